"""Producer batches, the per-record handles that point into them, and the buffer-memory pool.

Why batches are per (thread, partition)
---------------------------------------
`Producer.send()` must cost about a microsecond, so its fast path takes no lock and allocates no
Future: it appends the value to a plain list. Plain lists are only safe without a lock if each has
ONE appending thread, because the record's index (its offset within the batch) is read with
``len(values) - 1`` right after the append. So every producer thread appends to its own open batch
per partition (`ThreadState`); the sender thread only ever *reads* those lists.

A batch's life::

    OPEN ---------------------> SEALED ------> IN_FLIGHT ------> DONE
      owner appends             count fixed;     Produce sent;     future resolved,
      (fast path, no lock)      queued on the    retried on        memory released
                                partition        retriable errors

Sealing (by the sender when the batch is old enough and its partition idle, by the owner when the
batch is full, by flush()/close()) happens under the producer lock and does, in this order:
``sealed = True; limit = -1; count = len(values)``. The owner's fast path appends first and checks
``sealed`` after, which gives three cases (the GIL makes each list operation atomic):

  1. it appended before the seal read len(values): the record is in the batch (index < count);
  2. it appended after: index >= count, the record is not in the batch, and the owner re-sends it
     through the slow path (under the lock) into a new batch;
  3. it saw ``sealed`` false after appending: the seal comes later and will count the record.

Cases 1 and 2 are told apart under the lock, which the sealer holds until ``count`` is set: the
record is in the batch when it went into the list the seal counted (``values_id``) at an index
below ``count``. (Once a batch is done its list is replaced by an empty one, to free the records.)
Auxiliary lists (keys, headers, timestamps) are appended BEFORE the value, so whenever the sealer
sees n values it also sees at least n entries of each; it uses the first ``count`` of each.

Size: a batch's ``size`` counts, per record, key + value + an upper bound of its encoded headers
+ RECORD_OVERHEAD_BYTES (+ HEADER_OFFSET_BYTES once the batch has headers). What the encoding adds
beyond that (the 57-byte header, the first entry of each offsets array, the key-validity bitmap,
and with compression the codec's worst-case expansion) is bounded by `encoded_size_bound`, and
every batch is capped at ``accounted_cap(limit)``: a sealed batch never encodes to more than its
limit (min(batch_size, the topic's max_message_bytes)). The bound, not an estimate: a batch of
1 MiB of accounted records used to encode to 1,053,236 bytes and be refused by a 1 MiB topic.

Memory: ``buffer_memory`` bounds the bytes of records accepted but not yet acknowledged (keys +
values + headers + RECORD_OVERHEAD_BYTES each). An open batch reserves it in chunks of
MEMORY_CHUNK_BYTES (so the fast path only compares ``size <= limit``) and gives it all back when it
is done. Until then the batch also keeps the record objects (to re-encode after an epoch bump),
so the process holds up to about twice buffer_memory, plus Python's per-object overhead.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from dmq.client._log import get_logger
from dmq.client.errors import DMQError, DMQTimeoutError, RecordTooLargeError
from dmq.client.records import RecordMetadata
from dmq.proto.records import HEADER_SIZE

log = get_logger(__name__)

__all__ = [
    "RECORD_OVERHEAD_BYTES",
    "HEADER_OFFSET_BYTES",
    "MEMORY_CHUNK_BYTES",
    "encoded_size_bound",
    "accounted_cap",
    "ProducerBatch",
    "ThreadState",
    "RecordFuture",
    "SendManyFuture",
    "BufferPool",
    "PartitionQueue",
    "Accumulator",
]

# A record's share of the batch arrays: timestamp delta, key offset and value offset (int32 each).
RECORD_OVERHEAD_BYTES = 12
# Its header_offsets entry, present for every record of a batch in which any record has headers.
HEADER_OFFSET_BYTES = 4
# What a batch adds whatever its records: the header and the first entry of the key, value and
# header offset arrays (proto/records.py layout).
BATCH_OVERHEAD_BYTES = HEADER_SIZE + 12
# zstd's ZSTD_COMPRESSBOUND(n) = n + n/256 + at most 64 for small inputs (frame header included);
# an lz4 frame adds less (raw blocks of 64 KiB with 4-byte headers, a <= 19-byte frame header and
# a 4-byte end mark). Incompressible data is stored in raw blocks, so a compressed body never
# grows by more than this.
COMPRESSION_SLACK_BYTES = 64
MEMORY_CHUNK_BYTES = 64 * 1024
MAX_TIMESTAMP_DELTA_MS = 2**31 - 1  # the codec's per-record timestamp deltas are int32

Callback = Callable[[RecordMetadata | None, DMQError | None], None]


def encoded_size_bound(accounted: int, compressed: bool) -> int:
    """The most bytes a batch whose records account for `accounted` bytes can encode to.

    Every record accounts for at least RECORD_OVERHEAD_BYTES, so there are at most
    accounted // 12 records, and the key-validity bitmap (a bit per record) is at most
    ceil(that / 8) bytes.
    """
    records_max = accounted // RECORD_OVERHEAD_BYTES
    total = accounted + BATCH_OVERHEAD_BYTES + (records_max + 7) // 8
    if compressed:
        body = total - HEADER_SIZE
        total += (body >> 8) + COMPRESSION_SLACK_BYTES
    return total


def accounted_cap(max_batch_bytes: int, compressed: bool) -> int:
    """The largest accounted size whose batch is sure to encode within `max_batch_bytes` (about
    1% below it: the bitmap bound; 1.4% with compression); 0 when not even an empty record fits."""
    lo, hi = 0, max_batch_bytes  # the bound is monotonic in the accounted size: binary search
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if encoded_size_bound(mid, compressed) <= max_batch_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo


class ProducerBatch:
    """Records of one partition from one thread. Fields below `count` are the sender's."""

    __slots__ = (
        "topic",
        "partition",
        "values",
        "keys",
        "headers",
        "timestamps",
        "size",
        "cap",
        "limit",
        "reserved",
        "sealed",
        "count",
        "values_id",
        "created",
        "created_ms",
        "future",
        "payload",
        "base_sequence",
        "epoch",
        "attempts",
        "last_error",
        "deadline",
        "acked",
        "callbacks",
        "accumulator",
        "record_offsets",
        "outcome",
        "tracked",
        "sent",
        "__weakref__",
    )

    def __init__(self, topic: str, partition: int, created_ms: int) -> None:
        self.topic = topic
        self.partition = partition
        self.values: list[bytes] = []
        self.keys: list[bytes | None] | None = None
        self.headers: list[list[tuple[str, bytes | None]] | None] | None = None
        self.timestamps: list[int] | None = None
        self.size = 0  # accounted bytes appended (owner-written; see the module comment)
        self.cap = 0  # the most `size` may reach: encodes within the batch's limit (accounted_cap)
        self.limit = 0  # the fast path appends while size <= limit; -1 once sealed
        self.reserved = 0  # bytes of buffer_memory held
        self.sealed = False
        self.count = 0  # records in the batch, fixed at seal
        self.values_id = 0  # id() of the values list the seal counted (see Producer._raced)
        self.created = time.monotonic()
        self.created_ms = created_ms  # the timestamp of records sent without one
        self.future: concurrent.futures.Future[int] = concurrent.futures.Future()  # -> base offset
        self.payload: bytes | None = None  # the encoded batch, built by the sender
        self.base_sequence = -1
        self.epoch = -1
        self.attempts = 0
        self.last_error: str | None = None  # of the latest failed attempt, for the expiry message
        self.deadline = 0.0  # monotonic time after which it fails (delivery_timeout_ms)
        self.acked = False
        # Records' callbacks as [index, fn, index, fn, ...]; None once they have run (see
        # RecordFuture.add_callback for why they are not the future's done-callbacks).
        self.callbacks: list[Any] | None = []
        self.accumulator: Accumulator | None = None  # counts the records of a failed batch
        # Every record's offset when the broker answered some as duplicate transaction ids
        # (stored earlier, at other offsets); None: record i is at the base offset + i.
        self.record_offsets: list[int] | None = None
        # The sender's, with several Produce calls of a partition in flight (dmq.client._sender):
        # the answer kept until the batches before it are answered (a base offset, or the error
        # it failed with for good); whether it is in its partition's `unresolved` queue; whether
        # its current encoding was handed to gRPC.
        self.outcome: Any = None
        self.tracked = False
        self.sent = False

    def __repr__(self) -> str:
        state = "done" if self.future.done() else "sealed" if self.sealed else "open"
        n = self.count if self.sealed else len(self.values)
        return f"<ProducerBatch {self.topic}[{self.partition}] {state} records={n} size={self.size}>"

    # -- owner-thread appends (the caller holds the producer lock, or is the fast path) -------------

    def header_cost(self, has_headers: bool) -> int:
        """The header_offsets bytes appending a record adds: its own entry when the batch has (or
        gets) headers, and for the first record with headers the entries of the records before it."""
        if self.headers is not None:
            return HEADER_OFFSET_BYTES
        if has_headers:
            return HEADER_OFFSET_BYTES * (len(self.values) + 1)
        return 0

    def append_full(
        self,
        value: bytes,
        key: bytes | None,
        headers: list[tuple[str, bytes | None]] | None,
        timestamp_ms: int | None,
        size: int,
    ) -> int:
        """Append one record with any optional part; returns its index. Aux lists first, value last."""
        n = len(self.values)
        if key is not None or self.keys is not None:
            if self.keys is None:
                self.keys = [None] * n
                self.limit = -1  # the fast path appends values only: keep it off this batch
            self.keys.append(key)
        if headers or self.headers is not None:
            if self.headers is None:
                self.headers = [None] * n
                self.limit = -1
            self.headers.append(headers or None)
        if timestamp_ms is not None or self.timestamps is not None:
            if self.timestamps is None:
                self.timestamps = [self.created_ms] * n
                self.limit = -1
            self.timestamps.append(self.created_ms if timestamp_ms is None else timestamp_ms)
        self.size += size
        self.values.append(value)
        return n

    def extend(self, values: Sequence[bytes], keys: Sequence[bytes | None] | None, size: int) -> int:
        """Append many records (send_many) to a batch without headers; returns the index of the
        first. `size` is their accounted bytes."""
        assert self.headers is None, "send_many seals a batch with headers first (header_cost)"
        n = len(self.values)
        if keys is not None or self.keys is not None:
            if self.keys is None:
                self.keys = [None] * n
            if keys is None:
                self.keys.extend([None] * len(values))
            else:
                self.keys.extend(keys)
        if self.timestamps is not None:
            self.timestamps.extend([self.created_ms] * len(values))
        self.size += size
        self.values.extend(values)
        return n

    @property
    def plain(self) -> bool:
        """Values only: the fast path of send() may append (it does not touch the aux lists)."""
        return self.keys is None and self.headers is None and self.timestamps is None

    def accepts_timestamp(self, timestamp_ms: int) -> bool:
        """Whether a record with this timestamp fits: the codec stores int32 deltas from the
        first record's timestamp."""
        return not self.values or abs(timestamp_ms - self.timestamp_of(0)) <= MAX_TIMESTAMP_DELTA_MS

    def release_records(self) -> None:
        """Drop the record objects once the batch is done (handles may outlive it by far).

        `values` gets a new empty list rather than None: a fast-path append racing this still
        works, and Producer._raced sees by the list's identity that the seal did not count it.
        """
        self.values = []
        self.keys = None
        self.headers = None

    def timestamp_of(self, index: int) -> int:
        ts = self.timestamps
        return self.created_ms if ts is None else ts[index]

    def metadata(self, index: int, base_offset: int) -> RecordMetadata:
        offsets = self.record_offsets
        if offsets is not None:
            return RecordMetadata(self.topic, self.partition, offsets[index], self.timestamp_of(index))
        offset = -1 if base_offset < 0 else base_offset + index
        return RecordMetadata(self.topic, self.partition, offset, self.timestamp_of(index))

    def resolve(self, base_offset: int) -> None:
        """Complete the batch (if not yet done) and run its records' callbacks, on this thread."""
        if not self.future.done():
            self.future.set_result(base_offset)
        self.run_callbacks()

    def reject(self, err: BaseException) -> None:
        """Fail the batch (if not yet done) and run its records' callbacks, on this thread."""
        if not self.future.done():
            self.future.set_exception(err)
            if self.accumulator is not None:
                self.accumulator.records_failed += self.count or len(self.values)
        self.run_callbacks()

    def run_callbacks(self) -> None:
        """Run and drop the callbacks added so far; later ones run at once in add_callback. The
        future must be done."""
        with _callbacks_lock:
            cbs, self.callbacks = self.callbacks, None
        if cbs:
            fut = self.future
            for i in range(0, len(cbs), 2):
                _run_callback(cbs[i + 1], self, cbs[i], fut)


# Guards ProducerBatch.callbacks between add_callback (producer threads) and run_callbacks
# (the sender): held for a list append or a swap only.
_callbacks_lock = threading.Lock()


def _run_callback(fn: Callback, batch: ProducerBatch, index: int, fut: concurrent.futures.Future[int]) -> None:
    err = fut.exception()
    try:
        if err is None:
            fn(batch.metadata(index, fut.result()), None)
        else:
            fn(None, err)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - a user callback must not kill the sender
        log.exception("producer callback raised", topic=batch.topic, partition=batch.partition)


class ThreadState:
    """One producer thread's open batches: by partition, and the sticky one per topic."""

    __slots__ = ("sticky", "batches")

    def __init__(self) -> None:
        self.sticky: dict[str, ProducerBatch] = {}
        self.batches: dict[tuple[str, int], ProducerBatch] = {}


# The state a concurrent.futures.Future keeps; a RecordFuture creates it on first use (below).
_FUTURE_STATE = frozenset({"_condition", "_state", "_result", "_exception", "_waiters", "_done_callbacks"})
_materialize_lock = threading.Lock()


class RecordFuture(concurrent.futures.Future[RecordMetadata]):
    """The handle send() returns: the record's batch and its index in it.

    ``get(timeout)`` (also ``result``) waits for the batch and returns the RecordMetadata, or
    raises its DMQError.

    It is a `concurrent.futures.Future`, so ``concurrent.futures.wait`` / ``as_completed`` and
    ``add_done_callback`` work on it, but a lazy one: send() creates no Future state per record
    (a Condition, a lock and lists per record would cost more than the send itself). The first
    use of that state (wait(), as_completed(), add_done_callback()) creates it and registers a
    batch callback that completes it; done(), get(), exception() and add_callback() read the
    batch directly. A queued record cannot be cancelled: cancel() returns False.
    """

    __slots__ = ("_batch", "_index")

    def __init__(self, batch: ProducerBatch, index: int) -> None:  # no Future.__init__: see above
        self._batch = batch
        self._index = index

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes not set yet: the Future state of a handle never waited on.
        if name not in _FUTURE_STATE:
            raise AttributeError(f"'RecordFuture' object has no attribute {name!r}")
        self._materialize()
        return self.__dict__[name]

    def _materialize(self) -> None:
        with _materialize_lock:
            if "_condition" in self.__dict__:
                return
            concurrent.futures.Future.__init__(self)
        # Outside the lock: runs _settle at once when the batch is already done.
        self.add_callback(self._settle)

    def _settle(self, metadata: RecordMetadata | None, error: Exception | None) -> None:
        if error is None:
            assert metadata is not None  # a Callback gets the metadata exactly when there is no error
            concurrent.futures.Future.set_result(self, metadata)
        else:
            concurrent.futures.Future.set_exception(self, error)

    def __repr__(self) -> str:
        b = self._batch
        if not b.future.done():
            return f"<RecordFuture {b.topic}[{b.partition}] pending>"
        if b.future.exception() is not None:
            return f"<RecordFuture {b.topic}[{b.partition}] failed: {b.future.exception()!r}>"
        return f"<RecordFuture {self.get()!r}>"

    def done(self) -> bool:
        return self._batch.future.done()

    def running(self) -> bool:
        return not self._batch.future.done()

    def cancel(self) -> bool:
        return False  # the record may already be on its way

    def cancelled(self) -> bool:
        return False

    def get(self, timeout: float | None = None) -> RecordMetadata:
        """Wait up to `timeout` seconds (None = until the producer gives up on the batch)."""
        b = self._batch
        try:
            base = b.future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise DMQTimeoutError(
                f"record for {b.topic}[{b.partition}] not acknowledged within {timeout} s "
                "(the producer keeps trying until delivery_timeout_ms)"
            ) from None
        return b.metadata(self._index, base)

    result = get  # concurrent.futures-style name

    def exception(self, timeout: float | None = None) -> BaseException | None:
        try:
            return self._batch.future.exception(timeout)
        except concurrent.futures.TimeoutError:
            raise DMQTimeoutError(f"record not acknowledged within {timeout} s") from None

    def add_done_callback(self, fn: Callable[[concurrent.futures.Future[RecordMetadata]], object]) -> None:
        """concurrent.futures style: ``fn(self)`` once the record is acknowledged or failed."""
        self._materialize()
        concurrent.futures.Future.add_done_callback(self, fn)

    def set_result(self, result: RecordMetadata) -> None:
        raise RuntimeError("a RecordFuture is completed by the producer, not by its user")

    set_exception = set_result  # type: ignore[assignment]

    def add_callback(self, fn: Callback) -> None:
        """Call ``fn(metadata, None)`` or ``fn(None, error)`` once the record's batch is done, on the
        producer's sender thread (or right away, here, if it is already done). Keep it short.

        The callbacks live in a plain list on the batch, not as closures on its future: a
        closure over the batch held by the batch's own future is a reference cycle, so every
        batch (its future, condition, lock, closures, cells: ~7 objects a record) became cyclic
        garbage that only the cyclic GC frees. At 10k records/s that made full collections of
        10-30 ms a few times a second, the largest part of the produce latency tail. Now a done
        batch is freed by reference counting.
        """
        batch = self._batch
        with _callbacks_lock:
            cbs = batch.callbacks
            if cbs is not None:
                cbs.append(self._index)
                cbs.append(fn)
                return
        _run_callback(fn, batch, self._index, batch.future)


class SendManyFuture:
    """The result of send_many(): every record's batch, resolved together.

    ``segments`` are (batch, first index in batch, count, positions) where positions are the
    records' places in the input (None = consecutive, following the previous segment).
    """

    __slots__ = ("_segments", "_total")

    def __init__(self, segments: list[tuple[ProducerBatch, int, int, list[int] | None]], total: int) -> None:
        self._segments = segments
        self._total = total

    def __len__(self) -> int:
        return self._total

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<SendManyFuture records={self._total} batches={len(self._segments)} {state}>"

    def done(self) -> bool:
        return all(seg[0].future.done() for seg in self._segments)

    def wait(self, timeout: float | None = None) -> None:
        """Wait for every record; raise the first failure (a DMQError) or DMQTimeoutError."""
        futures = {seg[0].future for seg in self._segments}
        _, pending = concurrent.futures.wait(futures, timeout)
        if pending:
            raise DMQTimeoutError(
                f"{len(pending)} of {len(futures)} batches not acknowledged within {timeout} s"
            )
        for seg in self._segments:
            err = seg[0].future.exception()
            if err is not None:
                raise err

    def get(self, timeout: float | None = None) -> list[RecordMetadata]:
        """Every record's metadata, in the order the values were given."""
        self.wait(timeout)
        out: list[RecordMetadata | None] = [None] * self._total
        pos = 0
        for batch, first, count, positions in self._segments:
            base = batch.future.result()
            metas = [batch.metadata(i, base) for i in range(first, first + count)]
            if positions is None:
                out[pos : pos + count] = metas
                pos += count
            else:
                for p, m in zip(positions, metas):
                    out[p] = m
        return out  # type: ignore[return-value]

    result = get

    def offsets(self, timeout: float | None = None) -> list[int]:
        return [m.offset for m in self.get(timeout)]


class BufferPool:
    """Bytes of buffer_memory: reserve() blocks up to max_block_ms when they are all taken."""

    def __init__(self, total_bytes: int, on_wait: Callable[[], None] | None = None) -> None:
        self.total_bytes = total_bytes
        self._available = total_bytes
        self._cond = threading.Condition(threading.Lock())
        self._on_wait = on_wait
        self.waiters = 0

    def __repr__(self) -> str:
        return f"<BufferPool available={self._available}/{self.total_bytes} waiters={self.waiters}>"

    @property
    def available(self) -> int:
        return self._available

    def reserve(self, nbytes: int, max_block_ms: int) -> None:
        """Take nbytes, blocking up to max_block_ms for them (the sync producer)."""
        if self.try_reserve(nbytes):
            return
        with self._cond:
            deadline = time.monotonic() + max_block_ms / 1000
            self.waiters += 1
            try:
                if self._on_wait is not None:
                    self._on_wait()  # let the sender ship open batches right away
                while self._available < nbytes:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise self.stayed_full(max_block_ms)
                    self._cond.wait(remaining)
            finally:
                self.waiters -= 1
            self._available -= nbytes

    def try_reserve(self, nbytes: int) -> bool:
        """Take nbytes if they are free now; RecordTooLargeError if they never could be."""
        if nbytes > self.total_bytes:
            raise RecordTooLargeError(
                f"a record needs {nbytes} bytes of buffer but buffer_memory is {self.total_bytes}: "
                "raise buffer_memory or send smaller records"
            )
        with self._cond:
            if self._available >= nbytes:
                self._available -= nbytes
                return True
        return False

    def stayed_full(self, max_block_ms: int) -> DMQTimeoutError:
        return DMQTimeoutError(
            f"buffer_memory ({self.total_bytes} bytes) stayed full for max_block_ms "
            f"({max_block_ms} ms): the brokers are not keeping up or cannot be "
            "reached; raise buffer_memory or max_block_ms, or produce more slowly"
        )

    def release(self, nbytes: int) -> None:
        if nbytes <= 0:
            return
        with self._cond:
            self._available += nbytes
            self._cond.notify_all()


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class PartitionQueue:
    """A partition's sealed batches in order, and those sent and not yet resolved (the sender's;
    sealers append to ``ready`` under the accumulator lock).

    ``unresolved``: batches handed to the sender's dispatch at least once and not yet resolved,
    in seal (= sequence) order; a batch is resolved (its future completed) only once every batch
    before it is. ``in_flight``: Produce calls of the partition awaiting their answer."""

    __slots__ = ("topic", "partition", "ready", "unresolved", "in_flight", "retry_at", "epoch", "next_sequence",
                 "failed_leader", "failures", "confirmed_at", "bump_pending", "last_sent_at", "rtt_s")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.ready: deque[ProducerBatch] = deque()
        self.unresolved: deque[ProducerBatch] = deque()
        self.in_flight = 0
        self.retry_at = 0.0  # monotonic; no dispatch before (backoff)
        self.epoch = 0  # idempotence: bumped when the sequence can no longer be trusted
        self.next_sequence = 0
        # After a failure that means "the leader moved" (NOT_LEADER, UNAVAILABLE): the address the
        # attempt went to ("" when no leader was known). While backing off the sender watches the
        # metadata and retries at once when another live leader shows up (as Kafka's KIP-951).
        self.failed_leader: str | None = None
        self.failures = 0  # consecutive failed attempts since the last success or leader change
        # monotonic time of the last acknowledgement in this epoch (0: none since the last failure
        # or epoch bump); several calls are in flight only while it is recent (dmq.client._sender)
        self.confirmed_at = 0.0
        self.bump_pending = False  # the epoch is bumped once no call of the partition is in flight
        self.last_sent_at = 0.0  # monotonic time the last Produce call of the partition started
        self.rtt_s = 0.0  # the partition's Produce round trip, a moving average of the answers

    def __repr__(self) -> str:
        return (
            f"<PartitionQueue {self.topic}[{self.partition}] ready={len(self.ready)} "
            f"in_flight={self.in_flight} unresolved={len(self.unresolved)} epoch={self.epoch} "
            f"next_sequence={self.next_sequence}>"
        )

    @property
    def idle(self) -> bool:
        return self.in_flight == 0 and not self.ready and not self.unresolved


class Accumulator:
    """Open batches of every producer thread, sealing, and the per-partition queues.

    ``lock`` guards batch creation and sealing, the ``open``/``incomplete`` sets and queue
    creation; the fast path of send() never takes it (see the module comment).
    """

    def __init__(self, batch_size: int, delivery_timeout_ms: int, wakeup: threading.Event, pool: BufferPool) -> None:
        self.batch_size = batch_size
        self.delivery_timeout_s = delivery_timeout_ms / 1000
        self.wakeup = wakeup
        self.pool = pool
        self.lock = threading.Lock()
        self.threads: dict[int, ThreadState] = {}
        self.open: set[ProducerBatch] = set()
        self.incomplete: set[ProducerBatch] = set()
        self.queues: dict[tuple[str, int], PartitionQueue] = {}
        self.newly_ready: set[PartitionQueue] = set()
        self.closed = False
        # Records of batches that failed for good (written by whoever fails them: the sender
        # thread, or close() once the sender has stopped).
        self.records_failed = 0

    def __repr__(self) -> str:
        return (
            f"<Accumulator threads={len(self.threads)} open={len(self.open)} "
            f"incomplete={len(self.incomplete)} partitions={len(self.queues)}>"
        )

    def thread_state(self, ident: int) -> ThreadState:
        st = self.threads.get(ident)
        if st is None:
            # Idents are reused after a thread ends; the new thread inherits the dead one's open
            # batches, which keeps one appender per batch.
            st = self.threads.setdefault(ident, ThreadState())
        return st

    def queue(self, topic: str, partition: int) -> PartitionQueue:
        q = self.queues.get((topic, partition))
        if q is None:
            q = self.queues.setdefault((topic, partition), PartitionQueue(topic, partition))
        return q

    def new_batch(self, st: ThreadState, topic: str, partition: int, reserved: int, cap: int) -> ProducerBatch:
        """An open batch holding `reserved` bytes of buffer memory, whose records may account for
        up to `cap` bytes (see accounted_cap). Lock held."""
        b = ProducerBatch(topic, partition, now_ms())
        b.reserved = reserved
        b.cap = cap
        b.accumulator = self
        b.limit = min(reserved, cap)
        b.deadline = b.created + self.delivery_timeout_s
        st.batches[(topic, partition)] = b
        self.open.add(b)
        self.incomplete.add(b)
        self.wakeup.set()  # the sender schedules its linger deadline
        return b

    def grow(self, b: ProducerBatch, nbytes: int) -> None:
        """Give an open batch more of the buffer memory. Lock held."""
        b.reserved += nbytes
        if not b.sealed and b.plain:
            b.limit = min(b.reserved, b.cap)

    def seal(self, b: ProducerBatch) -> None:
        """Fix the batch's record count and queue it on its partition. Lock held."""
        if b.sealed:
            return
        b.sealed = True
        b.limit = -1
        b.values_id = id(b.values)
        b.count = len(b.values)
        self.open.discard(b)
        if b.count == 0:  # only possible when a send failed between reserving and appending
            self.incomplete.discard(b)
            self.pool.release(b.reserved)
            b.reserved = 0
            b.resolve(-1)
            return
        q = self.queue(b.topic, b.partition)
        q.ready.append(b)
        self.newly_ready.add(q)
        self.wakeup.set()

    def unreleased(self) -> int:
        """Batches not released yet: waiting, or with a call in flight (with acks=0 a batch's
        handle resolves when it is sent, but its call is in flight until the broker answers)."""
        with self.lock:
            return len(self.incomplete)

    def seal_all(self) -> None:
        """Seal every open batch (flush, close). Lock held."""
        for b in list(self.open):
            self.seal(b)
