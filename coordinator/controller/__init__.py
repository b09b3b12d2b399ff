"""The controller's part of the metadata service (DESIGN.md "Replication"): who holds and who
leads each replicated partition.
  controller        the controller's events (brokers registering, failing, shutting down; AlterIsr;
                    preferred leaders) decided, recorded and pushed, one change at a time
  reassignment      moving a partition's replicas (ReassignPartition), one background task each
  election          pure election rules (from the in-sync set, failover, preferred leader, placement)
  placement         where a new partition's replicas go (round-robin leaders, racks spread)
  partition_states  a partition's state transitions and the checks of AlterIsr / reassignment
  pushes            UpdatePartitionStates to the brokers, with retries at their heartbeats
  sessions          brokers' sessions: awaited after a coordinator start, restarted after its pause
"""
