"""DMQConsumer: the consumer-group client (subscribe / poll / commit).

It composes the parts, which never import each other (STYLE.md, after aiokafka):

    SubscriptionState  what is assigned and where consumption stands   (_subscription.py)
    Fetcher            pipelined fetches, lazy decoding                 (_fetcher.py)
    ConsumerCore       the group protocol, sans I/O: which group call    (_core.py)
                       next, what answers mean, commit rules
    GroupClient        the group RPCs: requests, error mapping           (_group.py)
    HeartbeatThread    heartbeats, watch streams, poll watchdog         (_heartbeat.py)
    OffsetClient       commit / committed / list offsets                (_offsets.py)
    Commits            commits in flight, their callbacks, auto-commits (_commits.py)
    PositionFinder     position look-ups of new partitions              (_positions.py)

What it does around the core alike with AsyncConsumer is ConsumerShell's (_shell.py).

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
  3. per membership, one group call at a time, the one the core says it needs: find the group (if subscribe() could not),
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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from operator import length_hint
from typing import Any

import grpc

from dmq.client._cluster import Cluster
from dmq.client._log import get_logger
from dmq.client.consumer._commits import CommitCallback, Commits
from dmq.client.consumer._common import check_seek_offset, commit_offsets, deserialize, time_queries, tp_of, tps_of
from dmq.client.consumer._config import ConsumerConfig
from dmq.client.consumer._core import HANDOVER_COMMIT_WAIT_S, ConsumerCore, GroupCall, Outcome
from dmq.client.consumer._fetcher import Fetcher
from dmq.client.consumer._group import FIND, HANDOVER, JOIN, GroupClient, Membership, group_id_for
from dmq.client.consumer._heartbeat import HeartbeatThread
from dmq.client.consumer._listener import ConsumerRebalanceListener
from dmq.client.consumer._offsets import OffsetClient
from dmq.client.consumer._positions import PositionFinder
from dmq.client.consumer._records import ConsumerRecords, OffsetAndMetadata, OffsetAndTimestamp, TopicPartition
from dmq.client.consumer._shell import ConsumerShell, topic_list
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
    DMQError,
    IllegalStateError,
    InvalidArgumentError,
    TopicNotFoundError,
)
from dmq.client.records import RecordSequence

log = get_logger(__name__)


# close() gives up on what the cluster has not answered by then (Kafka's close() default).
DEFAULT_CLOSE_TIMEOUT_S = 30.0
LEAVE_TIMEOUT_S = 5.0


class _GroupOp:
    """A membership's group call in flight (the core's GroupCall): one future (find, join,
    assignment) or the per-broker commit futures of a hand-off, with the partitions held back."""

    __slots__ = ("call", "futures", "commits", "released", "wait_until")

    def __init__(self, call: GroupCall, futures: list[Any], released: set[TopicPartition] | None = None) -> None:
        self.call = call
        self.futures = futures
        self.commits: dict[Any, frozenset[TopicPartition]] = {}  # hand-off commit future -> its partitions
        # poll() returns none of call.held's records while this is in flight, except these
        # (their commit failed)
        self.released: set[TopicPartition] = set() if released is None else released
        self.wait_until = float("inf")  # a hand-off goes on without commits still out by then

    def __repr__(self) -> str:
        return (f"<_GroupOp {self.call.kind} done={self.done()} held={len(self.call.held)} "
                f"released={len(self.released)}>")

    def done(self) -> bool:
        return all(f.done() for f in self.futures) or time.monotonic() >= self.wait_until


class DMQConsumer(ConsumerShell):
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
        self._core = ConsumerCore(config, self._subs, self._to_commit, self._log, now=time.monotonic())
        self._memberships: dict[str, Membership] = self._core.memberships  # the core's, read here
        self._ops: dict[str, _GroupOp] = {}  # topic -> the membership's group call in flight
        self._heartbeat = HeartbeatThread(self.consumer_id, config, self._wakeup, self._poll_age_s,
                                          router=self._cluster.coordinator_router)
        self._commits = Commits(self._offsets, self._core, self._fetcher.stats, self._log)
        self._closed = False
        # The Kafka-style API (methods at the end of the class): partitions given to assign()
        # (read without a group), a subscribe(pattern=...) and its listing in flight, counters.
        self._manual: set[TopicPartition] = set()
        self._pattern: re.Pattern[str] | None = None
        self._pattern_listing: concurrent.futures.Future[None] | None = None
        self._pattern_listener: ConsumerRebalanceListener | None = None
        self._next_pattern_listing = 0.0
        self._counters = {"polls": 0, "records_returned": 0}
        self._reset_iteration()
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

    def _reset_iteration(self) -> None:
        """``for record in consumer``'s state: the per-partition sequences of the poll() being
        handed out, the one handed out now (_iter_pos), its records iterator and that iterator's
        cursor (see RecordSequence.cursor: its length_hint is how many records are left)."""
        self._iter_parts: list[Sequence[Any]] = []
        self._iter_pos = 0
        self._iter_rows: Iterator[Any] = iter(())
        self._iter_left: Iterator[Any] = self._iter_rows
        self._iterator: Iterator[Any] | None = None  # the generator next(consumer) steps

    def __iter__(self) -> Iterator[Any]:
        """The records, one by one; the loop ends once none came for consumer_timeout_ms
        (default: never), or when the consumer is closed. Records are fetched a poll() at a time
        and handed out one by one: a record counts as consumed (positions, commits) only once
        handed out, so leaving the loop and committing or closing never covers the rest.

        A generator stepping each partition's records iterator with ``yield from``: a record
        costs one generator resume and the C iterator's step, no Python code (a __next__ method
        per record cost about twice as much: bench/iteration_cost.py). What was handed out is
        read back from the iterator's cursor when needed (_hand_back_unreturned)."""
        return self._records()

    def __next__(self) -> Any:
        """next(consumer): one step of the same iteration (one generator kept for these calls)."""
        it = self._iterator
        if it is None:
            it = self._iterator = self._records()
        try:
            return next(it)
        except BaseException:
            self._iterator = None  # ended (timeout, closed) or raised: the next call starts afresh
            raise

    def _records(self) -> Iterator[Any]:
        while True:
            rows = self._iter_rows
            yield from rows
            # `rows` ran out, or a hand-back or another iterator over this consumer ended or
            # moved past it: only the iterator that finished the current records moves on.
            if rows is self._iter_rows and not self._next_part():
                return

    def _next_part(self) -> bool:
        """Go on to the next partition's records of the poll() being handed out, else to a new
        poll()'s, waiting up to consumer_timeout_ms for one; False when none came or closed."""
        pos = self._iter_pos + 1
        if pos < len(self._iter_parts):
            self._start_part(pos)
            return True
        self._iter_parts = []  # all handed out: poll() has nothing to hand back
        if self._closed:
            return False
        deadline = time.monotonic() + self.config.consumer_timeout_ms / 1000
        while True:
            batch = self.poll(max(0.0, deadline - time.monotonic()) * 1000)
            if batch:
                self._iter_parts = list(batch.values())
                self._start_part(0)
                return True
            if time.monotonic() >= deadline:
                return False

    def _start_part(self, pos: int) -> None:
        part = self._iter_parts[pos]
        self._iter_pos = pos
        if isinstance(part, RecordSequence):
            self._iter_rows, self._iter_left = part.cursor()
        else:  # deserialized records: a list, whose iterator is its own cursor
            self._iter_rows = self._iter_left = iter(part)

    def _hand_back_unreturned(self) -> None:
        """Move each partition back to the first record of the iteration's poll() not handed out
        yet (poll() advanced it past all of them), and end the iteration's records iterator (a
        loop stepping it comes back for records, through poll()): called before anything reads,
        commits or sets positions, and by poll(), which then returns those records again."""
        parts = self._iter_parts
        if not parts:
            return
        pos, left = self._iter_pos, length_hint(self._iter_left)
        deque(self._iter_left, maxlen=0)  # ends _iter_rows
        self._iter_parts, self._iter_pos = [], 0
        self._iter_rows = self._iter_left = iter(())
        firsts: dict[TopicPartition, int] = {}
        current = parts[pos]
        rest = [current[len(current) - left]] if left else []
        rest += [part[0] for part in parts[pos + 1:] if part]
        for r in rest:
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
        self._subscribe_topics(topic_or_topics, listener)

    def _subscribe_topics(self, topics: Any, listener: ConsumerRebalanceListener | None) -> None:
        wanted = topic_list(topics)
        if not self._heartbeat.alive:
            self._heartbeat.start()
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        for topic in self._core.unwanted(wanted):
            self._leave_topic(topic, call_listener=True, deadline=deadline)
        self._subs.subscribe(wanted, listener)
        for m in self._core.added(wanted, self._cluster.bootstrap):
            for kind in (FIND, JOIN):
                call = self._core.begin(m, kind)
                future = self._groups.start(kind, m)
                if not _wait(future, deadline - time.monotonic()):
                    self._track_op(_GroupOp(call, [future]))  # still unanswered at the deadline: poll() finishes it
                    break
                out = self._answered(call, future)
                if out.error is not None:
                    self._core.leave(m.topic)
                    raise out.error
                if not out.succeeded:  # retriable: poll() goes on after a backoff
                    break
                self._apply(m, out)

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
        if self._iter_parts:
            self._hand_back_unreturned()
        if not self._memberships and not self._manual and self._pattern is None:
            raise IllegalStateError("poll() needs a subscription: call subscribe(topic) or assign(partitions) first")
        self._counters["polls"] += 1
        now = time.monotonic()
        deadline = now + timeout_s
        self._core.poll_started(now)
        try:
            self._commits.run_callbacks()
            self._commits.auto_commit(now)
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
                        records = deserialize(self.config, records, self.seek)
                    self._counters["records_returned"] += sum(map(len, records.values()))
                    return ConsumerRecords(records)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return ConsumerRecords()
                # Fetch answers, look-ups, group calls and rebalance flags set _wakeup; the cap
                # covers retry backoffs and background metadata refreshes, which nothing signals.
                self._wakeup.wait(min(remaining, self.config.retry_backoff_ms / 1000 or remaining))
        finally:
            self._core.poll_ended(time.monotonic())

    # -- group coordination (application thread, never blocking) ----------------------------------

    def _coordinate(self) -> None:
        for m in list(self._memberships.values()):
            self._step(m)

    def _step(self, m: Membership) -> None:
        """Finish m's group call if it answered, then start the next one the core says m needs
        (one at a time per membership: find, (re-)join, commit before the hand-off, fetch the
        assignment). Errors a person must fix are raised."""
        op = self._ops.get(m.topic)
        if op is not None:
            if not op.done():
                return
            del self._ops[m.topic]
            self._finish(m, op)
            if m.topic in self._ops:
                return
        call = self._core.next_call(m.topic, time.monotonic())
        if call is None:
            return
        if call.before is not None:
            try:
                self._apply(m, call.before)
            except BaseException:
                self._core.abandon(call)  # the join is made by the next poll()
                raise
        if call.kind == HANDOVER:
            self._start_handover(call)
        else:
            self._track_op(_GroupOp(call, [self._groups.start(call.kind, m)]))

    def _track_op(self, op: _GroupOp) -> None:
        wakeup = self._wakeup
        for f in op.futures:
            f.add_done_callback(lambda _f: wakeup.set())
        self._ops[op.call.topic] = op

    def _answered(self, call: GroupCall, future: Any) -> Outcome:
        try:
            response = self._groups.result(call.kind, call.membership, future)
        except DMQError as e:
            return self._core.answered(call, time.monotonic(), error=e)
        return self._core.answered(call, time.monotonic(), response, coordinator=self._cluster.bootstrap)

    def _finish(self, m: Membership, op: _GroupOp) -> None:
        if op.call.kind == HANDOVER:
            out = self._core.answered(op.call, time.monotonic(), failed=self._handover_results(op))
            assert out.next is not None
            self._track_op(_GroupOp(out.next, [self._groups.start(out.next.kind, m)], op.released))
            return
        out = self._answered(op.call, op.futures[0])
        if out.error is not None:
            raise out.error
        self._apply(m, out)

    def _apply(self, m: Membership, out: Outcome) -> None:
        callbacks = self._carry_out(m, out)
        if m.rejoin_reason is not None:
            self._wakeup.set()
        self._callbacks(callbacks)

    def _start_handover(self, call: GroupCall) -> None:
        """Commit what poll() returned for m's partitions, per broker, so their next owner starts
        there; GetAssignment follows once the commits answered, or after HANDOVER_COMMIT_WAIT_S
        (a stopped broker must not hold the group's rebalance nor m's other partitions).

        From here until the assignment is applied, m's partitions are held (poll() returns none
        of their records). Partitions whose commit failed or did not answer in time are released
        at once: their next owner re-reads from the last good commit whatever we do (duplicates,
        never loss), and they are on a broker that is away anyway."""
        m = call.membership
        op = _GroupOp(call, [])
        timeout_s = min(self.config.request_timeout_ms, self.config.session_timeout_ms) / 1000
        try:
            calls, errors = self._offsets.commit_calls(call.offsets, {m.topic: m}, timeout_s=0)
        except DMQError as e:
            calls, errors = [], dict.fromkeys(call.offsets, e)
        for tp, err in errors.items():
            self._log.warning("commit before the hand-off not sent", group=m.group_id, partition=tp.partition,
                              error=str(err))
        op.released |= set(errors)
        for commit in calls:
            f = self._offsets.send_commit(commit, timeout_s)
            op.futures.append(f)
            op.commits[f] = frozenset(commit.offsets)
        if not op.futures:
            self._finish(m, op)
            return
        op.wait_until = time.monotonic() + HANDOVER_COMMIT_WAIT_S
        self._track_op(op)

    def _handover_results(self, op: _GroupOp) -> dict[TopicPartition, str]:
        """Record the hand-off commits; the partitions whose commit failed or is late, and why
        (they are released: poll() may return their records again)."""
        failed: dict[TopicPartition, str] = {}
        for f, tps in op.commits.items():
            if not f.done():
                failed.update(dict.fromkeys(tps, f"no answer within {HANDOVER_COMMIT_WAIT_S} s"))
                continue
            error = f.exception()
            if error is None:
                self._subs.mark_committed({tp: o.offset for tp, o in f.result().items()})
            else:
                failed.update(dict.fromkeys(tps, str(error)))
        op.released |= set(failed)
        return failed

    def _held(self) -> frozenset[TopicPartition]:
        held: set[TopicPartition] = set()
        for op in self._ops.values():
            if op.call.held:
                held |= op.call.held - op.released - {tp for f, tps in op.commits.items() if f.done()
                                                      and f.exception() is not None for tp in tps}
        return frozenset(held)

    def _leave_topic(self, topic: str, *, call_listener: bool, deadline: float) -> None:
        op = self._ops.pop(topic, None)
        if op is not None:
            for f in op.futures:
                f.cancel()
        leaving = self._core.leave(topic)
        m = leaving.membership
        if leaving.offsets:
            try:
                self._commits.sync(leaving.offsets, {topic: m}, deadline=deadline)
            except DMQError as e:
                self._log.warning("final commit failed", group=m.group_id, member=m.member_id, error=str(e))
        callbacks = self._release(leaving)
        try:
            if call_listener:
                self._callbacks(callbacks)
        finally:
            self._heartbeat.untrack(topic)
            self._groups.leave(m, timeout_s=min(LEAVE_TIMEOUT_S, max(0.001, deadline - time.monotonic())))

    def _callbacks(self, callbacks: Iterable[tuple[str, frozenset[TopicPartition]]]) -> None:
        listener = self._subs.listener
        if listener is not None:
            for name, partitions in callbacks:
                getattr(listener, name)(set(partitions))

    def _to_commit(self, topic: str | None = None, only_changed: bool = True) -> dict[TopicPartition, OffsetAndMetadata]:
        """The positions of the records poll() returned (for the core): what a commit covers."""
        return {tp: OffsetAndMetadata(o) for tp, o in self._subs.consumed(only_changed).items()
                if topic is None or tp.topic == topic}

    # -- positions -------------------------------------------------------------------------------

    def position(self, partition: TopicPartition) -> int:
        """The offset of the next record poll() will return for an assigned partition."""
        self._check_open()
        self._hand_back_unreturned()
        tp, state = self._assigned_state(partition, "position()")
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        while state.position is None and (wait_s := self._position_wait_s(tp, state, deadline)) is not None:
            self._wakeup.wait(wait_s)
        position = self._subs.state(tp).position
        assert position is not None
        return position

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Make the next poll() return records of `partition` from `offset` on."""
        self._check_open()
        self._hand_back_unreturned()
        check_seek_offset(offset)
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
        tps = tps_of(partitions) or self._subs.assigned()
        checked = [self._assigned_state(tp, what)[0] for tp in tps]
        for tp in checked:
            self._subs.request_reset(tp, where)
            self._fetcher.drop(tp)

    def pause(self, *partitions: TopicPartition | Iterable[TopicPartition]) -> None:
        """Stop fetching and returning records of these partitions until resume()."""
        self._check_open()
        self._hand_back_unreturned()
        for tp in [self._assigned_state(tp, "pause()")[0] for tp in tps_of(partitions)]:
            self._subs.pause(tp)
            self._fetcher.drop(tp)

    def resume(self, *partitions: TopicPartition | Iterable[TopicPartition]) -> None:
        self._check_open()
        for tp in [self._assigned_state(tp, "resume()")[0] for tp in tps_of(partitions)]:
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
        tps = [tp_of(partitions)] if single else tps_of((partitions,))
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
        self._commits.run_callbacks()
        if offsets is None:
            # Refused for a member that lost its group even when no position moved (Kafka's
            # rule): the application must learn that its partitions may be gone.
            self._core.check_can_commit(self._to_commit(None, False))
        self._commits.sync(self._commit_offsets(offsets), deadline=deadline)

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
        self._commits.run_callbacks()
        return self._commits.send(self._commit_offsets(offsets), callback)

    def _commit_offsets(
        self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        self._hand_back_unreturned()
        if offsets is None:
            # Positions already committed are left out: re-committing them changes nothing, and
            # would make commit_sync() wait on a dead broker whose partitions did not move.
            return self._to_commit()
        return commit_offsets(offsets)

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
            self._commits.wait(deadline)
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
        wanted = set(tps_of((partitions,)))
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
        return self._list_offsets({tp: EARLIEST for tp in tps_of((partitions,))}, timeout)

    def end_offsets(self, partitions: Iterable[TopicPartition], timeout: float | None = None) -> dict[TopicPartition, int]:
        """The offset the next record produced to each partition will get (its log end)."""
        return self._list_offsets({tp: LATEST for tp in tps_of((partitions,))}, timeout)

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int], timeout: float | None = None
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Per partition, the first record appended at or after the time (epoch ms), as
        kafka-python's OffsetAndTimestamp(offset, timestamp of that record); None when no
        record is that recent. Within `timeout` seconds (default request_timeout_ms)."""
        queries = time_queries(timestamps)
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
            "commits_in_flight": len(self._commits.in_flight),
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


