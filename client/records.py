"""Public record types: what consumers return and what a produce resolves to.

Both are NamedTuples so they are cheap to build in bulk (``tuple.__new__`` through ``map``, no
Python-level constructor per record) and unpack like Kafka clients' records.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import chain, islice, repeat
from typing import NamedTuple, overload

from dmq.proto.records import RecordBatch
from dmq.proto.tracecontext import TRACEPARENT_HEADER, TraceContext, parse_traceparent

__all__ = ["ConsumerRecord", "RecordMetadata", "RecordSequence", "consumer_records"]


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp: int  # ms since the epoch: the producer's create time
    headers: tuple[tuple[str, bytes | None], ...]

    @property
    def trace_context(self) -> TraceContext | None:
        """The W3C trace context of the record's ``traceparent`` header (the last one), or None
        when it has none or one the spec says to ignore. Give it to ``Producer.send(...,
        trace_context=...)`` to carry the trace to the next topic (dmq.client.tracing)."""
        for name, value in reversed(self.headers):
            if name == TRACEPARENT_HEADER:
                return parse_traceparent(value)
        return None


class RecordMetadata(NamedTuple):
    """Where a produced record was stored. ``offset`` is -1 with acks=0 (nobody waited)."""

    topic: str
    partition: int
    offset: int
    timestamp: int  # ms: the record's create time


def consumer_records(
    topic: str, partition: int, batch: RecordBatch, start_offset: int = 0, max_records: int | None = None
) -> Iterator[ConsumerRecord]:
    """ConsumerRecords of `batch` with offset >= start_offset, at most max_records of them.

    Built column-wise from the batch's arrays (values(), keys(), ...) rather than record by record,
    so the per-record cost is a tuple allocation.
    """
    h = batch.header
    n = h.record_count
    skip = max(0, start_offset - h.base_offset)
    if skip >= n:
        return iter(())
    stop = n if max_records is None else min(n, skip + max(0, max_records))
    rows: Iterator[tuple[object, ...]] = zip(
        repeat(topic),
        repeat(partition),
        range(h.base_offset, h.base_offset + n),
        batch.keys(),
        batch.values(),
        batch.timestamps(),
        batch.headers(),
    )
    if skip or stop < n:
        rows = islice(rows, skip, stop)
    return map(tuple.__new__, repeat(ConsumerRecord), rows)


class RecordSequence(Sequence[ConsumerRecord]):
    """Records of one partition kept as columns (offsets, keys, values, timestamps, headers); each
    ConsumerRecord is built when it is reached, by iteration or indexing, and not kept here.

    Why (a queue lease's records): a tuple of 1,000 ConsumerRecords is 1,000 objects the garbage
    collector tracks (a tuple subclass is never untracked), and the ones still alive when a
    collection runs are promoted, which sets off full collections of the whole heap. Building
    them all up front cost ~1 ms per 1,000 records in a worker, more than half of it collections
    (measured: 0.7-1.1 ms, 0.4 ms with the collector off). Built one at a time as a loop reaches
    them, each is freed before the next is made: no collection runs, and the columns themselves
    are a few lists of untracked bytes and ints.

    Immutable and compared like the tuple of its records (``==`` a tuple or a list with the same
    records, the same hash as the tuple); a slice is a RecordSequence too. Records are equal each
    time they are built, not identical. SimpleConsumer.consume() and DMQConsumer.poll() hand
    records out in these too (the same collections, for the same reason).
    """

    __slots__ = ("_topic", "_partition", "_offsets", "_keys", "_values", "_timestamps", "_headers")

    def __init__(self, topic: str, partition: int, batches: Iterable[RecordBatch], start: int, stop: int) -> None:
        """The records of `batches` with offsets in [start, stop)."""
        self._topic = topic
        self._partition = partition
        offsets: list[range] = []
        keys: list[bytes | None] = []
        values: list[bytes] = []
        timestamps: list[int] = []
        headers: list[tuple[tuple[str, bytes | None], ...]] = []
        for batch in batches:
            h = batch.header
            lo = max(start - h.base_offset, 0)
            hi = min(stop - h.base_offset, h.record_count)
            if lo >= hi:
                continue
            offsets.append(range(h.base_offset + lo, h.base_offset + hi))
            bkeys, bvalues, btimestamps, bheaders = batch.columns()  # decoded once per batch
            if lo == 0 and hi == h.record_count:
                keys += bkeys
                values += bvalues
                timestamps += btimestamps
                headers += bheaders
            else:
                keys += bkeys[lo:hi]
                values += bvalues[lo:hi]
                timestamps += btimestamps[lo:hi]
                headers += bheaders[lo:hi]
        # one batch (the common case): its offsets stay a range
        self._offsets: Sequence[int] = offsets[0] if len(offsets) == 1 else list(chain.from_iterable(offsets))
        self._keys, self._values, self._timestamps, self._headers = keys, values, timestamps, headers

    def __len__(self) -> int:
        return len(self._values)

    @property
    def next_offset(self) -> int:
        """The offset after the last record; only for a sequence with records."""
        return self._offsets[-1] + 1

    def __iter__(self) -> Iterator[ConsumerRecord]:
        return self._rows(self._offsets, self._keys, self._values, self._timestamps, self._headers)

    def cursor(self) -> tuple[Iterator[ConsumerRecord], Iterator[int]]:
        """An iterator over the records and its cursor: the iterator of offsets it steps, whose
        ``operator.length_hint`` is exactly how many records are left, and which, exhausted
        (``deque(cursor, maxlen=0)``), ends the records iterator too. For a consumer handing
        records out one at a time through C iterators (``yield from``) that must later know how
        many went out, and stop a reader between two records, with no Python step per record."""
        left = iter(self._offsets)
        return self._rows(left, self._keys, self._values, self._timestamps, self._headers), left

    def _rows(self, offsets: Iterable[int], *columns: Sequence[object]) -> Iterator[ConsumerRecord]:
        # tuple.__new__ builds each NamedTuple in C (see consumer_records). The offsets come
        # first after the constants: zip stops at them before taking anything from the rest.
        return map(tuple.__new__, repeat(ConsumerRecord),
                   zip(repeat(self._topic), repeat(self._partition), offsets, *columns))

    @overload
    def __getitem__(self, index: int) -> ConsumerRecord: ...

    @overload
    def __getitem__(self, index: slice) -> RecordSequence: ...

    def __getitem__(self, index: int | slice) -> ConsumerRecord | RecordSequence:
        if isinstance(index, slice):  # the columns cut, the records still built when reached
            part = RecordSequence.__new__(RecordSequence)
            part._topic, part._partition = self._topic, self._partition
            part._offsets, part._keys, part._values = self._offsets[index], self._keys[index], self._values[index]
            part._timestamps, part._headers = self._timestamps[index], self._headers[index]
            return part
        columns = (self._offsets, self._keys, self._values, self._timestamps, self._headers)
        return ConsumerRecord(self._topic, self._partition, *(c[index] for c in columns))  # type: ignore[arg-type]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RecordSequence | tuple | list):
            return len(self) == len(other) and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        if not self._values:
            return "RecordSequence([])"
        return (
            f"RecordSequence({len(self)} records of {self._topic}[{self._partition}], "
            f"offsets {self._offsets[0]}..{self._offsets[-1]})"
        )
