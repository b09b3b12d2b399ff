"""Whether this coordinator is the active one, and its controller epoch (issue 28 item 7, issue 29).

One read of the node, shared by the CoordinatorStatus RPC (`dmq coordinators list`) and the
gauges `dmq_coordinator_active` / `dmq_coordinator_controller_epoch` (dmq.coordinator.metrics),
so the two never disagree. A standby answers it: it is how an operator asks each address in turn.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import structlog

from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.server.server_errors import rpc_handler


class _Ready(Protocol):
    @property
    def ready(self) -> bool: ...


class _Leadership(Protocol):
    @property
    def deposed(self) -> bool: ...

    @property
    def active_address(self) -> str | None: ...

    def leading(self) -> bool: ...


class _CheckedStore(Protocol):
    """The etcd store's health check (dmq.coordinator.metastore.etcd); SQLite has none: a local
    file that the coordinator answering from is there."""

    @property
    def address(self) -> str: ...

    async def check_health(self, timeout_s: float) -> tuple[bool, str]: ...


class CoordinatorNode(Protocol):
    """What the status reads of dmq.coordinator.node.CoordinatorNode: a narrow view, so this
    module (imported by the metrics the node installs) does not depend on the node."""

    @property
    def leadership(self) -> _Leadership | None: ...

    @property
    def controller_epoch(self) -> int: ...

    @property
    def metadata(self) -> _Ready: ...

    @property
    def advertised_address(self) -> str: ...

    @property
    def store(self) -> object: ...


log = structlog.get_logger(__name__)

# A health check is one small answer: an etcd that has not answered a read in a second is not
# healthy, and `dmq health` (5 s per call) must hear so rather than time out itself.
STORE_CHECK_TIMEOUT_S = 1.0


@dataclass(frozen=True, slots=True)
class CoordinatorStatus:
    address: str
    active: bool
    # The epoch this coordinator claimed when it last took control (kept after it steps down);
    # 0 for a standby that never did: a standby does not track the active one's epoch.
    controller_epoch: int
    active_address: str | None


def status_of(node: CoordinatorNode) -> CoordinatorStatus:
    lead = node.leadership
    if lead is None:  # the only coordinator of its store: active once it has claimed its epoch
        active = node.controller_epoch > 0 and node.metadata.ready
        return CoordinatorStatus(node.advertised_address, active, node.controller_epoch,
                                 node.advertised_address if active else None)
    # Acting: elected, its epoch claimed and its state loaded, and the lease still held by the clock.
    active = lead.leading() and node.metadata.ready
    return CoordinatorStatus(node.advertised_address, active, node.controller_epoch,
                             None if lead.deposed else lead.active_address)


@dataclass(frozen=True, slots=True)
class StoreHealth:
    kind: str  # "sqlite" | "etcd"
    address: str  # etcd: the endpoint in use; sqlite: ""
    healthy: bool
    detail: str


async def store_health_of(node: CoordinatorNode, timeout_s: float = STORE_CHECK_TIMEOUT_S) -> StoreHealth:
    store = node.store
    check = getattr(store, "check_health", None)
    if check is None:
        return StoreHealth("sqlite", "", True, "local file")
    checked: _CheckedStore = store  # type: ignore[assignment]  # it has check_health: the etcd store
    healthy, detail = await checked.check_health(timeout_s)
    return StoreHealth("etcd", checked.address, healthy, detail)


_handler = rpc_handler(log=log)


class CoordinatorStatusServicer(pb_grpc.CoordinatorStatusServicer):
    def __init__(self, node: CoordinatorNode) -> None:
        self._node = node
        # One store check at a time, shared by the calls that arrive meanwhile: however many ask,
        # the store sees at most one read in flight from here (bounded by STORE_CHECK_TIMEOUT_S).
        self._store_check: asyncio.Future[StoreHealth] | None = None

    def __repr__(self) -> str:
        return f"<CoordinatorStatusServicer address={self._node.advertised_address!r}>"

    @_handler
    async def DescribeCoordinator(
        self, request: pb.DescribeCoordinatorRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DescribeCoordinatorResponse:
        s = status_of(self._node)
        store = await self._checked_store()
        return pb.DescribeCoordinatorResponse(address=s.address, active=s.active,
                                              controller_epoch=s.controller_epoch,
                                              active_address=s.active_address or "",
                                              metadata_store=store.kind, metadata_store_address=store.address,
                                              metadata_store_healthy=store.healthy,
                                              metadata_store_detail=store.detail)

    async def _checked_store(self) -> StoreHealth:
        check = self._store_check
        if check is None or check.done():
            check = self._store_check = asyncio.ensure_future(store_health_of(self._node))
        # shield: a caller that gives up (its deadline) must not cancel the check the others share
        return await asyncio.shield(check)
