"""The Broker gRPC service, served by one servicer per room: the data path and the cluster's calls
(dmq.broker.service.BrokerService), queue mode (dmq.broker.queue.service.QueueServicer) and the
event store (dmq.broker.events.service.EventStoreServicer).

The wire keeps one service, `dmq.v1.Broker` (clients and the security interceptor's RPC table name
its methods), so the servicers are registered on the server together: each method of the service
is taken from the one servicer that defines it, and registration fails when a method has no
servicer or two, so a new RPC cannot be left UNIMPLEMENTED or answered by the wrong room. The
registration itself (Fetch's and EventRead's hand-framed answers, the generic and registered
handlers) is dmq.proto.wire's, as it was for the single servicer; the interceptors (security,
decode guard, metrics, connection limits) see the same method handlers as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc

from dmq.proto import dmq_pb2 as pb
from dmq.proto.wire import add_broker_servicer

__all__ = ["BROKER_METHODS", "BrokerRpcs", "add_broker_servicers"]

BROKER_METHODS: tuple[str, ...] = tuple(m.name for m in pb.DESCRIPTOR.services_by_name["Broker"].methods)


class BrokerRpcs:
    """The Broker service's methods gathered from the servicers that define them: what the
    generated registration reads (`servicer.Produce`, `servicer.QueuePop`, ...)."""

    def __init__(self, *servicers: object) -> None:
        self.owners: dict[str, object] = {}
        for name in BROKER_METHODS:
            owners = [s for s in servicers if callable(getattr(s, name, None))]
            if len(owners) != 1:
                which = ", ".join(type(s).__name__ for s in owners) or "none"
                raise RuntimeError(f"Broker.{name} must be served by exactly one servicer, got {which}")
            self.owners[name] = owners[0]

    def __repr__(self) -> str:
        rooms = sorted({type(s).__name__ for s in self.owners.values()})
        return f"<BrokerRpcs methods={len(self.owners)} servicers={rooms}>"

    def __getattr__(self, name: str) -> Callable[..., Any]:
        owner = self.__dict__.get("owners", {}).get(name)
        if owner is None:
            raise AttributeError(name)
        method: Callable[..., Any] = getattr(owner, name)
        return method


def add_broker_servicers(server: grpc.aio.Server, *servicers: object) -> BrokerRpcs:
    """Register the servicers as the one Broker service on `server` (see the module docstring)."""
    rpcs = BrokerRpcs(*servicers)
    add_broker_servicer(rpcs, server)
    return rpcs
