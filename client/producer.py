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

Batching: a partition's batch ships when it is full or ``linger_ms`` old
and nothing is in flight for that partition; while a Produce is in flight the next batch keeps
filling. At most one Produce per partition is in flight, so records keep their order, even
across retries; different partitions are sent concurrently. See `dmq.client._accumulator` for
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
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import accumulate, repeat
from operator import add
from threading import get_ident
from typing import Any

from dmq.client._accumulator import (
    HEADER_OFFSET_BYTES,
    MEMORY_CHUNK_BYTES,
    RECORD_OVERHEAD_BYTES,
    Accumulator,
    BufferPool,
    Callback,
    ProducerBatch,
    RecordFuture,
    SendManyFuture,
    ThreadState,
    accounted_cap,
    encoded_size_bound,
)
from dmq.client._calls import retry_call
from dmq.client._cluster import Cluster, TopicMetadata
from dmq.client._log import get_logger
from dmq.client._partitioner import Partitioner, StickyChooser, crc32_partition
from dmq.client._security import pop_security
from dmq.client._sender import Sender, new_producer_id
from dmq.client._settings import bootstrap_address, reject_unknown
from dmq.client.errors import (
    ClientClosedError,
    DMQError,
    DMQTimeoutError,
    IllegalStateError,
    InvalidConfigError,
    RecordTooLargeError,
    SerializationError,
    UnknownPartitionError,
)
from dmq.client.tracing import OTEL_EXTRA_HINT
from dmq.proto import dmq_pb2 as pb
from dmq.proto import limits, records
from dmq.proto.tracecontext import TraceContext, check_traceparent

log = get_logger(__name__)

__all__ = ["Producer", "RecordFuture", "SendManyFuture"]

DEFAULT_BATCH_SIZE = 1024 * 1024
# The largest batch_size accepted (half the brokers' default max batch bytes, the bound it always
# had); batches are further capped per topic by its max_message_bytes (see _caps_for).
MAX_BATCH_SIZE = records.DEFAULT_MAX_BATCH_BYTES // 2
DEFAULT_BUFFER_MEMORY = 64 * 1024 * 1024
SENDER_STOP_TIMEOUT_S = 5.0
IN_FLIGHT_POLL_S = 0.005  # close() looks this often whether the calls in flight have ended
# The shortest metadata look-up timeout (max_block_ms=0 still allows one quick look-up).
METADATA_TIMEOUT_MIN_MS = 100

_ACKS = {"all": pb.ACKS_ALL, -1: pb.ACKS_ALL, "-1": pb.ACKS_ALL, 1: pb.ACKS_LEADER, "1": pb.ACKS_LEADER,
         0: pb.ACKS_NONE, "0": pb.ACKS_NONE}
_CODECS = {None: records.Codec.NONE, "none": records.Codec.NONE, "zstd": records.Codec.ZSTD, "lz4": records.Codec.LZ4}

Headers = Iterable[tuple[str, bytes | None]] | Mapping[str, bytes | None]
Serializer = Callable[[Any], bytes]
_BYTES_ONLY = {bytes}


def check_settings(
    *, acks: Any, compression: Any, enable_idempotence: Any, linger_ms: Any, batch_size: Any, buffer_memory: Any,
    max_block_ms: Any, retries: Any, retry_backoff_ms: Any, retry_backoff_max_ms: Any, request_timeout_ms: Any,
    delivery_timeout_ms: Any, max_record_bytes: Any,
) -> bool:
    """The producer settings' rules, shared by Producer and AsyncProducer: InvalidConfigError
    naming the setting; returns whether the producer is idempotent (None: unless acks=0)."""
    if acks not in _ACKS:
        raise InvalidConfigError(f"acks must be 'all', 1 or 0, got {acks!r}")
    codec_name = compression.lower() if isinstance(compression, str) else compression
    if codec_name not in _CODECS:
        raise InvalidConfigError(f"compression must be None, 'zstd' or 'lz4', got {compression!r}")
    _positive("batch_size", batch_size, MAX_BATCH_SIZE, "the brokers' default max batch bytes is "
              f"{records.DEFAULT_MAX_BATCH_BYTES}; a topic's max_message_bytes caps its batches further")
    _positive("buffer_memory", buffer_memory)
    if max_record_bytes is not None:  # None: the topic's max_message_bytes is the only bound
        _positive("max_record_bytes", max_record_bytes, limits.MAX_MESSAGE_BYTES_MAX,
                  "the largest max_message_bytes a topic may have")
    _positive("request_timeout_ms", request_timeout_ms)
    _positive("delivery_timeout_ms", delivery_timeout_ms)
    for name, value in (("linger_ms", linger_ms), ("max_block_ms", max_block_ms), ("retries", retries),
                        ("retry_backoff_ms", retry_backoff_ms), ("retry_backoff_max_ms", retry_backoff_max_ms)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidConfigError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if linger_ms < 0 or max_block_ms < 0 or retries < 0 or retry_backoff_ms < 0:
        raise InvalidConfigError("linger_ms, max_block_ms, retries and retry_backoff_ms must be >= 0")
    if delivery_timeout_ms < linger_ms + request_timeout_ms:
        # Kafka's rule: a batch may linger, then wait a whole request for its answer; a
        # shorter delivery timeout fails records that were never given a chance (a batch
        # lingering past it expired the moment it was sealed).
        raise InvalidConfigError(
            f"delivery_timeout_ms ({delivery_timeout_ms}) must be at least linger_ms + request_timeout_ms "
            f"({linger_ms} + {request_timeout_ms}): raise delivery_timeout_ms or lower the others"
        )
    if enable_idempotence is None:
        enable_idempotence = _ACKS[acks] != pb.ACKS_NONE
    elif enable_idempotence and _ACKS[acks] == pb.ACKS_NONE:
        raise InvalidConfigError(
            "enable_idempotence needs acks 'all' or 1: with acks=0 no answer is read, so a lost batch "
            "cannot be retried in sequence and the broker would refuse every later one"
        )
    if buffer_memory < batch_size:
        raise InvalidConfigError(f"buffer_memory ({buffer_memory}) must be at least batch_size ({batch_size})")

    return bool(enable_idempotence)


class Producer:
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
        if partitioner is not None and not callable(partitioner):
            raise InvalidConfigError(f"partitioner must be a callable (key, partition count) -> partition, got {partitioner!r}")
        if client_id is not None and (not isinstance(client_id, str) or not client_id):
            raise InvalidConfigError(f"client_id must be a non-empty string, got {client_id!r}")
        enable_idempotence = check_settings(
            acks=acks, compression=compression, enable_idempotence=enable_idempotence, linger_ms=linger_ms,
            batch_size=batch_size, buffer_memory=buffer_memory, max_block_ms=max_block_ms, retries=retries,
            retry_backoff_ms=retry_backoff_ms, retry_backoff_max_ms=retry_backoff_max_ms,
            request_timeout_ms=request_timeout_ms, delivery_timeout_ms=delivery_timeout_ms,
            max_record_bytes=max_record_bytes,
        )
        codec_name = compression.lower() if isinstance(compression, str) else compression

        self.client_id = client_id or f"producer-{id(self):x}"
        self._own_cluster = cluster is None
        # Metadata look-ups block send(): each one is bounded by max_block_ms as well (a coordinator
        # that accepts connections but does not answer held send() for a whole request timeout).
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
        self._cluster = cluster or Cluster(
            address, request_timeout_ms=min(request_timeout_ms, max(max_block_ms, METADATA_TIMEOUT_MIN_MS)), security=security
        )
        if self._own_cluster:
            # A wrong address fails here, naming it (kafka-python's NoBrokersAvailable), within
            # the Cluster's timeout (request_timeout_ms, or max_block_ms if shorter): not in
            # every send() after max_block_ms of metadata retries.
            try:
                self._cluster.check_reachable()
            except BaseException:
                self._cluster.close()
                raise
        self._batch_size = batch_size
        self._compressed = _CODECS[codec_name] is not records.Codec.NONE
        # topic max_message_bytes (None = the brokers' default) -> (batch cap, single-record cap)
        self._caps: dict[int | None, tuple[int, int]] = {}
        self._max_block_ms = max_block_ms
        self._max_record_bytes = max_record_bytes
        self._partitioner = partitioner or crc32_partition
        self._chooser = StickyChooser()
        self.producer_id = new_producer_id() if enable_idempotence else -1
        self.acks = acks
        wakeup = threading.Event()
        self._pool = BufferPool(buffer_memory, on_wait=wakeup.set)
        self._acc = Accumulator(batch_size, delivery_timeout_ms, wakeup, self._pool)
        # the fast path reads this dict directly
        self._threads: dict[int, ThreadState] = self._acc.threads
        self._sender = Sender(
            self._acc,
            self._cluster,
            acks=_ACKS[acks],
            codec=_CODECS[codec_name],
            linger_ms=linger_ms,
            request_timeout_ms=request_timeout_ms,
            retries=retries,
            retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=max(retry_backoff_ms, retry_backoff_max_ms),
            producer_id=self.producer_id,
            # None: send() already held each record within its topic's max_message_bytes
            max_record_bytes=max_record_bytes or limits.MAX_MESSAGE_BYTES_MAX,
            name=f"dmq-sender-{self.client_id}",
        )
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
        hdrs = _normalise_headers(headers) or []
        txn_key = None
        if transaction_id is not None:
            txn_key = records.check_record_id(transaction_id, "transaction_id").encode()
            hdrs.append((records.TXN_HEADER, txn_key))
        parent = _trace_parent(hdrs, trace_id, trace_context)
        span = None
        if self._otel is not None and parent is not _USER_HEADER:
            span, carrier = self._otel.start_send(topic, parent)
            hdrs += [(name, text.encode()) for name, text in carrier.items()]
            if records.TRACEPARENT_HEADER in carrier:
                parent = _USER_HEADER  # written: the span's own context
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
        are _normalise_headers' list already (checked once, not twice)."""
        acc = self._acc
        self._check_open()
        value = _as_bytes(value, "value")
        if key is not None:
            key = _as_bytes(key, "key")
        hdrs: list[tuple[str, bytes | None]] | None = headers if normalised else _normalise_headers(headers)  # type: ignore[assignment]
        if timestamp_ms is not None and (isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int) or timestamp_ms < 0):
            raise TypeError(f"timestamp_ms must be a non-negative int (ms since the epoch), got {timestamp_ms!r}")
        record_bytes = len(value) + (len(key) if key is not None else 0) + _headers_size(hdrs)
        if self._max_record_bytes is not None and record_bytes > self._max_record_bytes:
            raise RecordTooLargeError(
                f"record for {topic!r} is {record_bytes} bytes (key + value + headers), above "
                f"max_record_bytes {self._max_record_bytes}"
            )
        size = record_bytes + RECORD_OVERHEAD_BYTES
        meta = self._topic_metadata(topic)
        batch_cap, record_cap = self._caps_for(meta)
        if size + (HEADER_OFFSET_BYTES if hdrs else 0) > record_cap:
            raise self._too_large(topic, meta, record_bytes, size + (HEADER_OFFSET_BYTES if hdrs else 0))
        if partition is not None:
            meta = self._check_partition(topic, partition, meta)
        elif key is not None:
            partition = self._partitioner(key, meta.partition_count)
        elif txn_key is not None:
            partition = self._partitioner(txn_key, meta.partition_count)
        sticky = partition is None
        st = acc.thread_state(get_ident())
        credit = 0  # reserved buffer memory not yet given to a batch
        try:
            while True:
                need = 0
                with acc.lock:
                    self._check_open()
                    if sticky:
                        current = st.sticky.get(topic)
                        if current is not None and not current.sealed:
                            partition = current.partition
                        elif partition is None:
                            partition = self._chooser.next(topic, meta.available)
                    p: int = partition  # type: ignore[assignment]
                    b = st.batches.get((topic, p))
                    if (
                        b is not None
                        and not b.sealed
                        and b.values
                        and (
                            b.size + size + b.header_cost(hdrs is not None) > b.cap
                            or not b.accepts_timestamp(b.created_ms if timestamp_ms is None else timestamp_ms)
                        )
                    ):
                        acc.seal(b)  # full (or the timestamp is too far off): start the next batch
                        if sticky:
                            partition = None  # a sealed sticky batch moves the topic on
                            continue
                    if b is None or b.sealed:
                        cost = size + (HEADER_OFFSET_BYTES if hdrs else 0)
                        if credit >= cost:
                            # a record above batch_cap (but within record_cap) goes alone
                            b = acc.new_batch(st, topic, p, credit, max(batch_cap, cost))
                            credit = 0
                        else:
                            need = max(min(MEMORY_CHUNK_BYTES, batch_cap), cost) - credit
                    else:
                        cost = size + b.header_cost(hdrs is not None)
                        if b.size + cost > b.reserved:
                            if credit >= b.size + cost - b.reserved:
                                acc.grow(b, credit)
                                credit = 0
                            else:
                                room = max(cost, min(MEMORY_CHUNK_BYTES, b.cap - b.size))
                                need = room - (b.reserved - b.size) - credit
                    if not need:
                        assert b is not None
                        index = b.append_full(value, key, hdrs, timestamp_ms, cost)
                        if sticky:
                            st.sticky[topic] = b
                        if b.size >= b.cap:
                            acc.seal(b)
                        break
                self._pool.reserve(need, self._max_block_ms)  # outside the lock: may block
                credit += need
        finally:
            if credit:
                self._pool.release(credit)
        handle = RecordFuture(b, index)
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
            values = [_as_bytes(v, "values[]") for v in values]
        sizes = list(map(len, values))
        if keys is not None:
            keys = keys if isinstance(keys, list) else list(keys)
            if len(keys) != n:
                raise ValueError(f"send_many: {len(keys)} keys for {n} values")
            if any(k is not None and type(k) is not bytes for k in keys):
                keys = [None if k is None else _as_bytes(k, "keys[]") for k in keys]
            sizes = [s + (0 if k is None else len(k)) for s, k in zip(sizes, keys)]
        biggest = max(sizes)
        if self._max_record_bytes is not None and biggest > self._max_record_bytes:
            i = sizes.index(biggest)
            raise RecordTooLargeError(
                f"send_many: record {i} is {biggest} bytes, above max_record_bytes {self._max_record_bytes}"
            )
        meta = self._topic_metadata(topic)
        _, record_cap = self._caps_for(meta)
        if biggest + RECORD_OVERHEAD_BYTES > record_cap:
            i = sizes.index(biggest)
            raise self._too_large(topic, meta, biggest, biggest + RECORD_OVERHEAD_BYTES, f"send_many: record {i}: ")
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
                current = st.sticky.get(topic)
                sticky = (
                    current.partition
                    if current is not None and not current.sealed
                    else self._chooser.next(topic, meta.available)
                )
            groups: dict[int, list[int]] = {}
            part = self._partitioner
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
        acc = self._acc
        batch_cap, _ = self._caps_for(meta)
        cum = [0, *accumulate(map(add, sizes, repeat(RECORD_OVERHEAD_BYTES)))]
        n = len(values)
        i = 0
        credit = 0
        try:
            while i < n:
                need = 0
                with acc.lock:
                    self._check_open()
                    if partition is None:
                        current = st.sticky.get(topic)
                        if current is not None and not current.sealed:
                            p = current.partition
                        else:
                            p = self._chooser.next(topic, meta.available)
                    else:
                        p = partition
                    b = st.batches.get((topic, p))
                    if b is not None and not b.sealed and b.values and (
                        b.headers is not None or not b.accepts_timestamp(b.created_ms)
                    ):
                        # Holds an explicit timestamp too far from now for int32 deltas, or
                        # headers (whose offsets would make each record cost more than counted).
                        acc.seal(b)
                        continue
                    if b is not None and b.sealed:
                        b = None
                    cap = b.cap if b is not None else batch_cap
                    room = cap - (b.size if b is not None else 0)
                    j = bisect_right(cum, cum[i] + room, i + 1) - 1  # records [i, j) fit
                    if j == i:
                        if b is not None and b.values:
                            acc.seal(b)  # full
                            continue
                        j = i + 1  # a single record larger than batch_size gets its own batch
                        cap = max(cap, cum[j] - cum[i])
                    chunk = cum[j] - cum[i]
                    free = (b.reserved - b.size) if b is not None else 0
                    if free + credit < chunk:
                        need = chunk - free - credit
                    else:
                        if b is None:
                            b = acc.new_batch(st, topic, p, credit, cap)
                        else:
                            acc.grow(b, credit)
                        credit = 0
                        if partition is None:
                            st.sticky[topic] = b
                        first = b.extend(
                            values[i:j] if (i or j < n) else values,
                            None if keys is None else keys[i:j],
                            chunk,
                        )
                        segments.append((b, first, j - i, None if positions is None else positions[i:j]))
                        if b.size >= b.cap or j < n:
                            acc.seal(b)
                        i = j
                if need:
                    self._pool.reserve(need, self._max_block_ms)
                    credit += need
        finally:
            if credit:
                self._pool.release(credit)

    # -- metadata --------------------------------------------------------------------------------

    def _topic_metadata(self, topic: str, *, fresh: bool = False) -> TopicMetadata:
        """Cached, even stale (Cluster.cached_metadata), unless `fresh`; else asked, retried until max_block_ms."""
        if not fresh and (cached := self._cluster.cached_metadata(topic)) is not None:
            return cached
        deadline = time.monotonic() + self._max_block_ms / 1000
        try:
            return retry_call(lambda: self._cluster.topic_metadata(topic), policy=self._sender.retry, deadline=deadline)
        except DMQError as e:
            if not e.retriable:
                raise
            raise DMQTimeoutError(f"metadata for topic {topic!r} not available within max_block_ms: {e}") from e

    def _check_partition(self, topic: str, partition: Any, meta: TopicMetadata) -> TopicMetadata:
        """`partition` must exist; the topic may have grown since we cached it, so ask once more."""
        if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
            raise UnknownPartitionError(f"partition must be an int >= 0, got {partition!r}")
        if partition >= meta.partition_count:
            self._cluster.invalidate(topic)
            meta = self._topic_metadata(topic, fresh=True)
            if partition >= meta.partition_count:
                raise UnknownPartitionError(
                    f"partition {partition} does not exist: topic {topic!r} has partitions "
                    f"0..{meta.partition_count - 1}"
                )
        return meta

    def _caps_for(self, meta: TopicMetadata) -> tuple[int, int]:
        """(batch cap, single-record cap) in accounted bytes for the topic: batches encode within
        min(batch_size, the topic's limit); a record alone within the topic's limit."""
        limit = meta.max_message_bytes
        caps = self._caps.get(limit)
        if caps is None:
            topic_limit = limit if limit is not None else records.DEFAULT_MAX_BATCH_BYTES
            caps = (
                accounted_cap(min(self._batch_size, topic_limit), self._compressed),
                accounted_cap(topic_limit, self._compressed),
            )
            self._caps[limit] = caps
        return caps

    def _too_large(
        self, topic: str, meta: TopicMetadata, record_bytes: int, accounted: int, prefix: str = ""
    ) -> RecordTooLargeError:
        limit = meta.max_message_bytes
        named = (
            f"topic {topic!r}'s max_message_bytes {limit}"
            if limit is not None
            else f"the brokers' max batch bytes {records.DEFAULT_MAX_BATCH_BYTES}"
        )
        return RecordTooLargeError(
            f"{prefix}record for {topic!r} is {record_bytes} bytes (key + value + headers); as a batch it "
            f"may take up to {encoded_size_bound(accounted, self._compressed)} bytes, above {named}: "
            "send a smaller record or raise the topic's max_message_bytes"
        )

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
        acc = self._acc
        with acc.lock:
            acc.seal_all()
            pending = [b.future for b in acc.incomplete]
        acc.wakeup.set()
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
        acc = self._acc
        with acc.lock:
            acc.closed = True
            acc.seal_all()
            pending = [b.future for b in acc.incomplete]
        acc.wakeup.set()
        if threading.current_thread() is not self._sender.thread:
            started = time.monotonic()
            if pending:
                concurrent.futures.wait(pending, timeout)
            # acks=0: the handles resolved when the calls were sent; closing the channels now would
            # cancel calls still in flight before the broker has them (Kafka's close also lets the
            # requests it sent complete). Bounded by the timeout, or one request timeout.
            limit_s = self._sender.request_timeout_s if timeout is None else timeout - (time.monotonic() - started)
            deadline = time.monotonic() + limit_s
            while acc.unreleased() and time.monotonic() < deadline:
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
            if self._sender.error is not None:
                raise IllegalStateError(f"the producer's sender thread crashed: {self._sender.error!r}")
            raise ClientClosedError("send() after close(): create a new Producer")

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        whose handle or callback someone looked at), open / incomplete batches, buffer bytes free."""
        return {
            **self._sender.stats.snapshot("send"),
            "records_failed": self._acc.records_failed,
            "open_batches": len(self._acc.open),
            "incomplete_batches": len(self._acc.incomplete),
            "buffer_available_bytes": self._pool.available,
            "threads": len(self._acc.threads),
        }


def _positive(name: str, value: int, maximum: int | None = None, why: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidConfigError(f"{name} must be a positive integer, got {value!r}")
    if maximum is not None and value > maximum:
        raise InvalidConfigError(f"{name} must be at most {maximum}, got {value}" + (f" ({why})" if why else ""))


def _as_bytes(value: Any, what: str) -> bytes:
    if type(value) is bytes:
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, bytes):  # a bytes subclass
        return bytes(value)
    raise TypeError(
        f"{what} must be bytes, got {type(value).__name__}: serialise it first "
        "(e.g. json.dumps(obj).encode() or text.encode()), or give the Producer a key_serializer / "
        "value_serializer (dmq.client.json_serializer, dmq.client.str_serializer)"
    )


def _normalise_headers(headers: Headers | None) -> list[tuple[str, bytes | None]] | None:
    if headers is None:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for item in items:
        try:
            k, v = item
        except (TypeError, ValueError):
            raise TypeError(f"headers must be (str, bytes | None) pairs, got {item!r}") from None
        if not isinstance(k, str):
            raise TypeError(f"header key must be str, got {type(k).__name__}")
        v = None if v is None else _as_bytes(v, f"header {k!r} value")
        if k in _RESERVED_HEADERS:
            # the broker refuses a whole batch with a bad id: refuse the one record here instead
            records.check_record_id(b"" if v is None else v, f"header {k!r}")
        elif k == records.TRACEPARENT_HEADER:
            # a receiver would ignore it (W3C): refuse it here, where the mistake is made
            check_traceparent(v, f"header {k!r}")
        out.append((k, v))
    return out or None


_RESERVED_HEADERS = frozenset((records.TXN_HEADER, records.TRACE_HEADER))
_USER_HEADER = object()  # _trace_parent: the headers given carry a traceparent already


def _trace_parent(
    headers: list[tuple[str, bytes | None]], trace_id: str | None, trace_context: TraceContext | str | None
) -> TraceContext | object | None:
    """What send()'s trace arguments ask for: the context to continue or start (a TraceContext),
    _USER_HEADER when the headers given hold a traceparent (sent as it is), or None."""
    if trace_id is not None and trace_context is not None:
        raise ValueError("give trace_id or trace_context, not both (a context holds its trace id)")
    if any(name == records.TRACEPARENT_HEADER for name, _ in headers):
        if trace_id is not None or trace_context is not None:
            raise ValueError(f"the headers hold a {records.TRACEPARENT_HEADER!r} already: leave out trace_id / trace_context")
        return _USER_HEADER
    if trace_context is not None:
        if isinstance(trace_context, TraceContext):
            # re-checked: a TraceContext can be built by hand
            return check_traceparent(trace_context.traceparent, "trace_context")
        return check_traceparent(trace_context, "trace_context")
    if trace_id is not None:
        return TraceContext.new(trace_id)  # checked there, naming trace_id
    return None


def _headers_size(headers: list[tuple[str, bytes | None]] | None) -> int:
    if not headers:
        return 0
    # the codec's varints take at most 5 bytes each: count, key length, value length
    return 5 + sum(10 + len(k.encode()) + (len(v) if v is not None else 0) for k, v in headers)


_SETTINGS = frozenset(
    name for name in inspect.signature(Producer.__init__).parameters if name not in ("self", "unknown")
)
