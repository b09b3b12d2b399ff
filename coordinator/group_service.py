"""The GroupCoordinator gRPC service: the pure group machine (dmq.coordinator.group) on a real
clock, a real SQLite file and real brokers (DESIGN.md "Consumer groups", "Subscription modes").

Who does what::

    RPC handler     validate the proto (INVALID_ARGUMENT names the field), read now_ms, then
                    *decide under the lock*: one pure handler call on the in-memory registry.
                    *I/O outside it*: persist the result's records to SQLite before answering,
                    log and publish its events, call brokers (ListOffsets, FetchCommittedOffsets,
                    DeleteGroupOffsets).
    ticker task     fires the machine's timers (session / poll expiry, the debounced rebalance):
                    sleeps until next_deadline_ms(), at most MAX_TICK_INTERVAL_MS, and is woken at
                    once when a handler schedules a rebalance (the debounce may be shorter).
    wake-ups        one-shot asyncio.Events per (group, member) and the watch streams:
                    coordinator/group_wakeups.py.
    admin / brokers ListGroups, DescribeGroup, DeleteGroup's translations and the broker calls:
                    coordinator/group_admin.py (GroupBrokers).

Collaborators (the cluster metadata, the SQLite store, the broker pool, the advertised address,
the wall clock) are passed in by `build(node)`, not reached through the node.

Lock: every call into the registry or a Group happens under `_lock` with no await inside, so a
decision and the state it was made on are one atomic step; persisting, broker calls and stream
writes happen after it is released.

Persistence (coordinator.sqlite, table groups; see store.py): a group's existence and subscription.
GroupCreated is saved before FindOrCreateGroup answers; if the save fails the group is
undone (replay GroupDeleted) and the caller gets UNAVAILABLE. Its membership too (generation,
members, targets, owners: dmq.coordinator.group.durable), rewritten after every change of it
(DURABLE_EVENTS) before the change is answered or published, so a restarted coordinator resumes
each group where it was: the generation keeps increasing, member ids and secrets stay valid,
commits are fenced as before, and members get one session from the start to be heard again
(issue 28). All group writes go one at a time (`_save_lock`), each of the group as it is when the
write starts, so a later write never records an older state.

Clocks: the machine runs on a monotonic clock (`Clock.now_ms()`, injectable); wall-clock time
(`node.clock_ms()`) is only stored, as a group's created_ms.

Liveness: a heartbeat carries the member's poll age (time since its application last called
poll()), so the coordinator removes a member whose application is stuck past
max_poll_interval_ms even while its heartbeat thread runs; the client's own watchdog leaves the
group too (as Kafka's client does). A heartbeat without a poll age counts as poll activity.

Watch streams (WatchGroup): see coordinator/group_wakeups.py.

Several coordinators (dmq.coordinator.controller.leadership): the service acts only while
`metadata.acting()` (the lease surely held): every RPC checks it first and a standby's or deposed
one's refusal names the active coordinator; the ticker checks it before firing any timer, so a
coordinator resumed after its lease lapsed expires no member and writes nothing. Deposed, the node
stops the service (ticker, streams, long polls) and, elected again, starts it anew: the groups are
reloaded from the store into a fresh registry, as by a restarted coordinator.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import grpc
import structlog

from dmq.coordinator import group as machine
from dmq.coordinator.group import (
    Clock,
    Event,
    GenerationStarted,
    Group,
    GroupConfig,
    GroupCreated,
    GroupDeleted,
    GroupRegistry,
    GroupState,
    MemberJoined,
    MemberRemoved,
    MonotonicClock,
    PartitionCountChanged,
    PartitionsAcquired,
    PartitionsReleased,
    RebalanceScheduled,
    Record,
    RemovalReason,
    StateChanged,
    SubscriptionMode,
    durable,
    group_id_for,
)
from dmq.coordinator.group_admin import GroupBrokers, describe_to_proto, subscription_to_proto, summaries_to_proto
from dmq.coordinator.group_rows import group_to_row, record_to_row, row_to_record
from dmq.coordinator.group_wakeups import ALL_MEMBERS, Signals, WatchStreams, affected, wait_or_timeout
from dmq.coordinator.metadata import MetadataManager
from dmq.coordinator.metastore.base import MetadataStore, StoreFullError
from dmq.coordinator.pause_watch import PauseWatch
from dmq.coordinator.store_writes import complete_even_if_cancelled
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import error_details, limits
from dmq.proto.names import check_app_id, check_id
from dmq.proto.server.domain_errors import DomainError
from dmq.proto.server.server_errors import RpcAbort, rpc_handler
from dmq.proto.server.server_errors import fail as _fail
from dmq.proto.topic_settings import validate_topic_name

if TYPE_CHECKING:
    from dmq.coordinator.node import CoordinatorNode

log = structlog.get_logger(__name__)

# Limits (every one says why it is what it is).
MAX_ID_CHARS = 512  # group ids are G_<topic:249>_<app_id:249>; member ids <client_id:255>-<32 hex>
MAX_POLL_AGE_MS = 365 * 24 * 3600 * 1000  # a year: anything longer is a client bug
MAX_WAIT_MS = 60_000  # GetAssignment long-poll; the same bound as the broker's Fetch
MAX_CHECK_PARTITIONS = 10_000  # = the most partitions a topic can have
MAX_TICK_INTERVAL_MS = 100  # the ticker re-reads the deadlines at least this often
CREATE_WAIT_S = 30.0  # waiting for another request that is creating the same group
STOP_TIMEOUT_S = 3.0

_MODE_FROM_PROTO = {
    pb.SUBSCRIPTION_MODE_ALL: SubscriptionMode.ALL,
    pb.SUBSCRIPTION_MODE_NEW: SubscriptionMode.NEW,
    pb.SUBSCRIPTION_MODE_TIMESTAMP: SubscriptionMode.TIMESTAMP,
}


MAX_TRACKED_REBALANCES = 100_000
# The machine's events that change what durable.snapshot records: the group is saved after them.
DURABLE_EVENTS = (MemberJoined, MemberRemoved, GenerationStarted, PartitionsReleased, PartitionsAcquired,
                  StateChanged, PartitionCountChanged)


def build(node: CoordinatorNode) -> GroupService:
    """The node's plug-in point (see coordinator/node.py): the service gets its collaborators."""
    return GroupService(
        metadata=node.metadata,
        store=node.store,
        brokers=GroupBrokers(node.metadata, node.broker_pool),
        advertised_address=node.advertised_address,
        wall_clock_ms=node.clock_ms,
        default_subscription_mode=node.default_subscription_mode,
        default_subscription_from_ms=node.default_subscription_from_ms,
        rebalance_debounce_ms=node.rebalance_debounce_ms,
    )


# -- errors -----------------------------------------------------------------------------------


# A request refused by this layer is an RpcAbort (dmq.proto.server.server_errors); the machine's own
# errors are GroupError, a DomainError the one mapping (dmq.proto.server.server_errors) answers.


def _not_recorded(what: str, e: Exception) -> NoReturn:
    """A failed write of the group store: a full disk is RESOURCE_EXHAUSTED with the disk-full reason
    (the client backs off until space is freed); anything else UNAVAILABLE. Both retriable: nothing changed."""
    if isinstance(e, StoreFullError):
        raise RpcAbort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"could not {what}: {e}", error_details.DISK_FULL)
    _fail(grpc.StatusCode.UNAVAILABLE, f"could not {what}: {e}: retry")


def _invalid(message: str) -> NoReturn:
    _fail(grpc.StatusCode.INVALID_ARGUMENT, message)


def _check_id(field: str, value: str, *, limit: int = MAX_ID_CHARS) -> None:
    """The shared id rule (dmq.proto.names): 1..limit UTF-8 bytes, no control characters; its
    FieldError is INVALID_ARGUMENT through rpc_handler (dmq.proto.server.server_errors)."""
    check_id(value, field, field, limit)


class _MemberRequest(Protocol):
    group_id: str
    member_id: str


def _member_ids(request: _MemberRequest) -> tuple[str, str]:
    """(group_id, member_id) of a member's request (GetAssignment, Heartbeat, WatchGroup,
    LeaveGroup), each checked by the id rule."""
    _check_id("group_id", request.group_id)
    _check_id("member_id", request.member_id)
    return request.group_id, request.member_id


def _check_range(field: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        _invalid(f"{field} must be within {low}..{high}, got {value}")


Handler = Callable[..., Awaitable[Any]]


MEMBER_SECRET_BYTES = 24  # 192 random bits, urlsafe base64: 32 characters
MAX_MEMBER_SECRET_CHARS = 64


def _check_secret(secret: str) -> None:
    if len(secret) > MAX_MEMBER_SECRET_CHARS:
        _invalid(f"member_secret is {len(secret)} characters; the limit is {MAX_MEMBER_SECRET_CHARS}")


# Refusals become their status; anything unexpected becomes INTERNAL (logged). A handler never
# lets an exception escape into grpc, so no request takes the server down.
_rpc = rpc_handler(log=log, before=lambda service: service._check_serving())


def _peer_host(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """"ipv4:127.0.0.1:5000" -> "127.0.0.1"; "ipv6:[::1]:5000" -> "::1" (the member's host, for
    describe)."""
    try:
        peer = context.peer() or ""
    except Exception:  # noqa: BLE001 - informational only
        return ""
    _, _, rest = peer.partition(":")
    host = rest.rpartition(":")[0] if rest.count(":") >= 1 else rest
    return host.strip("[]")[:255]


# -- the service ------------------------------------------------------------------------------


class GroupService(pb_grpc.GroupCoordinatorServicer):
    """The group coordinator component of a CoordinatorNode (add_to_server / start / stop)."""

    def __init__(
        self,
        *,
        metadata: MetadataManager,
        store: MetadataStore,
        brokers: GroupBrokers,
        advertised_address: str,
        wall_clock_ms: Callable[[], int],
        default_subscription_mode: str = "all",
        default_subscription_from_ms: int | None = None,
        rebalance_debounce_ms: int = 500,
        clock: Clock | None = None,
        config: GroupConfig | None = None,
        max_tick_interval_ms: int = MAX_TICK_INTERVAL_MS,
    ) -> None:
        self._metadata = metadata
        self._store = store
        self._brokers = brokers
        self._advertised_address = advertised_address
        self._wall_clock_ms = wall_clock_ms  # stored only (a group's created_ms)
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self.default_mode = SubscriptionMode(default_subscription_mode)
        # The time a default `timestamp` subscription starts from (CoordinatorNode refuses that
        # mode without one); None for the other modes.
        self.default_from_ms: int | None = default_subscription_from_ms
        debounce_ms = rebalance_debounce_ms
        self.config = config or GroupConfig(
            rebalance_debounce_ms=debounce_ms,
            rebalance_max_delay_ms=max(5_000, 10 * debounce_ms),
            default_subscription_mode=self.default_mode,
        )
        self.registry = GroupRegistry(self.config)
        self.max_tick_interval_ms = max_tick_interval_ms
        # Armed by the ticker, which observes at least every max_tick_interval_ms: a longer gap means
        # the coordinator was not running, and the members' sessions restart (dmq.coordinator.pause_watch).
        self.pause_watch = PauseWatch(max(limits.SESSION_TIMEOUT_MS_MIN // 2, 4 * max_tick_interval_ms))
        self._lock = asyncio.Lock()
        self._save_lock = asyncio.Lock()  # group rows are written one at a time (see Persistence)
        self._signals = Signals()
        # Rebalances for the metrics (dmq.coordinator.metrics): generations started, and each one's
        # time from the group's first scheduled rebalance, handed to on_rebalance when set.
        self.rebalances = 0
        self.on_rebalance: Callable[[float], None] | None = None
        self._rebalance_started: dict[str, float] = {}
        self._ack_seq: dict[tuple[str, str], int] = {}  # GetAssignment calls per member
        self._term = 0  # starts since construction: a stream of an earlier term ends in a later one
        self._watches = self._new_watches()
        self._creating: dict[str, asyncio.Future[None]] = {}
        self._deleting: set[str] = set()
        self._ticker: asyncio.Task[None] | None = None
        self._ticker_wake: asyncio.Event | None = None
        self.ticks = 0  # passes of the ticker (tests wait on it instead of on the clock)
        self._listening = False  # the metadata listeners are added once, at the first start
        self._serving = False
        self._stopping = False

    @property
    def brokers(self) -> GroupBrokers:
        """The broker calls DescribeGroup makes (the metrics' lag uses the same)."""
        return self._brokers

    def __repr__(self) -> str:
        return (
            f"<GroupService serving={self._serving} groups={len(self.registry)} "
            f"watches={len(self._watches)} waiters={len(self._signals)}>"
        )

    # -- lifecycle -------------------------------------------------------------------------------

    def add_to_server(self, server: grpc.aio.Server) -> None:
        pb_grpc.add_GroupCoordinatorServicer_to_server(self, server)  # type: ignore[no-untyped-call]  # generated stubs are untyped

    async def start(self) -> None:
        """Load the groups from SQLite (the node's metadata is loaded already), hook the topic
        listeners, start the ticker; RPCs are answered UNAVAILABLE until this is done."""
        if self._serving:
            raise RuntimeError("group service already started")
        if self._ticker is not None:
            raise RuntimeError("group service still stopping")
        self._fresh_state()  # a new term of an elected coordinator starts from the store, as a restart does
        await self._load()
        if not self._listening:
            self._listening = True
            self._metadata.on_topic_deleted(self._on_topic_deleted)
            self._metadata.on_partitions_added(self._on_partitions_added)
        self._ticker_wake = asyncio.Event()
        self._stopping = False
        self._ticker = asyncio.create_task(self._tick_loop(), name="group-coordinator-ticker")
        self._serving = True
        log.info("group coordinator started", groups=len(self.registry), default_mode=self.default_mode.value)

    async def stop(self) -> None:
        """Stop the ticker and end every watch stream and long poll. Safe without start()."""
        self._serving = False
        self._stopping = True
        self._signals.fire_all()
        if self._ticker_wake is not None:
            self._ticker_wake.set()
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(ticker, STOP_TIMEOUT_S)
        log.info("group coordinator stopped", groups=len(self.registry))

    def _fresh_state(self) -> None:
        self._term += 1
        self.registry = GroupRegistry(self.config)
        self._signals = Signals()
        self._ack_seq = {}
        self._rebalance_started.clear()
        self._watches = self._new_watches()

    def _new_watches(self) -> WatchStreams:
        term = self._term
        return WatchStreams(self.registry, self._signals, self._ack_seq, lambda: not self._serving or self._term != term)

    def _check_serving(self) -> None:
        acting = self._metadata.acting()
        if self._serving and acting:
            return
        if not acting or not self._stopping:
            # starting, a standby, or deposed (stepping down or stood down): says so, naming the active one
            e = self._metadata.not_ready_error()
            raise DomainError(str(e) if e.reason else f"group {e}", code=e.code, reason=e.reason, extra=e.extra)
        _fail(grpc.StatusCode.UNAVAILABLE, "group coordinator is stopping: retry")

    async def _load(self) -> None:
        rows = await self._store.load_groups()
        for row in rows:
            topic = self._metadata.topic(row.topic)
            if topic is None:
                # The topic was deleted while the group was being recorded, or the coordinator
                # stopped before the topic-deleted listener removed it: the group goes too.
                log.warning("dropping group of a deleted topic", group=row.group_id, topic=row.topic)
                await self._store.delete_group(row.group_id)
                continue
            try:
                self.registry.replay(row_to_record(row, topic.partition_count))
            except (ValueError, KeyError) as e:
                log.error("skipping unreadable group row", group=row.group_id, topic=row.topic, error=str(e))
                continue
            try:
                durable.restore(self.registry.get(row.group_id), json.loads(row.state_json or "{}"), self.clock.now_ms())
            except (ValueError, KeyError, TypeError) as e:  # the members re-join, as before membership was kept
                log.error("skipping unreadable group membership", group=row.group_id, error=str(e))
                continue
            group = self.registry.get(row.group_id)
            if group.members:
                log.info("group resumed", group=group.group_id, generation=group.generation, state=group.state.name,
                         members=len(group.members))

    # -- the ticker ------------------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        assert self._ticker_wake is not None
        wake = self._ticker_wake
        self.pause_watch.arm()
        while not self._stopping:
            wake.clear()
            try:
                async with self._lock:
                    self._forgive_pause()
                    deadline_ms = self.registry.next_deadline_ms()
                    # Deposed (the lease may lapse): no member expires, nothing is written; the node
                    # stops this task and the new active coordinator's timers decide.
                    acting = self._metadata.acting()
                    due = acting and deadline_ms is not None and deadline_ms <= self.clock.now_ms()
                    events = self._tick() if due else []
                    if due:
                        deadline_ms = self.registry.next_deadline_ms()
                try:
                    await self._record(events)
                except Exception:  # noqa: BLE001 - the next change of the group writes it again
                    log.exception("could not record group membership")
                self._publish(events)
            except Exception:  # noqa: BLE001 - the ticker must keep running; say what broke
                log.exception("group timer tick failed")
                deadline_ms = None
            self.ticks += 1
            now_ms = self.clock.now_ms()
            sleep_ms = self.max_tick_interval_ms if deadline_ms is None else deadline_ms - now_ms
            sleep_ms = min(max(sleep_ms, 0), self.max_tick_interval_ms)
            if sleep_ms > 0:
                await wait_or_timeout(wake, sleep_ms / 1000)
            else:
                await asyncio.sleep(0)  # let requests in between back-to-back deadlines

    def _forgive_pause(self) -> None:
        """Before any timer fires: if the coordinator was not running, members' sessions restart now
        (machine.handle_coordinator_pause says which)."""
        paused_ms = self.pause_watch.observe()
        if paused_ms:
            now_ms = self.clock.now_ms()
            for group in self.registry.groups():
                machine.handle_coordinator_pause(group, paused_ms, now_ms)
            log.warning("coordinator was not running: member sessions it could have expired restart now",
                        paused_ms=paused_ms, groups=len(self.registry))

    def _tick(self) -> list[Event]:
        """Fire the due timers, each group on its own so one group's failure cannot stall the
        others. Called under the lock."""
        now_ms = self.clock.now_ms()
        events: list[Event] = []
        for group in self.registry.groups():
            deadline_ms = group.next_deadline_ms()
            if deadline_ms is None or deadline_ms > now_ms:
                continue
            try:
                events.extend(machine.tick(group, now_ms).events)
            except Exception:  # noqa: BLE001
                log.exception("group timer failed", group=group.group_id, topic=group.topic)
        return events

    # -- events ----------------------------------------------------------------------------------

    def _publish(self, events: Iterable[Event], *, wake: Iterable[tuple[str, str]] = ()) -> None:
        """Log the machine's events and wake the members they concern."""
        for event in events:
            group = self.registry.find(event.group_id)
            self._log_event(group, event)
            if isinstance(event, MemberRemoved):
                self._ack_seq.pop((event.group_id, event.member_id), None)
            elif isinstance(event, RebalanceScheduled):
                if len(self._rebalance_started) >= MAX_TRACKED_REBALANCES:  # groups deleted mid-rebalance
                    self._rebalance_started.clear()
                self._rebalance_started.setdefault(event.group_id, time.monotonic())
                if self._ticker_wake is not None:
                    self._ticker_wake.set()
            elif isinstance(event, GenerationStarted):
                self.rebalances += 1
                started = self._rebalance_started.pop(event.group_id, None)
                if started is not None and self.on_rebalance is not None:
                    self.on_rebalance(time.monotonic() - started)
            members = affected(group, event)
            if members:
                self._signals.fire(event.group_id, members)
        for group_id, member_id in wake:
            self._signals.fire(group_id, (member_id,))

    def _log_event(self, group: Group | None, event: Event) -> None:
        topic = group.topic if group is not None else None
        if isinstance(event, MemberJoined):
            log.info("member joined", group=event.group_id, topic=topic, member=event.member_id,
                     client_id=event.client_id, members=len(group.members) if group else None)
        elif isinstance(event, MemberRemoved):
            level = log.info if event.reason is RemovalReason.LEFT else log.warning
            level(f"member removed: {event.reason.value}", group=event.group_id, topic=topic, member=event.member_id,
                  reason=event.reason.value, released=list(event.released))
        elif isinstance(event, GenerationStarted):
            log.info("rebalance: generation started", group=event.group_id, topic=topic, generation=event.generation,
                     members=len(event.assignment),
                     assignment={m: list(ps) for m, ps in sorted(event.assignment.items())})
        elif isinstance(event, PartitionsReleased):
            log.info("partitions released", group=event.group_id, topic=topic, member=event.member_id,
                     generation=event.generation, partitions=list(event.partitions))
        elif isinstance(event, PartitionsAcquired):
            log.info("partitions acquired", group=event.group_id, topic=topic, member=event.member_id,
                     generation=event.generation, partitions=list(event.partitions))
        elif isinstance(event, StateChanged):
            level = log.info if event.new in (GroupState.STABLE, GroupState.EMPTY) else log.debug
            level("group state changed", group=event.group_id, topic=topic, old=event.old.name, new=event.new.name,
                  generation=group.generation if group else None)
        elif isinstance(event, RebalanceScheduled):
            log.debug("rebalance scheduled", group=event.group_id, topic=topic, deadline_ms=event.deadline_ms)
        elif isinstance(event, PartitionCountChanged):
            log.info("partition count changed", group=event.group_id, topic=topic, old=event.old, new=event.new)

    # -- persistence -----------------------------------------------------------------------------

    async def _persist(self, records: Iterable[Record]) -> None:
        async with self._save_lock:
            for record in records:
                if isinstance(record, GroupCreated):
                    await self._store.save_group(record_to_row(record))
                else:
                    await self._store.delete_group(record.group_id)

    async def _record(self, events: Iterable[Event]) -> None:
        """Save the membership of the groups these events changed (before they are answered or
        published): each group as it is when its write starts; a group deleted meanwhile is not."""
        for group_id in sorted({e.group_id for e in events if isinstance(e, DURABLE_EVENTS)}):
            async with self._save_lock:
                async with self._lock:
                    group = self.registry.find(group_id)
                    row = None if group is None else group_to_row(group)
                if row is not None:
                    await complete_even_if_cancelled(self._store.save_group(row))

    async def _recorded(self, events: Iterable[Event], what: str) -> None:
        """_record for an RPC: a failed write answers it with a retriable error (its retry finds the
        change made and records it); the change itself stands in memory and is published."""
        try:
            await self._record(events)
        except Exception as e:
            log.exception("could not record group membership", what=what)
            self._publish(events)
            _not_recorded(what, e)

    # -- RPCs: membership ------------------------------------------------------------------------

    @_rpc
    async def FindOrCreateGroup(  # noqa: N802
        self, request: pb.FindOrCreateGroupRequest,
        context: grpc.aio.ServicerContext[pb.FindOrCreateGroupRequest, pb.FindOrCreateGroupResponse],
    ) -> pb.FindOrCreateGroupResponse:
        topic, app_id = request.topic, request.app_id
        validate_topic_name(topic, field="topic")
        check_app_id(app_id)  # it becomes part of the group id: bounded, printable
        asked = self._requested_mode(request)
        mode = asked or self.default_mode
        from_ms = request.subscription_from_ms
        if asked is None and mode is SubscriptionMode.TIMESTAMP and not from_ms and self.default_from_ms:
            # The server's default mode comes with the server's default time: a consumer that
            # names neither starts where the operator said (`--default-subscription-from`).
            from_ms = self.default_from_ms
        if from_ms < 0:
            _invalid(f"subscription_from_ms must be >= 0 (wall-clock milliseconds), got {from_ms}")
        if from_ms and mode is not SubscriptionMode.TIMESTAMP:
            _invalid(f"subscription_from_ms is only used with subscription_mode timestamp (the mode is {mode.value})")
        if not from_ms and mode is SubscriptionMode.TIMESTAMP:
            _invalid("subscription_mode timestamp needs subscription_from_ms > 0 (wall-clock milliseconds)")
        group_id = group_id_for(topic, app_id)
        if group_id in self._deleting:
            _fail(grpc.StatusCode.UNAVAILABLE, f"group {group_id!r} is being deleted: retry")

        record = self._metadata.topic(topic)
        if record is None:
            _fail(grpc.StatusCode.NOT_FOUND, f"topic {topic!r} not found: create it first (dmq topics create)")
        pure = machine.FindOrCreateGroupRequest(
            topic=topic,
            app_id=app_id,
            partition_count=record.partition_count,
            subscription_mode=mode,
            subscription_from_ms=from_ms if mode is SubscriptionMode.TIMESTAMP else None,
        )
        result = None
        while result is None:
            # One creator per group id at a time: a second request waits for the first, so
            # nobody is answered with a group that is not on disk yet.
            pending = self._creating.get(group_id)
            if pending is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(pending), CREATE_WAIT_S)
                if not pending.done():
                    _fail(grpc.StatusCode.UNAVAILABLE, f"group {group_id!r} is still being created: retry")
                continue
            async with self._lock:
                if self.registry.find(group_id) is not None:
                    result = self._find_or_create(pure)
            if result is None and group_id not in self._creating:
                result = await self._create(pure)
        await self._recorded(result.events, "record the group's partition count")
        self._publish(result.events)

        found = result.response
        recorded = found.subscription
        if not found.created and asked is not None and (
            asked is not recorded.mode or (asked is SubscriptionMode.TIMESTAMP and from_ms != recorded.from_ms)
        ):
            log.warning(
                "subscription differs from the group's recorded one; the first subscriber's wins",
                group=found.group_id, topic=topic, requested=asked.value, recorded=recorded.mode.value,
                requested_from_ms=from_ms or None, recorded_from_ms=recorded.from_ms,
            )
        if found.created:
            sub = found.subscription
            log.info("group created", group=found.group_id, topic=topic, mode=sub.mode.value, from_ms=sub.from_ms,
                     start_offsets=dict(sub.snapshot_offsets) or None)
        return pb.FindOrCreateGroupResponse(
            group_id=found.group_id,
            coordinator_address=self._advertised_address,
            subscription=subscription_to_proto(found.subscription),
            created=found.created,
        )

    def _requested_mode(self, request: pb.FindOrCreateGroupRequest) -> SubscriptionMode | None:
        code = request.subscription_mode
        if code == pb.SUBSCRIPTION_MODE_UNSPECIFIED:
            return None
        mode = _MODE_FROM_PROTO.get(code)
        if mode is None:
            _invalid(f"subscription_mode {code} is not one of ALL (1), NEW (2), TIMESTAMP (3)")
        return mode

    def _find_or_create(self, pure: machine.FindOrCreateGroupRequest) -> machine.Result[machine.FindOrCreateGroupResponse]:
        return self.registry.find_or_create(replace(pure, created_ms=self._wall_clock_ms()), self.clock.now_ms())

    async def _create(self, pure: machine.FindOrCreateGroupRequest) -> machine.Result[machine.FindOrCreateGroupResponse]:
        """Create the group: snapshot the log ends first for mode `new`, then record it durably."""
        group_id = group_id_for(pure.topic, pure.app_id)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._creating[group_id] = done
        try:
            if pure.subscription_mode is SubscriptionMode.NEW:
                snapshot = await self._brokers.latest_offsets(pure.topic, pure.partition_count)
                pure = replace(pure, snapshot_offsets=snapshot)
            return await complete_even_if_cancelled(self._create_durably(pure))
        finally:
            del self._creating[group_id]
            done.set_result(None)

    async def _create_durably(
        self, pure: machine.FindOrCreateGroupRequest
    ) -> machine.Result[machine.FindOrCreateGroupResponse]:
        async with self._lock:
            result = self._find_or_create(pure)
        try:
            await self._persist(result.records)
        except Exception as e:
            async with self._lock:
                for record in result.records:
                    if isinstance(record, GroupCreated):
                        self.registry.replay(GroupDeleted(record.group_id))
            log.exception("could not record the new group", group=result.response.group_id, topic=pure.topic)
            _not_recorded(f"record group {result.response.group_id!r}", e)
        if result.records and self._metadata.topic(pure.topic) is None:
            # The topic was deleted while the group was being recorded (its listener found no
            # group to delete then): take the group away again.
            async with self._lock:
                deleted = self.registry.topic_deleted(pure.topic, self.clock.now_ms())
            await self._persist(deleted.records)
            _fail(grpc.StatusCode.NOT_FOUND, f"topic {pure.topic!r} was deleted")
        return result

    @_rpc
    async def JoinGroup(  # noqa: N802
        self, request: pb.JoinGroupRequest, context: grpc.aio.ServicerContext[pb.JoinGroupRequest, pb.JoinGroupResponse]
    ) -> pb.JoinGroupResponse:
        group_id = request.group_id
        _check_id("group_id", group_id)
        if group_id in self._deleting:
            _fail(grpc.StatusCode.UNAVAILABLE, f"group {group_id!r} is being deleted: retry")
        pure = machine.JoinGroupRequest(
            client_id=request.client_id,
            consumer_id=request.consumer_id,
            host=_peer_host(context),
            session_timeout_ms=request.session_timeout_ms,
            max_poll_interval_ms=request.max_poll_interval_ms,
            # Drawn here, not in the machine (which stays deterministic); kept by a new member.
            member_secret=secrets.token_urlsafe(MEMBER_SECRET_BYTES),
        )
        async with self._lock:
            result = machine.handle_join(self.registry.get(group_id), pure, self.clock.now_ms())
        await self._recorded(result.events, f"record member of group {group_id!r}")
        self._publish(result.events)
        return pb.JoinGroupResponse(member_id=result.response.member_id, generation=result.response.generation,
                                    member_secret=result.response.member_secret)

    @_rpc
    async def GetAssignment(  # noqa: N802
        self, request: pb.GetAssignmentRequest,
        context: grpc.aio.ServicerContext[pb.GetAssignmentRequest, pb.GetAssignmentResponse],
    ) -> pb.GetAssignmentResponse:
        group_id, member_id = _member_ids(request)
        _check_range("wait_ms", request.wait_ms, 0, MAX_WAIT_MS)
        wait_s = request.wait_ms / 1000
        remaining = context.time_remaining()
        if remaining is not None:
            wait_s = min(wait_s, max(0.0, remaining - 0.05))  # answer before the client gives up
        deadline = time.monotonic() + wait_s
        key = (group_id, member_id)
        _check_secret(request.member_secret)
        pure = machine.GetAssignmentRequest(member_id, member_secret=request.member_secret)
        while True:
            async with self._lock:
                result = machine.handle_get_assignment(self.registry.get(group_id), pure, self.clock.now_ms())
            # Before the member learns it owns a partition: a restart must fence as this answer does.
            await self._recorded(result.events, f"record the assignment of group {group_id!r}")
            self._ack_seq[key] = self._ack_seq.get(key, 0) + 1
            self._publish(result.events, wake=(key,))
            response = result.response
            left_s = deadline - time.monotonic()
            if not response.rebalance_in_progress or left_s <= 0 or not self._serving:
                break
            wake = self._signals.get(group_id, member_id)
            await wait_or_timeout(wake, left_s)
        return pb.GetAssignmentResponse(
            generation=response.generation,
            partitions=response.partitions,
            rebalance_in_progress=response.rebalance_in_progress,
            start_positions=[pb.StartPosition(partition=p, offset=o) for p, o in response.start_positions],
            topic=response.topic,
        )

    @_rpc
    async def Heartbeat(  # noqa: N802
        self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext[pb.HeartbeatRequest, pb.HeartbeatResponse]
    ) -> pb.HeartbeatResponse:
        group_id, member_id = _member_ids(request)
        if request.generation < -1:
            _invalid(f"generation must be >= -1 (-1 = none yet), got {request.generation}")
        poll_age_ms = request.poll_age_ms if request.HasField("poll_age_ms") else 0
        if not 0 <= poll_age_ms <= MAX_POLL_AGE_MS:
            _fail(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"poll_age_ms must be within 0..{MAX_POLL_AGE_MS}, got {poll_age_ms}",
            )
        _check_secret(request.member_secret)
        pure = machine.HeartbeatRequest(member_id, request.generation, poll_age_ms=poll_age_ms,
                                        member_secret=request.member_secret)
        async with self._lock:
            result = machine.handle_heartbeat(self.registry.get(group_id), pure, self.clock.now_ms())
        response = result.response
        return pb.HeartbeatResponse(generation=response.generation, assignment_changed=response.assignment_changed)

    @_rpc
    async def WatchGroup(  # noqa: N802
        self, request: pb.WatchGroupRequest, context: grpc.aio.ServicerContext[pb.WatchGroupRequest, pb.GroupEvent]
    ) -> None:
        group_id, member_id = _member_ids(request)
        _check_secret(request.member_secret)
        # NOT_FOUND / PERMISSION_DENIED before anything is held
        machine.prove_member(self.registry.get(group_id), member_id, request.member_secret)
        await self._watches.serve(group_id, member_id, context)

    @_rpc
    async def LeaveGroup(  # noqa: N802
        self, request: pb.LeaveGroupRequest, context: grpc.aio.ServicerContext[pb.LeaveGroupRequest, pb.LeaveGroupResponse]
    ) -> pb.LeaveGroupResponse:
        group_id, member_id = _member_ids(request)
        async with self._lock:
            _check_secret(request.member_secret)
            leave = machine.LeaveGroupRequest(member_id, member_secret=request.member_secret)
            result = machine.handle_leave(self.registry.get(group_id), leave, self.clock.now_ms())
        await self._recorded(result.events, f"record the leave from group {group_id!r}")
        self._publish(result.events)
        return pb.LeaveGroupResponse()

    # -- RPCs: commits (internal, called by brokers) ---------------------------------------------

    @_rpc
    async def CheckOwnership(  # noqa: N802
        self, request: pb.CheckOwnershipRequest,
        context: grpc.aio.ServicerContext[pb.CheckOwnershipRequest, pb.CheckOwnershipResponse],
    ) -> pb.CheckOwnershipResponse:
        group_id = request.group_id
        _check_id("group_id", group_id)
        if request.generation < -1:
            _invalid(f"generation must be >= -1, got {request.generation}")
        if not request.member_id and request.generation != -1:
            _invalid("member_id must not be empty (an operator's reset names member_id '' with generation -1)")
        if len(request.member_id) > MAX_ID_CHARS:
            _invalid(f"member_id is {len(request.member_id)} characters; the limit is {MAX_ID_CHARS}")
        if len(request.partitions) > MAX_CHECK_PARTITIONS:
            _invalid(f"partitions has {len(request.partitions)} entries; the limit is {MAX_CHECK_PARTITIONS}")
        for i, p in enumerate(request.partitions):
            if p < 0:
                _invalid(f"partitions[{i}] must be >= 0, got {p}")
        if len(request.topic) > MAX_ID_CHARS:
            _invalid(f"topic is {len(request.topic)} characters; the limit is {MAX_ID_CHARS}")
        if group_id in self._deleting:
            _fail(grpc.StatusCode.UNAVAILABLE, f"group {group_id!r} is being deleted: retry")
        pure = machine.CheckOwnershipRequest(
            member_id=request.member_id,
            generation=request.generation,
            partitions=tuple(request.partitions),
            topic=request.topic or None,
            member_secret=request.member_secret,
        )
        _check_secret(request.member_secret)
        async with self._lock:
            machine.check_ownership(self.registry.get(group_id), pure, self.clock.now_ms())
        return pb.CheckOwnershipResponse()

    # -- RPCs: admin -----------------------------------------------------------------------------

    @_rpc
    async def ListGroups(  # noqa: N802
        self, request: pb.ListGroupsRequest, context: grpc.aio.ServicerContext[pb.ListGroupsRequest, pb.ListGroupsResponse]
    ) -> pb.ListGroupsResponse:
        async with self._lock:
            summaries = summaries_to_proto(self.registry.groups())
        return pb.ListGroupsResponse(groups=summaries)

    @_rpc
    async def DescribeGroup(  # noqa: N802
        self, request: pb.DescribeGroupRequest,
        context: grpc.aio.ServicerContext[pb.DescribeGroupRequest, pb.DescribeGroupResponse],
    ) -> pb.DescribeGroupResponse:
        _check_id("group_id", request.group_id)
        async with self._lock:
            d = self.registry.get(request.group_id).describe()
        offsets = await self._brokers.partition_offsets(d.group_id, d.topic, d.partition_count, d.subscription)
        return describe_to_proto(d, offsets)

    @_rpc
    async def DeleteGroup(  # noqa: N802
        self, request: pb.DeleteGroupRequest, context: grpc.aio.ServicerContext[pb.DeleteGroupRequest, pb.DeleteGroupResponse]
    ) -> pb.DeleteGroupResponse:
        """Only an EMPTY group: its offsets on the brokers go first (so a failure leaves the group
        in place to retry), then the group. Joins and commits wait meanwhile (UNAVAILABLE)."""
        group_id = request.group_id
        _check_id("group_id", group_id)
        if group_id in self._deleting:
            _fail(grpc.StatusCode.UNAVAILABLE, f"group {group_id!r} is already being deleted: retry")
        async with self._lock:
            group = self.registry.get(group_id)
            if group.members:
                raise machine.ConsumerGroupNotEmptyError(group_id, len(group.members), "delete it")
            topic = group.topic
            self._deleting.add(group_id)
        try:
            await self._brokers.delete_offsets(group_id, topic)
            await complete_even_if_cancelled(self._delete_durably(group_id))
        finally:
            self._deleting.discard(group_id)
        log.info("group deleted", group=group_id, topic=topic)
        return pb.DeleteGroupResponse()

    async def _delete_durably(self, group_id: str) -> None:
        async with self._lock:
            group = self.registry.get(group_id)
            undo = GroupCreated(group.group_id, group.topic, group.app_id, group.partition_count, group.subscription)
            result = self.registry.delete_group(group_id, self.clock.now_ms())
        self._forget_group(group_id)
        try:
            await self._persist(result.records)
        except Exception as e:
            async with self._lock:
                self.registry.replay(undo)
            log.exception("could not delete the group row", group=group_id)
            _not_recorded(f"delete group {group_id!r}", e)

    def _forget_group(self, group_id: str) -> None:
        self._signals.fire(group_id, (ALL_MEMBERS,))
        for key in [k for k in self._ack_seq if k[0] == group_id]:
            del self._ack_seq[key]

    # -- metadata listeners ----------------------------------------------------------------------

    async def _on_topic_deleted(self, topic: str) -> None:
        if not self._serving:
            return
        async with self._lock:
            result = self.registry.topic_deleted(topic, self.clock.now_ms())
        for group_id in result.response:
            self._forget_group(group_id)
            log.info("group deleted with its topic", group=group_id, topic=topic)
        await self._persist(result.records)

    async def _on_partitions_added(self, topic: str, partition_count: int) -> None:
        if not self._serving:
            return
        async with self._lock:
            result = self.registry.partition_count_changed(topic, partition_count, self.clock.now_ms())
        try:
            await self._record(result.events)
        except Exception:  # noqa: BLE001 - the next change of the group writes it again
            log.exception("could not record group membership", topic=topic)
        self._publish(result.events)


__all__ = ["GroupService", "build", "record_to_row", "row_to_record", "subscription_to_proto"]
