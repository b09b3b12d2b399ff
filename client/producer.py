"""Producer: batches records per partition and ships them from a background sender thread.

    with Producer(bootstrap_servers="127.0.0.1:9091") as p:
        p.send("orders", b'{"id": 1}', key=b"customer-7")          # -> RecordFuture
        p.send_many("clicks", [b"a", b"b", b"c"])                   # -> SendManyFuture
    # leaving the block flushes and closes

Where a record goes: ``partition=`` if given; else, with a key, ``zlib.crc32(key) % partitions``
(see `dmq.client._partitioner`); else, with a ``transaction_id``, the same function of the id's
UTF-8 bytes (so a resent transaction meets its first copy on one partition, where the broker
de-duplicates it); else the thread's sticky partition, which moves on each time its batch is sealed.

Transaction ids: ``send(..., transaction_id=...)`` puts it in the reserved header ``dmq.txn``
(dmq.proto.records). A record whose transaction id the partition stored within the topic's
``dedup_window_ms`` is not stored again: its RecordMetadata.offset is the original's.

Trace context (W3C, dmq.proto.tracecontext): a record's ``traceparent`` header, written only when
asked for, so untraced sends cost nothing more. ``send(..., trace_context=record.trace_context)``
continues a received record's trace (same trace id, a new span id); ``send(..., trace_id=...)``
(32 hex digits) starts one with that id; ``trace_ids=True`` starts a new trace for every record
sent without either. ``opentelemetry=True`` (the ``otel`` extra) makes every send an OpenTelemetry
PRODUCER span, a child of the given context or of the current span, whose context the
traceparent carries (dmq.client._otel). AdminClient.find_trace / ``dmq trace`` follow a trace id
across topics. (Clients before traceparent wrote a ``dmq.trace`` header: the broker still
indexes it, and a header given in ``headers=`` is sent as it is.)

Batching: a partition's batch ships when it is full or ``linger_ms`` old and the partition has
room for another Produce in flight; meanwhile it keeps filling. ``max_in_flight_requests_per_connection``
(Kafka's name; 1..5, default 5 with idempotence, else 1) bounds a partition's Produce calls awaiting
an answer. With idempotence records keep their order even across retries (the broker appends a
producer's batches in sequence order, and retries go out in seal order); without it, more than 1
may reorder a retried batch, as in Kafka. Different partitions are sent concurrently. See `dmq.client._accumulator` for
the lock-free fast path of send() and `dmq.client._sender` for retries and idempotence.

Batch size: an encoded batch (header, arrays, compression included) is at most
min(``batch_size``, the topic's ``max_message_bytes``), so a topic never refuses a batch for its
size. A record that does not fit a batch of ``batch_size`` on its own goes alone, up to the
topic's limit; above that send() raises RecordTooLargeError naming the limit. ``max_record_bytes``
(default None: the topic's limit alone) bounds a record's key + value + headers below it.

Delivery: acks="all" (default: the broker fsyncs per its flush policy before answering), 1 (the
leader wrote it), 0 (nobody waits: futures resolve with offset -1 once the batch is sent).
Retriable errors are retried with exponential backoff (retry_backoff_ms .. retry_backoff_max_ms)
until ``retries`` attempts or ``delivery_timeout_ms`` after the batch was created. With
enable_idempotence (default with acks "all" or 1) a retried batch whose first answer was lost
is stored once. With acks=0 it is off (and refused if asked for): nobody reads the answers, so a
lost batch would leave a sequence gap that makes the broker refuse every later batch.

Timestamps: records sent without ``timestamp_ms`` get their batch's creation time, which is at
most linger_ms (or the time to fill a batch) before their send().

Threads: send() is safe from any number of threads. Callbacks run on the sender thread: keep them
short, and do not call flush() from one (it would wait for itself).
"""

from __future__ import annotations

import concurrent.futures
import inspect
import threading
import time
from collections.abc import Callable, Sequence
from itertools import accumulate, repeat
from operator import add
from threading import get_ident
from typing import Any

from dmq.client._accumulator import (
    RECORD_OVERHEAD_BYTES,
    Callback,
    ProducerBatch,
    RecordFuture,
    SendManyFuture,
    ThreadState,
)
from dmq.client._calls import retry_call
from dmq.client._closing import ClosedOnExit
from dmq.client._cluster import Cluster, TopicMetadata
from dmq.client._log import get_logger
from dmq.client._partitioner import Partitioner
from dmq.client._producer_core import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_BUFFER_MEMORY,
    IN_FLIGHT_POLL_S,
    SENDER_STOP_TIMEOUT_S,
    USER_HEADER,
    Headers,
    ProducerCore,
    as_bytes,
    normalise_headers,
    trace_parent,
)
from dmq.client._security import pop_security
from dmq.client._sender import Sender
from dmq.client._settings import bootstrap_address, reject_unknown
from dmq.client.errors import (
    ClientClosedError,
    DMQError,
    DMQTimeoutError,
    IllegalStateError,
    InvalidConfigError,
    RecordTooLargeError,
    SerializationError,
)
from dmq.client.tracing import OTEL_EXTRA_HINT
from dmq.proto import records
from dmq.proto.tracecontext import TraceContext

log = get_logger(__name__)

__all__ = ["Producer", "RecordFuture", "SendManyFuture"]

Serializer = Callable[[Any], bytes]
_BYTES_ONLY = {bytes}


class Producer(ClosedOnExit):
    """Sends records to DMQ topics. Thread-safe. Close it (or use `with`) to deliver what is
    buffered and stop its sender thread."""

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str] | None = None,
        *,
        acks: str | int = "all",
        linger_ms: float = 5,
        batch_size: int = DEFAULT_BATCH_SIZE,
        compression: str | None = None,
        enable_idempotence: bool | None = None,
        buffer_memory: int = DEFAULT_BUFFER_MEMORY,
        max_block_ms: int = 60_000,
        retries: int = 2_147_483_647,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
        request_timeout_ms: int = 30_000,
        delivery_timeout_ms: int = 120_000,
        max_in_flight_requests_per_connection: int | None = None,
        max_record_bytes: int | None = None,
        partitioner: Partitioner | None = None,
        client_id: str | None = None,
        cluster: Cluster | None = None,
        key_serializer: Serializer | None = None,
        value_serializer: Serializer | None = None,
        bootstrap: str | Sequence[str] | None = None,
        trace_ids: bool = False,
        opentelemetry: bool = False,
        **unknown: Any,
    ) -> None:
        """``bootstrap_servers``: the coordinator's "host:port" (a string, "h:p,h:p" or a list;
        ``bootstrap`` is the original name). ``key_serializer`` / ``value_serializer``: applied to
        every key / value given to send() and send_many() (see dmq.client.serializers). Every
        bad setting raises InvalidConfigError (a ValueError) naming it."""
        security = pop_security(unknown)  # ssl_cafile, token, ... (dmq.client._security)
        reject_unknown("Producer", unknown, _SETTINGS)
        for name, fn in (("key_serializer", key_serializer), ("value_serializer", value_serializer)):
            if fn is not None and not callable(fn):
                raise InvalidConfigError(f"{name} must be a callable returning bytes, got {type(fn).__name__}")
        address = "" if cluster is not None else bootstrap_address(
            {"bootstrap_servers": bootstrap_servers, "bootstrap": bootstrap}, "Producer"
        )
        wakeup = threading.Event()
        # The settings, the accumulator and every decision both producers share (_producer_core).
        self._core = core = ProducerCore(
            acks=acks, linger_ms=linger_ms, batch_size=batch_size, compression=compression,
            enable_idempotence=enable_idempotence, buffer_memory=buffer_memory, max_block_ms=max_block_ms,
            retries=retries, retry_backoff_ms=retry_backoff_ms, retry_backoff_max_ms=retry_backoff_max_ms,
            request_timeout_ms=request_timeout_ms, delivery_timeout_ms=delivery_timeout_ms,
            max_record_bytes=max_record_bytes, partitioner=partitioner, client_id=client_id, wakeup=wakeup,
            max_in_flight_requests_per_connection=max_in_flight_requests_per_connection,
            shell="Producer", runner="thread", closer="close()",
        )
        self.client_id = client_id or f"producer-{id(self):x}"
        self._own_cluster = cluster is None
        self._key_serializer = key_serializer
        self._value_serializer = value_serializer
        self._serializing = key_serializer is not None or value_serializer is not None
        if not isinstance(trace_ids, bool):
            raise InvalidConfigError(f"trace_ids must be True or False, got {trace_ids!r}")
        self._trace_ids = trace_ids  # a new trace for every record sent without a context
        if not isinstance(opentelemetry, bool):
            raise InvalidConfigError(f"opentelemetry must be True or False, got {opentelemetry!r}")
        self._otel: Any = None  # dmq.client._otel when opentelemetry=True
        if opentelemetry:
            try:
                from dmq.client import _otel
            except ModuleNotFoundError:
                raise InvalidConfigError(f"opentelemetry=True: {OTEL_EXTRA_HINT}") from None
            self._otel = _otel
        self._traced = trace_ids or opentelemetry  # every send takes the traced path
        self._cluster = cluster or Cluster(address, request_timeout_ms=core.metadata_timeout_ms, security=security)
        if self._own_cluster:
            # A wrong address fails here, naming it (kafka-python's NoBrokersAvailable), within
            # the Cluster's timeout (request_timeout_ms, or max_block_ms if shorter): not in
            # every send() after max_block_ms of metadata retries.
            try:
                self._cluster.check_reachable()
            except BaseException:
                self._cluster.close()
                raise
        self.producer_id = core.producer_id
        self.acks = acks
        self._acc = core.acc
        self._pool = core.pool
        # the fast path reads this dict directly
        self._threads: dict[int, ThreadState] = self._acc.threads
        self._sender = Sender(self._acc, self._cluster, **core.sender_settings(self.client_id))
        self._close_lock = threading.Lock()
        self._closed = False
        self._sender.start()
        log.debug("producer started", client_id=self.client_id, producer_id=self.producer_id, acks=acks)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"<Producer {self.client_id} bootstrap={self._cluster.bootstrap!r} {state} "
            f"pending_batches={len(self._acc.incomplete)} buffer_free={self._pool.available}>"
        )

    # -- send ------------------------------------------------------------------------------------

    def send(
        self,
        topic: str,
        value: bytes,
        key: bytes | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        callback: Callback | None = None,
        transaction_id: str | None = None,
        trace_id: str | None = None,
        trace_context: TraceContext | str | None = None,
    ) -> RecordFuture:
        """Queue one record; returns a handle whose get() gives its RecordMetadata.

        ``transaction_id``: a string of 1 to 255 characters. ``trace_id``: a W3C trace id (32 hex
        digits, not all zero). ``trace_context``: the context to continue (a TraceContext, e.g.
        a received record's ``trace_context``, or a traceparent string); at most one of the two.
        Bad values raise ValueError naming the argument; see the module docstring.

        Blocks only when buffer_memory is full (up to max_block_ms, then DMQTimeoutError) or on
        the first send to a topic (its metadata). `callback(metadata, error)` runs once the
        record is acknowledged or has failed. The handle is a concurrent.futures.Future: it works
        with concurrent.futures.wait() and as_completed().
        """
        if self._serializing:
            key, value = self._serialize(topic, key, value)
        if transaction_id is not None or trace_id is not None or trace_context is not None or self._traced:
            return self._send_ids(
                topic, value, key, headers, partition, timestamp_ms, callback, transaction_id, trace_id, trace_context
            )
        # Fast path: a plain value for this thread's sticky batch. No lock: this thread is the
        # batch's only appender (see _accumulator); a seal racing the append is caught by the
        # `sealed` check after it.
        if key is None and partition is None and headers is None and timestamp_ms is None and type(value) is bytes:
            st = self._threads.get(get_ident())
            if st is not None:
                b = st.sticky.get(topic)
                if b is not None:
                    size = b.size + len(value) + 12  # RECORD_OVERHEAD_BYTES
                    if size <= b.limit:
                        b.size = size
                        values = b.values
                        values.append(value)
                        if b.sealed:
                            return self._raced(b, values, len(values) - 1, value, callback)
                        handle = RecordFuture(b, len(values) - 1)
                        if callback is not None:
                            handle.add_callback(callback)
                        return handle
        return self._send_slow(topic, value, key, headers, partition, timestamp_ms, callback)

    def _raced(
        self, b: ProducerBatch, values: list[bytes], index: int, value: bytes, callback: Callback | None
    ) -> RecordFuture:
        """The batch was sealed around our append: did the seal count the record?"""
        with self._acc.lock:
            included = id(values) == b.values_id and index < b.count
        if not included:
            return self._send_slow(b.topic, value, None, None, None, None, callback)
        handle = RecordFuture(b, index)
        if callback is not None:
            handle.add_callback(callback)
        return handle

    def _send_ids(
        self,
        topic: str,
        value: Any,
        key: Any,
        headers: Headers | None,
        partition: int | None,
        timestamp_ms: int | None,
        callback: Callback | None,
        transaction_id: str | None,
        trace_id: str | None,
        trace_context: TraceContext | str | None,
    ) -> RecordFuture:
        """send() of a record with a transaction id or a trace context: the reserved headers
        added (and, with opentelemetry=True, its PRODUCER span started, ended with the answer)."""
        self._check_open()
        hdrs = normalise_headers(headers) or []
        txn_key = None
        if transaction_id is not None:
            txn_key = records.check_record_id(transaction_id, "transaction_id").encode()
            hdrs.append((records.TXN_HEADER, txn_key))
        parent = trace_parent(hdrs, trace_id, trace_context)
        span = None
        if self._otel is not None and parent is not USER_HEADER:
            span, carrier = self._otel.start_send(topic, parent)
            hdrs += [(name, text.encode()) for name, text in carrier.items()]
            if records.TRACEPARENT_HEADER in carrier:
                parent = USER_HEADER  # written: the span's own context
        if parent is None and self._trace_ids:
            parent = TraceContext.new()
        if isinstance(parent, TraceContext):
            # a given context is the sender's; this record is its next hop: same trace, new span
            ctx = parent if trace_context is None else parent.child()
            hdrs.append((records.TRACEPARENT_HEADER, ctx.traceparent.encode()))
        try:
            handle = self._send_slow(
                topic, value, key, hdrs or None, partition, timestamp_ms, callback, txn_key, normalised=True
            )
        except BaseException as e:
            if span is not None:
                self._otel.end_send(span, None, e)
            raise
        if span is not None:
            handle.add_callback(lambda metadata, error: self._otel.end_send(span, metadata, error))
        return handle

    def _send_slow(
        self,
        topic: str,
        value: Any,
        key: Any,
        headers: Headers | None,
        partition: int | None,
        timestamp_ms: int | None,
        callback: Callback | None,
        txn_key: bytes | None = None,
        *,
        normalised: bool = False,
    ) -> RecordFuture:
        """send() of every record the fast path does not take; `txn_key`: the transaction id
        (in the headers already) that places a record without a key; `normalised`: the headers
        are normalise_headers' list already (checked once, not twice)."""
        core, acc = self._core, self._acc
        self._check_open()
        record = core.prepare(topic, value, key, headers, timestamp_ms, normalised=normalised)
        meta = self._topic_metadata(topic)
        batch_cap = core.fit(topic, meta, record)
        if partition is not None:
            meta = self._check_partition(topic, partition, meta)
        partition = core.place(meta, partition, record.key, txn_key)
        sticky = partition is None
        st = acc.thread_state(get_ident())
        credit = 0  # reserved buffer memory not yet given to a batch (see _producer_core)
        try:
            while True:
                with acc.lock:
                    self._check_open()
                    if sticky:
                        partition = core.sticky_partition(st, topic, meta, partition)
                    assert partition is not None
                    b, n = core.append(st, topic, partition, sticky, record, batch_cap, credit)
                if b is not None:
                    credit = 0
                    break
                if n == 0:  # sealed full: a sticky record moves on to the next partition
                    partition = None if sticky else partition
                    continue
                self._pool.reserve(n, self._core.max_block_ms)  # outside the lock: may block
                credit += n
        finally:
            if credit:
                self._pool.release(credit)
        handle = RecordFuture(b, n)
        if callback is not None:
            handle.add_callback(callback)
        return handle

    def send_many(
        self,
        topic: str,
        values: Sequence[bytes],
        keys: Sequence[bytes | None] | None = None,
        partition: int | None = None,
    ) -> SendManyFuture:
        """Queue many records at once: the bulk path, much cheaper per record than send().

        Partitioning is as for send() (explicit partition, key hash, else sticky). Returns a
        SendManyFuture: ``get()`` gives every RecordMetadata in input order, ``wait()`` just waits.
        """
        self._check_open()
        values = values if isinstance(values, list) else list(values)
        if self._serializing:
            pairs = [self._serialize(topic, k, v) for k, v in zip(keys if keys is not None else repeat(None), values)]
            values = [v for _, v in pairs]
            if keys is not None:
                keys = [k for k, _ in pairs]
        n = len(values)
        if n == 0:
            return SendManyFuture([], 0)
        if set(map(type, values)) != _BYTES_ONLY:  # a C loop: ~3x cheaper than a generator
            values = [as_bytes(v, "values[]") for v in values]
        sizes = list(map(len, values))
        if keys is not None:
            keys = keys if isinstance(keys, list) else list(keys)
            if len(keys) != n:
                raise ValueError(f"send_many: {len(keys)} keys for {n} values")
            if any(k is not None and type(k) is not bytes for k in keys):
                keys = [None if k is None else as_bytes(k, "keys[]") for k in keys]
            sizes = [s + (0 if k is None else len(k)) for s, k in zip(sizes, keys)]
        biggest = max(sizes)
        core = self._core
        if core.max_record_bytes is not None and biggest > core.max_record_bytes:
            i = sizes.index(biggest)
            raise RecordTooLargeError(
                f"send_many: record {i} is {biggest} bytes, above max_record_bytes {core.max_record_bytes}"
            )
        meta = self._topic_metadata(topic)
        _, record_cap = core.caps_for(meta)
        if biggest + RECORD_OVERHEAD_BYTES > record_cap:
            i = sizes.index(biggest)
            raise core.too_large(topic, meta, biggest, biggest + RECORD_OVERHEAD_BYTES, f"send_many: record {i}: ")
        count = meta.partition_count
        st = self._acc.thread_state(get_ident())
        segments: list[tuple[ProducerBatch, int, int, list[int] | None]] = []
        if partition is not None:
            meta = self._check_partition(topic, partition, meta)
            self._append_run(st, topic, partition, meta, values, keys, sizes, None, segments)
        elif keys is None:
            self._append_run(st, topic, None, meta, values, None, sizes, None, segments)
        else:
            # Keyless records in a keyed call all go to the current sticky partition, resolved
            # once, so that every partition's records form one run in input order (grouping them
            # apart would put keyless records behind keyed ones of the same partition).
            with self._acc.lock:
                sticky = core.sticky_partition(st, topic, meta, None)
            groups: dict[int, list[int]] = {}
            part = core.partitioner
            for i, k in enumerate(keys):
                p = sticky if k is None else part(k, count)
                g = groups.get(p)
                if g is None:
                    groups[p] = [i]
                else:
                    g.append(i)
            for p, positions in groups.items():
                self._append_run(
                    st,
                    topic,
                    p,
                    meta,
                    [values[i] for i in positions],
                    [keys[i] for i in positions],
                    [sizes[i] for i in positions],
                    positions,
                    segments,
                )
        return SendManyFuture(segments, n)

    def _append_run(
        self,
        st: ThreadState,
        topic: str,
        partition: int | None,
        meta: TopicMetadata,
        values: list[bytes],
        keys: list[bytes | None] | None,
        sizes: list[int],
        positions: list[int] | None,
        segments: list[tuple[ProducerBatch, int, int, list[int] | None]],
    ) -> None:
        """Append records to `partition` (None = sticky), a batch-sized chunk per lock hold."""
        acc, core = self._acc, self._core
        batch_cap, _ = core.caps_for(meta)
        cum = [0, *accumulate(map(add, sizes, repeat(RECORD_OVERHEAD_BYTES)))]
        n = len(values)
        i = 0
        credit = 0  # reserved buffer memory not yet given to a batch (see _producer_core)
        try:
            while i < n:
                with acc.lock:
                    self._check_open()
                    p = partition if partition is not None else core.sticky_partition(st, topic, meta, None)
                    j, need = core.extend(st, topic, p, partition is None, values, keys, cum, positions, i,
                                          batch_cap, credit, segments)
                if j > i:
                    i, credit = j, 0
                elif need:
                    self._pool.reserve(need, core.max_block_ms)  # outside the lock: may block
                    credit += need
        finally:
            if credit:
                self._pool.release(credit)

    # -- metadata --------------------------------------------------------------------------------

    def _topic_metadata(self, topic: str, *, fresh: bool = False) -> TopicMetadata:
        """Cached, even stale (Cluster.cached_metadata), unless `fresh`; else asked, retried until max_block_ms."""
        if not fresh and (cached := self._cluster.cached_metadata(topic)) is not None:
            return cached
        deadline = time.monotonic() + self._core.max_block_ms / 1000
        try:
            return retry_call(lambda: self._cluster.topic_metadata(topic), policy=self._sender.retry, deadline=deadline)
        except DMQError as e:
            if not e.retriable:
                raise
            raise DMQTimeoutError(f"metadata for topic {topic!r} not available within max_block_ms: {e}") from e

    def _check_partition(self, topic: str, partition: Any, meta: TopicMetadata) -> TopicMetadata:
        """`partition` must exist; the topic may have grown since we cached it, so ask once more."""
        if not self._core.partition_in(partition, meta):
            self._cluster.invalidate(topic)
            meta = self._topic_metadata(topic, fresh=True)
            if not self._core.partition_in(partition, meta):
                raise self._core.missing_partition(topic, partition, meta)
        return meta

    def partitions_for(self, topic: str) -> list[int]:
        return list(range(self._topic_metadata(topic).partition_count))

    # -- flush / close ---------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and wait until all of it is acknowledged or failed.

        Failures are reported through the records' futures and callbacks, not raised here;
        DMQTimeoutError if `timeout` seconds pass first.
        """
        if threading.current_thread() is self._sender.thread:
            raise IllegalStateError("flush() called from a producer callback would wait for itself")
        pending = self._core.flush_batches()
        if not pending:
            return
        _, not_done = concurrent.futures.wait(pending, timeout)
        if not_done:
            raise DMQTimeoutError(f"flush: {len(not_done)} batches still unacknowledged after {timeout} s")

    def close(self, timeout: float | None = None) -> None:
        """Flush (waiting up to `timeout` s; None = until every batch is acknowledged or has
        failed, each within delivery_timeout_ms), stop the sender thread, close the channels.
        Records still unacknowledged when the time is up fail with ClientClosedError."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        pending = self._core.close_batches()
        if threading.current_thread() is not self._sender.thread:
            started = time.monotonic()
            if pending:
                concurrent.futures.wait(pending, timeout)
            deadline = self._core.drain_deadline(timeout, started)  # acks=0: calls still in flight
            while self._acc.unreleased() and time.monotonic() < deadline:
                time.sleep(IN_FLIGHT_POLL_S)
        stopped = self._sender.stop(SENDER_STOP_TIMEOUT_S)
        if not stopped and self._own_cluster:
            self._cluster.close()  # cancels a blocking call the sender is in
            stopped = self._sender.stop(SENDER_STOP_TIMEOUT_S)
        failed = self._sender.fail_all(
            ClientClosedError(f"the producer was closed (timeout={timeout}) before these records were acknowledged")
        )
        if failed:
            log.warning("producer closed with unacknowledged records", client_id=self.client_id, records=failed)
        if not stopped:
            log.error("producer sender thread did not stop", client_id=self.client_id)
        if self._own_cluster:
            self._cluster.close()
        log.debug("producer closed", client_id=self.client_id)

    def _check_open(self) -> None:
        if self._acc.closed:
            self._core.check_open(self._sender.error)

    @property
    def cluster(self) -> Cluster:
        return self._cluster

    def _serialize(self, topic: str, key: Any, value: Any) -> tuple[Any, Any]:
        ks, vs = self._key_serializer, self._value_serializer
        try:
            if ks is not None and key is not None:
                key = ks(key)
        except Exception as e:
            raise SerializationError(f"key_serializer failed for a record to {topic!r}: {e!r}") from e
        try:
            if vs is not None:
                value = vs(value)
        except Exception as e:
            raise SerializationError(f"value_serializer failed for a record to {topic!r}: {e!r}") from e
        return key, value

    def metrics(self) -> dict[str, float]:
        """Kafka's producer metrics in snake_case (README "Metrics"): record_send_rate / _total,
        bytes_send_rate / _total (acknowledged batches), request_rate, request_total,
        request_error_total, request_latency_avg_ms / _max_ms (rates and latencies over the last
        30 s); and gauges: records_failed counts every record that failed for good (not only those
        whose handle or callback someone looked at), open / incomplete batches, buffer bytes free,
        producing threads."""
        return self._core.metrics(self._sender.stats)


_SETTINGS = frozenset(
    name for name in inspect.signature(Producer.__init__).parameters if name not in ("self", "unknown")
)
