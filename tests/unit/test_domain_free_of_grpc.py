"""The servers' domain code never imports grpc (issue 27 item 5).

A refusal in domain code is a DomainError (dmq.proto.server.domain_errors); only the servicers, the
modules that call other servers over gRPC, and the status mappings turn it into a gRPC status.
Imports are read with `ast` (as tests/unit/test_import_rules.py does), nested ones included: a
module of broker/ or coordinator/ that imports grpc, or dmq.proto.server.server_errors (whose `fail` takes a
grpc.StatusCode), must be listed below with the reason it is not domain code. A new domain module
that reaches for a gRPC status fails here; a listed module that no longer imports grpc must leave
the list, so it never grows stale.
"""

from __future__ import annotations

import pathlib

import pytest

from tests.unit.test_import_rules import ROOT, _module_name, imports_of

# module -> why it may speak gRPC
GRPC_ALLOWED = {
    # servicers: requests in, statuses out
    "dmq.broker.service": "the Broker servicer",
    "dmq.broker.queue.service": "the queue servicer (queue RPCs of the Broker service)",
    "dmq.broker.events.service": "the event-store servicer (event RPCs of the Broker service)",
    "dmq.broker.events.append_stream": "serves EventAppendStream on the servicer's context (statuses as answers)",
    "dmq.broker.servicers": "registers the Broker service's servicers on the gRPC server",
    "dmq.coordinator.group_service": "the GroupCoordinator servicer",
    "dmq.coordinator.metadata_service": "the Metadata servicer",
    "dmq.coordinator.group_wakeups": "serves WatchGroup's stream on the servicer's context",
    "dmq.coordinator.controller.status": "holds the CoordinatorStatus servicer",
    # status mappings of what is not a DomainError
    "dmq.broker.storage_status": "maps storage failures (OSError, a corrupt log) to statuses",
    "dmq.broker.readiness": "rpc_handler's `before` hook: UNAVAILABLE until the broker is started",
    # gRPC clients of another server, relaying its answers
    "dmq.broker.node": "runs the broker's server and calls the coordinator",
    "dmq.broker.coordinator_link": "the broker's channel to the active coordinator",
    "dmq.broker.queue.dead_letters": "produces to the dead-letter topic's leader over gRPC",
    "dmq.broker.replication.fetcher": "fetches from the partition's leader over gRPC",
    "dmq.broker.replication.manager": "calls the coordinator (AlterIsr) over gRPC",
    "dmq.coordinator.broker_calls": "calls brokers over gRPC (CreatePartitions, DeletePartitions)",
    "dmq.coordinator.broker_pool": "the coordinator's channels to brokers",
    "dmq.coordinator.controller.pushes": "pushes partition states to brokers over gRPC",
    "dmq.coordinator.group_admin": "reads and deletes committed offsets on brokers over gRPC",
    "dmq.coordinator.metastore.etcd": "etcd's API is gRPC",
    "dmq.coordinator.node": "runs the coordinator's server",
}
FORBIDDEN = ("grpc", "dmq.proto.server.server_errors")


def _speaks_grpc(path: pathlib.Path) -> list[str]:
    return sorted(
        {f"line {line}: {name}" for line, name in imports_of(path)
         if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)}
    )


def _modules() -> list[pathlib.Path]:
    return sorted(p for top in ("broker", "coordinator") for p in (ROOT / top).rglob("*.py"))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_domain_modules_do_not_import_grpc(path: pathlib.Path) -> None:
    module = _module_name(path)
    found = _speaks_grpc(path)
    if module in GRPC_ALLOWED:
        assert found, f"{module} no longer imports grpc: take it off GRPC_ALLOWED"
    else:
        assert not found, (
            f"{module} is domain code but imports {found}: raise a DomainError (dmq.proto.server.domain_errors) "
            "and let the servicer's rpc_handler map it"
        )


def test_every_allowed_module_exists() -> None:
    assert set(GRPC_ALLOWED) <= {_module_name(p) for p in _modules()}
