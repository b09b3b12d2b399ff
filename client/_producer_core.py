"""The producer's core: one for Producer (a sender thread) and AsyncProducer (a sender task).

As client/consumer/_core.py is for the two consumers, this holds what the two producers decide
the same way, and does no I/O: it makes no call, starts no thread or task and never waits.

    settings     check_settings(): every rule, InvalidConfigError naming the setting; the
                 Sender's settings (sender_settings())
    records      prepare(): a record's value, key, headers and timestamp checked, and its
                 accounted size (bounded by max_record_bytes)
    batching     caps_for() / fit(): the batch and single-record caps a topic's limit gives;
                 append(): ONE decision under the accumulator lock: append the record to its
                 partition's open batch, seal a batch that is full, or say how many bytes of
                 buffer memory to reserve first
    placement    place(): an explicit partition, the key's hash, the transaction id's hash, or
                 sticky (sticky_partition(): the thread's open sticky batch, else the next in
                 the round robin)
    results      close_batches() / flush_batches(): seal what is open and list the batches to
                 wait for; drain_deadline(); check_open(); metrics()

What the shells keep is the waiting: for metadata (a blocking retry loop / an awaited refresh),
for buffer memory (BufferPool.reserve blocks / AsyncProducer._reserve awaits), for answers
(concurrent futures / asyncio), and starting and stopping their sender. Both drive append()
the same way (the sync shell blocks where the asyncio shell awaits):

    credit = 0                                   # buffer memory reserved, not given to a batch
    while True:
        with acc.lock:
            p = core.sticky_partition(...) if sticky else partition
            batch, n = core.append(st, topic, p, record, credit)
        if batch is not None: done (credit now belongs to the batch)
        elif n == 0: a full batch was sealed: look again (a sticky record moves on)
        else: reserve n more bytes (outside the lock), credit += n, look again
    (on the way out, any credit left is released)
"""

from __future__ import annotations

import concurrent.futures
import time
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from typing import Any

from dmq.client._accumulator import (
    HEADER_OFFSET_BYTES,
    MEMORY_CHUNK_BYTES,
    RECORD_OVERHEAD_BYTES,
    Accumulator,
    BufferPool,
    ProducerBatch,
    ThreadState,
    accounted_cap,
    encoded_size_bound,
)
from dmq.client._cluster import TopicMetadata
from dmq.client._metrics import ClientStats
from dmq.client._partitioner import Partitioner, StickyChooser, crc32_partition
from dmq.client._sender import new_producer_id
from dmq.client.errors import (
    ClientClosedError,
    IllegalStateError,
    InvalidConfigError,
    RecordTooLargeError,
    UnknownPartitionError,
)
from dmq.proto import dmq_pb2 as pb
from dmq.proto import limits, records
from dmq.proto.tracecontext import TraceContext, check_traceparent

__all__ = ["ProducerCore", "Pending", "check_settings", "Headers"]

DEFAULT_BATCH_SIZE = 1024 * 1024
# The largest batch_size accepted (half the brokers' default max batch bytes, the bound it always
# had); batches are further capped per topic by its max_message_bytes (see caps_for).
MAX_BATCH_SIZE = records.DEFAULT_MAX_BATCH_BYTES // 2
DEFAULT_BUFFER_MEMORY = 64 * 1024 * 1024
SENDER_STOP_TIMEOUT_S = 5.0
# max_in_flight_requests_per_connection's bound and idempotent default (Kafka's): the brokers keep
# the last 5 batches of each producer for de-duplication (dmq.broker.log.producer_state), so a
# retry of any batch in flight is still recognised.
MAX_IN_FLIGHT = 5
IN_FLIGHT_POLL_S = 0.005  # close() looks this often whether the calls in flight have ended
# The shortest metadata look-up timeout (max_block_ms=0 still allows one quick look-up).
METADATA_TIMEOUT_MIN_MS = 100

ACKS = {"all": pb.ACKS_ALL, -1: pb.ACKS_ALL, "-1": pb.ACKS_ALL, 1: pb.ACKS_LEADER, "1": pb.ACKS_LEADER,
        0: pb.ACKS_NONE, "0": pb.ACKS_NONE}
CODECS = {None: records.Codec.NONE, "none": records.Codec.NONE, "zstd": records.Codec.ZSTD, "lz4": records.Codec.LZ4}

Headers = Iterable[tuple[str, bytes | None]] | Mapping[str, bytes | None]
HeaderList = list[tuple[str, bytes | None]]


def check_settings(
    *, acks: Any, compression: Any, enable_idempotence: Any, linger_ms: Any, batch_size: Any, buffer_memory: Any,
    max_block_ms: Any, retries: Any, retry_backoff_ms: Any, retry_backoff_max_ms: Any, request_timeout_ms: Any,
    delivery_timeout_ms: Any, max_record_bytes: Any, max_in_flight_requests_per_connection: Any = None,
) -> tuple[bool, int]:
    """The producer settings' rules: InvalidConfigError naming the setting; returns whether the
    producer is idempotent (None: unless acks=0) and its max_in_flight_requests_per_connection
    (None: 5 when idempotent, else 1)."""
    if acks not in ACKS:
        raise InvalidConfigError(f"acks must be 'all', 1 or 0, got {acks!r}")
    if _codec_name(compression) not in CODECS:
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
        enable_idempotence = ACKS[acks] != pb.ACKS_NONE
    elif enable_idempotence and ACKS[acks] == pb.ACKS_NONE:
        raise InvalidConfigError(
            "enable_idempotence needs acks 'all' or 1: with acks=0 no answer is read, so a lost batch "
            "cannot be retried in sequence and the broker would refuse every later one"
        )
    if buffer_memory < batch_size:
        raise InvalidConfigError(f"buffer_memory ({buffer_memory}) must be at least batch_size ({batch_size})")
    in_flight = max_in_flight_requests_per_connection
    if in_flight is None:
        # Kafka's default with idempotence; without it a retried batch could overtake the next
        # (Kafka's documented caveat), so one at a time unless the user asks for more.
        in_flight = MAX_IN_FLIGHT if enable_idempotence else 1
    elif isinstance(in_flight, bool) or not isinstance(in_flight, int) or not 1 <= in_flight <= MAX_IN_FLIGHT:
        raise InvalidConfigError(
            f"max_in_flight_requests_per_connection must be an integer within 1..{MAX_IN_FLIGHT} (Produce "
            f"requests per partition awaiting an answer; the brokers de-duplicate the last {MAX_IN_FLIGHT} "
            f"batches of a producer), got {in_flight!r}"
        )
    return bool(enable_idempotence), in_flight


class Pending:
    """A record checked by prepare(), not yet in a batch. ``size``: its accounted bytes in a
    batch; ``alone``: what it accounts for as the first record of a batch (with headers, the
    header-offsets entry too)."""

    __slots__ = ("value", "key", "headers", "timestamp_ms", "record_bytes", "size", "alone")

    def __init__(self, value: bytes, key: bytes | None, headers: HeaderList | None, timestamp_ms: int | None,
                 record_bytes: int) -> None:
        self.value = value
        self.key = key
        self.headers = headers
        self.timestamp_ms = timestamp_ms
        self.record_bytes = record_bytes
        self.size = record_bytes + RECORD_OVERHEAD_BYTES
        self.alone = self.size + (HEADER_OFFSET_BYTES if headers else 0)


class ProducerCore:
    """The settings, accumulator and decisions of one producer (see the module comment).
    `shell` names the owner in messages ("Producer" / "AsyncProducer"); `runner` is what its
    sender runs as ("thread" / "task") and `closer` how it is closed ("close()" / "stop()")."""

    def __init__(
        self, *, acks: Any, linger_ms: float, batch_size: int, compression: str | None,
        enable_idempotence: bool | None, buffer_memory: int, max_block_ms: int, retries: int,
        retry_backoff_ms: int, retry_backoff_max_ms: int, request_timeout_ms: int, delivery_timeout_ms: int,
        max_record_bytes: int | None, partitioner: Partitioner | None, client_id: str | None, wakeup: Any,
        shell: str, runner: str, closer: str, max_in_flight_requests_per_connection: int | None = None,
    ) -> None:
        if partitioner is not None and not callable(partitioner):
            raise InvalidConfigError(f"partitioner must be a callable (key, partition count) -> partition, got {partitioner!r}")
        if client_id is not None and (not isinstance(client_id, str) or not client_id):
            raise InvalidConfigError(f"client_id must be a non-empty string, got {client_id!r}")
        idempotent, in_flight = check_settings(
            acks=acks, compression=compression, enable_idempotence=enable_idempotence, linger_ms=linger_ms,
            batch_size=batch_size, buffer_memory=buffer_memory, max_block_ms=max_block_ms, retries=retries,
            retry_backoff_ms=retry_backoff_ms, retry_backoff_max_ms=retry_backoff_max_ms,
            request_timeout_ms=request_timeout_ms, delivery_timeout_ms=delivery_timeout_ms,
            max_record_bytes=max_record_bytes,
            max_in_flight_requests_per_connection=max_in_flight_requests_per_connection,
        )
        self.max_in_flight = in_flight
        self.shell, self.runner, self.closer = shell, runner, closer
        self.acks = acks
        self.producer_id = new_producer_id() if idempotent else -1
        self.codec = CODECS[_codec_name(compression)]
        self.compressed = self.codec is not records.Codec.NONE
        self.batch_size = batch_size
        self.max_block_ms = max_block_ms
        self.max_record_bytes = max_record_bytes
        self.partitioner: Partitioner = partitioner or crc32_partition
        self.chooser = StickyChooser()
        self._sender_settings: dict[str, Any] = dict(
            acks=ACKS[acks], codec=self.codec, linger_ms=linger_ms, request_timeout_ms=request_timeout_ms,
            retries=retries, retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=max(retry_backoff_ms, retry_backoff_max_ms), producer_id=self.producer_id,
            # None: prepare() already held each record within its topic's max_message_bytes
            max_record_bytes=max_record_bytes or limits.MAX_MESSAGE_BYTES_MAX,
            max_in_flight=in_flight,
        )
        # Metadata look-ups are bounded by max_block_ms as well (a coordinator that accepts
        # connections but does not answer held send() for a whole request timeout).
        self.metadata_timeout_ms = min(request_timeout_ms, max(max_block_ms, METADATA_TIMEOUT_MIN_MS))
        self.request_timeout_s = request_timeout_ms / 1000
        self.pool = BufferPool(buffer_memory, on_wait=wakeup.set)
        self.acc = Accumulator(batch_size, delivery_timeout_ms, wakeup, self.pool)
        # topic max_message_bytes (None = the brokers' default) -> (batch cap, single-record cap)
        self._caps: dict[int | None, tuple[int, int]] = {}

    def __repr__(self) -> str:
        return (f"<ProducerCore {self.shell} producer_id={self.producer_id} acks={self.acks!r} "
                f"incomplete={len(self.acc.incomplete)} buffer_free={self.pool.available}>")

    def sender_settings(self, client_id: str) -> dict[str, Any]:
        """The Sender's keyword arguments (its thread or task named after the client)."""
        return {**self._sender_settings, "name": f"dmq-sender-{client_id}"}

    # -- records -----------------------------------------------------------------------------------

    def prepare(self, topic: str, value: Any, key: Any, headers: Headers | HeaderList | None,
                timestamp_ms: int | None, *, normalised: bool = False) -> Pending:
        """Check a record for send(); `normalised`: `headers` is normalise_headers' list already."""
        value = as_bytes(value, "value")
        if key is not None:
            key = as_bytes(key, "key")
        hdrs: HeaderList | None = headers if normalised else normalise_headers(headers)  # type: ignore[assignment]
        if timestamp_ms is not None and (isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int) or timestamp_ms < 0):
            raise TypeError(f"timestamp_ms must be a non-negative int (ms since the epoch), got {timestamp_ms!r}")
        record_bytes = len(value) + (len(key) if key is not None else 0) + headers_size(hdrs)
        if self.max_record_bytes is not None and record_bytes > self.max_record_bytes:
            raise RecordTooLargeError(
                f"record for {topic!r} is {record_bytes} bytes (key + value + headers), above "
                f"max_record_bytes {self.max_record_bytes}"
            )
        return Pending(value, key, hdrs, timestamp_ms, record_bytes)

    def caps_for(self, meta: TopicMetadata) -> tuple[int, int]:
        """(batch cap, single-record cap) in accounted bytes for the topic: batches encode within
        min(batch_size, the topic's limit); a record alone within the topic's limit."""
        limit = meta.max_message_bytes
        caps = self._caps.get(limit)
        if caps is None:
            topic_limit = limit if limit is not None else records.DEFAULT_MAX_BATCH_BYTES
            caps = self._caps[limit] = (accounted_cap(min(self.batch_size, topic_limit), self.compressed),
                                        accounted_cap(topic_limit, self.compressed))
        return caps

    def fit(self, topic: str, meta: TopicMetadata, record: Pending) -> int:
        """The topic's batch cap; RecordTooLargeError when the record cannot go even alone."""
        batch_cap, record_cap = self.caps_for(meta)
        if record.alone > record_cap:
            raise self.too_large(topic, meta, record.record_bytes, record.alone)
        return batch_cap

    def too_large(
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
            f"may take up to {encoded_size_bound(accounted, self.compressed)} bytes, above {named}: "
            "send a smaller record or raise the topic's max_message_bytes"
        )

    # -- placement ---------------------------------------------------------------------------------

    @staticmethod
    def partition_in(partition: Any, meta: TopicMetadata) -> bool:
        """Whether `partition` exists in `meta` (it may exist in fresher metadata: the shell asks
        again before missing_partition()); UnknownPartitionError if it is no partition number."""
        if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
            raise UnknownPartitionError(f"partition must be an int >= 0, got {partition!r}")
        return partition < meta.partition_count

    @staticmethod
    def missing_partition(topic: str, partition: int, meta: TopicMetadata) -> UnknownPartitionError:
        return UnknownPartitionError(
            f"partition {partition} does not exist: topic {topic!r} has partitions 0..{meta.partition_count - 1}"
        )

    def place(self, meta: TopicMetadata, partition: int | None, key: bytes | None,
              txn_key: bytes | None = None) -> int | None:
        """The record's partition (`partition` checked by the shell already), or None: sticky."""
        if partition is not None:
            return partition
        if key is not None:
            return self.partitioner(key, meta.partition_count)
        if txn_key is not None:
            return self.partitioner(txn_key, meta.partition_count)
        return None

    def sticky_partition(self, st: ThreadState, topic: str, meta: TopicMetadata, partition: int | None) -> int:
        """A keyless record's partition: that of the thread's open sticky batch; else
        `partition` (chosen in an earlier look, before waiting for memory); else the next in the
        round robin. Lock held."""
        current = st.sticky.get(topic)
        if current is not None and not current.sealed:
            return current.partition
        if partition is None:
            return self.chooser.next(topic, meta.available)
        return partition

    # -- batching ----------------------------------------------------------------------------------

    def append(self, st: ThreadState, topic: str, partition: int, sticky: bool, record: Pending,
               batch_cap: int, credit: int) -> tuple[ProducerBatch | None, int]:
        """One look at the partition's batch, under the accumulator lock. `credit`: buffer
        memory the caller reserved since its last look. Three answers:

          (batch, index)  appended; the credit now belongs to the batch
          (None, n > 0)   n more bytes of buffer memory are needed: reserve them outside the
                          lock, then look again with them added to the credit
          (None, 0)       the batch was full (or the record's timestamp too far from its first)
                          and is sealed now: look again (a sticky record moves on)
        """
        acc = self.acc
        has_headers = record.headers is not None
        b = st.batches.get((topic, partition))
        if b is not None and not b.sealed and b.values and (
            b.size + record.size + b.header_cost(has_headers) > b.cap
            or not b.accepts_timestamp(b.created_ms if record.timestamp_ms is None else record.timestamp_ms)
        ):
            acc.seal(b)
            return None, 0
        if b is None or b.sealed:
            cost = record.alone
            if credit < cost:
                return None, max(min(MEMORY_CHUNK_BYTES, batch_cap), cost) - credit
            # a record above batch_cap (but within the record cap) goes alone
            b = acc.new_batch(st, topic, partition, credit, max(batch_cap, cost))
        else:
            cost = record.size + b.header_cost(has_headers)
            shortage = b.size + cost - b.reserved
            if shortage > credit:
                return None, max(cost, min(MEMORY_CHUNK_BYTES, b.cap - b.size)) - (b.reserved - b.size) - credit
            if credit:
                acc.grow(b, credit)
        index = b.append_full(record.value, record.key, record.headers, record.timestamp_ms, cost)
        if sticky:
            st.sticky[topic] = b
        if b.size >= b.cap:
            acc.seal(b)
        return b, index

    def extend(
        self, st: ThreadState, topic: str, partition: int, sticky: bool, values: list[bytes],
        keys: list[bytes | None] | None, cum: list[int], positions: list[int] | None, i: int, batch_cap: int,
        credit: int, segments: list[tuple[ProducerBatch, int, int, list[int] | None]],
    ) -> tuple[int, int]:
        """send_many's append(): one look under the lock at the partition's batch, for the run's
        records from `i` on (`cum`: their accounted sizes, cumulated from 0). Answers (j, need):
        j > i: records [i, j) appended as one segment, the credit given to their batch; else
        need > 0 bytes of buffer memory to reserve first, or need == 0: a batch was sealed
        (full, or holding headers or a far timestamp): look again."""
        acc = self.acc
        b = st.batches.get((topic, partition))
        if b is not None and not b.sealed and b.values and (
            b.headers is not None or not b.accepts_timestamp(b.created_ms)
        ):
            # Holds an explicit timestamp too far from now for int32 deltas, or headers (whose
            # offsets would make each record cost more than counted).
            acc.seal(b)
            return i, 0
        if b is not None and b.sealed:
            b = None
        cap = b.cap if b is not None else batch_cap
        room = cap - (b.size if b is not None else 0)
        j = bisect_right(cum, cum[i] + room, i + 1) - 1  # records [i, j) fit
        if j == i:
            if b is not None and b.values:
                acc.seal(b)  # full
                return i, 0
            j = i + 1  # a single record larger than batch_size gets its own batch
            cap = max(cap, cum[j] - cum[i])
        chunk = cum[j] - cum[i]
        free = (b.reserved - b.size) if b is not None else 0
        if free + credit < chunk:
            return i, chunk - free - credit
        if b is None:
            b = acc.new_batch(st, topic, partition, credit, cap)
        else:
            acc.grow(b, credit)
        if sticky:
            st.sticky[topic] = b
        n = len(values)
        first = b.extend(values[i:j] if (i or j < n) else values, None if keys is None else keys[i:j], chunk)
        segments.append((b, first, j - i, None if positions is None else positions[i:j]))
        if b.size >= b.cap or j < n:
            acc.seal(b)
        return j, 0

    # -- results -----------------------------------------------------------------------------------

    def flush_batches(self) -> list[concurrent.futures.Future[int]]:
        """Seal every open batch and wake the sender: the batches' futures to wait for."""
        return self._seal_all(closing=False)

    def close_batches(self) -> list[concurrent.futures.Future[int]]:
        """flush_batches(), and refuse every later send()."""
        return self._seal_all(closing=True)

    def _seal_all(self, *, closing: bool) -> list[concurrent.futures.Future[int]]:
        acc = self.acc
        with acc.lock:
            if closing:
                acc.closed = True
            acc.seal_all()
            pending = [b.future for b in acc.incomplete]
        acc.wakeup.set()
        return pending

    def drain_deadline(self, timeout: float | None, started: float) -> float:
        """When close() stops waiting for calls still in flight (monotonic): with acks=0 the
        handles resolved when the calls were sent, and closing the channels would cancel calls
        the broker has not read yet (Kafka's close also lets the requests it sent complete).
        Bounded by the close's timeout (counted from `started`), or one request timeout."""
        now = time.monotonic()
        return now + (self.request_timeout_s if timeout is None else timeout - (now - started))

    def check_open(self, sender_error: BaseException | None) -> None:
        if self.acc.closed:
            if sender_error is not None:
                raise IllegalStateError(f"the producer's sender {self.runner} crashed: {sender_error!r}")
            raise ClientClosedError(f"send() after {self.closer}: create a new {self.shell}")

    def metrics(self, stats: ClientStats) -> dict[str, float]:
        """Kafka's producer metrics in snake_case (README "Metrics"): the sender's request and
        transfer figures, and gauges: records_failed counts every record that failed for good,
        open / incomplete batches, buffer bytes free, producing threads."""
        acc = self.acc
        return {
            **stats.snapshot("send"),
            "records_failed": acc.records_failed,
            "open_batches": len(acc.open),
            "incomplete_batches": len(acc.incomplete),
            "buffer_available_bytes": self.pool.available,
            "threads": len(acc.threads),
        }


# -- record parts ------------------------------------------------------------------------------------

def _codec_name(compression: Any) -> Any:
    return compression.lower() if isinstance(compression, str) else compression


def _positive(name: str, value: int, maximum: int | None = None, why: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidConfigError(f"{name} must be a positive integer, got {value!r}")
    if maximum is not None and value > maximum:
        raise InvalidConfigError(f"{name} must be at most {maximum}, got {value}" + (f" ({why})" if why else ""))


def as_bytes(value: Any, what: str) -> bytes:
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


def normalise_headers(headers: Headers | None) -> HeaderList | None:
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
        v = None if v is None else as_bytes(v, f"header {k!r} value")
        if k in _RESERVED_HEADERS:
            # the broker refuses a whole batch with a bad id: refuse the one record here instead
            records.check_record_id(b"" if v is None else v, f"header {k!r}")
        elif k == records.TRACEPARENT_HEADER:
            # a receiver would ignore it (W3C): refuse it here, where the mistake is made
            check_traceparent(v, f"header {k!r}")
        out.append((k, v))
    return out or None


_RESERVED_HEADERS = frozenset((records.TXN_HEADER, records.TRACE_HEADER))
USER_HEADER = object()  # trace_parent: the headers given carry a traceparent already


def trace_parent(
    headers: HeaderList, trace_id: str | None, trace_context: TraceContext | str | None
) -> TraceContext | object | None:
    """What send()'s trace arguments ask for: the context to continue or start (a TraceContext),
    USER_HEADER when the headers given hold a traceparent (sent as it is), or None."""
    if trace_id is not None and trace_context is not None:
        raise ValueError("give trace_id or trace_context, not both (a context holds its trace id)")
    if any(name == records.TRACEPARENT_HEADER for name, _ in headers):
        if trace_id is not None or trace_context is not None:
            raise ValueError(f"the headers hold a {records.TRACEPARENT_HEADER!r} already: leave out trace_id / trace_context")
        return USER_HEADER
    if trace_context is not None:
        if isinstance(trace_context, TraceContext):
            # re-checked: a TraceContext can be built by hand
            return check_traceparent(trace_context.traceparent, "trace_context")
        return check_traceparent(trace_context, "trace_context")
    if trace_id is not None:
        return TraceContext.new(trace_id)  # checked there, naming trace_id
    return None


def headers_size(headers: HeaderList | None) -> int:
    if not headers:
        return 0
    # the codec's varints take at most 5 bytes each: count, key length, value length
    return 5 + sum(10 + len(k.encode()) + (len(v) if v is not None else 0) for k, v in headers)
