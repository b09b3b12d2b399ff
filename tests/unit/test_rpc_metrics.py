"""RPC timing (issue 29): each call is recorded under the status code it ended with, in
prometheus_client's Histogram registered once per registry."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dmq.proto.server.metrics import RpcTimings, new_registry

NAME = "dmq_rpc_server_duration_seconds"
DOC = "Time to answer a gRPC call, by method and status code"


def test_the_histogram_registers_its_names_so_duplicates_are_refused() -> None:
    registry = new_registry()
    RpcTimings(registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Histogram(NAME, DOC, ["method", "code"], registry=registry)


class _Context:
    def __init__(self, code: object) -> None:
        self._code = code

    def code(self) -> object:
        return self._code


def _counts(registry: CollectorRegistry) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name == f"{NAME}_count":
                out[(s.labels["method"], s.labels["code"])] = s.value
            elif s.name == "dmq_auth_failures_total":
                out[("auth", s.labels["kind"])] = s.value
    return out


def test_each_call_is_recorded_under_the_code_it_ended_with() -> None:
    registry = new_registry()
    timings = RpcTimings(registry)
    timer = timings.method_timer("/dmq.v1.Broker/Produce")
    ctx: Any = _Context
    timer.answered(ctx(0), 0.001)  # grpc.aio's context before any code is set
    timer.answered(ctx(None), 0.001)
    timer.answered(ctx(grpc.StatusCode.OK), 0.001)
    timer.answered(ctx(grpc.StatusCode.NOT_FOUND), 0.001)  # set with context.set_code, then returned
    timer.failed(asyncio.CancelledError(), ctx(0), 0.001)
    timer.failed(GeneratorExit(), ctx(0), 0.001)  # a stream the client stopped reading
    timer.failed(RuntimeError("abort"), ctx(grpc.StatusCode.PERMISSION_DENIED), 0.001)
    timer.failed(RuntimeError("abort"), ctx(grpc.StatusCode.UNAUTHENTICATED), 0.001)
    timer.failed(RuntimeError("a bug"), ctx(0), 0.001)
    assert _counts(registry) == {
        ("Produce", "OK"): 3, ("Produce", "NOT_FOUND"): 1, ("Produce", "CANCELLED"): 2,
        ("Produce", "PERMISSION_DENIED"): 1, ("Produce", "UNAUTHENTICATED"): 1, ("Produce", "UNKNOWN"): 1,
        ("auth", "authentication"): 1, ("auth", "authorization"): 1,
    }


def test_a_method_that_never_answered_ok_exports_no_ok_series() -> None:
    registry = new_registry()
    timer = RpcTimings(registry).method_timer("/dmq.v1.Broker/Fetch")
    timer.failed(RuntimeError("abort"), _Context(grpc.StatusCode.INVALID_ARGUMENT), 0.001)  # type: ignore[arg-type]
    assert _counts(registry) == {("Fetch", "INVALID_ARGUMENT"): 1, ("auth", "authentication"): 0,
                                 ("auth", "authorization"): 0}


def test_method_labels_are_bounded() -> None:
    registry = new_registry()
    timings = RpcTimings(registry)
    timings.max_method_labels = 2
    for name in ("A", "B", "C", "D", "A"):
        timings.method_timer(f"/svc/{name}").answered(_Context(0), 0.001)  # type: ignore[arg-type]
    assert _counts(registry) == {("A", "OK"): 2, ("B", "OK"): 1, ("other", "OK"): 2,
                                 ("auth", "authentication"): 0, ("auth", "authorization"): 0}
