"""One event store: an event-store topic's partition log, its index and its consumer groups.

The writer thread (owned here, stopped by close()):
  - the writer: one thread that runs every append (condition check, log append, index update),
    every index catch-up and every consumer-group operation, one at a time. Being one thread is
    what makes a conditional append atomic: the condition is checked against an index that
    already holds every earlier append, and nothing else appends to the partition (Produce to an
    event-store topic is refused), so check and append happen under one append lock - this
    thread - with nothing between them. Appends that arrive while the writer is busy are handed
    to it together, as one job: each is still checked, appended and indexed in turn (the index is
    in memory, index.py: a check costs microseconds and sees the appends before it), and the
    index file is written once per append, never fsynced on this path (the log's group commit
    is the fsync; the log is the truth).
Reads run in the writer too: the index's memory is the writer's alone. While the writer is idle
(no job in flight, none queued), the loop appends and reads itself instead (`_idle_index`): jobs
are only submitted from the loop, so the writer cannot start one meanwhile, and a hand-off to the
thread and back cost more than an append. A read is one index
lookup: the index file keeps a copy of each event's payload, metadata and time beside its type
and tags (copied from the log, so catch_up() derives the same records), and no record is read or
parsed. The price: a large read delays the appends queued behind it (a read answer is bounded:
limit events, index.READ_ANSWER_BYTES).

An append is acknowledged once its events are in the log and the index, (flush policy "fsync")
the log is fsynced past them, and (a replicated topic) every in-sync replica has them, as an
acks=all produce (`Replication`; below min_insync_replicas nothing is appended). Readers see events
up to the readable end: the durable end under "fsync" (an event whose fsync failed is rolled back
by the log and must never have been read), the log end under "interval", and never past the high
watermark. When the log rolls back, the index is cut back to it before the next append.

Replicated (DESIGN.md "Replication"): the leader alone appends, checks conditions and runs the
groups; its followers copy the log's bytes (broker/replication/fetcher.py) and keep their index
following it (`follow_soon`), so a follower that becomes leader has an index of its whole log.
That log holds every acknowledged event (the new leader was in sync), so its conditions see them.
Before a follower cuts its log to its new leader's history (KIP-101) the index is cut first
(`truncating`, durably), so it never keeps an event the log lost, even across a crash. The groups'
progress is in the replicated offsets log (progress.py) and is reloaded when this broker becomes
the leader (`reload_groups`); claims are dropped then.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

import structlog

from dmq.broker.events.errors import ConditionFailedError, EventClaimNotHeldError, EventStoreError
from dmq.broker.events.groups import Claimed, GroupManager
from dmq.broker.events.index import EventColumns, EventIndex, PackedEvents, columns_of
from dmq.broker.events.progress import AckWrite, ProgressStore
from dmq.broker.events.query import QueryItem
from dmq.broker.log import LogClosedError, LogError, PartitionLog, StorageUnavailableError
from dmq.broker.replication.replica import NotEnoughReplicas, NotLeaderForPartition
from dmq.proto import records
from dmq.proto.event_headers import encode_events_headers

__all__ = ["EventStore", "NewEvent", "Condition", "Replication", "Unreplicated"]

log = structlog.get_logger(__name__)

T = TypeVar("T")

# An append of at most this many events runs on the event loop when the writer is idle
# (_append_inline); a larger one goes to the writer thread, so the loop is never held long.
INLINE_EVENTS_MAX = 1_000
# Likewise a read of at most this many events (a page of the client's read(): the broker's default).
INLINE_READ_EVENTS_MAX = 10_000


class NewEvent(NamedTuple):
    """An event to append. A tuple, not a dataclass: an append of many events makes one each,
    and a tuple is made several times faster."""

    type: str
    tags: tuple[str, ...]
    payload: bytes
    metadata: bytes = b""


class _IndexWriteFailed(Exception):
    """The batch is in the log (`result`), its index rows could not be written (`cause`)."""

    def __init__(self, result: tuple[int, int], cause: OSError) -> None:
        super().__init__(str(cause))
        self.result = result
        self.cause = cause


@dataclass(frozen=True, slots=True)
class _Job:
    events: Sequence[NewEvent]
    condition: Condition | None
    batch: bytes
    done: asyncio.Future[tuple[int, int]] | None  # None: appended inline, on the loop


@dataclass(frozen=True, slots=True)
class Condition:
    query: tuple[QueryItem, ...]
    after: int


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class Replication(Protocol):
    """The store's partition as this broker replicates it (registry.py). Called on the event loop,
    except check_writable (the writer thread: it only reads)."""

    def check_writable(self) -> None:
        """Raise NotLeaderForPartition / NotEnoughReplicas: nothing may be appended now."""

    def high_watermark(self) -> int | None:
        """Readers stop below it (None: unreplicated, no such limit)."""

    def appended(self) -> None:
        """Right after an append: the followers may take it while the leader fsyncs."""

    async def replicated(self, end_offset: int) -> None:
        """Return once every in-sync replica has the log below end_offset; raise when it cannot
        be acknowledged (NotEnoughReplicas, NotLeaderForPartition)."""


class Unreplicated:
    """One copy: nothing to wait for."""

    def check_writable(self) -> None:
        pass

    def high_watermark(self) -> int | None:
        return None

    def appended(self) -> None:
        pass

    async def replicated(self, end_offset: int) -> None:
        pass


class EventStore:
    def __init__(
        self,
        plog: PartitionLog,
        *,
        progress: Callable[[], ProgressStore],
        replication: Replication | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.plog = plog
        self.topic = plog.topic
        self._progress_factory = progress  # called in the writer when the store opens
        self._replication: Replication = replication or Unreplicated()
        self._clock = clock_ms
        self._writer = ThreadPoolExecutor(1, thread_name_prefix=f"dmq-events-{plog.topic}-w")
        self._index: EventIndex | None = None
        self._groups: GroupManager | None = None
        self._progress: ProgressStore | None = None
        self._opened: asyncio.Future[None] | None = None
        self._closed = False
        self._appended: asyncio.Future[None] | None = None  # resolved by the next append (subscribers)
        self._queue: list[_Job] = []  # appends waiting for the writer
        self._draining = False  # a writer job is appending; it hands the queue on when done
        self._following = False  # a follower's index catch-up is queued on the writer
        # Writer jobs submitted and not yet seen done on the loop: while 0, the writer thread runs
        # nothing and cannot start anything (jobs are only submitted from the loop), so the loop
        # may append itself (`_append_inline`).
        self._writer_jobs = 0

    def __repr__(self) -> str:
        end = self._index.end if self._index is not None else None
        return f"<EventStore {self.topic} indexed_end={end} log_end={self.plog.log_end_offset}>"

    # -- lifecycle ----------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def next_append(self) -> asyncio.Future[None]:
        """A future resolved when the next append becomes readable."""
        if self._appended is None or self._appended.done():
            self._appended = asyncio.get_running_loop().create_future()
        return self._appended

    def _notify(self) -> None:
        fut, self._appended = self._appended, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    def _submit(self, fn: Callable[..., T], *args: object) -> asyncio.Future[T]:
        """fn(*args) on the writer thread, counted in `_writer_jobs` until the loop sees it done.
        On the loop only; RuntimeError when the writer is shut down."""
        fut = asyncio.get_running_loop().run_in_executor(self._writer, fn, *args)
        self._writer_jobs += 1
        fut.add_done_callback(self._writer_job_done)
        return fut

    def _writer_job_done(self, _fut: asyncio.Future[Any]) -> None:
        self._writer_jobs -= 1

    async def ensure_open(self) -> None:
        """Open on first use (catching the index up may read the whole log: done once, shared)."""
        if self._closed:
            raise LogClosedError(f"the event store {self.topic} is closed")
        if self._opened is None:
            self._opened = self._submit(self._open)
        await asyncio.shield(self._opened)

    def _open(self) -> None:
        # a damaged index file is cut at its first bad record (EventIndex), and caught up here
        index = EventIndex(str(self.plog.directory))
        self._index = index
        index.catch_up(self.plog)
        self._progress = self._progress_factory()
        self._groups = GroupManager(index, self._progress)

    async def close(self) -> None:
        """Wait for the work in flight, then close the connections (in their threads)."""
        if self._closed:
            return
        self._closed = True
        self._notify()
        if self._opened is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._opened)
        if self._index is not None:
            await self._submit(self._close_writer)
        await asyncio.to_thread(self._writer.shutdown, True)

    def _close_writer(self) -> None:
        assert self._index is not None
        try:
            self._index.close()
        finally:
            if self._progress is not None:
                self._progress.close()

    async def on_writer(self, fn: Callable[[], T]) -> T:
        await self.ensure_open()
        try:
            fut = self._submit(fn)
        except RuntimeError as e:  # the executor is shut down: the broker is stopping
            raise LogClosedError(f"the event store {self.topic} is closing") from e
        # shielded: a cancelled caller must not leave the store's state half-changed
        return await asyncio.shield(fut)

    # -- replicas -----------------------------------------------------------------------------------

    def _start(self, fn: Callable[[], None], what: str) -> asyncio.Future[None] | None:
        """Queue fn on the writer without waiting for it (its failure is logged); None when the
        store is closed or closing."""
        if self._closed:
            return None
        try:
            if self._opened is None:
                self._opened = self._submit(self._open)
            fut = self._submit(fn)
        except RuntimeError:  # the writer is shut down: the store is closing
            return None

        def done(f: asyncio.Future[None]) -> None:
            if not f.cancelled() and f.exception() is not None:
                log.warning("event store background step failed", topic=self.topic, step=what, error=repr(f.exception()))

        fut.add_done_callback(done)
        return fut

    def _follow_if_open(self) -> None:
        self._following = False
        if self._index is not None:
            self._follow_log()

    def follow_soon(self) -> None:
        """A follower appended its leader's batches: index them (in the writer, one catch-up for
        all the appends queued meanwhile), so this replica is ready to lead."""
        if not self._following and self._start(self._follow_if_open, "follow the log") is not None:
            self._following = True

    async def truncating(self, end_offset: int) -> None:
        """The log is about to be cut to end at `end_offset` (a follower matching its new
        leader's history): the index is cut first, durably, so a crash in between leaves an
        index that the log's end bounds (catch_up then indexes what is missing)."""
        def cut() -> None:
            index = self._writer_index()
            if index.end > end_offset:
                try:
                    index.truncate_to(end_offset)
                except OSError as e:  # the fetcher retries; the log is not cut before the index
                    raise StorageUnavailableError(f"{self.topic}: the event index could not be cut to "
                                                  f"{end_offset}: {e}") from e

        await self.on_writer(cut)

    def reload_groups(self) -> None:
        """This broker now leads the partition: its groups' progress was replayed from the offsets
        log (progress.py); the groups start from it, without claims (workers claim again)."""
        def reload() -> None:
            if self._index is not None and self._progress is not None:
                self._groups = GroupManager(self._index, self._progress)
                log.info("event groups reloaded from the offsets log", topic=self.topic)

        self._start(reload, "reload the groups")

    # -- positions --------------------------------------------------------------------------------

    def readable_end(self) -> int:
        """The last position a reader may see (see the module docstring). On the event loop."""
        plog = self.plog
        end = plog.visible_end_offset
        if plog.config.flush_policy == "fsync":
            end = min(plog.durable_end_offset, end)
        hw = self._replication.high_watermark()
        return end if hw is None else min(end, hw)

    # -- append -----------------------------------------------------------------------------------

    async def append(self, events: Sequence[NewEvent], condition: Condition | None) -> tuple[int, int]:
        """Store `events` atomically unless the condition fails (ConditionFailedError); the last
        position and the append time."""
        max_batch = self.plog.config.max_batch_bytes
        types, tags, payloads, metadata = zip(*events)  # NewEvents are tuples: the columns, in C
        batch = records.encode(
            payloads,
            encoded_headers=encode_events_headers(types, tags, metadata),
            timestamp_ms=self._clock(),
            max_batch_bytes=max_batch,
            max_record_bytes=max_batch,
        )
        await self.ensure_open()
        if self._may_append_inline(len(events)):
            info_end, append_ms = self._append_inline(_Job(events, condition, batch, None))
        else:
            done: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
            self._queue.append(_Job(events, condition, batch, done))
            if not self._draining:
                self._drain()
            info_end, append_ms = await asyncio.shield(done)
        self._replication.appended()
        if self.plog.config.flush_policy == "fsync":
            try:
                await self.plog.wait_durable(info_end)
            except StorageUnavailableError:
                # The log rolled back past these events: the index follows before the next append.
                await self.on_writer(self._follow_log)
                raise
        try:
            await self._replication.replicated(info_end)
        except (NotEnoughReplicas, NotLeaderForPartition) as e:
            # as an acks=all produce's: stored on this leader, maybe not on a future one
            raise type(e)(f"{e}; the events (up to position {info_end}) are stored on this leader but not "
                          "acknowledged: read before appending them again") from e
        self._notify()
        return info_end, append_ms

    def _idle_index(self) -> EventIndex | None:
        """The index, when the loop may use it itself: the writer idle with nothing queued (so
        nothing else reads or changes the index meanwhile: the loop is the append lock now) and
        the index caught up with the log; else None (the writer's turn)."""
        index = self._index
        if (self._writer_jobs or self._queue or index is None or self._closed
                or index.end != self.plog.log_end_offset):
            return None
        return index

    def _may_append_inline(self, count: int) -> bool:
        """_idle_index(), and the append small enough not to hold the loop long."""
        return count <= INLINE_EVENTS_MAX and self._idle_index() is not None

    def _append_inline(self, job: _Job) -> tuple[int, int]:
        """_append_all for one append, on the loop: no hand-off to the writer thread and back
        (a submit, a thread wake-up, a call_soon_threadsafe and the GIL passed twice cost more
        server CPU than the append itself). Once the batch is in the log its group-commit fsync
        starts in the flush pool (PartitionLog.begin_flush, when the disk is too slow for the
        loop), so the index record is built and written while the disk syncs. The index file's
        periodic fsync goes to the writer."""
        [result] = self._append_all([job], on_loop=True)
        index = self._index
        if index is not None and index.sync_due():
            self._start(index.sync, "sync the event index")
        if isinstance(result, Exception):
            raise result
        return result

    def _drain(self) -> None:
        """Hand every queued append to the writer as one job (one index transaction for all)."""
        jobs, self._queue = self._queue, []
        try:
            fut = self._submit(self._append_all, jobs)
        except RuntimeError:  # the writer is shut down: the store is closing
            self._draining = False
            for job in jobs:
                assert job.done is not None
                job.done.set_exception(LogClosedError(f"the event store {self.topic} is closing"))
            return
        self._draining = True

        def finished(f: asyncio.Future[list[tuple[int, int] | Exception]]) -> None:
            error = f.exception() if not f.cancelled() else LogClosedError(f"the event store {self.topic} is closing")
            results: list[tuple[int, int] | BaseException] = [error] * len(jobs) if error else list(f.result())
            for i, job in enumerate(jobs):
                assert job.done is not None  # queued jobs have their future
                if job.done.done():
                    continue
                result = results[i] if i < len(results) else LogClosedError(f"the event store {self.topic} is closing")
                if isinstance(result, BaseException):
                    job.done.set_exception(result)
                else:
                    job.done.set_result(result)
            if self._queue:
                self._drain()
            else:
                self._draining = False

        fut.add_done_callback(finished)

    def _follow_log(self) -> None:
        assert self._index is not None
        if self._index.end != self.plog.log_end_offset:
            self._index.catch_up(self.plog)

    def _append_all(self, jobs: list[_Job], *, on_loop: bool = False) -> list[tuple[int, int] | Exception]:
        """In the writer (or, `on_loop`, on the event loop while the writer is idle:
        _append_inline): each job's condition checked against the index, which already holds the
        jobs before it (staged in the same transaction), then its batch appended and indexed.

        When the index fails (its file cannot be written), the jobs not yet done get a retriable
        error: checking them against an index that lacks events would be wrong. The events
        already appended are in the log (the truth) and are reported stored; they are indexed
        again from the log (by the writer when on the loop: a catch-up may read much of the log)."""
        if self._closed:
            raise LogClosedError(f"the event store {self.topic} is closing")
        index = self._index
        assert index is not None
        out: list[tuple[int, int] | Exception] = []
        try:
            self._follow_log()
            on_logged = self.plog.begin_flush if on_loop else None
            with index.transaction(sync=not on_loop):
                for job in jobs:
                    try:
                        self._replication.check_writable()
                        out.append(self._append_one(index, job.events, job.condition, job.batch, on_logged))
                    except (EventStoreError, LogError, records.RecordsError, NotLeaderForPartition,
                            NotEnoughReplicas) as e:
                        out.append(e)
                    except _IndexWriteFailed as e:
                        out.append(e.result)
                        raise e.cause from None
        except OSError as e:
            log.warning("event index write failed; re-indexing from the log", topic=self.topic, error=str(e))
            if on_loop:
                self._start(self._follow_log, "re-index from the log")
            else:
                with contextlib.suppress(OSError):
                    index.catch_up(self.plog)
            out += [StorageUnavailableError(f"{self.topic}: the event index is unavailable ({e}); nothing of this "
                                            "append was stored; retry") for _ in jobs[len(out):]]
        return out

    def _append_one(
        self, index: EventIndex, events: Sequence[NewEvent], condition: Condition | None, batch: bytes,
        on_logged: Callable[[], object] | None = None,
    ) -> tuple[int, int]:
        if condition is not None:
            conflict = index.first_match(condition.query, condition.after, index.end)
            if conflict is not None:
                raise ConditionFailedError(
                    f"append condition failed: the event at position {conflict} (after {condition.after}) "
                    "matches fail_if_events_match; nothing was stored: read again and decide anew",
                    conflict,
                )
        info = self.plog.append(batch)
        if on_logged is not None:  # on the loop: the log's fsync starts while the index record is written
            on_logged()
        # every record of the batch has its first timestamp (append() encodes one), as the log keeps it
        ms = records.read_header(batch, 0, max_batch_bytes=len(batch)).first_timestamp
        result = (info.last_offset + 1, info.append_time_ms)
        try:
            # the same records catch_up() derives from the log (index.py), column by column
            base, n = info.base_offset, len(events)
            types, tags, payloads, metadata = zip(*events)
            index.stage_columns(range(base + 1, base + 1 + n), types, list(map("\n".join, tags)), [base] * n,
                                payloads, metadata, [ms] * n, info.last_offset + 1, tags)
        except OSError as e:
            raise _IndexWriteFailed(result, e) from e
        return result

    # -- read -------------------------------------------------------------------------------------

    async def read_packed(self, query: Sequence[QueryItem], after: int, limit: int) -> tuple[PackedEvents, int]:
        """Matching events in (after, readable end], at most `limit` and at most
        index.READ_ANSWER_BYTES of them (at least one), as the encoded answer
        (EventIndex.read_packed, head = the readable end), and the head position. From the index
        alone (its fragments hold each event whole), no record read from the log."""
        await self.ensure_open()
        until = self.readable_end()
        index = self._idle_index() if limit <= INLINE_READ_EVENTS_MAX else None
        if index is not None:  # as an append: on the loop while the writer is idle (no hand-off)
            return index.read_packed(query, after, until, limit), until
        return await self.on_writer(lambda: self._writer_index().read_packed(query, after, until, limit)), until

    async def read(self, query: Sequence[QueryItem], after: int, limit: int) -> tuple[EventColumns, int]:
        """read_packed(), as columns (subscriptions, and clients that ask for one message per event)."""
        packed, until = await self.read_packed(query, after, limit)
        return columns_of(packed.answer), until

    def _writer_index(self) -> EventIndex:
        """In the writer: the index, caught up with the log first (a replica that just became
        the leader may not have indexed all it copied yet; a no-op otherwise)."""
        assert self._index is not None
        self._follow_log()
        return self._index

    # -- groups -----------------------------------------------------------------------------------

    async def groups(self, fn: Callable[[GroupManager, int, int], T]) -> T:
        """Run fn(groups, readable end, now) in the writer thread."""
        until = self.readable_end()
        now = self._clock()

        def run() -> T:
            self._writer_index()
            assert self._groups is not None
            return fn(self._groups, until, now)

        return await self.on_writer(run)

    async def describe(self, fn: Callable[[EventIndex, GroupManager, int, int], T]) -> T:
        """Run fn(index, groups, readable end, now) in the writer thread (the index and the groups
        change only there)."""
        until = self.readable_end()
        now = self._clock()

        def run() -> T:
            index = self._writer_index()
            assert self._groups is not None
            return fn(index, self._groups, until, now)

        return await self.on_writer(run)

    async def write_acks(self, acks: list[AckWrite]) -> None:
        """Make the acks that groups.py applied in memory (`unwritten`) durable, on the loop, where
        concurrent ones share the offsets log's fsync. If the write fails, the groups are reloaded
        from what is durable (their claims dropped, as at a failover) and the error raised: no
        view keeps an ack that was not stored."""
        if not acks:
            return
        assert self._progress is not None
        groups = self._groups
        for a in acks:
            # The group was reset (or reloaded) since the ack was applied: writing it now would
            # land after the reset's tombstones and undo them. Checked in the same step as the
            # append (put_acks appends before it first yields), so no reset can come between.
            if groups is None or groups.record(a.group) is not a.record or a.record is None or a.record.resets != a.resets:
                raise EventClaimNotHeldError(f"group {a.group!r} was reset (or its leader changed) while partition "
                                        f"{a.key!r} was acknowledged: the ack is not stored; claim again")
        try:
            await self._progress.put_acks(acks)
        except BaseException:
            self.reload_groups()
            raise

    async def claim_all(
        self, fn: Callable[[GroupManager, int, int], tuple[T, list[Claimed]]]
    ) -> tuple[tuple[T, list[Claimed]], list[EventColumns]]:
        """fn's result, with the events of each claim it returns (from the index, as reads), in
        the same writer job (a prefetching worker's several claims)."""
        until = self.readable_end()
        now = self._clock()

        def run() -> tuple[tuple[T, list[Claimed]], list[EventColumns]]:
            index = self._writer_index()
            assert self._groups is not None
            result = fn(self._groups, until, now)
            return result, [index.events_at([p for p, _ in c.events]) for c in result[1]]

        return await self.on_writer(run)
