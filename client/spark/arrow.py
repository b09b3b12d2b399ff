"""Fetched record batches -> one `pyarrow.RecordBatch` in the Kafka source's schema.

A Fetch answer holds many DMQ record batches back to back. Each batch already stores its keys
and values Arrow-style (int32 offsets, a LSB validity bitmap, the bytes back to back), so the
columns of a whole answer are built with a fixed number of numpy / Arrow calls per *batch* and
none per *record*:

    value, key   blobs joined (one memcpy each), offsets re-based by each batch's start in the
                 joined blob (np.repeat of the per-batch bases), key bitmaps unpacked / re-packed
    offset       np.repeat(base - first index) + arange
    timestamp    first_timestamp + int32 deltas, or max_timestamp for log-append-time batches, in
                 microseconds (Spark's timestamp unit)
    timestampType  0 create time, 1 log append time (attribute bit 3), as in Kafka
    topic, partition  constant columns built from arange / full

Headers are the one exception: their per-record encoding (varints) is not an Arrow layout, so
when `includeHeaders` is on, batches that carry headers are decoded record by record. A record
without headers gets a null `headers` value, as in Spark's Kafka source.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from dmq.proto.records import CorruptBatchError, RecordBatch

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql.types import StructType

__all__ = ["source_schema", "arrow_schema", "ArrowBuilder", "TIMESTAMP_TYPE_CREATE", "TIMESTAMP_TYPE_LOG_APPEND"]

TIMESTAMP_TYPE_CREATE = 0
TIMESTAMP_TYPE_LOG_APPEND = 1

_I32 = np.dtype("<i4")
_HEADER_TYPE = pa.list_(
    pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
)


def source_schema(include_headers: bool) -> StructType:
    """The Spark schema of the source: Spark's Kafka source columns, headers when asked."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(
            StructField(
                "headers",
                ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
            )
        )
    return StructType(fields)


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema Spark expects from read() (it compares with `equals`)."""
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", _HEADER_TYPE))
    return pa.schema(fields)


def _i32(mv: memoryview) -> np.ndarray:
    return np.frombuffer(mv, dtype=_I32)


def _binary_column(
    counts: np.ndarray, offsets: list[memoryview], blobs: list[memoryview], validity: np.ndarray | None
) -> pa.Array:
    """One binary array from per-batch Arrow-style offsets and blobs (re-based, joined)."""
    total = int(counts.sum())
    lengths = np.fromiter((len(b) for b in blobs), dtype=np.int64, count=len(blobs))
    data_size = int(lengths.sum())
    if data_size > np.iinfo(np.int32).max:
        raise CorruptBatchError(f"{data_size} bytes do not fit one Arrow binary column (int32 offsets)")
    starts = np.zeros(len(blobs), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    if len(offsets) == 1:
        head = _i32(offsets[0])[:-1]
    else:
        head = np.concatenate([_i32(o)[:-1] for o in offsets])
    out = np.empty(total + 1, dtype=np.int32)
    np.add(head, np.repeat(starts, counts), out=out[:-1], casting="unsafe")
    out[-1] = data_size
    # Arrow reads offsets blindly: a corrupt batch must fail here, not read out of bounds. The
    # codec checked each batch's first and last offset; monotonic within each batch remains.
    if total and (np.diff(out) < 0).any():
        raise CorruptBatchError("record batch offsets are not monotonic (non-decreasing)")
    data = blobs[0] if len(blobs) == 1 else b"".join(blobs)
    bitmap = None
    null_count = 0
    if validity is not None:
        null_count = total - int(np.count_nonzero(validity))
        if null_count:
            bitmap = pa.py_buffer(np.packbits(validity, bitorder="little"))
    return pa.Array.from_buffers(
        pa.binary(), total, [bitmap, pa.py_buffer(out), pa.py_buffer(data)], null_count=null_count
    )


class ArrowBuilder:
    """Builds the Arrow batches of one topic-partition; stateless between calls."""

    def __init__(self, topic: str, partition: int, include_headers: bool) -> None:
        self.topic = topic
        self.partition = partition
        self.include_headers = include_headers
        self.schema = arrow_schema(include_headers)
        self._topic_bytes = topic.encode("utf-8")

    def build(self, batches: Sequence[RecordBatch], start: int, until: int) -> pa.RecordBatch | None:
        """Rows of `batches` with start <= offset < until, or None when there are none."""
        batches = [b for b in batches if b.header.last_offset >= start and b.header.base_offset < until]
        if not batches:
            return None
        k = len(batches)
        headers = [b.header for b in batches]
        counts = np.fromiter((h.record_count for h in headers), dtype=np.int64, count=k)
        total = int(counts.sum())
        bases = np.fromiter((h.base_offset for h in headers), dtype=np.int64, count=k)
        first_index = np.zeros(k, dtype=np.int64)
        np.cumsum(counts[:-1], out=first_index[1:])
        offsets = np.repeat(bases - first_index, counts) + np.arange(total, dtype=np.int64)

        log_append = np.fromiter((h.log_append_time for h in headers), dtype=bool, count=k)
        ts_base = np.fromiter(
            (h.max_timestamp if h.log_append_time else h.first_timestamp for h in headers), dtype=np.int64, count=k
        )
        timestamps = np.repeat(ts_base, counts)
        if not log_append.all():
            deltas = [
                np.zeros(h.record_count, dtype=_I32) if h.log_append_time else _i32(b.timestamp_deltas)
                for h, b in zip(headers, batches)
            ]
            timestamps += deltas[0] if k == 1 else np.concatenate(deltas)
        timestamps *= 1000  # ms -> us

        values = _binary_column(counts, [b.value_offsets for b in batches], [b.value_blob for b in batches], None)
        validity = np.concatenate(
            [
                np.unpackbits(np.frombuffer(b.key_validity, dtype=np.uint8), count=h.record_count, bitorder="little")
                for h, b in zip(headers, batches)
            ]
        )
        keys = _binary_column(counts, [b.key_offsets for b in batches], [b.key_blob for b in batches], validity)

        tb = self._topic_bytes
        topic = pa.Array.from_buffers(
            pa.string(),
            total,
            [None, pa.py_buffer(np.arange(total + 1, dtype=np.int32) * len(tb)), pa.py_buffer(tb * total)],
        )
        columns = [
            keys,
            values,
            topic,
            pa.Array.from_buffers(pa.int32(), total, [None, pa.py_buffer(np.full(total, self.partition, np.int32))]),
            pa.Array.from_buffers(pa.int64(), total, [None, pa.py_buffer(offsets)]),
            pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), total, [None, pa.py_buffer(timestamps)]),
            pa.Array.from_buffers(pa.int32(), total, [None, pa.py_buffer(np.repeat(log_append.astype(np.int32), counts))]),
        ]
        if self.include_headers:
            columns.append(_headers_column(batches, total))
        rb = pa.RecordBatch.from_arrays(columns, schema=self.schema)
        lo = int(np.searchsorted(offsets, start, side="left"))
        hi = int(np.searchsorted(offsets, until, side="left"))
        if lo == 0 and hi == total:
            return rb
        if hi <= lo:
            return None
        return rb.slice(lo, hi - lo)


def _headers_column(batches: Sequence[RecordBatch], total: int) -> pa.Array:
    if not any(b.header.has_headers for b in batches):
        return pa.nulls(total, type=_HEADER_TYPE)
    list_offsets = [0]
    valid: list[bool] = []
    keys: list[str] = []
    values: list[bytes | None] = []
    for b in batches:
        if not b.header.has_headers:
            list_offsets.extend([list_offsets[-1]] * len(b))
            valid.extend([False] * len(b))
            continue
        for record_headers in b.headers():
            valid.append(bool(record_headers))
            for hk, hv in record_headers:
                keys.append(hk)
                values.append(hv)
            list_offsets.append(len(keys))
    entries = pa.StructArray.from_arrays(
        [pa.array(keys, type=pa.string()), pa.array(values, type=pa.binary())],
        fields=list(_HEADER_TYPE.value_type),
    )
    nulls = pa.array(np.logical_not(np.array(valid, dtype=bool)))
    return pa.ListArray.from_arrays(pa.array(list_offsets, type=pa.int32()), entries, type=_HEADER_TYPE, mask=nulls)
