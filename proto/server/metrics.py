"""Prometheus metrics shared by both servers: the `/metrics` endpoint and the RPC timing interceptor.

Each gRPC server has its own `CollectorRegistry` (never the process-global one): the in-process
test clusters and `LocalCluster` put several brokers in one process, and each must answer for
itself. The embedded `dmq server` shares one registry between its coordinator and broker (they
share one gRPC server and one port).

What is measured where:
  - `RpcTimings`: one histogram observation per call, labelled by method and status code;
    UNAUTHENTICATED and PERMISSION_DENIED answers also count as authentication / authorization
    failures. Recorded by the server's first interceptor (the per-address connection limit, so
    calls refused by any interceptor are counted), not by an interceptor of its own: O(1) per call,
    no coroutine layer, the OK series at hand (issue 29: bench/metrics_rpc_cost.py).
  - `ConnectionsCollector`: the connections the per-address limit tracks, read at scrape time.
  - everything else is a node's own collector (dmq.broker.metrics, dmq.coordinator.metrics),
    which reads existing state at scrape time rather than counting on the hot path.

`MetricsEndpoint` serves GET /metrics on the server's own asyncio loop (asyncio.start_server),
so collectors read the nodes' state on the thread that changes it: no locks, no torn dicts.
Before rendering it awaits the registered refresh hooks (the coordinator's consumer lag asks
brokers for log ends; the hook caches its answer, so a scrape costs bounded broker calls).
The endpoint has no authentication: bind it where only the monitoring system can reach it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import grpc
import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = [
    "DEFAULT_METRICS_PORT",
    "ConnectionsCollector",
    "MethodTimer",
    "MetricsEndpoint",
    "QuotaCollector",
    "RpcTimings",
    "new_registry",
]

log = structlog.get_logger(__name__)

# `dmq server`'s default: 9464 is the port OpenTelemetry's Prometheus exporter uses, free of
# DMQ's own 9091 and of Prometheus' 9090.
DEFAULT_METRICS_PORT = 9464
# Distinct method labels; past it calls are labelled "other" (a client may name any method).
MAX_METHOD_LABELS = 256
MAX_REQUEST_HEAD_BYTES = 8192
REQUEST_HEAD_TIMEOUT_S = 5.0
REFRESH_TIMEOUT_S = 5.0
# Request latencies from 0.5 ms (an in-memory answer) to 10 s (a long poll's bound).
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

RefreshHook = Callable[[], Awaitable[None]]


def new_registry() -> CollectorRegistry:
    # auto_describe: a collector's families are checked against the others' names at register time.
    return CollectorRegistry(auto_describe=True)


class RpcTimings:
    """What is recorded per call: `dmq_rpc_server_duration_seconds` by method and status code, and
    `dmq_auth_failures_total` for UNAUTHENTICATED and PERMISSION_DENIED answers.

    Not an interceptor of its own: each interceptor grpc.aio runs costs an `intercept_service`
    coroutine per call and its wrapper another coroutine layer, so the server's first interceptor
    (dmq.proto.server.connections.PerAddressConnectionLimit) times the calls, through a
    `MethodTimer` per method made when it wraps the method (once), with the OK series at hand."""

    max_method_labels = MAX_METHOD_LABELS

    def __init__(self, registry: CollectorRegistry) -> None:
        self.duration = Histogram(
            "dmq_rpc_server_duration_seconds", "Time to answer a gRPC call, by method and status code",
            ["method", "code"], registry=registry, buckets=LATENCY_BUCKETS_S,
        )
        self.auth_failures = Counter(
            "dmq_auth_failures_total", "Calls refused: authentication (UNAUTHENTICATED) or authorization (PERMISSION_DENIED)",
            ["kind"], registry=registry,
        )
        # both kinds exported from the start (0 until a refusal), as a rate() over them needs
        self._auth_failures = {"UNAUTHENTICATED": self.auth_failures.labels("authentication"),
                               "PERMISSION_DENIED": self.auth_failures.labels("authorization")}
        self._methods: set[str] = set()

    def __repr__(self) -> str:
        return f"<RpcTimings methods={len(self._methods)}>"

    def method_timer(self, method: str) -> MethodTimer:
        """The timer of a full method name ("/dmq.v1.Broker/Produce" is labelled "Produce"); past
        `max_method_labels` distinct names, "other", so the label set stays bounded."""
        label = method.rsplit("/", 1)[-1]
        if label not in self._methods:
            if len(self._methods) >= self.max_method_labels:
                label = "other"
            else:
                self._methods.add(label)
        return MethodTimer(self, label)

    def observe(self, method: str, code: str, seconds: float) -> None:
        self.duration.labels(method, code).observe(seconds)
        failure = self._auth_failures.get(code)
        if failure is not None:
            failure.inc()


class MethodTimer:
    """Records one method's calls under their status code: the context's code when the call ends
    (OK unless set), CANCELLED when the client went away (or stopped reading a stream), else the
    code context.abort() set before raising (UNKNOWN for any other error, as grpc answers it)."""

    __slots__ = ("_method", "_ok", "_timings")

    def __init__(self, timings: RpcTimings, method: str) -> None:
        self._timings = timings
        self._method = method
        # made on the first OK answer, not here: a method that never answered OK exports no OK series
        self._ok: Any = None  # a labelled child of the histogram

    def __repr__(self) -> str:
        return f"<MethodTimer {self._method}>"

    def answered(self, context: grpc.aio.ServicerContext[Any, Any], seconds: float) -> None:
        """The call returned (or its stream ended) normally."""
        code = context.code()
        if isinstance(code, grpc.StatusCode) and code is not grpc.StatusCode.OK:
            self._timings.observe(self._method, code.name, seconds)
        else:  # grpc.aio's context answers a non-StatusCode (0) until a code is set
            ok = self._ok
            if ok is None:
                ok = self._ok = self._timings.duration.labels(self._method, "OK")
            ok.observe(seconds)

    def failed(self, error: BaseException, context: grpc.aio.ServicerContext[Any, Any], seconds: float) -> None:
        """The call raised `error` (an abort, a cancellation or a bug)."""
        if isinstance(error, (asyncio.CancelledError, GeneratorExit)):
            code = "CANCELLED"
        else:
            c = context.code()
            code = c.name if isinstance(c, grpc.StatusCode) else "UNKNOWN"
        self._timings.observe(self._method, code, seconds)


class ConnectionsCollector(Collector):
    """Open client connections, as the per-address connection limit counts them."""

    def __init__(self, count: Callable[[], int]) -> None:
        self._count = count

    def collect(self) -> Iterable[GaugeMetricFamily]:
        yield GaugeMetricFamily("dmq_open_connections", "Client connections (peers) with a call in the last minute",
                                value=self._count())


class QuotaCollector(Collector):
    """Seconds calls were delayed by quotas, per kind (requests, produce, fetch)."""

    def __init__(self, throttled_s: Callable[[], Mapping[str, float]]) -> None:
        self._throttled_s = throttled_s

    def collect(self) -> Iterable[CounterMetricFamily]:
        family = CounterMetricFamily("dmq_quota_throttle_seconds", "Time calls were delayed by quotas, by kind",
                                     labels=["kind"])
        for kind, seconds in sorted(self._throttled_s().items()):
            family.add_metric([kind], seconds)
        yield family


class MetricsEndpoint:
    """GET /metrics over plain HTTP/1.0 on the running loop; `port` 0 binds a free port (see `port`)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self.registry = registry
        self.host = host
        self.requested_port = port
        self.port = 0  # the bound port, once started
        self._refresh: list[RefreshHook] = []
        self._server: asyncio.Server | None = None

    def __repr__(self) -> str:
        return f"<MetricsEndpoint http://{self.host}:{self.port}/metrics refresh_hooks={len(self._refresh)}>"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def add_refresh(self, hook: RefreshHook) -> None:
        """An async step to run before each scrape (bounded by REFRESH_TIMEOUT_S; its own cache)."""
        self._refresh.append(hook)

    async def start(self) -> int:
        try:
            self._server = await asyncio.start_server(self._serve, self.host, self.requested_port)
        except OSError as e:  # the operator's next step: another port, or none
            raise OSError(e.errno, f"metrics endpoint (--metrics-port): cannot listen on {self.host}:"
                                   f"{self.requested_port}: {e.strerror or e}; choose another port, or 0 to turn "
                                   "it off") from None
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("metrics endpoint listening", url=self.url)
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            server.close()
            await server.wait_closed()

    async def render(self) -> bytes:
        for hook in self._refresh:
            try:
                await asyncio.wait_for(hook(), REFRESH_TIMEOUT_S)
            except Exception as e:  # noqa: BLE001 - a failed refresh leaves the previous values, never the scrape
                log.warning("metrics refresh failed", error=repr(e))
        return generate_latest(self.registry)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_HEAD_TIMEOUT_S)
            if len(head) > MAX_REQUEST_HEAD_BYTES:
                raise ValueError("request head too large")
            parts = head.split(b"\r\n", 1)[0].split()
            if len(parts) == 3 and parts[0] == b"GET" and parts[1].split(b"?", 1)[0] == b"/metrics":
                body = await self.render()
                status, ctype = b"200 OK", CONTENT_TYPE_LATEST.encode()
            else:
                body, status, ctype = b"not found: GET /metrics\n", b"404 Not Found", b"text/plain"
            writer.write(b"HTTP/1.0 " + status + b"\r\nContent-Type: " + ctype + b"\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
            await writer.drain()
        except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # a client that went away or spoke no HTTP: nothing to answer
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass
