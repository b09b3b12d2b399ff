"""DMQConsumer: the consumer-group client (subscribe / poll / commit).

It composes the parts, which never import each other (STYLE.md, after aiokafka):

    SubscriptionState  what is assigned and where consumption stands   (_subscription.py)
    Fetcher            pipelined fetches, lazy decoding                 (_fetcher.py)
    GroupClient        memberships: find/join/assignment/leave RPCs     (_group.py)
    HeartbeatThread    heartbeats, watch streams, poll watchdog         (_heartbeat.py)
    OffsetClient       commit / committed / list offsets                (_offsets.py)
    PositionFinder     position look-ups of new partitions              (_positions.py)

Threads: everything here runs on the application's thread, which must be one thread at a time
(like Kafka's consumer, the object is not thread-safe). The heartbeat thread only sets flags on
memberships; gRPC threads only complete futures; both then set ``_wakeup`` so a poll() waiting
for data wakes up.

Nothing in poll() waits for the network beyond its timeout: every call it makes (group calls,
commits, position look-ups, fetches, metadata refreshes) is started as a future with its own
deadline and finished by a later iteration or a later poll() when it has answered. Each broker
has its own calls, so a dead or stopped broker holds up only its own partitions, and fetching
needs no coordinator, so a coordinator outage stops nothing but rebalances.

poll(), step by step:
  1. run the callbacks of finished commit_async() calls;
  2. auto-commit: positions returned by earlier polls, async, per broker, at most every
     auto_commit_interval_ms;
  3. per membership, one group call at a time: find the group (if subscribe() could not),
     re-join if the coordinator forgot us (partitions lost); if the heartbeat thread flagged a
     new generation, commit the returned positions (holding those partitions' records until
     their broker answered), then GetAssignment (this is what hands revoked partitions to
     their new owner, who starts at that commit), drop fetched data of revoked partitions,
     call the listener. Failed calls are retried after retry_backoff_ms, doubling up to 1 s;
  4. look up the positions of new partitions: committed offset, else the group's start
     position (exact offset, log start, or by subscription time), per broker;
  5. return buffered records (max_poll_records) and start the next fetches before returning,
     or wait for a fetch / a rebalance / an answer until the timeout.
"""

from __future__ import annotations

import concurrent.futures
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import grpc

from dmq.client._calls import Backoffs, RetryPolicy
from dmq.client._log import get_logger
from dmq.client._cluster import Cluster
from dmq.client.consumer._config import ConsumerConfig
from dmq.client.consumer._fetcher import Fetcher
from dmq.client.consumer._group import GroupClient, Membership, group_id_for
from dmq.client.consumer._heartbeat import HeartbeatThread
from dmq.client.consumer._listener import ConsumerRebalanceListener
from dmq.client.consumer._offsets import OffsetClient
from dmq.client.consumer._positions import PositionFinder
from dmq.client.consumer._records import ConsumerRecords, OffsetAndMetadata, OffsetAndTimestamp, TopicPartition
from dmq.client.consumer._subscription import (
    EARLIEST,
    LATEST,
    START_AT_LOG_START,
    START_BY_TIMESTAMP,
    SubscriptionState,
)
from dmq.client.consumer._times import record_timestamps
from dmq.client.errors import (
    ClientClosedError,
    CommitFailedError,
    DMQError,
    DMQTimeoutError,
    GroupNotFoundError,
    IllegalStateError,
    InvalidArgumentError,
    ResourceExhaustedError,
    SerializationError,
    TopicNotFoundError,
    UnknownMemberError,
)

log = get_logger(__name__)

CommitCallback = Callable[[dict[TopicPartition, OffsetAndMetadata], Exception | None], None]


# close() gives up on what the cluster has not answered by then (Kafka's close() default).
DEFAULT_CLOSE_TIMEOUT_S = 30.0
LEAVE_TIMEOUT_S = 5.0
# How long a hand-off waits for its commits before asking for the new assignment anyway.
# Healthy brokers answer in milliseconds; a stopped one would otherwise hold the rebalance (and
# this member's other partitions, held meanwhile) for a whole request timeout.
HANDOVER_COMMIT_WAIT_S = 1.0
MAX_GROUP_BACKOFF_MS = 1_000
_OP_WHAT = {"find": "finding the group", "join": "joining the group", "handover": "committing before the hand-off",
            "assignment": "fetching the assignment"}


class _GroupOp:
    """A membership's group call in flight: one future (find, join, assignment) or the
    per-broker commit futures of a hand-off, with the partitions a hand-off holds back."""

    __slots__ = ("kind", "futures", "commits", "held", "released", "wait_until")

    def __init__(self, kind: str, futures: list[Any], held: frozenset[TopicPartition] = frozenset()) -> None:
        self.kind = kind
        self.futures = futures
        self.commits: dict[Any, frozenset[TopicPartition]] = {}  # hand-off commit future -> its partitions
        self.held = held  # poll() returns none of their records while this is in flight...
        self.released: set[TopicPartition] = set()  # ...except these (their commit failed)
        self.wait_until = float("inf")  # a hand-off goes on without commits still out by then

    def __repr__(self) -> str:
        return f"<_GroupOp {self.kind} done={self.done()} held={len(self.held)} released={len(self.released)}>"

    def done(self) -> bool:
        return all(f.done() for f in self.futures) or time.monotonic() >= self.wait_until


class DMQConsumer:
    """Consume topics as a member of a consumer group. Use as a context manager, or call close()."""

    def __init__(self, *topics: str | ConsumerConfig, config: ConsumerConfig | None = None, **settings: Any) -> None:
        """``DMQConsumer(ConsumerConfig(...))``, ``DMQConsumer(bootstrap_servers=..., group_id=...)``,
        or kafka-python's ``DMQConsumer("topic", ..., bootstrap_servers=..., group_id=...)``, which
        also subscribes to the topics."""
        if topics and isinstance(topics[0], ConsumerConfig):
            if config is not None:
                raise InvalidArgumentError("give the ConsumerConfig once")
            config, topics = topics[0], topics[1:]
        if not all(isinstance(t, str) for t in topics):
            raise InvalidArgumentError(
                f"DMQConsumer takes topic names (str) and keyword settings, got {[type(t).__name__ for t in topics]}"
            )
        if config is None:
            config = ConsumerConfig(**settings)
        elif settings:
            raise InvalidArgumentError("give either a ConsumerConfig or keyword settings, not both")
        self.config = config
        self.consumer_id = f"{config.client_id}-{uuid.uuid4().hex[:12]}"
        self._log = log.bind(consumer=self.consumer_id)
        self._cluster = Cluster(config.address, request_timeout_ms=config.request_timeout_ms, security=config.security)
        try:
            # A wrong address fails here, naming it (kafka-python's NoBrokersAvailable), not as
            # poll() after poll() returning nothing.
            self._cluster.check_reachable()
        except BaseException:
            self._cluster.close()
            raise
        self._wakeup = threading.Event()
        self._subs = SubscriptionState()
        self._fetcher = Fetcher(self._cluster, self._subs, config, self._wakeup, name=self.consumer_id)
        self._groups = GroupClient(self._cluster, config, self.consumer_id)
        self._offsets = OffsetClient(self._cluster, config)
        self._positions = PositionFinder(self._cluster, self._offsets, self._subs, config, self._wakeup)
        self._memberships: dict[str, Membership] = {}
        self._ops: dict[str, _GroupOp] = {}  # topic -> the membership's group call in flight
        # group calls per topic: up to 1 s apart, so a returning coordinator is found within about a second
        self._backoff: Backoffs[str] = Backoffs(RetryPolicy(self.config.retry_backoff_ms, MAX_GROUP_BACKOFF_MS))
        self._auto_commits: dict[str, concurrent.futures.Future[Any]] = {}  # broker -> last auto-commit
        self._heartbeat = HeartbeatThread(self.consumer_id, config, self._wakeup, self._poll_age_s,
                                          router=self._cluster.coordinator_router)
        self._last_poll = time.monotonic()
        self._in_poll = False
        self._next_auto_commit = time.monotonic() + config.auto_commit_interval_ms / 1000
        self._commits_in_flight: set[concurrent.futures.Future[Any]] = set()
        self._finished_commits: deque[tuple[CommitCallback | None, concurrent.futures.Future[Any]]] = deque()
        self._closed = False
        # The Kafka-style API (methods at the end of the class): partitions given to assign()
        # (read without a group), a subscribe(pattern=...) and its listing in flight, counters.
        self._manual: set[TopicPartition] = set()
        self._pattern: re.Pattern[str] | None = None
        self._pattern_listing: concurrent.futures.Future[None] | None = None
        self._pattern_listener: ConsumerRebalanceListener | None = None
        self._next_pattern_listing = 0.0
        self._counters = {"polls": 0, "records_returned": 0}
        # ``for record in consumer``: the records of the last poll() per partition, an iterator
        # over them all, how many there are and how many were handed out (see __next__ and
        # _hand_back_unreturned). The records are built as the iterator reaches them.
        self._iter_parts: list[Sequence[Any]] = []
        self._iter_records: Iterator[Any] = iter(())
        self._iter_count = 0
        self._iter_next = 0
        if topics:
            try:
                self.subscribe(list(topics))  # type: ignore[arg-type]
            except BaseException:
                self.close(0)  # stops the heartbeat thread subscribe() started
                raise

    def __repr__(self) -> str:
        return (
            f"<DMQConsumer id={self.consumer_id!r} group_id={self.config.group_id!r} "
            f"topics={list(self._subs.topics)} assigned={sorted(map(str, self._subs.assigned()))} "
            f"closed={self._closed}>"
        )

    # -- context manager -------------------------------------------------------------------------

    def __enter__(self) -> DMQConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- iteration (kafka-python's ``for record in consumer``) -----------------------------------

    def __iter__(self) -> DMQConsumer:
        return self

    def __next__(self) -> Any:
        """The next record; StopIteration once none came for consumer_timeout_ms (default:
        never), or when the consumer is closed. Records are fetched a poll() at a time and
        handed out one by one: a record counts as consumed (positions, commits) only once
        handed out, so leaving the loop and committing or closing never covers the rest."""
        i = self._iter_next
        if i < self._iter_count:
            self._iter_next = i + 1
            return next(self._iter_records)
        if self._closed:
            raise StopIteration
        deadline = time.monotonic() + self.config.consumer_timeout_ms / 1000
        while True:
            batch = self.poll(max(0.0, deadline - time.monotonic()) * 1000)
            if batch:
                self._iter_parts = list(batch.values())
                self._iter_records = iter(batch)
                self._iter_count, self._iter_next = len(batch), 1
                return next(self._iter_records)
            if time.monotonic() >= deadline:
                raise StopIteration

    def _hand_back_unreturned(self) -> None:
        """Move each partition back to the first record of the iterator's batch not handed out
        yet (poll() advanced it past the whole batch): called before anything reads, commits or
        sets positions, and by poll(), which then returns those records again."""
        if self._iter_next >= self._iter_count:
            return
        skip, parts = self._iter_next, self._iter_parts
        self._iter_parts, self._iter_records, self._iter_count, self._iter_next = [], iter(()), 0, 0
        firsts: dict[TopicPartition, int] = {}
        for part in parts:  # handed out in order: the first `skip` records, then none
            if skip >= len(part):
                skip -= len(part)
                continue
            r = part[skip]
            skip = 0
            firsts.setdefault(TopicPartition(r.topic, r.partition), r.offset)
        for tp, offset in firsts.items():
            if self._subs.get(tp) is not None:
                self._subs.seek(tp, offset)
                self._fetcher.drop(tp)

    # -- subscription ----------------------------------------------------------------------------

    def subscribe(
        self,
        topic_or_topics: str | Iterable[str] | None = None,
        listener: ConsumerRebalanceListener | None = None,
        *,
        pattern: str | re.Pattern[str] | None = None,
    ) -> None:
        """Join the group of each topic (``G_<topic>_<group_id>``); partitions arrive in poll().

        ``pattern=`` (a regular expression, matched in full against topic names) subscribes to
        every matching topic, and to topics that start matching later: poll() lists the topics
        again every metadata_max_age_ms.

        The group's subscription mode is recorded when it is first created, here: a group
        subscribing with mode ``new`` reads everything produced after this call returns. When
        the coordinator cannot be reached (a retriable error, logged with its address), the
        group is found and joined by poll() instead, within poll()'s timeout; errors a person
        must fix (no such topic, bad setting) are raised here.
        """
        self._check_open()
        self._hand_back_unreturned()
        if self._manual:
            raise IllegalStateError("subscribe() after assign(): call unsubscribe() first (a consumer either "
                                    "assigns its partitions itself or is given them by a group)")
        if pattern is not None or topic_or_topics is None:
            self._subscribe_pattern(topic_or_topics, pattern, listener)
            return
        self._pattern = None
        topics = [topic_or_topics] if isinstance(topic_or_topics, str) else list(topic_or_topics)
        self._subscribe_topics(topics, listener)

    def _subscribe_topics(self, topics: list[str], listener: ConsumerRebalanceListener | None) -> None:
        if not topics or not all(isinstance(t, str) and t for t in topics):
            raise InvalidArgumentError("subscribe() needs a topic name or a non-empty list of topic names")
        if not self._heartbeat.alive:
            self._heartbeat.start()
        wanted = list(dict.fromkeys(topics))
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        for topic in [t for t in self._memberships if t not in wanted]:
            self._leave_topic(topic, call_listener=True, deadline=deadline)
        self._subs.subscribe(wanted, listener)
        for topic in wanted:
            if topic in self._memberships:
                continue
            m = Membership.pending(topic, group_id_for(topic, self.config.group_id), self._cluster.bootstrap)
            self._memberships[topic] = m
            try:
                for kind, start, finish in (("find", self._groups.start_find, self._groups.finish_find),
                                            ("join", self._groups.start_join, self._groups.finish_join)):
                    future = start(topic if kind == "find" else m)  # type: ignore[arg-type]
                    if not _wait(future, deadline - time.monotonic()):
                        # Still unanswered at the deadline: poll() finishes it.
                        self._start(m, kind, future)
                        break
                    finish(m, future)
                else:
                    self._heartbeat.track(m)
            except DMQError as e:
                if not e.retriable:
                    self._memberships.pop(topic, None)
                    raise
                self._group_failed(m, "subscribing", e)

    def unsubscribe(self) -> None:
        """Commit (with auto-commit), hand back every partition and leave every group, within
        request_timeout_ms."""
        self._check_open()
        self._hand_back_unreturned()
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        for topic in list(self._memberships):
            self._leave_topic(topic, call_listener=True, deadline=deadline)
        self._subs.subscribe((), None)
        self._pattern = None
        for tp in self._manual:
            self._subs.remove(tp)
            self._fetcher.drop(tp)
        self._manual.clear()

    def subscription(self) -> set[str]:
        return set(self._subs.topics)

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer owns now."""
        return set(self._subs.assigned())

    # -- poll ------------------------------------------------------------------------------------

    def poll(self, timeout_ms: float = 0, max_records: int | None = None, *, timeout: object = None) -> ConsumerRecords:
        """Records fetched for the owned partitions, at most max_poll_records (or `max_records`),
        waiting up to `timeout_ms` milliseconds for some: kafka-python's poll(timeout_ms=0,
        max_records=None), the first positional argument included (``poll(1000)`` waits 1 s).
        Rebalances are carried out here, on this thread.

        poll() returns within `timeout_ms` (plus the time of the rebalance listener's callbacks)
        whatever the cluster does: group, commit, position and metadata calls are started here
        and finished by a later poll() when they answer; nothing waits for a dead broker or an
        absent coordinator."""
        self._check_open()
        timeout_s, limit = self._poll_arguments(timeout_ms, max_records, timeout)
        if self._iter_next < self._iter_count:
            self._hand_back_unreturned()
        if not self._memberships and not self._manual and self._pattern is None:
            raise IllegalStateError("poll() needs a subscription: call subscribe(topic) or assign(partitions) first")
        self._counters["polls"] += 1
        now = time.monotonic()
        deadline = now + timeout_s
        self._in_poll = True
        self._last_poll = now
        try:
            self._run_commit_callbacks()
            self._maybe_auto_commit(now)
            fetcher = self._fetcher
            while True:
                self._wakeup.clear()
                if self._pattern is not None:
                    self._follow_pattern()
                self._coordinate()
                if self._subs.needing_position():
                    self._update_positions()
                records: Mapping[TopicPartition, Sequence[Any]] = fetcher.collect(limit, self._held())
                fetcher.send_fetches()
                if records:
                    if self.config.key_deserializer is not None or self.config.value_deserializer is not None:
                        records = self._deserialize(records)
                    self._counters["records_returned"] += sum(map(len, records.values()))
                    return ConsumerRecords(records)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return ConsumerRecords()
                # Fetch answers, look-ups, group calls and rebalance flags set _wakeup; the cap
                # covers retry backoffs and background metadata refreshes, which nothing signals.
                self._wakeup.wait(min(remaining, self.config.retry_backoff_ms / 1000 or remaining))
        finally:
            self._in_poll = False
            self._last_poll = time.monotonic()

    def _poll_age_s(self) -> float:
        """Seconds since the application last called poll(); 0 while inside poll()."""
        return 0.0 if self._in_poll else time.monotonic() - self._last_poll

    # -- group coordination (application thread, never blocking) ----------------------------------

    def _coordinate(self) -> None:
        for m in list(self._memberships.values()):
            self._step(m)

    def _step(self, m: Membership) -> None:
        """Finish m's group call if it answered, then start the next one m needs (one at a
        time per membership): find the group, (re-)join, commit before the hand-off, fetch the
        assignment. Retriable failures are retried after a backoff; others are raised."""
        op = self._ops.get(m.topic)
        if op is not None:
            if not op.done():
                return
            del self._ops[m.topic]
            self._finish(m, op)
            if m.topic in self._ops:
                return
        retry_at = self._backoff.retry_at(m.topic)
        if retry_at > time.monotonic():
            return
        if not m.found:
            self._start(m, "find", self._groups.start_find(m.topic))
        elif m.rejoin_reason is not None or not m.joined:
            self._drop_lost(m)
            self._start(m, "join", self._groups.start_join(m))
        elif m.assignment_stale:
            m.assignment_stale = False
            self._start_handover(m)

    def _start(self, m: Membership, kind: str, future: Any) -> None:
        wakeup = self._wakeup
        future.add_done_callback(lambda _f: wakeup.set())
        self._ops[m.topic] = _GroupOp(kind, [future])

    def _finish(self, m: Membership, op: _GroupOp) -> None:
        try:
            if op.kind == "find":
                self._groups.finish_find(m, op.futures[0])
            elif op.kind == "join":
                try:
                    self._groups.finish_join(m, op.futures[0])
                except GroupNotFoundError:
                    # Deleted between FindOrCreateGroup and now (an empty group can be): find it again.
                    m.found = False
                    return
                self._heartbeat.track(m)
            elif op.kind == "handover":
                self._finish_handover(m, op)
                self._start_assignment(m, op)
                return
            else:
                self._apply_assignment(m, op.futures[0])
        except UnknownMemberError as e:
            m.rejoin_reason = str(e)
            self._wakeup.set()
            return
        except DMQError as e:
            if not e.retriable:
                raise
            if op.kind == "assignment":
                m.assignment_stale = True
            self._group_failed(m, _OP_WHAT[op.kind], e)
            return
        self._backoff.succeeded(m.topic)

    def _group_failed(self, m: Membership, what: str, e: DMQError) -> None:
        """Back off before the next group call of m: retry_backoff_ms, doubling up to 1 s, so a
        returning coordinator is found again within about a second."""
        delay_s, failures = self._backoff.failed(m.topic)
        # A warning for the first failure in a row, then quieter: the coordinator may be away for
        # minutes, and poll() retries every second meanwhile.
        emit = self._log.warning if failures == 1 else self._log.debug
        emit("group call failed; retrying", what=what, group=m.group_id, error=str(e), retry_in_ms=int(delay_s * 1000))

    def _drop_lost(self, m: Membership) -> None:
        lost = set(self._subs.assigned(m.topic))
        if not lost:
            return
        for tp in lost:
            self._subs.remove(tp)
            self._fetcher.drop(tp)
        self._log.warning("partitions lost without a hand-off", group=m.group_id, member=m.member_id,
                          partitions=sorted(tp.partition for tp in lost), reason=m.rejoin_reason or "not a member")
        self._listener_call("on_partitions_lost", lost)

    def _start_handover(self, m: Membership) -> None:
        """Commit what poll() returned for m's partitions, per broker, so their next owner starts
        there; GetAssignment follows once the commits answered, or after HANDOVER_COMMIT_WAIT_S
        (a stopped broker must not hold the group's rebalance nor m's other partitions).

        From here until the assignment is applied, m's partitions are held (poll() returns none
        of their records): a record returned now and then revoked would be read again by the
        next owner. Partitions whose commit failed or did not answer in time are released at
        once: their next owner re-reads from the last good commit whatever we do (duplicates,
        never loss), and they are on a broker that is away anyway."""
        owned = frozenset(self._subs.assigned(m.topic))
        offsets = {tp: OffsetAndMetadata(o) for tp, o in self._subs.consumed(only_changed=True).items()
                   if tp.topic == m.topic}
        op = _GroupOp("handover", [], held=owned)
        if offsets and owned:
            timeout_s = min(self.config.request_timeout_ms, self.config.session_timeout_ms) / 1000
            try:
                calls, errors = self._offsets.commit_calls(offsets, {m.topic: m}, timeout_s=0)
            except DMQError as e:
                calls, errors = [], dict.fromkeys(offsets, e)
            for tp, err in errors.items():
                self._log.warning("commit before the hand-off not sent", group=m.group_id, partition=tp.partition,
                                  error=str(err))
            op.released |= set(errors)
            wakeup = self._wakeup
            for call in calls:
                f = self._offsets.send_commit(call, timeout_s)
                f.add_done_callback(lambda _f: wakeup.set())
                op.futures.append(f)
                op.commits[f] = frozenset(call.offsets)
        if not op.futures:
            self._start_assignment(m, op)
            return
        op.wait_until = time.monotonic() + HANDOVER_COMMIT_WAIT_S
        self._ops[m.topic] = op

    def _start_assignment(self, m: Membership, handover: _GroupOp) -> None:
        future = self._groups.start_get_assignment(m, wait_ms=0)
        wakeup = self._wakeup
        future.add_done_callback(lambda _f: wakeup.set())
        op = _GroupOp("assignment", [future], held=handover.held)
        op.released = handover.released
        self._ops[m.topic] = op

    def _finish_handover(self, m: Membership, op: _GroupOp) -> None:
        """Record the hand-off commits; release the partitions whose commit failed or is late."""
        for f, tps in op.commits.items():
            if not f.done():
                op.released |= tps
                self._log.warning("commit before the hand-off did not answer in time; going on without it",
                                  group=m.group_id, member=m.member_id, partitions=sorted(tp.partition for tp in tps),
                                  waited_s=HANDOVER_COMMIT_WAIT_S)
                continue
            error = f.exception()
            if error is None:
                self._subs.mark_committed({tp: o.offset for tp, o in f.result().items()})
            else:
                op.released |= tps
                # Ownership already moved (expired) or the broker is away: the next owner re-reads
                # from the last good commit. Duplicates, never loss.
                self._log.warning("commit before the hand-off failed", group=m.group_id, member=m.member_id,
                                  error=str(error))

    def _held(self) -> frozenset[TopicPartition]:
        held: set[TopicPartition] = set()
        for op in self._ops.values():
            if op.held:
                held |= op.held - op.released - {tp for f, tps in op.commits.items() if f.done()
                                                 and f.exception() is not None for tp in tps}
        return frozenset(held)

    def _apply_assignment(self, m: Membership, future: Any) -> None:
        owned = set(self._subs.assigned(m.topic))
        # Never wait in the coordinator (wait_ms=0): partitions still held by their previous
        # owner come with a later watch event / heartbeat, and poll() keeps consuming meanwhile.
        response = self._groups.finish_get_assignment(m, future)
        now_owned = {TopicPartition(m.topic, p) for p in response.partitions}
        revoked = owned - now_owned
        added = now_owned - owned
        for tp in revoked:
            self._subs.remove(tp)
            self._fetcher.drop(tp)
        starts = {sp.partition: sp.offset for sp in response.start_positions}
        for tp in sorted(added):
            self._subs.add(tp, starts.get(tp.partition, EARLIEST))
        if revoked or added:
            self._fetcher.stats.rebalanced()  # an assignment that changed: Kafka's rebalance count
            self._log.info(
                "assignment changed", group=m.group_id, member=m.member_id, generation=response.generation,
                revoked=sorted(tp.partition for tp in revoked), assigned=sorted(tp.partition for tp in added),
                owned=sorted(response.partitions), rebalance_in_progress=response.rebalance_in_progress,
            )
        if revoked:
            self._listener_call("on_partitions_revoked", revoked)
        if added:
            self._listener_call("on_partitions_assigned", added)

    def _leave_topic(self, topic: str, *, call_listener: bool, deadline: float) -> None:
        m = self._memberships.pop(topic)
        op = self._ops.pop(topic, None)
        if op is not None:
            for f in op.futures:
                f.cancel()
        self._backoff.succeeded(topic)
        owned = set(self._subs.assigned(topic))
        if owned and self.config.enable_auto_commit and m.rejoin_reason is None and m.joined:
            offsets = {tp: OffsetAndMetadata(o) for tp, o in self._subs.consumed(only_changed=True).items() if tp.topic == topic}
            try:
                self._commit_sync_now(offsets, {topic: m}, deadline=deadline)
            except DMQError as e:
                self._log.warning("final commit failed", group=m.group_id, member=m.member_id, error=str(e))
        for tp in owned:
            self._subs.remove(tp)
            self._fetcher.drop(tp)
        try:
            if owned and call_listener:
                self._listener_call("on_partitions_revoked", owned)
        finally:
            self._heartbeat.untrack(topic)
            self._groups.leave(m, timeout_s=min(LEAVE_TIMEOUT_S, max(0.001, deadline - time.monotonic())))

    def _listener_call(self, name: str, partitions: set[TopicPartition]) -> None:
        listener = self._subs.listener
        if listener is not None:
            getattr(listener, name)(set(partitions))

    # -- positions -------------------------------------------------------------------------------

    def _update_positions(self) -> None:
        """Harvest and start position look-ups (never blocks; see _positions.py)."""
        group_ids = {t: m.group_id for t, m in self._memberships.items() if m.found}
        for tp in self._manual:  # assign()ed partitions start at the group's commit, if any
            group_ids.setdefault(tp.topic, group_id_for(tp.topic, self.config.group_id))
        error = self._positions.update(group_ids, self._subscription_from_ms)
        if error is not None:
            raise error

    def _subscription_from_ms(self, topic: str) -> int:
        m = self._memberships.get(topic)
        if m is None:
            return LATEST if self.config.start_latest else EARLIEST
        return m.subscription.from_ms

    def _assigned_state(self, tp: TopicPartition, what: str):
        tp = _tp(tp)
        state = self._subs.get(tp)
        if state is None:
            raise IllegalStateError(
                f"{what}: {tp} is not assigned to this consumer (assigned: "
                f"{sorted(map(str, self._subs.assigned())) or 'none yet: poll() first'})"
            )
        return tp, state

    def position(self, partition: TopicPartition) -> int:
        """The offset of the next record poll() will return for an assigned partition."""
        self._check_open()
        self._hand_back_unreturned()
        tp, state = self._assigned_state(partition, "position()")
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        while state.position is None:
            self._wakeup.clear()
            self._update_positions()
            if state.position is not None or self._subs.get(tp) is not state:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DMQTimeoutError(
                    f"position(): the position of {tp} was not found within request_timeout_ms "
                    f"({self.config.request_timeout_ms}); is its broker up?"
                )
            self._wakeup.wait(min(remaining, self.config.retry_backoff_ms / 1000 or remaining))
        position = self._subs.state(tp).position
        assert position is not None
        return position

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Make the next poll() return records of `partition` from `offset` on."""
        self._check_open()
        self._hand_back_unreturned()
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise InvalidArgumentError(f"seek() offset must be an int >= 0, got {offset!r}")
        tp, _ = self._assigned_state(partition, "seek()")
        self._subs.seek(tp, offset)
        self._fetcher.drop(tp)

    def seek_to_beginning(self, *partitions: TopicPartition | Iterable[TopicPartition]) -> None:
        """Move to the log start of the given partitions (all assigned ones when none given)."""
        self._seek_to(EARLIEST, partitions, "seek_to_beginning()")

    def seek_to_end(self, *partitions: TopicPartition | Iterable[TopicPartition]) -> None:
        """Move to the log end: only records produced from now on are returned."""
        self._seek_to(LATEST, partitions, "seek_to_end()")

    def _seek_to(self, where: int, partitions: tuple[Any, ...], what: str) -> None:
        self._check_open()
        self._hand_back_unreturned()
        tps = _tps(partitions) or self._subs.assigned()
        checked = [self._assigned_state(tp, what)[0] for tp in tps]
        for tp in checked:
            self._subs.request_reset(tp, where)
            self._fetcher.drop(tp)

    def pause(self, *partitions: TopicPartition | Iterable[TopicPartition]) -> None:
        """Stop fetching and returning records of these partitions until resume()."""
        self._check_open()
        self._hand_back_unreturned()
        for tp in [self._assigned_state(tp, "pause()")[0] for tp in _tps(partitions)]:
            self._subs.pause(tp)
            self._fetcher.drop(tp)

    def resume(self, *partitions: TopicPartition | Iterable[TopicPartition]) -> None:
        self._check_open()
        for tp in [self._assigned_state(tp, "resume()")[0] for tp in _tps(partitions)]:
            self._subs.resume(tp)

    def paused(self) -> set[TopicPartition]:
        return self._subs.paused()

    def committed(
        self, partitions: TopicPartition | Iterable[TopicPartition], timeout: float | None = None
    ) -> OffsetAndMetadata | None | dict[TopicPartition, OffsetAndMetadata | None]:
        """The group's commit: OffsetAndMetadata(offset = the next offset to consume, metadata as
        committed), None = nothing committed; one for a TopicPartition, a dict for several. Any partition of any topic may be
        asked, assigned or not. Brokers are asked in parallel, within `timeout` seconds
        (default request_timeout_ms)."""
        self._check_open()
        single = isinstance(partitions, TopicPartition) or (
            isinstance(partitions, tuple) and len(partitions) == 2 and isinstance(partitions[0], str)
        )
        tps = [_tp(partitions)] if single else _tps((partitions,))
        group_ids = {
            tp.topic: (self._memberships[tp.topic].group_id if tp.topic in self._memberships
                       else group_id_for(tp.topic, self.config.group_id))
            for tp in tps
        }
        found = self._offsets.fetch_committed(tps, group_ids, timeout_s=timeout)
        out = {tp: found.get(tp) for tp in tps}
        return out[tps[0]] if single else out

    # -- commits ---------------------------------------------------------------------------------

    def commit_sync(
        self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None, timeout: float | None = None
    ) -> None:
        """Commit `offsets` (next offset to consume per partition), or the positions of every
        record poll() returned, within `timeout` seconds (default request_timeout_ms). Each
        broker is committed to in parallel: the partitions of healthy brokers are committed even
        when another broker is down, and the error then names the partitions left. Raises
        CommitFailedError when this consumer no longer owns a partition (see its message for the
        settings to change), DiskFullError when a broker's disk stayed full until the deadline,
        DMQTimeoutError when a broker did not answer in time."""
        self._check_open()
        deadline = time.monotonic() + (self.config.request_timeout_ms / 1000 if timeout is None else max(0.0, timeout))
        self._run_commit_callbacks()
        if offsets is None:
            # Refused for a member that lost its group even when no position moved (Kafka's
            # rule): the application must learn that its partitions may be gone.
            self._check_can_commit({tp: OffsetAndMetadata(o) for tp, o in self._subs.consumed().items()},
                                   self._memberships)
        normalised = self._commit_offsets(offsets)
        self._commit_sync_now(normalised, deadline=deadline)

    def commit_async(
        self,
        offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None,
        callback: CommitCallback | None = None,
    ) -> concurrent.futures.Future[dict[TopicPartition, OffsetAndMetadata]]:
        """Send the commit without waiting; returns a future of the committed offsets.

        ``callback(offsets, exception_or_None)`` runs on the application's thread during a later
        poll(), commit_sync() or close(), like Kafka's commitAsync callbacks.
        """
        self._check_open()
        self._run_commit_callbacks()
        return self._commit_async_now(self._commit_offsets(offsets), callback)

    def _commit_offsets(
        self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        self._hand_back_unreturned()
        if offsets is None:
            # Positions already committed are left out: re-committing them changes nothing, and
            # would make commit_sync() wait on a dead broker whose partitions did not move.
            return {tp: OffsetAndMetadata(o) for tp, o in self._subs.consumed(only_changed=True).items()}
        out = {}
        for tp, o in offsets.items():
            om = o if isinstance(o, OffsetAndMetadata) else OffsetAndMetadata(o)
            if isinstance(om.offset, bool) or not isinstance(om.offset, int) or om.offset < 0:
                raise InvalidArgumentError(f"commit offset for {tp} must be an int >= 0, got {om.offset!r}")
            out[_tp(tp)] = om
        return out

    def _check_can_commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata],
                          memberships: Mapping[str, Membership]) -> None:
        for topic in {tp.topic for tp in offsets}:
            m = memberships.get(topic)
            if m is not None and m.rejoin_reason is not None:
                m_tps = sorted(str(tp) for tp in offsets if tp.topic == topic)
                raise CommitFailedError(
                    f"commit of {', '.join(m_tps)} refused: this consumer is no longer in group "
                    f"{m.group_id} ({m.rejoin_reason}); its partitions may belong to another member. "
                    f"If processing a poll's records takes longer than max_poll_interval_ms "
                    f"({self.config.max_poll_interval_ms} ms), raise max_poll_interval_ms or lower "
                    f"max_poll_records ({self.config.max_poll_records}). The next poll() re-joins."
                )

    def _commit_sync_now(self, offsets: Mapping[TopicPartition, OffsetAndMetadata],
                         memberships: Mapping[str, Membership] | None = None, *, deadline: float) -> None:
        if not offsets:
            return
        memberships = self._memberships if memberships is None else memberships
        self._check_can_commit(offsets, memberships)
        # An older async commit landing after this one would move the offset backwards.
        self._wait_for_async_commits(deadline)
        outcome = self._offsets.commit_sync(offsets, memberships, timeout_s=deadline - time.monotonic())
        self._fetcher.stats.committed()
        self._subs.mark_committed({tp: o.offset for tp, o in outcome.done.items()})
        error = outcome.error("commit")
        if error is None:
            return
        if isinstance(error, CommitFailedError):
            for topic in {tp.topic for tp in outcome.errors}:
                if topic in self._memberships:
                    self._memberships[topic].assignment_stale = True
        elif error.retriable:
            # A broker that answered with the resource it lacks (disk full, busy) keeps that class:
            # "free space on broker N" is not "a broker did not answer in time".
            cls = type(error) if isinstance(error, ResourceExhaustedError) else DMQTimeoutError
            error = cls(f"{error} (gave up at the commit's deadline)", code=error.code, details=error.details)
        raise error

    def _commit_async_now(
        self, offsets: dict[TopicPartition, OffsetAndMetadata], callback: CommitCallback | None
    ) -> concurrent.futures.Future[dict[TopicPartition, OffsetAndMetadata]]:
        try:
            self._check_can_commit(offsets, self._memberships)
        except CommitFailedError as e:
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            future.set_exception(e)
        else:
            future = self._offsets.commit_async(offsets, self._memberships, timeout_s=0)
            self._fetcher.stats.committed()
        self._track_commit(future, callback)
        return future

    def _track_commit(self, future: concurrent.futures.Future[Any], callback: CommitCallback | None) -> None:
        self._commits_in_flight.add(future)
        finished = self._finished_commits
        future.add_done_callback(lambda f: finished.append((callback, f)))

    def _run_commit_callbacks(self) -> None:
        while self._finished_commits:
            callback, future = self._finished_commits.popleft()
            self._commits_in_flight.discard(future)
            error = future.exception()
            if error is None:
                offsets = future.result()
                self._subs.mark_committed({tp: o.offset for tp, o in offsets.items()})
            else:
                offsets = {}
                if not isinstance(error, Exception):  # a BaseException (KeyboardInterrupt): not ours
                    raise error
                if isinstance(error, CommitFailedError):
                    for m in self._memberships.values():
                        m.assignment_stale = True
                if callback is None:
                    self._log.warning("async commit failed", error=str(error))
            if callback is not None:
                callback(offsets, error)

    def _wait_for_async_commits(self, deadline: float) -> None:
        if self._commits_in_flight:
            concurrent.futures.wait(list(self._commits_in_flight), timeout=max(0.0, deadline - time.monotonic()))
            self._run_commit_callbacks()

    def _maybe_auto_commit(self, now: float) -> None:
        """Commit the returned positions asynchronously, per broker: a broker whose previous
        auto-commit has not answered (stopped, slow) is skipped this time, the others are not."""
        if not self.config.enable_auto_commit or now < self._next_auto_commit:
            return
        self._next_auto_commit = now + self.config.auto_commit_interval_ms / 1000
        offsets = {
            tp: OffsetAndMetadata(o) for tp, o in self._subs.consumed(only_changed=True).items()
            if (m := self._memberships.get(tp.topic)) is not None and m.joined and m.rejoin_reason is None
        }
        if not offsets:
            return
        try:
            calls, _ = self._offsets.commit_calls(offsets, self._memberships, timeout_s=0)
        except DMQError as e:
            self._log.debug("auto-commit skipped", error=str(e))
            return
        for call in calls:
            busy = self._auto_commits.get(call.address)
            if busy is not None and not busy.done():
                continue
            future = self._offsets.send_commit(call)
            self._auto_commits[call.address] = future
            self._track_commit(future, None)

    # -- close -----------------------------------------------------------------------------------

    def close(self, timeout: float | None = None) -> None:
        """Commit (with auto-commit on), hand the partitions back, leave the groups and stop the
        heartbeat thread, within `timeout` seconds (default DEFAULT_CLOSE_TIMEOUT_S, 30 s, as
        Kafka's). What does not finish in time (a commit to a dead broker, a leave to an absent
        coordinator) is logged and abandoned: the group's session timeout is the backstop.
        Safe to call twice."""
        if self._closed:
            return
        deadline = time.monotonic() + (DEFAULT_CLOSE_TIMEOUT_S if timeout is None else max(0.0, timeout))
        try:
            self._hand_back_unreturned()
            self._wait_for_async_commits(deadline)
            for topic in list(self._memberships):
                try:
                    self._leave_topic(topic, call_listener=True, deadline=deadline)
                except Exception as e:  # noqa: BLE001 - closing must finish whatever a listener does
                    self._log.warning("error while leaving a group", topic=topic, error=str(e))
        finally:
            self._closed = True
            self._heartbeat.stop()
            self._positions.close()
            self._fetcher.close()
            self._cluster.close()
            self._log.info("consumer closed")

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("this DMQConsumer is closed; create a new one")

    # -- the Kafka-style API: manual assignment, patterns, offsets look-ups, metrics -------------

    def _poll_arguments(self, timeout_ms: Any, max_records: Any, timeout: object) -> tuple[float, int]:
        """poll()'s arguments checked: (seconds to wait, most records to return)."""
        if timeout is not None:
            # poll(timeout=) took seconds before poll() took kafka-python's timeout_ms: a caller
            # still passing seconds is told, rather than waiting a thousandth of what it meant.
            raise InvalidArgumentError(
                f"poll() takes timeout_ms (milliseconds, as kafka-python's), not timeout=; "
                f"poll(timeout={timeout!r}) is poll(timeout_ms={timeout!r} * 1000)"
            )
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or not timeout_ms >= 0:
            raise InvalidArgumentError(f"poll(): timeout_ms must be milliseconds (a number >= 0), got {timeout_ms!r}")
        if max_records is None:
            return timeout_ms / 1000, self.config.max_poll_records
        if isinstance(max_records, bool) or not isinstance(max_records, int) or max_records <= 0:
            raise InvalidArgumentError(f"poll(): max_records must be an int > 0, got {max_records!r}")
        return timeout_ms / 1000, max_records

    def _deserialize(self, records: Mapping[TopicPartition, Sequence[Any]]) -> dict[TopicPartition, list[Any]]:
        """Apply the deserializers. A record that fails is not skipped (Kafka's rule): the records
        before it are returned, and the next poll() raises SerializationError with the partition's
        position at the failed record, which the application may seek() past."""
        kd, vd = self.config.key_deserializer, self.config.value_deserializer
        out: dict[TopicPartition, list[Any]] = {}
        pending = list(records.items())
        for i, (tp, rs) in enumerate(pending):
            done: list[Any] = []
            for r in rs:
                what = "key"
                try:
                    key = r.key if kd is None or r.key is None else kd(r.key)
                    what = "value"
                    value = r.value if vd is None or r.value is None else vd(r.value)
                except Exception as e:
                    # Rewind what this poll will not return: tp to the failed record, the
                    # partitions not reached yet to their first record.
                    self.seek(tp, r.offset)
                    for other, others in pending[i + 1:]:
                        self.seek(other, others[0].offset)
                    if done:
                        out[tp] = done
                    if out:
                        return out
                    raise SerializationError(
                        f"{what}_deserializer failed on {tp} offset {r.offset}: {e!r}; the position stays "
                        f"there: seek(TopicPartition({tp.topic!r}, {tp.partition}), {r.offset + 1}) skips the record"
                    ) from e
                done.append(r._replace(key=key, value=value))
            out[tp] = done
        return out

    def _subscribe_pattern(
        self, topics: Any, pattern: str | re.Pattern[str] | None, listener: ConsumerRebalanceListener | None
    ) -> None:
        if pattern is None or topics is not None:
            raise InvalidArgumentError("subscribe() takes topics or pattern=, exactly one of them")
        try:
            compiled = re.compile(pattern) if isinstance(pattern, str) else pattern
        except re.error as e:
            raise InvalidArgumentError(f"subscribe(): pattern {pattern!r} is not a regular expression: {e}") from None
        if not isinstance(compiled, re.Pattern):
            raise InvalidArgumentError(f"subscribe(): pattern must be a str or re.Pattern, got {type(pattern).__name__}")
        self._cluster.refresh(None)
        self._pattern = compiled
        self._pattern_listener = listener
        self._next_pattern_listing = time.monotonic() + self.config.metadata_max_age_ms / 1000
        self._apply_pattern()

    def _apply_pattern(self) -> None:
        assert self._pattern is not None
        matched = [t for t in self._cluster.topic_names() if self._pattern.fullmatch(t)]
        if set(matched) == set(self._memberships):
            return
        self._log.info("pattern subscription changed", pattern=self._pattern.pattern, topics=matched)
        if matched:
            self._subscribe_topics(matched, self._pattern_listener)
        else:
            deadline = time.monotonic() + self.config.request_timeout_ms / 1000
            for topic in list(self._memberships):
                self._leave_topic(topic, call_listener=True, deadline=deadline)

    def _follow_pattern(self) -> None:
        """List the topics every metadata_max_age_ms without blocking poll(): the listing is a
        future, applied by the poll() iteration that finds it answered."""
        listing = self._pattern_listing
        if listing is None:
            if time.monotonic() >= self._next_pattern_listing:
                self._pattern_listing = listing = self._cluster.start_listing()
                listing.add_done_callback(lambda _f: self._wakeup.set())
            return
        if not listing.done():
            return
        self._pattern_listing = None
        self._next_pattern_listing = time.monotonic() + self.config.metadata_max_age_ms / 1000
        if listing.exception() is not None:
            self._log.debug("topic listing failed", error=str(listing.exception()))
            return
        self._apply_pattern()

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read these partitions without a group: no rebalances, nobody else is given them.
        Each starts at the group's committed offset if there is one, else at the log start
        (auto_offset_reset='latest': the log end); seek() moves it. An empty list unassigns.
        Commits need group membership (subscribe()), so they are refused for these partitions."""
        self._check_open()
        self._hand_back_unreturned()
        if self._memberships or self._pattern is not None:
            raise IllegalStateError("assign() after subscribe(): call unsubscribe() first")
        wanted = set(_tps((partitions,)))
        for tp in wanted:
            count = self._cluster.partitions_for(tp.topic)
            if not 0 <= tp.partition < count:
                raise InvalidArgumentError(f"assign(): {tp} does not exist; topic {tp.topic!r} has partitions 0..{count - 1}")
        for tp in self._manual - wanted:
            self._subs.remove(tp)
            self._fetcher.drop(tp)
        start = START_BY_TIMESTAMP if self.config.start_latest else START_AT_LOG_START
        for tp in wanted - self._manual:
            self._subs.add(tp, start)
        self._manual = wanted

    def beginning_offsets(
        self, partitions: Iterable[TopicPartition], timeout: float | None = None
    ) -> dict[TopicPartition, int]:
        """The first offset still in each partition's log (its log start), asked of the brokers
        in parallel within `timeout` seconds (default request_timeout_ms). Any partitions."""
        return self._list_offsets({tp: EARLIEST for tp in _tps((partitions,))}, timeout)

    def end_offsets(self, partitions: Iterable[TopicPartition], timeout: float | None = None) -> dict[TopicPartition, int]:
        """The offset the next record produced to each partition will get (its log end)."""
        return self._list_offsets({tp: LATEST for tp in _tps((partitions,))}, timeout)

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int], timeout: float | None = None
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Per partition, the first record appended at or after the time (epoch ms), as
        kafka-python's OffsetAndTimestamp(offset, timestamp of that record); None when no
        record is that recent. Within `timeout` seconds (default request_timeout_ms)."""
        queries = {}
        for tp, ts in timestamps.items():
            if isinstance(ts, bool) or not isinstance(ts, int) or ts < 0:
                raise InvalidArgumentError(f"offsets_for_times(): timestamp of {tp} must be epoch ms (int >= 0), got {ts!r}")
            queries[_tp(tp)] = ts
        deadline = time.monotonic() + (self.config.request_timeout_ms / 1000 if timeout is None else max(0.0, timeout))
        found = self._list_offsets(queries, timeout)
        ends = self._list_offsets(dict.fromkeys(queries, LATEST), max(0.0, deadline - time.monotonic()))
        offsets = {tp: found[tp] for tp in queries if found[tp] < ends[tp]}
        stamps = record_timestamps(self._cluster, offsets, max(0.0, deadline - time.monotonic()))
        return {tp: (OffsetAndTimestamp(offsets[tp], stamps[tp]) if tp in offsets else None) for tp in queries}

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        """The topic's partition numbers; None when there is no such topic (kafka-python's)."""
        self._check_open()
        try:
            return set(range(self._cluster.topic_metadata(topic).partition_count))
        except TopicNotFoundError:
            return None

    def topics(self) -> set[str]:
        """The names of every topic, asked of the coordinator now (kafka-python's topics())."""
        self._check_open()
        self._cluster.refresh(None)
        return set(self._cluster.topic_names())

    def _list_offsets(self, queries: dict[TopicPartition, int], timeout: float | None) -> dict[TopicPartition, int]:
        self._check_open()
        return self._offsets.list_offsets(queries, timeout_s=timeout)

    def metrics(self) -> dict[str, float]:
        """Kafka's consumer metrics in snake_case (README "Metrics"): record_consumed_rate / _total,
        bytes_consumed_rate / _total (fetched), request_rate / _total / _error_total and
        request_latency_avg_ms / _max_ms of the Fetch calls, records_lag_max (the largest lag of an
        assigned partition, as of its last fetch), commit_rate / _total, rebalance_total (assignment
        changes); rates and latencies over the last 30 s. Then counters and gauges of this consumer."""
        return {
            **self._fetcher.stats.consumer_snapshot(),
            **self._counters,
            "assigned_partitions": len(self._subs.assigned()),
            "paused_partitions": len(self._subs.paused()),
            "subscribed_topics": len(self._subs.topics),
            "joined_groups": sum(1 for m in self._memberships.values() if m.joined),
            "manually_assigned_partitions": len(self._manual),
            "commits_in_flight": len(self._commits_in_flight),
        }


def _wait(future: Any, timeout_s: float) -> bool:
    """Wait for a gRPC future up to timeout_s; True when it is done."""
    try:
        future.exception(timeout=max(0.0, timeout_s))
    except grpc.FutureTimeoutError:
        return False
    except grpc.FutureCancelledError:
        pass
    return True


def _tp(value: Any) -> TopicPartition:
    if isinstance(value, TopicPartition):
        return value
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int):
        return TopicPartition(value[0], value[1])
    raise InvalidArgumentError(f"expected a TopicPartition(topic, partition), got {value!r}")


def _tps(args: tuple[Any, ...]) -> list[TopicPartition]:
    """Partitions given as varargs, or as one iterable of them."""
    out: list[TopicPartition] = []
    for a in args:
        if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str):
            out.append(_tp(a))
        else:
            out.extend(_tp(x) for x in a)
    return out
