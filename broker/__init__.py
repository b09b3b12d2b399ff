"""Storage broker: partition logs, fetch, committed offsets, gRPC service."""
