"""Running the parts: the embedded server, a coordinator alone, a broker alone, and test clusters.

This is the process owner's side of the servers, so it lives with the CLI (the one place allowed
to import both `dmq.broker` and `dmq.coordinator`); the nodes themselves never touch process-wide
state. What a server process sets for itself is set here, by the `dmq server` / `dmq coordinator`
/ `dmq broker` runners only, never by LocalCluster / ClusterThread (which run inside a test's or
a bench's process):
  - the allocator keeps large buffers (dmq.client._malloc_tuning), in processes that host a broker;
  - the import-time heap is frozen out of the cyclic GC once the servers have started;
  - logging is configured by the commands in dmq.client.cli.servers before they get here.

`LocalCluster` puts a coordinator and N brokers in one asyncio loop. With one broker and
`shared_port=True` (the `dmq server` default) both sit on one gRPC server and one port; otherwise
each has its own server and port. `ClusterThread` runs a LocalCluster on a private event loop in a
background thread, so synchronous clients (Producer, DMQConsumer) can talk to it from the test's
own thread without sharing its loop.

Process lifecycle, the same for every runner here:
  - the data directories are locked (dmq.proto.server.dirlock) before the ports are bound and before
    anything is read, written or started, so a second server on them fails at once, never having
    listened on its port;
  - a port that cannot be bound raises `PortUnavailable` (an OSError with one line to print);
  - every gRPC server carries the standard health service (grpc.health.v1.Health): NOT_SERVING
    until its nodes have started, SERVING then, NOT_SERVING again from the first moment of
    shutdown. Services: "" (the whole server) and each hosted service by its full name;
  - `start()` undoes what it did when it fails or is cancelled, so `stop()` is only for a
    started cluster; SIGINT/SIGTERM during start (a broker waiting for an unreachable
    coordinator) cancels the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import os
import pathlib
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from dmq.broker.log import LogConfig
from dmq.broker.metrics import DEFAULT_MAX_PARTITION_SERIES
from dmq.broker.node import BrokerNode
from dmq.broker.replication.settings import REPLICA_ACK_TIMEOUT_MS_DEFAULT, REPLICA_LAG_TIME_MAX_MS_DEFAULT
from dmq.client._malloc_tuning import keep_large_buffers
from dmq.coordinator.controller.sessions import DEFAULT_BROKER_SESSION_TIMEOUT_MS
from dmq.coordinator.node import CoordinatorNode
from dmq.coordinator.principal_limits import PrincipalLimits
from dmq.proto import dmq_pb2 as pb
from dmq.proto.security.settings import ServerSecurity
from dmq.proto.server.connections import PerAddressConnectionLimit
from dmq.proto.server.decoding import DecodeGuard
from dmq.proto.server.dirlock import DataDirLock
from dmq.proto.server.grpc_options import server_options
from dmq.proto.server.metrics import ConnectionsCollector, MetricsEndpoint, QuotaCollector, RpcTimings, new_registry
from dmq.proto.server.security.interceptor import AclView, SecurityInterceptor
from dmq.proto.server.security.quotas import QuotaSettings

log = structlog.get_logger(__name__)

SHUTDOWN_GRACE_S = 2.0
# A signalled process is gone by then, whatever happens. A clean stop takes well under a second
# (grace for in-flight calls included); past this something is stuck (a thread that will not end,
# an fsync on a dying disk) and ending the process unclean beats a server that ignores SIGTERM:
# acknowledged data is already on disk, and the next start recovers the logs' tails.
STOP_DEADLINE_S = 8.0


@dataclass
class ClusterOptions:
    data_dir: pathlib.Path
    brokers: int = 1
    host: str = "127.0.0.1"
    port: int = 0
    shared_port: bool = True
    log_config: LogConfig | None = None
    default_subscription_mode: str = "all"
    rebalance_debounce_ms: int = 500
    broker_session_timeout_ms: int = DEFAULT_BROKER_SESSION_TIMEOUT_MS
    retention_check_interval_ms: int = 60_000
    coordinator_kwargs: dict[str, object] = field(default_factory=dict)
    # TLS, authentication and the nodes' own credentials (None: plain and open, loopback only).
    security: ServerSecurity | None = None
    quotas: QuotaSettings | None = None
    # Topics and partitions one principal may create (the super-users and cluster principal exempt).
    principal_limits: PrincipalLimits | None = None
    # A new topic's replication_factor when it names none. None: the coordinator's default,
    # min(3, live brokers), as `dmq coordinator` and `dmq server --brokers N` (processes) have.
    # 1 by default here: the embedded server has one broker, and the in-process multi-broker
    # clusters (tests) keep the unreplicated placement their tests were written for unless asked.
    replication_factor: int | None = 1
    # Prometheus /metrics (dmq.proto.server.metrics): None off; 0 a free port per server (tests); P > 0:
    # the coordinator's server on P and broker server i (when brokers have their own) on P + 1 + i.
    metrics_port: int | None = None
    # Per-partition series up to this many partitions, then per topic (dmq.broker.metrics).
    max_partition_series: int = 1000


# Bounds the calls a process serves at once (long polls and watch streams included); past it
# gRPC answers RESOURCE_EXHAUSTED instead of queueing without limit.
MAX_CONCURRENT_RPCS = 50_000


def _new_server(
    security: ServerSecurity | None = None, acls: AclView | None = None, quotas: QuotaSettings | None = None,
    metrics: CollectorRegistry | None = None,
) -> grpc.aio.Server:
    # The per-address connection limit first (dmq.proto.server.connections; per server and idle
    # timeout are in the options, dmq.proto.server.grpc_options). With metrics it also times every
    # call (dmq.proto.server.metrics.RpcTimings), so calls refused by any later interceptor are
    # counted, at no interceptor of their own. Then requests that do not decode: INVALID_ARGUMENT
    # before any rule reads them (dmq.proto.server.decoding). Then security: who calls, may they,
    # how fast (dmq.proto.server.security.interceptor), after the connection limit so a flood of bad
    # credentials is bounded like any other flood.
    connections = PerAddressConnectionLimit(timings=RpcTimings(metrics) if metrics is not None else None)
    guard = SecurityInterceptor(security, acls, quotas)
    if metrics is not None:
        metrics.register(ConnectionsCollector(connections.connection_count))
        quota = guard.quotas
        if quota is not None:
            metrics.register(QuotaCollector(lambda: quota.throttled_s))
    interceptors: list[grpc.aio.ServerInterceptor[Any, Any]] = [connections, DecodeGuard(), guard]
    return grpc.aio.server(
        options=server_options(),
        interceptors=interceptors,
        maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS,
    )


def _metrics_port(base: int | None, index: int) -> int | None:
    """Server `index`'s metrics port (0: the coordinator's server): see ClusterOptions.metrics_port."""
    if base is None or base == 0:
        return base
    return base + index


def exempting(limits: PrincipalLimits | None, security: ServerSecurity | None) -> PrincipalLimits | None:
    """`limits` with the principals they never apply to: the super-users and the cluster's own."""
    if limits is None or security is None:
        return limits  # security off: no call has a principal, so no limit applies anyway
    return replace(limits, exempt=limits.exempt | security.super_users | {security.cluster_principal})


def check_bind_security(host: str, security: ServerSecurity | None) -> None:
    """Refuse a non-loopback host without TLS and authentication unless --insecure; warn with it."""
    warning = (security or ServerSecurity()).check_bind(host)
    if warning is not None:
        log.warning(warning)


class PortUnavailable(OSError):
    """The listening port cannot be bound; str() is one line for an operator."""


def bind(server: grpc.aio.Server, host: str, port: int, security: ServerSecurity | None = None) -> int:
    """Bind host:port (0 picks a free port) and return the port; PortUnavailable if it cannot.

    A plain bind is tried first: gRPC reports a failed bind as an extra error line on stderr
    (and an opaque RuntimeError), while the operator should see one line that says why."""
    bind_probe(host, port)
    try:
        credentials = security.server_credentials() if security is not None else None
        if credentials is not None:
            bound = server.add_secure_port(f"{host}:{port}", credentials)
        else:
            bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:  # grpcio raises this rather than returning 0 on recent versions
        bound = 0
    if bound == 0:
        raise PortUnavailable(_why_unbindable(host, port))
    return bound


def bind_probe(host: str, port: int) -> None:
    """Raise PortUnavailable now if host:port cannot be listened on (port 0 always can)."""
    if port == 0:
        return
    reason = _bind_failure(host, port)
    if reason is not None:
        raise PortUnavailable(f"cannot listen on {host}:{port}: {reason}")


def _why_unbindable(host: str, port: int) -> str:
    # gRPC says only "Failed to bind"; a plain bind finds the reason the operator can act on.
    return f"cannot listen on {host}:{port}: {_bind_failure(host, port) or 'the port is taken or the address is wrong'}"


def _bind_failure(host: str, port: int) -> str | None:
    """Why a plain bind of host:port fails, in words; None when it succeeds."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        return f"{host!r} does not resolve ({e.strerror}); pass another --host"
    family, _type, _proto, _name, address = infos[0]
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        # As gRPC binds: SO_REUSEADDR, so a port left in TIME_WAIT by a stopped server is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(address)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            return "the port is in use by another process (choose another with --port)"
        if e.errno == errno.EADDRNOTAVAIL:
            return "the address is not one of this host's (pass another --host)"
        if e.errno == errno.EACCES:
            return "permission denied (ports below 1024 need privileges)"
        return e.strerror or str(e)
    finally:
        probe.close()
    return None


SERVICE_METADATA = pb.DESCRIPTOR.services_by_name["Metadata"].full_name
SERVICE_GROUPS = pb.DESCRIPTOR.services_by_name["GroupCoordinator"].full_name
SERVICE_BROKER = pb.DESCRIPTOR.services_by_name["Broker"].full_name
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class ServerHealth:
    """The standard gRPC health service on one server, driven by the runner that owns it."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self.servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]  # grpc-stubs 1.53 lacks grpc_health's aio module
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)
        self._services: set[str] = set()  # hosted here, by full name
        self._serving: set[str] = set()

    def __repr__(self) -> str:
        return f"<ServerHealth services={sorted(self._services)} serving={sorted(self._serving)}>"

    async def starting(self, services: list[str]) -> None:
        """Before the server starts: the server and these services are NOT_SERVING."""
        self._services.update(services)
        for service in ["", *services]:
            await self.servicer.set(service, NOT_SERVING)

    async def serving(self, services: list[str]) -> None:
        """These services' nodes have started; the server is SERVING once all of its have."""
        self._serving.update(services)
        for service in services:
            await self.servicer.set(service, SERVING)
        if self._serving >= self._services:
            await self.servicer.set("", SERVING)

    async def shutting_down(self) -> None:
        """NOT_SERVING for good: load balancers and `dmq health` stop sending work here."""
        await self.servicer.enter_graceful_shutdown()


def _lock_all(locks: list[DataDirLock]) -> None:
    """All or nothing: on the first directory in use, release the ones taken and raise."""
    taken: list[DataDirLock] = []
    try:
        for lock in locks:
            lock.acquire()
            taken.append(lock)
    except BaseException:
        for lock in taken:
            lock.release()
        raise


class LocalCluster:
    def __init__(self, options: ClusterOptions) -> None:
        self.options = options
        self.coordinator: CoordinatorNode | None = None
        self.brokers: list[BrokerNode] = []
        self._servers: list[grpc.aio.Server] = []
        self._health: list[ServerHealth] = []
        self._locked = False  # the data directories are ours: the nodes may be started and stopped
        self._locks: list[DataDirLock] = []  # taken first by start(), then held by the nodes
        self.bootstrap = ""
        # One /metrics endpoint per gRPC server (coordinator's first), when options.metrics_port is set.
        self.metrics_endpoints: list[MetricsEndpoint] = []

    def __repr__(self) -> str:
        return f"<LocalCluster bootstrap={self.bootstrap!r} brokers={len(self.brokers)}>"

    async def start(self) -> None:
        """Bind, lock the data directories, start; on failure or cancellation undo all of it."""
        try:
            await self._start()
        except BaseException:
            await self._abort_start()
            raise

    async def _start(self) -> None:
        o = self.options
        check_bind_security(o.host, o.security)
        cluster_client = o.security.cluster_client() if o.security is not None else None
        # Every data directory is locked before any port is bound: a second server on them must
        # refuse without ever listening (it accepted connections for ~50 ms, then exited). Each
        # node is handed the lock already held (acquire() on a held lock does nothing).
        locks = [DataDirLock(o.data_dir / "coordinator"), *(DataDirLock(o.data_dir / f"broker-{i}") for i in range(o.brokers))]
        _lock_all(locks)
        self._locks = locks
        coord_acls = AclView()
        coord_metrics = new_registry() if o.metrics_port is not None else None
        coord_server = _new_server(o.security, coord_acls, o.quotas, coord_metrics)
        self._servers.append(coord_server)
        port = bind(coord_server, o.host, o.port, o.security)
        self.bootstrap = f"{o.host}:{port}"
        self.coordinator = CoordinatorNode(
            o.data_dir / "coordinator",
            advertised_address=self.bootstrap,
            acls=coord_acls,
            client_security=cluster_client,
            principal_limits=exempting(o.principal_limits, o.security),
            broker_session_timeout_ms=o.broker_session_timeout_ms,
            default_subscription_mode=o.default_subscription_mode,
            rebalance_debounce_ms=o.rebalance_debounce_ms,
            metrics=coord_metrics,
            max_partition_series=o.max_partition_series,
            **{"default_replication_factor": o.replication_factor, **o.coordinator_kwargs},  # type: ignore[arg-type]
        )
        self.coordinator.dir_lock = locks[0]
        self.coordinator.add_to_server(coord_server)
        if coord_metrics is not None:
            endpoint = MetricsEndpoint(coord_metrics, o.host, _metrics_port(o.metrics_port, 0) or 0)
            endpoint.add_refresh(self.coordinator.lag_cache.refresh)
            self.metrics_endpoints.append(endpoint)
        coord_health = ServerHealth(coord_server)
        self._health.append(coord_health)
        await coord_health.starting([SERVICE_METADATA, SERVICE_GROUPS])
        broker_health: list[ServerHealth] = []
        for i in range(o.brokers):
            broker_acls = AclView()
            if i == 0 and o.shared_port and o.brokers == 1:
                # One server: its interceptor decides with the coordinator's own ACLs; the broker's
                # copy (a separate view, so its refresh can never roll the coordinator's back) is unused.
                server, broker_port, h = coord_server, port, coord_health
                registry = coord_metrics
            else:
                registry = new_registry() if o.metrics_port is not None else None
                server = _new_server(o.security, broker_acls, o.quotas, registry)
                self._servers.append(server)
                if registry is not None:
                    self.metrics_endpoints.append(
                        MetricsEndpoint(registry, o.host, _metrics_port(o.metrics_port, 1 + i) or 0))
                broker_port = bind(server, o.host, 0, o.security)
                h = ServerHealth(server)
                self._health.append(h)
            await h.starting([SERVICE_BROKER])
            broker_health.append(h)
            broker = BrokerNode(
                o.data_dir / f"broker-{i}",
                broker_id=i,
                coordinator_address=self.bootstrap,
                advertised_host=o.host,
                advertised_port=broker_port,
                log_config=o.log_config,
                retention_check_interval_ms=o.retention_check_interval_ms,
                acls=broker_acls,
                client_security=cluster_client,
                metrics=registry,
                max_partition_series=o.max_partition_series,
            )
            broker.dir_lock = locks[1 + i]
            broker.add_to_server(server)
            self.brokers.append(broker)
        self._locked = True
        for endpoint in self.metrics_endpoints:
            await endpoint.start()
        for server in self._servers:
            await server.start()
        await self.coordinator.start()
        await coord_health.serving([SERVICE_METADATA, SERVICE_GROUPS])
        for broker, h in zip(self.brokers, broker_health):
            await broker.start()
            await h.serving([SERVICE_BROKER])

    async def _abort_start(self) -> None:
        """Undo a failed or cancelled start: nothing may stay open, locked or listening."""
        try:
            if self._locked:
                await self._stop_nodes_and_servers(grace_s=0)
            else:  # nothing was opened (a busy port or a locked directory): close the sockets only
                for server in self._servers:
                    await server.stop(0)
                self._servers.clear()
        except Exception:  # noqa: BLE001 - the start failure is what the caller must see
            log.exception("cleaning up after a failed start failed")
        finally:
            for lock in self._locks:  # those no node released (its start never came)
                lock.release()
            self._locks.clear()

    async def stop(self) -> None:
        for h in self._health:
            await h.shutting_down()
        await self._stop_nodes_and_servers(grace_s=SHUTDOWN_GRACE_S)

    async def _stop_nodes_and_servers(self, grace_s: float) -> None:
        # End the group service's watch streams and long polls first: they would otherwise hold
        # the servers' grace period open. Then stop accepting calls, so no handler runs against a
        # closing log. Each step runs even if an earlier one failed: an unclosed log reopens
        # unclean, an unclosed SQLite file keeps its (non-daemon) thread and the process alive.
        try:
            await _stop_group_service(self.coordinator)
            for broker in self.brokers:
                broker.queues.end_pops()  # queue pops long-poll too
        finally:
            try:
                for server in self._servers:
                    await server.stop(grace_s)
            finally:
                try:
                    for broker in self.brokers:
                        await broker.stop()
                finally:
                    if self.coordinator is not None:
                        await self.coordinator.stop()
                    for endpoint in self.metrics_endpoints:
                        await endpoint.stop()
                    self._servers.clear()
                    self._health.clear()
                    self._locked = False

    async def stop_broker(self, index: int) -> None:
        """Stop one broker's server and node (a separate port only), as if its process ended."""
        broker = self.brokers[index]
        server = self._server_of(index)
        if server is not None:
            await server.stop(0)
        await broker.stop()

    def _server_of(self, index: int) -> grpc.aio.Server | None:
        o = self.options
        if o.shared_port and o.brokers == 1:
            return None
        return self._servers[1 + index]


async def _stop_group_service(node: CoordinatorNode | None) -> None:
    groups = getattr(node, "groups", None)
    if groups is not None:
        await groups.stop()


class ClusterThread:
    """A LocalCluster on its own event loop in a background thread; owner calls stop()."""

    def __init__(self, options: ClusterOptions) -> None:
        self.cluster = LocalCluster(options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="dmq-cluster", daemon=True)

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    def __repr__(self) -> str:
        return f"<ClusterThread {self.cluster!r}>"

    def start(self, timeout_s: float = 30.0) -> ClusterThread:
        self._thread.start()
        self.call(self.cluster.start(), timeout_s)
        return self

    def call(self, coro: object, timeout_s: float = 30.0) -> object:
        """Run a coroutine on the cluster's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)  # type: ignore[arg-type]

    def stop(self, timeout_s: float = 30.0) -> None:
        try:
            self.call(self.cluster.stop(), timeout_s)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)
            self._loop.close()

    def __enter__(self) -> ClusterThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def serve_until_signalled(
    start: Callable[[], Awaitable[object]], stop: Callable[[], Awaitable[object]], on_ready: Callable[[], None] | None = None
) -> None:
    """Start, wait for SIGINT/SIGTERM, stop cleanly (so the logs write their clean-shutdown marker).

    A signal during start cancels it (start undoes its own work then), so a broker that waits for
    an unreachable coordinator still stops at once. `stop()` runs only after a completed start.
    The handlers stay installed for the rest of the process (this is for process runners only): a
    second Ctrl-C must not interrupt the clean stop half-way (which would leave logs unclean), nor
    raise KeyboardInterrupt into the interpreter's exit. The first signal also arms a watchdog that
    ends the process STOP_DEADLINE_S later if it is still there (interpreter exit included).
    """
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    signalled_once = threading.Event()

    def on_signal(sig: signal.Signals) -> None:  # in the loop
        if stopping.is_set():
            log.info("already stopping", signal=sig.name)
            return
        stopping.set()
        log.info("stopping", signal=sig.name)

    def handler(signum: int, frame: object) -> None:
        # A plain handler, not loop.add_signal_handler: it runs even while the loop is blocked
        # (in a write to a full pipe, say), which is when the watchdog is needed.
        if not signalled_once.is_set():
            signalled_once.set()
            _arm_stop_watchdog(STOP_DEADLINE_S)
        with contextlib.suppress(RuntimeError):  # the loop has closed: the process is exiting
            loop.call_soon_threadsafe(on_signal, signal.Signals(signum))

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)
    starting = asyncio.ensure_future(start())
    signalled = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait([starting, signalled], return_when=asyncio.FIRST_COMPLETED)
    finally:
        signalled.cancel()
    if not starting.done():
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        return
    starting.result()  # a failed start raises here, after cleaning up after itself
    # Everything allocated so far (modules, servicers, open logs) lives as long as the process:
    # freezing it keeps the cyclic GC's full collections from walking it each time (10-20 ms
    # pauses of the event loop, stalling every in-flight request, otherwise ~1 ms). Collect first,
    # so that start-up garbage in reference cycles is freed rather than frozen for good.
    gc.collect()
    gc.freeze()
    try:
        if on_ready is not None:
            on_ready()
        await stopping.wait()
    finally:
        await stop()


def _arm_stop_watchdog(deadline_s: float) -> None:
    def expire() -> None:
        # Not through structlog: its lock or stream may be what is stuck. Non-blocking, since
        # stderr may be the full pipe that blocks everything else.
        with contextlib.suppress(OSError, ValueError):
            os.set_blocking(2, False)
            os.write(2, f"dmq: did not stop within {deadline_s:g}s of the signal; exiting now\n".encode())
        os._exit(1)

    timer = threading.Timer(deadline_s, expire)
    timer.daemon = True  # never what keeps the process alive
    timer.start()


async def run_coordinator_only(
    data_dir: pathlib.Path, host: str, port: int, on_ready: Callable[[str], None], *,
    security: ServerSecurity | None = None, quotas: QuotaSettings | None = None,
    principal_limits: PrincipalLimits | None = None, metrics_port: int | None = None,
    on_metrics: Callable[[str], None] | None = None, advertise: str | None = None, **kwargs: object
) -> None:
    """`metrics_port`: None no /metrics endpoint, 0 a free port, else that port; `on_metrics` gets its URL.
    `advertise`: the address brokers and clients are told to use (default: host and the bound port).
    With `lease_ttl_s` (several coordinators on one etcd), a coordinator deposed by a lapsed lease
    stands by again in the same process (dmq.coordinator.node)."""
    acls, registry, server, lock, bound = _bound_server(data_dir, host, port, security, quotas, metrics_port)
    node = CoordinatorNode(
        data_dir, advertised_address=advertise or f"{host}:{bound}", acls=acls,
        client_security=security.cluster_client() if security is not None else None,
        principal_limits=exempting(principal_limits, security),
        metrics=registry,
        **kwargs,  # type: ignore[arg-type]
    )
    node.dir_lock = lock
    node.add_to_server(server)
    server_health = ServerHealth(server)
    services = [SERVICE_METADATA, SERVICE_GROUPS]
    endpoint = MetricsEndpoint(registry, host, metrics_port or 0) if registry is not None else None
    if endpoint is not None:
        endpoint.add_refresh(node.lag_cache.refresh)

    async def start() -> None:
        node.dir_lock.acquire()
        try:
            await server_health.starting(services)
            await server.start()
            await node.start()
            if endpoint is not None:
                await endpoint.start()
                if on_metrics is not None:
                    on_metrics(endpoint.url)
        except BaseException:
            await _stop_quietly(node.stop(), server.stop(0), *([endpoint.stop()] if endpoint else []))
            raise
        await server_health.serving(services)

    async def stop() -> None:
        await server_health.shutting_down()
        try:
            await _stop_group_service(node)
        finally:
            await _stop_in_order(server, node, endpoint)

    await serve_until_signalled(start, stop, lambda: on_ready(f"{host}:{bound}"))


async def run_broker_only(
    data_dir: pathlib.Path,
    host: str,
    port: int,
    broker_id: int,
    coordinator: str,
    on_ready: Callable[[str], None],
    log_config: LogConfig | None = None,
    security: ServerSecurity | None = None,
    quotas: QuotaSettings | None = None,
    rack: str = "",
    replica_lag_time_max_ms: int = REPLICA_LAG_TIME_MAX_MS_DEFAULT,
    replica_ack_timeout_ms: int = REPLICA_ACK_TIMEOUT_MS_DEFAULT,
    metrics_port: int | None = None,
    on_metrics: Callable[[str], None] | None = None,
    max_partition_series: int = DEFAULT_MAX_PARTITION_SERIES,
) -> None:
    acls, registry, server, lock, bound = _bound_server(data_dir, host, port, security, quotas, metrics_port,
                                                        before=_keep_large_buffers)
    node = BrokerNode(
        data_dir,
        broker_id=broker_id,
        coordinator_address=coordinator,
        advertised_host=host,
        advertised_port=bound,
        log_config=log_config,
        acls=acls,
        client_security=security.cluster_client() if security is not None else None,
        rack=rack,
        replica_lag_time_max_ms=replica_lag_time_max_ms,
        replica_ack_timeout_ms=replica_ack_timeout_ms,
        metrics=registry,
        max_partition_series=max_partition_series,
    )
    node.dir_lock = lock
    node.add_to_server(server)
    server_health = ServerHealth(server)
    endpoint = MetricsEndpoint(registry, host, metrics_port or 0) if registry is not None else None

    async def start() -> None:
        node.dir_lock.acquire()
        try:
            await server_health.starting([SERVICE_BROKER])
            await server.start()
            if endpoint is not None:  # before registering: a broker waiting for its coordinator is worth watching
                await endpoint.start()
                if on_metrics is not None:
                    on_metrics(endpoint.url)
            # Where it listens before it is ready (`listening on` comes after the registration):
            # health checks can watch a broker that waits for its coordinator.
            log.info("broker started, registering with its coordinator", address=f"{host}:{bound}",
                     coordinator=coordinator)
            # Waits (cancellably) until the coordinator has taken the registration.
            await node.start()
        except BaseException:
            await _stop_quietly(server.stop(0), node.stop(), *([endpoint.stop()] if endpoint else []))
            raise
        await server_health.serving([SERVICE_BROKER])

    async def stop() -> None:
        await server_health.shutting_down()
        node.queues.end_pops()  # waiting queue pops answer now, not after the grace period
        await _stop_in_order(server, node, endpoint)

    await serve_until_signalled(start, stop, lambda: on_ready(f"{host}:{bound}"))


async def _stop_in_order(server: grpc.aio.Server, node: CoordinatorNode | BrokerNode,
                         endpoint: MetricsEndpoint | None) -> None:
    """A clean stop: the gRPC server (its grace period lets calls in flight finish), then the
    node, then the metrics endpoint; each one even when the one before failed."""
    try:
        await server.stop(SHUTDOWN_GRACE_S)
    finally:
        try:
            await node.stop()
        finally:
            if endpoint is not None:
                await endpoint.stop()


def _bound_server(
    data_dir: pathlib.Path, host: str, port: int, security: ServerSecurity | None, quotas: QuotaSettings | None,
    metrics_port: int | None, *, before: Callable[[], None] | None = None,
) -> tuple[AclView, CollectorRegistry | None, grpc.aio.Server, DataDirLock, int]:
    """A server process's first steps, before its node exists: check the security settings for
    the address (then run `before`), its ACL view, its metrics registry (when a /metrics port is
    asked for), the gRPC server, and the data directory locked, then bound (_locked_then_bound).
    Answers (acls, registry, server, lock, bound port)."""
    check_bind_security(host, security)
    if before is not None:
        before()
    acls = AclView()
    registry = new_registry() if metrics_port is not None else None
    server = _new_server(security, acls, quotas, registry)
    lock = DataDirLock(data_dir)
    return acls, registry, server, lock, _locked_then_bound(lock, server, host, port, security)


def _locked_then_bound(
    lock: DataDirLock, server: grpc.aio.Server, host: str, port: int, security: ServerSecurity | None
) -> int:
    """Lock the data directory, then bind (see the module docstring): a server refused its
    directory never listens. The lock is released again if the bind fails."""
    lock.acquire()
    try:
        return bind(server, host, port, security)
    except BaseException:
        lock.release()
        raise


def _keep_large_buffers() -> None:
    # A broker's Fetch answers and Produce requests are multi-megabyte buffers: reuse heap memory
    # for them instead of page-faulting fresh mmap()s in (see dmq.client._malloc_tuning for the
    # figures). Process-wide, so only the processes that host a broker set it.
    # Debug only: a start that fails (a busy port) must print its one line and nothing else.
    log.debug("allocator tuned", malloc_large_buffers=keep_large_buffers())


async def _stop_quietly(*steps: Coroutine[object, object, object]) -> None:
    """Run every cleanup step in order; a failing one is logged, the start failure is what counts."""
    for step in steps:
        try:
            await step
        except Exception:  # noqa: BLE001
            log.exception("cleaning up after a failed start failed")


async def run_embedded(options: ClusterOptions, on_ready: Callable[[LocalCluster], None]) -> None:
    _keep_large_buffers()
    cluster = LocalCluster(options)
    await serve_until_signalled(cluster.start, cluster.stop, lambda: on_ready(cluster))
