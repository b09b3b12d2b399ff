"""Whether this coordinator is the active one, and its controller epoch (issue 28 item 7, issue 29).

One read of the node, shared by the CoordinatorStatus RPC (`dmq coordinators list`) and the
gauges `dmq_coordinator_active` / `dmq_coordinator_controller_epoch` (dmq.coordinator.metrics),
so the two never disagree. A standby answers it: it is how an operator asks each address in turn.
"""

from __future__ import annotations

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

log = structlog.get_logger(__name__)


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


_handler = rpc_handler(log=log)


class CoordinatorStatusServicer(pb_grpc.CoordinatorStatusServicer):
    def __init__(self, node: CoordinatorNode) -> None:
        self._node = node

    def __repr__(self) -> str:
        return f"<CoordinatorStatusServicer address={self._node.advertised_address!r}>"

    @_handler
    async def DescribeCoordinator(
        self, request: pb.DescribeCoordinatorRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DescribeCoordinatorResponse:
        s = status_of(self._node)
        return pb.DescribeCoordinatorResponse(address=s.address, active=s.active,
                                              controller_epoch=s.controller_epoch,
                                              active_address=s.active_address or "")
