"""The producer's sender thread: seals lingering batches, encodes them, ships them, retries.

One thread per Producer, owned by it (`start()` in the constructor, `stop()` in close()). Each
turn of the loop (woken by new batches, responses, or the next linger/backoff deadline):

  1. handle finished Produce calls (gRPC calls our callback on its own thread; it only queues);
  2. seal open batches whose partition is idle and whose age reached linger_ms (at once when a
     send() is blocked on buffer_memory, so memory comes back);
  3. for each partition with nothing in flight, encode its next sealed batch (assigning its
     idempotent sequence) and send it to the partition's leader with `Produce.future`;
  4. fail batches older than delivery_timeout_ms that are still waiting.

Retries: an error whose class is `retriable` is retried with backoff until delivery_timeout_ms.
That includes a full disk on the broker (RESOURCE_EXHAUSTED with the disk-full reason in the
trailing metadata: `DiskFullError`) and its transient I/O errors (UNAVAILABLE,
`StorageUnavailableError`): the broker stored nothing of the batch, so the retry cannot
duplicate it. A batch too large (RESOURCE_EXHAUSTED without any reason) is not retried; as the
producer builds batches within the topic's max_message_bytes from its metadata, the refusal means
the broker's limit is lower than that metadata said, so the topic's metadata is refreshed for the
batches after it. A RESOURCE_EXHAUSTED with a reason this client does not know is a plain
ResourceExhaustedError, never "too large".

acks=0: nobody waits for the broker, so a batch's handle resolves once the batch is handed to
gRPC; a batch dropped after that (an error answer) is logged and counted in records_failed. A
batch not handed over yet (no leader known) is retried, or its handle fails, like any other.

Ordering: at most ONE Produce per partition is in flight, so batches land in seal order and a
retried batch never overtakes the next. Different partitions are in flight concurrently.

Idempotence: a batch's (producer_id, epoch, base_sequence) is fixed when it is first encoded and
reused by every retry, so a batch whose response was lost is answered by the broker as a
duplicate with its original offset. When a batch fails for good after being sent, the broker may
or may not have it, so the partition's epoch is bumped and the sequence restarts at 0 (the
broker accepts a higher epoch starting at 0). OUT_OF_ORDER_SEQUENCE (the broker lost our
sequence, e.g. after producer-state expiry) is handled the same way, then the batch is retried.
"""

from __future__ import annotations

import functools
import secrets
import threading
import time
from collections import deque
from typing import Any

import grpc

from dmq.client._accumulator import Accumulator, PartitionQueue, ProducerBatch
from dmq.client._calls import CALL_CANCELLED, RetryPolicy
from dmq.client._cluster import Cluster
from dmq.client._log import get_logger
from dmq.client._metrics import ClientStats
from dmq.client.errors import (
    ClientClosedError,
    DMQError,
    DMQTimeoutError,
    InvalidArgumentError,
    NotFoundError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
    TopicNotFoundError,
    UnknownPartitionError,
    UnknownServerError,
    from_rpc_error,
    rpc_error_reason,
)
from dmq.proto import dmq_pb2 as pb
from dmq.proto import records
from dmq.proto.wire import frame_produce_request

log = get_logger(__name__)

__all__ = ["Sender"]

IDLE_WAKE_S = 1.0  # an idle sender still wakes this often (expiry checks; no unbounded wait)
# While a partition backs off after its leader failed, the sender looks at the metadata this often
# (a background GetMetadata at most this often), to retry as soon as a new leader is elected.
LEADER_POLL_S = 0.1
INT32_MAX = 2**31 - 1
INT16_MAX = 2**15 - 1

_PRODUCE_ERRORS = {
    grpc.StatusCode.RESOURCE_EXHAUSTED: RecordTooLargeError,
    grpc.StatusCode.NOT_FOUND: UnknownPartitionError,
}
# An answer carrying a reason (dmq.proto.error_details) says what ran out; only a reason-less
# RESOURCE_EXHAUSTED is the broker's "batch too large".
_PRODUCE_ERRORS_WITH_REASON = {grpc.StatusCode.NOT_FOUND: UnknownPartitionError}


class Sender:
    def __init__(
        self,
        acc: Accumulator,
        cluster: Cluster,
        *,
        acks: int,
        codec: records.Codec,
        linger_ms: float,
        request_timeout_ms: int,
        retries: int,
        retry_backoff_ms: int,
        retry_backoff_max_ms: int,
        producer_id: int,
        max_record_bytes: int,
        name: str,
    ) -> None:
        self._acc = acc
        self._cluster = cluster
        self._acks = acks
        self._wait_for_ack = acks != pb.ACKS_NONE
        self._codec = codec
        self._linger_s = linger_ms / 1000
        self.request_timeout_s = request_timeout_ms / 1000
        self._retries = retries
        # The client's one retry rule (dmq.client._calls); the deadline is delivery_timeout_ms's.
        self.retry = RetryPolicy(retry_backoff_ms, retry_backoff_max_ms, request_timeout_ms)
        self._producer_id = producer_id  # -1: not idempotent
        self._max_record_bytes = max_record_bytes
        self._wakeup = acc.wakeup
        self._completions: deque[tuple[ProducerBatch, str, Any, float]] = deque()
        # Producer.metrics(): one recording per answered request (dmq.client._metrics)
        self.stats = ClientStats()
        self._active: set[PartitionQueue] = set()
        self._stopping = False
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __repr__(self) -> str:
        return (
            f"<Sender {self.thread.name} alive={self.thread.is_alive()} active={len(self._active)} "
            f"completions={len(self._completions)}>"
        )

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout_s: float) -> bool:
        """Ask the loop to end and wait up to timeout_s; True when the thread has ended."""
        self._stopping = True
        self._wakeup.set()
        if threading.current_thread() is self.thread:
            return False  # close() from a callback: the loop ends when the callback returns
        self.thread.join(timeout_s)
        return not self.thread.is_alive()

    def _run(self) -> None:
        timeout: float | None = 0.0
        try:
            while not self._stopping:
                self._wakeup.wait(timeout)
                timeout = self._turn()
        except BaseException as e:  # noqa: BLE001 - report, fail every pending record, end
            self._crashed(e, UnknownServerError(f"the producer's sender thread crashed: {e!r}"))

    def _turn(self) -> float | None:
        """After a wake-up (the thread's or the asyncio task's loop): one turn, unless stopping;
        how long the loop may wait for the next wake-up."""
        self._wakeup.clear()
        if self._stopping:
            return None
        return self._step(time.monotonic())

    def _crashed(self, e: BaseException, err: DMQError) -> None:
        """The loop raised: report it, refuse later sends, fail every pending record with `err`."""
        log.exception("producer sender crashed", name=self.thread.name)
        self.error = e
        with self._acc.lock:
            self._acc.closed = True
            self._acc.seal_all()
        self.fail_all(err)

    # -- one turn ----------------------------------------------------------------------------------

    def _step(self, now: float) -> float:
        acc = self._acc
        while self._completions:
            batch, address, call, sent = self._completions.popleft()
            self._on_response(batch, address, call, now, sent)
        next_at = now + IDLE_WAKE_S
        with acc.lock:
            if acc.open:
                rush = acc.pool.waiters > 0
                linger = self._linger_s
                for b in list(acc.open):
                    q = acc.queues.get((b.topic, b.partition))
                    if q is not None and not q.idle:
                        continue  # keeps filling; looked at again when the partition frees up
                    due = b.created + linger
                    if rush or due <= now:
                        acc.seal(b)
                    elif due < next_at:
                        next_at = due
            if acc.newly_ready:
                self._active |= acc.newly_ready
                acc.newly_ready.clear()
        for q in list(self._active):
            if q.inflight is not None:
                if q.ready and q.ready[0].payload is None:
                    # Encode the next batch while this one is in flight, so that when the answer
                    # comes the next Produce goes out at once (its sequence follows in order).
                    self._encode_or_fail(q, q.ready[0], pop=True)
                continue
            if not q.ready:
                self._active.discard(q)
                continue
            while q.ready and q.ready[0].deadline <= now:
                self._expire(q, q.ready.popleft())
            if not q.ready:
                continue
            if q.retry_at > now and q.failed_leader is not None:
                leader = self._cluster.peek_leader(q.topic, q.partition, max_age_s=LEADER_POLL_S)
                if leader and leader != q.failed_leader:
                    # A new leader is known: waiting out the backoff would only add latency.
                    log.info("new leader known; retrying without waiting out the backoff",
                             topic=q.topic, partition=q.partition, leader=leader)
                    q.retry_at, q.failed_leader, q.failures = 0.0, None, 0
                else:
                    next_at = min(next_at, now + LEADER_POLL_S)
            if q.retry_at > now:
                next_at = min(next_at, q.retry_at)
                continue
            self._dispatch(q, q.ready.popleft(), now)
        return max(0.0, next_at - time.monotonic())

    # -- sending -----------------------------------------------------------------------------------

    def _encode(self, q: PartitionQueue, b: ProducerBatch) -> None:
        n = b.count
        values = b.values if len(b.values) == n else b.values[:n]
        keys = None if b.keys is None else b.keys[:n]
        headers = None if b.headers is None else b.headers[:n]
        timestamps = None if b.timestamps is None else b.timestamps[:n]
        pid, epoch, seq = -1, -1, -1
        if self._producer_id >= 0:
            pid, epoch, seq = self._producer_id, q.epoch, q.next_sequence
        b.payload = records.encode(
            values,
            keys,
            headers,
            timestamps,
            timestamp_ms=b.created_ms,
            codec=self._codec,
            producer_id=pid,
            producer_epoch=epoch,
            base_sequence=seq,
            max_record_bytes=self._max_record_bytes,
        )
        if pid >= 0:
            b.epoch, b.base_sequence = epoch, seq
            # sequences wrap from 2**31-1 to 0, as the broker expects
            q.next_sequence = (seq + n) % (INT32_MAX + 1)

    def _encode_or_fail(self, q: PartitionQueue, b: ProducerBatch, pop: bool = False) -> bytes | None:
        """Encode `b` and return its payload; on a codec error fail it (popping it off the ready
        queue if asked) and return None."""
        where = f"{b.topic}[{b.partition}]"
        try:
            self._encode(q, b)
            return b.payload
        except records.RecordTooLargeError as e:
            err: DMQError = RecordTooLargeError(f"{where}: {e}: raise max_record_bytes or send smaller records")
        except records.RecordsError as e:
            err = InvalidArgumentError(f"{where}: cannot encode the batch: {e}")
        if pop:
            q.ready.remove(b)
        self._fail(q, b, err)
        return None

    def _dispatch(self, q: PartitionQueue, b: ProducerBatch, now: float) -> None:
        where = f"{b.topic}[{b.partition}]"
        payload = b.payload if b.payload is not None else self._encode_or_fail(q, b)
        if payload is None:
            return
        try:
            # A cached leader is used at once when the metadata is stale (a refresh is started
            # meanwhile): while no coordinator is active a refresh cannot succeed, and waiting for
            # one stopped every partition's produce until a coordinator was back (issue 28 item 5:
            # the data path does not need the control plane). A leader that moved answers
            # NOT_LEADER and the batch is retried, by then with the refreshed leader.
            address = self._cluster.leader_for(b.topic, b.partition, timeout_s=0.0, allow_stale=True)
            request = frame_produce_request(b.topic, b.partition, self._acks, payload)
            # A grpc future; on the AsyncCluster a task on the loop (both give add_done_callback
            # and result(), which raises the call's error or one of CALL_CANCELLED).
            call = self._cluster.start_unary(self._cluster.raw_produce(address), request, timeout=self.request_timeout_s)
        except DMQError as e:  # no leader known (metadata refresh failed)
            b.attempts += 1
            self._attempt_failed(q, b, e, now, address="")
            return
        except ValueError as e:  # "Cannot invoke RPC on closed channel!"
            self._fail(q, b, ClientClosedError(f"{where}: the producer was closed before the batch was sent ({e})"))
            return
        b.attempts += 1
        q.inflight = b
        if not self._wait_for_ack and not b.future.done():
            b.resolve(-1)  # acks=0: nobody waits for the broker
        call.add_done_callback(functools.partial(self._queue_response, b, address, time.monotonic()))

    def _queue_response(self, b: ProducerBatch, address: str, sent: float, call: Any) -> None:
        # On a gRPC thread: hand over to the sender, touch nothing else (the latency ends here).
        self._completions.append((b, address, call, time.monotonic() - sent))
        self._wakeup.set()

    def _on_response(self, b: ProducerBatch, address: str, call: Any, now: float, latency_s: float = 0.0) -> None:
        q = self._acc.queue(b.topic, b.partition)
        q.inflight = None
        try:
            response = call.result()
        except grpc.RpcError as e:
            self.stats.request(latency_s, ok=False)
            overrides = _PRODUCE_ERRORS if rpc_error_reason(e) is None else _PRODUCE_ERRORS_WITH_REASON
            err = from_rpc_error(e, context=f"Produce to {b.topic}[{b.partition}] at {address}", overrides=overrides)
            if isinstance(err, RecordTooLargeError):
                # Built within the topic's limit as the metadata gave it: the broker's is lower.
                # Later batches are built with fresh metadata; this one cannot be split any more.
                self._cluster.invalidate(b.topic)
                err.message += (
                    f" (this batch: {b.count} records, {len(b.payload or b'')} bytes, built within the limit the "
                    f"topic's metadata gave; the broker's limit is lower, so later batches use refreshed metadata. "
                    "Records this large need a higher max_message_bytes on the topic, or smaller records)"
                )
                err.args = (err.message,)
            self._attempt_failed(q, b, err, now, address=address)
        except CALL_CANCELLED:
            self._fail(q, b, ClientClosedError(f"{b.topic}[{b.partition}]: Produce cancelled: the producer is closing"))
        else:
            if response.record_offsets:
                # some records were duplicate transaction ids: each has its own (original) offset
                b.record_offsets = list(response.record_offsets)
            elif response.duplicate:
                log.info(
                    "batch acknowledged as a duplicate of an earlier attempt",
                    topic=b.topic,
                    partition=b.partition,
                    base_offset=response.base_offset,
                    attempts=b.attempts,
                )
            q.failed_leader, q.failures = None, 0
            self.stats.request(latency_s)
            self.stats.transferred(b.count, len(b.payload or b""))
            self._done(b, response.base_offset)
        self._active.add(q)

    def _attempt_failed(
        self, q: PartitionQueue, b: ProducerBatch, err: DMQError, now: float, address: str | None = None
    ) -> None:
        """Retry `b` (first in its partition, after a backoff) or fail it. `address`: the broker
        the attempt went to ("" when no leader was known)."""
        q.inflight = None
        q.failures += 1
        self._active.add(q)
        where = dict(topic=b.topic, partition=b.partition, attempt=b.attempts)
        if not self._wait_for_ack and b.future.done():
            # The handle said "sent" already; the metrics are the one place the loss shows. (A
            # batch never handed to gRPC goes on below: retried, or its handle fails.)
            log.warning("produce failed with acks=0; records dropped", error=str(err), records=b.count, **where)
            with self._acc.lock:
                self._acc.records_failed += b.count
            self._release(b)
            return
        if err.invalid_metadata:
            self._cluster.invalidate(b.topic)
            q.failed_leader = address
        if isinstance(err, OutOfOrderSequenceError) and b.attempts <= self._retries:
            log.warning("broker lost this producer's sequence; bumping the epoch", error=str(err), **where)
            self._bump_epoch(q)
            b.payload = None  # re-encoded with the new epoch, sequence 0
            q.ready.appendleft(b)
            return
        # NOT_FOUND from a broker: the partition may have moved; the metadata refresh before the
        # retry raises TopicNotFoundError if the topic itself is gone.
        retriable = err.retriable or (isinstance(err, NotFoundError) and not isinstance(err, TopicNotFoundError))
        backoff = self.retry.backoff_s(max(1, q.failures))
        if retriable and b.attempts <= self._retries and now + backoff < b.deadline:
            log.warning("produce failed; retrying", error=str(err), backoff_ms=round(backoff * 1000), **where)
            b.last_error = str(err)
            q.retry_at = now + backoff
            q.ready.appendleft(b)
            return
        if retriable and now + backoff >= b.deadline:
            err = DMQTimeoutError(
                f"{b.topic}[{b.partition}]: {b.count} records not acknowledged within delivery_timeout_ms "
                f"after {b.attempts} attempts; last error: {err}"
            )
        self._fail(q, b, err)

    def _expire(self, q: PartitionQueue, b: ProducerBatch) -> None:
        if b.last_error is not None:  # expired while backing off: say what the broker answered
            self._fail(q, b, DMQTimeoutError(
                f"{b.topic}[{b.partition}]: {b.count} records not acknowledged within delivery_timeout_ms "
                f"after {b.attempts} attempts; last error: {b.last_error}"
            ))
            return
        self._fail(
            q,
            b,
            DMQTimeoutError(
                f"{b.topic}[{b.partition}]: {b.count} records waited longer than delivery_timeout_ms "
                "without being sent (the leader is unreachable or the producer is overloaded)"
            ),
        )

    # -- outcomes ----------------------------------------------------------------------------------

    def _done(self, b: ProducerBatch, base_offset: int) -> None:
        b.resolve(base_offset)  # runs the records' callbacks, here
        self._release(b)

    def _fail(self, q: PartitionQueue, b: ProducerBatch, err: DMQError) -> None:
        q.failed_leader, q.failures = None, 0  # the next batch starts its backoff afresh
        log.error("produce failed", topic=b.topic, partition=b.partition, records=b.count, error=str(err))
        if b.base_sequence >= 0:
            # The broker may or may not hold it: continuing the sequence could leave a gap or a
            # duplicate; a new epoch starting at 0 is unambiguous.
            self._bump_epoch(q)
        b.reject(err)
        self._release(b)

    def _release(self, b: ProducerBatch) -> None:
        acc = self._acc
        with acc.lock:
            acc.incomplete.discard(b)
        acc.pool.release(b.reserved)
        b.reserved = 0
        b.release_records()

    def _bump_epoch(self, q: PartitionQueue) -> None:
        if self._producer_id < 0:
            return
        q.epoch += 1
        q.next_sequence = 0
        if q.epoch > INT16_MAX:  # pragma: no cover - 32k fatal errors on one partition
            raise RuntimeError(f"{q.topic}[{q.partition}]: producer epoch exhausted; create a new Producer")
        for waiting in q.ready:
            waiting.payload = None

    def fail_all(self, err: DMQError) -> int:
        """Fail every incomplete batch (close after its timeout, or a crash). The loop must be
        stopped. Returns the number of records failed."""
        acc = self._acc
        with acc.lock:
            pending = list(acc.incomplete)
            acc.incomplete.clear()
        failed = 0
        for b in pending:
            if not b.future.done():
                failed += b.count or len(b.values)
            b.reject(err)
            acc.pool.release(b.reserved)
            b.reserved = 0
        return failed



def new_producer_id() -> int:
    """A random non-negative 63-bit id: collisions between producers are negligible."""
    return secrets.randbits(63)
