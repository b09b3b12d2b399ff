"""Fetcher: pipelined fetches, one in flight per broker, records decoded lazily.

Flow (all on the application's thread, except the blocking Fetch calls themselves, which run on a
small pool of I/O threads whose only other act is setting the consumer's wake-up event; in the
asyncio consumer everything runs on its loop, the Fetch calls as tasks)::

    send_fetches()  for each broker leading fetchable partitions and having no fetch in flight,
                    one Fetch naming those partitions at their next fetch offset
    harvest()       done futures -> per-partition buffers of raw batch bytes (undecoded)
    collect(n)      up to n records: decodes a buffered answer only when its records are
                    needed, hands them out as RecordSequences over the batches' columns (each
                    ConsumerRecord built in C when the application's loop reaches it, and
                    freed before the next: no garbage collection over kept records), and
                    advances the positions

The fetching itself is the client's PartitionReader (dmq.client._reader): one Fetch in flight per
broker with its own deadline, answers taken as they come, so records of healthy brokers flow while
another broker is dead or stopped; per-broker retry backoff; leaders from the metadata cache
without waiting for the coordinator (a missing entry is fetched in the background), so neither a
dead broker nor a coordinator outage holds up the others; blocking calls on a pool of threads
rather than grpc's `.future()` (why: see that module). What is the consumer's own is here: which
partitions to fetch from which offset, the buffers, and what an answer means for a position.

poll() calls send_fetches() again just before returning records, so the next answer travels
while the application works. Per partition at most one answer waits undecoded, one is being
drained and one is in flight, which bounds memory to about three times
max_partition_fetch_bytes per partition.

Stale data never reaches the application: each buffer and each requested partition carries the
partition's epoch (SubscriptionState), and anything fetched under an older epoch (seek, pause,
revoked, reset) is dropped.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence

from dmq.client._calls import PendingCall
from dmq.client._cluster import Cluster
from dmq.client._log import get_logger
from dmq.client._metrics import ClientStats
from dmq.client._reader import FetchAnswer, FetchWant, PartitionReader
from dmq.client.consumer._config import ConsumerConfig
from dmq.client.consumer._records import TopicPartition
from dmq.client.consumer._subscription import PartitionState, SubscriptionState
from dmq.client.errors import CorruptRecordError, DMQError, from_partition_error
from dmq.client.records import ConsumerRecord, RecordSequence
from dmq.proto import dmq_pb2 as pb
from dmq.proto import records as codec
from dmq.proto.wire import FetchPartitionView

log = get_logger(__name__)


class _PartitionBuffer:
    """Fetched data of one partition that the application has not been given yet."""

    __slots__ = ("tp", "epoch", "chunks", "batches", "next_fetch_offset", "error")

    def __init__(self, tp: TopicPartition, epoch: int, fetch_offset: int) -> None:
        self.tp = tp
        self.epoch = epoch
        self.chunks: deque[bytes | memoryview] = deque()  # raw answers, not decoded yet
        # decoded batches, records not built; the first may be partly handed out already
        self.batches: deque[codec.RecordBatch] = deque()
        self.next_fetch_offset = fetch_offset
        self.error: DMQError | None = None

    def empty(self) -> bool:
        return not self.chunks and not self.batches

    def take(self, n: int, position: int, verify_crc: bool) -> RecordSequence | None:
        """Up to n records from `position` on, as a RecordSequence over the batches' columns
        (records built as the application's loop reaches them); None when none is buffered."""
        start = position
        taken: list[codec.RecordBatch] = []
        batches = self.batches
        while n > 0:
            if not batches:
                if not self.chunks:
                    break
                raw = self.chunks.popleft()
                try:
                    batches.extend(codec.decode_batches(raw, verify_crc=verify_crc))
                except codec.RecordsError as e:
                    raise CorruptRecordError(
                        f"fetched data of {self.tp} at offset {position} is corrupt: {e}; "
                        f"seek() past it to skip it"
                    ) from e
                continue
            batch = batches[0]
            last = batch.header.last_offset
            if last < position:
                batches.popleft()
                continue
            first = max(position, batch.header.base_offset)
            taken.append(batch)
            if last - first + 1 <= n:  # all of the rest of this batch
                batches.popleft()
                n -= last - first + 1
                position = last + 1
            else:  # a part: the batch stays first, its columns decoded once (columns())
                position = first + n
                n = 0
        if not taken:
            return None
        return RecordSequence(self.tp.topic, self.tp.partition, taken, start, position)


class Fetcher:
    def __init__(
        self,
        cluster: Cluster,
        subscriptions: SubscriptionState,
        config: ConsumerConfig,
        wakeup: threading.Event,
        name: str = "dmq-consumer",
        start: Callable[..., PendingCall[bytes]] | None = None,
    ) -> None:
        """`start` starts each Fetch call (default: on the reader's own threads; the asyncio
        consumer's AsyncCluster.start_unary makes it a task on its loop). `wakeup` is set when
        one is done: a threading.Event, or the asyncio consumer's Wakeup (set() is all that is used)."""
        self._subs = subscriptions
        self._config = config
        self._buffers: dict[TopicPartition, _PartitionBuffer] = {}
        self._rotation = 0
        # Leaders are looked up without waiting (timeout 0): a missing entry is fetched in the
        # background, and a known one is used while the coordinator cannot be reached.
        self._reader = PartitionReader(
            cluster,
            max_wait_ms=config.fetch_max_wait_ms,
            min_bytes=config.fetch_min_bytes,
            max_bytes=config.fetch_max_bytes,
            partition_max_bytes=config.max_partition_fetch_bytes,
            retry_backoff_ms=config.retry_backoff_ms,
            leader_wait_s=0,
            allow_stale=True,
            wakeup=wakeup,
            start=start,
            name=name,
        )
        self._closed = False
        # the consumer's metrics() (dmq.client._metrics): per Fetch answer and per partition result
        self.stats = ClientStats()
        self._lags: dict[TopicPartition, int] = {}

    def __repr__(self) -> str:
        return (
            f"<Fetcher {self._reader!r} buffered="
            f"{sorted(str(tp) for tp, b in self._buffers.items() if not b.empty())}>"
        )

    # -- sending ---------------------------------------------------------------------------------

    def send_fetches(self) -> int:
        """Start a fetch for every broker that has fetchable partitions and none in flight."""
        if self._closed:
            return 0
        self.harvest()
        reader = self._reader
        wants = []
        for tp, state in self._subs.fetchable():
            if reader.in_flight(tp):
                continue
            buf = self._buffers.get(tp)
            if buf is not None and buf.epoch != state.epoch:
                del self._buffers[tp]
                buf = None
            if buf is not None and (buf.chunks or buf.error is not None):
                continue  # one undecoded answer waiting is enough read-ahead
            assert state.position is not None
            offset = state.position if buf is None else buf.next_fetch_offset
            wants.append(FetchWant(tp.topic, tp.partition, offset, 0, state.epoch))
        if not wants:
            return 0
        before = reader.sent
        reader.send(wants)
        return reader.sent - before

    # -- receiving -------------------------------------------------------------------------------

    def harvest(self) -> None:
        """Move the answers of finished fetches into the partition buffers."""
        stats = self.stats
        lags = self._lags
        for answer in self._reader.answers():
            stats.request(answer.answered_at - answer.sent_at, ok=answer.error is None)
            for result in answer.results:
                self._take_result(result, answer)
            if answer.results:
                stats.lag(max(lags.values(), default=0))

    def _take_result(self, result: FetchPartitionView, answer: FetchAnswer) -> None:
        tp = TopicPartition(result.topic, result.partition)
        asked = answer.wants.get(tp)
        state = self._subs.get(tp)
        if asked is None or state is None or state.epoch != asked.tag or state.paused:
            return  # revoked, sought, reset or paused since: this data is stale
        epoch, offset = asked.tag, asked.offset
        if result.error:
            self._partition_error(tp, state, result, offset)
            return
        data = result.records
        if not data:
            self._lags[tp] = max(0, result.high_watermark - offset)
            return
        buf = self._buffers.get(tp)
        if buf is None or buf.epoch != epoch:
            buf = self._buffers[tp] = _PartitionBuffer(tp, epoch, offset)
        elif buf.next_fetch_offset != offset:
            return  # cannot happen with one fetch per partition in flight; never buffer twice
        last = -1
        try:
            for _, header in codec.iter_headers(data):
                last = header.last_offset
        except codec.RecordsError as e:
            # Keep the complete batches before the bad one; the error surfaces when reached.
            buf.error = CorruptRecordError(f"fetched data of {tp} after offset {last} is corrupt: {e}")
        if last >= offset:
            buf.chunks.append(data)
            buf.next_fetch_offset = last + 1
            self.stats.transferred(last + 1 - offset, len(data))
            self._lags[tp] = max(0, result.high_watermark - (last + 1))

    def _partition_error(
        self, tp: TopicPartition, state: PartitionState, result: FetchPartitionView, offset: int
    ) -> None:
        code = result.error
        if code == pb.OFFSET_OUT_OF_RANGE:
            # The design has no "auto offset reset" setting: jumping to the nearest end is what
            # a group starting from the log start would do, and the warning makes loss visible.
            if offset < result.log_start_offset:
                target = result.log_start_offset
                log.warning(
                    "position below the log start (deleted by retention): skipping ahead",
                    topic=tp.topic, partition=tp.partition, position=offset, log_start_offset=target,
                    skipped=target - offset,
                )
            elif offset > result.high_watermark:
                target = result.high_watermark
                log.warning(
                    "position beyond the log end: moving back to it",
                    topic=tp.topic, partition=tp.partition, position=offset, log_end_offset=target,
                )
            else:
                return  # the log moved between the read and the answer; fetch again
            self._buffers.pop(tp, None)
            self._subs.seek(tp, target)
            return
        if code == pb.CORRUPT_DATA:
            # The broker's copy is damaged at this offset: retrying cannot help. poll() raises
            # the error (naming partition and offsets); the application may seek past it.
            buf = self._buffers.get(tp)
            if buf is None or buf.epoch != state.epoch:
                buf = self._buffers[tp] = _PartitionBuffer(tp, state.epoch, offset)
            buf.error = from_partition_error(code, result.error_message, tp.topic, tp.partition)
            return
        # NOT_LEADER / UNKNOWN_TOPIC_OR_PARTITION: the reader looks the leader up again.
        log.warning(
            "fetch error for partition, will retry",
            topic=tp.topic, partition=tp.partition, error=pb.ErrorCode.Name(code), message=result.error_message,
        )

    # -- handing records to the application ------------------------------------------------------

    def collect(
        self, max_records: int, hold: frozenset[TopicPartition] | set[TopicPartition] = frozenset()
    ) -> dict[TopicPartition, Sequence[ConsumerRecord]]:
        """Up to max_records buffered records, advancing the positions past them. Partitions in
        `hold` keep their buffers but give nothing now (their hand-off commit is in flight)."""
        self.harvest()
        out: dict[TopicPartition, Sequence[ConsumerRecord]] = {}
        if not self._buffers:
            return out
        tps = list(self._buffers)
        # Start each collect at the next partition, so one busy partition cannot starve others.
        self._rotation = (self._rotation + 1) % len(tps)
        tps = tps[self._rotation :] + tps[: self._rotation]
        remaining = max_records
        verify = self._config.check_crcs
        subs = self._subs
        for tp in tps:
            buf = self._buffers[tp]
            state = subs.get(tp)
            if state is None or state.epoch != buf.epoch or state.position is None:
                del self._buffers[tp]
                continue
            if state.paused or tp in hold:
                continue
            try:
                recs = buf.take(remaining, state.position, verify)
            except CorruptRecordError:
                del self._buffers[tp]
                if out:
                    break  # hand over what is good; the error comes again on the next fetch
                raise
            if recs is not None:
                out[tp] = recs
                state.position = recs.next_offset
                remaining -= len(recs)
            if buf.empty():
                if buf.error is not None and not out:
                    del self._buffers[tp]
                    raise buf.error
                if buf.error is None:
                    del self._buffers[tp]
            if remaining <= 0:
                break
        return out

    def drop(self, tp: TopicPartition) -> None:
        """Forget everything fetched for tp (revoked, sought): it must never be returned."""
        self._buffers.pop(tp, None)
        self._lags.pop(tp, None)

    def close(self) -> None:
        """Drop everything; calls still running end when the owner closes the channels."""
        self._closed = True
        self._reader.close()
        self._buffers.clear()
