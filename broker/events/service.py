"""The event-store RPCs of the Broker service: validation and translation, nothing else.

`EventStoreServicer` is a servicer of its own, registered on the broker's server beside the
others (dmq.broker.servicers); it sees the broker through `EventServiceHost`, not the node. The
work happens in store.py / groups.py. Every field is checked here against
dmq.proto.event_headers' rules before a store is touched. The store's refusals are DomainErrors
(broker/events/errors.py) and a broken rule a FieldError, both mapped by rpc_handler
(dmq.proto.server.server_errors):

  InvalidEventRequestError / FieldError  INVALID_ARGUMENT (the message names the field and the limit)
  ConditionFailedError                   FAILED_PRECONDITION, reason "append-condition-failed", the
                                         first conflicting position in "dmq-conflict-position"
  EventGroupNotFoundError                NOT_FOUND
  EventClaimNotHeldError / GroupConflict      FAILED_PRECONDITION
  EventStoreFullError                    RESOURCE_EXHAUSTED
  not an event store                     FAILED_PRECONDITION (also Produce to one: use EventAppend)
and, translated here, batch limits (RESOURCE_EXHAUSTED), an unknown partition (NOT_FOUND) and
storage failures (as for Produce, broker/service.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import operator
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

import grpc
import structlog

from dmq.broker.events.append_stream import AppendStreams
from dmq.broker.events.errors import ConditionFailedError, EventStoreFullError
from dmq.broker.events.groups import Claimed, GroupManager, PartitionView
from dmq.broker.events.index import EventColumns, EventIndex, split_tags
from dmq.broker.events.progress import AckWrite, GroupRecord
from dmq.broker.events.query import QueryItem
from dmq.broker.events.registry import EventStores
from dmq.broker.events.store import Condition, EventStore, NewEvent
from dmq.broker.log import UnknownPartitionError
from dmq.broker.metrics import TopicTraffic
from dmq.broker.readiness import require_started
from dmq.broker.replication.replica import ReplicaLookup
from dmq.broker.storage_status import translate_storage
from dmq.proto import dmq_pb2 as pb
from dmq.proto import event_headers, records
from dmq.proto.names import GROUP_ID_MAX_BYTES, MEMBER_ID_MAX_BYTES, check_id, check_topic_name
from dmq.proto.server.security.interceptor import RefusedRequest
from dmq.proto.server.server_errors import RpcAbort, rpc_handler, rpc_status
from dmq.proto.server.server_errors import fail as _fail

__all__ = ["EventServiceHost", "EventStoreServicer", "DEFAULT_READ_LIMIT", "DEFAULT_CLAIM_TIMEOUT_MS"]

log = structlog.get_logger(__name__)

DEFAULT_READ_LIMIT = 10_000
DEFAULT_CLAIM_LIMIT = 1_000
DEFAULT_CLAIM_TIMEOUT_MS = 30_000
# Claims one EventClaimNext may take (a prefetching worker's), and acks + releases it may carry.
CLAIMS_PER_CALL_MAX = 1_000
CLAIM_TIMEOUT_MS_MIN = 100
CLAIM_TIMEOUT_MS_MAX = 3_600_000
SUBSCRIBE_PAGE = 1_000
SUBSCRIPTIONS_MAX = 1_000
# A subscription with nothing new re-checks this often even without a wake-up (a store closing).
SUBSCRIBE_IDLE_S = 1.0
DESCRIBE_PARTITIONS_MAX = 1_000
# EventStoreDescribe's limit: types, tags and groups answered, and partitions per group.
STORE_DESCRIBE_LIMIT_DEFAULT = 100
STORE_DESCRIBE_LIMIT_MAX = 1_000

# What is not the event store's own (its errors are DomainErrors): the codec's and the log's.
_STATUS: list[tuple[type[Exception], grpc.StatusCode]] = [
    (records.BatchTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (records.RecordTooLargeError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (UnknownPartitionError, grpc.StatusCode.NOT_FOUND),
]


def _translate(service: EventStoreServicer, e: Exception) -> RpcAbort | None:
    for cls, code in _STATUS:
        if isinstance(e, cls):
            return RpcAbort(code, str(e))
    # Storage failures: the broker's one mapping.
    return translate_storage(service._node.broker_id, e)


# Every event-store RPC reads what is loaded at start (the logs, group progress): UNAVAILABLE until
# then (dmq.broker.readiness).
_guarded = rpc_handler(log=log, translate=_translate, before=require_started)


def _checked(check: Callable[[], None]) -> None:
    """Run one of dmq.proto's shared rules; its FieldError is INVALID_ARGUMENT (rpc_handler's mapping)."""
    check()


def _check_position(value: int, field: str) -> None:
    if value < 0:
        _fail(grpc.StatusCode.INVALID_ARGUMENT, f"{field} must be >= 0 (a position; 0 = from the start), got {value}")


def _limit(value: int, field: str, default: int) -> int:
    if not 0 <= value <= event_headers.READ_LIMIT_MAX:
        _fail(grpc.StatusCode.INVALID_ARGUMENT, f"{field} must be within 0..{event_headers.READ_LIMIT_MAX} (0 = {default}), got {value}")
    return value or default


def query_from_proto(query: pb.EventQuery, field: str) -> tuple[QueryItem, ...]:
    items = [(list(i.types), list(i.tags)) for i in query.items]
    _checked(lambda: event_headers.check_query_items(items, field=field))
    return tuple(QueryItem(tuple(types), tuple(tags)) for types, tags in items)


def columns_to_events(c: EventColumns) -> list[pb.SequencedEvent]:
    """The row-shaped answer (a message per event) of older clients and subscriptions."""
    return [
        pb.SequencedEvent(position=p, event=pb.Event(type=t, tags=split_tags(tags), payload=pl, metadata=m),
                          append_time_ms=ms)
        for p, t, tags, pl, m, ms in zip(c.positions, c.types, c.tags, c.payloads, c.metadata, c.times_ms, strict=True)
    ]


_TYPE, _TAGS, _PAYLOAD, _METADATA = (operator.attrgetter(f) for f in ("type", "tags", "payload", "metadata"))


def _events_from_proto(events: Sequence[pb.Event]) -> list[NewEvent]:
    if not events:
        _fail(grpc.StatusCode.INVALID_ARGUMENT, "events must hold at least one event")
    if len(events) > event_headers.EVENTS_PER_APPEND_MAX:
        _fail(grpc.StatusCode.INVALID_ARGUMENT,
              f"events has {len(events)} events; the limit is {event_headers.EVENTS_PER_APPEND_MAX}")
    # column by column, each a loop in C (map): an append of 100 events spent more on its
    # per-event Python here than on storing them
    events = list(events)  # the message objects made once, not once per column
    types: list[str] = list(map(_TYPE, events))
    tags: list[tuple[str, ...]] = list(map(tuple, map(_TAGS, events)))
    _checked(lambda: event_headers.check_events(types, tags, field="events"))
    return list(map(NewEvent, types, tags, map(_PAYLOAD, events), map(_METADATA, events)))


def _attributes(values: dict[str, str]) -> list[pb.Attribute]:
    return [pb.Attribute(name=n, value=v) for n, v in sorted(values.items())]


def _group_description(g: GroupRecord, views: list[PartitionView], head: int) -> pb.EventGroupDescription:
    return pb.EventGroupDescription(
        group=g.name,
        active=g.active,
        partition_by=list(g.partition_by),
        handled_types=list(g.handled_types),
        partitions=[
            pb.EventPartitionState(
                partition_key=v.key,
                values=[pb.Attribute(name=n, value=val) for n, val in sorted(v.values.items())],
                acked_position=v.acked,
                claimed_by=v.claimed_by,
                claimed_since_ms=v.claimed_since_ms,
                pending=v.pending,
            )
            for v in views
        ],
        head=head,
    )


def _check_group(group: str) -> None:
    _checked(lambda: check_id(group, "group", "group name", GROUP_ID_MAX_BYTES))


def _check_worker(worker_id: str) -> None:
    _checked(lambda: check_id(worker_id, "worker_id", "worker id", MEMBER_ID_MAX_BYTES))


def _check_ref(ref: pb.EventClaimRef, field: str = "") -> None:
    _checked(lambda: check_topic_name(ref.topic, field=f"{field}topic"))
    _check_group(ref.group)
    # a composite key joins its attributes with PARTITION_KEY_SEPARATOR: checked attribute by attribute
    _checked(lambda: event_headers.check_partition_key(ref.partition_key, field=f"{field}partition_key"))
    _check_worker(ref.worker_id)


class EventServiceHost(Protocol):
    """The broker as the event-store RPCs see it: started yet (dmq.broker.readiness), its id, its
    event stores, its replicas (only the leader serves a store), the per-topic traffic counters
    and where a partition's leader is."""

    @property
    def ready(self) -> bool: ...

    @property
    def broker_id(self) -> int: ...

    @property
    def event_stores(self) -> EventStores: ...

    @property
    def replication(self) -> ReplicaLookup: ...

    @property
    def traffic(self) -> TopicTraffic: ...

    async def leader_hint(self, topic: str, partition: int) -> str | None: ...


class EventStoreServicer:
    """EventAppend (and EventAppendStream) / EventRead / EventSubscribe, the event groups' RPCs and
    EventStoreDescribe. close() ends the append streams (BrokerNode.stop)."""

    def __init__(self, node: EventServiceHost) -> None:
        self._node = node  # `_node`: what require_started reads
        self._append_streams = AppendStreams(self._append_message, self._message_status)

    def __repr__(self) -> str:
        return f"<EventStoreServicer broker={self._node.broker_id}>"

    async def _store(self, topic: str) -> EventStore:
        _checked(lambda: check_topic_name(topic, field="topic"))
        node = self._node
        try:
            store = node.event_stores.get(topic)
        except UnknownPartitionError:
            leader = await node.leader_hint(topic, 0)
            if leader is None:
                _fail(grpc.StatusCode.NOT_FOUND, f"unknown topic: {topic}")
            _fail(grpc.StatusCode.UNAVAILABLE,
                  f"broker {node.broker_id} does not lead {topic}[0]; the leader is {leader}")
        self._check_leads(topic)
        await store.ensure_open()
        return store

    def _check_leads(self, topic: str) -> None:
        """A follower copies the log; only the leader serves the store (UNAVAILABLE naming it)."""
        node = self._node
        r = node.replication.get(topic, 0)
        if r is not None and r.leading is None:
            _fail(grpc.StatusCode.UNAVAILABLE, r.not_leader_message(node.broker_id))

    # -- append / read / subscribe ------------------------------------------------------------------

    @_guarded
    async def EventAppend(
        self, request: pb.EventAppendRequest, context: grpc.aio.ServicerContext[pb.EventAppendRequest, pb.EventAppendResponse]
    ) -> pb.EventAppendResponse:
        return await self._append(request)

    async def EventAppendStream(
        self, requests: AsyncIterator[pb.EventAppendRequest | RefusedRequest],
        context: grpc.aio.ServicerContext[pb.EventAppendRequest, pb.EventAppendResponse],
    ) -> AsyncIterator[pb.EventAppendResponse]:
        """EventAppend, request after request on one stream: each answered in order, a refusal
        in the answer's status fields (as EventAppend's call would end), the stream going on;
        bounded, and ended by close() (broker/events/append_stream.py). A stream opened while the
        broker is starting is refused whole (UNAVAILABLE, nothing read), as EventAppend is."""
        try:
            require_started(self)
        except RpcAbort as starting:
            await context.abort(starting.code, starting.message)
        async for answer in self._append_streams.serve(requests, context):
            yield answer

    async def _append_message(self, request: pb.EventAppendRequest) -> pb.EventAppendResponse:
        """One message of an append stream: EventAppend behind its readiness gate."""
        require_started(self)
        return await self._append(request)

    def _message_status(self, e: Exception, request: object) -> RpcAbort:
        return rpc_status(e, log=log, servicer=self, translate=_translate, rpc="EventAppendStream", request=request)

    async def close(self) -> None:
        """The broker stopping: end the append streams (they answer what they read, then end OK)."""
        await self._append_streams.close()

    async def _append(self, request: pb.EventAppendRequest) -> pb.EventAppendResponse:
        events = _events_from_proto(request.events)
        condition = None
        if request.HasField("condition"):
            c = request.condition
            _check_position(c.after, "condition.after")
            condition = Condition(query_from_proto(c.fail_if_events_match, "condition.fail_if_events_match"), c.after)
        store = await self._store(request.topic)
        try:
            last, append_ms = await store.append(events, condition)
        except ConditionFailedError:
            # counted here, answered by rpc_handler (its reason and conflicting position ride along)
            self._node.traffic.event_conflict(request.topic)
            raise
        self._node.traffic.events_appended(request.topic, len(events))
        return pb.EventAppendResponse(last_position=last, append_time_ms=append_ms)

    @_guarded
    async def EventRead(
        self, request: pb.EventReadRequest, context: grpc.aio.ServicerContext[pb.EventReadRequest, pb.EventReadResponse | bytes]
    ) -> pb.EventReadResponse | bytes:
        query = query_from_proto(request.query, "query")
        _check_position(request.after, "after")
        limit = _limit(request.limit, "limit", DEFAULT_READ_LIMIT)
        store = await self._store(request.topic)
        if request.columnar:
            # already encoded (the stored fragments joined): EventRead's serializer passes bytes on
            # (wire.add_broker_servicer), so the answer is not copied into a message and out again
            packed, _ = await store.read_packed(query, request.after, limit)
            return packed.answer
        events, head = await store.read(query, request.after, limit)
        return pb.EventReadResponse(events=columns_to_events(events), head=head)

    @_guarded
    async def EventSubscribe(
        self, request: pb.EventSubscribeRequest, context: grpc.aio.ServicerContext[pb.EventSubscribeRequest, pb.EventReadResponse]
    ) -> None:
        query = query_from_proto(request.query, "query")
        _check_position(request.after, "after")
        store = await self._store(request.topic)
        stores = self._node.event_stores
        if stores.subscriptions >= SUBSCRIPTIONS_MAX:
            raise EventStoreFullError(f"this broker serves {SUBSCRIPTIONS_MAX} event subscriptions, the limit; retry later")
        stores.subscriptions += 1
        try:
            after = request.after
            while not store.closed:
                self._check_leads(request.topic)  # leadership moved: the client subscribes again there
                wake = store.next_append()  # taken before reading: an append after the read wakes us
                events, head = await store.read(query, after, SUBSCRIBE_PAGE)
                if events.positions:
                    await context.write(pb.EventReadResponse(events=columns_to_events(events), head=head))
                    after = events.positions[-1]
                    continue
                after = max(after, head)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(wake), SUBSCRIBE_IDLE_S)
        finally:
            stores.subscriptions -= 1
        _fail(grpc.StatusCode.UNAVAILABLE, f"the event store {request.topic} is closing (broker stopping); subscribe again")

    # -- consumer groups -----------------------------------------------------------------------------

    @_guarded
    async def EventGroupControl(
        self,
        request: pb.EventGroupControlRequest,
        context: grpc.aio.ServicerContext[pb.EventGroupControlRequest, pb.EventGroupStatus],
    ) -> pb.EventGroupStatus:
        _check_group(request.group)
        action = request.action
        if action not in pb.EventGroupAction.values():
            _fail(grpc.StatusCode.INVALID_ARGUMENT, f"action {action} is not an EventGroupAction")
        store = await self._store(request.topic)
        group = request.group

        def run(groups: GroupManager, until: int, now: int) -> tuple[bool, bool]:
            if action == pb.EVENT_GROUP_REGISTER:
                groups.register(group)
            elif action == pb.EVENT_GROUP_STOP:
                groups.set_active(group, False)
            elif action == pb.EVENT_GROUP_START:
                groups.set_active(group, True)
            elif action == pb.EVENT_GROUP_RESET:
                groups.reset(group)
            return groups.status(group)

        known, active = await store.groups(run)
        return pb.EventGroupStatus(group=group, known=known, active=active)

    @_guarded
    async def EventClaimNext(
        self, request: pb.EventClaimRequest, context: grpc.aio.ServicerContext[pb.EventClaimRequest, pb.EventClaimResponse]
    ) -> pb.EventClaimResponse:
        _check_group(request.group)
        _check_worker(request.worker_id)
        partition_by = list(request.partition_by)
        handled = list(request.handled_types)
        max_claims = request.max_claims if request.HasField("max_claims") else 1
        if not 0 <= max_claims <= CLAIMS_PER_CALL_MAX:
            _fail(grpc.StatusCode.INVALID_ARGUMENT,
                  f"max_claims must be within 0..{CLAIMS_PER_CALL_MAX}, got {max_claims}")
        if max_claims:  # 0: acks and releases only (a prefetching worker's commit)
            _checked(lambda: event_headers.check_attribute_names(partition_by, field="partition_by"))
            if not handled or len(handled) > event_headers.ITEM_TYPES_MAX:
                _fail(grpc.StatusCode.INVALID_ARGUMENT,
                      f"handled_types must name 1..{event_headers.ITEM_TYPES_MAX} event types, got {len(handled)}")
            for i, t in enumerate(handled):
                _checked(functools.partial(event_headers.check_event_type, t, field=f"handled_types[{i}]"))
        timeout_ms = request.claim_timeout_ms or DEFAULT_CLAIM_TIMEOUT_MS
        if not CLAIM_TIMEOUT_MS_MIN <= timeout_ms <= CLAIM_TIMEOUT_MS_MAX:
            _fail(grpc.StatusCode.INVALID_ARGUMENT,
                  f"claim_timeout_ms must be within {CLAIM_TIMEOUT_MS_MIN}..{CLAIM_TIMEOUT_MS_MAX} (0 = "
                  f"{DEFAULT_CLAIM_TIMEOUT_MS}), got {request.claim_timeout_ms}")
        limit = _limit(request.limit, "limit", DEFAULT_CLAIM_LIMIT)
        acked = ([("ack.", request.ack)] if request.HasField("ack") else []) + [
            (f"more_acks[{i}].", ref) for i, ref in enumerate(request.more_acks)
        ]
        released = [(f"releases[{i}].", ref) for i, ref in enumerate(request.releases)]
        if len(acked) + len(released) > CLAIMS_PER_CALL_MAX + 1:
            _fail(grpc.StatusCode.INVALID_ARGUMENT,
                  f"ack, more_acks and releases may name at most {CLAIMS_PER_CALL_MAX + 1} claims, "
                  f"got {len(acked) + len(released)}")
        for name, ref in acked + released:
            _check_ref(ref, name)
            _check_position(ref.position, name + "position")
            if ref.topic != request.topic or ref.group != request.group:
                _fail(grpc.StatusCode.INVALID_ARGUMENT, f"{name[:-1]} must name the request's topic and group")
        acks, releases = [ref for _, ref in acked], [ref for _, ref in released]
        store = await self._store(request.topic)

        unwritten: list[AckWrite] = []

        def run(groups: GroupManager, until: int, now: int) -> tuple[Exception | None, list[Claimed]]:
            # Applied in order; a refused one stops the rest, and what was applied is still
            # written below (its view already changed), then the refusal is raised.
            try:
                for a in acks:
                    groups.ack(a.group, a.partition_key, a.worker_id, a.position, now, until, unwritten=unwritten)
                for r in releases:
                    groups.release(r.group, r.partition_key, r.worker_id, now)
            except Exception as e:  # noqa: BLE001  (raised once the applied acks are stored)
                return e, []
            claims: list[Claimed] = []
            budget = limit
            while len(claims) < max_claims and budget > 0:
                claimed = groups.claim_next(request.group, partition_by, handled, request.worker_id,
                                            limit=budget, timeout_ms=timeout_ms, until=until, now_ms=now)
                if claimed is None:
                    break
                claims.append(claimed)
                budget -= len(claimed.events)
            return None, claims

        (refused, claims), loaded = await store.claim_all(run)
        await store.write_acks(unwritten)  # the acks riding on this claim are answered by its answer
        if refused is not None:
            raise refused
        head = store.readable_end()
        if not claims:
            return pb.EventClaimResponse(claimed=False, head=head)
        self._node.traffic.events_claimed(request.topic, len(claims))
        first, *more = claims
        return pb.EventClaimResponse(
            claimed=True,
            partition_key=first.key,
            values=_attributes(first.values),
            events=columns_to_events(loaded[0]),
            last_position=first.last_position,
            head=head,
            more_claims=[
                pb.ClaimedPartition(partition_key=c.key, values=_attributes(c.values),
                                    events=columns_to_events(events), last_position=c.last_position)
                for c, events in zip(more, loaded[1:], strict=True)
            ],
        )

    async def _claim_op(self, request: pb.EventClaimRef, op: Callable[[GroupManager, int, int], None]) -> pb.EventClaimAnswer:
        _check_ref(request)
        store = await self._store(request.topic)
        await store.groups(op)
        return pb.EventClaimAnswer()

    @_guarded
    async def EventAck(
        self, request: pb.EventClaimRef, context: grpc.aio.ServicerContext[pb.EventClaimRef, pb.EventClaimAnswer]
    ) -> pb.EventClaimAnswer:
        _check_position(request.position, "position")
        r = request
        unwritten: list[AckWrite] = []
        answer = await self._claim_op(
            r, lambda g, until, now: g.ack(r.group, r.partition_key, r.worker_id, r.position, now, until,
                                           unwritten=unwritten))
        store = await self._store(r.topic)
        await store.write_acks(unwritten)
        return answer

    @_guarded
    async def EventRelease(
        self, request: pb.EventClaimRef, context: grpc.aio.ServicerContext[pb.EventClaimRef, pb.EventClaimAnswer]
    ) -> pb.EventClaimAnswer:
        r = request
        return await self._claim_op(r, lambda g, until, now: g.release(r.group, r.partition_key, r.worker_id, now))

    @_guarded
    async def EventRenewClaim(
        self, request: pb.EventClaimRef, context: grpc.aio.ServicerContext[pb.EventClaimRef, pb.EventClaimAnswer]
    ) -> pb.EventClaimAnswer:
        r = request
        return await self._claim_op(r, lambda g, until, now: g.renew(r.group, r.partition_key, r.worker_id, now))

    @_guarded
    async def EventGroupDescribe(
        self,
        request: pb.EventGroupDescribeRequest,
        context: grpc.aio.ServicerContext[pb.EventGroupDescribeRequest, pb.EventGroupDescription],
    ) -> pb.EventGroupDescription:
        _check_group(request.group)
        store = await self._store(request.topic)
        def run(groups: GroupManager, until: int, now: int) -> tuple[GroupRecord, list[PartitionView]]:
            return groups.describe(request.group, until, now, DESCRIBE_PARTITIONS_MAX)

        g, views = await store.groups(run)
        return _group_description(g, views, store.readable_end())

    @_guarded
    async def EventStoreDescribe(
        self,
        request: pb.EventStoreDescribeRequest,
        context: grpc.aio.ServicerContext[pb.EventStoreDescribeRequest, pb.EventStoreDescription],
    ) -> pb.EventStoreDescription:
        if not 0 <= request.limit <= STORE_DESCRIBE_LIMIT_MAX:
            _fail(grpc.StatusCode.INVALID_ARGUMENT, f"limit must be within 0..{STORE_DESCRIBE_LIMIT_MAX} "
                  f"(0 = {STORE_DESCRIBE_LIMIT_DEFAULT}), got {request.limit}")
        limit = request.limit or STORE_DESCRIBE_LIMIT_DEFAULT
        store = await self._store(request.topic)

        def run(index: EventIndex, groups: GroupManager, until: int, now: int) -> pb.EventStoreDescription:
            types, type_count = index.type_counts(until, limit)
            tags, tag_count = index.tag_counts(until, limit)
            names = groups.names()
            described = [(name, groups.describe(name, until, now, limit)) for name in names[:limit]]
            return pb.EventStoreDescription(
                head=until,
                types=[pb.EventCount(name=n, events=c) for n, c in types], type_count=type_count,
                tags=[pb.EventCount(name=n, events=c) for n, c in tags], tag_count=tag_count,
                groups=[_group_description(g, views, until) for _name, (g, views) in described],
                group_count=len(names),
            )

        return await store.describe(run)

