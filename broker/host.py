"""The broker's storage as the parts under the node see it: one Protocol that the narrower hosts
(the data-path servicer's BrokerHost, replication's ReplicaHost) build on, so that what "the
broker's id, logs and offsets store" means is written once. The BrokerNode is one."""

from __future__ import annotations

from typing import Protocol

from dmq.broker.log import LogManager
from dmq.broker.offsets import OffsetStore

__all__ = ["StorageHost"]


class StorageHost(Protocol):
    """The broker's id, its partition logs and its offsets store."""

    @property
    def broker_id(self) -> int: ...

    @property
    def logs(self) -> LogManager: ...

    @property
    def offsets(self) -> OffsetStore: ...
