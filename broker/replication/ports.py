"""What replication needs from the broker around it, as narrow interfaces (issue 27, "modes under
the node"): the manager and the fetchers are handed a `ReplicaHost` (the BrokerNode is one) and a
`ReplicaLogListener` (the event stores), never the node or a servicer, so broker/replication
imports nothing above it and no import cycle runs through it.
"""

from __future__ import annotations

from typing import Protocol

from dmq.broker.host import StorageHost
from dmq.broker.replication.stage_trace import StageTrace
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.security.settings import ClientSecurity

__all__ = ["AppendListener", "NO_LISTENER", "ReplicaHost", "ReplicaLogListener"]


class AppendListener(Protocol):
    """Told when a partition's readable end moves (the long-polling fetches' AppendNotifier)."""

    def notify(self, topic: str, partition: int) -> None: ...


class ReplicaLogListener(Protocol):
    """What follows a follower's log besides the log itself (an event store's index): told before
    the log is truncated and after replica batches were appended."""

    async def truncating(self, topic: str, end_offset: int) -> None: ...

    def replica_appended(self, topic: str) -> None: ...


class _NoListener:
    async def truncating(self, topic: str, end_offset: int) -> None:
        return None

    def replica_appended(self, topic: str) -> None:
        return None


NO_LISTENER: ReplicaLogListener = _NoListener()


class ReplicaHost(StorageHost, Protocol):
    """The broker as replication sees it: its id, logs and offsets store (StorageHost), who to
    tell about new data, the stage trace, how to call other servers, and the coordinator's
    metadata service (None before the broker started; AlterIsr)."""

    @property
    def notifier(self) -> AppendListener: ...

    @property
    def stage_trace(self) -> StageTrace: ...

    @property
    def client_security(self) -> ClientSecurity | None: ...

    @property
    def metadata_stub(self) -> pb_grpc.MetadataStub | None: ...
