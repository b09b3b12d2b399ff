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

Prefetch (``prefetch_records=N``, off by default), as Kafka's share consumer (KIP-932) fetches and
acquires a batch and hands it out max.poll.records at a time: a pop that goes to the broker asks
for max(N, max_records) records under one lease, and the consumer hands them out as leases of
max_records records each (same QueueLease class; each one's offsets and records are its own, its
lease_id the broker's lease). The next slice of a partition is handed out only once the previous
one is acknowledged (order within a partition holds as without prefetch), and only while at least
PREFETCH_MIN_LEASE_LEFT of the broker lease's length is left (so a slice has time to be worked
before the broker expires it). An ack passed to ``pop(ack=slice)`` is then recorded locally, not
sent: it becomes durable when a later call to the broker carrying it is answered — the pop that
finds the prefetched records used up (or the lease too close to its expiry) carries it, as a
share fetch carries acknowledgements — or at ``commit()`` or ``close()``. A worker that dies before
that gets those records again (at least once, as Kafka's share consumer): the broker expires the
lease and counts a failed delivery of its first record only. ``ack(slice)``, ``nack``, ``reject``
and ``renew`` go to the broker at once as without prefetch; ``close()`` sends the recorded acks and
gives back the records never handed out without counting a failed delivery for them.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from dmq.client._calls import call_leader
from dmq.client._closing import ClosedOnExit
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
# A prefetched slice is handed out only while this much of its broker lease's length is left: a
# handler run under process() is renewed every third of the length, so a slice handed out then has
# at least that long before the broker could expire it, as a renewed lease has.
PREFETCH_MIN_LEASE_LEFT = 1 / 3
MAX_PREFETCH_RECORDS = 100_000  # the broker's limit on one pop
_SETTINGS = ("max_records", "lease_ms", "request_timeout_ms", "max_bytes", "prefetch_records", "cluster", "bootstrap")


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


class _Prefetched:
    """A broker lease whose records are handed out a slice at a time (guarded by the consumer's lock).

    acked_to: records before it are acknowledged (locally or durably); durable_to: durably;
    taken: records before it were handed out; out: the slice handed out and not yet finished
    (at most one: the next is handed out after it is acked, so acks are a prefix)."""

    __slots__ = ("lease", "lease_ms", "deadline", "acked_to", "durable_to", "taken", "out")

    def __init__(self, lease: QueueLease, lease_ms: int, sent_at: float) -> None:
        self.lease = lease
        self.lease_ms = lease_ms
        # timed from when the pop was sent: the broker granted it later, so this is earlier
        self.deadline = sent_at + lease_ms / 1000
        self.acked_to = self.durable_to = self.taken = lease.start_offset
        self.out: QueueLease | None = None

    @property
    def used_up(self) -> bool:
        return self.taken >= self.lease.end_offset

    def servable(self, now: float) -> bool:
        return self.out is None and not self.used_up and self.deadline - now >= self.lease_ms / 1000 * PREFETCH_MIN_LEASE_LEFT

    def take(self, n: int) -> QueueLease:
        lease = self.lease
        i = self.taken - lease.start_offset
        part = lease.records[i : i + n]
        start = self.taken
        self.taken += len(part)
        self.out = QueueLease(
            lease.lease_id, lease.topic, lease.partition, lease.group, start, self.taken,
            lease.expiry_ms, lease.delivery_count if start == lease.start_offset else 0, part, lease.broker,
        )
        return self.out

    def owns(self, part: QueueLease) -> bool:
        return self.out is not None and part.start_offset == self.out.start_offset and part.end_offset == self.out.end_offset


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


class QueueConsumer(ClosedOnExit):
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
        prefetch_records: int = 0,
        cluster: Cluster | None = None,
        bootstrap: str | Sequence[str] | None = None,
        **unknown: Any,
    ) -> None:
        """``lease_ms`` None = the topic's lease_ms setting (30 s without one); ``max_bytes`` 0 =
        the broker's default (4 MiB; a pop returns at least one record).

        ``prefetch_records`` (0 = off): a pop that goes to the broker leases up to this many
        records (at least max_records) and hands them out max_records at a time; acks given to
        ``pop(ack=...)`` are then recorded locally and made durable by the next broker call that
        carries them, ``commit()`` or ``close()`` (see the module docstring). Off by default: it
        holds a partition for up to this many records, and a crash redelivers records whose acks
        were only local."""
        reject_unknown("QueueConsumer", unknown, _SETTINGS)
        check_positive("max_records", max_records)
        if not 0 <= prefetch_records <= MAX_PREFETCH_RECORDS:
            raise InvalidArgumentError(f"prefetch_records must be within 0..{MAX_PREFETCH_RECORDS} (0 = off), got {prefetch_records}")
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
        self.prefetch_records = prefetch_records
        # broker leases being handed out a slice at a time, by lease id (guarded by _lock)
        self._prefetched: dict[str, _Prefetched] = {}
        self._lock = threading.Lock()
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

    def close(self) -> None:
        """Stop; with prefetch, first make the recorded acks durable and give back the records
        never handed out (no failed delivery is counted for them; a slice handed out and not
        acked is given back too). A refusal (the lease expired meanwhile) is logged: those
        records come back."""
        if self._closed:
            return
        self._stop.set()
        self._renewer.close()
        with self._lock:
            held = list(self._prefetched.values())
            self._prefetched.clear()
        self._give_back(held)
        self._closed = True
        if self._own_cluster:
            self._cluster.close()

    def commit(self) -> None:
        """Make the acks recorded locally (``pop(ack=...)`` with prefetch) durable now, as Kafka's
        share consumer's commitSync: durable on the broker when this returns; the leases stay
        live for the prefetched records not yet handed out. Raises the first refusal (e.g.
        LeaseExpiredError: those records come back); a no-op without prefetch."""
        with self._lock:
            held = [p for p in self._prefetched.values() if p.acked_to > p.durable_to]
        for p in held:
            self._settle(p, release=False)

    def _give_back(self, held: list[_Prefetched]) -> None:
        """Settle prefetched leases taken out of the table: their recorded acks stored, the rest
        released. A refusal is logged, not raised: those records come back from the broker."""
        for p in held:
            try:
                self._settle(p, release=True)
            except DMQError as e:
                log.warning("acks of prefetched records not stored (they come back)",
                            topic=p.lease.topic, partition=p.lease.partition, error=str(e))

    def _settle(self, p: _Prefetched, *, release: bool) -> None:
        """Send a prefetched lease's recorded acks; `release`: and give the rest back."""
        with self._lock:
            up_to, everything = p.acked_to - 1, p.acked_to >= p.lease.end_offset
            if not release and up_to < p.durable_to:
                return
        if release or everything:
            with self._lock:
                if self._prefetched.get(p.lease.lease_id) is p:
                    del self._prefetched[p.lease.lease_id]
        request = pb.QueueAckRequest(lease_id=p.lease.lease_id, up_to_offset=up_to, keep_lease=not (release or everything))
        try:
            self._lease_call(p.lease, "QueueAck", request)
        except DMQError:
            self._drop(p)  # e.g. the lease expired: hand out nothing more of it (the broker gives it back)
            raise
        with self._lock:
            p.durable_to = max(p.durable_to, up_to + 1)

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
        timeout (dmq.client._calls). A broker refuses such a call before it changes anything."""
        if self._closed:
            raise ClientClosedError("the QueueConsumer is closed; create a new one")
        return call_leader(
            self._cluster, self.topic, lambda: self._leader_of(lease), method, request,
            policy=self._cluster.retry, what=f"{method} {lease.topic}[{lease.partition}]",
            retriable=lambda e: isinstance(e, BrokerUnavailableError), stop=lambda: self._closed,
        )

    # -- pop ---------------------------------------------------------------------------------------

    def pop(
        self, timeout: float = 1.0, *, max_records: int | None = None, ack: QueueLease | None = None,
        lease_ms: int | None = None,
    ) -> QueueLease | None:
        """Lease the next available partition's records; None when none came within `timeout` s.

        ``lease_ms``: this lease's length (default: the consumer's ``lease_ms``, else the topic's);
        a slice handed out of a prefetched lease keeps that lease's length.

        ``ack``: a lease to acknowledge (all of it) first; sent with the pop when it goes to the
        same broker, so one round trip does both. A refused ack raises and nothing is popped.
        With prefetch, a slice's ack is recorded locally and the next slice of its partition
        handed out when there is one (no broker call); the recorded acks ride on the pop that
        goes to the broker next (see the module docstring for when they are durable).
        """
        if timeout < 0 or timeout > MAX_POP_WAIT_MS / 1000:
            raise InvalidArgumentError(f"timeout must be within 0..{MAX_POP_WAIT_MS / 1000:g} s, got {timeout}")
        if lease_ms is not None and not limits.LEASE_MS_MIN <= lease_ms <= limits.LEASE_MS_MAX:
            raise InvalidArgumentError(
                f"lease_ms must be within {limits.LEASE_MS_MIN}..{limits.LEASE_MS_MAX} (or None for the consumer's), "
                f"got {lease_ms}"
            )
        asked_ms = lease_ms or self.lease_ms
        wanted = max_records or self.max_records
        # The ack riding on this pop: (the broker lease, the last offset acknowledged).
        ride = None if ack is None else (ack, ack.end_offset - 1)
        if self.prefetch_records:
            if self._closed:
                raise ClientClosedError("the QueueConsumer is closed; create a new one")
            with self._lock:
                now = time.monotonic()
                p = None if ack is None else self._prefetched.get(ack.lease_id)
                if p is not None and ack is not None:
                    if not p.owns(ack):
                        raise InvalidArgumentError(
                            f"lease {ack.topic}[{ack.partition}] offsets {ack.start_offset}..{ack.end_offset - 1} "
                            "was already acked, nacked or released"
                        )
                    p.acked_to, p.out = ack.end_offset, None
                    if p.servable(now):
                        return p.take(wanted)
                    # used up, or too close to its expiry: the acks ride on this pop, the
                    # records not handed out are given back (uncounted)
                    del self._prefetched[ack.lease_id]
                    ride = (p.lease, p.acked_to - 1)
                elif ride is None:
                    for q in self._prefetched.values():
                        if q.servable(now):
                            return q.take(wanted)
                # idle ones too close to their expiry to hand out more: given back below
                stale = [q for q in self._prefetched.values() if q.out is None and not q.servable(now)]
                for q in stale:
                    del self._prefetched[q.lease.lease_id]
            self._give_back(stale)
        sent_at = time.monotonic()
        got = self._pop(timeout, max(wanted, self.prefetch_records), ride, asked_ms)
        if got is None:
            return None
        lease, lease_ms = got
        if len(lease.records) <= wanted:
            return lease
        if not lease_ms:  # a broker that does not say: the asked length, else the wall clock's
            lease_ms = asked_ms or max(lease.expiry_ms - int(time.time() * 1000), 0)
        p = _Prefetched(lease, lease_ms, sent_at)
        with self._lock:
            self._prefetched[lease.lease_id] = p
            return p.take(wanted)

    def _pop(
        self, timeout: float, wanted: int, ride: tuple[QueueLease, int] | None, lease_ms: int
    ) -> tuple[QueueLease, int] | None:
        """Pop from the topic's leaders (the one holding the riding ack's lease first)."""
        deadline = time.monotonic() + timeout
        leaders = self._leaders()
        if not leaders:
            raise BrokerUnavailableError(f"topic {self.topic!r} has no live leaders; retry")
        ack_at = self._leader_of(ride[0]) if ride is not None else ""
        if ride is not None and ack_at not in leaders:
            self._ack_ride(ride)
            ride = None
        if ride is not None:
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
                    got = self._pop_from(address, wanted, wait_ms, ride, lease_ms)
                except BrokerUnavailableError:
                    if ride is None:
                        raise
                    # refused there before anything changed (leadership moved): ack it alone
                    self._ack_ride(ride)
                    got = None
                ride = None
                if got is not None:
                    return got
            first = False
            if time.monotonic() >= deadline or self._stop.is_set():
                return None

    def _ack_ride(self, ride: tuple[QueueLease, int]) -> None:
        lease, up_to = ride
        self._lease_call(lease, "QueueAck", pb.QueueAckRequest(lease_id=lease.lease_id, up_to_offset=up_to))

    def _pop_from(
        self, address: str, max_records: int, wait_ms: int, ride: tuple[QueueLease, int] | None, lease_ms: int
    ) -> tuple[QueueLease, int] | None:
        """(the lease, its length in ms; 0 asks for the topic's) or None."""
        request = pb.QueuePopRequest(
            topic=self.topic,
            group=self.group,
            max_records=max_records,
            lease_ms=lease_ms,
            timeout_ms=wait_ms,
            max_bytes=self.max_bytes,
        )
        if ride is not None:
            # through the acked lease's last record: a slice's lease id names a longer lease
            request.ack_lease_id, request.ack_up_to_offset = ride[0].lease_id, ride[1]
        try:
            response = self._call(address, "QueuePop", request, f"QueuePop {self.topic!r}", wait_ms / 1000 + self._cluster.timeout_s)
        except (NotFoundError, BrokerUnavailableError) as e:
            if ride is not None:
                raise
            # leadership moved or the broker is down: learn the new leaders, try the others now
            self._cluster.invalidate(self.topic)
            log.debug("pop failed; metadata refreshed", broker=address, error=str(e))
            return None
        if not response.lease_id:
            return None
        return self._lease(response, address), int(response.lease_ms)

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

    def _held(self, lease: QueueLease) -> _Prefetched | None:
        """The prefetched broker lease `lease` is the slice handed out of (None: not one)."""
        if not self.prefetch_records:
            return None
        with self._lock:
            p = self._prefetched.get(lease.lease_id)
            if p is not None and not p.owns(lease):
                raise InvalidArgumentError(
                    f"lease {lease.topic}[{lease.partition}] offsets {lease.start_offset}..{lease.end_offset - 1} "
                    "was already acked, nacked or released"
                )
            return p

    def _drop(self, p: _Prefetched) -> None:
        with self._lock:
            if self._prefetched.get(p.lease.lease_id) is p:
                del self._prefetched[p.lease.lease_id]

    def ack(self, lease: QueueLease, up_to_offset: int | None = None) -> int:
        """Acknowledge the lease's records (through up_to_offset, inclusive) and release it; durable
        on the broker when this returns. The next offset the group will get.

        With prefetch, a slice acked whole keeps its broker lease live for the records not yet
        handed out (the next pop hands them out); acked in part, the broker lease is released and
        the records after up_to_offset come back."""
        up_to = lease.end_offset - 1 if up_to_offset is None else up_to_offset
        p = self._held(lease)
        if p is None:
            # through the lease's last record: a slice's lease id names a longer broker lease
            request = pb.QueueAckRequest(lease_id=lease.lease_id, up_to_offset=up_to)
            return int(self._lease_call(lease, "QueueAck", request).acked_offset)
        if not lease.start_offset - 1 <= up_to < lease.end_offset:
            raise InvalidArgumentError(
                f"up_to_offset must be within {lease.start_offset - 1}..{lease.end_offset - 1}, got {up_to}"
            )
        keep = up_to == lease.end_offset - 1 and not p.used_up
        if not keep:
            self._drop(p)
        request = pb.QueueAckRequest(lease_id=lease.lease_id, up_to_offset=up_to, keep_lease=keep)
        try:
            acked = int(self._lease_call(lease, "QueueAck", request).acked_offset)
        except DMQError:
            self._drop(p)  # its state is unknown: what was not acked comes back from the broker
            raise
        with self._lock:
            p.acked_to = p.durable_to = up_to + 1
            p.out = None
        return acked

    def nack(self, lease: QueueLease, error: str = "", failed_offset: int | None = None) -> NackResult:
        """Release the lease: the record that failed (default the first) counts a failed delivery
        and comes back first; records before it are acknowledged. At the topic's
        max_delivery_attempts it goes to the dead-letter topic instead. With prefetch, the records
        acked locally before it are acknowledged too, and the prefetched rest comes back."""
        p = self._held(lease)
        if p is not None:
            self._drop(p)
            if failed_offset is None:
                failed_offset = max(lease.start_offset, p.acked_to)  # after a reject's record
        request = pb.QueueNackRequest(lease_id=lease.lease_id, error=error)
        if failed_offset is not None:
            request.failed_offset = failed_offset
        r = self._lease_call(lease, "QueueNack", request)
        return NackResult(r.acked_offset, r.delivery_count, r.dead_lettered)

    release = nack

    def reject(self, lease: QueueLease, offset: int, error: str = "") -> DeadLetterInfo:
        """Send the record at `offset` to `<topic>.dlq` now and move past it (the records before it
        are acknowledged); the lease stays live for its other records."""
        p = self._held(lease)
        if p is not None and not lease.start_offset <= offset < lease.end_offset:
            raise InvalidArgumentError(f"offset must be within {lease.start_offset}..{lease.end_offset - 1}, got {offset}")
        request = pb.QueueRejectRequest(lease_id=lease.lease_id, offset=offset, error=error)
        r = self._lease_call(lease, "QueueReject", request)
        if p is not None:
            with self._lock:
                p.acked_to = max(p.acked_to, offset + 1)
                p.durable_to = max(p.durable_to, offset + 1)
        return DeadLetterInfo(r.dlq_topic, r.dlq_partition, r.dlq_offset)

    def renew(self, lease: QueueLease, lease_ms: int | None = None) -> int:
        """Extend the lease by lease_ms (default: its own length) from now; the new expiry (ms).
        With prefetch, this is the broker lease of the slice (its records not handed out too)."""
        p = self._held(lease) if self.prefetch_records else None
        sent_at = time.monotonic()
        request = pb.QueueRenewRequest(lease_id=lease.lease_id, lease_ms=lease_ms or 0)
        try:
            r = self._lease_call(lease, "QueueRenew", request)
        except LeaseExpiredError:
            if p is not None:
                self._drop(p)  # lost: hand out nothing more of it
            raise
        if p is not None:
            with self._lock:
                p.lease_ms = lease_ms or p.lease_ms
                p.deadline = max(p.deadline, sent_at + p.lease_ms / 1000)
                p.lease = dataclasses.replace(p.lease, expiry_ms=int(r.expiry_ms))
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
