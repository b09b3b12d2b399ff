"""DMQConsumer: the consumer-group client (subscribe / poll / commit).

It composes the parts, which never import each other (STYLE.md, after aiokafka):

    SubscriptionState  what is assigned and where consumption stands   (_subscription.py)
    Fetcher            pipelined fetches, lazy decoding                 (_fetcher.py)
    GroupClient        memberships: find/join/assignment/leave RPCs     (_group.py)
    HeartbeatThread    heartbeats, watch streams, poll watchdog         (_heartbeat.py)
    OffsetClient       commit / committed / list offsets                (_offsets.py)

Threads: everything here runs on the application's thread, which must be one thread at a time
(like Kafka's consumer, the object is not thread-safe). The heartbeat thread only sets flags on
memberships; gRPC threads only complete futures; both then set ``_wakeup`` so a poll() waiting
for data wakes up.

poll(), step by step:
  1. run the callbacks of finished commit_async() calls;
  2. auto-commit: positions returned by earlier polls, async, at most every
     auto_commit_interval_ms;
  3. per membership: re-join if the coordinator forgot us (partitions lost); if the heartbeat
     thread flagged a new generation, commit the returned positions synchronously, then
     GetAssignment (this is what hands revoked partitions to their new owner, who starts at
     that commit), drop fetched data of revoked partitions, call the listener;
  4. look up the positions of new partitions: committed offset, else the group's start
     position (exact offset, log start, or by subscription time);
  5. return buffered records (max_poll_records) and start the next fetches before returning,
     or wait for a fetch / a rebalance until the timeout.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

import structlog

from dmq.client._cluster import Cluster
from dmq.client.consumer._config import ConsumerConfig
from dmq.client.consumer._fetcher import Fetcher
from dmq.client.consumer._group import GroupClient, Membership, group_id_for
from dmq.client.consumer._heartbeat import HeartbeatThread
from dmq.client.consumer._listener import ConsumerRebalanceListener
from dmq.client.consumer._offsets import OffsetClient
from dmq.client.consumer._records import ConsumerRecords, OffsetAndMetadata, TopicPartition
from dmq.client.consumer._subscription import (
    EARLIEST,
    LATEST,
    START_BY_TIMESTAMP,
    SubscriptionState,
)
from dmq.client.errors import (
    ClientClosedError,
    CommitFailedError,
    CoordinatorUnavailableError,
    DMQError,
    GroupNotFoundError,
    IllegalStateError,
    InvalidArgumentError,
    UnknownMemberError,
)

log = structlog.get_logger(__name__)

CommitCallback = Callable[[dict[TopicPartition, OffsetAndMetadata], Exception | None], None]


class DMQConsumer:
    """Consume topics as a member of a consumer group. Use as a context manager, or call close()."""

    def __init__(self, config: ConsumerConfig | None = None, **settings: Any) -> None:
        if config is None:
            config = ConsumerConfig(**settings)
        elif settings:
            raise InvalidArgumentError("give either a ConsumerConfig or keyword settings, not both")
        self.config = config
        self.consumer_id = f"{config.client_id}-{uuid.uuid4().hex[:12]}"
        self._log = log.bind(consumer=self.consumer_id)
        self._cluster = Cluster(config.metadata_service_url, request_timeout_ms=config.request_timeout_ms)
        self._wakeup = threading.Event()
        self._subs = SubscriptionState()
        self._fetcher = Fetcher(self._cluster, self._subs, config, self._wakeup, name=self.consumer_id)
        self._groups = GroupClient(self._cluster, config, self.consumer_id)
        self._offsets = OffsetClient(self._cluster, config)
        self._memberships: dict[str, Membership] = {}
        self._heartbeat = HeartbeatThread(self.consumer_id, config, self._wakeup, self._poll_age_s)
        self._last_poll = time.monotonic()
        self._in_poll = False
        self._next_auto_commit = time.monotonic() + config.auto_commit_interval_ms / 1000
        self._auto_commit: concurrent.futures.Future[Any] | None = None
        self._commits_in_flight: set[concurrent.futures.Future[Any]] = set()
        self._finished_commits: deque[tuple[CommitCallback | None, concurrent.futures.Future[Any]]] = deque()
        self._closed = False

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

    # -- subscription ----------------------------------------------------------------------------

    def subscribe(self, topic_or_topics: str | Iterable[str], listener: ConsumerRebalanceListener | None = None) -> None:
        """Join the group of each topic (``G_<topic>_<group_id>``); partitions arrive in poll().

        The group's subscription mode is recorded when it is first created, here: a group
        subscribing with mode ``new`` reads everything produced after this call returns.
        """
        self._check_open()
        topics = [topic_or_topics] if isinstance(topic_or_topics, str) else list(topic_or_topics)
        if not topics or not all(isinstance(t, str) and t for t in topics):
            raise InvalidArgumentError("subscribe() needs a topic name or a non-empty list of topic names")
        if not self._heartbeat.alive:
            self._heartbeat.start()
        wanted = list(dict.fromkeys(topics))
        for topic in [t for t in self._memberships if t not in wanted]:
            self._leave_topic(topic, call_listener=True)
        self._subs.subscribe(wanted, listener)
        for topic in wanted:
            if topic not in self._memberships:
                m = self._call_coordinator(partial(self._groups.find_or_create, topic), f"finding the group of {topic}")
                self._memberships[topic] = m
                self._join(m)

    def unsubscribe(self) -> None:
        """Commit (with auto-commit), hand back every partition and leave every group."""
        self._check_open()
        for topic in list(self._memberships):
            self._leave_topic(topic, call_listener=True)
        self._subs.subscribe((), None)

    def subscription(self) -> set[str]:
        return set(self._subs.topics)

    def assignment(self) -> set[TopicPartition]:
        """The partitions this consumer owns now."""
        return set(self._subs.assigned())

    # -- poll ------------------------------------------------------------------------------------

    def poll(self, timeout: float = 0.0) -> ConsumerRecords:
        """Records fetched for the owned partitions, at most max_poll_records, waiting up to
        `timeout` seconds for some. Rebalances are carried out here, on this thread."""
        self._check_open()
        if not self._memberships:
            raise IllegalStateError("poll() needs a subscription: call subscribe(topic) first")
        now = time.monotonic()
        deadline = now + max(0.0, timeout)
        self._in_poll = True
        self._last_poll = now
        try:
            self._run_commit_callbacks()
            self._maybe_auto_commit(now)
            fetcher = self._fetcher
            while True:
                self._wakeup.clear()
                self._coordinate()
                if self._subs.needing_position():
                    self._initialise_positions(in_poll=True)
                records = fetcher.collect(self.config.max_poll_records)
                fetcher.send_fetches()
                if records:
                    return ConsumerRecords(records)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return ConsumerRecords()
                # Fetch answers and rebalance flags set _wakeup; the cap covers retry backoffs,
                # which nothing signals.
                self._wakeup.wait(min(remaining, self.config.retry_backoff_ms / 1000 or remaining))
        finally:
            self._in_poll = False
            self._last_poll = time.monotonic()

    def _poll_age_s(self) -> float:
        """Seconds since the application last called poll(); 0 while inside poll()."""
        return 0.0 if self._in_poll else time.monotonic() - self._last_poll

    # -- group coordination (application thread) -------------------------------------------------

    def _call_coordinator(self, fn: Callable[[], Any], what: str) -> Any:
        """Run a group RPC, retrying retriable failures for up to request_timeout_ms."""
        deadline = time.monotonic() + self.config.request_timeout_ms / 1000
        delay_s = self.config.retry_backoff_ms / 1000
        while True:
            try:
                return fn()
            except DMQError as e:
                if not e.retriable:
                    raise
                if time.monotonic() + delay_s > deadline:
                    raise CoordinatorUnavailableError(
                        f"{what} failed for request_timeout_ms ({self.config.request_timeout_ms}): {e}",
                        code=e.code, details=e.details,
                    ) from e
                self._log.info("coordinator call failed, retrying", what=what, error=str(e))
                time.sleep(delay_s)
                delay_s = min(delay_s * 2, 1.0)

    def _join(self, m: Membership) -> None:
        def join() -> None:
            try:
                self._groups.join(m)
            except GroupNotFoundError:
                # Deleted between FindOrCreateGroup and now (an empty group can be): find it again.
                fresh = self._groups.find_or_create(m.topic)
                m.group_id, m.coordinator, m.subscription = fresh.group_id, fresh.coordinator, fresh.subscription
                self._groups.join(m)

        self._call_coordinator(join, f"joining group {m.group_id}")
        self._heartbeat.track(m)

    def _coordinate(self) -> None:
        for m in self._memberships.values():
            if m.rejoin_reason is not None or not m.joined:
                self._rejoin(m)
            if m.assignment_stale:
                self._refresh_assignment(m)

    def _rejoin(self, m: Membership) -> None:
        reason = m.rejoin_reason or "not a member"
        lost = set(self._subs.assigned(m.topic))
        for tp in lost:
            self._subs.remove(tp)
            self._fetcher.drop(tp)
        if lost:
            self._log.warning("partitions lost without a hand-off", group=m.group_id, member=m.member_id,
                              partitions=sorted(tp.partition for tp in lost), reason=reason)
        self._join(m)
        if lost:
            self._listener_call("on_partitions_lost", lost)

    def _refresh_assignment(self, m: Membership) -> None:
        m.assignment_stale = False
        owned = set(self._subs.assigned(m.topic))
        if owned:
            self._commit_before_handover(m)
        try:
            # Never wait in the coordinator: partitions still held by their previous owner come
            # with a later watch event / heartbeat, and poll() keeps consuming meanwhile.
            response = self._groups.get_assignment(m, wait_ms=0)
        except UnknownMemberError as e:
            m.rejoin_reason = str(e)
            self._wakeup.set()
            return
        except DMQError as e:
            if not e.retriable:
                raise
            self._log.warning("fetching the assignment failed; retrying", group=m.group_id, error=str(e))
            m.assignment_stale = True
            return
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
            self._log.info(
                "assignment changed", group=m.group_id, member=m.member_id, generation=response.generation,
                revoked=sorted(tp.partition for tp in revoked), assigned=sorted(tp.partition for tp in added),
                owned=sorted(response.partitions), rebalance_in_progress=response.rebalance_in_progress,
            )
        if revoked:
            self._listener_call("on_partitions_revoked", revoked)
        if added:
            self._listener_call("on_partitions_assigned", added)

    def _commit_before_handover(self, m: Membership) -> None:
        """Commit what poll() returned for m's partitions, so their next owner starts there."""
        offsets = {tp: o for tp, o in self._subs.consumed(only_changed=True).items() if tp.topic == m.topic}
        if not offsets:
            return
        try:
            self._commit_sync_now({tp: OffsetAndMetadata(o) for tp, o in offsets.items()})
        except DMQError as e:
            # Ownership already moved (expired) or the broker is away: the next owner re-reads
            # from the last good commit. Duplicates, never loss.
            self._log.warning("commit before the hand-off failed", group=m.group_id, member=m.member_id, error=str(e))

    def _leave_topic(self, topic: str, *, call_listener: bool) -> None:
        m = self._memberships.pop(topic)
        owned = set(self._subs.assigned(topic))
        if owned and self.config.enable_auto_commit and m.rejoin_reason is None:
            offsets = {tp: OffsetAndMetadata(o) for tp, o in self._subs.consumed(only_changed=True).items() if tp.topic == topic}
            try:
                self._commit_sync_now(offsets, {topic: m})
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
            self._groups.leave(m)

    def _listener_call(self, name: str, partitions: set[TopicPartition]) -> None:
        listener = self._subs.listener
        if listener is not None:
            getattr(listener, name)(set(partitions))

    # -- positions -------------------------------------------------------------------------------

    def _initialise_positions(self, in_poll: bool = False) -> None:
        """Find the positions of partitions that have none. Inside poll() a retriable failure
        (a broker away) is logged and retried at the next iteration, so poll() keeps its timeout
        and the other partitions keep flowing; position() retries up to request_timeout_ms."""
        try:
            self._lookup_positions(retry=not in_poll)
        except DMQError as e:
            if not (in_poll and e.retriable):
                raise
            self._log.warning("looking up positions failed; retrying", error=str(e))

    def _lookup_positions(self, retry: bool) -> None:
        need = self._subs.needing_position()
        unknown = [tp for tp in need if self._subs.state(tp).reset is None]
        if unknown:
            group_ids = {tp.topic: self._memberships[tp.topic].group_id for tp in unknown}
            committed = self._offsets.fetch_committed(unknown, group_ids, retry=retry)
            for tp in unknown:
                state = self._subs.get(tp)
                if state is None or state.position is not None:
                    continue
                c = committed.get(tp)
                if c is not None:
                    state.position = state.committed = c.offset
                elif state.start_position >= 0:
                    state.position = state.start_position
                elif state.start_position == START_BY_TIMESTAMP:
                    state.reset = self._memberships[tp.topic].subscription.from_ms
                else:
                    state.reset = EARLIEST
        lookups = {tp: s.reset for tp, s in self._subs.items() if s.position is None and s.reset is not None}
        if lookups:
            found = self._offsets.list_offsets(lookups, retry=retry)
            for tp, offset in found.items():
                state = self._subs.get(tp)
                if state is not None and state.position is None:
                    self._subs.seek(tp, offset)
        self._log.debug("positions initialised", partitions={str(tp): self._subs.state(tp).position for tp in need
                                                            if self._subs.is_assigned(tp)})

    def _assigned_state(self, tp: TopicPartition, what: str):  # type: ignore[no-untyped-def]
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
        tp, state = self._assigned_state(partition, "position()")
        if state.position is None:
            self._initialise_positions()
        position = self._subs.state(tp).position
        assert position is not None
        return position

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Make the next poll() return records of `partition` from `offset` on."""
        self._check_open()
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
        tps = _tps(partitions) or self._subs.assigned()
        checked = [self._assigned_state(tp, what)[0] for tp in tps]
        for tp in checked:
            self._subs.request_reset(tp, where)
            self._fetcher.drop(tp)

    def pause(self, *partitions: TopicPartition | Iterable[TopicPartition]) -> None:
        """Stop fetching and returning records of these partitions until resume()."""
        self._check_open()
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
        self, partitions: TopicPartition | Iterable[TopicPartition]
    ) -> int | None | dict[TopicPartition, int | None]:
        """The group's committed offset (the next offset to consume; None = nothing committed):
        an int for one TopicPartition, a dict for several. Any partition of any topic may be
        asked, assigned or not."""
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
        found = self._offsets.fetch_committed(tps, group_ids)
        out = {tp: (None if (c := found.get(tp)) is None else c.offset) for tp in tps}
        return out[tps[0]] if single else out

    # -- commits ---------------------------------------------------------------------------------

    def commit_sync(self, offsets: Mapping[TopicPartition, int | OffsetAndMetadata] | None = None) -> None:
        """Commit `offsets` (next offset to consume per partition), or the positions of every
        record poll() returned. Raises CommitFailedError when this consumer no longer owns a
        partition (see its message for the settings to change)."""
        self._check_open()
        self._run_commit_callbacks()
        normalised = self._commit_offsets(offsets)
        self._commit_sync_now(normalised)

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
        if offsets is None:
            return {tp: OffsetAndMetadata(o) for tp, o in self._subs.consumed().items()}
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
                         memberships: Mapping[str, Membership] | None = None) -> None:
        if not offsets:
            return
        memberships = self._memberships if memberships is None else memberships
        self._check_can_commit(offsets, memberships)
        # An older async commit landing after this one would move the offset backwards.
        self._wait_for_async_commits()
        try:
            self._offsets.commit_sync(offsets, memberships)
        except CommitFailedError:
            for topic in {tp.topic for tp in offsets}:
                if topic in self._memberships:
                    self._memberships[topic].assignment_stale = True
            raise
        self._subs.mark_committed({tp: o.offset for tp, o in offsets.items()})

    def _commit_async_now(
        self, offsets: dict[TopicPartition, OffsetAndMetadata], callback: CommitCallback | None
    ) -> concurrent.futures.Future[dict[TopicPartition, OffsetAndMetadata]]:
        try:
            self._check_can_commit(offsets, self._memberships)
        except CommitFailedError as e:
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            future.set_exception(e)
        else:
            future = self._offsets.commit_async(offsets, self._memberships)
        self._commits_in_flight.add(future)
        finished = self._finished_commits
        future.add_done_callback(lambda f: finished.append((callback, f)))
        return future

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

    def _wait_for_async_commits(self) -> None:
        if self._commits_in_flight:
            concurrent.futures.wait(list(self._commits_in_flight), timeout=self.config.request_timeout_ms / 1000)
            self._run_commit_callbacks()

    def _maybe_auto_commit(self, now: float) -> None:
        if not self.config.enable_auto_commit or now < self._next_auto_commit:
            return
        if self._auto_commit is not None and not self._auto_commit.done():
            return
        self._next_auto_commit = now + self.config.auto_commit_interval_ms / 1000
        offsets = {tp: OffsetAndMetadata(o) for tp, o in self._subs.consumed(only_changed=True).items()}
        if offsets:
            self._auto_commit = self._commit_async_now(offsets, None)

    # -- close -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Commit (with auto-commit on), hand the partitions back, leave the groups and stop the
        heartbeat thread (within about a second). Safe to call twice."""
        if self._closed:
            return
        try:
            self._wait_for_async_commits()
            for topic in list(self._memberships):
                try:
                    self._leave_topic(topic, call_listener=True)
                except Exception as e:  # noqa: BLE001 - closing must finish whatever a listener does
                    self._log.warning("error while leaving a group", topic=topic, error=str(e))
        finally:
            self._closed = True
            self._heartbeat.stop()
            self._fetcher.close()
            self._cluster.close()
            self._log.info("consumer closed")

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("this DMQConsumer is closed; create a new one")


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
