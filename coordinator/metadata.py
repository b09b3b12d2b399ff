"""The metadata service: brokers, topics and partition placement.

Two layers:
  MetadataManager   the state and its rules, for in-process callers (the group coordinator, the
                    node). Raises MetadataError subclasses, each carrying its gRPC status code.
  MetadataServicer  the gRPC Metadata service: proto in, proto out, MetadataError -> status code,
                    anything unexpected -> INTERNAL (logged). No handler lets an exception escape.

State: topics and placement are read from memory; every change is written to SQLite first (one
transaction) and applied to memory after it commits, and that pair completes even if the calling
RPC is cancelled. A full disk under SQLite fails the write whole (StoreFullError) and is answered
RESOURCE_EXHAUSTED "disk full on the coordinator" with the disk-full reason (dmq.proto.error_details)
in the trailing metadata: nothing changed, and the same request succeeds once space is freed. Topic admin operations (create, delete, add partitions) are serialized by one lock
held through their broker calls, so a broker sees CreatePartitions and DeletePartitions for a topic
in the order the coordinator decided them; those calls have a timeout, so the lock is bounded.

Broker answers to CreatePartitions (create topic, add partitions), two cases:
  1. Lost (unreachable, timed out, shutting down): the change stands; the broker gets its
     partitions when it next (re-)registers, as its session expires.
  2. Refused (any other status, e.g. RESOURCE_EXHAUSTED "disk full on broker N", or a reason such as
     storage-unavailable): the broker will not get the partitions by re-registering, so the change is
     undone (store, memory, and DeletePartitions to the brokers, which may have created some) and the
     caller gets the broker's own status, message and reason: a retry once the cause is gone succeeds.

Broker liveness: a broker is alive while it has registered with this coordinator process and its
last heartbeat is at most broker_session_timeout_ms old (clock_ms is injected for tests). Liveness
is computed from the clock on every read, so metadata answers leader_alive=false as soon as the
session has elapsed, not when the node's monitor next runs. The default session is short
(DEFAULT_BROKER_SESSION_TIMEOUT_MS, 6 s) because clients route around a dead broker only once
it is declared dead; brokers are told to heartbeat four times per session. Brokers
known from SQLite but not yet registered since start are not alive; their heartbeats are answered
with reregister=true, as are those of a broker whose session expired, so every (re-)registration
hands the broker its full placement and repairs any CreatePartitions call that was lost.

Per-principal limits (PrincipalLimits): every topic records the principal that created it, and
the topics and partitions a principal may hold that way are bounded (0 = unlimited). A topic's
partitions count against its creator, also those another principal adds later, so no principal
grows past its limit through someone else's requests. Refused: RESOURCE_EXHAUSTED naming the
principal, the limit and the current count. Exempt: the principals listed (super-users and the
cluster's own), and calls without a principal (security off).

Placement: round-robin over the live brokers sorted by id, starting at crc32(topic) mod N so that
partition 0 of different topics lands on different brokers; partition p goes to
live[(start + p) % N]. AddPartitions continues the same sequence over the brokers live then. A
partition keeps its broker for life (no replication), so a dead broker's partitions are unavailable
(leader_alive=false) until it comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import sqlite3
import time
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import grpc
import structlog

from dmq.coordinator.acls import AclManager
from dmq.coordinator.broker_pool import BrokerPool
from dmq.coordinator.store import BrokerRecord, CoordinatorStore, StoreFullError, TopicRecord
from dmq.coordinator.validation import (
    TopicSettings,
    ValidationError,
    validate_partition_count,
    validate_partition_increase,
    validate_topic_name,
)
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import error_details, limits
from dmq.proto.names import shorten
from dmq.proto.security.interceptor import ANONYMOUS, current_principal
from dmq.proto.server_errors import RpcAbort, rpc_handler

log = structlog.get_logger(__name__)

T = TypeVar("T")

DEFAULT_BROKER_CALL_TIMEOUT_MS = 5_000
HOST_MAX_CHARS = 253  # a DNS name's limit
BROKER_ID_MAX = 2**31 - 1
NO_LIVE_BROKERS = "no live brokers: start one with `dmq broker`"
# Partitions a broker may lead: each costs a directory, open files on demand and work at every
# restart (DESIGN.md: one broker holds 10,000). 200,011 partitions on one broker made a restart take
# 24.7 s and ListTopics time out.
MAX_PARTITIONS_PER_BROKER = 10_000
# Partitions in the cluster: bounds the coordinator's memory, its start-up and every metadata answer.
MAX_PARTITIONS_TOTAL = 100_000

PartitionsAddedListener = Callable[[str, int], Awaitable[None] | None]
TopicDeletedListener = Callable[[str], Awaitable[None] | None]


# -- errors ---------------------------------------------------------------------------------------


class MetadataError(Exception):
    """A request the metadata service refuses; `code` is the gRPC status it maps to."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    reason: str | None = None  # a dmq.proto.error_details reason, sent as trailing metadata


class InvalidArgument(MetadataError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class BrokerIdTaken(MetadataError):
    # FAILED_PRECONDITION: another, live broker holds the id. A broker restarted at a new address
    # retries until the old registration's session expires (dmq.broker.node).
    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = error_details.BROKER_ID_TAKEN


class PartitionLimitExceeded(MetadataError):
    # RESOURCE_EXHAUSTED: the request is valid, the cluster is full (delete topics or add brokers).
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class PrincipalLimitExceeded(MetadataError):
    # RESOURCE_EXHAUSTED: valid, but the principal holds as much as it may (delete its unused topics).
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


@dataclass(frozen=True, slots=True)
class PrincipalLimits:
    """How many topics, and partitions of those topics, one principal may have created (0 = no
    limit). `exempt`: principals no limit applies to (the super-users and the cluster principal)."""

    max_topics: int = 0
    max_partitions: int = 0
    exempt: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for name in ("max_topics", "max_partitions"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0 (0 = unlimited), got {value!r}")

    def applies_to(self, principal: str | None) -> bool:
        return principal is not None and principal not in self.exempt and bool(self.max_topics or self.max_partitions)


class CoordinatorDiskFull(MetadataError):
    """The coordinator's SQLite could not write: its disk is full. Nothing changed; retriable."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = error_details.DISK_FULL


@contextlib.contextmanager
def _coordinator_disk_full() -> Iterator[None]:
    """Around a store write: a full disk becomes CoordinatorDiskFull (its message says where)."""
    try:
        yield
    except StoreFullError as e:
        raise CoordinatorDiskFull(str(e)) from e


@dataclass(frozen=True, slots=True)
class BrokerRefusal:
    """A broker's answer refusing a partition change (case 2 in the module docstring)."""

    broker_id: int
    code: grpc.StatusCode
    message: str
    reason: str | None


class BrokerRefused(MetadataError):
    """A topic change undone because a broker refused it; carries the broker's status and reason."""

    def __init__(self, refusal: BrokerRefusal, message: str, *, undone: bool) -> None:
        super().__init__(message)
        self.code = refusal.code
        self.reason = refusal.reason
        self.refusal = refusal
        self.undone = undone  # False: the store could not undo it either (the message says what to do)


# Broker answers after which it gets its partitions anyway, at its next (re-)registration.
_LOST_CALL_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


class TopicNotFound(MetadataError):
    code = grpc.StatusCode.NOT_FOUND

    def __init__(self, names: Iterable[str]) -> None:
        self.names = sorted(names)
        listed = ", ".join(repr(n) for n in self.names)
        noun = "topic" if len(self.names) == 1 else "topics"
        super().__init__(f"{noun} {listed} not found")


class TopicAlreadyExists(MetadataError):
    code = grpc.StatusCode.ALREADY_EXISTS

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"topic {name!r} already exists")


class NoLiveBrokers(MetadataError):
    # UNAVAILABLE: retriable, since brokers may still be starting (e.g. just after `dmq server`).
    code = grpc.StatusCode.UNAVAILABLE

    def __init__(self) -> None:
        super().__init__(NO_LIVE_BROKERS)


class NotReady(MetadataError):
    code = grpc.StatusCode.UNAVAILABLE

    def __init__(self) -> None:
        super().__init__("coordinator is starting: retry")


# -- state ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class _BrokerState:
    record: BrokerRecord
    registered: bool = False  # registered with this coordinator process (and not expired since)
    last_heartbeat_ms: int = -1
    principal: str | None = None  # who registered it (this coordinator process): the id is bound to it


def broker_address(host: str, port: int) -> str:
    """ "host:port", with IPv6 literals bracketed as gRPC expects."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def placement_for(topic: str, partitions: Iterable[int], live_broker_ids: list[int]) -> dict[int, int]:
    """Round-robin placement (see the module comment). live_broker_ids must be non-empty."""
    brokers = sorted(live_broker_ids)
    start = zlib.crc32(topic.encode()) % len(brokers)
    return {p: brokers[(start + p) % len(brokers)] for p in partitions}


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


async def complete_even_if_cancelled(coro: Coroutine[Any, Any, T]) -> T:
    """Run coro to its end even when the caller is cancelled; then re-raise the cancellation.

    Used for "write SQLite, then apply to memory": stopping half-way would leave memory behind disk.
    """
    task = asyncio.ensure_future(coro)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return task.result()


# A dead broker is declared dead at most this long after its last heartbeat. Kafka's KRaft
# default (broker.session.timeout.ms) is 9 s; ours is shorter because a local cluster's brokers
# heartbeat over loopback, and the bound for declaring a broker dead is 6 s.
DEFAULT_BROKER_SESSION_TIMEOUT_MS = 6_000


class MetadataManager:
    def __init__(
        self,
        store: CoordinatorStore,
        broker_pool: BrokerPool,
        *,
        broker_session_timeout_ms: int = DEFAULT_BROKER_SESSION_TIMEOUT_MS,
        broker_call_timeout_ms: int = DEFAULT_BROKER_CALL_TIMEOUT_MS,
        default_topic_config: TopicSettings | None = None,
        principal_limits: PrincipalLimits | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        if broker_session_timeout_ms <= 0:
            raise ValueError(f"broker_session_timeout_ms must be > 0, got {broker_session_timeout_ms}")
        if default_topic_config is not None:
            default_topic_config.validate(field_prefix="default_topic_config.")
        self.store = store
        self.broker_pool = broker_pool
        self.broker_session_timeout_ms = broker_session_timeout_ms
        self.broker_call_timeout_ms = broker_call_timeout_ms
        self.default_topic_config = default_topic_config
        self.clock_ms = clock_ms
        # Plain attributes: an operator (or a test) may change them on a running coordinator.
        self.max_partitions_per_broker = MAX_PARTITIONS_PER_BROKER
        self.max_partitions_total = MAX_PARTITIONS_TOTAL
        self.principal_limits = principal_limits or PrincipalLimits()
        self.ready = False
        self._topics: dict[str, TopicRecord] = {}
        self._brokers: dict[int, _BrokerState] = {}
        self._admin_lock = asyncio.Lock()
        self._partitions_added_listeners: list[PartitionsAddedListener] = []
        self._topic_deleted_listeners: list[TopicDeletedListener] = []

    def __repr__(self) -> str:
        return (
            f"<MetadataManager ready={self.ready} topics={len(self._topics)} brokers={len(self._brokers)} "
            f"live={len(self.live_broker_ids())}>"
        )

    async def load(self) -> None:
        """Load brokers and topics from the store (called once by the node's start())."""
        self._brokers = {b.broker_id: _BrokerState(b) for b in await self.store.load_brokers()}
        self._topics = {t.name: t for t in await self.store.load_topics()}
        self.ready = True
        log.info("metadata loaded", topics=len(self._topics), brokers=len(self._brokers))

    def check_ready(self) -> None:
        if not self.ready:
            raise NotReady()

    @property
    def heartbeat_interval_ms(self) -> int:
        """What brokers are told: several heartbeats fit in one session, so one lost beat is harmless."""
        return max(10, self.broker_session_timeout_ms // 4)

    # -- reads, for in-process callers -------------------------------------------------------------

    def topic(self, name: str) -> TopicRecord | None:
        return self._topics.get(name)

    def topics(self) -> list[TopicRecord]:
        return [self._topics[name] for name in sorted(self._topics)]

    def broker(self, broker_id: int) -> BrokerRecord | None:
        state = self._brokers.get(broker_id)
        return state.record if state else None

    def brokers(self) -> list[BrokerRecord]:
        return [self._brokers[i].record for i in sorted(self._brokers)]

    def broker_address(self, broker_id: int) -> str | None:
        state = self._brokers.get(broker_id)
        return broker_address(state.record.host, state.record.port) if state else None

    def leader_address(self, topic: str, partition: int) -> str | None:
        record = self._topics.get(topic)
        leader = record.leader(partition) if record else None
        return self.broker_address(leader) if leader is not None else None

    def is_broker_alive(self, broker_id: int) -> bool:
        state = self._brokers.get(broker_id)
        return state is not None and self._alive(state, self.clock_ms())

    def live_broker_ids(self) -> list[int]:
        now = self.clock_ms()
        return sorted(i for i, s in self._brokers.items() if self._alive(s, now))

    def last_heartbeat_ms(self, broker_id: int) -> int:
        state = self._brokers.get(broker_id)
        return state.last_heartbeat_ms if state else -1

    def partitions_led(self, broker_id: int) -> int:
        return sum(1 for t in self._topics.values() for b in t.placement.values() if b == broker_id)

    def _alive(self, state: _BrokerState, now_ms: int) -> bool:
        return state.registered and now_ms - state.last_heartbeat_ms <= self.broker_session_timeout_ms

    # -- listeners -------------------------------------------------------------------------------

    def add_partitions_added_listener(self, callback: PartitionsAddedListener) -> None:
        """callback(topic, new_partition_count), sync or async, after the brokers were asked to create
        the new partitions. Errors are logged, not propagated."""
        self._partitions_added_listeners.append(callback)

    # The name the group coordinator looks for.
    on_partitions_added = add_partitions_added_listener

    def add_topic_deleted_listener(self, callback: TopicDeletedListener) -> None:
        """callback(topic), sync or async, after the topic was removed. Errors are logged."""
        self._topic_deleted_listeners.append(callback)

    on_topic_deleted = add_topic_deleted_listener

    async def _notify(self, listeners: list[Callable[..., Any]], *args: Any) -> None:
        for callback in list(listeners):
            try:
                result = callback(*args)
                if inspect.isawaitable(result):
                    await asyncio.wait_for(result, self.broker_call_timeout_ms / 1000)
            except Exception:  # noqa: BLE001 - a listener's bug must not fail the admin request
                log.exception("metadata listener failed", listener=repr(callback), args=args)

    # -- brokers ---------------------------------------------------------------------------------

    async def register_broker(
        self, broker_id: int, host: str, port: int, *, principal: str | None = None
    ) -> list[pb.CreatePartitionsRequest]:
        """Record the broker, mark it alive, and return every partition placed on it.

        Refused (BrokerIdTaken) when the id is bound to another principal, or when the id's
        broker is live at another address: a registration never moves a live broker's partitions
        away from it (a stray or hostile RegisterBroker re-pointed broker 0 and producers then
        timed out). Security off, every caller is the same anonymous principal and the liveness
        rule alone protects the id."""
        self.check_ready()
        _validate_broker(broker_id, host, port)
        now = self.clock_ms()
        previous = self._brokers.get(broker_id)
        if previous is not None:
            if previous.principal is not None and principal is not None and previous.principal != principal:
                raise BrokerIdTaken(
                    f"broker id {broker_id} is bound to principal {previous.principal!r}; {principal!r} may not "
                    "register it (give this broker its own id)"
                )
            moved = (previous.record.host, previous.record.port) != (host, port)
            if moved and self._alive(previous, now):
                raise BrokerIdTaken(
                    f"broker id {broker_id} is live at {broker_address(previous.record.host, previous.record.port)}; "
                    f"a registration moving it to {broker_address(host, port)} is refused until that broker's "
                    f"session ({self.broker_session_timeout_ms} ms) expires: two brokers with one id?"
                )
        record = BrokerRecord(broker_id=broker_id, host=host, port=port, registered_ms=now)
        await complete_even_if_cancelled(self._apply_registration(record, now))
        self._brokers[broker_id].principal = principal
        return self.partition_requests_for(broker_id)

    async def _apply_registration(self, record: BrokerRecord, now_ms: int) -> None:
        previous = self._brokers.get(record.broker_id)
        if previous is None or (previous.record.host, previous.record.port) != (record.host, record.port):
            with _coordinator_disk_full():
                await self.store.upsert_broker(record)
        if previous is not None and (previous.record.host, previous.record.port) != (record.host, record.port):
            old = broker_address(previous.record.host, previous.record.port)
            # Two brokers configured with one id would flap here; the log line is how to spot it.
            log.warning(
                "broker address changed",
                broker_id=record.broker_id,
                old_address=old,
                new_address=broker_address(record.host, record.port),
                was_alive=self._alive(previous, now_ms),
            )
            self.broker_pool.forget(old)
        state = _BrokerState(record, registered=True, last_heartbeat_ms=now_ms)
        if previous is not None and (previous.record.host, previous.record.port) == (record.host, record.port):
            state.record = previous.record  # keep the first registration time of this address
        self._brokers[record.broker_id] = state
        log.info(
            "broker registered",
            broker_id=record.broker_id,
            address=broker_address(record.host, record.port),
            partitions=self.partitions_led(record.broker_id),
        )

    def partition_requests_for(self, broker_id: int) -> list[pb.CreatePartitionsRequest]:
        """One CreatePartitionsRequest per topic with partitions on the broker."""
        requests = []
        for topic in self.topics():
            partitions = topic.partitions_on(broker_id)
            if partitions:
                requests.append(
                    pb.CreatePartitionsRequest(
                        topic=topic.name,
                        partitions=partitions,
                        config=topic_config_to_proto(topic.config),
                        topic_partition_count=topic.partition_count,
                    )
                )
        return requests

    def heartbeat(self, broker_id: int) -> bool:
        """Refresh the broker's session; True when it must re-register (unknown or expired)."""
        self.check_ready()
        state = self._brokers.get(broker_id)
        now = self.clock_ms()
        if state is None or not self._alive(state, now):
            if state is not None and state.registered:
                state.registered = False
                log.warning("heartbeat after the broker's session expired", broker_id=broker_id)
            return True
        state.last_heartbeat_ms = now
        return False

    def expire_brokers(self) -> list[int]:
        """End the sessions that timed out; the ids. Called periodically by the node's monitor."""
        now = self.clock_ms()
        expired = []
        for broker_id, state in sorted(self._brokers.items()):
            if state.registered and not self._alive(state, now):
                state.registered = False
                expired.append(broker_id)
                log.warning(
                    "broker session expired",
                    broker_id=broker_id,
                    address=broker_address(state.record.host, state.record.port),
                    last_heartbeat_ms=state.last_heartbeat_ms,
                    partitions=self.partitions_led(broker_id),
                )
        return expired

    # -- topics ----------------------------------------------------------------------------------

    async def create_topic(
        self, name: str, partitions: int, config: TopicSettings | None = None, *, principal: str | None = None
    ) -> TopicRecord:
        """Create the topic; `principal` (None: security off) is recorded as its creator."""
        self.check_ready()
        config = config or TopicSettings()
        _validated(validate_topic_name, name)
        _validated(validate_partition_count, partitions)
        _validated(config.validate)
        _validated(config.check_event_store, partitions)
        async with self._admin_lock:
            if name in self._topics:
                raise TopicAlreadyExists(name)
            live = self.live_broker_ids()
            if not live:
                raise NoLiveBrokers()
            placement = placement_for(name, range(partitions), live)
            self._check_principal_limits(principal, principal, name, new_topics=1, new_partitions=partitions)
            self._check_partition_limits(name, placement)
            record = TopicRecord(
                name=name,
                partition_count=partitions,
                placement=placement,
                config=_settings_for(config, self.default_topic_config),
                created_ms=self.clock_ms(),
                creator=principal,
            )
            await complete_even_if_cancelled(self._apply_create(record))
            log.info(
                "topic created",
                topic=name,
                partitions=partitions,
                brokers=sorted(set(record.placement.values())),
                config=record.config.to_dict(),
            )
            refusal = await self._create_on_brokers(record, range(partitions))
            if refusal is not None:
                error = await self._undo(refusal, f"create topic {name!r}", self._apply_delete(name))
                if error.undone:
                    await self._delete_on_brokers(record)
        if refusal is not None:
            if error.undone:
                # Listeners (the group coordinator) may have seen the topic meanwhile; it is gone again.
                await self._notify(self._topic_deleted_listeners, name)
            raise error
        return record

    async def _apply_create(self, record: TopicRecord) -> None:
        try:
            with _coordinator_disk_full():
                await self.store.create_topic(record)
        except sqlite3.IntegrityError as e:  # only if memory and disk disagree; say which
            raise MetadataError(f"topic {record.name!r} is already in the store but not in memory: {e}") from e
        self._topics[record.name] = record

    async def _undo(self, refusal: BrokerRefusal, change: str, undo: Coroutine[Any, Any, None]) -> BrokerRefused:
        """Undo a recorded change a broker refused; the error to answer (it names the broker's cause).
        When the store cannot undo it either (its disk is full too), the change stands and the answer
        says how it completes: the broker is handed its partitions whenever it registers."""
        log.warning(
            "broker refused partitions; undoing the change",
            change=change,
            broker_id=refusal.broker_id,
            code=refusal.code.name,
            error=refusal.message,
        )
        try:
            with _coordinator_disk_full():
                await complete_even_if_cancelled(undo)
        except CoordinatorDiskFull as e:
            log.error("could not undo a change a broker refused", change=change, error=str(e))
            return BrokerRefused(
                refusal,
                f"{change}: broker {refusal.broker_id} refused its partitions ({refusal.message}) and the "
                f"coordinator could not undo the change ({e}): once space is freed, restart broker "
                f"{refusal.broker_id}; it creates its partitions when it registers",
                undone=False,
            )
        return BrokerRefused(refusal, f"could not {change}: {refusal.message}", undone=True)

    async def delete_topic(self, name: str) -> None:
        self.check_ready()
        _validated(validate_topic_name, name)
        async with self._admin_lock:
            record = self._topics.get(name)
            if record is None:
                raise TopicNotFound([name])
            await complete_even_if_cancelled(self._apply_delete(name))
            log.info("topic deleted", topic=name, partitions=record.partition_count)
            await self._delete_on_brokers(record)
        await self._notify(self._topic_deleted_listeners, name)

    async def _apply_delete(self, name: str) -> None:
        with _coordinator_disk_full():
            await self.store.delete_topic(name)
        del self._topics[name]

    async def add_partitions(self, name: str, total: int, *, principal: str | None = None) -> TopicRecord:
        """Grow the topic to `total` partitions (more than it has now), on behalf of `principal`;
        the new partitions count against the topic's creator."""
        self.check_ready()
        _validated(validate_topic_name, name)
        _validated(validate_partition_count, total)
        async with self._admin_lock:
            current = self._topics.get(name)
            if current is None:
                raise TopicNotFound([name])
            _validated(validate_partition_increase, current.partition_count, total)
            _validated(current.config.check_event_store, total)
            live = self.live_broker_ids()
            if not live:
                raise NoLiveBrokers()
            new = range(current.partition_count, total)
            added = placement_for(name, new, live)
            self._check_principal_limits(principal, current.creator, name, new_topics=0, new_partitions=len(added))
            self._check_partition_limits(name, added)
            record = TopicRecord(
                name=name,
                partition_count=total,
                placement={**current.placement, **added},
                config=current.config,
                created_ms=current.created_ms,
                creator=current.creator,
            )
            await complete_even_if_cancelled(self._apply_add(record, added))
            log.info(
                "partitions added",
                topic=name,
                old_count=current.partition_count,
                new_count=total,
                brokers=sorted(set(added.values())),
            )
            refusal = await self._create_on_brokers(record, new)
            if refusal is not None:
                error = await self._undo(refusal, f"add partitions to topic {name!r}", self._apply_remove(current))
                if error.undone:
                    await self._delete_on_brokers(record, new)
                raise error
        # Listeners run outside the lock (they may read metadata), so two growths can notify out of
        # order; passing the count current at notification time keeps what they see non-decreasing.
        latest = self._topics.get(name)
        if latest is not None:
            await self._notify(self._partitions_added_listeners, name, latest.partition_count)
        return record

    def _check_principal_limits(
        self, caller: str | None, owner: str | None, topic: str, *, new_topics: int, new_partitions: int
    ) -> None:
        """Refuse a change that would take `owner` (the creator the topic counts against) past its
        limits; nothing when the caller or the owner is exempt or unknown."""
        limits = self.principal_limits
        if not (limits.applies_to(caller) and limits.applies_to(owner)):
            return
        mine = [t for t in self._topics.values() if t.creator == owner]
        held = sum(t.partition_count for t in mine)
        if limits.max_topics and new_topics and len(mine) + new_topics > limits.max_topics:
            raise PrincipalLimitExceeded(
                f"principal {owner!r} has created {len(mine)} topics; the limit (max_topics_per_principal) "
                f"is {limits.max_topics}: cannot create {shorten(topic)}; delete unused topics"
            )
        if limits.max_partitions and held + new_partitions > limits.max_partitions:
            raise PrincipalLimitExceeded(
                f"principal {owner!r} holds {held} partitions in the topics it created; adding {new_partitions} "
                f"to {shorten(topic)} would exceed the limit (max_partitions_per_principal) of "
                f"{limits.max_partitions}: delete unused topics"
            )

    def _check_partition_limits(self, topic: str, added: Mapping[int, int]) -> None:
        """Refuse placing `added` (partition -> broker) when a broker or the cluster would hold too many."""
        total = sum(t.partition_count for t in self._topics.values())
        if total + len(added) > self.max_partitions_total:
            raise PartitionLimitExceeded(
                f"partitions: adding {len(added)} partitions to {shorten(topic)} would make "
                f"{total + len(added)} in the cluster; the limit (max_partitions_total) is "
                f"{self.max_partitions_total}: delete unused topics"
            )
        per_broker: dict[int, int] = {}
        for broker_id in added.values():
            per_broker[broker_id] = per_broker.get(broker_id, 0) + 1
        held_by: dict[int, int] = {}
        for t in self._topics.values():  # one pass over every placement, not one per broker
            for b in t.placement.values():
                if b in per_broker:
                    held_by[b] = held_by.get(b, 0) + 1
        for broker_id, count in sorted(per_broker.items()):
            held = held_by.get(broker_id, 0)
            if held + count > self.max_partitions_per_broker:
                raise PartitionLimitExceeded(
                    f"partitions: adding {len(added)} partitions to {shorten(topic)} would place "
                    f"{held + count} partitions on broker {broker_id}; the limit (max_partitions_per_broker) is "
                    f"{self.max_partitions_per_broker}: delete unused topics or add brokers"
                )

    async def _apply_add(self, record: TopicRecord, added: dict[int, int]) -> None:
        with _coordinator_disk_full():
            await self.store.add_partitions(record.name, record.partition_count, added)
        self._topics[record.name] = record

    async def _apply_remove(self, previous: TopicRecord) -> None:
        """Undo _apply_add: back to `previous` (store first, then memory)."""
        await self.store.remove_partitions(previous.name, previous.partition_count)
        self._topics[previous.name] = previous

    # -- broker calls ----------------------------------------------------------------------------

    async def _create_on_brokers(self, record: TopicRecord, partitions: Iterable[int]) -> BrokerRefusal | None:
        """Ask each broker to create its new partitions; the first refusal (by broker id), if any.
        A lost call is logged, not returned: the broker gets its partitions when it re-registers."""
        by_broker: dict[int, list[int]] = {}
        for p in partitions:
            by_broker.setdefault(record.placement[p], []).append(p)
        config = topic_config_to_proto(record.config)

        async def call(broker_id: int, parts: list[int]) -> BrokerRefusal | None:
            request = pb.CreatePartitionsRequest(
                topic=record.name, partitions=parts, config=config, topic_partition_count=record.partition_count
            )
            return await self._call_broker(broker_id, "CreatePartitions", request, topic=record.name, partitions=parts)

        refusals = await asyncio.gather(*(call(b, parts) for b, parts in sorted(by_broker.items())))
        return next((r for r in refusals if r is not None), None)

    async def _delete_on_brokers(self, record: TopicRecord, partitions: Iterable[int] | None = None) -> None:
        """Best effort (all of the topic's partitions, or `partitions`): a broker that misses the call
        keeps the files until an operator removes them."""
        wanted = set(record.placement) if partitions is None else set(partitions)

        async def call(broker_id: int) -> None:
            parts = [p for p in record.partitions_on(broker_id) if p in wanted]
            request = pb.DeletePartitionsRequest(topic=record.name, partitions=parts)
            refusal = await self._call_broker(
                broker_id, "DeletePartitions", request, topic=record.name, partitions=parts
            )
            if refusal is not None:
                log.warning("broker DeletePartitions refused; its files stay", broker_id=broker_id,
                            topic=record.name, partitions=parts, code=refusal.code.name, error=refusal.message)

        await asyncio.gather(*(call(b) for b in sorted({record.placement[p] for p in wanted})))

    async def _call_broker(self, broker_id: int, method: str, request: Any, **fields: Any) -> BrokerRefusal | None:
        """None when the broker did it or the call was lost (logged); its refusal otherwise."""
        address = self.broker_address(broker_id)
        if address is None:  # cannot happen: placement only uses registered brokers
            log.error("partition placed on an unknown broker", broker_id=broker_id, **fields)
            return None
        try:
            stub = self.broker_pool.stub(address)
            await getattr(stub, method)(request, timeout=self.broker_call_timeout_ms / 1000)
            return None
        except grpc.aio.AioRpcError as e:
            reason = error_details.reason_of(e.trailing_metadata())
            if e.code() in _LOST_CALL_CODES and reason is None:
                log.warning(
                    f"broker {method} failed; it gets its partitions when it re-registers",
                    broker_id=broker_id,
                    address=address,
                    code=e.code().name,
                    error=e.details(),
                    **fields,
                )
                return None
            return BrokerRefusal(broker_id, e.code(), e.details() or e.code().name, reason)
        except Exception:  # noqa: BLE001 - the topic is recorded either way; say what went wrong
            log.exception(f"broker {method} failed", broker_id=broker_id, address=address, **fields)
        return None


def _validated(check: Callable[..., None], *args: Any) -> None:
    try:
        check(*args)
    except ValidationError as e:
        raise InvalidArgument(str(e)) from e


def _validate_broker(broker_id: int, host: str, port: int) -> None:
    if not 0 <= broker_id <= BROKER_ID_MAX:
        raise InvalidArgument(f"broker_id: must be between 0 and {BROKER_ID_MAX}, got {broker_id}")
    if not host or len(host) > HOST_MAX_CHARS:
        raise InvalidArgument(f"host: must be 1 to {HOST_MAX_CHARS} characters, got {len(host)}")
    if any(c.isspace() or not c.isprintable() or c in "/@" for c in host):
        raise InvalidArgument(f"host: {host[:60]!r} is not a host name or IP address")
    if not 1 <= port <= 65535:
        raise InvalidArgument(f"port: must be between 1 and 65535, got {port}")


# -- proto conversions ----------------------------------------------------------------------------

_CONFIG_FIELDS = (*limits.TOPIC_CONFIG_RANGES, "kind")


def _settings_for(config: TopicSettings, defaults: TopicSettings | None) -> TopicSettings:
    """A new topic's recorded settings: the server's defaults fill the unset ones, except that an
    event store never takes a retention default (it keeps every event)."""
    if config.is_event_store:
        config = replace(config, retention_ms=-1, retention_bytes=-1)
    return config.with_defaults(defaults)


def topic_config_to_proto(settings: TopicSettings) -> pb.TopicConfig:
    return pb.TopicConfig(**settings.to_dict())


def topic_config_from_proto(config: pb.TopicConfig) -> TopicSettings:
    return TopicSettings(**{f: getattr(config, f) for f in _CONFIG_FIELDS if config.HasField(f)})


def topic_info(metadata: MetadataManager, record: TopicRecord) -> pb.TopicInfo:
    live = set(metadata.live_broker_ids())
    partitions = []
    for p in range(record.partition_count):
        leader = record.placement.get(p, -1)
        partitions.append(
            pb.PartitionInfo(
                partition=p,
                leader_id=leader,
                leader_address=metadata.broker_address(leader) or "",
                leader_alive=leader in live,
            )
        )
    return pb.TopicInfo(
        name=record.name,
        partition_count=record.partition_count,
        partitions=partitions,
        config=topic_config_to_proto(record.config),
        created_ms=record.created_ms,
    )


def broker_infos(metadata: MetadataManager) -> list[pb.BrokerInfo]:
    led: dict[int, int] = {}
    for t in metadata.topics():
        for b in t.placement.values():
            led[b] = led.get(b, 0) + 1
    return [
        pb.BrokerInfo(
            broker_id=b.broker_id,
            host=b.host,
            port=b.port,
            alive=metadata.is_broker_alive(b.broker_id),
            last_heartbeat_ms=metadata.last_heartbeat_ms(b.broker_id),
            partitions_led=led.get(b.broker_id, 0),
        )
        for b in metadata.brokers()
    ]


# -- gRPC -----------------------------------------------------------------------------------------


def _translate(servicer: MetadataServicer, e: Exception) -> RpcAbort | None:
    if isinstance(e, MetadataError):
        return RpcAbort(e.code, str(e), e.reason)
    return None


def _principal() -> str | None:
    """The calling principal; None with security off (every call is then anonymous)."""
    principal = current_principal.get()
    return None if principal == ANONYMOUS else principal


# MetadataError becomes its status, anything unexpected INTERNAL (logged) (dmq.proto.server_errors).
_handler = rpc_handler(log=log, translate=_translate)


class MetadataServicer(pb_grpc.MetadataServicer):
    def __init__(self, metadata: MetadataManager, acls: AclManager) -> None:
        self.metadata = metadata
        self.acls = acls

    @_handler
    async def RegisterBroker(
        self, request: pb.RegisterBrokerRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterBrokerResponse:
        partitions = await self.metadata.register_broker(
            request.broker_id, request.host, request.port, principal=current_principal.get()
        )
        return pb.RegisterBrokerResponse(
            partitions=partitions, heartbeat_interval_ms=self.metadata.heartbeat_interval_ms
        )

    @_handler
    async def BrokerHeartbeat(
        self, request: pb.BrokerHeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> pb.BrokerHeartbeatResponse:
        return pb.BrokerHeartbeatResponse(
            reregister=self.metadata.heartbeat(request.broker_id), acl_version=self.acls.view.version
        )

    @_handler
    async def AddAcls(self, request: pb.AddAclsRequest, context: grpc.aio.ServicerContext) -> pb.AclsChangeResponse:
        self.metadata.check_ready()
        with _coordinator_disk_full():
            return await self.acls.change(add=request.acls)

    @_handler
    async def RemoveAcls(self, request: pb.RemoveAclsRequest, context: grpc.aio.ServicerContext) -> pb.AclsChangeResponse:
        self.metadata.check_ready()
        with _coordinator_disk_full():
            return await self.acls.change(remove=request.acls)

    @_handler
    async def ListAcls(self, request: pb.ListAclsRequest, context: grpc.aio.ServicerContext) -> pb.ListAclsResponse:
        self.metadata.check_ready()
        return self.acls.listing(request.principal)

    @_handler
    async def ListBrokers(
        self, request: pb.ListBrokersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListBrokersResponse:
        self.metadata.check_ready()
        return pb.ListBrokersResponse(brokers=broker_infos(self.metadata))

    @_handler
    async def CreateTopic(self, request: pb.CreateTopicRequest, context: grpc.aio.ServicerContext) -> pb.TopicInfo:
        record = await self.metadata.create_topic(
            request.name, request.partitions, topic_config_from_proto(request.config), principal=_principal()
        )
        return topic_info(self.metadata, record)

    @_handler
    async def DeleteTopic(
        self, request: pb.DeleteTopicRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteTopicResponse:
        await self.metadata.delete_topic(request.name)
        return pb.DeleteTopicResponse()

    @_handler
    async def ListTopics(
        self, request: pb.ListTopicsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListTopicsResponse:
        self.metadata.check_ready()
        return pb.ListTopicsResponse(topics=[topic_info(self.metadata, t) for t in self.metadata.topics()])

    @_handler
    async def DescribeTopic(self, request: pb.DescribeTopicRequest, context: grpc.aio.ServicerContext) -> pb.TopicInfo:
        return topic_info(self.metadata, self._existing_topic(request.name))

    @_handler
    async def AddPartitions(self, request: pb.AddPartitionsRequest, context: grpc.aio.ServicerContext) -> pb.TopicInfo:
        record = await self.metadata.add_partitions(request.name, request.partitions, principal=_principal())
        return topic_info(self.metadata, record)

    @_handler
    async def GetMetadata(
        self, request: pb.GetMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetMetadataResponse:
        self.metadata.check_ready()
        if request.topics:
            names = list(dict.fromkeys(request.topics))  # dedupe, keep order
            for i, name in enumerate(request.topics):
                _validated(functools.partial(validate_topic_name, field=f"topics[{i}]"), name)
            found = [(n, self.metadata.topic(n)) for n in names]
            missing = [n for n, r in found if r is None]
            if missing:
                raise TopicNotFound(missing)
            records = [r for _, r in found if r is not None]
        else:
            records = self.metadata.topics()
        return pb.GetMetadataResponse(
            brokers=broker_infos(self.metadata),
            topics=[topic_info(self.metadata, r) for r in records],
        )

    def _existing_topic(self, name: str) -> TopicRecord:
        self.metadata.check_ready()
        _validated(validate_topic_name, name)
        record = self.metadata.topic(name)
        if record is None:
            raise TopicNotFound([name])
        return record


__all__ = [
    "BrokerRefused",
    "CoordinatorDiskFull",
    "InvalidArgument",
    "MetadataError",
    "MetadataManager",
    "MetadataServicer",
    "NoLiveBrokers",
    "NotReady",
    "TopicAlreadyExists",
    "TopicNotFound",
    "TopicRecord",
    "BrokerRecord",
    "broker_address",
    "placement_for",
    "topic_config_from_proto",
    "topic_config_to_proto",
    "topic_info",
]
