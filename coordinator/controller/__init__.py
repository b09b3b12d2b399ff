"""The controller's part of the metadata service (DESIGN.md "Replication"): who leads each
replicated partition. `election` holds the pure rules (election from the in-sync set, failover,
preferred leader, rack-aware placement)."""
