"""The one gate between a broker's RPCs and the state it loads at start.

What a broker answers from is loaded by `BrokerNode.start()`: the logs (log ends, producer state),
the offset store (committed offsets, queue progress and leases, event-store group progress, all
replayed from their internal logs), then the partitions and roles the coordinator hands over at
registration. Its port is open before that (the runner starts the server first, and a restarted
broker's clients are already calling): an answer from half-loaded state is a wrong answer, e.g. a
committed offset read as "nothing committed" (-1) sends a resuming consumer to its reset policy.

So every RPC that reads or changes that state goes through `require_started` (the `before` hook
of the services' `rpc_handler`), whatever its role for the partition (leader or follower): until
`node.ready` it answers UNAVAILABLE "broker N is starting; retry", which clients retry as any
UNAVAILABLE. `node.ready` is set, in one step of the event loop, only after everything above is
loaded (queue leases are restored in the same step, before any request can run).

Exempt, answered at any time: the controller's own commands, CreatePartitions and
DeletePartitions. The coordinator sends them while the broker registers (after it computed the
registration's answer, before `ready`); refused, a created partition would be missing until the
broker's next registration.
"""

from __future__ import annotations

from typing import Any

import grpc

from dmq.proto.server.server_errors import fail

__all__ = ["require_started"]


def require_started(service: Any) -> None:
    """Raise RpcAbort UNAVAILABLE while the service's broker (`service._node`) is starting."""
    node = service._node
    if not node.ready:
        fail(grpc.StatusCode.UNAVAILABLE, f"broker {node.broker_id} is starting; retry")
