"""gRPC plumbing the services share: call context, per-participant limits, request fields."""
