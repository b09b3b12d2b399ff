"""Queue mode on a partition's leader: pops grant leases, acks advance the group durably.

One `QueueManager` per broker (owned by BrokerNode). Everything runs on the broker's event loop,
so choosing a partition and granting its lease happen with no await in between: two pops can
never get the same (partition, group). The coordinator is on no path here except the creation
of a dead-letter topic.

Pop: among the topic's partitions this broker leads that have records the group has not
acknowledged and no live lease for the group, take the one whose first pending record is oldest
(append time), then the one with most pending; lease it and return up to max_records from the
group's acknowledged offset. Queue settings (topic config) narrow what is pending: `delay_ms`
hides records appended less than that long ago, `window_buffer_ms` skips a partition that got a
record that recently, and records older than `max_wait_ms` at pop time are dead-lettered as
expired instead of being handed out. With nothing to give, a pop waits until an append or a
release on the topic wakes it, or its timeout passes.

Finishing: ack advances the group's offset (fsynced before the answer) and releases the lease;
nack counts a failed delivery of the record that failed (the records before it are acknowledged)
and releases; reject dead-letters one record and moves past it, keeping the lease; renew pushes
the expiry out. The leader's timer releases an expired lease within EXPIRY_TICK_S of its expiry
and counts a failed delivery of its first record. At `max_delivery_attempts` failures the record
is dead-lettered and the group moves past it.

Leases are durable and replicated as the progress is (ProgressStore: entries of the partition's
internal offsets log): a grant, a renewal and a reject's narrowing are written before they are
answered, and the end of a lease (ack, nack, expiry) is a tombstone in the same batch as the
progress it writes, so a finish costs no extra fsync. The in-memory table is the view: a broker
that becomes a partition's leader (or starts) rebuilds the partition's leases from the log, with
the time each had left by the wall clock, so a worker's ack or renew works at the new leader and
no one else is handed the partition until its lease ends or expires (issue 15 item 6).
Acknowledged offsets, delivery counts and last errors are durable, so nothing acknowledged comes
back and no count is lost.

Max queue size: a produce that would take the records not acknowledged by the topic's queue
groups (over the partitions this broker leads) above this broker's pro rata share of
`max_queue_size` is refused whole, before anything is appended.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NoReturn

import structlog

from dmq.broker.log import PartitionLog, UnknownPartitionError
from dmq.broker.queue.dead_letters import (
    REASON_EXPIRED,
    REASON_MAX_ATTEMPTS,
    REASON_REJECTED,
    DeadLetter,
    DeadLetterWriter,
    Written,
)
from dmq.broker.queue.errors import LeaseBusyError, LeaseNotLiveError, QueueNotLeaderError, QueueOverLimitError
from dmq.broker.queue.leases import Lease, LeaseTable
from dmq.broker.queue.ports import QueueHost
from dmq.broker.queue.progress import (
    LEASE_ENDED,
    MAX_ERROR_CHARS,
    OffsetProgressStore,
    Progress,
    ProgressStore,
)
from dmq.proto import dmq_pb2 as pb
from dmq.proto import limits, records
from dmq.proto.server.domain_errors import DomainError, ErrorCode

log = structlog.get_logger(__name__)

# The timer looks for expired leases at least this often: expiry is released within ~this of its time.
EXPIRY_TICK_S = 0.1
# A pop waiting on a topic with delay_ms / window_buffer_ms re-checks this often (records become
# available by the clock, not by an append).
TIME_RULE_RECHECK_S = 0.05
# Records dead-lettered as expired in one step (one batch, one fsync).
MAX_EXPIRED_PER_STEP = 500
# Added to a pop's estimated read size: covers the batch that holds the first record.
READ_SLACK_BYTES = 16 * 1024
# Bytes of stored batches kept decoded between pops (_CutBatch, one per partition at most); past
# this the oldest entries go.
CUT_BATCH_CACHE_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Popped:
    lease: Lease
    records: bytes
    delivery_count: int


def _setting(config: pb.TopicConfig | None, name: str, default: int) -> int:
    if config is None or not config.HasField(name):
        return default
    value: int = getattr(config, name)
    return value


def _retrieve(task: asyncio.Future[None]) -> None:
    """A shielded write's outcome is its caller's; when the caller went away it is not an error."""
    if not task.cancelled():
        task.exception()


def _lease_expired(lease_id: str) -> NoReturn:
    raise LeaseNotLiveError(lease_id)


def slice_records(data: bytes, start: int, stop: int, known: records.RecordBatch | None = None) -> bytes:
    """The batches of `data` restricted to offsets [start, stop): whole batches pass as they are,
    a batch that straddles a bound is cut to the records inside (records.slice_batch: byte ranges
    of its body, after its CRC is checked, so no record is decoded and nothing damaged on disk
    goes out under a fresh CRC). `known`: a batch of `data` decoded (and checked) before."""
    out: list[bytes | memoryview] = []
    view = memoryview(data)
    for pos, h in records.iter_headers(view):
        if h.last_offset < start:
            continue
        if h.base_offset >= stop:
            break
        if h.base_offset >= start and h.last_offset < stop:
            out.append(view[pos : pos + h.total_size])
        else:
            batch = known if known is not None and known.header == h else records.decode(view, pos)
            out.append(records.slice_batch(batch, start, stop))
    return b"".join(out)


@dataclass(slots=True)
class _CutBatch:
    """The stored batch a pop's lease ended inside, decoded: the next pops of the partition take
    the rest of it from here instead of reading and checking it again (a producer's batch of ~10,000
    records is ~10 pops of 1,000; each read 1 MB and checked its CRC)."""

    plog: PartitionLog
    rollback_epoch: int  # the bytes are the log's while its rollback epoch is this
    batch: records.RecordBatch
    data: bytes  # the batch's bytes (batch views them)


class QueueManager:
    def __init__(self, node: QueueHost, progress: ProgressStore | None = None) -> None:
        self._node = node
        self.progress: ProgressStore = progress or OffsetProgressStore(node.offsets)
        self.leases = LeaseTable()
        self.dead_letters = DeadLetterWriter(node, appended=self.on_append)
        self._configs: dict[str, pb.TopicConfig] = {}
        self._partition_counts: dict[str, int] = {}
        self._led: dict[str, set[int]] = {}
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._admitting: dict[str, int] = {}  # records of produces between admission and append
        self._cut: dict[tuple[str, int], _CutBatch] = {}  # bounded by CUT_BATCH_CACHE_BYTES
        self._cut_bytes = 0
        self._timer: asyncio.Task[None] | None = None
        self._expiring: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        # this broker now leads a partition (its offsets log was replayed): take over its leases
        node.offsets.add_reload_listener(self._restore_leases)

    def __repr__(self) -> str:
        return f"<QueueManager topics={len(self._led)} leases={len(self.leases)}>"

    # -- lifecycle (BrokerNode) --------------------------------------------------------------------

    def start(self) -> None:
        """After the offset store is open: load progress, start the expiry timer."""
        if isinstance(self.progress, OffsetProgressStore):
            self.progress.load()
        for topic, partition in self.progress.lease_partitions():
            self._restore_leases(topic, partition)
        self._timer = asyncio.create_task(self._expiry_loop(), name=f"broker-{self._node.broker_id}-queue-expiry")

    def end_pops(self) -> None:
        """Answer waiting pops now (empty) and every later one at once: the broker is stopping,
        and a long-poll must not hold the server's shutdown grace period open."""
        self._stopping.set()
        for topic in list(self._waiters):
            self._wake(topic)

    async def stop(self) -> None:
        self.end_pops()
        tasks = [t for t in (self._timer, *self._expiring) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        await self.dead_letters.close()

    # -- partitions (BrokerNode) -------------------------------------------------------------------

    def configure(self, request: pb.CreatePartitionsRequest) -> None:
        config = pb.TopicConfig()
        config.CopyFrom(request.config)
        self._configs[request.topic] = config
        led = self._led.setdefault(request.topic, set())
        led.update(request.partitions)
        total = request.topic_partition_count or len(led)
        self._partition_counts[request.topic] = max(total, self._partition_counts.get(request.topic, 0), len(led))

    def forget(self, topic: str, partitions: set[int] | None) -> None:
        led = self._led.get(topic, set())
        led.difference_update(partitions if partitions is not None else set(led))
        if not led:
            self._led.pop(topic, None)
            self._configs.pop(topic, None)
            self._partition_counts.pop(topic, None)
        self.leases.drop_topic(topic, partitions)
        self.progress.forget_topic(topic, partitions)
        for key in [k for k in self._cut if k[0] == topic and (partitions is None or k[1] in partitions)]:
            self._drop_cut(key)

    def on_append(self, topic: str, partition: int) -> None:
        self._wake(topic)

    def _restore_leases(self, topic: str, partition: int) -> None:
        """The partition's leases as its log has them (this broker starts, or now leads it): the
        table's own for it may be stale (from an earlier leadership here) and go."""
        for lease in self.leases.of_partition(topic, partition):
            self.leases.release(lease)
        now, now_ms = time.monotonic(), int(time.time() * 1000)
        stored = self.progress.stored_leases(topic, partition)
        for group, entry in stored.items():
            self.leases.restore(topic, partition, group, entry, now, now_ms)
        if stored:
            log.info("queue leases restored", topic=topic, partition=partition, leases=len(stored))
        self._wake(topic)

    # -- helpers -----------------------------------------------------------------------------------

    def _logs(self, topic: str) -> Iterator[tuple[int, PartitionLog]]:
        logs = self._node.logs
        for partition in sorted(self._led.get(topic, ())):
            try:
                yield partition, logs.get(topic, partition)
            except UnknownPartitionError:
                continue

    def _acked(self, topic: str, partition: int, group: str, plog: PartitionLog) -> tuple[int, Progress | None]:
        progress = self.progress.get(topic, partition, group)
        start = plog.log_start_offset
        if progress is None:
            return start, None
        return max(progress.acked_offset, start), progress

    def _max_attempts(self, topic: str) -> int:
        return _setting(self._configs.get(topic), "max_delivery_attempts", limits.DEFAULT_MAX_DELIVERY_ATTEMPTS)

    def _wake(self, topic: str) -> None:
        waiters = self._waiters.pop(topic, None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    async def _wait(self, topic: str, timeout_s: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(topic, set()).add(fut)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fut, timeout_s)
        finally:
            waiters = self._waiters.get(topic)
            if waiters is not None:
                waiters.discard(fut)
                if not waiters:
                    del self._waiters[topic]

    def _check_topic_here(self, topic: str) -> None:
        if topic not in self._led:
            raise DomainError(
                f"broker {self._node.broker_id} leads no partition of topic {topic!r} "
                "(it does not exist, or its partitions are led by other brokers: pop from those)",
                code=ErrorCode.NOT_FOUND,
            )

    def default_lease_ms(self, topic: str) -> int:
        return _setting(self._configs.get(topic), "lease_ms", limits.DEFAULT_LEASE_MS)

    # -- pop ---------------------------------------------------------------------------------------

    async def pop(
        self, topic: str, group: str, max_records: int, lease_ms: int, timeout_s: float, max_bytes: int
    ) -> Popped | None:
        self._check_topic_here(topic)
        deadline = time.monotonic() + timeout_s
        config = self._configs.get(topic)
        time_rules = config is not None and (config.HasField("delay_ms") or config.HasField("window_buffer_ms"))
        while True:
            popped = await self._try_pop(topic, group, max_records, lease_ms, max_bytes)
            if popped is not None:
                return popped
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._stopping.is_set():
                return None
            await self._wait(topic, min(remaining, TIME_RULE_RECHECK_S) if time_rules else remaining)
            self._check_topic_here(topic)

    def _select(
        self, topic: str, group: str, now_ms: int, after_ack: Lease | None = None
    ) -> tuple[int, PartitionLog, int, int] | None:
        """(partition, log, acked offset, end of what may be handed out) of the best candidate.
        `after_ack`: a lease of the group being acknowledged; its partition is a candidate from
        where the lease ends, as it will be once the ack is stored."""
        config = self._configs.get(topic)
        delay_ms = _setting(config, "delay_ms", 0)
        window_ms = _setting(config, "window_buffer_ms", 0)
        best: tuple[tuple[int, int], int, PartitionLog, int, int] | None = None
        for partition, plog in self._logs(topic):
            reuse = after_ack is not None and after_ack.partition == partition
            if not reuse and self.leases.held(topic, partition, group) is not None:
                continue
            end = self._node.replication.readable_end(topic, partition, plog)  # replicated: the high watermark
            if end is None:
                continue  # a follower's replica: its leader serves the queue
            if reuse:
                assert after_ack is not None
                acked = max(after_ack.end_offset, plog.log_start_offset)
            else:
                acked, _ = self._acked(topic, partition, group, plog)
            if acked >= end:
                continue
            if window_ms and plog.last_append_ms > now_ms - window_ms:
                continue
            if delay_ms:
                # Batches appended after now - delay_ms are not yet visible to the queue.
                ready = plog.offset_for_time(now_ms - delay_ms + 1)
                if ready is not None:
                    end = min(end, ready)
                if acked >= end:
                    continue
            head_time = plog.append_time_of(acked) or 0
            rank = (head_time, acked - end)
            if best is None or rank < best[0]:
                best = (rank, partition, plog, acked, end)
        return None if best is None else best[1:]

    async def _try_pop(
        self, topic: str, group: str, max_records: int, lease_ms: int, max_bytes: int, after_ack: Lease | None = None
    ) -> Popped | None:
        """One look for records (no wait). With `after_ack` (a busy lease of the group whose ack
        rides on this pop; topics without max_wait_ms) its partition may be taken again: then
        the ack's progress and the new lease are one batch, one fsync (hand-over)."""
        while True:
            now_ms = int(time.time() * 1000)
            chosen = self._select(topic, group, now_ms, after_ack)
            if chosen is None:
                return None
            partition, plog, acked, end = chosen
            old = after_ack if after_ack is not None and after_ack.partition == partition else None
            max_wait_ms = _setting(self._configs.get(topic), "max_wait_ms", 0)
            if max_wait_ms and old is None:
                fresh = plog.offset_for_time(now_ms - max_wait_ms)
                expired_end = min(end, plog.log_end_offset if fresh is None else fresh)
                if expired_end > acked:
                    await self._expire_records(topic, partition, group, plog, acked, expired_end)
                    continue  # choose again: the partition may have nothing left
            stop = min(end, acked + max_records)
            cut = self._cut_batch(topic, partition, plog, acked)
            data = self._read(plog, acked, stop, end, max_bytes, cut)
            last = acked
            for _pos, h in records.iter_headers(data):
                last = h.last_offset + 1
            stop = min(stop, last)
            if stop <= acked:
                return None
            progress = self.progress.get(topic, partition, group)
            count = progress.delivery_count if progress is not None and progress.acked_offset == acked else 0
            now, wall_ms = time.monotonic(), int(time.time() * 1000)
            if old is None:
                lease = self.leases.grant(topic, partition, group, acked, stop, lease_ms, now, wall_ms)
            else:
                lease = self.leases.hand_over(old, stop, lease_ms, now, wall_ms)
            # Granted here at once (no other pop can choose the pair), answered once durable. A
            # task: the table follows the write's outcome even when this caller goes away.
            lease.busy = True
            write = asyncio.ensure_future(self._grant_durably(lease, old))
            write.add_done_callback(_retrieve)
            await asyncio.shield(write)
            return Popped(lease, self._slice(topic, partition, plog, data, acked, stop, cut), count)

    def _cut_batch(self, topic: str, partition: int, plog: PartitionLog, start: int) -> _CutBatch | None:
        """The kept batch holding offset `start` of the partition, if it is still the log's."""
        cut = self._cut.get((topic, partition))
        if cut is None:
            return None
        h = cut.batch.header
        if cut.plog is not plog or cut.rollback_epoch != plog.rollback_epoch or start < plog.log_start_offset:
            self._drop_cut((topic, partition))
            return None
        return cut if h.base_offset <= start <= h.last_offset else None

    def _slice(
        self, topic: str, partition: int, plog: PartitionLog, data: bytes, start: int, stop: int, cut: _CutBatch | None
    ) -> bytes:
        """slice_records, keeping the last batch when the lease ends inside it (the next pop's)."""
        out = slice_records(data, start, stop, None if cut is None else cut.batch)
        key = (topic, partition)
        if cut is not None and cut.batch.header.last_offset >= stop:
            return out  # kept already, and still holds the next pop's first records
        self._drop_cut(key)
        view = memoryview(data)
        for pos, h in records.iter_headers(view):
            if h.base_offset < stop <= h.last_offset:  # the lease ends inside this batch
                if h.total_size <= CUT_BATCH_CACHE_BYTES // 4:
                    own = bytes(view[pos : pos + h.total_size])
                    self._keep_cut(key, _CutBatch(plog, plog.rollback_epoch, records.decode(own), own))
                break
        return out

    def _keep_cut(self, key: tuple[str, int], cut: _CutBatch) -> None:
        self._drop_cut(key)  # the partition's earlier one, counted out
        self._cut[key] = cut
        self._cut_bytes += len(cut.data)
        while self._cut_bytes > CUT_BATCH_CACHE_BYTES:
            self._drop_cut(next(iter(self._cut)))  # the oldest

    def _drop_cut(self, key: tuple[str, int]) -> None:
        cut = self._cut.pop(key, None)
        if cut is not None:
            self._cut_bytes -= len(cut.data)

    async def _grant_durably(self, lease: Lease, old: Lease | None) -> None:
        """Store a busy new lease (with `old`'s ack when it is a hand-over); on failure it goes and
        `old` holds the partition again, idle (its ack failed too)."""
        # as _ack_durably: progress only when the ack moved it (a new Progress resets the count)
        advanced = old is not None and lease.start_offset > old.start_offset
        progress = Progress(lease.start_offset) if advanced else None
        try:
            await self.progress.save(lease.topic, lease.partition, lease.group, progress, lease)
        except BaseException:
            lease.busy = False
            if old is None:
                self._finish(lease)
            else:
                self.leases.take_back(lease, old)
                old.busy = False
            raise
        lease.busy = False

    @staticmethod
    def _read(plog: PartitionLog, start: int, stop: int, end: int, max_bytes: int, cut: _CutBatch | None = None) -> bytes:
        """Whole batches from the one holding `start`, enough for [start, stop) when max_bytes
        allows. The read is sized by the log's average record size: reading max_bytes each time
        copied and walked megabytes to hand out a few records. `cut`: the batch holding `start`,
        kept from an earlier pop (not read again)."""
        records_in_log = max(plog.log_end_offset - plog.log_start_offset, 1)
        per_record = plog.size_bytes / records_in_log
        want = min(max_bytes, int(per_record * (stop - start) * 1.25) + READ_SLACK_BYTES)
        data = cut.data if cut is not None else plog.read(start, want, max_offset=end)
        parts = [data]
        got = len(data)
        while got < max_bytes:
            last = start
            for _pos, h in records.iter_headers(parts[-1]):
                last = h.last_offset + 1
            if last >= stop or last >= end or not parts[-1]:
                break
            more = plog.read(last, min(max_bytes - got, want), max_offset=end)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def _expire_records(
        self, topic: str, partition: int, group: str, plog: PartitionLog, acked: int, expired_end: int
    ) -> None:
        """Dead-letter records older than max_wait_ms, holding the partition meanwhile (a busy
        lease no pop can take), then move the group past them."""
        now = time.monotonic()
        stop = min(expired_end, acked + MAX_EXPIRED_PER_STEP)
        hold = self.leases.grant(topic, partition, group, acked, stop, limits.LEASE_MS_MAX, now, int(time.time() * 1000))
        hold.busy = True
        try:
            letters = [
                DeadLetter(r, 0, "not popped within max_wait_ms", REASON_EXPIRED)
                for r in self._records(plog, acked, stop)
            ]
            await self.dead_letters.write(topic, partition, group, letters)
            await self.progress.save(topic, partition, group, Progress(stop))
            log.info("queue records expired", topic=topic, partition=partition, group=group, records=len(letters))
        finally:
            hold.busy = False
            self.leases.release(hold)
            self._wake(topic)

    @staticmethod
    def _records(plog: PartitionLog, start: int, stop: int) -> list[records.Record]:
        out: list[records.Record] = []
        offset = start
        while offset < stop:
            # No max_offset: it hides the whole batch holding it, and `stop` may be mid-batch.
            data = plog.read(offset, 1 << 20)
            if not data:
                break
            before = len(out)
            for batch in records.decode_batches(data):
                out.extend(r for r in batch.iter_from(offset) if r.offset < stop)
            if len(out) == before:
                break
            offset = out[-1].offset + 1
        return out

    # -- finishing ---------------------------------------------------------------------------------

    def lease_of(self, lease_id: str) -> Lease | None:
        """The live lease of this id, to see whose it is (None: the call will find it not live)."""
        return self.leases.get(lease_id, time.monotonic())

    def _live(self, lease_id: str) -> Lease:
        now = time.monotonic()
        lease = self.leases.get(lease_id, now)
        if lease is None or (lease.busy and lease.expiry <= now):  # past expiry: the timer's now
            _lease_expired(lease_id)
        replica = self._node.replication.get(lease.topic, lease.partition)
        if replica is not None and replica.leading is None:
            # an earlier leadership's view: the partition's leader has the lease (refused before
            # anything changed; the client sends the call there)
            raise QueueNotLeaderError(replica.not_leader_message(self._node.broker_id))
        if lease.busy:
            raise LeaseBusyError(lease_id)
        return lease

    @staticmethod
    def _check_in(lease: Lease, offset: int, field: str, *, allow_before: bool = False) -> None:
        low = lease.start_offset - 1 if allow_before else lease.start_offset
        if not low <= offset < lease.end_offset:
            raise DomainError(
                f"{field} must be within {low}..{lease.end_offset - 1} (the lease's unacknowledged "
                f"records of {lease.topic}[{lease.partition}]), got {offset}",
                code=ErrorCode.INVALID_ARGUMENT,
            )

    def _finish(self, lease: Lease) -> None:
        self.leases.release(lease)
        self._wake(lease.topic)

    async def ack(self, lease_id: str, up_to_offset: int | None, keep_lease: bool = False) -> int:
        """Acknowledge through up_to_offset (None: all) and release the lease; with `keep_lease`
        and records left after it, the lease stays live for them instead, narrowed (as a reject
        narrows it): the progress and the narrowed lease are one write."""
        lease = self._live(lease_id)
        if up_to_offset is not None:
            self._check_in(lease, up_to_offset, "up_to_offset", allow_before=True)
        new = lease.end_offset if up_to_offset is None else up_to_offset + 1
        lease.busy = True
        if keep_lease and new < lease.end_offset:
            try:
                if new > lease.start_offset:
                    narrowed = dataclasses.replace(lease, start_offset=new)
                    await self.progress.save(lease.topic, lease.partition, lease.group, Progress(new), narrowed)
                    lease.start_offset = new
            finally:
                lease.busy = False
            return new
        return await self._ack_durably(lease, new)

    async def _ack_durably(self, lease: Lease, new: int) -> int:
        """Make the ack of a busy lease durable, then release it (kept, idle, when that failed)."""
        try:
            progress = Progress(new) if new > lease.start_offset else None
            await self.progress.save(lease.topic, lease.partition, lease.group, progress, LEASE_ENDED)
        finally:
            lease.busy = False
        self._finish(lease)
        return new

    async def ack_and_pop(
        self, lease_id: str, topic: str, group: str, max_records: int, lease_ms: int, timeout_s: float, max_bytes: int,
        up_to_offset: int | None = None,
    ) -> tuple[int, Popped | None]:
        """An ack riding on a pop (issue 16: a cycle is one round trip and at most one fsync).

        When the acknowledged partition is the one the pop would take now, it is handed over: the
        ack's progress and the next lease are one batch of the partition's offsets log, so the
        cycle costs one durable write, answered once it is stored (the pop's answer is the ack's).
        Otherwise the ack's write and the pop's choice, read and grant overlap: the acknowledged
        partition stays held (busy) until the ack is durable, so the pop takes another one, or
        waits for the release like any pop. The answer waits for both; when the ack fails, a
        lease the pop took meanwhile is released uncounted and the error returned.

        `up_to_offset` (inclusive): only the records through it are acknowledged; the rest of the
        lease is released without a failed delivery (a prefetching worker gives back records it
        never handed out), so the next lease of the partition starts after it."""
        lease = self._live(lease_id)  # checked first: a refused ack pops nothing
        if up_to_offset is not None:
            self._check_in(lease, up_to_offset, "ack_up_to_offset", allow_before=True)
        new = lease.end_offset if up_to_offset is None else up_to_offset + 1
        lease.busy = True
        if (
            lease.topic == topic and lease.group == group and not self._stopping.is_set()
            and not _setting(self._configs.get(topic), "max_wait_ms", 0)
        ):
            # The hand-over takes the partition from where the ack ends (the lease's end, for it).
            end = lease.end_offset
            lease.end_offset = new
            chosen = self._select(topic, group, int(time.time() * 1000), lease)
            if chosen is not None and chosen[0] == lease.partition:
                # The acknowledged partition is the one to pop: hand it over, the ack and the
                # next lease in one write (one fsync) answered together.
                try:
                    popped = await self._try_pop(topic, group, max_records, lease_ms, max_bytes, lease)
                except BaseException:
                    lease.end_offset = end
                    lease.busy = False
                    raise
                if popped is not None and popped.lease.key == lease.key:
                    return new, popped
                if popped is not None:  # a lease elsewhere after all: the ack on its own
                    return await self._ack_durably(lease, new), popped
            lease.end_offset = end
        # A task: the ack completes even when this call is cancelled (its client went away).
        ack = asyncio.ensure_future(self._ack_durably(lease, new))
        try:
            popped = await self.pop(topic, group, max_records, lease_ms, timeout_s, max_bytes)
        except Exception as e:  # noqa: BLE001 - answered below: the ack's outcome is what counts
            acked = await asyncio.shield(ack)
            # The ack is done and durable: answer it (no lease) rather than an error that would
            # make the worker believe its records were not acknowledged.
            log.info("pop after an ack failed", topic=topic, error=str(e) if isinstance(e, DomainError) else repr(e))
            return acked, None
        try:
            acked = await asyncio.shield(ack)
        except BaseException:
            if popped is not None:
                self._finish(popped.lease)
            raise
        return acked, popped

    async def nack(self, lease_id: str, error: str, failed_offset: int | None) -> tuple[int, int, bool]:
        lease = self._live(lease_id)
        offset = lease.start_offset if failed_offset is None else failed_offset
        self._check_in(lease, offset, "failed_offset")
        lease.busy = True
        try:
            result = await self._count_failure(lease, offset, error or "nacked without an error")
        finally:
            lease.busy = False
        self._finish(lease)
        return result

    async def reject(self, lease_id: str, offset: int, error: str) -> tuple[int, Written]:
        lease = self._live(lease_id)
        self._check_in(lease, offset, "offset")
        lease.busy = True
        try:
            progress = self.progress.get(lease.topic, lease.partition, lease.group)
            attempts = progress.delivery_count if progress is not None and progress.acked_offset == offset else 0
            narrowed = dataclasses.replace(lease, start_offset=offset + 1)
            written = await self._dead_letter(
                lease, offset, attempts + 1, error or "rejected", REASON_REJECTED, narrowed
            )
            lease.start_offset = offset + 1
        finally:
            lease.busy = False
        return offset + 1, written

    async def renew(self, lease_id: str, lease_ms: int) -> int:
        """Extend the lease; the new expiry is written (replicated) before it is answered. It
        applies here at once, so the timer cannot expire the lease while the write is under way,
        and is taken back if the write fails. A lease being finished is not renewed: its end is
        written after this entry, never before."""
        lease = self._live(lease_id)
        before = (lease.lease_ms, lease.expiry, lease.expiry_ms)
        self.leases.renew(lease, lease_ms or lease.lease_ms, time.monotonic(), int(time.time() * 1000))
        renewed = lease.expiry
        try:
            await self.progress.save(lease.topic, lease.partition, lease.group, None, lease)
        except BaseException:
            if lease.expiry == renewed:  # no later renewal moved it meanwhile
                self.leases.set_expiry(lease, *before)
            raise
        if self.leases.get(lease_id, time.monotonic()) is not lease:
            _lease_expired(lease_id)  # finished or taken over while the write was under way
        return lease.expiry_ms

    async def _dead_letter(
        self, lease: Lease, offset: int, attempts: int, error: str, reason: str, after: Lease | None = None
    ) -> Written:
        """Write the record at `offset` to the dead-letter topic, then move the group past it; the
        lease goes on as `after` (a reject) or ends (None: the record failed its last delivery)."""
        plog = self._node.logs.get(lease.topic, lease.partition)
        found = self._records(plog, offset, offset + 1)
        if not found:
            raise DomainError(
                f"{lease.topic}[{lease.partition}] no longer holds offset {offset}", code=ErrorCode.FAILED_PRECONDITION
            )
        written = await self.dead_letters.write(
            lease.topic, lease.partition, lease.group, [DeadLetter(found[0], attempts, error[:MAX_ERROR_CHARS], reason)]
        )
        await self.progress.save(
            lease.topic, lease.partition, lease.group, Progress(offset + 1), LEASE_ENDED if after is None else after
        )
        log.info(
            "queue record dead-lettered", topic=lease.topic, partition=lease.partition, group=lease.group,
            offset=offset, attempts=attempts, reason=reason, dlq_offset=written.base_offset,
        )
        return written

    async def _count_failure(self, lease: Lease, offset: int, error: str) -> tuple[int, int, bool]:
        """One failed delivery of the record at `offset` (the records before it are acknowledged)
        and the end of the lease: durable; at max_delivery_attempts the record is dead-lettered.
        (acked, count, dead)."""
        progress = self.progress.get(lease.topic, lease.partition, lease.group)
        before = progress.delivery_count if progress is not None and progress.acked_offset == offset else 0
        count = before + 1
        if count >= self._max_attempts(lease.topic):
            await self._dead_letter(lease, offset, count, error, REASON_MAX_ATTEMPTS)
            return offset + 1, 0, True
        await self.progress.save(
            lease.topic, lease.partition, lease.group, Progress(offset, count, error[:MAX_ERROR_CHARS]), LEASE_ENDED
        )
        return offset, count, False

    # -- expiry ------------------------------------------------------------------------------------

    async def _expiry_loop(self) -> None:
        while not self._stopping.is_set():
            now = time.monotonic()
            for lease in self.leases.expired(now):
                lease.busy = True
                task = asyncio.create_task(self._expire(lease), name=f"queue-expire-{lease.lease_id[:8]}")
                self._expiring.add(task)
                task.add_done_callback(self._expiring.discard)
            nxt = self.leases.next_expiry()
            delay = EXPIRY_TICK_S if nxt is None else min(max(nxt - now, 0.01), EXPIRY_TICK_S)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)

    async def _expire(self, lease: Lease) -> None:
        try:
            plog = self._node.logs.get(lease.topic, lease.partition)
            if self._node.replication.readable_end(lease.topic, lease.partition, plog) is None:
                return  # a follower's copy of an old leadership's lease: its leader expires it
            if lease.start_offset < lease.end_offset:
                await self._count_failure(lease, lease.start_offset, f"lease expired after {lease.lease_ms} ms without an ack")
            else:
                await self.progress.save(lease.topic, lease.partition, lease.group, None, LEASE_ENDED)
            log.info("queue lease expired", topic=lease.topic, partition=lease.partition, group=lease.group,
                     start_offset=lease.start_offset)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - e.g. disk full: the records come back uncounted
            log.warning("queue lease expiry not recorded", topic=lease.topic, partition=lease.partition,
                        group=lease.group, error=repr(e))
        finally:
            lease.busy = False
            self._finish(lease)

    # -- max queue size (the produce path) ---------------------------------------------------------

    def _depths(self, topic: str) -> Iterator[tuple[int, PartitionLog, int]]:
        for partition, plog in self._logs(topic):
            groups = self.progress.groups(topic, partition)
            start = plog.log_start_offset
            low = min((max(p.acked_offset, start) for p in groups.values()), default=start)
            yield partition, plog, plog.log_end_offset - low

    def limit_share(self, topic: str) -> tuple[int, int]:
        """(max_queue_size, this broker's pro rata share of it); (0, 0) when unlimited."""
        limit = _setting(self._configs.get(topic), "max_queue_size", 0)
        if not limit:
            return 0, 0
        led = len(self._led.get(topic, ()))
        total = max(self._partition_counts.get(topic, led), led, 1)
        return limit, max(1, limit * led // total)

    @contextlib.contextmanager
    def admission(self, topic: str, batch: bytes) -> Iterator[None]:
        """Around a produce's append: refuse it whole when the queue would exceed its share."""
        limit, share = self.limit_share(topic)
        if not limit:
            yield
            return
        try:
            count = records.read_header(batch).record_count
        except records.RecordsError:
            yield  # the append refuses the batch with the precise error
            return
        depth = sum(d for _, _, d in self._depths(topic)) + self._admitting.get(topic, 0)
        if depth + count > share:
            remaining = max(share - depth, 0)
            raise QueueOverLimitError(
                f"queue {topic!r} is full: {depth} records not acknowledged on broker {self._node.broker_id}, "
                f"whose share of max_queue_size {limit} is {share}; a batch of {count} records does not fit "
                f"({remaining} remaining); nothing was stored",
                depth,
                share,
            )
        self._admitting[topic] = self._admitting.get(topic, 0) + count
        try:
            yield
        finally:
            left = self._admitting[topic] - count
            if left:
                self._admitting[topic] = left
            else:
                del self._admitting[topic]

    # -- describe ----------------------------------------------------------------------------------

    def describe(self, topic: str, group: str) -> pb.QueueDescribeResponse:
        now = time.monotonic()
        out = pb.QueueDescribeResponse(broker_id=self._node.broker_id)
        topics = [topic] if topic else sorted(self._led)
        for t in topics:
            total_depth = 0
            has_groups = False
            for partition, plog, depth in self._depths(t):
                total_depth += depth
                out.partitions.append(
                    pb.QueuePartitionDepth(
                        topic=t, partition=partition, log_start_offset=plog.log_start_offset,
                        log_end_offset=plog.log_end_offset, depth=depth,
                    )
                )
                for g, progress in sorted(self.progress.groups(t, partition).items()):
                    if group and g != group:
                        continue
                    has_groups = True
                    acked = max(progress.acked_offset, plog.log_start_offset)
                    row = pb.QueueGroupPartition(
                        topic=t, partition=partition, group=g, acked_offset=acked,
                        pending=plog.log_end_offset - acked,
                        delivery_count=progress.delivery_count if progress.acked_offset == acked else 0,
                        last_error=progress.last_error,
                    )
                    self._describe_lease(row, now)
                    out.groups.append(row)
                for lease in self.leases.leases():
                    # a group that popped but never acknowledged has no progress row yet
                    if lease.topic == t and lease.partition == partition and lease.group not in self.progress.groups(t, partition):
                        if group and lease.group != group:
                            continue
                        has_groups = True
                        row = pb.QueueGroupPartition(
                            topic=t, partition=partition, group=lease.group, acked_offset=lease.start_offset,
                            pending=plog.log_end_offset - lease.start_offset,
                        )
                        self._describe_lease(row, now)
                        out.groups.append(row)
            limit, share = self.limit_share(t)
            if limit or has_groups or topic:
                out.limits.append(pb.QueueTopicLimit(topic=t, max_queue_size=limit, share=share, depth=total_depth))
        return out

    def _describe_lease(self, row: pb.QueueGroupPartition, now: float) -> None:
        lease = self.leases.held(row.topic, row.partition, row.group)
        if lease is not None and (lease.busy or lease.expiry > now):
            row.lease_id = lease.lease_id
            row.lease_records = lease.record_count
            row.lease_expiry_ms = lease.expiry_ms
