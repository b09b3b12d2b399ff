"""SimpleConsumer: read one partition from an offset you manage. No group, no commits.

    with SimpleConsumer("127.0.0.1:9091") as c:
        records = c.consume("orders", 0, offset=0)                  # a sequence of ConsumerRecord
        for batch in c.consume_batches("orders", 0, 0, end_offset=1000):
            for r in batch.iter_from(0): ...                        # the fast path

`consume()` returns the records from `offset` on as a `RecordSequence` (a read-only sequence:
len, indexing, slicing, iteration, ``==`` a list of the same records) whose ConsumerRecords are
built as a loop or an index reaches them. It reads ahead (``prefetch=True``, the default): a
Fetch returns up to max_bytes, and what the call does not return stays buffered for a call at
the next offset, which then answers at once, while the Fetch after it is already in flight
(dmq.client._prefetch: per partition one answer buffered and one in flight, for at most 64
partitions). A call at any other offset drops that partition's read-ahead: records are only
ever returned for the offset asked. Without read-ahead each call does one Fetch (long-polling up
to max_wait_ms for data). `consume_batches()` yields the decoded, lazy
`dmq.proto.records.RecordBatch` objects and keeps the next Fetch in flight while the caller works
on the current one. A fetch returns whole batches, so the first may start before the requested
offset: consume() skips those records, and consume_batches() callers use
``batch.iter_from(offset)`` (or `consumer_records`).

Fetches go through the client's PartitionReader (dmq.client._reader): the leader is found
through the Cluster's metadata; a failed Fetch, NOT_LEADER or UNKNOWN_TOPIC_OR_PARTITION refresh
it and retry (up to FETCH_ATTEMPTS tries, paced by the cluster's RetryPolicy: dmq.client._calls).
OFFSET_OUT_OF_RANGE raises OffsetOutOfRangeError carrying the log's start and end. consume() makes
its own Fetch on the caller's thread (the read-ahead's on a small pool); each consume_batches()
iteration has its own reader, so concurrent reads share nothing but channels (two threads reading
one partition at once: one of them reads without the read-ahead).
"""

from __future__ import annotations

import concurrent.futures
import inspect
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from dmq.client._closing import ClosedOnExit
from dmq.client._cluster import Cluster
from dmq.client._log import get_logger
from dmq.client._prefetch import MAX_PREFETCH_PARTITIONS, PREFETCH_THREADS, Prefetch
from dmq.client._reader import INLINE, FetchWant, PartitionReader, partition_error
from dmq.client._security import pop_security
from dmq.client._settings import bootstrap_address, check_flag, check_positive, reject_unknown
from dmq.client.admin import AdminClient
from dmq.client.errors import CorruptRecordError, DMQError, InvalidArgumentError
from dmq.client.records import RecordSequence
from dmq.proto import dmq_pb2 as pb
from dmq.proto import records
from dmq.proto.grpc_options import MAX_FETCH_RESPONSE_BYTES
from dmq.proto.records import RecordBatch
from dmq.proto.wire import FetchPartitionView

log = get_logger(__name__)

__all__ = ["SimpleConsumer"]

DEFAULT_MAX_WAIT_MS = 500
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
FETCH_ATTEMPTS = 4


class SimpleConsumer(ClosedOnExit):
    """Fetches records of one partition at a time. Thread-safe; close() (or `with`) when done."""

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str] | None = None,
        *,
        max_wait_ms: int = DEFAULT_MAX_WAIT_MS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        request_timeout_ms: int = 30_000,
        verify_crc: bool = True,
        prefetch: bool = True,
        cluster: Cluster | None = None,
        bootstrap: str | Sequence[str] | None = None,
        **unknown: Any,
    ) -> None:
        """``bootstrap_servers``: the coordinator's "host:port" (a string, "h:p,h:p" or a list;
        ``bootstrap`` is the original name). ``prefetch``: consume() reads ahead (see the
        module's docstring); False makes each call one Fetch of its own."""
        security = pop_security(unknown)  # ssl_cafile, token, ... (dmq.client._security)
        reject_unknown("SimpleConsumer", unknown, _SETTINGS)
        check_positive("request_timeout_ms", request_timeout_ms)
        check_flag("verify_crc", verify_crc)
        check_flag("prefetch", prefetch)
        _check_limits(max_wait_ms, max_bytes)
        self._own_cluster = cluster is None
        self._cluster = cluster or Cluster(
            bootstrap_address({"bootstrap_servers": bootstrap_servers, "bootstrap": bootstrap}, "SimpleConsumer"),
            request_timeout_ms=request_timeout_ms, security=security,
        )
        self.max_wait_ms = max_wait_ms
        self.max_bytes = max_bytes
        self.verify_crc = verify_crc
        self.prefetch = prefetch
        self._lock = threading.Lock()  # guards the two below
        self._prefetches: dict[tuple[str, int], Prefetch] = {}  # least recently read first
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None  # made at the first read-ahead
        self._closed = False

    def __repr__(self) -> str:
        return f"<SimpleConsumer bootstrap={self._cluster.bootstrap!r}>"

    @property
    def cluster(self) -> Cluster:
        return self._cluster

    # -- reading ---------------------------------------------------------------------------------

    def consume(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int = 500,
        max_wait_ms: int | None = None,
        max_bytes: int | None = None,
    ) -> RecordSequence:
        """Records from `offset` on (at most max_records); empty when none arrive within
        max_wait_ms. Records buffered by the last call's read-ahead come back at once."""
        if max_records <= 0:
            raise InvalidArgumentError(f"max_records must be >= 1, got {max_records}")
        wait = self.max_wait_ms if max_wait_ms is None else max_wait_ms
        limit = self.max_bytes if max_bytes is None else max_bytes
        _check_limits(wait, limit)
        if offset < 0:
            raise InvalidArgumentError(f"offset must be >= 0, got {offset}")
        key = (topic, partition)
        with self._lock:
            ahead = self._prefetches.pop(key, None)
        if ahead is not None and not ahead.matches(offset, limit):
            ahead.drop()
            ahead = None
        batches: list[RecordBatch] = []
        high_watermark = -1
        if ahead is not None:
            batches = [b for b in ahead.batches if b.last_offset >= offset]
            high_watermark = ahead.high_watermark
            if not batches:
                batches, high_watermark = self._prefetched(ahead, topic, partition, offset)
        if not batches:
            want = FetchWant(topic, partition, offset)
            reader = self._reader(want, wait, limit, INLINE)
            try:
                result = _checked(reader.result(want, attempts=FETCH_ATTEMPTS))
            finally:
                reader.close()
            batches = self._decode(result, topic, partition, offset)
            high_watermark = result.high_watermark
        stop = _stop_offset(batches, offset, max_records)
        out = RecordSequence(topic, partition, batches, offset, stop)
        if self.prefetch and stop > offset:
            self._read_ahead(ahead, topic, partition, stop, limit, wait, batches, high_watermark)
        elif ahead is not None:
            ahead.drop()
        return out

    def _prefetched(
        self, ahead: Prefetch, topic: str, partition: int, offset: int
    ) -> tuple[list[RecordBatch], int]:
        """The batches of the read-ahead's Fetch of `offset` and the high watermark it saw;
        ([], -1) when it has none to give (not sent, failed, an error code, no records): the
        caller then fetches as without read-ahead, which raises or retries what needs it."""
        sent = ahead.take_answer()
        if sent is None:
            return [], -1
        want, reader = sent
        if want.offset != offset:
            reader.cancel()
            return [], -1
        try:
            result = reader.result(want)  # bounded: the call has its deadline
        except DMQError as e:
            log.debug("read-ahead fetch failed; fetching again", topic=topic, partition=partition, error=str(e))
            return [], -1
        if result.error != pb.NONE or not result.records:
            return [], -1
        return self._decode(result, topic, partition, offset), result.high_watermark

    def _read_ahead(
        self,
        ahead: Prefetch | None,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int,
        max_wait_ms: int,
        batches: list[RecordBatch],
        high_watermark: int,
    ) -> None:
        """Keep what was fetched from `offset` on for the next call and, when the log holds more
        after it, start that Fetch; then put the read-ahead back in the table."""
        rest = [b for b in batches if b.last_offset >= offset]
        if ahead is None:
            ahead = Prefetch(topic, partition, offset, max_bytes, rest)
        else:
            ahead.offset, ahead.batches = offset, rest
        if high_watermark >= 0:
            ahead.high_watermark = high_watermark
        after = rest[-1].last_offset + 1 if rest else offset
        # Only when the log holds records after what is buffered: a Fetch at the log end would
        # long-poll with this call's max_wait_ms, and the next call must see what arrives then.
        with self._lock:
            pool = self._pool
            if pool is None and not self._closed:
                pool = self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=PREFETCH_THREADS, thread_name_prefix="dmq-simple-consumer-prefetch"
                )
        if pool is not None and ahead.high_watermark > after:
            ahead.send(self._cluster, pool, after, max_wait_ms, self._cluster.retry.retry_backoff_ms)  # a closed pool: not sent
        evicted: list[Prefetch] = []
        with self._lock:
            if self._closed or not (rest or ahead.in_flight):
                evicted.append(ahead)
            else:
                key = (topic, partition)
                old = self._prefetches.pop(key, None)  # another thread's read of the same partition
                if old is not None:
                    evicted.append(old)
                self._prefetches[key] = ahead
                while len(self._prefetches) > MAX_PREFETCH_PARTITIONS:
                    evicted.append(self._prefetches.pop(next(iter(self._prefetches))))
        for p in evicted:
            p.drop()

    def consume_batches(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        end_offset: int | None = None,
        max_wait_ms: int | None = None,
        max_bytes: int | None = None,
    ) -> Iterator[RecordBatch]:
        """Yield decoded batches from `offset` on, with the next Fetch already in flight.

        Stops after the batch holding ``end_offset - 1`` when end_offset is given; otherwise runs
        until the caller stops iterating, long-polling at the log end. The first batch may start
        before `offset`: iterate it with ``batch.iter_from(offset)``.
        """
        if end_offset is not None and end_offset <= offset:
            return
        first = FetchWant(topic, partition, offset)
        reader = self._reader(first, max_wait_ms, max_bytes, None)
        want: FetchWant | None = first
        try:
            reader.send([first])
            while want is not None:
                result = _checked(reader.result(want, attempts=FETCH_ATTEMPTS))
                batches = self._decode(result, topic, partition, want.offset)
                next_offset = batches[-1].last_offset + 1 if batches else want.offset
                want = None
                if end_offset is None or next_offset < end_offset:
                    want = FetchWant(topic, partition, next_offset)
                    reader.send([want])  # in flight while the caller works on these batches
                yield from batches
        finally:
            reader.close()  # a Fetch still in flight is dropped

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """(log start, log end) of the partition: the first offset kept and the next to be written."""
        info = AdminClient(self._cluster.bootstrap, cluster=self._cluster).list_offsets(topic, partition, "latest")
        return info.log_start_offset, info.log_end_offset

    # -- fetch plumbing ----------------------------------------------------------------------------

    def _reader(
        self,
        want: FetchWant,
        max_wait_ms: int | None,
        max_bytes: int | None,
        pool: concurrent.futures.Executor | None,
    ) -> PartitionReader:
        wait = self.max_wait_ms if max_wait_ms is None else max_wait_ms
        limit = self.max_bytes if max_bytes is None else max_bytes
        _check_limits(wait, limit)
        if want.offset < 0:
            raise InvalidArgumentError(f"offset must be >= 0, got {want.offset}")
        return PartitionReader(
            self._cluster,
            max_wait_ms=wait,
            max_bytes=limit,
            partition_max_bytes=limit,
            retry_backoff_ms=self._cluster.retry.retry_backoff_ms,
            pool=pool,
            name="dmq-simple-consumer",
        )

    def _decode(self, result: FetchPartitionView, topic: str, partition: int, offset: int) -> list[RecordBatch]:
        if not result.records:
            return []
        try:
            batches = records.decode_batches(result.records, verify_crc=self.verify_crc)
        except records.RecordsError as e:
            raise CorruptRecordError(f"{topic}[{partition}] fetched at offset {offset}: {e}") from e
        # Whole batches come back: drop any that end before the requested offset.
        if batches and batches[0].last_offset < offset:
            batches = [b for b in batches if b.last_offset >= offset]
        return batches

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            self._closed = True
            dropped = list(self._prefetches.values())
            self._prefetches.clear()
            pool, self._pool = self._pool, None
        for p in dropped:
            p.drop()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)  # calls still running end with the channels
        if self._own_cluster:
            self._cluster.close()


def _checked(r: FetchPartitionView) -> FetchPartitionView:
    if r.error != pb.NONE:
        raise partition_error(r)
    return r


def _stop_offset(batches: list[RecordBatch], offset: int, max_records: int) -> int:
    """The offset after the last of the first max_records records from `offset` on (`offset`
    when the batches hold none)."""
    stop = offset
    need = max_records
    for b in batches:
        first = max(offset, b.base_offset)
        available = b.last_offset - first + 1
        if available <= 0:
            continue
        if available >= need:
            return first + need
        need -= available
        stop = b.last_offset + 1
    return stop


def _check_limits(max_wait_ms: int, max_bytes: int) -> None:
    if not 0 <= max_wait_ms <= 60_000:
        raise InvalidArgumentError(f"max_wait_ms must be within 0..60000, got {max_wait_ms}")
    if not 1 <= max_bytes <= MAX_FETCH_RESPONSE_BYTES:
        raise InvalidArgumentError(f"max_bytes must be within 1..{MAX_FETCH_RESPONSE_BYTES}, got {max_bytes}")


_SETTINGS = frozenset(
    name for name in inspect.signature(SimpleConsumer.__init__).parameters if name not in ("self", "unknown")
)
