"""`fedrl-client check`: this machine, the server's reachability, and settings to train with."""
