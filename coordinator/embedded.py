"""Running the parts: the embedded server, a coordinator alone, a broker alone, and test clusters.

`LocalCluster` puts a coordinator and N brokers in one asyncio loop. With one broker and
`shared_port=True` (the `dmq server` default) both sit on one gRPC server and one port; otherwise
each has its own server and port. `ClusterThread` runs a LocalCluster on a private event loop in a
background thread, so synchronous clients (Producer, DMQConsumer) can talk to it from the test's
own thread without sharing its loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import pathlib
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import structlog

from dmq.broker.log import LogConfig
from dmq.broker.node import BrokerNode
from dmq.coordinator.metadata import DEFAULT_BROKER_SESSION_TIMEOUT_MS
from dmq.coordinator.node import CoordinatorNode
from dmq.proto.grpc_options import server_options

log = structlog.get_logger(__name__)

SHUTDOWN_GRACE_S = 2.0


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


# Bounds the calls a process serves at once (long polls and watch streams included); past it
# gRPC answers RESOURCE_EXHAUSTED instead of queueing without limit.
MAX_CONCURRENT_RPCS = 50_000


def _new_server() -> grpc.aio.Server:
    return grpc.aio.server(options=server_options(), maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS)


class LocalCluster:
    def __init__(self, options: ClusterOptions) -> None:
        self.options = options
        self.coordinator: CoordinatorNode | None = None
        self.brokers: list[BrokerNode] = []
        self._servers: list[grpc.aio.Server] = []
        self.bootstrap = ""

    def __repr__(self) -> str:
        return f"<LocalCluster bootstrap={self.bootstrap!r} brokers={len(self.brokers)}>"

    async def start(self) -> None:
        o = self.options
        o.data_dir.mkdir(parents=True, exist_ok=True)
        coord_server = _new_server()
        port = coord_server.add_insecure_port(f"{o.host}:{o.port}")
        if port == 0:
            raise OSError(f"cannot listen on {o.host}:{o.port}: the port is taken or the address is wrong")
        self._servers.append(coord_server)
        self.bootstrap = f"{o.host}:{port}"
        self.coordinator = CoordinatorNode(
            o.data_dir / "coordinator",
            advertised_address=self.bootstrap,
            broker_session_timeout_ms=o.broker_session_timeout_ms,
            default_subscription_mode=o.default_subscription_mode,
            rebalance_debounce_ms=o.rebalance_debounce_ms,
            **o.coordinator_kwargs,  # type: ignore[arg-type]
        )
        self.coordinator.add_to_server(coord_server)
        for i in range(o.brokers):
            if i == 0 and o.shared_port and o.brokers == 1:
                server, broker_port = coord_server, port
            else:
                server = _new_server()
                broker_port = server.add_insecure_port(f"{o.host}:0")
                self._servers.append(server)
            broker = BrokerNode(
                o.data_dir / f"broker-{i}",
                broker_id=i,
                coordinator_address=self.bootstrap,
                advertised_host=o.host,
                advertised_port=broker_port,
                log_config=o.log_config,
                retention_check_interval_ms=o.retention_check_interval_ms,
            )
            broker.add_to_server(server)
            self.brokers.append(broker)
        for server in self._servers:
            await server.start()
        await self.coordinator.start()
        for broker in self.brokers:
            await broker.start()

    async def stop(self) -> None:
        # End the group service's watch streams and long polls first: they would otherwise hold
        # the servers' grace period open. Then stop accepting calls, so no handler runs against a
        # closing log.
        await _stop_group_service(self.coordinator)
        for server in self._servers:
            await server.stop(SHUTDOWN_GRACE_S)
        for broker in self.brokers:
            await broker.stop()
        if self.coordinator is not None:
            await self.coordinator.stop()
        self._servers.clear()

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
    start: Callable[[], object], stop: Callable[[], object], on_ready: Callable[[], None] | None = None
) -> None:
    """Start, wait for SIGINT/SIGTERM, stop cleanly (so the logs write their clean-shutdown marker)."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    await start()  # type: ignore[misc]
    # Everything allocated so far (modules, servicers, open logs) lives as long as the process:
    # freezing it keeps the cyclic GC's full collections from walking it each time (10-20 ms
    # pauses of the event loop, stalling every in-flight request, otherwise ~1 ms). Collect first,
    # so that start-up garbage in reference cycles is freed rather than frozen for good.
    gc.collect()
    gc.freeze()
    if on_ready is not None:
        on_ready()
    try:
        await stopping.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(Exception):
                loop.remove_signal_handler(sig)
        await stop()  # type: ignore[misc]


async def run_coordinator_only(
    data_dir: pathlib.Path, host: str, port: int, on_ready: Callable[[str], None], **kwargs: object
) -> None:
    server = _new_server()
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}: the port is taken or the address is wrong")
    node = CoordinatorNode(data_dir, advertised_address=f"{host}:{bound}", **kwargs)  # type: ignore[arg-type]
    node.add_to_server(server)

    async def start() -> None:
        await server.start()
        await node.start()

    async def stop() -> None:
        await _stop_group_service(node)
        await server.stop(SHUTDOWN_GRACE_S)
        await node.stop()

    await serve_until_signalled(start, stop, lambda: on_ready(f"{host}:{bound}"))


async def run_broker_only(
    data_dir: pathlib.Path,
    host: str,
    port: int,
    broker_id: int,
    coordinator: str,
    on_ready: Callable[[str], None],
    log_config: LogConfig | None = None,
) -> None:
    server = _new_server()
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}: the port is taken or the address is wrong")
    node = BrokerNode(
        data_dir,
        broker_id=broker_id,
        coordinator_address=coordinator,
        advertised_host=host,
        advertised_port=bound,
        log_config=log_config,
    )
    node.add_to_server(server)

    async def start() -> None:
        await server.start()
        await node.start()

    async def stop() -> None:
        await server.stop(SHUTDOWN_GRACE_S)
        await node.stop()

    await serve_until_signalled(start, stop, lambda: on_ready(f"{host}:{bound}"))


async def run_embedded(options: ClusterOptions, on_ready: Callable[[LocalCluster], None]) -> None:
    cluster = LocalCluster(options)
    await serve_until_signalled(cluster.start, cluster.stop, lambda: on_ready(cluster))
