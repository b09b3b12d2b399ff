"""A storage broker: its logs, its offset store, and its link to the coordinator.

Lifecycle (the owner is the process runner or a test fixture):
  1. `BrokerNode(...)`, `add_to_server(server)`, `server.start()`;
  2. `await start()`: lock the data directory (dmq.proto.server.dirlock: a second process on it fails at
     once), recover the logs, open the offset store, register with the coordinator (which answers
     with every partition placed here) and start the background tasks;
  3. `await stop()`: stop the tasks, flush and close the logs cleanly (clean-shutdown marker),
     release the lock.
Until `start()` finishes, requests get UNAVAILABLE ("starting; retry"): one gate, dmq.broker.readiness.

`start()` may be cancelled at any point (a SIGTERM while the coordinator is unreachable): the
registration retries are cancellable, and the local opening of logs and offsets runs to its end
(it cannot be interrupted half-way without leaving threads behind), after which `stop()` closes it.

Background tasks, all owned here and stopped by `stop()`:
  - heartbeat to the coordinator every `heartbeat_interval_ms` (re-register when it forgot us);
  - retention every `retention_check_interval_ms`;
  - the interval flusher when the log flush policy is "interval";
  - replication (broker/replication/manager.py): the followers' fetch loops, the leaders' in-sync
    set checks and their AlterIsr calls; stopped before the logs close.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import time
from dataclasses import replace
from typing import Any

import grpc
import structlog
from prometheus_client import CollectorRegistry

from dmq.broker.append_notifier import AppendNotifier
from dmq.broker.coordinator_link import CoordinatorLink, split_coordinators
from dmq.broker.events.registry import EventStores
from dmq.broker.events.service import EventStoreServicer
from dmq.broker.log import LogConfig, LogManager
from dmq.broker.memory_budget import ByteBudget
from dmq.broker.metrics import DEFAULT_MAX_PARTITION_SERIES, BrokerCollector, TopicTraffic, timed_fsync
from dmq.broker.offsets import OffsetStore
from dmq.broker.queue.manager import QueueManager
from dmq.broker.queue.service import QueueServicer
from dmq.broker.replication.manager import ReplicaManager, ReplicatedDurability
from dmq.broker.replication.settings import REPLICA_ACK_TIMEOUT_MS_DEFAULT, REPLICA_LAG_TIME_MAX_MS_DEFAULT
from dmq.broker.replication.stage_trace import StageTrace
from dmq.broker.service import BrokerService
from dmq.broker.servicers import add_broker_servicers
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import error_details
from dmq.proto.event_headers import KIND_EVENT_STORE
from dmq.proto.grpc_options import channel_options
from dmq.proto.security.acls import Acl, AclSet
from dmq.proto.security.settings import ClientSecurity, aio_channel
from dmq.proto.server.dirlock import DataDirLock
from dmq.proto.server.metrics import new_registry
from dmq.proto.server.security.interceptor import AclView
from dmq.proto.server.server_errors import fail

log = structlog.get_logger(__name__)


LEADER_CACHE_MS = 2_000
COORDINATOR_RPC_TIMEOUT_S = 5.0
# Going round the coordinators without an answer (an election under way): one heartbeat per this long.
FOLLOW_PAUSE_S = 0.1
# The channel to the coordinator retries its connection at least this often (gRPC jitters it
# +-20%): a restarted coordinator hears from every broker within about a second. gRPC's default
# backoff grows to 120 s, and kept brokers away 9.5-18 s after a 30 s coordinator outage, during
# which commits failed and their sessions were not running (issue 28).
COORDINATOR_RECONNECT_BACKOFF_MAX_MS = 1_000


# The topic settings a partition log applies: TopicConfig field -> LogConfig field.
_LOG_CONFIG_FIELDS = (
    ("retention_ms", "retention_ms"),
    ("retention_bytes", "retention_bytes"),
    ("segment_bytes", "segment_bytes"),
    ("segment_ms", "segment_ms"),
    ("max_message_bytes", "max_batch_bytes"),
    ("dedup_window_ms", "dedup_window_ms"),
)


def log_config_for(base: LogConfig, config: pb.TopicConfig) -> LogConfig:
    """The broker's defaults overridden by the topic's explicit settings."""
    changes: dict[str, Any] = {  # LogConfig fields by name, for replace()
        field: getattr(config, name) for name, field in _LOG_CONFIG_FIELDS if config.HasField(name)
    }
    return replace(base, **changes) if changes else base


class BrokerNode:
    def __init__(
        self,
        data_dir: pathlib.Path,
        *,
        broker_id: int,
        coordinator_address: str,
        advertised_host: str,
        advertised_port: int,
        log_config: LogConfig | None = None,
        max_open_files: int = 1000,
        retention_check_interval_ms: int = 60_000,
        acls: AclView | None = None,
        client_security: ClientSecurity | None = None,
        replica_lag_time_max_ms: int = REPLICA_LAG_TIME_MAX_MS_DEFAULT,
        replica_ack_timeout_ms: int = REPLICA_ACK_TIMEOUT_MS_DEFAULT,
        rack: str = "",
        metrics: CollectorRegistry | None = None,
        max_partition_series: int = DEFAULT_MAX_PARTITION_SERIES,
    ) -> None:
        # The server's Prometheus registry (dmq.proto.server.metrics): shared with the coordinator when
        # both sit on one server (`dmq server`), never the process-global one.
        self.metrics = metrics if metrics is not None else new_registry()
        self.data_dir = pathlib.Path(data_dir)
        self.broker_id = broker_id
        # One or several coordinators ("h1:p,h2:p"): the link follows the active one (coordinator_link).
        self._link = CoordinatorLink(
            split_coordinators(coordinator_address),
            lambda address: aio_channel(address, self.client_security,
                                        channel_options(reconnect_backoff_max_ms=COORDINATOR_RECONNECT_BACKOFF_MAX_MS)),
        )
        self.advertised_host = advertised_host
        self.advertised_port = advertised_port
        self.rack = rack  # rack / zone label: the controller spreads a partition's replicas over racks
        self.log_config = log_config or LogConfig()
        self.retention_check_interval_ms = retention_check_interval_ms
        # The ACLs this broker's server decides with: the coordinator's, copied when its
        # heartbeat answer shows a newer version. `client_security`: how this broker calls the
        # coordinator (TLS, and the cluster principal's certificate or token).
        self.acls = acls or AclView()
        self.client_security = client_security
        self.logs = LogManager(self.data_dir / "logs", self.log_config, max_open_files=max_open_files,
                               fsync=timed_fsync(self.metrics))
        self.offsets = OffsetStore(self.logs, self.data_dir)
        # wakes long-polling fetches: the Broker servicer's produces, replication, dead letters
        self.notifier = AppendNotifier()
        self.queues = QueueManager(self)  # queue mode: leases, acks, dead letters (broker/queue)
        # Replicated partitions: roles from the controller's states, followers' fetch loops,
        # the leaders' in-sync sets (broker/replication)
        self.replication = ReplicaManager(self, replica_lag_time_max_ms=replica_lag_time_max_ms,
                                          replica_ack_timeout_ms=replica_ack_timeout_ms)
        # commits on a replicated partition wait for its in-sync replicas, as acks=all produces
        self.offsets.durability = ReplicatedDurability(self.replication)
        # event-store topics: their index, conditional appends and groups (broker/events)
        self.event_stores = EventStores(self.logs, self.offsets, self.replication)
        self.replication.log_listener = self.event_stores  # a follower's event index follows its log
        self.dir_lock = DataDirLock(self.data_dir)
        self._opening: asyncio.Future[None] | None = None
        # bench/replication_bench.py's latency breakdown; off unless DMQ_STAGE_TRACE is set
        self.stage_trace = StageTrace.from_environment()
        self.traffic = TopicTraffic()  # records / bytes in and out per topic (dmq.broker.metrics)
        # The Broker service's servicers, one per room, registered together by add_to_server.
        self.service = BrokerService(self)
        self.queue_service = QueueServicer(self)
        self.event_service = EventStoreServicer(self)
        self.metrics.register(BrokerCollector(self, max_partition_series))
        self.ready = False
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        self._heartbeat_interval_ms = 1000
        # The newest controller epoch heard of: UpdatePartitionStates of an older one is refused.
        self.controller_epoch = 0
        self._leader_cache: dict[str, tuple[float, dict[int, str]]] = {}

    def __repr__(self) -> str:
        return (
            f"<BrokerNode id={self.broker_id} address={self.address} ready={self.ready} "
            f"partitions={len(self.logs.partitions())}>"
        )

    @property
    def coordinator_address(self) -> str:
        """The coordinator this broker talks to now (the active one, as far as it knows)."""
        return self._link.address

    @property
    def _metadata(self) -> pb_grpc.MetadataStub | None:
        return self._link.metadata

    @property
    def _groups(self) -> pb_grpc.GroupCoordinatorStub | None:
        return self._link.groups

    @property
    def metadata_stub(self) -> pb_grpc.MetadataStub | None:
        """The coordinator's metadata service (None before start()): the replica manager's AlterIsr."""
        return self._metadata

    @property
    def budget(self) -> ByteBudget:
        """The data path's memory budget (fetch answers and produce requests in flight; the
        servicer's, see memory_budget.py), as the metrics read it."""
        return self.service.budget

    @property
    def address(self) -> str:
        return f"{self.advertised_host}:{self.advertised_port}"

    def add_to_server(self, server: grpc.aio.Server) -> None:
        # One Broker service served by three servicers (dmq.broker.servicers); Fetch answers bytes it
        # framed itself: registered raw (dmq.proto.wire).
        add_broker_servicers(server, self.service, self.queue_service, self.event_service)

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        # Before anything in the directory is read or written: a second broker on it would
        # overwrite this one's batches.
        self.dir_lock.acquire()
        started = time.monotonic()
        # Shielded: a cancelled start() must not leave recovery running in a thread (or an
        # aiosqlite thread half-open) while stop() closes the same files; stop() waits for it.
        self._opening = asyncio.ensure_future(self._open_local())
        await asyncio.shield(self._opening)
        self._link.open()
        await self._register()
        if self._stopping.is_set():
            return
        self.ready = True
        log.info(
            "broker started",
            broker_id=self.broker_id,
            address=self.address,
            partitions=len(self.logs.partitions()),
            recovery_s=round(time.monotonic() - started, 3),
        )
        self.queues.start()
        self.replication.start()
        self._tasks.append(asyncio.create_task(self._heartbeat_loop(), name=f"broker-{self.broker_id}-heartbeat"))
        self._tasks.append(asyncio.create_task(self._retention_loop(), name=f"broker-{self.broker_id}-retention"))
        if self.log_config.flush_policy == "interval":
            self._tasks.append(
                asyncio.create_task(self.logs.run_flusher(self._stopping), name=f"broker-{self.broker_id}-flusher")
            )

    async def _open_local(self) -> None:
        await asyncio.to_thread(self.logs.open_existing)
        await self.offsets.open()

    async def stop(self) -> None:
        """Idempotent: a test may stop a broker early and the fixture stop it again.

        Every step runs even when an earlier one fails, so the logs get their clean-shutdown
        marker and no thread (aiosqlite's is not a daemon) outlives the node."""
        if self._stopping.is_set():
            return
        await self._hand_over_leadership()
        self.ready = False
        self._stopping.set()
        try:
            await self.event_service.close()  # append streams answer what they read, then end
            await self.queues.stop()
            await self.replication.stop()
            for task in self._tasks:
                task.cancel()
            if self._tasks:
                await asyncio.wait(self._tasks, timeout=5)
            self._tasks.clear()
            await self._link.close()  # cancels what is in flight
            if self._opening is not None:
                # Let an interrupted start finish opening, then close what it opened.
                await asyncio.wait([self._opening])
                if not self._opening.cancelled() and self._opening.exception() is not None:
                    log.warning("broker stopped before its logs opened", broker_id=self.broker_id,
                                error=repr(self._opening.exception()))
        finally:
            try:
                await asyncio.to_thread(self.service.appender.close)  # appends in threads end first
                await self.event_stores.close()  # their threads use the logs
                await self.offsets.close()  # its compactions use the logs
                await asyncio.to_thread(self.logs.close)
            finally:
                self.stage_trace.close()
                self.dir_lock.release()
        log.info("broker stopped", broker_id=self.broker_id)

    async def _hand_over_leadership(self) -> None:
        """A clean stop of a broker with replicated partitions: the heartbeat that says so makes
        the controller move their leadership now (it answers after telling the new leaders),
        while this broker still serves; not a session timeout of unavailability later. Brokers
        without replicated partitions stop as before."""
        if not self.ready or self._metadata is None or not any(True for _ in self.replication.replicas()):
            return
        try:
            await self._metadata.BrokerHeartbeat(
                pb.BrokerHeartbeatRequest(broker_id=self.broker_id, shutting_down=True),
                timeout=COORDINATOR_RPC_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as e:
            log.warning("could not hand leadership over before stopping", broker_id=self.broker_id,
                        code=e.code().name, error=e.details())

    async def _register(self) -> None:
        """Register with the coordinator, retrying until it answers or the node stops."""
        delay_s = 0.05
        moved = False
        while not self._stopping.is_set():
            assert self._metadata is not None
            try:
                response = await self._metadata.RegisterBroker(
                    pb.RegisterBrokerRequest(
                        broker_id=self.broker_id, host=self.advertised_host, port=self.advertised_port,
                        rack=self.rack,
                    ),
                    timeout=COORDINATOR_RPC_TIMEOUT_S,
                )
            except grpc.aio.AioRpcError as e:
                # Unreachable, or its disk is full (it cannot record us yet): both pass; any other
                # refusal (a bad id or address) is for the operator.
                # Our id still live at our old address (this broker restarted at a new port within
                # its session) passes too, once that session expires.
                reason = error_details.reason_of(e.trailing_metadata())
                waits = reason in (error_details.DISK_FULL, error_details.BROKER_ID_TAKEN)
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and not waits:
                    raise
                # Another coordinator: asked at once, but only once in a row, and the backoff keeps
                # growing (see _heartbeat_loop: two that name each other are otherwise a tight loop).
                if await self._link.follow(e) and not moved:
                    moved = True
                    continue
                moved = False
                log.warning("coordinator cannot register this broker yet, retrying",
                            coordinator=self.coordinator_address, code=e.code().name, error=e.details())
                # Bounded backoff that ends at once when the node stops (the RPC itself is
                # bounded by its timeout, and the whole loop is cancellable).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), delay_s)
                delay_s = min(delay_s * 2, 2.0)
                continue
            if response.heartbeat_interval_ms > 0:
                self._heartbeat_interval_ms = response.heartbeat_interval_ms
            # The coordinator registered with is the authority, even at a lower epoch (one whose
            # store was replaced); a deposed one answers nothing (it refuses every call).
            self.controller_epoch = response.controller_epoch
            for create in response.partitions:
                self.create_partitions(create)
            await self._refresh_acls(-1)
            return

    async def _heartbeat_loop(self) -> None:
        followed = False
        moves = 0  # moves since the last answer: past one round of the list, an election is under way
        while not self._stopping.is_set():
            if not followed or moves > len(self._link.addresses):
                # Just moved to another coordinator: heartbeat (and re-register) at once, except
                # when going round the list: then at most every FOLLOW_PAUSE_S.
                pause_s = FOLLOW_PAUSE_S if followed else self._heartbeat_interval_ms / 1000
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), pause_s)
            followed = False
            if self._stopping.is_set():
                return
            assert self._metadata is not None
            try:
                # wait_for_ready: while the coordinator is down the heartbeat waits (bounded) for
                # the channel's next connection instead of failing at once, so a coordinator that
                # comes back hears from us as soon as we connect, not a heartbeat interval later.
                response = await self._metadata.BrokerHeartbeat(
                    pb.BrokerHeartbeatRequest(broker_id=self.broker_id), timeout=self._heartbeat_timeout_s(),
                    # With several coordinators an unreachable one is left for the next at once.
                    wait_for_ready=len(self._link.addresses) == 1,
                )
                moves = 0
                if response.reregister:
                    log.info("coordinator asked to re-register", broker_id=self.broker_id)
                    await self._register()
                else:
                    self.controller_epoch = max(self.controller_epoch, response.controller_epoch)
                    await self._refresh_acls(response.acl_version)
            except grpc.aio.AioRpcError as e:
                log.warning("broker heartbeat failed", broker_id=self.broker_id, error=e.details())
                followed = await self._link.follow(e)
                moves = moves + 1 if followed else 0

    def _heartbeat_timeout_s(self) -> float:
        """One coordinator: COORDINATOR_RPC_TIMEOUT_S (waiting for it to come back is all there is
        to do). Several: two heartbeat intervals (half the session the coordinator gives us). A
        paused active coordinator (SIGSTOP) never answers; a standby takes over about a lease TTL
        later and gives this broker one session from its start to be heard. Waiting the full 5 s
        on the paused one made the new one declare this live broker dead (issue 28)."""
        if len(self._link.addresses) == 1:
            return COORDINATOR_RPC_TIMEOUT_S
        return min(COORDINATOR_RPC_TIMEOUT_S, 2 * self._heartbeat_interval_ms / 1000)

    async def _refresh_acls(self, version: int) -> None:
        """Copy the coordinator's ACLs when their version differs from ours (version -1: ask
        anyway). Differs, not only newer: a coordinator whose store was replaced starts over at a
        lower version, and it is the authority.

        With security off the copy is never read; it is kept all the same, one small call per
        change, so turning security on needs no other path."""
        if self._metadata is None or version == self.acls.version:
            return
        try:
            listing = await self._metadata.ListAcls(pb.ListAclsRequest(), timeout=COORDINATOR_RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            log.warning("cannot copy the coordinator's ACLs yet", broker_id=self.broker_id, code=e.code().name,
                        error=e.details())
            return
        try:
            acls = AclSet((Acl.parse(a.principal, a.resource_type, a.resource_name, a.operation, a.permission,
                                     a.pattern_type) for a in listing.acls), listing.version)
        except ValueError as e:  # the coordinator validates every entry: this is a bug, not an input
            log.error("the coordinator's ACLs do not parse; keeping the previous copy", error=str(e))
            return
        self.acls.replace(acls, newer_only=False)
        log.info("acls copied from the coordinator", broker_id=self.broker_id, version=acls.version, acls=len(acls))

    async def _retention_loop(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.retention_check_interval_ms / 1000)
            if self._stopping.is_set():
                return
            try:
                deleted = await asyncio.to_thread(self.logs.enforce_retention)
                if deleted:
                    log.info("retention deleted segments", broker_id=self.broker_id, segments=deleted)
                    self.replication.after_retention()
            except Exception:  # noqa: BLE001 - retention must keep running
                log.exception("retention failed", broker_id=self.broker_id)

    # -- partitions ------------------------------------------------------------------------------

    def create_partitions(self, request: pb.CreatePartitionsRequest) -> None:
        config = log_config_for(self.log_config, request.config)
        for partition in request.partitions:
            self.logs.create(request.topic, partition, config)
            self.offsets.create_log(request.topic, partition, config)
        self.queues.configure(request)
        for error in self.replication.configure(request):
            log.error("partition state not applied", topic=error.topic, partition=error.partition,
                      error=error.error_message)
        if request.config.kind == KIND_EVENT_STORE:
            self.event_stores.mark(request.topic)
        self._leader_cache.pop(request.topic, None)
        log.info("partitions created", topic=request.topic, partitions=list(request.partitions))

    async def delete_partitions(self, topic: str, partitions: set[int] | None) -> None:
        await self.event_stores.drop(topic)
        self.replication.forget(topic, partitions)
        # The commits first: a crash in between must not leave them for a topic created again.
        await self.offsets.delete_topic(topic, partitions)
        for t, p in self.logs.partitions():
            if t == topic and (partitions is None or p in partitions):
                self.logs.delete(t, p)
        self.queues.forget(topic, partitions)
        self._leader_cache.pop(topic, None)
        if partitions is None:
            self.traffic.forget(topic)
        log.info("partitions deleted", topic=topic, partitions=sorted(partitions) if partitions else "all")

    async def leader_hint(self, topic: str, partition: int) -> str | None:
        """The address of the partition's leader per the coordinator, None when it does not exist."""
        now = time.monotonic()
        cached = self._leader_cache.get(topic)
        if cached is None or now - cached[0] > LEADER_CACHE_MS / 1000:
            leaders: dict[int, str] = {}
            if self._metadata is not None:
                try:
                    md = await self._metadata.GetMetadata(
                        pb.GetMetadataRequest(topics=[topic]), timeout=COORDINATOR_RPC_TIMEOUT_S
                    )
                    for t in md.topics:
                        if t.name == topic:
                            leaders = {p.partition: p.leader_address for p in t.partitions}
                except grpc.aio.AioRpcError:
                    leaders = {}
            cached = (now, leaders)
            self._leader_cache[topic] = cached
            if len(self._leader_cache) > 10_000:  # bound the cache under hostile topic names
                self._leader_cache.clear()
        return cached[1].get(partition)

    async def ensure_topic(self, name: str, *, partitions: int) -> pb.TopicInfo:
        """The topic's metadata, creating it first when it does not exist (queue mode's dead-letter
        topics). Raises grpc.aio.AioRpcError when the coordinator refuses or cannot be reached."""
        assert self._metadata is not None
        try:
            info: pb.TopicInfo = await self._metadata.CreateTopic(
                pb.CreateTopicRequest(name=name, partitions=partitions), timeout=COORDINATOR_RPC_TIMEOUT_S
            )
            return info
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
        described: pb.TopicInfo = await self._metadata.DescribeTopic(
            pb.DescribeTopicRequest(name=name), timeout=COORDINATOR_RPC_TIMEOUT_S
        )
        return described

    async def check_ownership(
        self, group_id: str, member_id: str, generation: int, topic: str, partitions: list[int],
        *, member_secret: str = "",
    ) -> None:
        """Ask the coordinator whether the member owns the partitions; refuse the commit if not."""
        assert self._groups is not None
        try:
            await self._groups.CheckOwnership(
                pb.CheckOwnershipRequest(
                    group_id=group_id, member_id=member_id, generation=generation, partitions=partitions, topic=topic,
                    member_secret=member_secret,
                ),
                timeout=COORDINATOR_RPC_TIMEOUT_S,
            )
        except grpc.aio.AioRpcError as e:
            code = e.code()
            reason = error_details.reason_of(e.trailing_metadata())
            details = e.details() or "ownership check failed"
            if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNIMPLEMENTED):
                code = grpc.StatusCode.UNAVAILABLE
            if code == grpc.StatusCode.UNAVAILABLE and reason is None:
                # No answer from the coordinator (down, unreachable, too slow): the transport's
                # text names only addresses, and the client prefixes this broker's, so say whose
                # it is; otherwise a healthy broker reads as the one that refused.
                details = (f"the group coordinator at {self.coordinator_address} is unreachable, so the member's "
                           f"ownership cannot be checked and nothing was committed; retry once it is back ({details})")
            # The coordinator's reason (not-owner, stale-generation) goes on to the committing client.
            fail(code, details, reason)
