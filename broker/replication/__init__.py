"""Replication's pure core (DESIGN.md "Replication"): no I/O, no clock of its own, no gRPC.

    epochs      the leader-epoch cache of one replica (epoch -> first offset written in it)
    truncation  where a replica's log stops agreeing with the leader's (KIP-101 / KIP-279)
    isr         the leader's view of its followers: in-sync set and high watermark

The broker's replica manager drives them: it feeds fetch positions and the time in, and carries
out what they decide (truncate a log, tell the controller about an in-sync set change, answer a
produce). Kept pure so the rules can be tested by tables and by a seeded simulation
(tests/unit/test_replication_*.py).

The parts with I/O, imported by the broker node and service only:

    manager     roles per partition from the controller's states, the leader's in-sync set and
                high watermark, acks=all waits, AlterIsr
    fetcher     a follower's fetch loop per leader broker (truncation first, then copying)
    checkpoint  the epoch cache's file in the partition directory

What the rest of the broker sees of it: `replica` (one replica's state, the refusals
NotLeaderForPartition / NotEnoughReplicas) and `ports` (the narrow interfaces the manager is handed
instead of the node: ReplicaHost, AppendListener, ReplicaLogListener).
"""

from .epochs import UNDEFINED_EPOCH, UNDEFINED_OFFSET, EpochEntry, LeaderEpochCache
from .isr import FollowerState, PartitionReplicas
from .truncation import truncation_offset

__all__ = [
    "UNDEFINED_EPOCH",
    "UNDEFINED_OFFSET",
    "EpochEntry",
    "FollowerState",
    "LeaderEpochCache",
    "PartitionReplicas",
    "truncation_offset",
]
