"""AsyncConsumer: consumer groups from asyncio code, with DMQConsumer's semantics (aiokafka's shape).

    consumer = AsyncConsumer("orders", bootstrap_servers="127.0.0.1:9091", group_id="billing")
    await consumer.start()
    try:
        async for record in consumer:                      # or: await consumer.getmany(timeout_ms=500)
            handle(record)
    finally:
        await consumer.stop()                              # commits, hands back, leaves the group

The group protocol is DESIGN.md's "Consumer groups", as DMQConsumer runs it: one membership per
subscribed topic (``G_<topic>_<group_id>``), FindOrCreateGroup / JoinGroup, heartbeats and a
WatchGroup stream that flag a new generation, and the ownership hand-off: when a generation
changes, the positions of the records already handed to the application are committed to each
partition's broker BEFORE GetAssignment acknowledges the new assignment, so the next owner of a
revoked partition starts exactly after the last record this consumer returned: no record lost or
returned twice across a voluntary rebalance.

The group protocol's client side is the ConsumerCore (consumer/_core.py), the sans-I/O state
machine DMQConsumer drives too: which group call each membership needs, what each answer and
error means, the listener callbacks and their order, the commit rules. This module only makes
the calls (awaiting them on the loop) and carries out what the core returns.

Reused from the sync consumer, unchanged: ConsumerConfig (settings and their checks),
SubscriptionState, the Fetcher (pipelined per-broker fetches and lazy decoding) and
PositionFinder (committed offset, group start position or reset), whose calls are tasks on this
loop (started by AsyncCluster.start_unary: no thread, no grpc.Future), GroupClient (group requests
and error mapping) and OffsetClient (request building, answer parsing, error mapping) around the
calls this module awaits itself, the application of the key / value deserializers
(consumer/_common.py), the heartbeat/watch/max-poll-interval coroutines of HeartbeatThread (run
as tasks on this loop by Heartbeats, _consumer_parts.py), and the record types.

Differences from DMQConsumer: the group work a poll finds to do (find, re-join, hand-off) runs as
one task of its own (each call in it bounded by request_timeout_ms, the hand-off commits by
HANDOVER_COMMIT_WAIT_S), and getmany() hands out no record while it runs, rather than holding back
only the partitions of the membership concerned; getmany() keeps to its timeout either way.
Records buffered for getone() / ``async for`` are not counted as consumed until they are handed
out, so commits never cover a record the application has not seen (see Chunk: ``async for``
takes each record straight from a buffered chunk's iterator, and the position handed out is read
back from that iterator). Rebalance listener callbacks may be coroutine functions (they are
awaited).

Tasks owned here: the group work, the heartbeat supervisor (and its per-membership heartbeat and
watch tasks), the fetch and look-up calls (through the AsyncCluster), the auto-commits. stop()
ends them all.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import fields
from typing import Any

import grpc

from dmq.client._calls import RetryPolicy, retry_call_async
from dmq.client._log import get_logger
from dmq.client._settings import reject_unknown
from dmq.client.aio._cluster import AsyncCluster, Wakeup, bootstrap_address
from dmq.client.aio._consumer_parts import Chunk, Heartbeats
from dmq.client.consumer._common import check_seek_offset, commit_offsets, deserialize, time_queries
from dmq.client.consumer._common import tp_of as _tp
from dmq.client.consumer._common import tps_of as _tps
from dmq.client.consumer._config import ConsumerConfig
from dmq.client.consumer._core import HANDOVER_COMMIT_WAIT_S, ConsumerCore, GroupCall, Outcome
from dmq.client.consumer._fetcher import Fetcher
from dmq.client.consumer._group import FIND, HANDOVER, JOIN, GroupClient, Membership, group_id_for
from dmq.client.consumer._listener import ConsumerRebalanceListener
from dmq.client.consumer._offsets import CommitCall, OffsetClient
from dmq.client.consumer._positions import PositionFinder
from dmq.client.consumer._records import OffsetAndMetadata, OffsetAndTimestamp, TopicPartition
from dmq.client.consumer._shell import ConsumerShell, topic_list
from dmq.client.consumer._subscription import EARLIEST, LATEST, SubscriptionState
from dmq.client.consumer._times import timestamp_of, timestamp_request
from dmq.client.errors import (
    ClientClosedError,
    CommitFailedError,
    DMQError,
    DMQTimeoutError,
    IllegalStateError,
    InvalidArgumentError,
    InvalidConfigError,
    from_rpc_error,
)
from dmq.client.records import ConsumerRecord

log = get_logger(__name__)

__all__ = ["AsyncConsumer"]

DEFAULT_CLOSE_TIMEOUT_S = 30.0
LEAVE_TIMEOUT_S = 5.0
_CONFIG_NAMES = frozenset(f.name for f in fields(ConsumerConfig) if f.init)


def consumer_config(bootstrap_servers: Any, group_id: Any, config: ConsumerConfig | None,
                    settings: Mapping[str, Any]) -> ConsumerConfig:
    """A ConsumerConfig from aiokafka-style arguments; an unknown setting is named."""
    if config is not None:
        if settings or bootstrap_servers is not None or group_id is not None:
            raise InvalidConfigError("give either config=ConsumerConfig(...) or settings, not both")
        return config
    reject_unknown("AsyncConsumer", {k: v for k, v in settings.items() if k not in _CONFIG_NAMES},
                   _CONFIG_NAMES | {"bootstrap_servers"})
    values = dict(settings)
    if bootstrap_servers is not None:
        if "metadata_service_url" in values:
            raise InvalidConfigError("give bootstrap_servers or metadata_service_url, not both")
        values["metadata_service_url"] = bootstrap_address(bootstrap_servers)
    elif "metadata_service_url" not in values:
        raise InvalidConfigError("bootstrap_servers is required: the coordinator's 'host:port'")
    if group_id is None:
        raise InvalidConfigError("group_id is required: the application's consumer group name")
    values["group_id"] = group_id
    return ConsumerConfig(**values)


class AsyncConsumer(ConsumerShell):
    """Consume topics as a member of a consumer group, from asyncio code."""

    def __init__(
        self,
        *topics: str,
        bootstrap_servers: str | list[str] | None = None,
        group_id: str | None = None,
        config: ConsumerConfig | None = None,
        listener: ConsumerRebalanceListener | None = None,
        **settings: Any,
    ) -> None:
        self.config = consumer_config(bootstrap_servers, group_id, config, settings)
        if not all(isinstance(t, str) and t for t in topics):
            raise InvalidArgumentError(f"topics must be non-empty strings, got {topics!r}")
        self._initial_topics = list(topics)
        self._initial_listener = listener
        self.consumer_id = f"{self.config.client_id}-{uuid.uuid4().hex[:12]}"
        self._subs = SubscriptionState()
        self._core = ConsumerCore(self.config, self._subs, self._to_commit, log.bind(consumer=self.consumer_id),
                                  now=time.monotonic())
        self._memberships: dict[str, Membership] = self._core.memberships  # the core's, read here
        # Records fetched for getone() / async for and not all handed out yet, in fetch order
        self._pending: deque[Chunk] = deque()
        # The iterator of the chunk __anext__ hands records out of (one of the chunks' own)
        self._draining: Iterator[ConsumerRecord] = iter(())
        self._auto_commits: set[asyncio.Future[Any]] = set()
        self._manual: set[TopicPartition] = set()  # no assign() here: every partition comes from a group
        self._deserializing = self.config.key_deserializer is not None or self.config.value_deserializer is not None
        self._lock: asyncio.Lock | None = None
        self._coordinating: asyncio.Future[None] | None = None  # group work in flight (see _coordination)
        self._started = False
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "started" if self._started else "not started"
        return f"<AsyncConsumer id={self.consumer_id!r} group_id={self.config.group_id!r} topics={list(self._memberships)} {state}>"

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Build the client on this loop and join the groups of the topics given to the
        constructor (errors a person must fix, like an unknown topic, are raised here)."""
        if self._closed:
            raise ClientClosedError("this AsyncConsumer is stopped; create a new one")
        if self._started:
            return
        c = self.config
        self._cluster = AsyncCluster(c.address, request_timeout_ms=c.request_timeout_ms, security=c.security)
        self._wakeup = Wakeup()
        # Fetches are tasks on this loop (AsyncCluster.start_unary), not calls on a thread pool.
        self._fetcher = Fetcher(self._cluster, self._subs, c, self._wakeup,
                                name=self.consumer_id, start=self._cluster.start_unary)
        self._groups = GroupClient(self._cluster, c, self.consumer_id)
        self._offsets = OffsetClient(self._cluster, c)
        self._retry = RetryPolicy(retry_backoff_ms=c.retry_backoff_ms, request_timeout_ms=c.request_timeout_ms)
        self._positions = PositionFinder(self._cluster, self._offsets, self._subs, c, self._wakeup)
        self._heartbeat = Heartbeats(self._cluster, self.consumer_id, c, self._wakeup, self._poll_age_s)
        self._lock = asyncio.Lock()
        self._core = ConsumerCore(c, self._subs, self._to_commit, log.bind(consumer=self.consumer_id),
                                  now=time.monotonic())  # auto-commits count from start()
        self._memberships = self._core.memberships
        self._started = True
        try:
            await self._cluster.acheck_reachable()
        except BaseException:
            await self.stop()
            raise
        if self._initial_topics:
            try:
                await self.subscribe(self._initial_topics, self._initial_listener)
            except BaseException:
                await self.stop()
                raise

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- subscription ----------------------------------------------------------------------------

    async def subscribe(self, topics: str | Iterable[str], listener: ConsumerRebalanceListener | None = None) -> None:
        """Join the group of each topic (leaving those no longer named); partitions arrive in
        getmany(). A retriable failure (coordinator away) is retried by getmany()."""
        self._check_open()
        wanted = topic_list(topics)
        if not self._heartbeat.alive:
            self._heartbeat.start()
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        for topic in self._core.unwanted(wanted):
            await self._leave_topic(topic, deadline)
        self._subs.subscribe(wanted, listener)
        for m in self._core.added(wanted, self._cluster.bootstrap):
            for kind in (FIND, JOIN):
                out = await self._call(self._core.begin(m, kind))
                if out.error is not None:
                    self._core.leave(m.topic)
                    raise out.error
                if not out.succeeded:  # retriable: getmany() goes on after a backoff
                    break
                await self._apply(m, out)

    async def unsubscribe(self) -> None:
        self._check_open()
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        for topic in list(self._memberships):
            await self._leave_topic(topic, deadline)
        self._subs.subscribe((), None)

    def subscription(self) -> set[str]:
        return set(self._memberships)

    def metrics(self) -> dict[str, float]:
        """As DMQConsumer.metrics()'s Kafka-style keys (README "Metrics"): record / bytes consumed,
        Fetch request latency, records_lag_max, commit_rate / _total, rebalance_total."""
        return self._fetcher.stats.consumer_snapshot()

    def assignment(self) -> set[TopicPartition]:
        return set(self._subs.assigned()) if self._started else set()

    # -- records ---------------------------------------------------------------------------------

    async def getmany(self, *partitions: TopicPartition, timeout_ms: int = 0,
                      max_records: int | None = None) -> dict[TopicPartition, Sequence[ConsumerRecord]]:
        """Records of the owned partitions (of `partitions` only, when given), at most
        max_records (default max_poll_records), waiting up to timeout_ms for some. Rebalances
        are carried out here."""
        self._check_open()
        if not self._memberships:
            raise IllegalStateError("getmany() needs a subscription: give topics or call subscribe() first")
        limit = self.config.max_poll_records if max_records is None else max_records
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise InvalidArgumentError(f"max_records must be a positive int, got {max_records!r}")
        only = set(_tps(partitions)) if partitions else None
        assert self._lock is not None
        async with self._lock:
            self._core.poll_started(time.monotonic())
            try:
                if self._pending and self._coordinating is None:
                    out = self._take_pending(limit, only)
                    if out:
                        return out
                return await self._poll(max(0, timeout_ms) / 1000, limit, only)
            finally:
                self._core.poll_ended(time.monotonic())

    async def getone(self, *partitions: TopicPartition) -> ConsumerRecord:
        """The next record (of `partitions` only, when given), waiting as long as it takes (like
        aiokafka's); each wait inside is bounded by fetch_max_wait_ms."""
        if not partitions:
            return await self._next_record()
        while True:
            batch = await self.getmany(*partitions, timeout_ms=self.config.fetch_max_wait_ms, max_records=1)
            if batch:
                return next(iter(batch.values()))[0]

    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> ConsumerRecord:
        """The next record, for ``async for`` and anext(); StopAsyncIteration once the consumer is
        stopped. While a buffered chunk has records left this is one step of the chunk's iterator:
        no other await, no check, no bookkeeping (every stop of the hand-out ends that iterator,
        see Chunk). CPython's ``async for`` step is paid per record whatever is done here; a
        coroutine's return is that step's cheapest form in pure Python (an async generator's
        step raises a StopIteration carrying each record: ~20% dearer in isolation; a Future
        per record far more: bench/RESULTS.md, "asyncio client")."""
        for record in self._draining:
            return record
        try:
            return await self._next_record()
        except ClientClosedError:
            raise StopAsyncIteration from None

    async def _next_record(self) -> ConsumerRecord:
        """The first record of the next chunk _ready_chunk() allows, refilling the buffer (up to
        fetch_max_wait_ms per wait) until there is one; the chunk's iterator becomes the one
        __anext__ drains."""
        while True:
            chunk = self._ready_chunk()
            if chunk is not None:
                self._draining = chunk.it
                return next(chunk.it)  # _ready_chunk() gives only chunks with records left
            await self._refill()

    def _ready_chunk(self) -> Chunk | None:
        """The first buffered chunk with records left, when records may be handed out: not
        while group work runs (a hand-off's commit must cover every record returned), nor once
        stopped. Chunks drained to the end are let go here."""
        pending = self._pending
        if self._coordinating is not None or self._closed:
            return None
        while pending:
            chunk = pending[0]
            if chunk.left():
                return chunk
            pending.popleft()
        return None

    async def _refill(self) -> None:
        """Wait (up to fetch_max_wait_ms) for records to hand out one at a time."""
        batch = await self.getmany(timeout_ms=self.config.fetch_max_wait_ms)
        # getmany() gives buffered records first, taken from the front of the buffer (and new
        # ones only when none was buffered): back to the front they go, in order.
        self._pending.extendleft(Chunk(tp, records) for tp, records in reversed(batch.items()))

    def _take_pending(self, limit: int, only: set[TopicPartition] | None) -> dict[TopicPartition, Sequence[ConsumerRecord]]:
        """Buffered records first (they were fetched before anything newer), up to limit."""
        out: dict[TopicPartition, Sequence[ConsumerRecord]] = {}
        kept: deque[Chunk] = deque()
        while self._pending and limit > 0:
            chunk = self._pending.popleft()
            if only is not None and chunk.tp not in only:
                kept.append(chunk)
                continue
            taken = chunk.take(limit)
            if taken:
                had = out.get(chunk.tp)  # a partition's chunks follow each other in offset order
                out[chunk.tp] = taken if had is None else [*had, *taken]
                limit -= len(taken)
            if chunk.left():
                kept.append(chunk)
        kept.extend(self._pending)
        self._pending = kept
        return out

    def _drop_pending(self, tps: Iterable[TopicPartition]) -> None:
        gone = set(tps)
        if gone and self._pending:
            for chunk in self._pending:
                if chunk.tp in gone:
                    chunk.drop()  # an ``async for`` draining it stops at once
            self._pending = deque(c for c in self._pending if c.tp not in gone)

    async def _poll(self, timeout_s: float, limit: int,
                    only: set[TopicPartition] | None) -> dict[TopicPartition, Sequence[ConsumerRecord]]:
        deadline = time.monotonic() + timeout_s
        fetcher = self._fetcher
        self._maybe_auto_commit()
        # One turn of the loop first, even when records are buffered: fetch answers that have
        # arrived are only taken in (and the next fetch sent) when the loop runs, and an
        # application that never waits would otherwise drain and fetch in turn, not in parallel.
        await asyncio.sleep(0)
        while True:
            self._wakeup.clear()
            if self._coordination():
                fetcher.send_fetches()  # records go on arriving; none is handed out meanwhile
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return {}
                await self._wakeup.wait(remaining)  # the work's end sets the wake-up
                continue
            if self._pending:  # held while the group work ran: older than anything fetched since
                out = self._take_pending(limit, only)
                if out:
                    return out
            if self._subs.needing_position():
                self._update_positions()
            hold = frozenset(tp for tp in self._subs.assigned() if tp not in only) if only is not None else frozenset()
            collected = fetcher.collect(limit, hold)
            fetcher.send_fetches()
            if collected:
                # RecordSequences, as DMQConsumer.poll()'s: records built as the application reaches them
                if self._deserializing:  # only records new from the fetcher: buffered ones already are
                    return dict(deserialize(self.config, collected, self.seek))
                return dict(collected)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return {}
            # Answers and group flags set the wake-up; the cap covers backoffs nothing signals.
            await self._wakeup.wait(min(remaining, self.config.retry_backoff_ms / 1000 or remaining))

    # -- group coordination ----------------------------------------------------------------------

    def _coordination(self) -> bool:
        """Start the group work the memberships need (find, re-join, hand-off) as a task of its
        own, so that getmany() keeps to its timeout whatever the coordinator does (each call in
        it is bounded by request_timeout_ms). True while that work runs: no record is handed out
        then, since a hand-off's commit must cover every record returned. Raises what finished
        work raised (errors a person must fix)."""
        task = self._coordinating
        if task is not None:
            if not task.done():
                return True
            self._coordinating = None
            task.result()
        now = time.monotonic()
        if not any(self._core.wants_call(topic, now) for topic in self._memberships):
            return False
        task = self._coordinating = asyncio.ensure_future(self._coordinate())
        for chunk in self._pending:  # held while the work runs, even by an ``async for`` mid-chunk
            chunk.detach()
        wakeup = self._wakeup
        task.add_done_callback(lambda _t: wakeup.set())
        return True

    async def _coordinate(self) -> None:
        for m in list(self._memberships.values()):
            for _ in range(4):  # find, join, hand-off in one go when each succeeds at once
                if not await self._step(m):
                    break

    async def _step(self, m: Membership) -> bool:
        """Make the next group call the core says m needs (find, re-join, hand-off); False
        when there was none to make (none needed, or backing off after a failure)."""
        call = self._core.next_call(m.topic, time.monotonic())
        if call is None:
            return False
        if call.before is not None:
            try:
                await self._apply(m, call.before)
            except BaseException:
                self._core.abandon(call)  # the join is made by the next getmany()
                raise
        if call.kind == HANDOVER:
            # Commit the positions of the records handed out, so the next owner of a revoked
            # partition starts there; GetAssignment follows, answered or not.
            errors = await self._commit_now(call.offsets, {m.topic: m}, HANDOVER_COMMIT_WAIT_S)
            out = self._core.answered(call, time.monotonic(), failed={tp: str(e) for tp, e in errors.items()})
            assert out.next is not None
            call = out.next
        out = await self._call(call)
        if out.error is not None:
            raise out.error
        await self._apply(m, out)
        return True

    async def _call(self, call: GroupCall) -> Outcome:
        """Make a group call (its deadline is the request's timeout) and give the core its answer."""
        m = call.membership
        method, request, timeout_s = self._groups.request(call.kind, m)
        try:
            stub = self._cluster.group_stub(self._groups.address(call.kind, m))
            response = await getattr(stub, method)(request, timeout=timeout_s)
        except grpc.RpcError as e:
            return self._core.answered(call, time.monotonic(), error=self._groups.error(call.kind, m, e))
        except DMQError as e:
            return self._core.answered(call, time.monotonic(), error=e)
        except BaseException:
            self._core.abandon(call)  # cancelled (stop()): nothing answered
            raise
        return self._core.answered(call, time.monotonic(), response, coordinator=self._cluster.bootstrap)

    async def _apply(self, m: Membership, out: Outcome) -> None:
        await self._callbacks(self._carry_out(m, out))

    def _drop(self, tps: Iterable[TopicPartition]) -> None:
        super()._drop(tps)
        self._drop_pending(tps)  # and the records buffered for getone() / ``async for``

    async def _callbacks(self, callbacks: Iterable[tuple[str, frozenset[TopicPartition]]]) -> None:
        """The listener's callbacks, in order; a coroutine function is awaited."""
        listener = self._subs.listener
        if listener is None:
            return
        for name, partitions in callbacks:
            result = getattr(listener, name)(set(partitions))
            if inspect.isawaitable(result):
                await result

    async def _leave_topic(self, topic: str, deadline: float) -> None:
        """Commit (with auto-commit on), hand the partitions back and leave the topic's group."""
        leaving = self._core.leave(topic)
        m = leaving.membership
        if leaving.offsets:
            errors = await self._commit_now(leaving.offsets, {topic: m}, max(0.0, deadline - time.monotonic()))
            if errors:
                log.warning("final commit failed", group=m.group_id, error=str(next(iter(errors.values()))))
        callbacks = self._release(leaving)
        try:
            await self._callbacks(callbacks)
        finally:
            self._heartbeat.untrack(topic)
            await self._leave(m, min(LEAVE_TIMEOUT_S, max(0.001, deadline - time.monotonic())))

    async def _leave(self, m: Membership, timeout_s: float) -> None:
        """LeaveGroup: the partitions are released at once. Best effort (the session timeout
        is the backstop), so failures are logged."""
        request = self._groups.leave_request(m)
        if request is None:
            return
        try:
            await self._cluster.group_stub(m.coordinator).LeaveGroup(request, timeout=timeout_s)
            log.info("left group", group=m.group_id, member=request.member_id)
        except Exception as e:  # noqa: BLE001 - leaving is best effort
            log.warning("leave failed; the session timeout will remove the member", group=m.group_id,
                        member=request.member_id, error=str(e))

    # -- commits ---------------------------------------------------------------------------------

    def _to_commit(self, topic: str | None = None, only_changed: bool = True) -> dict[TopicPartition, OffsetAndMetadata]:
        """Positions after the last record HANDED OUT, per owned partition: records buffered for
        getone() are not consumed yet."""
        positions = {tp: p for tp, p in self._subs.consumed().items() if topic is None or tp.topic == topic}
        seen: set[TopicPartition] = set()
        for chunk in self._pending:  # a partition's chunks are in fetch order: the first with records left counts
            tp = chunk.tp
            if tp in positions and tp not in seen and (offset := chunk.next_offset()) is not None:
                seen.add(tp)
                positions[tp] = offset
        return {tp: OffsetAndMetadata(p) for tp, p in positions.items()
                if not (only_changed and self._subs.state(tp).committed == p)}

    async def _commit_now(self, offsets: Mapping[TopicPartition, OffsetAndMetadata],
                          memberships: Mapping[str, Membership], timeout_s: float) -> dict[TopicPartition, DMQError]:
        """Commit per broker in parallel, within timeout_s; the partitions left and why."""
        if not offsets:
            return {}
        for topic in {tp.topic for tp in offsets}:
            try:
                await self._cluster.metadata(topic, timeout_s)
            except DMQError as e:
                if not self._cluster.knows(topic):
                    return dict.fromkeys(offsets, e)
        calls, errors = self._offsets.commit_calls(offsets, memberships, timeout_s=0)
        self._fetcher.stats.committed()
        tasks = {self._cluster.start_call(self._commit_one(call, max(0.001, timeout_s))): call for call in calls}
        if tasks:
            await asyncio.wait(tasks, timeout=max(0.0, timeout_s))
        for task, call in tasks.items():
            err: DMQError
            if not task.done():
                task.cancel()
                err = DMQTimeoutError(f"commit to broker {call.address} did not answer within {timeout_s:.3g} s")
            elif task.cancelled():  # by aclose()
                err = DMQError("commit cancelled: the consumer closed")
            elif (error := task.exception()) is None:
                self._subs.mark_committed({tp: o.offset for tp, o in call.offsets.items()})
                continue
            else:
                err = error if isinstance(error, DMQError) else DMQError(f"commit to broker {call.address}: {error!r}")
            errors.update(dict.fromkeys(call.offsets, err))
        return errors

    async def _commit_one(self, call: CommitCall, timeout_s: float) -> None:
        """One CommitOffsets; a refusal raised as the OffsetClient maps it (CommitFailedError)."""
        try:
            await self._cluster.broker_stub(call.address).CommitOffsets(call.request, timeout=timeout_s)
        except grpc.RpcError as e:
            raise self._offsets.commit_error(e, call) from e
        except ValueError as e:  # the channel was closed under the call
            raise DMQError(f"commit not sent: {e}") from e

    async def commit(self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None) -> None:
        """Commit `offsets` (the next offset to consume, per partition), or the positions of
        every record handed out, within request_timeout_ms. CommitFailedError when this consumer
        no longer owns a partition; DMQTimeoutError when a broker did not answer in time."""
        self._check_open()
        if offsets is None:
            # Refused for a member that lost its group even when no position moved (Kafka's rule).
            self._core.check_can_commit(self._to_commit(only_changed=False))
            normalised = self._to_commit()
        else:
            normalised = commit_offsets(offsets)
            self._core.check_can_commit(normalised)
        errors = await self._commit_now(normalised, self._memberships, self.config.request_timeout_ms / 1000)
        if not errors:
            return
        error = next((e for e in errors.values() if not e.retriable), next(iter(errors.values())))
        if isinstance(error, CommitFailedError):
            self._core.commit_refused({tp.topic for tp in errors})
        raise error

    def _maybe_auto_commit(self) -> None:
        """Commit the handed-out positions in the background every auto_commit_interval_ms (the
        previous auto-commit must have answered first)."""
        if self._auto_commits:
            return
        offsets = self._core.auto_commit(time.monotonic())
        if not offsets:
            return
        task = asyncio.ensure_future(self._commit_now(offsets, self._memberships, self.config.request_timeout_ms / 1000))
        self._auto_commits.add(task)
        task.add_done_callback(self._auto_commit_done)

    def _auto_commit_done(self, task: asyncio.Future[Any]) -> None:
        self._auto_commits.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        errors = task.result() if error is None else {}
        if error is not None or errors:
            log.warning("auto-commit failed", error=str(error or next(iter(errors.values()))))
            if any(isinstance(e, CommitFailedError) for e in errors.values()):
                self._core.commit_refused()

    async def committed(self, partition: TopicPartition) -> int | None:
        """The group's committed offset of a partition (the next offset to consume), or None.

        Retriable answers (a broker starting, which answers UNAVAILABLE until its commits are
        loaded; a leader that moved) are retried until request_timeout_ms, as the synchronous
        consumer's committed() does."""
        self._check_open()
        tp = _tp(partition)
        m = self._memberships.get(tp.topic)
        group_id = m.group_id if m is not None else group_id_for(tp.topic, self.config.group_id)
        deadline = self._retry.deadline()

        def on_retry(e: DMQError, pause_s: float) -> None:
            if e.invalid_metadata:
                self._cluster.invalidate(tp.topic)
            log.info("reading the committed offset failed; retrying", partition=str(tp),
                     retry_in_ms=int(pause_s * 1000), error=str(e))

        return await retry_call_async(lambda: self._committed_once(tp, group_id, deadline), policy=self._retry,
                                      deadline=deadline, on_retry=on_retry)

    async def _committed_once(self, tp: TopicPartition, group_id: str, deadline: float) -> int | None:
        await self._cluster.metadata(tp.topic, max(0.001, deadline - time.monotonic()))
        address = self._cluster.leader_for(tp.topic, tp.partition)
        try:  # the call's own deadline bounds the wait
            response = await self._cluster.broker_stub(address).FetchCommittedOffsets(
                OffsetClient.committed_request(group_id, [tp]),
                timeout=self._offsets.call_timeout_s(deadline - time.monotonic()))
        except grpc.RpcError as e:
            raise from_rpc_error(e, context=f"FetchCommittedOffsets of {tp} from broker {address}") from e
        found = OffsetClient.parse_committed(response).get(tp)
        return None if found is None else found.offset

    # -- look-ups (aiokafka's) --------------------------------------------------------------------

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        """The topic's partition numbers from the metadata known (None: not known, as aiokafka's,
        which also answers from its cache; ``await topics()`` refreshes it)."""
        self._check_open()
        if not self._cluster.knows(topic):
            return None
        return set(range(self._cluster.topic_metadata(topic).partition_count))

    async def topics(self) -> set[str]:
        """The names of every topic, asked of the coordinator now."""
        self._check_open()
        await self._cluster.wait_refresh(None)
        return set(self._cluster.topic_names())

    async def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The first offset still in each partition's log (its log start)."""
        return await self._list_offsets({tp: EARLIEST for tp in _tps((partitions,))})

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The offset the next record produced to each partition will get (its log end)."""
        return await self._list_offsets({tp: LATEST for tp in _tps((partitions,))})

    async def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Per partition, OffsetAndTimestamp(the first record appended at or after the time
        (epoch ms), that record's timestamp); None when no record is that recent (aiokafka's)."""
        queries = time_queries(timestamps)
        found = await self._list_offsets(queries)
        ends = await self._list_offsets(dict.fromkeys(queries, LATEST))
        out: dict[TopicPartition, OffsetAndTimestamp | None] = dict.fromkeys(queries)
        for tp in queries:
            if found[tp] < ends[tp]:
                out[tp] = OffsetAndTimestamp(found[tp], await self._timestamp_at(tp, found[tp]))
        return out

    async def _timestamp_at(self, tp: TopicPartition, offset: int) -> int:
        address = self._cluster.leader_for(tp.topic, tp.partition)
        try:
            answer = await self._cluster.raw_fetch(address)(timestamp_request(tp, offset), timeout=self._cluster.timeout_s)
        except grpc.RpcError as e:
            raise from_rpc_error(e, context=f"Fetch of {tp} offset {offset} from broker {address}") from e
        return timestamp_of(answer, tp, offset, address)

    async def _list_offsets(self, queries: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """ListOffsets of each partition from its leader, the brokers asked in parallel."""
        self._check_open()
        by_leader: dict[str, dict[TopicPartition, int]] = {}
        for tp, ts in queries.items():
            await self._cluster.metadata(tp.topic, self.config.request_timeout_ms / 1000)
            by_leader.setdefault(self._cluster.leader_for(tp.topic, tp.partition), {})[tp] = ts
        # The brokers in parallel, each call bounded by its own deadline (request_timeout_ms); the
        # first failure, in the brokers' order, is raised once all have answered.
        tasks = [self._cluster.start_call(self._list_offsets_at(address, part)) for address, part in by_leader.items()]
        try:
            if tasks:
                await asyncio.wait(tasks)
        finally:
            for task in tasks:
                task.cancel()  # those still running when this is cancelled (a no-op once done)
        out: dict[TopicPartition, int] = {}
        for task in tasks:
            if task.cancelled():  # by aclose()
                raise ClientClosedError("ListOffsets cancelled: the consumer stopped")
            for tp, value in OffsetClient.parse_list_offsets(task.result()).items():
                if isinstance(value, DMQError):
                    raise value
                out[tp] = value
        return out

    async def _list_offsets_at(self, address: str, queries: Mapping[TopicPartition, int]) -> Any:
        try:
            return await self._cluster.broker_stub(address).ListOffsets(
                OffsetClient.list_offsets_request(queries), timeout=self._offsets.call_timeout_s(None))
        except grpc.RpcError as e:
            raise from_rpc_error(e, context=f"ListOffsets from broker {address}") from e

    # -- positions -------------------------------------------------------------------------------

    async def position(self, partition: TopicPartition) -> int:
        """The offset of the next record getmany() / getone() will return for an assigned partition."""
        self._check_open()
        tp, state = self._assigned_state(partition, "position()")
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        while state.position is None and (wait_s := self._position_wait_s(tp, state, deadline)) is not None:
            await self._wakeup.wait(wait_s)
        handed = self._to_commit(topic=tp.topic, only_changed=False).get(tp)
        position = self._subs.state(tp).position
        assert position is not None
        return position if handed is None else handed.offset

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Make the next getmany() / getone() return records of `partition` from `offset` on."""
        self._check_open()
        check_seek_offset(offset)
        tp, _ = self._assigned_state(partition, "seek()")
        self._subs.seek(tp, offset)
        self._fetcher.drop(tp)
        self._drop_pending([tp])

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Move to the log start of the given partitions (every assigned one when none given)."""
        self._seek_to(EARLIEST, partitions, "seek_to_beginning()")

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Move to the log end: only records produced from now on are returned."""
        self._seek_to(LATEST, partitions, "seek_to_end()")

    def _seek_to(self, where: int, partitions: tuple[TopicPartition, ...], what: str) -> None:
        self._check_open()
        tps = [self._assigned_state(tp, what)[0] for tp in (_tps(partitions) or self._subs.assigned())]
        for tp in tps:
            self._subs.request_reset(tp, where)
            self._fetcher.drop(tp)
        self._drop_pending(tps)

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop fetching and returning records of these partitions until resume()."""
        self._check_open()
        tps = [self._assigned_state(tp, "pause()")[0] for tp in _tps(partitions)]
        # Records buffered but not handed out are dropped, and the position moved back to the
        # first of them, so resume() fetches them again.
        unhanded = self._to_commit(only_changed=False)
        for tp in tps:
            if any(c.tp == tp for c in self._pending):
                self._subs.seek(tp, unhanded[tp].offset)
            self._subs.pause(tp)
            self._fetcher.drop(tp)
        self._drop_pending(tps)

    def resume(self, *partitions: TopicPartition) -> None:
        self._check_open()
        for tp in [self._assigned_state(tp, "resume()")[0] for tp in _tps(partitions)]:
            self._subs.resume(tp)

    def paused(self) -> set[TopicPartition]:
        return self._subs.paused() if self._started else set()

    # -- stop ------------------------------------------------------------------------------------

    async def stop(self, timeout: float | None = None) -> None:
        """Commit (with auto-commit on), hand the partitions back, leave the groups and end every
        task, within `timeout` seconds (default 30). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if not self._started:
            return
        for chunk in self._pending:  # an ``async for`` mid-chunk ends; the commits below still see the rest
            chunk.detach()
        deadline = time.monotonic() + (DEFAULT_CLOSE_TIMEOUT_S if timeout is None else max(0.0, timeout))
        try:
            work = self._coordinating
            if work is not None and not work.done():
                # A hand-off half done is finished by leaving: the commit below covers it.
                work.cancel()
                await asyncio.wait({work}, timeout=max(0.0, deadline - time.monotonic()))
            if self._auto_commits:
                await asyncio.wait(set(self._auto_commits), timeout=max(0.0, deadline - time.monotonic()))
            for topic in list(self._memberships):
                try:
                    await self._leave_topic(topic, deadline)
                except Exception as e:  # noqa: BLE001 - stopping must finish whatever a listener does
                    log.warning("error while leaving a group", topic=topic, error=str(e))
        finally:
            self._pending.clear()
            for task in list(self._auto_commits):
                task.cancel()
            await self._heartbeat.astop()
            self._positions.close()
            self._fetcher.close()
            await self._cluster.aclose()
            log.info("consumer stopped", consumer=self.consumer_id)

    close = stop

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("this AsyncConsumer is stopped; create a new one")
        if not self._started:
            raise IllegalStateError("call `await consumer.start()` (or use `async with`) first")
