"""The coordinator node: the metadata service, the group coordinator, their SQLite file and tasks.

Lifecycle (the owner is the process runner or a test fixture):
  1. `CoordinatorNode(...)`, `add_to_server(server)`, `server.start()`;
  2. `await start()`: lock the data directory (dmq.proto.server.dirlock: a second process on it fails at
     once), open <data_dir>/coordinator.sqlite, load brokers and topics, start the broker
     liveness monitor, then start the attached components (the group coordinator);
  3. `await stop()`: stop the components and the monitor (bounded waits), the controller's
     background work (reassignments, state pushes), close the broker channels and SQLite, release
     the lock. Every step runs even when an earlier one fails.

The monitor (one task) is also the controller's clock: every liveness_check_interval_ms (a tenth
of the broker session) it ends expired sessions and elects new leaders for what
those brokers led, so a new leader is pushed within session + one interval of a broker's last
heartbeat (a broker known from the store that does not re-register within a session of the start
is declared dead the same way; a pause of the coordinator itself restarts the sessions instead:
dmq.coordinator.controller.sessions); every preferred_leader_check_interval_ms it hands leadership
back to preferred replicas that are in sync again.
Until `start()` has loaded the state, metadata RPCs are answered UNAVAILABLE ("coordinator is
starting: retry"), since the server may already be taking calls (`dmq server` shares its port).

Several coordinators on one etcd (`lease_ttl_s` given; dmq.coordinator.controller.leadership):
`start()` opens the store and stands by; the node takes control (step 2's claim, load, monitor,
components) only once elected, and answers metadata RPCs meanwhile with NOT_COORDINATOR naming
the active one. Deposed (its lease not renewed in time), it stops acting at once (every check reads
the lease's deadline from the clock) and steps down: the duties the active role started (the
group service with its timers and streams, the liveness monitor, reassignments, pushes in flight)
are stopped, `on_deposed` is called, and it stands by again in the same process; elected again
later, it claims a new, higher controller epoch and reloads everything from the store.
`stop()` resigns, so a standby takes over at once.

Components. The group coordinator is a NodeComponent (add_to_server / start / stop) built by
`dmq.coordinator.group_service.build(node)` in __init__ and kept as `node.groups`;
`attach(component)` adds any other.
Components start after the metadata is loaded and stop before it closes, so they may use
`node.metadata`, `node.store` and `node.broker_pool` throughout their life.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import time
from collections.abc import Callable
from typing import Any, Protocol

import grpc
import structlog
from prometheus_client import CollectorRegistry

from dmq.coordinator.acls import AclManager
from dmq.coordinator.broker_calls import DEFAULT_BROKER_CALL_TIMEOUT_MS
from dmq.coordinator.broker_pool import BrokerPool
from dmq.coordinator.controller.controller import DEFAULT_PREFERRED_LEADER_CHECK_INTERVAL_MS
from dmq.coordinator.controller.leadership import Leadership, NotCoordinatorError
from dmq.coordinator.controller.sessions import DEFAULT_BROKER_SESSION_TIMEOUT_MS, wall_clock_ms
from dmq.coordinator.controller.status import CoordinatorStatusServicer
from dmq.coordinator.group_service import build as build_group_service
from dmq.coordinator.metadata import MetadataManager
from dmq.coordinator.metadata_errors import CoordinatorStartingError, MetadataError
from dmq.coordinator.metadata_service import MetadataServicer
from dmq.coordinator.metastore.base import MetadataStore
from dmq.coordinator.metrics import DEFAULT_MAX_PARTITION_SERIES
from dmq.coordinator.metrics import install as install_metrics
from dmq.coordinator.pause_watch import PauseWatch
from dmq.coordinator.principal_limits import PrincipalLimits
from dmq.coordinator.store import CoordinatorStore
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.security.settings import ClientSecurity
from dmq.proto.server.dirlock import DataDirLock
from dmq.proto.server.metrics import new_registry
from dmq.proto.server.security.interceptor import AclView
from dmq.proto.topic_settings import TopicConfigDefaults

log = structlog.get_logger(__name__)

SQLITE_FILE = "coordinator.sqlite"
STOP_TIMEOUT_S = 5.0
LIVENESS_CHECK_MAX_INTERVAL_MS = 100
SUBSCRIPTION_MODES = ("all", "new", "timestamp")


class NodeComponent(Protocol):
    def add_to_server(self, server: grpc.aio.Server) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class CoordinatorNode:
    def __init__(
        self,
        data_dir: pathlib.Path,
        *,
        advertised_address: str,
        broker_session_timeout_ms: int = DEFAULT_BROKER_SESSION_TIMEOUT_MS,
        default_subscription_mode: str = "all",
        default_subscription_from_ms: int | None = None,
        rebalance_debounce_ms: int = 500,
        default_topic_config: TopicConfigDefaults | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        broker_call_timeout_ms: int = DEFAULT_BROKER_CALL_TIMEOUT_MS,
        liveness_check_interval_ms: int | None = None,
        acls: AclView | None = None,
        client_security: ClientSecurity | None = None,
        principal_limits: PrincipalLimits | None = None,
        default_replication_factor: int | None = None,
        preferred_leader_check_interval_ms: int = DEFAULT_PREFERRED_LEADER_CHECK_INTERVAL_MS,
        metrics: CollectorRegistry | None = None,
        max_partition_series: int = DEFAULT_MAX_PARTITION_SERIES,
        metadata_store: MetadataStore | None = None,
        lease_ttl_s: int | None = None,
        on_active: Callable[[int], None] | None = None,
        on_deposed: Callable[[], None] | None = None,
    ) -> None:
        if default_subscription_mode not in SUBSCRIPTION_MODES:
            raise ValueError(
                f"default_subscription_mode must be one of {SUBSCRIPTION_MODES}, got {default_subscription_mode!r}"
            )
        # A default of `timestamp` is only usable with a time to start from: refused here, at
        # start, rather than accepted and then failing every consumer that names no mode.
        if default_subscription_mode == "timestamp":
            if default_subscription_from_ms is None or default_subscription_from_ms <= 0:
                raise ValueError(
                    "default_subscription_mode 'timestamp' needs default_subscription_from_ms > 0 "
                    f"(wall-clock milliseconds), got {default_subscription_from_ms!r}"
                )
        elif default_subscription_from_ms is not None:
            raise ValueError(
                "default_subscription_from_ms is only used with default_subscription_mode 'timestamp' "
                f"(the mode is {default_subscription_mode!r})"
            )
        if preferred_leader_check_interval_ms <= 0:
            raise ValueError(f"preferred_leader_check_interval_ms must be > 0, got {preferred_leader_check_interval_ms}")
        if rebalance_debounce_ms < 0:
            raise ValueError(f"rebalance_debounce_ms must be >= 0, got {rebalance_debounce_ms}")
        self.data_dir = pathlib.Path(data_dir)
        self.advertised_address = advertised_address
        self.broker_session_timeout_ms = broker_session_timeout_ms
        self.default_subscription_mode = default_subscription_mode
        self.default_subscription_from_ms = default_subscription_from_ms
        self.rebalance_debounce_ms = rebalance_debounce_ms
        self.clock_ms = clock_ms
        # Liveness reads use the clock directly (BrokerMembership._alive); the monitor ends sessions
        # and elects new leaders within a tenth of a session, and at most 100 ms, of the expiry (the
        # issue's bound on a new leader is session + 1 s; a pass over the brokers costs microseconds).
        self.liveness_check_interval_ms = liveness_check_interval_ms or max(
            10, min(LIVENESS_CHECK_MAX_INTERVAL_MS, broker_session_timeout_ms // 10))
        self.preferred_leader_check_interval_ms = preferred_leader_check_interval_ms
        # The embedded default is SQLite in the data directory; etcd when given (metastore.config).
        self.store: MetadataStore = metadata_store or CoordinatorStore(self.data_dir / SQLITE_FILE)
        self.dir_lock = DataDirLock(self.data_dir)
        self.broker_pool = BrokerPool(security=client_security)
        # The ACLs the servers decide with, loaded from the store at start (dmq.coordinator.acls).
        self.acls = acls or AclView()
        self.metadata = MetadataManager(
            self.store,
            self.broker_pool,
            broker_session_timeout_ms=broker_session_timeout_ms,
            broker_call_timeout_ms=broker_call_timeout_ms,
            default_topic_config=default_topic_config,
            principal_limits=principal_limits,
            clock_ms=clock_ms,
            default_replication_factor=default_replication_factor,
            # A gap of several checks means the coordinator was not running; half a session at
            # least, so a broker heartbeating on time is never expired by a shorter pause.
            pause_watch=PauseWatch(max(broker_session_timeout_ms // 2, 4 * self.liveness_check_interval_ms)),
        )
        self.acl_manager = AclManager(self.store, self.acls)
        self.metadata_service = MetadataServicer(self.metadata, self.acl_manager)
        # None: the only coordinator of its store (SQLite, or etcd without an election).
        self.leadership: Leadership | None = None
        if lease_ttl_s is not None:
            self.leadership = Leadership(
                self.store, advertised_address, lease_ttl_s,  # type: ignore[arg-type]  # an etcd store
                on_elected=self._elected, on_deposed=self._step_down,
            )
            self.metadata.acting = self.metadata.pusher.acting = self.leadership.leading
            self.metadata.not_ready_error = self._refusal
        self.controller_epoch = 0
        self._on_active = on_active
        self.on_deposed = on_deposed  # the process runner may set it after construction
        self.components: list[NodeComponent] = []
        self.groups: Any = None  # the group coordinator component, when there is one
        self._tasks: list[asyncio.Task[None]] = []
        self._active_tasks: list[asyncio.Task[None]] = []  # the active role's, stopped on stepping down
        self._stopping = asyncio.Event()
        self._started = False
        self.groups = build_group_service(self)
        self.attach(self.groups)
        # The server's Prometheus registry (dmq.proto.server.metrics), never the process-global one; the
        # endpoint awaits lag_cache.refresh before each scrape (consumer lag asks the brokers).
        self.metrics = metrics if metrics is not None else new_registry()
        self.lag_cache = install_metrics(self, self.metrics, max_partition_series=max_partition_series)

    def __repr__(self) -> str:
        return (
            f"<CoordinatorNode address={self.advertised_address!r} started={self._started} "
            f"topics={len(self.metadata.topics())} live_brokers={len(self.metadata.live_broker_ids())} "
            f"components={len(self.components)}>"
        )

    def attach(self, component: NodeComponent) -> None:
        """Add a component (before add_to_server and start)."""
        if self._started:
            raise RuntimeError("attach components before start()")
        self.components.append(component)

    def add_to_server(self, server: grpc.aio.Server) -> None:
        pb_grpc.add_MetadataServicer_to_server(self.metadata_service, server)  # type: ignore[no-untyped-call]  # generated stubs are untyped
        pb_grpc.add_CoordinatorStatusServicer_to_server(CoordinatorStatusServicer(self), server)  # type: ignore[no-untyped-call]  # generated stubs are untyped
        for component in self.components:
            component.add_to_server(server)

    async def start(self) -> None:
        if self._started:
            raise RuntimeError("coordinator node already started")
        # Before the SQLite file is opened: two coordinators on one file would each keep their
        # own view of topics and placement and overwrite each other's.
        self.dir_lock.acquire()
        try:
            await self.store.open()
        except BaseException:
            self.dir_lock.release()
            raise
        try:
            if self.leadership is not None:
                self._started = True
                self._tasks.append(asyncio.create_task(self._lead(), name="coordinator-leadership"))
                log.info("coordinator standing by", address=self.advertised_address, lease_ttl_s=self.leadership.ttl_s)
                return
            # Fences every write of a coordinator that took control before this one (metastore.base).
            self.controller_epoch = self.metadata.pusher.controller_epoch = await self.store.claim_controller_epoch()
            await self._take_control()
        except BaseException:
            await self.stop()
            raise

    async def _take_control(self) -> None:
        """Load the state and start the controller and group duties (the claim is the caller's)."""
        self.metadata.pusher.reopen()  # closed by an earlier term's step-down
        await self.metadata.load()
        await self.acl_manager.load()
        self._started = True
        self._active_tasks.append(asyncio.create_task(self._liveness_loop(), name="coordinator-broker-liveness"))
        for component in self.components:
            await component.start()
        log.info(
            "coordinator started",
            address=self.advertised_address,
            data_dir=str(self.data_dir),
            topics=len(self.metadata.topics()),
            brokers=len(self.metadata.brokers()),
        )

    async def stop(self) -> None:
        self._stopping.set()
        self.metadata.ready = False
        try:
            for component in reversed(self.components):
                try:
                    await asyncio.wait_for(component.stop(), STOP_TIMEOUT_S)
                except Exception:  # noqa: BLE001 - the rest must still be closed
                    log.exception("component failed to stop", component=repr(component))
            await self._cancel(self._tasks + self._active_tasks)
            self._tasks.clear()
            self._active_tasks.clear()
            try:
                await asyncio.wait_for(self.metadata.close(), STOP_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - the channels and SQLite must still be closed
                log.exception("controller background work failed to stop")
            if self.leadership is not None:
                # After every duty stopped: the standby that takes over never overlaps with them.
                await asyncio.wait_for(self.leadership.resign(), STOP_TIMEOUT_S)
        finally:
            try:
                await self.broker_pool.close()
            finally:
                try:
                    # aiosqlite's thread is not a daemon: an unclosed store would keep the process alive.
                    await self.store.close()
                finally:
                    self.dir_lock.release()
        self._started = False
        log.info("coordinator stopped", address=self.advertised_address)

    async def _liveness_loop(self) -> None:
        interval_s = self.liveness_check_interval_ms / 1000
        self.metadata.membership.pause_watch.arm()  # observed from now on at every check (dmq.coordinator.pause_watch)
        next_preferred_s = time.monotonic() + self.preferred_leader_check_interval_ms / 1000
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), interval_s)
            if self._stopping.is_set():
                return
            if not self.metadata.acting():
                continue  # deposed, stepping down (this task is cancelled): the new active one decides now
            try:
                await self.metadata.controller.check_brokers()
            except Exception:  # noqa: BLE001 - the monitor must keep running (a failed election is retried)
                log.exception("broker liveness check failed")
            if time.monotonic() >= next_preferred_s:
                next_preferred_s = time.monotonic() + self.preferred_leader_check_interval_ms / 1000
                try:
                    await self.metadata.controller.rebalance_preferred_leaders()
                except Exception:  # noqa: BLE001 - retried at the next check
                    log.exception("preferred leader check failed")

    # -- several coordinators: the election's callbacks (dmq.coordinator.controller.leadership) ----

    async def _cancel(self, tasks: list[asyncio.Task[None]]) -> None:
        for task in tasks:
            task.cancel()
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
            if pending:
                log.error("coordinator tasks did not stop in time", tasks=[t.get_name() for t in pending])

    async def _lead(self) -> None:
        assert self.leadership is not None
        await self.leadership.run()  # until stop() cancels it: elected, deposed, standing by, again

    async def _elected(self) -> None:
        started = time.monotonic()
        # Fences every write of the coordinator that led before (metastore.base).
        self.controller_epoch = self.metadata.pusher.controller_epoch = await self.store.claim_controller_epoch()
        await self._take_control()
        # took_ms: the claim, the load and the duties' start, the part of a takeover after the
        # lease lapsed (bench/coordinator_failover_bench.py reads it).
        log.info("coordinator active", address=self.advertised_address, controller_epoch=self.controller_epoch,
                 took_ms=round((time.monotonic() - started) * 1000, 1))
        if self._on_active is not None:
            self._on_active(self.controller_epoch)

    async def _step_down(self) -> None:
        """Deposed: stop every duty of the active role (bounded waits), then stand by. Nothing acts
        meanwhile: every RPC, timer and push checks `leadership.leading()` first."""
        self.metadata.ready = False
        for component in reversed(self.components):
            try:
                await asyncio.wait_for(component.stop(), STOP_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - the rest must still be stopped
                log.exception("component failed to stop", component=repr(component))
        active, self._active_tasks = self._active_tasks, []
        await self._cancel(active)
        try:
            await asyncio.wait_for(self.metadata.close(), STOP_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - standing by must not fail
            log.exception("controller background work failed to stop")
        log.warning("coordinator standing by after losing leadership", address=self.advertised_address,
                    controller_epoch=self.controller_epoch)
        if self.on_deposed is not None:
            self.on_deposed()

    def _refusal(self) -> MetadataError:
        lead = self.leadership
        if lead is None or (not lead.deposed and lead.active_address == self.advertised_address):
            return CoordinatorStartingError()  # elected, still loading
        return NotCoordinatorError(None if lead.deposed else lead.active_address)
