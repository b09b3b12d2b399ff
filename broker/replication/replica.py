"""One replica's state and the refusals of a write it cannot take: what every room of the broker
that looks at replication (the Broker servicer, queue mode, the event store, the offsets store's
durability, the storage-status mapping) needs, without the manager and its fetch loops.

A leaf of broker/replication: it imports the pure core and the log, so the manager, the fetcher
and the modes all import it and none of them imports another through it (tests/unit/test_import_cycles.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from dmq.broker.log import PartitionLog
from dmq.broker.replication.epochs import LeaderEpochCache
from dmq.broker.replication.isr import PartitionReplicas
from dmq.proto import dmq_pb2 as pb

__all__ = ["NotEnoughReplicas", "NotLeaderForPartition", "Replica", "ReplicaFetcher", "ReplicaLookup"]


class NotLeaderForPartition(Exception):
    """This broker does not lead the partition (any more); the message names the leader."""


class NotEnoughReplicas(Exception):
    """Fewer in-sync replicas than min_insync_replicas (before the write, or when it reached them),
    or they did not all get it in time; retriable."""


class ReplicaFetcher(Protocol):
    """The follower's fetch loop a replica is handed to (fetcher.LeaderFetcher), as the manager
    drives it; a Protocol so that this module need not import the fetcher, which imports it."""

    @property
    def key(self) -> tuple[int, str]: ...

    @property
    def empty(self) -> bool: ...

    def add(self, r: Replica) -> None: ...

    def remove(self, r: Replica) -> None: ...

    def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(eq=False)
class Replica:
    """This broker's replica of one partition that has a PartitionState."""

    topic: str
    partition: int
    plog: PartitionLog
    cache: LeaderEpochCache
    state: pb.PartitionState
    min_insync: int = 1
    leading: PartitionReplicas | None = None
    high_watermark: int = 0  # a follower: the leader's (capped at its own log end)
    needs_truncation: bool = False
    fetcher: ReplicaFetcher | None = None
    alter_pending: bool = False
    waiters: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, int]:
        return self.topic, self.partition

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch

    def not_leader_message(self, broker_id: int) -> str:
        where = f"{self.topic}[{self.partition}]"
        if self.state.leader_id < 0:
            return f"broker {broker_id} does not lead {where}; it has no leader now (its in-sync replicas are down)"
        return f"broker {broker_id} does not lead {where}; the leader is {self.state.leader_address}"


class ReplicaLookup(Protocol):
    """The replica manager as the modes ask it: this broker's replica of a partition, None when the
    partition is unreplicated (no PartitionState)."""

    def get(self, topic: str, partition: int) -> Replica | None: ...
