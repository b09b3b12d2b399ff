"""The producer's sender thread: seals lingering batches, encodes them, ships them, retries.

One thread per Producer, owned by it (`start()` in the constructor, `stop()` in close()). Each
turn of the loop (woken by new batches, responses, or the next linger/backoff deadline):

  1. handle finished Produce calls (gRPC calls our callback on its own thread; it only queues);
  2. seal open batches whose partition has room for another call and whose age reached linger_ms (at once when a
     send() is blocked on buffer_memory, so memory comes back);
  3. for each partition with room (see "Ordering"), encode its next sealed batch (assigning its
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

Ordering: up to max_in_flight_requests_per_connection (Kafka's name; 1..5, default 5 when
idempotent, else 1) batches of a partition are sent and not yet resolved at once. Why the log
still holds them in seal order, exactly once, for an idempotent producer:
  - sequences are assigned at encoding, and batches are encoded and first sent in seal order
    (only the head of `ready` is ever encoded or sent);
  - the broker appends a producer's batch only directly after its predecessor in the same epoch
    (the sequence check); one that arrives, or reaches the append, before its predecessor waits
    for it, bounded (dmq.broker.sequence_gate), and is answered OUT_OF_ORDER_SEQUENCE if it does
    not come. So batch k+1 is in the log only if batch k is, right before it;
  - a failed batch goes back into `ready` in seal order, before every batch sealed after it, so
    retries are sent in order too; OUT_OF_ORDER_SEQUENCE for a batch with an earlier batch still
    unresolved means "not yet", and the batch is simply retried after it (no epoch bump);
  - at most max_in_flight (<= 5) batches are unresolved, counted from the oldest, and the broker
    keeps the last 5 batches of each producer, so a retry of any of them whose first answer was
    lost is still recognised as a duplicate and answered with its original offset;
  - an epoch bump (sequence back to 0) happens only with no call of the partition in flight
    (`bump_pending`): an old-epoch call answered after the new epoch started would be fenced.
    Every batch re-encoded by the bump is proven absent from the log: never sent, or refused
    OUT_OF_ORDER_SEQUENCE as the oldest unresolved batch (so its successors are absent too). A
    batch that fails for good bumps the epoch only as the oldest unresolved batch with no later
    batch sent; otherwise a batch the bump would re-encode might be stored (an earlier one
    awaiting its retry, a later one sent), so nothing is bumped: the broker has a later batch
    only if it has this one, and refuses a gap with OUT_OF_ORDER_SEQUENCE, which bumps then. A
    batch never sent gives its sequence numbers back (when it was the last encoded);
  - a broker that does not know the producer (state expired after a day idle, or a new leader
    whose log lost all its batches) accepts it at any sequence, so two batches racing there
    could land in either order: a partition sends one batch at a time until a batch of the
    current epoch is acknowledged, after any failure, and when the last acknowledgement is older
    than CONFIRMED_MAX_AGE_S.
Futures and callbacks complete in seal order: an answer is kept on its batch (`outcome`) until
every batch before it is resolved (`_settle`). Without idempotence more than 1 in flight may
reorder a retried batch (Kafka's documented caveat); the default there is 1. Different partitions
are in flight concurrently.

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

INF = float("inf")
# The broker drops an idle producer's sequence state (producer_id_expiration_ms, a day by
# default) and then accepts it with any sequence. Batches go one at a time until one is
# acknowledged in the current epoch and while the last acknowledgement is older than this, so a
# broker that may not know the producer's sequence never gets two of them at once.
CONFIRMED_MAX_AGE_S = 60.0
_DROPPED = object()  # acks=0: the batch's outcome when its call failed (its handle said "sent")
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
        max_in_flight: int = 1,
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
        # max_in_flight_requests_per_connection: Produce calls (and unresolved batches) per partition
        self._max_in_flight = max_in_flight
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
                    room_at = now if q is None else self._room_at(q, now)
                    if room_at is None:
                        continue  # keeps filling; looked at again when the partition frees up
                    due = max(b.created + linger, room_at)
                    if (rush and room_at <= now) or due <= now:
                        acc.seal(b)
                    elif due < next_at:
                        next_at = due
            if acc.newly_ready:
                self._active |= acc.newly_ready
                acc.newly_ready.clear()
        for q in list(self._active):
            next_at = min(next_at, self._service(q, now))
        return max(0.0, next_at - time.monotonic())

    def _window(self, q: PartitionQueue, now: float) -> int:
        """How many of the partition's batches may be unresolved (sent and not yet answered in
        order), and how many calls in flight: max_in_flight, except for an idempotent producer
        whose partition has no recent acknowledgement in this epoch (see the module docstring)."""
        n = self._max_in_flight
        if n > 1 and self._producer_id >= 0 and not (q.confirmed_at and now - q.confirmed_at < CONFIRMED_MAX_AGE_S):
            return 1
        return n

    def _room_at(self, q: PartitionQueue, now: float) -> float | None:
        """When the partition may take one more lingering batch (its open batch keeps filling
        until then): None while its window is full (an answer frees it). With calls in flight, at
        most one every round trip / window: a record then waits at most that long for its call,
        where one call in flight made it wait up to a whole round trip, and a partition sends at
        most `window` calls per round trip (with linger_ms=0 it otherwise sent a call of one or
        two records every turn, and the brokers' per-call work crowded out everything else).
        A full batch is sealed by the accumulator and sent at once (window permitting)."""
        window = self._window(q, now)
        if q.ready or q.bump_pending or q.in_flight >= window or len(q.unresolved) >= window:
            return None
        if not q.in_flight:
            return now
        return q.last_sent_at + q.rtt_s / window

    def _service(self, q: PartitionQueue, now: float) -> float:
        """Expire, encode and send what the partition may send now; when to look again."""
        if q.bump_pending and not q.in_flight:
            self._bump_epoch(q)
        if not q.ready:
            if not q.in_flight and not q.bump_pending:
                self._active.discard(q)
            return INF
        if not q.in_flight:
            while q.ready and q.ready[0].deadline <= now:
                self._expire(q, q.ready.popleft())
            if not q.ready:
                return INF
        next_at = INF
        if q.retry_at > now and q.failed_leader is not None:
            leader = self._cluster.peek_leader(q.topic, q.partition, max_age_s=LEADER_POLL_S)
            if leader and leader != q.failed_leader:
                # A new leader is known: waiting out the backoff would only add latency.
                log.info("new leader known; retrying without waiting out the backoff",
                         topic=q.topic, partition=q.partition, leader=leader)
                q.retry_at, q.failed_leader, q.failures = 0.0, None, 0
            else:
                next_at = now + LEADER_POLL_S
        if q.retry_at > now:
            return min(next_at, q.retry_at)
        window = self._window(q, now)
        while q.ready and not q.bump_pending and q.in_flight < window:
            b = q.ready[0]
            # its place among the partition's unresolved batches (a retry has one already)
            if (q.unresolved.index(b) if b.tracked else len(q.unresolved)) >= window:
                break
            self._dispatch(q, q.ready.popleft(), now)
            if q.retry_at > now:
                break  # no leader known: backing off
            window = self._window(q, now)
        if q.in_flight and q.ready and q.ready[0].payload is None and not q.bump_pending:
            # Encode the next batch while the calls are in flight, so that when an answer comes
            # the next Produce goes out at once (its sequence follows in order).
            self._encode_or_fail(q, q.ready[0], pop=True)
        return next_at

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
        b.sent = False  # this encoding has not been handed to gRPC
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
        if not b.tracked:  # every batch before it is tracked (or resolved) already: seal order
            b.tracked = True
            q.unresolved.append(b)
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
        b.sent = True
        q.in_flight += 1
        q.last_sent_at = now
        if not self._wait_for_ack and not b.future.done():
            b.resolve(-1)  # acks=0: nobody waits for the broker
        call.add_done_callback(functools.partial(self._queue_response, b, address, time.monotonic()))

    def _queue_response(self, b: ProducerBatch, address: str, sent: float, call: Any) -> None:
        # On a gRPC thread: hand over to the sender, touch nothing else (the latency ends here).
        self._completions.append((b, address, call, time.monotonic() - sent))
        self._wakeup.set()

    def _on_response(self, b: ProducerBatch, address: str, call: Any, now: float, latency_s: float = 0.0) -> None:
        q = self._acc.queue(b.topic, b.partition)
        q.in_flight -= 1
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
            q.confirmed_at = now
            q.rtt_s = latency_s if not q.rtt_s else 0.8 * q.rtt_s + 0.2 * latency_s
            self.stats.request(latency_s)
            self.stats.transferred(b.count, len(b.payload or b""))
            b.outcome = response.base_offset
            self._settle(q)  # resolved once the batches before it are
        self._active.add(q)

    def _attempt_failed(
        self, q: PartitionQueue, b: ProducerBatch, err: DMQError, now: float, address: str | None = None
    ) -> None:
        """Retry `b` (first in its partition, after a backoff) or fail it. `address`: the broker
        the attempt went to ("" when no leader was known)."""
        q.failures += 1
        q.confirmed_at = 0.0  # the next attempts go one at a time until one is acknowledged
        self._active.add(q)
        where = dict(topic=b.topic, partition=b.partition, attempt=b.attempts)
        if not self._wait_for_ack and b.future.done():
            # The handle said "sent" already; the metrics are the one place the loss shows. (A
            # batch never handed to gRPC goes on below: retried, or its handle fails.)
            log.warning("produce failed with acks=0; records dropped", error=str(err), records=b.count, **where)
            with self._acc.lock:
                self._acc.records_failed += b.count
            b.outcome = _DROPPED
            self._settle(q)
            return
        if err.invalid_metadata:
            self._cluster.invalidate(b.topic)
            q.failed_leader = address
        if isinstance(err, OutOfOrderSequenceError) and b.attempts <= self._retries:
            if q.unresolved and q.unresolved[0] is not b:
                # An earlier batch is in flight or being retried: the broker held this one for a
                # while, then refused it. It follows that batch again (no epoch bump).
                log.info("batch refused before its predecessor was appended; retried after it", error=str(err),
                         **where)
                self._requeue(q, b)
                return
            log.warning("broker lost this producer's sequence; bumping the epoch", error=str(err), **where)
            b.payload = None  # re-encoded with the new epoch, sequence 0
            self._requeue(q, b)
            self._bump_epoch_when_idle(q)
            return
        # NOT_FOUND from a broker: the partition may have moved; the metadata refresh before the
        # retry raises TopicNotFoundError if the topic itself is gone.
        retriable = err.retriable or (isinstance(err, NotFoundError) and not isinstance(err, TopicNotFoundError))
        backoff = self.retry.backoff_s(max(1, q.failures))
        if retriable and b.attempts <= self._retries and now + backoff < b.deadline:
            log.warning("produce failed; retrying", error=str(err), backoff_ms=round(backoff * 1000), **where)
            b.last_error = str(err)
            q.retry_at = now + backoff
            self._requeue(q, b)
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
        """`b` failed for good: rejected once the batches before it are resolved."""
        q.failed_leader, q.failures = None, 0  # the next batch starts its backoff afresh
        log.error("produce failed", topic=b.topic, partition=b.partition, records=b.count, error=str(err))
        if not b.tracked:  # never sent: the first of the partition's batches not yet tracked
            b.tracked = True
            q.unresolved.append(b)
        if b.base_sequence >= 0:
            if not b.sent and b.epoch == q.epoch and q.next_sequence == (b.base_sequence + b.count) % (INT32_MAX + 1):
                # Never handed to gRPC in this encoding, and the last batch encoded: its
                # sequence numbers are simply given to the next batch.
                q.next_sequence = b.base_sequence
            elif q.unresolved[0] is b and not self._successor_sent(q, b):
                # The broker may or may not hold it: continuing the sequence could leave a gap; a
                # new epoch starting at 0 is unambiguous. Only when no batch of this partition
                # that the bump re-encodes could be in the log: none before it is unresolved (one
                # awaiting its retry may be stored), none after it was sent. Otherwise the broker
                # decides: it has a later batch only if it has this one, and refuses a gap with
                # OUT_OF_ORDER_SEQUENCE, which bumps the epoch once that batch is the oldest.
                self._bump_epoch_when_idle(q)
        b.outcome = err
        self._settle(q)

    def _settle(self, q: PartitionQueue) -> None:
        """Resolve the partition's answered batches in seal order: futures and callbacks complete
        in the order the batches were sealed, whatever order their answers came in."""
        unresolved = q.unresolved
        while unresolved and unresolved[0].outcome is not None:
            b = unresolved.popleft()
            b.tracked = False
            outcome = b.outcome
            if outcome is _DROPPED:
                self._release(b)
            elif isinstance(outcome, BaseException):
                b.reject(outcome)
                self._release(b)
            else:
                self._done(b, outcome)

    def _requeue(self, q: PartitionQueue, b: ProducerBatch) -> None:
        """Put a tracked batch back among the batches to send, in seal order: after the retries
        sealed before it, before those sealed after it and before every fresh batch."""
        place = q.unresolved.index(b)
        for i, other in enumerate(q.ready):
            if not other.tracked or q.unresolved.index(other) > place:
                q.ready.insert(i, b)
                return
        q.ready.append(b)

    @staticmethod
    def _successor_sent(q: PartitionQueue, b: ProducerBatch) -> bool:
        """Whether a batch sealed after `b` was handed to gRPC with its current encoding."""
        after = False
        for other in q.unresolved:
            if after and other.sent:
                return True
            after = after or other is b
        return False

    def _bump_epoch_when_idle(self, q: PartitionQueue) -> None:
        """Bump the epoch now, or once no call of the partition is in flight: a call of the old
        epoch answered after the new one started would be refused as fenced."""
        if self._producer_id < 0:
            return
        if q.in_flight:
            q.bump_pending = True
        else:
            self._bump_epoch(q)

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
        q.bump_pending = False
        q.confirmed_at = 0.0
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
