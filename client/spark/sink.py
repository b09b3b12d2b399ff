"""The `dmq` sink: `df.write.format("dmq")` and `df.writeStream.format("dmq")`.

Columns (as Spark's Kafka sink; anything else is refused so a misspelt column cannot vanish):

    value      binary or string   required, never null
    key        binary or string   optional; records with a key go to crc32(key) % partitions
    topic      string             optional; the `topic` option, when given, overrides it
    partition  int                optional; null = chosen by key / sticky
    headers    array<struct<key string, value binary>>   optional
    timestamp  timestamp          optional; the record's create time (else the send time)

Each Spark task writes its rows through one idempotent `Producer` (retried batches are stored
once) and waits until all of them are acknowledged before it reports success: a task that
returns has delivered every row. Rows without headers or timestamps to one topic take the
producer's bulk `send_many` path. A batch write is at least once across task retries, as with Kafka.

A streaming write is exactly once across task retries and driver crashes: every row carries a
transaction id (the `dmq.txn` header) derived from where it sits in its micro-batch,
`<query id>:<batch id>:<task partition>:<row index>`, and the target partition's leader stores an
id once within the topic's `dedup_window_ms` (broker/log/dedup.py; the ids are rebuilt from the
log after a broker restart). After a driver crash Spark re-runs the last planned micro-batch from
its checkpoint with the same offsets, hence the same rows in the same tasks in the same order, so
each re-sent row has the id of its first copy and is acknowledged without being stored again. The
query id and batch id are the local properties Spark gives every task of a micro-batch. Limits
(README "Exactly-once output"): the re-run must come within the window; the rows of a task must
be the same and in the same order on a re-run (no shuffle without a total order before the sink);
a lost checkpoint starts a new query id, whose rows are new.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampType,
)

from dmq.client._log import get_logger
from dmq.client.errors import DMQError
from dmq.client.producer import Producer
from dmq.client.spark._worker import prepare_worker
from dmq.client.spark.options import OptionError, SinkOptions

try:
    from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter
except ImportError:  # pragma: no cover - Spark 4.0 has no Arrow stream writer
    from pyspark.sql.datasource import DataSourceArrowWriter
    from pyspark.sql.datasource import DataSourceStreamWriter as DataSourceStreamArrowWriter  # type: ignore[assignment]

log = get_logger(__name__)

__all__ = ["DMQWriter", "DMQStreamWriter", "WriteResult", "check_sink_schema", "write_task"]

FLUSH_TIMEOUT_S = 300.0
# Spark's names of the local properties it sets on every task of a streaming micro-batch
# (StreamExecution.QUERY_ID_KEY and MicroBatchExecution.BATCH_ID_KEY).
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"

_BYTES_TYPES = (BinaryType, StringType)
_ALLOWED = {
    "value": _BYTES_TYPES,
    "key": _BYTES_TYPES,
    "topic": (StringType,),
    "partition": (IntegerType, ShortType, LongType),
    "headers": (ArrayType,),
    "timestamp": (TimestampType,),
}


def check_sink_schema(schema: StructType, opts: SinkOptions) -> None:
    """Refuse a DataFrame the sink cannot write, naming the column and the fix."""
    names = [f.name for f in schema.fields]
    unknown = [n for n in names if n not in _ALLOWED]
    if unknown:
        raise OptionError(
            f"the dmq sink does not know the columns {unknown}; it writes {sorted(_ALLOWED)} "
            f"(select or rename the columns to write)"
        )
    if "value" not in names:
        raise OptionError("the dmq sink needs a 'value' column (binary or string)")
    for f in schema.fields:
        if not isinstance(f.dataType, _ALLOWED[f.name]):
            wanted = " or ".join(t.__name__.removesuffix("Type").lower() for t in _ALLOWED[f.name])
            raise OptionError(f"column {f.name!r} must be {wanted}, got {f.dataType.simpleString()}")
        if f.name == "headers" and f.dataType.simpleString() != "array<struct<key:string,value:binary>>":
            raise OptionError(
                f"column 'headers' must be array<struct<key:string,value:binary>>, got {f.dataType.simpleString()}"
            )
    if opts.topic is None and "topic" not in names:
        raise OptionError("the dmq sink needs a topic: set the option 'topic' or give a 'topic' column")


@dataclass(frozen=True)
class WriteResult(WriterCommitMessage):
    rows: int


def _column(rb: pa.RecordBatch, name: str) -> list[Any] | None:
    i = rb.schema.get_field_index(name)
    return None if i < 0 else rb.column(i).to_pylist()


def _as_bytes(values: list[Any]) -> list[Any]:
    return [v.encode("utf-8") if type(v) is str else v for v in values]


class _TaskWriter:
    """One Spark task's producer and the handles needed to tell whether all its rows landed."""

    def __init__(self, opts: SinkOptions, txn_prefix: str | None = None) -> None:
        self.opts = opts
        # "<query>:<batch>:<task partition>:": each row's transaction id is this and its index
        self.txn_prefix = txn_prefix
        kwargs: dict[str, Any] = {"enable_idempotence": True}
        if opts.compression != "none":
            kwargs["compression"] = opts.compression
        if opts.linger_ms is not None:
            kwargs["linger_ms"] = opts.linger_ms
        if opts.batch_size is not None:
            kwargs["batch_size"] = opts.batch_size
        kwargs.update(opts.credentials)  # ssl_cafile=..., token=...: over the environment's
        self.producer = Producer(opts.bootstrap, **kwargs)
        self.bulk: list[Any] = []  # SendManyFutures
        self.errors: list[BaseException] = []  # from per-row callbacks (the first few)
        self.rows = 0

    def _on_done(self, _meta: object, error: BaseException | None) -> None:
        if error is not None and len(self.errors) < 10:
            self.errors.append(error)

    def write(self, rb: pa.RecordBatch) -> None:
        n = rb.num_rows
        if not n:
            return
        opts = self.opts
        if rb.column(rb.schema.get_field_index("value")).null_count:
            raise OptionError("column 'value' has nulls: the dmq sink needs a value for every row")
        values = _column(rb, "value")
        assert values is not None
        if rb.schema.field("value").type != pa.binary():
            values = _as_bytes(values)
        keys = _column(rb, "key")
        if keys is not None and rb.schema.field("key").type != pa.binary():
            keys = _as_bytes(keys)
        topics = None if opts.topic is not None else _column(rb, "topic")
        partitions = _column(rb, "partition")
        headers = _column(rb, "headers")
        timestamps = None
        ti = rb.schema.get_field_index("timestamp")
        if ti >= 0:
            # Spark's timestamps are microseconds: truncate to the records' milliseconds
            ms = rb.column(ti).cast(pa.timestamp("ms", tz="UTC"), safe=False)
            timestamps = ms.cast(pa.int64()).to_pylist()
        first_row = self.rows
        self.rows += n
        txn = self.txn_prefix
        if txn is None and topics is None and partitions is None and headers is None and timestamps is None:
            assert opts.topic is not None
            self.bulk.append(self.producer.send_many(opts.topic, values, keys))
            return
        send = self.producer.send
        for i in range(n):
            topic = opts.topic or (topics[i] if topics is not None else None)
            if not topic:
                raise OptionError("a row has a null or empty 'topic' and no 'topic' option is set")
            hdrs = headers[i] if headers is not None else None
            send(
                topic,
                values[i],
                key=keys[i] if keys is not None else None,
                headers=[(h["key"], h["value"]) for h in hdrs] if hdrs else None,
                partition=partitions[i] if partitions is not None else None,
                timestamp_ms=timestamps[i] if timestamps is not None else None,
                callback=self._on_done,
                transaction_id=None if txn is None else f"{txn}{first_row + i}",
            )

    def finish(self) -> None:
        """Flush, then raise the first delivery failure of this task's records."""
        self.producer.flush(FLUSH_TIMEOUT_S)
        for f in self.bulk:
            f.wait(FLUSH_TIMEOUT_S)
        if self.errors:
            raise self.errors[0]

    def close(self) -> None:
        self.producer.close(FLUSH_TIMEOUT_S)


ROWS_PER_BATCH = 10_000


def as_arrow_batches(items: Iterator[Any]) -> Iterator[pa.RecordBatch]:
    """Arrow batches as they are; Spark Rows (the row-based stream writer of Spark 4.0) grouped
    into batches, so one code path writes both."""
    chunk: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, pa.RecordBatch):
            yield item
            continue
        row = item.asDict(recursive=True)
        for name in ("value", "key"):
            if isinstance(row.get(name), bytearray):
                row[name] = bytes(row[name])
        chunk.append(row)
        if len(chunk) >= ROWS_PER_BATCH:
            yield pa.RecordBatch.from_pylist(chunk)
            chunk = []
    if chunk:
        yield pa.RecordBatch.from_pylist(chunk)


def stream_txn_prefix() -> str | None:
    """This streaming task's transaction id prefix, "<query id>:<batch id>:<partition>:" (the
    module docstring); None where Spark gives no query or batch id (then at least once)."""
    ctx = TaskContext.get()
    if ctx is None:
        return None
    query = ctx.getLocalProperty(QUERY_ID_PROPERTY)
    batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
    if not query or batch is None:
        log.warning("dmq sink: Spark gave no streaming query or batch id, so rows are written at least once",
                    query_id=query, batch_id=batch)
        return None
    return f"{query}:{batch}:{ctx.partitionId()}:"


def write_task(opts: SinkOptions, batches: Iterator[Any], txn_prefix: str | None = None) -> WriteResult:
    """Write one task's rows and return once every one is acknowledged (or raise); with
    `txn_prefix`, each row carries the transaction id txn_prefix + its index in the task."""
    prepare_worker()
    task = _TaskWriter(opts, txn_prefix)
    try:
        for rb in as_arrow_batches(batches):
            task.write(rb)
        task.finish()
    except DMQError as e:
        log.error("dmq sink task failed", topic=opts.topic, error=str(e))
        raise
    finally:
        task.close()
    return WriteResult(task.rows)


class DMQWriter(DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        return write_task(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, WriteResult))
        log.info("dmq sink wrote", rows=rows, tasks=len(messages), topic=self.opts.topic)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, WriteResult))
        log.warning("dmq sink aborted: rows of successful tasks stay written", rows=rows, topic=self.opts.topic)


class DMQStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        return write_task(self.opts, iterator, stream_txn_prefix())

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        rows = sum(m.rows for m in messages if isinstance(m, WriteResult))
        log.debug("dmq sink micro-batch written", batch_id=batchId, rows=rows, topic=self.opts.topic)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        log.warning("dmq sink micro-batch aborted", batch_id=batchId, topic=self.opts.topic)
