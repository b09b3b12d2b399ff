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
    wake-ups        one-shot asyncio.Events per (group, member), see `_Signals`. Events of the
                    machine are mapped to the members they concern (`_affected`), so a rebalance of
                    a 1,000-member group wakes each waiter a bounded number of times, not once per
                    other member's request.

Lock: every call into the registry or a Group happens under `_lock` with no await inside, so a
decision and the state it was made on are one atomic step; persisting, broker calls and stream
writes happen after it is released.

Persistence (coordinator.sqlite, table groups; see store.py): a group's existence and subscription
only. GroupCreated is saved before FindOrCreateGroup answers; if the save fails the group is
undone (replay GroupDeleted) and the caller gets UNAVAILABLE. Membership is in memory: after a
restart every old member id gets NOT_FOUND and the client re-joins (DESIGN.md "Processes").

Clocks: the machine runs on a monotonic clock (`Clock.now_ms()`, injectable); wall-clock time
(`node.clock_ms()`) is only stored, as a group's created_ms.

Liveness: a heartbeat carries the member's poll age (time since its application last called
poll()), so the coordinator removes a member whose application is stuck past
max_poll_interval_ms even while its heartbeat thread runs; the client's own watchdog leaves the
group too (as Kafka's client does). A heartbeat without a poll age counts as poll activity.

Watch streams (WatchGroup): each stream sends GroupEvent(generation, assignment_changed) when what
it would tell the member changes: a new generation, assignment_changed turning true, or still true
after the member fetched its assignment (so nothing it must act on is swallowed). Its queue is a
coalescing slot of size one: every GroupEvent is a full snapshot, so when the client reads slowly
the newest state replaces older ones and nothing grows. The stream ends with NOT_FOUND when the
member is gone, and normally when the service stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

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
    GroupError,
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
    Subscription,
    SubscriptionMode,
    group_id_for,
)
from dmq.coordinator.metadata import complete_even_if_cancelled
from dmq.coordinator.store import GroupRecord, StoreFullError
from dmq.coordinator.validation import ValidationError, validate_topic_name
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import error_details
from dmq.proto.names import FieldError, cap_message, check_app_id, check_id

if TYPE_CHECKING:
    from dmq.coordinator.node import CoordinatorNode

log = structlog.get_logger(__name__)

# Limits (every one says why it is what it is).
MAX_ID_CHARS = 512  # group ids are G_<topic:249>_<app_id:249>; member ids <client_id:255>-<32 hex>
MAX_POLL_AGE_MS = 365 * 24 * 3600 * 1000  # a year: anything longer is a client bug
MAX_WAIT_MS = 60_000  # GetAssignment long-poll; the same bound as the broker's Fetch
MAX_CHECK_PARTITIONS = 10_000  # = the most partitions a topic can have
MAX_TICK_INTERVAL_MS = 100  # the ticker re-reads the deadlines at least this often
WATCH_IDLE_MS = 30_000  # a watch stream re-evaluates at least this often (a safety net)
MAX_WATCHES_PER_MEMBER = 4  # a client holds one; a few more cover reconnect overlap
MAX_WATCHES = 100_000  # over all groups, bounds the coordinator's stream tasks
CREATE_WAIT_S = 30.0  # waiting for another request that is creating the same group
STOP_TIMEOUT_S = 3.0

_MODE_FROM_PROTO = {
    pb.SUBSCRIPTION_MODE_ALL: SubscriptionMode.ALL,
    pb.SUBSCRIPTION_MODE_NEW: SubscriptionMode.NEW,
    pb.SUBSCRIPTION_MODE_TIMESTAMP: SubscriptionMode.TIMESTAMP,
}
_MODE_TO_PROTO = {mode: code for code, mode in _MODE_FROM_PROTO.items()}


def build(node: CoordinatorNode) -> GroupService:
    """The node's plug-in point (see coordinator/node.py)."""
    return GroupService(node)


# -- errors -----------------------------------------------------------------------------------


class ServiceError(Exception):
    """A request refused by this layer (the machine's own errors are GroupError)."""

    def __init__(self, code: grpc.StatusCode, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason  # a dmq.proto.error_details reason, sent as trailing metadata


def _fail(code: grpc.StatusCode, message: str) -> NoReturn:
    raise ServiceError(code, message)


def _not_recorded(what: str, e: Exception) -> NoReturn:
    """A failed write of the group store: a full disk is RESOURCE_EXHAUSTED with the disk-full reason
    (the client backs off until space is freed); anything else UNAVAILABLE. Both retriable: nothing changed."""
    if isinstance(e, StoreFullError):
        raise ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"could not {what}: {e}", error_details.DISK_FULL)
    _fail(grpc.StatusCode.UNAVAILABLE, f"could not {what}: {e}: retry")


def _invalid(message: str) -> NoReturn:
    _fail(grpc.StatusCode.INVALID_ARGUMENT, message)


def _check_id(field: str, value: str, *, limit: int = MAX_ID_CHARS) -> None:
    """The shared id rule (dmq.proto.names): 1..limit UTF-8 bytes, no control characters."""
    try:
        check_id(value, field, field, limit)
    except FieldError as e:
        _invalid(str(e))


def _check_range(field: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        _invalid(f"{field} must be within {low}..{high}, got {value}")


Handler = Callable[..., Awaitable[Any]]


def _rpc(method: Handler) -> Handler:
    """Refusals become their status; anything unexpected becomes INTERNAL (logged). A handler
    never lets an exception escape into grpc, so no request takes the server down."""
    name = method.__name__

    @functools.wraps(method)
    async def wrapper(self: GroupService, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            self._check_serving()
            return await method(self, request, context)
        except ServiceError as e:
            metadata = ((error_details.REASON_KEY, e.reason),) if e.reason else ()
            await context.abort(e.code, cap_message(e.message), trailing_metadata=metadata)
        except GroupError as e:
            if e.code == "INTERNAL":  # IllegalStateTransitionError: a bug in the machine
                log.exception("group machine failed", rpc=name, group=getattr(request, "group_id", None))
            await context.abort(grpc.StatusCode[e.code], cap_message(str(e)))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the last line of defence of a server
            if isinstance(e, grpc.aio.AbortError):
                raise
            log.exception("group handler failed", rpc=name, group=getattr(request, "group_id", None))
            await context.abort(grpc.StatusCode.INTERNAL, cap_message(f"internal error in {name}: {type(e).__name__}: {e}"))

    return wrapper


# -- wake-ups ---------------------------------------------------------------------------------


async def _wait(event: asyncio.Event, timeout_s: float) -> None:
    """Until the event is set or the timeout passes (asyncio.timeout: no extra task per wait,
    unlike wait_for, which matters with a thousand watch streams)."""
    if event.is_set():
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()


ALL_MEMBERS = "*"


class _Signals:
    """One-shot broadcast events keyed by (group, member): `get` hands out the current event of a
    key, `fire` sets it and forgets it, so the next `get` starts a fresh one. A waiter takes its
    event *before* it evaluates the state and waits *after*, so a change in between is never
    missed. Only keys with a waiter are held."""

    __slots__ = ("_events",)

    def __init__(self) -> None:
        self._events: dict[str, dict[str, asyncio.Event]] = {}

    def get(self, group_id: str, member_id: str) -> asyncio.Event:
        members = self._events.setdefault(group_id, {})
        event = members.get(member_id)
        if event is None:
            event = members[member_id] = asyncio.Event()
        return event

    def fire(self, group_id: str, member_ids: Collection[str]) -> None:
        members = self._events.get(group_id)
        if not members:
            return
        if ALL_MEMBERS in member_ids:
            self._events.pop(group_id)
            for event in members.values():
                event.set()
            return
        for member_id in member_ids:
            waiting = members.pop(member_id, None)
            if waiting is not None:
                waiting.set()
        if not members:
            del self._events[group_id]

    def fire_all(self) -> None:
        groups, self._events = self._events, {}
        for members in groups.values():
            for event in members.values():
                event.set()

    def __len__(self) -> int:
        return sum(len(m) for m in self._events.values())


def _affected(group: Group | None, event: Event) -> set[str]:
    """The members whose answer (GetAssignment's rebalance_in_progress / what a watch stream
    would send) may change because of ``event``. Cases:
    1. a new generation or a state change: everyone (generation, rebalance_in_progress);
    2. partitions freed (released by their owner, or their owner is gone): their target owners,
       who can now acquire them, and the member itself;
    3. a join, an acquisition: the member itself;
    4. a scheduled rebalance, a partition count change: nobody until the generation starts."""
    if isinstance(event, (GenerationStarted, StateChanged)):
        return {ALL_MEMBERS}
    if isinstance(event, (PartitionsReleased, MemberRemoved)):
        freed = event.partitions if isinstance(event, PartitionsReleased) else event.released
        members = {event.member_id}
        if group is not None:
            members.update(m for p in freed if (m := group.target_owner.get(p)) is not None)
        return members
    if isinstance(event, (MemberJoined, PartitionsAcquired)):
        return {event.member_id}
    return set()


# -- conversions ------------------------------------------------------------------------------


def subscription_to_proto(sub: Subscription) -> pb.Subscription:
    return pb.Subscription(mode=_MODE_TO_PROTO[sub.mode], from_ms=sub.from_ms or 0, created_ms=sub.created_ms)


def record_to_row(record: GroupCreated) -> GroupRecord:
    sub = record.subscription
    return GroupRecord(
        group_id=record.group_id,
        topic=record.topic,
        app_id=record.app_id,
        subscription_mode=sub.mode.value,
        subscription_from_ms=sub.from_ms,
        created_ms=sub.created_ms,
        start_offsets=dict(sub.snapshot_offsets),
    )


def row_to_record(row: GroupRecord, partition_count: int) -> GroupCreated:
    return GroupCreated(
        group_id=row.group_id,
        topic=row.topic,
        app_id=row.app_id,
        partition_count=partition_count,
        subscription=Subscription(
            mode=SubscriptionMode(row.subscription_mode),
            from_ms=row.subscription_from_ms,
            created_ms=row.created_ms,
            snapshot_offsets=dict(row.start_offsets),
        ),
    )


def _peer_host(context: grpc.aio.ServicerContext) -> str:
    """"ipv4:127.0.0.1:5000" -> "127.0.0.1"; "ipv6:[::1]:5000" -> "::1" (the member's host, for
    describe)."""
    try:
        peer = context.peer() or ""
    except Exception:  # noqa: BLE001 - informational only
        return ""
    _, _, rest = peer.partition(":")
    host = rest.rpartition(":")[0] if rest.count(":") >= 1 else rest
    return host.strip("[]")[:255]


@dataclass(slots=True)
class _Watch:
    """Book-keeping of one (group, member)'s open watch streams."""

    count: int = 0


# -- the service ------------------------------------------------------------------------------


class GroupService(pb_grpc.GroupCoordinatorServicer):
    """The group coordinator component of a CoordinatorNode (add_to_server / start / stop)."""

    def __init__(
        self,
        node: CoordinatorNode,
        *,
        clock: Clock | None = None,
        config: GroupConfig | None = None,
        max_tick_interval_ms: int = MAX_TICK_INTERVAL_MS,
    ) -> None:
        self.node = node
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self.default_mode = SubscriptionMode(node.default_subscription_mode)
        # The time a default `timestamp` subscription starts from (CoordinatorNode refuses that
        # mode without one); None for the other modes.
        self.default_from_ms: int | None = node.default_subscription_from_ms
        debounce_ms = node.rebalance_debounce_ms
        self.config = config or GroupConfig(
            rebalance_debounce_ms=debounce_ms,
            rebalance_max_delay_ms=max(5_000, 10 * debounce_ms),
            default_subscription_mode=self.default_mode,
        )
        self.registry = GroupRegistry(self.config)
        self.max_tick_interval_ms = max_tick_interval_ms
        self._lock = asyncio.Lock()
        self._signals = _Signals()
        self._ack_seq: dict[tuple[str, str], int] = {}  # GetAssignment calls per member
        self._watches: dict[tuple[str, str], _Watch] = {}
        self._watch_total = 0
        self._creating: dict[str, asyncio.Future[None]] = {}
        self._deleting: set[str] = set()
        self._ticker: asyncio.Task[None] | None = None
        self._ticker_wake: asyncio.Event | None = None
        self._serving = False
        self._stopping = False

    def __repr__(self) -> str:
        return (
            f"<GroupService serving={self._serving} groups={len(self.registry)} "
            f"watches={self._watch_total} waiters={len(self._signals)}>"
        )

    # -- lifecycle -------------------------------------------------------------------------------

    def add_to_server(self, server: grpc.aio.Server) -> None:
        pb_grpc.add_GroupCoordinatorServicer_to_server(self, server)

    async def start(self) -> None:
        """Load the groups from SQLite (the node's metadata is loaded already), hook the topic
        listeners, start the ticker; RPCs are answered UNAVAILABLE until this is done."""
        if self._serving:
            raise RuntimeError("group service already started")
        await self._load()
        self.node.metadata.on_topic_deleted(self._on_topic_deleted)
        self.node.metadata.on_partitions_added(self._on_partitions_added)
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

    def _check_serving(self) -> None:
        if not self._serving:
            _fail(
                grpc.StatusCode.UNAVAILABLE,
                "group coordinator is stopping: retry" if self._stopping else "group coordinator is starting: retry",
            )

    async def _load(self) -> None:
        rows = await self.node.store.load_groups()
        for row in rows:
            topic = self.node.metadata.topic(row.topic)
            if topic is None:
                # The topic was deleted while the group was being recorded, or the coordinator
                # stopped before the topic-deleted listener removed it: the group goes too.
                log.warning("dropping group of a deleted topic", group=row.group_id, topic=row.topic)
                await self.node.store.delete_group(row.group_id)
                continue
            try:
                self.registry.replay(row_to_record(row, topic.partition_count))
            except (ValueError, KeyError) as e:
                log.error("skipping unreadable group row", group=row.group_id, topic=row.topic, error=str(e))

    # -- the ticker ------------------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        assert self._ticker_wake is not None
        wake = self._ticker_wake
        while not self._stopping:
            wake.clear()
            try:
                async with self._lock:
                    deadline_ms = self.registry.next_deadline_ms()
                    due = deadline_ms is not None and deadline_ms <= self.clock.now_ms()
                    events = self._tick() if due else []
                    if due:
                        deadline_ms = self.registry.next_deadline_ms()
                self._publish(events)
            except Exception:  # noqa: BLE001 - the ticker must keep running; say what broke
                log.exception("group timer tick failed")
                deadline_ms = None
            now_ms = self.clock.now_ms()
            sleep_ms = self.max_tick_interval_ms if deadline_ms is None else deadline_ms - now_ms
            sleep_ms = min(max(sleep_ms, 0), self.max_tick_interval_ms)
            if sleep_ms > 0:
                await _wait(wake, sleep_ms / 1000)
            else:
                await asyncio.sleep(0)  # let requests in between back-to-back deadlines

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
            elif isinstance(event, RebalanceScheduled) and self._ticker_wake is not None:
                self._ticker_wake.set()
            members = _affected(group, event)
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
        for record in records:
            if isinstance(record, GroupCreated):
                await self.node.store.save_group(record_to_row(record))
            else:
                await self.node.store.delete_group(record.group_id)

    # -- broker calls ----------------------------------------------------------------------------

    @property
    def _broker_timeout_s(self) -> float:
        return float(self.node.metadata.broker_call_timeout_ms) / 1000

    def _leaders(self, topic: str, partitions: Iterable[int], *, need_alive: bool) -> dict[str, list[int]]:
        """partitions grouped by their leader's "host:port"; UNAVAILABLE when one has none (or,
        with need_alive, when its broker is down)."""
        record = self.node.metadata.topic(topic)
        if record is None:
            _fail(grpc.StatusCode.NOT_FOUND, f"topic {topic!r} not found")
        by_address: dict[str, list[int]] = {}
        for p in partitions:
            broker_id = record.leader(p)
            address = None if broker_id is None else self.node.metadata.broker_address(broker_id)
            if (
                broker_id is None
                or address is None
                or (need_alive and not self.node.metadata.is_broker_alive(broker_id))
            ):
                _fail(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the broker of {topic}[{p}] (broker {broker_id}) is not available: start it, then retry",
                )
            by_address.setdefault(address, []).append(p)
        return by_address

    async def _latest_offsets(self, topic: str, partition_count: int) -> dict[int, int]:
        """Each partition's log end offset, for the snapshot of a `new` subscription."""
        by_address = self._leaders(topic, range(partition_count), need_alive=True)

        async def ask(address: str, parts: list[int]) -> list[pb.OffsetAnswer]:
            request = pb.ListOffsetsRequest(
                queries=[pb.OffsetQuery(topic=topic, partition=p, timestamp_ms=-1) for p in parts]
            )
            try:
                stub = self.node.broker_pool.stub(address)
                response = await stub.ListOffsets(request, timeout=self._broker_timeout_s)
            except grpc.aio.AioRpcError as e:
                _fail(
                    grpc.StatusCode.UNAVAILABLE,
                    f"cannot read the log end offsets of {topic} from {address} ({e.code().name}: {e.details()}): "
                    f"retry",
                )
            return list(response.answers)

        answers = await asyncio.gather(*(ask(a, ps) for a, ps in by_address.items()))
        offsets: dict[int, int] = {}
        for answer in (a for batch in answers for a in batch):
            if answer.error != pb.NONE:
                _fail(
                    grpc.StatusCode.UNAVAILABLE,
                    f"cannot read the log end offset of {topic}[{answer.partition}]: {answer.error_message}: retry",
                )
            offsets[answer.partition] = answer.offset
        missing = sorted(set(range(partition_count)) - set(offsets))
        if missing:
            _fail(grpc.StatusCode.UNAVAILABLE, f"no log end offset for {topic} partitions {missing}: retry")
        return offsets

    # -- RPCs: membership ------------------------------------------------------------------------

    @_rpc
    async def FindOrCreateGroup(  # noqa: N802
        self, request: pb.FindOrCreateGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.FindOrCreateGroupResponse:
        topic, app_id = request.topic, request.app_id
        try:
            validate_topic_name(topic, field="topic")
        except ValidationError as e:
            _invalid(str(e))
        try:
            check_app_id(app_id)  # it becomes part of the group id: bounded, printable
        except FieldError as e:
            _invalid(str(e))
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

        record = self.node.metadata.topic(topic)
        if record is None:
            _fail(grpc.StatusCode.NOT_FOUND, f"topic {topic!r} not found: create it first (dmq topics create)")
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
                    result = self._find_or_create(request, mode, from_ms, record.partition_count, None)
            if result is None and group_id not in self._creating:
                result = await self._create(request, mode, from_ms, record.partition_count)
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
            coordinator_address=self.node.advertised_address,
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

    def _find_or_create(
        self,
        request: pb.FindOrCreateGroupRequest,
        mode: SubscriptionMode,
        from_ms: int,
        partition_count: int,
        snapshot: dict[int, int] | None,
    ) -> machine.Result[machine.FindOrCreateGroupResponse]:
        pure = machine.FindOrCreateGroupRequest(
            topic=request.topic,
            app_id=request.app_id,
            partition_count=partition_count,
            subscription_mode=mode,
            subscription_from_ms=from_ms if mode is SubscriptionMode.TIMESTAMP else None,
            snapshot_offsets=snapshot,
            created_ms=self.node.clock_ms(),
        )
        return self.registry.find_or_create(pure, self.clock.now_ms())

    async def _create(
        self, request: pb.FindOrCreateGroupRequest, mode: SubscriptionMode, from_ms: int, partition_count: int
    ) -> machine.Result[machine.FindOrCreateGroupResponse]:
        """Create the group: snapshot the log ends first for mode `new`, then record it durably."""
        group_id = group_id_for(request.topic, request.app_id)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._creating[group_id] = done
        try:
            snapshot = None
            if mode is SubscriptionMode.NEW:
                snapshot = await self._latest_offsets(request.topic, partition_count)
            return await complete_even_if_cancelled(self._create_durably(request, mode, from_ms, partition_count, snapshot))
        finally:
            del self._creating[group_id]
            done.set_result(None)

    async def _create_durably(
        self,
        request: pb.FindOrCreateGroupRequest,
        mode: SubscriptionMode,
        from_ms: int,
        partition_count: int,
        snapshot: dict[int, int] | None,
    ) -> machine.Result[machine.FindOrCreateGroupResponse]:
        async with self._lock:
            result = self._find_or_create(request, mode, from_ms, partition_count, snapshot)
        try:
            await self._persist(result.records)
        except Exception as e:
            async with self._lock:
                for record in result.records:
                    if isinstance(record, GroupCreated):
                        self.registry.replay(GroupDeleted(record.group_id))
            log.exception("could not record the new group", group=result.response.group_id, topic=request.topic)
            _not_recorded(f"record group {result.response.group_id!r}", e)
        if result.records and self.node.metadata.topic(request.topic) is None:
            # The topic was deleted while the group was being recorded (its listener found no
            # group to delete then): take the group away again.
            async with self._lock:
                deleted = self.registry.topic_deleted(request.topic, self.clock.now_ms())
            await self._persist(deleted.records)
            _fail(grpc.StatusCode.NOT_FOUND, f"topic {request.topic!r} was deleted")
        return result

    @_rpc
    async def JoinGroup(  # noqa: N802
        self, request: pb.JoinGroupRequest, context: grpc.aio.ServicerContext
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
        )
        async with self._lock:
            result = machine.handle_join(self.registry.get(group_id), pure, self.clock.now_ms())
        self._publish(result.events)
        return pb.JoinGroupResponse(member_id=result.response.member_id, generation=result.response.generation)

    @_rpc
    async def GetAssignment(  # noqa: N802
        self, request: pb.GetAssignmentRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetAssignmentResponse:
        group_id, member_id = request.group_id, request.member_id
        _check_id("group_id", group_id)
        _check_id("member_id", member_id)
        _check_range("wait_ms", request.wait_ms, 0, MAX_WAIT_MS)
        wait_s = request.wait_ms / 1000
        remaining = context.time_remaining()
        if remaining is not None:
            wait_s = min(wait_s, max(0.0, remaining - 0.05))  # answer before the client gives up
        deadline = time.monotonic() + wait_s
        key = (group_id, member_id)
        pure = machine.GetAssignmentRequest(member_id)
        while True:
            async with self._lock:
                result = machine.handle_get_assignment(self.registry.get(group_id), pure, self.clock.now_ms())
            self._ack_seq[key] = self._ack_seq.get(key, 0) + 1
            self._publish(result.events, wake=(key,))
            response = result.response
            left_s = deadline - time.monotonic()
            if not response.rebalance_in_progress or left_s <= 0 or self._stopping:
                break
            wake = self._signals.get(group_id, member_id)
            await _wait(wake, left_s)
        return pb.GetAssignmentResponse(
            generation=response.generation,
            partitions=response.partitions,
            rebalance_in_progress=response.rebalance_in_progress,
            start_positions=[pb.StartPosition(partition=p, offset=o) for p, o in response.start_positions],
            topic=response.topic,
        )

    @_rpc
    async def Heartbeat(  # noqa: N802
        self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> pb.HeartbeatResponse:
        group_id, member_id = request.group_id, request.member_id
        _check_id("group_id", group_id)
        _check_id("member_id", member_id)
        if request.generation < -1:
            _invalid(f"generation must be >= -1 (-1 = none yet), got {request.generation}")
        poll_age_ms = request.poll_age_ms if request.HasField("poll_age_ms") else 0
        if not 0 <= poll_age_ms <= MAX_POLL_AGE_MS:
            _fail(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"poll_age_ms must be within 0..{MAX_POLL_AGE_MS}, got {poll_age_ms}",
            )
        pure = machine.HeartbeatRequest(member_id, request.generation, poll_age_ms=poll_age_ms)
        async with self._lock:
            result = machine.handle_heartbeat(self.registry.get(group_id), pure, self.clock.now_ms())
        response = result.response
        return pb.HeartbeatResponse(generation=response.generation, assignment_changed=response.assignment_changed)

    @_rpc
    async def WatchGroup(  # noqa: N802
        self, request: pb.WatchGroupRequest, context: grpc.aio.ServicerContext
    ) -> None:
        group_id, member_id = request.group_id, request.member_id
        _check_id("group_id", group_id)
        _check_id("member_id", member_id)
        key = (group_id, member_id)
        self.registry.get(group_id).member(member_id)  # NOT_FOUND before anything is held
        watch = self._watches.get(key)
        if watch is not None and watch.count >= MAX_WATCHES_PER_MEMBER:
            _fail(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"member {member_id!r} already has {watch.count} watch streams open: close one first",
            )
        if self._watch_total >= MAX_WATCHES:
            _fail(grpc.StatusCode.RESOURCE_EXHAUSTED, f"the coordinator holds {MAX_WATCHES} watch streams: retry later")
        watch = self._watches.setdefault(key, _Watch())
        watch.count += 1
        self._watch_total += 1
        try:
            await self._watch(group_id, member_id, context)
        finally:
            watch.count -= 1
            self._watch_total -= 1
            if watch.count == 0 and self._watches.get(key) is watch:
                del self._watches[key]

    async def _watch(self, group_id: str, member_id: str, context: grpc.aio.ServicerContext) -> None:
        key = (group_id, member_id)
        sent: tuple[int, bool] | None = None
        sent_ack = -1
        while not self._stopping:
            wake = self._signals.get(group_id, member_id)  # taken before evaluating: see _Signals
            group = self.registry.get(group_id)
            group.member(member_id)  # NOT_FOUND ends the stream: the member is gone
            generation = group.generation
            changed = group.assignment_changed(member_id)
            ack = self._ack_seq.get(key, 0)
            if sent is None or generation != sent[0] or (changed and (not sent[1] or ack != sent_ack)):
                await context.write(pb.GroupEvent(generation=generation, assignment_changed=changed))
            sent, sent_ack = (generation, changed), ack
            await _wait(wake, WATCH_IDLE_MS / 1000)

    @_rpc
    async def LeaveGroup(  # noqa: N802
        self, request: pb.LeaveGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.LeaveGroupResponse:
        group_id, member_id = request.group_id, request.member_id
        _check_id("group_id", group_id)
        _check_id("member_id", member_id)
        async with self._lock:
            result = machine.handle_leave(self.registry.get(group_id), machine.LeaveGroupRequest(member_id),
                                          self.clock.now_ms())
        self._publish(result.events)
        return pb.LeaveGroupResponse()

    # -- RPCs: commits (internal, called by brokers) ---------------------------------------------

    @_rpc
    async def CheckOwnership(  # noqa: N802
        self, request: pb.CheckOwnershipRequest, context: grpc.aio.ServicerContext
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
        )
        async with self._lock:
            machine.check_ownership(self.registry.get(group_id), pure, self.clock.now_ms())
        return pb.CheckOwnershipResponse()

    # -- RPCs: admin -----------------------------------------------------------------------------

    @_rpc
    async def ListGroups(  # noqa: N802
        self, request: pb.ListGroupsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListGroupsResponse:
        async with self._lock:
            summaries = [
                pb.GroupSummary(
                    group_id=g.group_id,
                    topic=g.topic,
                    state=g.state.value,  # type: ignore[arg-type]  # protoc's .pyi omits the int an enum field takes
                    generation=g.generation,
                    member_count=len(g.members),
                )
                for g in self.registry.groups()
            ]
        return pb.ListGroupsResponse(groups=summaries)

    @_rpc
    async def DescribeGroup(  # noqa: N802
        self, request: pb.DescribeGroupRequest, context: grpc.aio.ServicerContext
    ) -> pb.DescribeGroupResponse:
        _check_id("group_id", request.group_id)
        async with self._lock:
            d = self.registry.get(request.group_id).describe()
        offsets = await self._partition_offsets(d.group_id, d.topic, d.partition_count, d.subscription)
        partitions = []
        total_lag = 0
        for p, owner in d.owners:
            committed, log_end, start = offsets.get(p, (-1, -1, -1))
            if log_end < 0:  # its broker did not answer: unknown, left out of the total
                lag = -1
            else:
                # Lag counts what the group has still to read: from the committed offset, or
                # where the subscription would start it when nothing is committed yet.
                position = committed if committed >= 0 else start
                lag = max(0, log_end - max(position, 0))
                total_lag += lag
            partitions.append(
                pb.PartitionLag(
                    partition=p, committed_offset=committed, log_end_offset=log_end, lag=lag,
                    owner_member_id=owner or "",
                )
            )
        return pb.DescribeGroupResponse(
            group_id=d.group_id,
            topic=d.topic,
            state=d.state.value,  # type: ignore[arg-type]  # protoc's .pyi omits the int an enum field takes
            generation=d.generation,
            subscription=subscription_to_proto(d.subscription),
            members=[
                pb.MemberDescription(
                    member_id=m.member_id, client_id=m.client_id, host=m.host,
                    partitions=m.partitions, target_partitions=m.target_partitions,
                )
                for m in d.members
            ],
            partitions=partitions,
            total_lag=total_lag,
        )

    async def _partition_offsets(
        self, group_id: str, topic: str, partition_count: int, sub: Subscription
    ) -> dict[int, tuple[int, int, int]]:
        """partition -> (committed offset, log end offset, start position of the subscription),
        one FetchCommittedOffsets and one ListOffsets per leading broker, concurrently. A broker
        that does not answer leaves its partitions out (logged)."""
        try:
            by_address = self._leaders(topic, range(partition_count), need_alive=False)
        except ServiceError:
            return {}
        # ListOffsets timestamps: -1 latest, -2 earliest, >= 0 the first offset at or after it.
        start_ts = sub.from_ms if sub.mode is SubscriptionMode.TIMESTAMP and sub.from_ms is not None else -2

        async def ask(address: str, parts: list[int]) -> dict[int, tuple[int, int, int]]:
            stub = self.node.broker_pool.stub(address)
            timeout = self._broker_timeout_s
            committed_call = stub.FetchCommittedOffsets(
                pb.FetchCommittedOffsetsRequest(
                    group_id=group_id, partitions=[pb.TopicPartition(topic=topic, partition=p) for p in parts]
                ),
                timeout=timeout,
            )
            queries = [
                pb.OffsetQuery(topic=topic, partition=p, timestamp_ms=ts) for p in parts for ts in (-1, start_ts)
            ]
            offsets_call = stub.ListOffsets(pb.ListOffsetsRequest(queries=queries), timeout=timeout)
            try:
                committed_resp, offsets_resp = await asyncio.gather(committed_call, offsets_call)
            except grpc.aio.AioRpcError as e:
                log.warning("describe: broker did not answer", group=group_id, topic=topic, address=address,
                            partitions=parts, code=e.code().name, error=e.details())
                return {}
            committed = {o.partition: o.offset for o in committed_resp.offsets if o.topic == topic}
            answers = list(offsets_resp.answers)
            out = {}
            for i, p in enumerate(parts):
                latest, start = answers[2 * i], answers[2 * i + 1]
                if latest.error != pb.NONE or start.error != pb.NONE:
                    continue
                if sub.mode is SubscriptionMode.NEW:
                    start_offset = max(sub.start_position(p), start.log_start_offset)
                else:
                    start_offset = start.offset
                out[p] = (committed.get(p, -1), latest.offset, start_offset)
            return out

        results = await asyncio.gather(*(ask(a, ps) for a, ps in by_address.items()))
        merged: dict[int, tuple[int, int, int]] = {}
        for r in results:
            merged.update(r)
        return merged

    @_rpc
    async def DeleteGroup(  # noqa: N802
        self, request: pb.DeleteGroupRequest, context: grpc.aio.ServicerContext
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
                raise machine.GroupNotEmptyError(group_id, len(group.members), "delete it")
            topic = group.topic
            self._deleting.add(group_id)
        try:
            await self._delete_offsets(group_id, topic)
            await complete_even_if_cancelled(self._delete_durably(group_id))
        finally:
            self._deleting.discard(group_id)
        log.info("group deleted", group=group_id, topic=topic)
        return pb.DeleteGroupResponse()

    async def _delete_offsets(self, group_id: str, topic: str) -> None:
        metadata = self.node.metadata
        record = metadata.topic(topic)
        if record is not None:
            down = sorted({b for b in record.placement.values() if not metadata.is_broker_alive(b)})
            if down:
                # Their offsets would outlive the group and come back when it is created again.
                _fail(
                    grpc.StatusCode.UNAVAILABLE,
                    f"brokers {down} holding offsets of {topic!r} are down: start them, then delete the group",
                )
        addresses = [a for b in metadata.live_broker_ids() if (a := metadata.broker_address(b)) is not None]

        async def delete(address: str) -> None:
            try:
                await self.node.broker_pool.stub(address).DeleteGroupOffsets(
                    pb.DeleteGroupOffsetsRequest(group_id=group_id), timeout=self._broker_timeout_s
                )
            except grpc.aio.AioRpcError as e:
                _fail(
                    grpc.StatusCode.UNAVAILABLE,
                    f"could not delete the offsets of {group_id!r} on {address} ({e.code().name}: {e.details()}): "
                    f"the group is kept, retry",
                )

        await asyncio.gather(*(delete(a) for a in addresses))

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
        self._publish(result.events)


__all__ = ["GroupService", "ServiceError", "build", "record_to_row", "row_to_record", "subscription_to_proto"]
