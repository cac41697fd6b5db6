"""What the server and the client both need: serde, codecs, chunking, spec hashing, TLS helpers."""
