"""Read-ahead for SimpleConsumer.consume(): the next Fetch of a partition travels while the caller
works through the records of the last one.

consume() is stateless for its caller (topic, partition, offset in; records out), so the read-ahead
is keyed by what the next call will most likely ask for: the offset just past the records
returned. After a call, a partition's `Prefetch` holds

  - `batches`: the decoded batches of the last answer not handed out yet (a fetch returns up to
    max_bytes, often far more than max_records), and
  - at most one Fetch in flight for the offset after them, sent only when the answer's high
    watermark says records exist there (so it never long-polls at the log end: a caught-up
    reader asks afresh, with its own max_wait_ms, and sees what arrived meanwhile).

A call at exactly `offset` (same max_bytes) takes from it; any other offset drops it (nothing
prefetched is ever returned for an offset not asked for). The fetched data is not validated
again when handed out later: records that retention deletes meanwhile may still be returned,
as a buffered Kafka consumer does.

Bounds: per partition one answer buffered (with the columns decoded from it: about twice its
size) and one in flight (max_bytes each); at most
MAX_PREFETCH_PARTITIONS partitions, the least recently read dropped first; the Fetch calls run
on the SimpleConsumer's pool (PREFETCH_THREADS threads), which close() shuts down.
"""

from __future__ import annotations

import concurrent.futures

from dmq.client._cluster import Cluster
from dmq.client._reader import FetchWant, PartitionReader
from dmq.proto.records import RecordBatch

__all__ = ["Prefetch", "MAX_PREFETCH_PARTITIONS", "PREFETCH_THREADS"]

MAX_PREFETCH_PARTITIONS = 64
PREFETCH_THREADS = 4


class Prefetch:
    """One partition's read-ahead; owned by one consume() call at a time (taken out of the
    SimpleConsumer's table under its lock, put back after)."""

    __slots__ = ("topic", "partition", "offset", "max_bytes", "batches", "high_watermark", "_reader", "_want")

    def __init__(self, topic: str, partition: int, offset: int, max_bytes: int, batches: list[RecordBatch]) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset  # the offset the next consume() is expected to ask for
        self.max_bytes = max_bytes
        self.batches = batches  # not handed out yet; the first may start before `offset`
        self.high_watermark = -1  # of the last answer taken in
        self._reader: PartitionReader | None = None
        self._want: FetchWant | None = None  # the Fetch in flight, if any

    def __repr__(self) -> str:
        return (
            f"<Prefetch {self.topic}[{self.partition}] offset={self.offset} buffered={len(self.batches)} batches "
            f"in_flight={self._want.offset if self._want else None}>"
        )

    def matches(self, offset: int, max_bytes: int) -> bool:
        return offset == self.offset and max_bytes == self.max_bytes

    @property
    def in_flight(self) -> bool:
        return self._want is not None

    def send(
        self, cluster: Cluster, pool: concurrent.futures.Executor, offset: int, max_wait_ms: int, retry_backoff_ms: int
    ) -> None:
        """Start the Fetch of `offset` on (at most one in flight)."""
        if self._want is not None:
            return
        if self._reader is None:
            self._reader = PartitionReader(
                cluster,
                max_wait_ms=max_wait_ms,
                max_bytes=self.max_bytes,
                partition_max_bytes=self.max_bytes,
                retry_backoff_ms=retry_backoff_ms,
                pool=pool,
                name="dmq-simple-consumer",
            )
        want = FetchWant(self.topic, self.partition, offset)
        self._reader.send([want])
        if self._reader.in_flight((self.topic, self.partition)):
            self._want = want

    def take_answer(self) -> tuple[FetchWant, PartitionReader] | None:
        """The Fetch in flight (to wait for with reader.result(want)), now no longer this one's."""
        want, reader = self._want, self._reader
        self._want = None
        if want is None or reader is None:
            return None
        return want, reader

    def drop(self) -> None:
        """Forget the buffer and any Fetch in flight (its answer is dropped when it comes).
        The reader's pool is the SimpleConsumer's: cancel() leaves it running."""
        self.batches = []
        self._want = None
        if self._reader is not None:
            self._reader.cancel()
