"""Which of the coordinators named in bootstrap_servers is active (AdminClient.describe_coordinators,
`dmq coordinators list`; issue 28 item 7).

Each address is asked directly (never through the CoordinatorRouter, which would follow a
standby's NOT_COORDINATOR to the active one), all at once, each within the request timeout: one
that cannot be reached (refused, or no answer in time: dead or paused) is reported unreachable
rather than failing the listing; any other refusal (authentication, permission) is raised.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from dmq.client.errors import from_rpc_error, is_connect_failure
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc

__all__ = ["CoordinatorDescription", "describe_coordinators"]

ACTIVE = "active"
STANDBY = "standby"
UNREACHABLE = "unreachable"


@dataclass(frozen=True, slots=True)
class CoordinatorDescription:
    address: str  # as named in bootstrap_servers
    state: str  # "active", "standby" or "unreachable"
    # The epoch it claimed when it last took control; 0 for a standby that never did, None unreachable.
    controller_epoch: int | None
    active_address: str | None  # the active coordinator as this one last read it (None: unknown)
    error: str | None = None  # why it is unreachable
    # Its metadata store as it checked it when asked: "sqlite" | "etcd" (None: unreachable, or
    # a coordinator too old to say), the etcd endpoint in use, healthy, and how (or why not).
    metadata_store: str | None = None
    metadata_store_address: str | None = None
    metadata_store_healthy: bool | None = None
    metadata_store_detail: str | None = None


def describe_coordinators(channels: list[tuple[str, grpc.Channel]], timeout_s: float) -> list[CoordinatorDescription]:
    pending: list[tuple[str, grpc.Future[pb.DescribeCoordinatorResponse]]] = []
    for address, channel in channels:
        stub = pb_grpc.CoordinatorStatusStub(channel)  # type: ignore[no-untyped-call]  # generated stubs are untyped
        pending.append((address, stub.DescribeCoordinator.future(pb.DescribeCoordinatorRequest(), timeout=timeout_s)))
    out: list[CoordinatorDescription] = []
    for address, future in pending:
        try:
            r = future.result()
        except grpc.RpcError as e:
            code, details = e.code(), e.details()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED or (
                    code == grpc.StatusCode.UNAVAILABLE and is_connect_failure(details)):
                out.append(CoordinatorDescription(address, UNREACHABLE, None, None, f"{code.name}: {details}"))
                continue
            raise from_rpc_error(e, context=f"describe the coordinator at {address}") from e
        out.append(CoordinatorDescription(address, ACTIVE if r.active else STANDBY, r.controller_epoch,
                                          r.active_address or None, None, r.metadata_store or None,
                                          r.metadata_store_address or None,
                                          r.metadata_store_healthy if r.metadata_store else None,
                                          r.metadata_store_detail or None))
    return out
