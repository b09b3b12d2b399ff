"""Public record types: what consumers return and what a produce resolves to.

Both are NamedTuples so they are cheap to build in bulk (``tuple.__new__`` through ``map``, no
Python-level constructor per record) and unpack like Kafka clients' records.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice, repeat
from typing import NamedTuple

from dmq.proto.records import RecordBatch

__all__ = ["ConsumerRecord", "RecordMetadata", "consumer_records"]


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp: int  # ms since the epoch: the producer's create time
    headers: tuple[tuple[str, bytes | None], ...]


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
