"""fedrl's wire protocol: the .proto sources and their generated code (fedrl.proto.v1)."""
