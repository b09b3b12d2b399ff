"""What queue mode needs from the broker around it, as narrow interfaces (issue 27, "modes under
the node"): the QueueManager is handed a `QueueHost` (the BrokerNode is one), never the node or a
servicer, so broker/queue imports nothing above it and no import cycle runs through it.
"""

from __future__ import annotations

from typing import Protocol

from dmq.broker.log import LogManager, PartitionLog
from dmq.broker.offsets import OffsetStore
from dmq.broker.replication.ports import AppendListener
from dmq.broker.replication.replica import ReplicaLookup
from dmq.proto import dmq_pb2 as pb

__all__ = ["PartitionLeadership", "QueueHost", "TopicPort"]


class PartitionLeadership(ReplicaLookup, Protocol):
    """The replica manager as queue mode asks it: a partition's replica (only its leader serves a
    queue) and where its readers stop."""

    def readable_end(self, topic: str, partition: int, plog: PartitionLog) -> int | None: ...


class TopicPort(Protocol):
    """Producing to a topic this broker may not hold (the dead-letter topics): its logs, where a
    partition's leader is, and creating the topic through the coordinator."""

    @property
    def address(self) -> str: ...

    @property
    def logs(self) -> LogManager: ...

    @property
    def notifier(self) -> AppendListener: ...

    async def leader_hint(self, topic: str, partition: int) -> str | None: ...

    async def ensure_topic(self, name: str, *, partitions: int) -> pb.TopicInfo: ...


class QueueHost(TopicPort, Protocol):
    """The broker as queue mode sees it: its id, the offsets store (progress and leases are its
    records) and its replicas, besides the topic port the dead letters go through."""

    @property
    def broker_id(self) -> int: ...

    @property
    def offsets(self) -> OffsetStore: ...

    @property
    def replication(self) -> PartitionLeadership: ...
