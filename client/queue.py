"""QueueConsumer: a stateless worker of a queue group (DESIGN.md "Queue mode").

    with QueueConsumer("127.0.0.1:9091", "jobs", "workers") as q:
        lease = q.pop(timeout=5)                 # QueueLease or None
        if lease is not None:
            for record in lease.records: ...
            q.ack(lease)                         # or nack(lease, error), reject(lease, offset, error)

        q.process(handle, idle_timeout=10)       # pop, run, renew meanwhile, ack / nack, repeat

A pop leases one partition of the topic to this process for `lease_ms`: its records from the
group's acknowledged offset, in order, and nobody else of the group gets that partition until the
lease is acked, nacked or expires. No registration: any process with the address may pop.

The partitions of a topic are spread over brokers and each leader leases its own, so `pop` asks
the leaders of the topic in turn (starting with a different one each time), long-polling when
there is only one. `process()` acknowledges a lease by riding the ack on its next pop to the same
broker, so a cycle of small leases is one round trip; the last ack is sent when it stops.

While a handler runs, a renewer thread (owned by the consumer, stopped by close()) renews the lease
every third of its length, so long work never loses it.

A lease outlives a failover of its partition's leader (the broker keeps it in the partition's
replicated log): ack / nack / reject / renew go to the partition's current leader, and when the
broker answers that it no longer leads it (or is down), the metadata is refreshed and the call
sent to the new leader, for up to request_timeout_ms.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from dmq.client._cluster import Cluster
from dmq.client._log import get_logger
from dmq.client._settings import bootstrap_address, check_positive, reject_unknown
from dmq.client.errors import (
    BrokerUnavailableError,
    ClientClosedError,
    CorruptRecordError,
    DMQError,
    InvalidArgumentError,
    LeaseExpiredError,
    NotFoundError,
    from_rpc_error,
)
from dmq.client.records import ConsumerRecord, RecordSequence
from dmq.proto import dmq_pb2 as pb
from dmq.proto import limits, records

log = get_logger(__name__)

__all__ = ["QueueConsumer", "QueueLease", "NackResult", "DeadLetterInfo"]

DEFAULT_MAX_RECORDS = 100
# With several leaders a pop cannot long-poll one of them (another may get records first): it
# asks each in turn with this long a wait.
MULTI_BROKER_WAIT_MS = 100
MAX_POP_WAIT_MS = 60_000
# A call on a lease whose partition has no reachable leader is retried this often (a failover).
LEASE_RETRY_BACKOFF_S = 0.1
_SETTINGS = ("max_records", "lease_ms", "request_timeout_ms", "max_bytes", "cluster", "bootstrap")


@dataclass(frozen=True, slots=True)
class QueueLease:
    """One pop's lease: records [start_offset, end_offset) of one partition, until expiry_ms."""

    lease_id: str
    topic: str
    partition: int
    group: str
    start_offset: int
    end_offset: int
    expiry_ms: int  # wall clock
    delivery_count: int  # failed deliveries of the first record so far
    # Immutable, compared and hashed like the tuple of its records; each record is built when a
    # loop or an index reaches it (RecordSequence: what building them all up front cost).
    records: RecordSequence
    broker: str  # the leader that granted it (after a failover, calls go to the new leader)

    def __len__(self) -> int:
        return len(self.records)


@dataclass(frozen=True, slots=True)
class NackResult:
    acked_offset: int
    delivery_count: int
    dead_lettered: bool


@dataclass(frozen=True, slots=True)
class DeadLetterInfo:
    topic: str
    partition: int
    offset: int


def call_broker(cluster: Cluster, address: str, method: str, request: Any, what: str, timeout_s: float | None = None) -> Any:
    """One Broker RPC; a gRPC error becomes its DMQError, saying what was done where."""
    stub = cluster.broker_stub(address)
    try:
        return getattr(stub, method)(request, timeout=timeout_s or cluster.timeout_s)
    except grpc.RpcError as e:
        raise from_rpc_error(e, context=f"{what} at {address}") from None


class _Renewer:
    """Renews the lease of the handler that is running, from its own thread."""

    def __init__(self, consumer: QueueConsumer) -> None:
        self._consumer = consumer
        self._cond = threading.Condition()
        self._lease: QueueLease | None = None
        self._next_at = 0.0
        self._interval_s = 0.0
        self._closed = False
        self._thread: threading.Thread | None = None

    def watch(self, lease: QueueLease) -> None:
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="dmq-queue-renewer", daemon=True)
                self._thread.start()
            length_s = max(lease.expiry_ms / 1000 - time.time(), 0.1)
            self._interval_s = length_s / 3
            self._lease = lease
            self._next_at = time.monotonic() + self._interval_s
            self._cond.notify()

    def clear(self) -> None:
        with self._cond:
            self._lease = None

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._lease = None
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (self._lease is None or time.monotonic() < self._next_at):
                    wait = None if self._lease is None else max(self._next_at - time.monotonic(), 0)
                    self._cond.wait(wait)
                if self._closed:
                    return
                lease = self._lease
                self._next_at = time.monotonic() + self._interval_s
            assert lease is not None
            try:
                self._consumer.renew(lease)
            except DMQError as e:
                log.warning("lease renewal failed", topic=lease.topic, partition=lease.partition, error=str(e))
                with self._cond:
                    if self._lease is lease and isinstance(e, LeaseExpiredError):
                        self._lease = None  # lost: nothing more to renew


class QueueConsumer:
    """A queue-group worker on one topic. Thread-safe for pop/ack/nack/reject/renew; close() when done."""

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str] | None,
        topic: str,
        group: str,
        *,
        max_records: int = DEFAULT_MAX_RECORDS,
        lease_ms: int | None = None,
        request_timeout_ms: int = 30_000,
        max_bytes: int = 0,
        cluster: Cluster | None = None,
        bootstrap: str | Sequence[str] | None = None,
        **unknown: Any,
    ) -> None:
        """``lease_ms`` None = the topic's lease_ms setting (30 s without one); ``max_bytes`` 0 =
        the broker's default (4 MiB; a pop returns at least one record)."""
        reject_unknown("QueueConsumer", unknown, _SETTINGS)
        check_positive("max_records", max_records)
        check_positive("request_timeout_ms", request_timeout_ms)
        if lease_ms is not None and not limits.LEASE_MS_MIN <= lease_ms <= limits.LEASE_MS_MAX:
            raise InvalidArgumentError(
                f"lease_ms must be within {limits.LEASE_MS_MIN}..{limits.LEASE_MS_MAX} (or None for the topic's), got {lease_ms}"
            )
        if max_bytes < 0:
            raise InvalidArgumentError(f"max_bytes must be >= 0 (0 = the broker's default), got {max_bytes}")
        self.topic = topic
        self.group = group
        self.max_records = max_records
        self.lease_ms = lease_ms or 0
        self.max_bytes = max_bytes
        self._own_cluster = cluster is None
        self._cluster = cluster or Cluster(
            bootstrap_address({"bootstrap_servers": bootstrap_servers, "bootstrap": bootstrap}, "QueueConsumer"),
            request_timeout_ms=request_timeout_ms,
        )
        self._next = 0  # round robin over the topic's leaders
        self._renewer = _Renewer(self)
        self._stop = threading.Event()
        self._closed = False

    def __repr__(self) -> str:
        return f"<QueueConsumer topic={self.topic!r} group={self.group!r} bootstrap={self._cluster.bootstrap!r}>"

    def __enter__(self) -> QueueConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._renewer.close()
        if self._own_cluster:
            self._cluster.close()

    def stop(self) -> None:
        """Ask a running process() to return after its current lease (callable from any thread)."""
        self._stop.set()

    # -- calls -------------------------------------------------------------------------------------

    def _call(self, address: str, method: str, request: Any, what: str, timeout_s: float | None = None) -> Any:
        if self._closed:
            raise ClientClosedError("the QueueConsumer is closed; create a new one")
        return call_broker(self._cluster, address, method, request, what, timeout_s)

    def _leaders(self) -> list[str]:
        md = self._cluster.topic_metadata(self.topic)
        return sorted({p.leader_address for p in md.partitions if p.leader_address})

    def _leader_of(self, lease: QueueLease) -> str:
        """Where calls on the lease go: its partition's leader per the metadata, else its granter."""
        try:
            md = self._cluster.topic_metadata(self.topic, allow_stale=True)
        except DMQError:
            return lease.broker
        for p in md.partitions:
            if p.partition == lease.partition and p.leader_address:
                return str(p.leader_address)
        return lease.broker

    def _lease_call(self, lease: QueueLease, method: str, request: Any) -> Any:
        """A call on a lease at its partition's leader; retried at the new one while the broker
        answers that it does not lead the partition (or cannot be reached), up to the request
        timeout. A broker refuses such a call before it changes anything."""
        what = f"{method} {lease.topic}[{lease.partition}]"
        deadline = time.monotonic() + self._cluster.timeout_s
        while True:
            address = self._leader_of(lease)
            try:
                return self._call(address, method, request, what)
            except BrokerUnavailableError as e:
                if time.monotonic() >= deadline or self._closed:
                    raise
                log.debug("lease call refused; looking for the partition's leader", broker=address, error=str(e))
                self._cluster.invalidate(self.topic)
                time.sleep(LEASE_RETRY_BACKOFF_S)

    # -- pop ---------------------------------------------------------------------------------------

    def pop(
        self, timeout: float = 1.0, *, max_records: int | None = None, ack: QueueLease | None = None
    ) -> QueueLease | None:
        """Lease the next available partition's records; None when none came within `timeout` s.

        ``ack``: a lease to acknowledge (all of it) first; sent with the pop when it goes to the
        same broker, so one round trip does both. A refused ack raises and nothing is popped.
        """
        if timeout < 0 or timeout > MAX_POP_WAIT_MS / 1000:
            raise InvalidArgumentError(f"timeout must be within 0..{MAX_POP_WAIT_MS / 1000:g} s, got {timeout}")
        wanted = max_records or self.max_records
        deadline = time.monotonic() + timeout
        leaders = self._leaders()
        if not leaders:
            raise BrokerUnavailableError(f"topic {self.topic!r} has no live leaders; retry")
        ack_at = self._leader_of(ack) if ack is not None else ""
        if ack is not None and ack_at not in leaders:
            self.ack(ack)
            ack = None
        if ack is not None:
            start = leaders.index(ack_at)
        else:
            start = self._next % len(leaders)
            self._next += 1
        order = leaders[start:] + leaders[:start]
        first = True
        while True:
            for address in order:
                remaining_ms = max(int((deadline - time.monotonic()) * 1000), 0)
                if first:
                    wait_ms = remaining_ms if len(order) == 1 else 0
                else:
                    wait_ms = min(remaining_ms, MULTI_BROKER_WAIT_MS)
                try:
                    lease = self._pop_from(address, wanted, wait_ms, ack)
                except BrokerUnavailableError:
                    if ack is None:
                        raise
                    # refused there before anything changed (leadership moved): ack it alone
                    self.ack(ack)
                    lease = None
                ack = None
                if lease is not None:
                    return lease
            first = False
            if time.monotonic() >= deadline or self._stop.is_set():
                return None

    def _pop_from(self, address: str, max_records: int, wait_ms: int, ack: QueueLease | None) -> QueueLease | None:
        request = pb.QueuePopRequest(
            topic=self.topic,
            group=self.group,
            max_records=max_records,
            lease_ms=self.lease_ms,
            timeout_ms=wait_ms,
            max_bytes=self.max_bytes,
            ack_lease_id=ack.lease_id if ack is not None else "",
        )
        try:
            response = self._call(address, "QueuePop", request, f"QueuePop {self.topic!r}", wait_ms / 1000 + self._cluster.timeout_s)
        except (NotFoundError, BrokerUnavailableError) as e:
            if ack is not None:
                raise
            # leadership moved or the broker is down: learn the new leaders, try the others now
            self._cluster.invalidate(self.topic)
            log.debug("pop failed; metadata refreshed", broker=address, error=str(e))
            return None
        if not response.lease_id:
            return None
        return self._lease(response, address)

    def _lease(self, r: pb.QueuePopResponse, address: str) -> QueueLease:
        try:
            batches = records.decode_batches(r.records)
            leased = RecordSequence(self.topic, r.partition, batches, r.start_offset, r.end_offset)
        except records.RecordsError as e:
            raise CorruptRecordError(f"QueuePop {self.topic}[{r.partition}] at {address}: {e}") from e
        return QueueLease(
            r.lease_id, self.topic, r.partition, self.group, r.start_offset, r.end_offset,
            r.expiry_ms, r.delivery_count, leased, address,
        )

    # -- finishing ---------------------------------------------------------------------------------

    def ack(self, lease: QueueLease, up_to_offset: int | None = None) -> int:
        """Acknowledge the lease's records (through up_to_offset, inclusive) and release it; durable
        on the broker when this returns. The next offset the group will get."""
        request = pb.QueueAckRequest(lease_id=lease.lease_id)
        if up_to_offset is not None:
            request.up_to_offset = up_to_offset
        response = self._lease_call(lease, "QueueAck", request)
        return int(response.acked_offset)

    def nack(self, lease: QueueLease, error: str = "", failed_offset: int | None = None) -> NackResult:
        """Release the lease: the record that failed (default the first) counts a failed delivery
        and comes back first; records before it are acknowledged. At the topic's
        max_delivery_attempts it goes to the dead-letter topic instead."""
        request = pb.QueueNackRequest(lease_id=lease.lease_id, error=error)
        if failed_offset is not None:
            request.failed_offset = failed_offset
        r = self._lease_call(lease, "QueueNack", request)
        return NackResult(r.acked_offset, r.delivery_count, r.dead_lettered)

    release = nack

    def reject(self, lease: QueueLease, offset: int, error: str = "") -> DeadLetterInfo:
        """Send the record at `offset` to `<topic>.dlq` now and move past it (the records before it
        are acknowledged); the lease stays live for its other records."""
        request = pb.QueueRejectRequest(lease_id=lease.lease_id, offset=offset, error=error)
        r = self._lease_call(lease, "QueueReject", request)
        return DeadLetterInfo(r.dlq_topic, r.dlq_partition, r.dlq_offset)

    def renew(self, lease: QueueLease, lease_ms: int | None = None) -> int:
        """Extend the lease by lease_ms (default: its own length) from now; the new expiry (ms)."""
        request = pb.QueueRenewRequest(lease_id=lease.lease_id, lease_ms=lease_ms or 0)
        r = self._lease_call(lease, "QueueRenew", request)
        return int(r.expiry_ms)

    # -- the worker loop ---------------------------------------------------------------------------

    def process(
        self,
        handler: Callable[[Any], object],
        *,
        batch: bool = False,
        max_leases: int | None = None,
        idle_timeout: float | None = None,
        poll_timeout: float = 1.0,
    ) -> int:
        """Pop, run `handler`, ack on return, nack on exception; repeat. Returns the records acked.

        ``batch=False``: handler(record) per record; when it raises, the records before are
        acknowledged and that record is nacked with the exception as the error. ``batch=True``:
        handler(lease) once per lease; an exception nacks the lease's first record. The lease is
        renewed while the handler runs. Stops after ``max_leases`` leases, after ``idle_timeout``
        seconds without records, or when stop() is called.
        """
        acked = 0
        leases = 0
        pending: QueueLease | None = None  # acked by riding on the next pop
        idle_since = time.monotonic()
        try:
            while not self._stop.is_set() and (max_leases is None or leases < max_leases):
                try:
                    lease = self.pop(poll_timeout, ack=pending)
                except LeaseExpiredError as e:
                    log.warning("ack of a processed lease refused (its records come back)", error=str(e))
                    lease = None
                pending = None
                if lease is None:
                    if idle_timeout is not None and time.monotonic() - idle_since >= idle_timeout:
                        break
                    continue
                idle_since = time.monotonic()
                leases += 1
                done = self._run(handler, lease, batch)
                if done == len(lease.records):
                    pending = lease
                acked += done
        finally:
            if pending is not None and not self._closed:
                try:
                    self.ack(pending)
                except LeaseExpiredError as e:
                    acked -= len(pending.records)
                    log.warning("final ack refused (its records come back)", error=str(e))
        return acked

    def _run(self, handler: Callable[[Any], object], lease: QueueLease, batch: bool) -> int:
        """Run the handler under renewal; the records done (all of them: the caller acks the lease;
        fewer: those before the failed record, acknowledged by its nack)."""
        self._renewer.watch(lease)
        failed: ConsumerRecord | None = None
        error: BaseException | None = None
        try:
            if batch:
                try:
                    handler(lease)
                except Exception as e:  # noqa: BLE001 - the handler's failure is the record's
                    failed, error = lease.records[0], e
            else:
                for record in lease.records:
                    try:
                        handler(record)
                    except Exception as e:  # noqa: BLE001 - the handler's failure is the record's
                        failed, error = record, e
                        break
        finally:
            self._renewer.clear()
        if failed is None:
            return len(lease.records)
        try:
            self.nack(lease, f"{type(error).__name__}: {error}", failed.offset)
        except LeaseExpiredError as e:
            log.warning("nack refused (the lease expired meanwhile)", error=str(e))
            return 0
        return failed.offset - lease.start_offset
