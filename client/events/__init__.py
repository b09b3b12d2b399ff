"""EventStore: the client of an event-store topic (DESIGN.md "Event-store mode", DCB semantics).

    with EventStore("127.0.0.1:9091", "courses") as store:
        CourseCreated = EventType("course.created", ["course_name"])
        facts = Query([QueryItem(tags=["course_name:Algebra"])])
        result = store.read(facts)
        ...decide on result.events...
        store.append([CourseCreated.new(b"{}", course_name="Algebra")],
                     AppendCondition(facts, after=result.head))

The names are the DCB specification's (`Event(type, data, tags)`, `Query`, `QueryItem`,
`AppendCondition(fail_if_events_match, after)`); DMQ's earlier ones stay accepted (_model.py).

- `append(events, condition=None)` stores the events atomically and returns the last position; a
  failed condition raises `AppendConditionError` (its ``position`` is the first conflicting event)
  and stores nothing. Appends are never retried by the library (a retry could store twice). They
  travel as messages on one open EventAppendStream per store (_stream.py: gRPC's per-call cost
  paid once), an append from another thread meanwhile as a call of its own.
- `read(query=None, after=None, limit=None)` -> `ReadResult(events, head)`; it pages through the
  broker's answers until `limit` events or the head. `subscribe(query, after)` iterates matching
  events as they are appended (close() it, or use it as a context manager).
- Consumer groups over attribute partitions: `register_group`, `group_active`, `stop_group`,
  `start_group`, `reset_group`, `claim_next(group, partition_by, handled_types, worker_id)` ->
  `Claim | None` (its ``guard`` is the append condition built from every handled type's
  `to_conditions` after the last returned position, as CCC's; `exact_guard=True` builds it
  from `to_exact_conditions`), `ack`, `release`, `renew`,
  `describe_group`. `claim_next(..., ack=(claim, position))` acknowledges the previous claim in
  the same round trip. With `claim_next(..., prefetch=N)` one round trip claims up to N
  partitions; later calls hand them out one at a time and record their riding acks locally, sent
  with the next call that reaches the broker (or `commit()` / `close()`), as Kafka's share
  consumer does (see claim_next).

An `EventType` declares the attributes its payload carries; its events carry them as tags
"name:value", and `to_conditions(**attributes)` yields one query item per attribute the type
declares (alternatives: an event of the type with any one of the values matches), as CCC's
`to_conditions`; `to_exact_conditions` yields one item needing all of them.

Thread-safe as the gRPC channel is; errors are `dmq.client.errors` classes, never grpc's.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import FrozenInstanceError, dataclass, field
from itertools import repeat
from typing import Any, NamedTuple, Protocol

import grpc

from dmq.client._calls import call_leader
from dmq.client._cluster import Cluster
from dmq.client._log import get_logger
from dmq.client._settings import bootstrap_address, check_positive
from dmq.client.errors import (
    DMQError,
    GroupNotFoundError,
    InvalidArgumentError,
    TopicNotFoundError,
    from_rpc_error,
)
from dmq.client.events._model import AppendCondition, Event, EventType, Query, QueryItem, _query_proto
from dmq.client.events._stream import AnswerStatus, AppendStream
from dmq.proto import dmq_pb2 as pb
from dmq.proto.event_headers import READ_LIMIT_MAX

__all__ = [
    "EventStore",
    "Event",
    "SequencedEvent",
    "Query",
    "QueryItem",
    "AppendCondition",
    "EventType",
    "ReadResult",
    "Claim",
    "GroupDescription",
    "StoreDescription",
    "EventSubscription",
]

log = get_logger(__name__)

# Read and subscribe retry a lost leader this often (they change nothing); append never retries.
READ_ATTEMPTS = 3
# The broker's claim timeout when the caller names none (broker/events/service.py).
DEFAULT_CLAIM_TIMEOUT_MS = 30_000
# A prefetched claim is handed out only while less than this share of its timeout has passed, so
# the worker gets most of the timeout (it renews, as with any claim, when it needs longer).
PREFETCH_FRESH_SHARE = 1 / 3
PREFETCH_MAX = 1_000
# EventStore.describe's limit (the broker's: broker/events/service.py).
STORE_DESCRIBE_LIMIT_DEFAULT = 100
STORE_DESCRIBE_LIMIT_MAX = 1_000


class _Columns(Protocol):
    """Events as parallel columns: a columnar EventReadResponse, or _OneEvent."""

    @property
    def positions(self) -> Sequence[int]: ...
    @property
    def types(self) -> Sequence[str]: ...
    @property
    def tags(self) -> Sequence[str]: ...  # joined by "\n"
    @property
    def payloads(self) -> Sequence[bytes]: ...
    @property
    def metadata(self) -> Sequence[bytes]: ...
    @property
    def append_times_ms(self) -> Sequence[int]: ...


class _OneEvent(NamedTuple):
    """Columns as tuples: of an event made with SequencedEvent(position, event, append_time_ms),
    or of an older broker's one-message-per-event answer (_columns_of_rows)."""

    positions: tuple[int, ...]
    types: tuple[str, ...]
    tags: tuple[str, ...]
    payloads: tuple[bytes, ...]
    metadata: tuple[bytes, ...]
    append_times_ms: tuple[int, ...]


def _columns_of_rows(events: Iterable[pb.SequencedEvent]) -> _OneEvent:
    rows = [(e.position, e.event.type, "\n".join(e.event.tags), e.event.payload, e.event.metadata, e.append_time_ms)
            for e in events]
    if not rows:
        return _OneEvent((), (), (), (), (), ())
    return _OneEvent(*map(tuple, zip(*rows, strict=True)))


class _Page:
    """A read answer's columns, each made a list on first use: a list is indexed several times
    faster than the protobuf answer's repeated field (which builds a new object per access), and
    a column no event asks for is never converted."""

    def __init__(self, answer: _Columns) -> None:
        self._answer = answer

    def __getattr__(self, name: str) -> list[Any]:
        column = list(getattr(self._answer, name))
        setattr(self, name, column)  # later lookups find the list in the instance dict
        return column


class SequencedEvent:
    """An event and its position: `SequencedEvent(position, event, append_time_ms=0)`, frozen,
    compared and hashed by those three fields (as the dataclass it replaces).

    Written by hand, with __slots__, so that a read of many events builds one small object per
    event (`_views`): a view of row `_i` of the answer's columns, each field taken from
    its column when used, and the Event and its tags tuple built on first use of `event` or
    `tags`. An event of a read therefore keeps that read's answer (at most one page, ~32 MiB)
    in memory while it lives."""

    __slots__ = ("_columns", "_i", "_event")
    __match_args__ = ("position", "event", "append_time_ms")

    _columns: _Columns
    _i: int
    _event: Event  # unset until first built (a view of a read's answer)

    def __init__(self, position: int, event: Event, append_time_ms: int = 0) -> None:
        _set_columns(self, _OneEvent((position,), (event.type,), ("",), (event.data,), (event.metadata,),
                                     (append_time_ms,)))
        _set_i(self, 0)
        _set_event(self, event)

    @property
    def position(self) -> int:
        return self._columns.positions[self._i]

    @property
    def append_time_ms(self) -> int:
        return self._columns.append_times_ms[self._i]

    @property
    def event(self) -> Event:
        try:
            return self._event
        except AttributeError:
            c, i = self._columns, self._i
            joined = c.tags[i]
            e = Event._of(c.types[i], c.payloads[i], tuple(joined.split("\n")) if joined else (), c.metadata[i])
            _set_event(self, e)
            return e

    @property
    def type(self) -> str:
        return self._columns.types[self._i]

    @property
    def tags(self) -> Sequence[str]:
        return self.event.tags

    @property
    def data(self) -> bytes:
        return self._columns.payloads[self._i]

    @property
    def payload(self) -> bytes:
        """`data`, by DMQ's earlier name."""
        return self._columns.payloads[self._i]

    @property
    def metadata(self) -> bytes:
        return self._columns.metadata[self._i]

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, SequencedEvent)
        return (self.position, self.event, self.append_time_ms) == (other.position, other.event, other.append_time_ms)

    def __hash__(self) -> int:
        return hash((self.position, self.event, self.append_time_ms))

    def __repr__(self) -> str:
        return f"SequencedEvent(position={self.position!r}, event={self.event!r}, append_time_ms={self.append_time_ms!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (SequencedEvent, (self.position, self.event, self.append_time_ms))

    @classmethod
    def from_proto(cls, e: pb.SequencedEvent) -> SequencedEvent:
        ev = e.event
        return cls(e.position, Event._of(ev.type, ev.payload, tuple(ev.tags), ev.metadata), e.append_time_ms)

    @staticmethod
    def _views(page: _Columns, start: int, stop: int) -> list[SequencedEvent]:
        """Views of rows [start, stop) of a read answer's columns (a _Page): one object and two
        slot stores per event, made by three C loops (map), no bytecode per event."""
        n = stop - start
        out: list[SequencedEvent] = list(map(object.__new__, repeat(SequencedEvent, n)))
        deque(map(_set_columns, out, repeat(page, n)), maxlen=0)
        deque(map(_set_i, out, range(start, stop)), maxlen=0)
        return out


def _visible_rows(answer: pb.EventReadResponse, head: int) -> int:
    """How many events of a columnar answer lie at positions <= head (positions ascend)."""
    positions = answer.positions
    n = len(positions)
    sizes = [n, len(answer.types), len(answer.tags), len(answer.payloads), len(answer.metadata),
             len(answer.append_times_ms)]
    if any(size != n for size in sizes):
        raise DMQError(f"malformed event read answer: columns of {sizes} entries")
    return bisect_right(positions, head) if n and positions[-1] > head else n


# The slots' own setters: they bypass the frozen __setattr__ (object.__setattr__ is ~3x slower).
def _slot_setter(name: str) -> Callable[[SequencedEvent, Any], None]:
    setter: Callable[[SequencedEvent, Any], None] = vars(SequencedEvent)[name].__set__
    return setter


_set_columns = _slot_setter("_columns")
_set_i = _slot_setter("_i")
_set_event = _slot_setter("_event")


class ReadResult:
    """The events of a read (`events`, in position order) and the store's head position when the
    read began: `ReadResult(events, head)`, frozen, compared by those two fields.

    Iterating a result (`for e in result`) makes each event as it is reached, a chunk at a time,
    and keeps none: a read of many events iterated once leaves nothing for the garbage collector
    to trace (10,000 views that all lived until the loop ended were promoted to its oldest
    generation, and the full collections they triggered took a third of the client's time per
    read). `events` makes the list, once, on first use."""

    __slots__ = ("_events", "_pages", "head")
    __match_args__ = ("events", "head")

    _events: list[SequencedEvent] | None
    _pages: tuple[tuple[_Columns, int], ...]  # (answer columns, visible rows) per page, before `events` is made
    head: int

    def __init__(self, events: list[SequencedEvent], head: int) -> None:
        _set_result(self, "_events", events)
        _set_result(self, "_pages", ())
        _set_result(self, "head", head)

    @classmethod
    def _of_pages(cls, pages: list[tuple[_Columns, int]], head: int) -> ReadResult:
        result = cls([], head)
        _set_result(result, "_events", None)
        _set_result(result, "_pages", tuple(pages))
        return result

    @property
    def events(self) -> list[SequencedEvent]:
        if self._events is None:
            events: list[SequencedEvent] = []
            for page, n in self._pages:
                events += SequencedEvent._views(page, 0, n)
            _set_result(self, "_events", events)
            _set_result(self, "_pages", ())
            return events
        return self._events

    def __iter__(self) -> Iterator[SequencedEvent]:
        if self._events is not None:
            return iter(self._events)
        return self._iter_pages(self._pages)

    @staticmethod
    def _iter_pages(pages: tuple[tuple[_Columns, int], ...]) -> Iterator[SequencedEvent]:
        # chunks well under the collector's first threshold (700 new objects): a chunk the
        # caller does not keep is freed before the next is made, and no collection runs
        for page, n in pages:
            for start in range(0, n, _ITER_CHUNK):
                yield from SequencedEvent._views(page, start, min(start + _ITER_CHUNK, n))

    def __len__(self) -> int:
        if self._events is not None:
            return len(self._events)
        return sum(n for _, n in self._pages)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, ReadResult)
        return self.head == other.head and self.events == other.events

    __hash__ = None  # type: ignore[assignment]  # holds a list, as the dataclass it replaces

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def __repr__(self) -> str:
        return f"ReadResult(events={self.events!r}, head={self.head!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (ReadResult, (self.events, self.head))


def _set_result(result: ReadResult, name: str, value: object) -> None:
    object.__setattr__(result, name, value)


# ReadResult's iteration makes this many event views at a time.
_ITER_CHUNK = 256


@dataclass(frozen=True, slots=True)
class Claim:
    """A claimed partition: its canonical key, values, pending events and the guard to append with."""

    group: str
    worker_id: str
    partition_key: str
    values: Mapping[str, str]
    events: list[SequencedEvent]
    guard: AppendCondition
    last_position: int
    head: int


@dataclass(frozen=True, slots=True)
class PartitionState:
    partition_key: str
    values: Mapping[str, str]
    acked_position: int
    claimed_by: str | None
    claimed_since_ms: int | None
    pending: int


@dataclass(frozen=True, slots=True)
class GroupDescription:
    group: str
    active: bool
    partition_by: list[str]
    handled_types: list[str]
    head: int
    partitions: list[PartitionState] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class StoreDescription:
    """An event store as its index and groups know it (`EventStore.describe`): the types and tags
    with their events, the most frequent first, at most `limit` of each (`type_count` /
    `tag_count` say how many there are), and its groups (by name, at most `limit`, each with at
    most `limit` partitions; `group_count` in all)."""

    head: int
    types: dict[str, int]
    type_count: int
    tags: dict[str, int]
    tag_count: int
    groups: list[GroupDescription]
    group_count: int


def _group_description(d: pb.EventGroupDescription) -> GroupDescription:
    return GroupDescription(
        group=d.group,
        active=d.active,
        partition_by=list(d.partition_by),
        handled_types=list(d.handled_types),
        head=d.head,
        partitions=[
            PartitionState(
                partition_key=p.partition_key,
                values={a.name: a.value for a in p.values},
                acked_position=p.acked_position,
                claimed_by=p.claimed_by or None,
                claimed_since_ms=p.claimed_since_ms or None,
                pending=p.pending,
            )
            for p in d.partitions
        ],
    )


def _as_types(handled_types: Sequence[EventType | str], partition_by: Sequence[str]) -> list[EventType]:
    """EventTypes as given; a bare type name declares every partition_by attribute."""
    out = []
    for t in handled_types:
        out.append(t if isinstance(t, EventType) else EventType(str(t), tuple(partition_by)))
    return out


class EventSubscription:
    """Iterates the events of an EventSubscribe stream; close() ends it."""

    def __init__(self, call: Any, context: str) -> None:
        self._call = call
        self._context = context
        self._pending: list[SequencedEvent] = []

    def __iter__(self) -> Iterator[SequencedEvent]:
        return self

    def __next__(self) -> SequencedEvent:
        while not self._pending:
            try:
                answer = next(self._call)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.CANCELLED:
                    raise StopIteration from None
                raise from_rpc_error(e, context=self._context) from None
            self._pending = [SequencedEvent.from_proto(e) for e in answer.events]
            self._pending.reverse()
        return self._pending.pop()

    def close(self) -> None:
        self._call.cancel()

    def __enter__(self) -> EventSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EventStore:
    def __init__(
        self,
        bootstrap_servers: str | Sequence[str] | None = None,
        topic: str = "",
        *,
        request_timeout_ms: int = 30_000,
        cluster: Cluster | None = None,
    ) -> None:
        check_positive("request_timeout_ms", request_timeout_ms)
        if not topic:
            raise InvalidArgumentError("EventStore needs the event-store topic's name (topic=...)")
        self.topic = topic
        self._own_cluster = cluster is None
        self._cluster = cluster or Cluster(
            bootstrap_address({"bootstrap_servers": bootstrap_servers}, "EventStore"),
            request_timeout_ms=request_timeout_ms,
        )
        # Prefetching claim_next: claims not yet handed out (with when they were claimed), and the
        # acks recorded locally per group, sent with the group's next call to the broker.
        self._lock = threading.Lock()
        # append's stream (_stream.py): one append at a time uses it, the others the unary call
        self._stream_lock = threading.Lock()
        self._stream: AppendStream | None = None
        self._stream_supported = True  # False once a broker answered UNIMPLEMENTED (an older one)
        self._request_timeout_s = request_timeout_ms / 1000
        self._prefetched: dict[tuple[Any, ...], deque[tuple[Claim, float]]] = {}
        self._local_acks: dict[str, list[pb.EventClaimRef]] = {}

    def __repr__(self) -> str:
        return f"<EventStore topic={self.topic!r} bootstrap={self._cluster.bootstrap!r}>"

    def close(self) -> None:
        """Send the acks recorded locally and give back the prefetched claims not handed out
        (best effort: a failure is logged, and those partitions' claims time out), then close."""
        with self._lock:
            groups = set(self._local_acks) | {key[0] for key, q in self._prefetched.items() if q}
        for group in sorted(groups):
            try:
                self.commit(group, release_prefetched=True)
            except DMQError as e:
                log.warning("event-store close: acks or releases not sent", topic=self.topic, group=group, error=str(e))
        with self._stream_lock:
            if self._stream is not None:
                self._stream.close()
                self._stream = None
        if self._own_cluster:
            self._cluster.close()

    def __enter__(self) -> EventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- calls ------------------------------------------------------------------------------------

    def _call(self, method: str, request: Any, *, attempts: int = 1,
              overrides: Mapping[grpc.StatusCode, type[DMQError]] | None = None) -> Any:
        """One RPC to the store's leader; retriable failures are retried `attempts` times in all
        (dmq.client._calls), with the metadata refreshed when it may be stale."""
        cluster = self._cluster
        return call_leader(
            cluster, self.topic, lambda: cluster.leader_for(self.topic, 0), method, request,
            policy=cluster.retry, what=f"{method} on {self.topic}",
            overrides=overrides or {grpc.StatusCode.NOT_FOUND: TopicNotFoundError}, max_attempts=attempts,
        )

    # -- append / read / subscribe -----------------------------------------------------------------

    def append(self, events: Event | Sequence[Event], condition: AppendCondition | None = None) -> int:
        """Store the events atomically; the last one's position. AppendConditionError if the
        condition fails (nothing stored)."""
        batch = [events] if isinstance(events, Event) else list(events)
        if not batch:
            raise InvalidArgumentError("append needs at least one event")
        request = pb.EventAppendRequest(topic=self.topic, events=[e.to_proto() for e in batch])
        if condition is not None:
            request.condition.CopyFrom(condition.to_proto())
        if self._stream_supported and self._stream_lock.acquire(blocking=False):
            try:
                answer = self._append_streamed(request)
            finally:
                self._stream_lock.release()
            if answer is not None:
                return int(answer.last_position)
        return int(self._call("EventAppend", request).last_position)

    def _append_streamed(self, request: pb.EventAppendRequest) -> pb.EventAppendResponse | None:
        """The append on the store's stream (_stream.py; the caller holds _stream_lock); None
        when the broker has no stream (UNIMPLEMENTED: nothing was appended), and then the unary
        call is used from now on. Never retried, as the unary append is not."""
        cluster = self._cluster
        address = cluster.leader_for(self.topic, 0)
        stream = self._stream
        if stream is None or not stream.usable(address):
            if stream is not None:
                stream.close()
            # each append waits at most twice request_timeout_ms (see _stream.py)
            stream = self._stream = AppendStream(cluster.broker_stub(address), address, 2 * self._request_timeout_s)
        try:
            answer = stream.send(request)
            error: grpc.RpcError | None = AnswerStatus(answer) if answer.status_code else None
        except grpc.RpcError as e:
            stream.close()
            self._stream = None
            if e.code() is grpc.StatusCode.UNIMPLEMENTED:
                self._stream_supported = False
                log.info("the broker has no EventAppendStream: appends take one call each", topic=self.topic,
                         broker=address)
                return None
            error = e
        if error is None:
            return answer
        err = from_rpc_error(error, context=f"EventAppend on {self.topic} at {address}",
                             overrides={grpc.StatusCode.NOT_FOUND: TopicNotFoundError})
        if err.invalid_metadata or err.code in ("NOT_FOUND", "UNAVAILABLE"):
            cluster.invalidate(self.topic)  # the leader may have moved: the next append looks it up
            if self._stream is not None:
                self._stream.close()
                self._stream = None
        raise err from None

    def read(self, query: Query | Sequence[QueryItem] | None = None, after: int | None = None,
             limit: int | None = None) -> ReadResult:
        """Matching events after position `after`, in position order, at most `limit` (None: all
        up to the head), and the head position when the read began."""
        if limit is not None and limit < 0:
            raise InvalidArgumentError(f"limit must be >= 0, got {limit}")
        q = _query_proto(query)
        pages: list[tuple[_Columns, int]] = []
        taken = 0
        cursor = after or 0
        head: int | None = None
        while limit is None or taken < limit:
            # a page is at most `page` events and at most ~32 MiB of them (the broker's bound):
            # a short page is not the end, only an empty one or one reaching the head is
            page = 0 if limit is None else min(limit - taken, READ_LIMIT_MAX)
            answer = self._call("EventRead", pb.EventReadRequest(topic=self.topic, query=q, after=cursor, limit=page,
                                                                  columnar=True),
                                attempts=READ_ATTEMPTS)
            if head is None:
                head = answer.head
            positions = answer.positions
            if positions:
                n = _visible_rows(answer, head)
                pages.append((_Page(answer), n))
                # read_to (when the broker knows it): no match lies between the last event and it
                cursor = max(positions[-1], answer.read_to)
            elif answer.events:  # a broker from before columnar answers: one message per event
                rows = _columns_of_rows(e for e in answer.events if e.position <= head)
                n = len(rows.positions)
                pages.append((rows, n))
                cursor = answer.events[-1].position
            else:
                break
            taken += n
            if cursor >= head:
                break
        return ReadResult._of_pages(pages, head or 0)

    def head(self) -> int:
        """The store's last position (0 when empty)."""
        return int(self._call("EventRead", pb.EventReadRequest(topic=self.topic, after=2**62, limit=1),
                              attempts=READ_ATTEMPTS).head)

    def subscribe(self, query: Query | Sequence[QueryItem] | None = None, after: int | None = None) -> EventSubscription:
        """Matching events after `after`, then each one as it is appended, until close()."""
        address = self._cluster.leader_for(self.topic, 0)
        call = self._cluster.broker_stub(address).EventSubscribe(
            pb.EventSubscribeRequest(topic=self.topic, query=_query_proto(query), after=after or 0)
        )
        return EventSubscription(call, f"EventSubscribe on {self.topic} at {address}")

    # -- consumer groups --------------------------------------------------------------------------

    def _group_call(self, method: str, request: Any) -> Any:
        return self._call(method, request, attempts=READ_ATTEMPTS if method == "EventGroupDescribe" else 1,
                          overrides={grpc.StatusCode.NOT_FOUND: GroupNotFoundError})

    def _control(self, group: str, action: pb.EventGroupAction) -> pb.EventGroupStatus:
        status: pb.EventGroupStatus = self._group_call(
            "EventGroupControl", pb.EventGroupControlRequest(topic=self.topic, group=group, action=action)
        )
        return status

    def register_group(self, group: str) -> None:
        """Create the group (idempotent: registering an existing group changes nothing)."""
        self._control(group, pb.EVENT_GROUP_REGISTER)

    def group_state(self, group: str) -> str:
        """"active", "stopped" or "unknown"."""
        status = self._control(group, pb.EVENT_GROUP_STATUS)
        return "unknown" if not status.known else "active" if status.active else "stopped"

    def group_active(self, group: str) -> bool:
        """True when the group exists and is not stopped."""
        return self.group_state(group) == "active"

    def stop_group(self, group: str) -> None:
        """claim_next answers nothing until start_group (claims held go on until acked or released)."""
        self._control(group, pb.EVENT_GROUP_STOP)

    def start_group(self, group: str) -> None:
        self._control(group, pb.EVENT_GROUP_START)

    def reset_group(self, group: str) -> None:
        """Forget every partition's acknowledged position (and every claim): all events are pending again."""
        self._control(group, pb.EVENT_GROUP_RESET)

    def claim_next(
        self,
        group: str,
        partition_by: Sequence[str],
        handled_types: Sequence[EventType | str],
        worker_id: str,
        *,
        limit: int | None = None,
        claim_timeout_ms: int | None = None,
        ack: tuple[Claim, int] | None = None,
        prefetch: int = 0,
        exact_guard: bool = False,
    ) -> Claim | None:
        """Claim the partition whose earliest pending event is oldest (None: nothing pending, all
        claimed, or the group is stopped). `ack=(claim, position)` acknowledges first, in the
        same round trip; its answer is this call's, so the ack is durable when this returns.

        `prefetch=N` (2..1000): one round trip claims up to N partitions (their events within
        `limit` in all) and later calls with the same arguments hand them out one at a time
        while they are fresh (less than a third of claim_timeout_ms old; older ones are given
        back). Their `ack=` is then recorded locally and sent with the group's next call that
        reaches the broker, or by `commit()` / `close()`: it is durable only once that call is
        answered, and a worker that crashes before loses those acks and the events come back
        (at least once, as with Kafka's share consumer).

        The claim's ``guard`` fails an append if, after the claim's last position, an event of a
        handled type carries any one of the claim's attribute values that its type declares (each
        type's `to_conditions`, as CCC's). `exact_guard=True`: only if it carries all of them
        (`to_exact_conditions`)."""
        if isinstance(partition_by, str) or isinstance(handled_types, str):
            raise InvalidArgumentError("partition_by and handled_types are lists, not single strings")
        if prefetch < 0 or prefetch > PREFETCH_MAX:
            raise InvalidArgumentError(f"prefetch must be within 0..{PREFETCH_MAX}, got {prefetch}")
        types = _as_types(handled_types, partition_by)
        if prefetch > 1:
            return self._claim_prefetched(group, partition_by, types, worker_id, limit, claim_timeout_ms, ack, prefetch,
                                          exact_guard)
        request = pb.EventClaimRequest(
            topic=self.topic, group=group, partition_by=list(partition_by), handled_types=[t.name for t in types],
            worker_id=worker_id, claim_timeout_ms=claim_timeout_ms or 0, limit=limit or 0,
        )
        if ack is not None:
            prev, position = ack
            request.ack.CopyFrom(self._ref(prev, position))
        answer = self._group_call("EventClaimNext", request)
        if not answer.claimed:
            return None
        return self._claim(group, worker_id, types, answer.partition_key, answer.values, answer.events,
                           answer.last_position, answer.head, exact_guard)

    def _claim(self, group: str, worker_id: str, types: Sequence[EventType], key: str,
               attributes: Iterable[pb.Attribute], events: Iterable[pb.SequencedEvent], last: int, head: int,
               exact_guard: bool) -> Claim:
        values = {a.name: a.value for a in attributes}
        items = [item for t in types
                 for item in (t.to_exact_conditions(**values) if exact_guard else t.to_conditions(**values))]
        return Claim(
            group=group,
            worker_id=worker_id,
            partition_key=key,
            values=values,
            events=[SequencedEvent.from_proto(e) for e in events],
            guard=AppendCondition(items, after=last),
            last_position=last,
            head=head,
        )

    def _claim_prefetched(
        self, group: str, partition_by: Sequence[str], types: list[EventType], worker_id: str,
        limit: int | None, claim_timeout_ms: int | None, ack: tuple[Claim, int] | None, prefetch: int,
        exact_guard: bool,
    ) -> Claim | None:
        # the guard kind is part of the key: a prefetched claim's guard is built when it is fetched
        key = (group, tuple(partition_by), tuple(t.name for t in types), worker_id, limit, claim_timeout_ms,
               exact_guard)
        fresh_s = (claim_timeout_ms or DEFAULT_CLAIM_TIMEOUT_MS) / 1000 * PREFETCH_FRESH_SHARE
        with self._lock:
            if ack is not None:
                self._local_acks.setdefault(group, []).append(self._ref(ack[0], ack[1]))
            queue = self._prefetched.get(key)
            stale: list[Claim] = []
            now = time.monotonic()
            while queue:
                claim, claimed_at = queue.popleft()
                if now - claimed_at < fresh_s:
                    return claim
                stale.append(claim)
            acks = self._local_acks.pop(group, [])
        request = pb.EventClaimRequest(
            topic=self.topic, group=group, partition_by=list(partition_by), handled_types=[t.name for t in types],
            worker_id=worker_id, claim_timeout_ms=claim_timeout_ms or 0, limit=limit or 0, max_claims=prefetch,
            more_acks=acks, releases=[self._ref(c) for c in stale],
        )
        claimed_at = time.monotonic()
        answer = self._group_call("EventClaimNext", request)  # refused: the local acks go with it
        if not answer.claimed:
            return None
        first = self._claim(group, worker_id, types, answer.partition_key, answer.values, answer.events,
                            answer.last_position, answer.head, exact_guard)
        more = [self._claim(group, worker_id, types, c.partition_key, c.values, c.events, c.last_position, answer.head,
                            exact_guard)
                for c in answer.more_claims]
        if more:
            with self._lock:
                self._prefetched.setdefault(key, deque()).extend((c, claimed_at) for c in more)
        return first

    def commit(self, group: str | None = None, *, release_prefetched: bool = False) -> None:
        """Send the acks a prefetching claim_next recorded locally (of `group`, or of every group)
        in one call per group; durable when this returns. `release_prefetched`: also give back
        the prefetched claims not handed out."""
        with self._lock:
            groups = [group] if group is not None else sorted(set(self._local_acks) | {k[0] for k in self._prefetched})
            work = []
            for g in groups:
                acks = self._local_acks.pop(g, [])
                releases: list[Claim] = []
                if release_prefetched:
                    for key in [k for k in self._prefetched if k[0] == g]:
                        releases.extend(c for c, _ in self._prefetched.pop(key))
                if acks or releases:
                    work.append((g, acks, releases))
        for g, acks, releases in work:
            self._group_call("EventClaimNext", pb.EventClaimRequest(
                topic=self.topic, group=g, worker_id=(acks[0].worker_id if acks else releases[0].worker_id),
                max_claims=0, more_acks=acks, releases=[self._ref(c) for c in releases],
            ))

    def _ref(self, claim: Claim, position: int = 0) -> pb.EventClaimRef:
        return pb.EventClaimRef(topic=self.topic, group=claim.group, partition_key=claim.partition_key,
                                worker_id=claim.worker_id, position=position)

    def ack(self, claim: Claim, position: int | None = None) -> None:
        """Acknowledge the claim's events up to `position` (default: all returned) and release it."""
        self._group_call("EventAck", self._ref(claim, claim.last_position if position is None else position))

    def release(self, claim: Claim) -> None:
        """Give the claim up without acknowledging: the same events come back."""
        self._group_call("EventRelease", self._ref(claim))

    def renew(self, claim: Claim) -> None:
        """Keep the claim alive for another claim_timeout_ms."""
        self._group_call("EventRenewClaim", self._ref(claim))

    def describe_group(self, group: str) -> GroupDescription:
        return _group_description(
            self._group_call("EventGroupDescribe", pb.EventGroupDescribeRequest(topic=self.topic, group=group)))

    def describe(self, limit: int = STORE_DESCRIBE_LIMIT_DEFAULT) -> StoreDescription:
        """The store's types and tags with their event counts (all events up to the head, from the
        leader's index) and its consumer groups with their claims and progress; each list holds
        at most `limit` (1 to STORE_DESCRIBE_LIMIT_MAX) entries."""
        if not 1 <= limit <= STORE_DESCRIBE_LIMIT_MAX:
            raise InvalidArgumentError(f"limit must be within 1..{STORE_DESCRIBE_LIMIT_MAX}, got {limit}")
        d = self._call("EventStoreDescribe", pb.EventStoreDescribeRequest(topic=self.topic, limit=limit),
                       attempts=READ_ATTEMPTS)
        return StoreDescription(
            head=d.head,
            types={c.name: c.events for c in d.types}, type_count=d.type_count,
            tags={c.name: c.events for c in d.tags}, tag_count=d.tag_count,
            groups=[_group_description(g) for g in d.groups], group_count=d.group_count,
        )
