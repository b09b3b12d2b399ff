"""Queue mode: partitions leased to stateless workers of a queue group (DESIGN.md "Queue mode")."""
