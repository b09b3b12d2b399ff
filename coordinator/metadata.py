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

Placement and replication (DESIGN.md "Replication"): this service is the controller. A topic's
replication_factor (default min(3, live brokers), or default_replication_factor) places each
partition on that many brokers (dmq.coordinator.controller.placement: leaders round-robin as before,
followers on the next brokers, spread over racks). Each partition's state (replicas, ISR, leader,
leader_epoch, partition_epoch) is recorded here and changes only through the controller's rules
(dmq.coordinator.controller.partition_states), each change written to SQLite, applied to memory and
pushed to the brokers (dmq.coordinator.controller.pushes):
  - a broker's session expires (the node's monitor, every liveness_check_interval_ms) or it
    heartbeats shutting_down=true (answered after the pushes): it leaves every ISR, and the
    partitions it led get a new leader from the live ISR (or none: offline, leader_id -1);
  - a broker registers: offline partitions whose in-sync replica it is get it back as leader;
  - AlterIsr from a partition's leader (checked: current epochs, leader in the set, replicas only);
  - the preferred leader (the first replica), alive and back in sync, takes the lead back (a
    periodic check, at most MAX_PREFERRED_MOVES_PER_CHECK partitions each time);
  - ReassignPartition: the new replicas are added as followers, and once the leader's AlterIsr shows
    them in sync the old ones are dropped and the first listed replica leads (a background task per
    partition, owned by this manager; a new order of replicas all in sync is finished at once).
State changes are serialized by their own lock, not the admin lock, so an election never waits for
a topic creation's broker calls. An unreplicated partition (one replica) keeps its broker as leader
while it is down (leader_alive=false) and its broker is sent no states, as before replication.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import grpc
import structlog

from dmq.coordinator.acls import AclManager
from dmq.coordinator.broker_pool import BrokerPool
from dmq.coordinator.controller import partition_states
from dmq.coordinator.controller.partition_states import StateRefusedError
from dmq.coordinator.controller.placement import place_partitions
from dmq.coordinator.controller.pushes import StatePusher, partition_state
from dmq.coordinator.controller.sessions import DEFAULT_BROKER_SESSION_TIMEOUT_MS, restart_after_pause, wall_clock_ms
from dmq.coordinator.controller.sessions import BrokerSession as _BrokerState
from dmq.coordinator.pause_watch import PauseWatch
from dmq.coordinator.metastore.base import (
    NO_LEADER,
    BrokerRecord,
    MetadataStore,
    PartitionRecord,
    StoreConflict,
    StoreError,
    StoreFullError,
    TopicExists,
    TopicRecord,
)
from dmq.proto.topic_settings import (
    TopicSettings,
    replication_defaults,
    validate_partition_count,
    validate_partition_increase,
    validate_topic_name,
)
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import error_details, limits
from dmq.proto.names import shorten
from dmq.proto.server.security.interceptor import ANONYMOUS, current_principal
from dmq.proto.server.domain_errors import DomainError, ErrorCode
from dmq.proto.server.server_errors import rpc_handler

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
# The preferred-leader check moves at most this many leaders at a time, so one check is a bounded
# amount of SQLite and push work; the next check continues.
MAX_PREFERRED_MOVES_PER_CHECK = 100
DEFAULT_PREFERRED_LEADER_CHECK_INTERVAL_MS = 5_000
# A reassignment waits this long for its new replicas to catch up before it gives up (they stay
# replicas; the operator may reassign again).
DEFAULT_REASSIGNMENT_TIMEOUT_MS = 600_000
RACK_MAX_CHARS = 64

PartitionsAddedListener = Callable[[str, int], Awaitable[None] | None]
TopicDeletedListener = Callable[[str], Awaitable[None] | None]


# -- errors ---------------------------------------------------------------------------------------


class MetadataError(DomainError):
    """A request the metadata service refuses; rpc_handler maps `code` to its gRPC status
    (dmq.proto.server.server_errors), `reason` (dmq.proto.error_details) goes as trailing metadata."""


class InvalidMetadataRequestError(MetadataError):
    code = ErrorCode.INVALID_ARGUMENT


class MetadataPreconditionError(MetadataError):
    code = ErrorCode.FAILED_PRECONDITION


class BrokerIdTakenError(MetadataError):
    # FAILED_PRECONDITION: another, live broker holds the id. A broker restarted at a new address
    # retries until the old registration's session expires (dmq.broker.node).
    code = ErrorCode.FAILED_PRECONDITION
    reason = error_details.BROKER_ID_TAKEN


class PartitionLimitExceededError(MetadataError):
    # RESOURCE_EXHAUSTED: the request is valid, the cluster is full (delete topics or add brokers).
    code = ErrorCode.RESOURCE_EXHAUSTED


class PrincipalLimitExceededError(MetadataError):
    # RESOURCE_EXHAUSTED: valid, but the principal holds as much as it may (delete its unused topics).
    code = ErrorCode.RESOURCE_EXHAUSTED


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


class CoordinatorDiskFullError(MetadataError):
    """The coordinator's SQLite could not write: its disk is full. Nothing changed; retriable."""

    code = ErrorCode.RESOURCE_EXHAUSTED
    reason = error_details.DISK_FULL


class MetadataStoreUnavailableError(MetadataError):
    """The metadata store did not confirm a write: a compare-and-swap lost to another coordinator
    (dmq.coordinator.metastore.base; nothing changed), or etcd unreachable or stalled (nothing
    changed, or, when the call timed out, the outcome is unknown until the store is read again). Retriable."""

    code = ErrorCode.UNAVAILABLE


@contextlib.contextmanager
def _coordinator_disk_full() -> Iterator[None]:
    """Around a store write: a full disk becomes CoordinatorDiskFullError (its message says where), any
    other store failure MetadataStoreUnavailableError."""
    try:
        yield
    except StoreFullError as e:
        raise CoordinatorDiskFullError(str(e)) from e
    except StoreConflict as e:
        raise MetadataStoreUnavailableError(f"the cluster metadata changed under this coordinator, nothing was written: {e}") from e
    except StoreError as e:
        raise MetadataStoreUnavailableError(f"the metadata store did not confirm the change: {e}: retry") from e


@dataclass(frozen=True, slots=True)
class BrokerRefusal:
    """A broker's answer refusing a partition change (case 2 in the module docstring)."""

    broker_id: int
    code: grpc.StatusCode
    message: str
    reason: str | None


class BrokerRefusedError(MetadataError):
    """A topic change undone because a broker refused it; carries the broker's status and reason."""

    def __init__(self, refusal: BrokerRefusal, message: str, *, undone: bool) -> None:
        super().__init__(message)
        self.code = ErrorCode(refusal.code.name)  # the broker's status, relayed
        self.reason = refusal.reason
        self.refusal = refusal
        self.undone = undone  # False: the store could not undo it either (the message says what to do)


# Broker answers after which it gets its partitions anyway, at its next (re-)registration.
_LOST_CALL_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


class PartitionNotFoundError(MetadataError):
    code = ErrorCode.NOT_FOUND


class UnknownTopicError(MetadataError):
    code = ErrorCode.NOT_FOUND

    def __init__(self, names: Iterable[str]) -> None:
        self.names = sorted(names)
        listed = ", ".join(repr(n) for n in self.names)
        noun = "topic" if len(self.names) == 1 else "topics"
        super().__init__(f"{noun} {listed} not found")


class TopicExistsError(MetadataError):
    code = ErrorCode.ALREADY_EXISTS

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"topic {name!r} already exists")


class NoLiveBrokersError(MetadataError):
    # UNAVAILABLE: retriable, since brokers may still be starting (e.g. just after `dmq server`).
    code = ErrorCode.UNAVAILABLE

    def __init__(self) -> None:
        super().__init__(NO_LIVE_BROKERS)


class NotEnoughBrokersError(MetadataError):
    code = ErrorCode.UNAVAILABLE


class CoordinatorStartingError(MetadataError):
    code = ErrorCode.UNAVAILABLE

    def __init__(self) -> None:
        super().__init__("coordinator is starting: retry")


# -- state ----------------------------------------------------------------------------------------


def broker_address(host: str, port: int) -> str:
    """ "host:port", with IPv6 literals bracketed as gRPC expects."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


StateChanges = dict[tuple[str, int], PartitionRecord]  # (topic, partition) -> its new state
_Transition = Callable[[PartitionRecord, int, list[int], TopicRecord], PartitionRecord]


def _failed(state: PartitionRecord, broker: int, live: list[int], record: TopicRecord) -> PartitionRecord:
    return partition_states.broker_failed(state, broker, live, unclean=bool(record.config.unclean_leader_election))


def _back(state: PartitionRecord, broker: int, live: list[int], record: TopicRecord) -> PartitionRecord:
    return partition_states.broker_back(state, broker, live)


def is_replicated(record: TopicRecord) -> bool:
    """Whether its brokers are sent partition states: some partition has several replicas or has
    moved (an unreplicated, never changed partition keeps the meaning of an empty `states`)."""
    return any(len(s.replicas) > 1 or s.partition_epoch > 0 for s in record.states.values())


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


class MetadataManager:
    def __init__(
        self,
        store: MetadataStore,
        broker_pool: BrokerPool,
        *,
        broker_session_timeout_ms: int = DEFAULT_BROKER_SESSION_TIMEOUT_MS,
        broker_call_timeout_ms: int = DEFAULT_BROKER_CALL_TIMEOUT_MS,
        default_topic_config: TopicSettings | None = None,
        principal_limits: PrincipalLimits | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        default_replication_factor: int | None = None,
        reassignment_timeout_ms: int = DEFAULT_REASSIGNMENT_TIMEOUT_MS,
        pause_watch: PauseWatch | None = None,
    ) -> None:
        if broker_session_timeout_ms <= 0:
            raise ValueError(f"broker_session_timeout_ms must be > 0, got {broker_session_timeout_ms}")
        if default_replication_factor is not None and not 1 <= default_replication_factor <= limits.REPLICATION_FACTOR_MAX:
            raise ValueError(
                f"default_replication_factor must be 1..{limits.REPLICATION_FACTOR_MAX} (or None: min(3, live "
                f"brokers)), got {default_replication_factor}"
            )
        if reassignment_timeout_ms <= 0:
            raise ValueError(f"reassignment_timeout_ms must be > 0, got {reassignment_timeout_ms}")
        if default_topic_config is not None:
            default_topic_config.validate(field_prefix="default_topic_config.")
        self.store = store
        self.broker_pool = broker_pool
        self.broker_session_timeout_ms = broker_session_timeout_ms
        self.broker_call_timeout_ms = broker_call_timeout_ms
        self.default_topic_config = default_topic_config
        self.clock_ms = clock_ms
        self.default_replication_factor = default_replication_factor
        self.reassignment_timeout_ms = reassignment_timeout_ms
        # Armed by the node's monitor; a pause shorter than half a session cannot expire a broker
        # that heartbeats four times per session.
        self.pause_watch = pause_watch or PauseWatch(max(1, broker_session_timeout_ms // 2))
        # Plain attributes: an operator (or a test) may change them on a running coordinator.
        self.max_partitions_per_broker = MAX_PARTITIONS_PER_BROKER
        self.max_partitions_total = MAX_PARTITIONS_TOTAL
        self.principal_limits = principal_limits or PrincipalLimits()
        self.ready = False
        # With several coordinators (dmq.coordinator.controller.leadership): acting only while the
        # lease is surely held; a standby's refusal names the active coordinator (node.py sets both).
        self.acting: Callable[[], bool] = lambda: True
        self.not_ready_error: Callable[[], MetadataError] = CoordinatorStartingError
        self._topics: dict[str, TopicRecord] = {}
        self._brokers: dict[int, _BrokerState] = {}
        self._admin_lock = asyncio.Lock()
        self._partitions_added_listeners: list[PartitionsAddedListener] = []
        self._topic_deleted_listeners: list[TopicDeletedListener] = []
        # Partition state changes (elections, AlterIsr, reassignments): decided and recorded one at a time.
        self._state_lock = asyncio.Lock()
        self._states_changed = asyncio.Event()  # set and replaced at every change (reassignments wait on it)
        self._unelected: set[int] = set()  # failed brokers whose elections could not be recorded yet
        self._reassignments: dict[tuple[str, int], asyncio.Task[None]] = {}
        self.pusher = StatePusher(broker_pool, self.broker_address, call_timeout_ms=broker_call_timeout_ms)

    def __repr__(self) -> str:
        return (
            f"<MetadataManager ready={self.ready} topics={len(self._topics)} brokers={len(self._brokers)} "
            f"live={len(self.live_broker_ids())}>"
        )

    async def load(self) -> None:
        """Load brokers and topics from the store (called once by the node's start())."""
        now = self.clock_ms()
        self._brokers = {b.broker_id: _BrokerState(b, last_heartbeat_ms=now, awaited=True)
                         for b in await self.store.load_brokers()}
        self._topics = {t.name: t for t in await self.store.load_topics()}
        self.ready = True
        log.info("metadata loaded", topics=len(self._topics), brokers=len(self._brokers))

    def check_ready(self) -> None:
        if not self.ready or not self.acting():
            raise self.not_ready_error()

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
        return state is not None and self._alive(state, self._now())

    def live_broker_ids(self) -> list[int]:
        """The brokers that may lead and hold new replicas: alive and not shutting down."""
        now = self._now()
        return sorted(i for i, s in self._brokers.items() if self._alive(s, now) and not s.shutting_down)

    def racks(self) -> dict[int, str]:
        return {i: s.record.rack for i, s in self._brokers.items() if s.record.rack}

    def last_heartbeat_ms(self, broker_id: int) -> int:
        state = self._brokers.get(broker_id)
        return state.last_heartbeat_ms if state else -1

    def partitions_led(self, broker_id: int) -> int:
        return sum(1 for t in self._topics.values() for b in t.placement.values() if b == broker_id)

    def partition_state(self, topic: str, partition: int) -> PartitionRecord | None:
        record = self._topics.get(topic)
        return record.states.get(partition) if record else None

    def _alive(self, state: _BrokerState, now_ms: int) -> bool:
        return state.registered and now_ms - state.last_heartbeat_ms <= self.broker_session_timeout_ms

    def _now(self) -> int:
        """The session clock, after forgiving a pause of this process (dmq.coordinator.pause_watch):
        a broker whose session was running when the coordinator stopped gets a new one from now."""
        now = self.clock_ms()
        paused_ms = self.pause_watch.observe()
        if paused_ms:
            restart_after_pause(self._brokers, paused_ms, now, self.broker_session_timeout_ms)
        return now

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
        self, broker_id: int, host: str, port: int, *, principal: str | None = None, rack: str = ""
    ) -> list[pb.CreatePartitionsRequest]:
        """Record the broker, mark it alive, and return every partition it holds a replica of
        (with their states when replicated). Offline partitions it is in sync for get it as leader.

        Refused (BrokerIdTakenError) when the id is bound to another principal, or when the id's
        broker is live at another address: a registration never moves a live broker's partitions
        away from it (a stray or hostile RegisterBroker re-pointed broker 0 and producers then
        timed out). Security off, every caller is the same anonymous principal and the liveness
        rule alone protects the id."""
        self.check_ready()
        _validate_broker(broker_id, host, port)
        if len(rack) > RACK_MAX_CHARS or any(c.isspace() or not c.isprintable() for c in rack):
            raise InvalidMetadataRequestError(f"rack: must be up to {RACK_MAX_CHARS} printable characters without spaces, got {rack[:80]!r}")
        now = self._now()
        previous = self._brokers.get(broker_id)
        if previous is not None:
            if previous.principal is not None and principal is not None and previous.principal != principal:
                raise BrokerIdTakenError(
                    f"broker id {broker_id} is bound to principal {previous.principal!r}; {principal!r} may not "
                    "register it (give this broker its own id)"
                )
            moved = (previous.record.host, previous.record.port) != (host, port)
            if moved and self._alive(previous, now):
                raise BrokerIdTakenError(
                    f"broker id {broker_id} is live at {broker_address(previous.record.host, previous.record.port)}; "
                    f"a registration moving it to {broker_address(host, port)} is refused until that broker's "
                    f"session ({self.broker_session_timeout_ms} ms) expires: two brokers with one id?"
                )
        record = BrokerRecord(broker_id=broker_id, host=host, port=port, registered_ms=now, rack=rack)
        await complete_even_if_cancelled(self._apply_registration(record, now))
        self._brokers[broker_id].principal = principal
        self.pusher.on_registered(broker_id)
        # Not pushed to the broker itself: its registration answer carries the states (a push could
        # overtake the answer and name partitions it has not created yet).
        await self._change_states(lambda live: self._transitions_for(broker_id, live, transition=_back),
                                  skip=[broker_id])
        return self.partition_requests_for(broker_id)

    async def _apply_registration(self, record: BrokerRecord, now_ms: int) -> None:
        previous = self._brokers.get(record.broker_id)
        if previous is None or (previous.record.host, previous.record.port, previous.record.rack) != (
            record.host, record.port, record.rack
        ):
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
            # keep the first registration time of this address
            state.record = replace(previous.record, rack=record.rack)
        self._brokers[record.broker_id] = state
        log.info(
            "broker registered",
            broker_id=record.broker_id,
            address=broker_address(record.host, record.port),
            partitions=self.partitions_led(record.broker_id),
        )

    def partition_requests_for(self, broker_id: int) -> list[pb.CreatePartitionsRequest]:
        """One CreatePartitionsRequest per topic with replicas on the broker."""
        requests = []
        for topic in self.topics():
            partitions = topic.replicas_on(broker_id)
            if partitions:
                requests.append(self._create_request(topic, partitions))
        return requests

    def _create_request(self, record: TopicRecord, partitions: list[int]) -> pb.CreatePartitionsRequest:
        """CreatePartitions for these partitions of the topic, with their states when it is replicated
        (is_replicated: otherwise an empty `states` keeps the unreplicated meaning)."""
        states = (
            [partition_state(record.name, p, record.states[p], self.broker_address) for p in partitions]
            if is_replicated(record)
            else []
        )
        return pb.CreatePartitionsRequest(
            topic=record.name,
            partitions=partitions,
            config=topic_config_to_proto(record.config),
            topic_partition_count=record.partition_count,
            states=states,
        )

    def heartbeat(self, broker_id: int) -> bool:
        """Refresh the broker's session; True when it must re-register (unknown or expired).
        States it missed are sent again now (StatePusher.on_heartbeat)."""
        self.check_ready()
        state = self._brokers.get(broker_id)
        now = self._now()
        if state is None or not self._alive(state, now):
            if state is not None and state.registered:
                state.registered = False
                log.warning("heartbeat after the broker's session expired", broker_id=broker_id)
            return True
        state.last_heartbeat_ms = now
        self.pusher.on_heartbeat(broker_id)
        return False

    async def broker_shutting_down(self, broker_id: int) -> bool:
        """A clean shutdown: move leadership off the broker and take it out of every ISR now, push the
        new states (to it too, so it stops leading) and return once they are answered. True when it
        must re-register (as heartbeat())."""
        if self.heartbeat(broker_id):
            return True
        state = self._brokers[broker_id]
        if not state.shutting_down:
            state.shutting_down = True
            log.info("broker shutting down: moving its leadership", broker_id=broker_id,
                     partitions=self.partitions_led(broker_id))
        changes, pushed = await self._change_states(
            lambda live: self._transitions_for(broker_id, live, transition=_failed), also=[broker_id]
        )
        await pushed
        log.info("broker shutting down: leadership moved", broker_id=broker_id, changed=len(changes))
        return False

    async def check_brokers(self) -> list[int]:
        """The monitor's tick: end the sessions that timed out and elect new leaders for what they
        led (retrying elections a full disk kept from being recorded); the ids expired now."""
        expired = self.expire_brokers()
        self._unelected.update(expired)
        for broker_id in sorted(self._unelected):
            await self._change_states(functools.partial(self._transitions_for, broker_id, transition=_failed))
            self._unelected.discard(broker_id)
        return expired

    def _transitions_for(self, broker_id: int, live: list[int], *, transition: _Transition) -> StateChanges:
        """Every partition with a replica on the broker, moved by transition(state, broker, live, topic)."""
        changes: StateChanges = {}
        for record in self._topics.values():
            for p, state in record.states.items():
                if broker_id not in state.replicas:
                    continue
                after = transition(state, broker_id, live, record)
                if after is not state:
                    changes[(record.name, p)] = after
        return changes

    async def rebalance_preferred_leaders(self, max_moves: int = MAX_PREFERRED_MOVES_PER_CHECK) -> int:
        """Give leadership back to each partition's first replica where it is alive, in sync and not
        leading; at most max_moves partitions. How many moved."""

        def moves(live: list[int]) -> StateChanges:
            changes: StateChanges = {}
            for record in self._topics.values():
                for p, state in record.states.items():
                    after = partition_states.preferred_leader(state, live)
                    if after is not state:
                        changes[(record.name, p)] = after
                        if len(changes) >= max_moves:
                            return changes
            return changes

        changes, _pushed = await self._change_states(moves)
        if changes:
            log.info("preferred leaders restored", partitions=len(changes))
        return len(changes)

    async def alter_isr(
        self, broker_id: int, topic: str, partition: int, leader_epoch: int, partition_epoch: int, isr: list[int]
    ) -> tuple[str, int, PartitionRecord]:
        """The leader's request to change the in-sync set (partition_states.alter_isr): the state after
        it. A refused request raises, and the broker is sent the current state again."""
        self.check_ready()
        validate_topic_name(topic, field="topic")
        where = f"{shorten(topic)} partition {partition}"
        error: StateRefusedError | None = None

        def accept(state: PartitionRecord, live: list[int]) -> PartitionRecord:
            nonlocal error
            try:
                return partition_states.alter_isr(
                    state, broker_id=broker_id, leader_epoch=leader_epoch, partition_epoch=partition_epoch,
                    isr=isr, live=live, where=where,
                )
            except StateRefusedError as e:
                error = e
                return state

        await self._change_states(self._partition_change(topic, partition, accept))
        state = self._existing_state(topic, partition)
        if error is not None:
            if error.code == ErrorCode.FAILED_PRECONDITION and broker_id in state.replicas:
                # It acts on an old state (a push it missed): it gets the current one.
                self.pusher.push({(topic, partition): state}, [broker_id])
            raise _refusal(error)
        return topic, partition, state

    def _partition_change(
        self, topic: str, partition: int, transition: Callable[[PartitionRecord, list[int]], PartitionRecord]
    ) -> Callable[[list[int]], StateChanges]:
        """For _change_states: one partition moved by transition(current state, live)."""

        def compute(live: list[int]) -> StateChanges:
            state = self._existing_state(topic, partition)
            after = transition(state, live)
            return {} if after is state else {(topic, partition): after}

        return compute

    def _existing_state(self, topic: str, partition: int) -> PartitionRecord:
        record = self._topics.get(topic)
        if record is None:
            raise UnknownTopicError([topic])
        state = record.states.get(partition)
        if state is None:
            raise PartitionNotFoundError(f"partition: topic {shorten(topic)} has {record.partition_count} partitions, got {partition}")
        return state

    async def reassign_partition(self, topic: str, partition: int, replicas: list[int]) -> PartitionRecord:
        """Start moving the partition to `replicas`: the new ones are created as followers now; a
        background task drops the old ones once the new ones are in sync. The state now."""
        self.check_ready()
        validate_topic_name(topic, field="topic")
        key = (topic, partition)
        async with self._admin_lock:  # against a topic deletion while the new replicas are created
            self._existing_state(topic, partition)
            running = self._reassignments.get(key)
            if running is not None and not running.done():
                raise MetadataPreconditionError(
                    f"{shorten(topic)} partition {partition} is being reassigned already; wait until it completes"
                )
            try:
                partition_states.check_reassignment(replicas, self.live_broker_ids())
            except StateRefusedError as e:
                raise _refusal(e) from e
            before = self._existing_state(topic, partition)

            def start(st: PartitionRecord, live: list[int]) -> PartitionRecord:
                after = partition_states.reassignment_started(st, replicas)
                # Only a new order (no replica added or leaving), all in sync: finished at once, so
                # the answer already names the elected leader; the task below then finds nothing to do.
                if after.replicas == tuple(replicas) and partition_states.reassignment_ready(after, replicas):
                    return partition_states.reassignment_finished(after, replicas, live)
                return after

            await self._change_states(self._partition_change(topic, partition, start))
            state = self._existing_state(topic, partition)
            added = [b for b in state.replicas if b not in before.replicas]
            if added:
                record = self._topics[topic]
                refusals = await asyncio.gather(
                    *(self._call_broker(b, "CreatePartitions", self._create_request(record, [partition]),
                                        topic=topic, partitions=[partition]) for b in added)
                )
                for refusal in refusals:
                    if refusal is not None:
                        log.warning("a new replica's broker refused it; the reassignment waits for it",
                                    topic=topic, partition=partition, broker_id=refusal.broker_id, error=refusal.message)
            log.info("reassignment started", topic=topic, partition=partition, target=replicas,
                     replicas=list(state.replicas), added=added)
            task = asyncio.ensure_future(self._complete_reassignment(topic, partition, list(replicas)))
            task.set_name(f"reassign-{topic}-{partition}")
            self._reassignments[key] = task
            task.add_done_callback(functools.partial(self._reassignment_done, key))
        return state

    def _reassignment_done(self, key: tuple[str, int], task: asyncio.Task[None]) -> None:
        if self._reassignments.get(key) is task:
            del self._reassignments[key]

    async def _complete_reassignment(self, topic: str, partition: int, target: list[int]) -> None:
        """Wait (bounded) until every target replica is in sync, then drop the others."""
        deadline = time.monotonic() + self.reassignment_timeout_ms / 1000
        try:
            while True:
                state = self.partition_state(topic, partition)
                if state is None or not set(target) <= set(state.replicas):
                    log.warning("reassignment abandoned: the partition changed", topic=topic, partition=partition)
                    return
                if partition_states.reassignment_ready(state, target):
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    log.error("reassignment timed out: the new replicas did not catch up; they stay replicas",
                              topic=topic, partition=partition, target=target, isr=list(state.isr))
                    return
                changed = self._states_changed
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(left, 1.0))
            before = state
            _changes, pushed = await self._change_states(
                self._partition_change(
                    topic, partition, lambda st, live: partition_states.reassignment_finished(st, target, live)
                )
            )
            removed = [b for b in before.replicas if b not in target]
            await pushed
            record = self._topics.get(topic)
            if record is not None and removed:
                request = pb.DeletePartitionsRequest(topic=topic, partitions=[partition])
                await asyncio.gather(*(self._call_broker(b, "DeletePartitions", request, topic=topic, partitions=[partition])
                                       for b in removed))
            log.info("reassignment completed", topic=topic, partition=partition, replicas=target, removed=removed)
        except MetadataError as e:
            log.error("reassignment failed", topic=topic, partition=partition, error=str(e))

    async def close(self) -> None:
        """Stop the background work (reassignments, pushes); bounded."""
        tasks = list(self._reassignments.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        await self.pusher.close()

    # -- partition states --------------------------------------------------------------------------

    async def _change_states(
        self, compute: Callable[[list[int]], StateChanges], *, also: Iterable[int] = (), skip: Iterable[int] = ()
    ) -> tuple[StateChanges, asyncio.Future[None]]:
        """Decide (compute(live) from the current states), record (SQLite, then memory) and push a
        change of partition states, one change at a time. The changes, and the push, which runs in
        the background (awaited by callers that answer after it); `also`: brokers pushed to even
        when they are not live (one shutting down); `skip`: brokers not pushed to."""
        async with self._state_lock:
            live = self.live_broker_ids()
            changes = compute(live)
            if changes:
                await complete_even_if_cancelled(self._apply_states(changes))
        if not changes:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return changes, done
        extra = list(also)
        targets = set(live) | set(extra)
        return changes, self.pusher.push(changes, targets - set(skip), also=extra)

    async def _apply_states(self, changes: Mapping[tuple[str, int], PartitionRecord]) -> None:
        with _coordinator_disk_full():
            await self.store.update_partitions(changes)
        by_topic: dict[str, dict[int, PartitionRecord]] = {}
        for (topic, p), state in changes.items():
            by_topic.setdefault(topic, {})[p] = state
        for topic, states in by_topic.items():
            record = self._topics.get(topic)
            if record is not None:  # deleted meanwhile: nothing to change
                self._topics[topic] = record.with_states(states)
        for (topic, p), state in sorted(changes.items()):
            log.info("partition state changed", topic=topic, partition=p, leader=state.leader,
                     leader_epoch=state.leader_epoch, isr=list(state.isr), replicas=list(state.replicas),
                     partition_epoch=state.partition_epoch)
        self._states_changed.set()
        self._states_changed = asyncio.Event()

    def expire_brokers(self) -> list[int]:
        """End the sessions that timed out, and those of brokers that did not re-register within a
        session of this coordinator's start; the ids. Called periodically by the node's monitor."""
        now = self._now()
        expired = []
        for broker_id, state in sorted(self._brokers.items()):
            if (state.registered or state.awaited) and now - state.last_heartbeat_ms > self.broker_session_timeout_ms:
                why = "broker session expired" if state.registered else "broker did not re-register after the coordinator started"
                state.registered = state.awaited = False
                expired.append(broker_id)
                log.warning(
                    why,
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
        validate_topic_name(name)
        validate_partition_count(partitions)
        config.validate()
        config.check_event_store(partitions)
        async with self._admin_lock:
            if name in self._topics:
                raise TopicExistsError(name)
            live = self.live_broker_ids()
            if not live:
                raise NoLiveBrokersError()
            settings = _settings_for(config, self.default_topic_config)
            defaulted = settings.replication_factor is None
            settings = replication_defaults(settings, len(live), self.default_replication_factor)
            settings.validate()  # a given min_insync_replicas above a defaulted factor
            if defaulted and _factor(settings) > len(live):
                # The operator's default asks for more brokers than are up (a cluster still starting):
                # retriable, unlike a factor the request named.
                raise NotEnoughBrokersError(
                    f"new topics get {_factor(settings)} replicas (default_replication_factor) and {len(live)} "
                    "brokers are live: retry once the brokers have started, or name a replication_factor"
                )
            settings.check_replication(len(live))
            states = place_partitions(name, range(partitions), _factor(settings), live, self.racks())
            self._check_principal_limits(principal, principal, name, new_topics=1, new_partitions=partitions)
            self._check_partition_limits(name, states)
            record = TopicRecord(
                name=name,
                partition_count=partitions,
                placement={},
                states=states,
                config=settings,
                created_ms=self.clock_ms(),
                creator=principal,
            )
            await complete_even_if_cancelled(self._apply_create(record))
            log.info(
                "topic created",
                topic=name,
                partitions=partitions,
                brokers=sorted({b for s in record.states.values() for b in s.replicas}),
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
        except TopicExists as e:  # only if memory and the store disagree; say which
            raise MetadataError(f"topic {record.name!r} is already in the store but not in memory: {e}") from e
        self._topics[record.name] = record

    async def _undo(self, refusal: BrokerRefusal, change: str, undo: Coroutine[Any, Any, None]) -> BrokerRefusedError:
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
        except CoordinatorDiskFullError as e:
            log.error("could not undo a change a broker refused", change=change, error=str(e))
            return BrokerRefusedError(
                refusal,
                f"{change}: broker {refusal.broker_id} refused its partitions ({refusal.message}) and the "
                f"coordinator could not undo the change ({e}): once space is freed, restart broker "
                f"{refusal.broker_id}; it creates its partitions when it registers",
                undone=False,
            )
        return BrokerRefusedError(refusal, f"could not {change}: {refusal.message}", undone=True)

    async def delete_topic(self, name: str) -> None:
        self.check_ready()
        validate_topic_name(name)
        async with self._admin_lock:
            record = self._topics.get(name)
            if record is None:
                raise UnknownTopicError([name])
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
        validate_topic_name(name)
        validate_partition_count(total)
        async with self._admin_lock:
            current = self._topics.get(name)
            if current is None:
                raise UnknownTopicError([name])
            validate_partition_increase(current.partition_count, total)
            current.config.check_event_store(total)
            live = self.live_broker_ids()
            if not live:
                raise NoLiveBrokersError()
            factor = _factor(current.config)
            if factor > len(live):
                raise MetadataPreconditionError(
                    f"topic {name!r} has replication_factor {factor}; there are {len(live)} live brokers: "
                    "start brokers, then add partitions"
                )
            new = range(current.partition_count, total)
            added = place_partitions(name, new, factor, live, self.racks())
            self._check_principal_limits(principal, current.creator, name, new_topics=0, new_partitions=len(added))
            self._check_partition_limits(name, added)
            record = await complete_even_if_cancelled(self._apply_add(name, total, added))
            log.info(
                "partitions added",
                topic=name,
                old_count=current.partition_count,
                new_count=total,
                brokers=sorted({b for s in added.values() for b in s.replicas}),
            )
            refusal = await self._create_on_brokers(record, new)
            if refusal is not None:
                error = await self._undo(
                    refusal, f"add partitions to topic {name!r}", self._apply_remove(name, current.partition_count)
                )
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
            raise PrincipalLimitExceededError(
                f"principal {owner!r} has created {len(mine)} topics; the limit (max_topics_per_principal) "
                f"is {limits.max_topics}: cannot create {shorten(topic)}; delete unused topics"
            )
        if limits.max_partitions and held + new_partitions > limits.max_partitions:
            raise PrincipalLimitExceededError(
                f"principal {owner!r} holds {held} partitions in the topics it created; adding {new_partitions} "
                f"to {shorten(topic)} would exceed the limit (max_partitions_per_principal) of "
                f"{limits.max_partitions}: delete unused topics"
            )

    def _check_partition_limits(self, topic: str, added: Mapping[int, PartitionRecord]) -> None:
        """Refuse placing `added` (partition -> state) when a broker (counting every replica it holds)
        or the cluster would hold too many."""
        total = sum(t.partition_count for t in self._topics.values())
        if total + len(added) > self.max_partitions_total:
            raise PartitionLimitExceededError(
                f"partitions: adding {len(added)} partitions to {shorten(topic)} would make "
                f"{total + len(added)} in the cluster; the limit (max_partitions_total) is "
                f"{self.max_partitions_total}: delete unused topics"
            )
        per_broker: dict[int, int] = {}
        for state in added.values():
            for broker_id in state.replicas:
                per_broker[broker_id] = per_broker.get(broker_id, 0) + 1
        held_by: dict[int, int] = {}
        for t in self._topics.values():  # one pass over every placement, not one per broker
            for st in t.states.values():
                for b in st.replicas:
                    if b in per_broker:
                        held_by[b] = held_by.get(b, 0) + 1
        for broker_id, count in sorted(per_broker.items()):
            held = held_by.get(broker_id, 0)
            if held + count > self.max_partitions_per_broker:
                raise PartitionLimitExceededError(
                    f"partitions: adding {len(added)} partitions to {shorten(topic)} would place "
                    f"{held + count} partitions on broker {broker_id}; the limit (max_partitions_per_broker) is "
                    f"{self.max_partitions_per_broker}: delete unused topics or add brokers"
                )

    async def _apply_add(self, name: str, total: int, added: dict[int, PartitionRecord]) -> TopicRecord:
        """The topic grown to `total` partitions (on the states current then: an election may have
        changed some while the admin lock was held)."""
        with _coordinator_disk_full():
            await self.store.add_partitions(name, total, added)
        current = self._topics[name]
        record = TopicRecord(
            name, total, {}, current.config, current.created_ms, current.creator, {**current.states, **added}
        )
        self._topics[name] = record
        return record

    async def _apply_remove(self, name: str, count: int) -> None:
        """Undo _apply_add: back to `count` partitions (store first, then memory)."""
        await self.store.remove_partitions(name, count)
        current = self._topics[name]
        states = {p: st for p, st in current.states.items() if p < count}
        self._topics[name] = TopicRecord(name, count, {}, current.config, current.created_ms, current.creator, states)

    # -- broker calls ----------------------------------------------------------------------------

    async def _create_on_brokers(self, record: TopicRecord, partitions: Iterable[int]) -> BrokerRefusal | None:
        """Ask each broker to create its new partitions; the first refusal (by broker id), if any.
        A lost call is logged, not returned: the broker gets its partitions when it re-registers."""
        by_broker: dict[int, list[int]] = {}
        for p in partitions:
            for broker_id in record.states[p].replicas:
                by_broker.setdefault(broker_id, []).append(p)

        async def call(broker_id: int, parts: list[int]) -> BrokerRefusal | None:
            request = self._create_request(record, parts)
            return await self._call_broker(broker_id, "CreatePartitions", request, topic=record.name, partitions=parts)

        refusals = await asyncio.gather(*(call(b, parts) for b, parts in sorted(by_broker.items())))
        return next((r for r in refusals if r is not None), None)

    async def _delete_on_brokers(self, record: TopicRecord, partitions: Iterable[int] | None = None) -> None:
        """Best effort (all of the topic's partitions, or `partitions`): a broker that misses the call
        keeps the files until an operator removes them."""
        wanted = set(record.states) if partitions is None else set(partitions)

        async def call(broker_id: int) -> None:
            parts = [p for p in record.replicas_on(broker_id) if p in wanted]
            request = pb.DeletePartitionsRequest(topic=record.name, partitions=parts)
            refusal = await self._call_broker(
                broker_id, "DeletePartitions", request, topic=record.name, partitions=parts
            )
            if refusal is not None:
                log.warning("broker DeletePartitions refused; its files stay", broker_id=broker_id,
                            topic=record.name, partitions=parts, code=refusal.code.name, error=refusal.message)

        await asyncio.gather(*(call(b) for b in sorted({b for p in wanted for b in record.states[p].replicas})))

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


def _refusal(e: StateRefusedError) -> MetadataError:
    return MetadataError(str(e), code=e.code)


def _factor(settings: TopicSettings) -> int:
    """A topic's replication factor (a topic recorded before replication has 1)."""
    return settings.replication_factor or 1


def _validate_broker(broker_id: int, host: str, port: int) -> None:
    if not 0 <= broker_id <= BROKER_ID_MAX:
        raise InvalidMetadataRequestError(f"broker_id: must be between 0 and {BROKER_ID_MAX}, got {broker_id}")
    if not host or len(host) > HOST_MAX_CHARS:
        raise InvalidMetadataRequestError(f"host: must be 1 to {HOST_MAX_CHARS} characters, got {len(host)}")
    if any(c.isspace() or not c.isprintable() or c in "/@" for c in host):
        raise InvalidMetadataRequestError(f"host: {host[:60]!r} is not a host name or IP address")
    if not 1 <= port <= 65535:
        raise InvalidMetadataRequestError(f"port: must be between 1 and 65535, got {port}")


# -- proto conversions ----------------------------------------------------------------------------

_CONFIG_FIELDS = (*limits.TOPIC_CONFIG_RANGES, "kind", "unclean_leader_election")


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
        state = record.states.get(p)
        leader = state.leader if state else NO_LEADER
        partitions.append(
            pb.PartitionInfo(
                partition=p,
                leader_id=leader,
                leader_address=(metadata.broker_address(leader) or "") if leader != NO_LEADER else "",
                leader_alive=leader in live,
                replicas=state.replicas if state else (),
                isr=state.isr if state else (),
                leader_epoch=state.leader_epoch if state else 0,
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
    followed: dict[int, int] = {}
    under: dict[int, int] = {}
    for t in metadata.topics():
        for state in t.states.values():
            led[state.leader] = led.get(state.leader, 0) + 1
            if state.under_replicated:
                under[state.leader] = under.get(state.leader, 0) + 1
            for b in state.replicas:
                if b != state.leader:
                    followed[b] = followed.get(b, 0) + 1
    return [
        pb.BrokerInfo(
            broker_id=b.broker_id,
            host=b.host,
            port=b.port,
            alive=metadata.is_broker_alive(b.broker_id),
            last_heartbeat_ms=metadata.last_heartbeat_ms(b.broker_id),
            partitions_led=led.get(b.broker_id, 0),
            rack=b.rack,
            partitions_followed=followed.get(b.broker_id, 0),
            partitions_under_replicated=under.get(b.broker_id, 0),
        )
        for b in metadata.brokers()
    ]


# -- gRPC -----------------------------------------------------------------------------------------


def _principal() -> str | None:
    """The calling principal; None with security off (every call is then anonymous)."""
    principal = current_principal.get()
    return None if principal == ANONYMOUS else principal


# MetadataError (a DomainError) becomes its status, anything unexpected INTERNAL (logged)
# (dmq.proto.server.server_errors).
_handler = rpc_handler(log=log)


class MetadataServicer(pb_grpc.MetadataServicer):
    def __init__(self, metadata: MetadataManager, acls: AclManager) -> None:
        self.metadata = metadata
        self.acls = acls

    @_handler
    async def RegisterBroker(
        self, request: pb.RegisterBrokerRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterBrokerResponse:
        partitions = await self.metadata.register_broker(
            request.broker_id, request.host, request.port, principal=current_principal.get(), rack=request.rack
        )
        return pb.RegisterBrokerResponse(
            partitions=partitions, heartbeat_interval_ms=self.metadata.heartbeat_interval_ms,
            controller_epoch=self.metadata.pusher.controller_epoch,
        )

    @_handler
    async def BrokerHeartbeat(
        self, request: pb.BrokerHeartbeatRequest, context: grpc.aio.ServicerContext
    ) -> pb.BrokerHeartbeatResponse:
        if request.shutting_down:
            reregister = await self.metadata.broker_shutting_down(request.broker_id)
        else:
            reregister = self.metadata.heartbeat(request.broker_id)
        return pb.BrokerHeartbeatResponse(reregister=reregister, acl_version=self.acls.view.version,
                                          controller_epoch=self.metadata.pusher.controller_epoch)

    @_handler
    async def AlterIsr(self, request: pb.AlterIsrRequest, context: grpc.aio.ServicerContext) -> pb.AlterIsrResponse:
        topic, partition, state = await self.metadata.alter_isr(
            request.broker_id, request.topic, request.partition, request.leader_epoch, request.partition_epoch,
            list(request.isr),
        )
        return pb.AlterIsrResponse(state=partition_state(topic, partition, state, self.metadata.broker_address))

    @_handler
    async def ReassignPartition(
        self, request: pb.ReassignPartitionRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReassignPartitionResponse:
        state = await self.metadata.reassign_partition(request.topic, request.partition, list(request.replicas))
        return pb.ReassignPartitionResponse(
            state=partition_state(request.topic, request.partition, state, self.metadata.broker_address)
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
                validate_topic_name(name, field=f"topics[{i}]")
            found = [(n, self.metadata.topic(n)) for n in names]
            missing = [n for n, r in found if r is None]
            if missing:
                raise UnknownTopicError(missing)
            records = [r for _, r in found if r is not None]
        else:
            records = self.metadata.topics()
        return pb.GetMetadataResponse(
            brokers=broker_infos(self.metadata),
            topics=[topic_info(self.metadata, r) for r in records],
        )

    def _existing_topic(self, name: str) -> TopicRecord:
        self.metadata.check_ready()
        validate_topic_name(name)
        record = self.metadata.topic(name)
        if record is None:
            raise UnknownTopicError([name])
        return record


__all__ = [
    "BrokerRefusedError",
    "CoordinatorDiskFullError",
    "InvalidMetadataRequestError",
    "MetadataError",
    "MetadataManager",
    "MetadataServicer",
    "NoLiveBrokersError",
    "CoordinatorStartingError",
    "PartitionNotFoundError",
    "TopicExistsError",
    "UnknownTopicError",
    "TopicRecord",
    "BrokerRecord",
    "broker_address",
    "is_replicated",
    "topic_config_from_proto",
    "topic_config_to_proto",
    "topic_info",
]
