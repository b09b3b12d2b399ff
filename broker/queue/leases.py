"""The lease table of one broker: which (topic, partition, group) is leased, until when.

A lease names no worker: it is the pair (partition, group) with an id and an expiry, and at most
one is live per pair. This module is pure bookkeeping (no I/O, no clock of its own: callers pass
`now`), so the rules are tested without servers:

  - `grant` refuses a second live lease on a pair;
  - `get` returns a live lease by id; an id that expired (even before the timer swept it) or was
    replaced is not live, so a late ack / nack / renew never acts on records someone else holds;
  - a lease being finished (an ack waiting for its fsync, a dead letter being written) is `busy`:
    the timer does not expire it meanwhile, and a second finish of it is refused;
  - `expired(now)` lists the live, idle leases past their expiry for the timer to release;
  - `restore` puts back a lease a previous leader granted (from its entry in the partition's
    replicated offsets log, dmq.broker.queue.progress): same id, same records, and the time it
    had left by the wall clock, so its worker's ack or renew works at the new leader.

Ids are random (128 bits), so one cannot be guessed or reused across broker restarts.
"""

from __future__ import annotations

import heapq
import secrets
from dataclasses import dataclass

__all__ = ["Lease", "LeaseTable", "StoredLease"]


@dataclass(slots=True)
class Lease:
    lease_id: str
    topic: str
    partition: int
    group: str
    start_offset: int  # the group's acknowledged offset when granted; moves with reject
    end_offset: int  # one past the last record handed out
    lease_ms: int
    expiry: float  # monotonic seconds
    expiry_ms: int  # the same instant on the wall clock, for clients and operators
    busy: bool = False

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.topic, self.partition, self.group)

    @property
    def record_count(self) -> int:
        return self.end_offset - self.start_offset


@dataclass(frozen=True, slots=True)
class StoredLease:
    """A lease as its log entry keeps it: no monotonic clock (that is per process)."""

    lease_id: str
    start_offset: int
    end_offset: int
    lease_ms: int
    expiry_ms: int  # wall clock


class LeaseTable:
    def __init__(self) -> None:
        self._by_id: dict[str, Lease] = {}
        self._by_key: dict[tuple[str, int, str], Lease] = {}
        # (expiry, id) of every lease ever granted or renewed; stale entries are skipped when
        # popped, and the heap is rebuilt when they outnumber the live leases (bounded memory).
        self._expiries: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._by_id)

    def __repr__(self) -> str:
        return f"<LeaseTable live={len(self._by_id)}>"

    def held(self, topic: str, partition: int, group: str) -> Lease | None:
        return self._by_key.get((topic, partition, group))

    def grant(
        self,
        topic: str,
        partition: int,
        group: str,
        start_offset: int,
        end_offset: int,
        lease_ms: int,
        now: float,
        now_ms: int,
    ) -> Lease:
        key = (topic, partition, group)
        if key in self._by_key:
            raise ValueError(f"{topic}[{partition}] is already leased to group {group!r}")
        lease = Lease(
            secrets.token_hex(16), topic, partition, group, start_offset, end_offset,
            lease_ms, now + lease_ms / 1000, now_ms + lease_ms,
        )
        self._by_id[lease.lease_id] = lease
        self._by_key[key] = lease
        self._push(lease)
        return lease

    def restore(self, topic: str, partition: int, group: str, stored: StoredLease, now: float, now_ms: int) -> Lease:
        """A lease granted before (by this broker or another): it replaces whatever the table
        holds for the pair, and expires when its wall-clock expiry says (at once if passed)."""
        held = self._by_key.get((topic, partition, group))
        if held is not None:
            self.release(held)
        old = self._by_id.get(stored.lease_id)
        if old is not None:
            self.release(old)
        lease = Lease(
            stored.lease_id, topic, partition, group, stored.start_offset, stored.end_offset,
            stored.lease_ms, now + (stored.expiry_ms - now_ms) / 1000, stored.expiry_ms,
        )
        self._by_id[lease.lease_id] = lease
        self._by_key[lease.key] = lease
        self._push(lease)
        return lease

    def hand_over(self, old: Lease, end_offset: int, lease_ms: int, now: float, now_ms: int) -> Lease:
        """The pair's next lease, from where `old` ends (an ack riding on a pop that takes the same
        partition again): `old` is released and the new one granted in one step."""
        self.release(old)
        return self.grant(old.topic, old.partition, old.group, old.end_offset, end_offset, lease_ms, now, now_ms)

    def take_back(self, new: Lease, old: Lease) -> None:
        """Undo hand_over (its write failed): `old` holds the pair again."""
        self.release(new)
        self._by_id[old.lease_id] = old
        self._by_key[old.key] = old
        self._push(old)

    def get(self, lease_id: str, now: float) -> Lease | None:
        """The lease if live: known and (busy, or not past its expiry)."""
        lease = self._by_id.get(lease_id)
        if lease is None or (not lease.busy and lease.expiry <= now):
            return None
        return lease

    def renew(self, lease: Lease, lease_ms: int, now: float, now_ms: int) -> None:
        self.set_expiry(lease, lease_ms, now + lease_ms / 1000, now_ms + lease_ms)

    def set_expiry(self, lease: Lease, lease_ms: int, expiry: float, expiry_ms: int) -> None:
        """Move the expiry (a renewal, or taking back one whose write failed)."""
        lease.lease_ms = lease_ms
        lease.expiry = expiry
        lease.expiry_ms = expiry_ms
        self._push(lease)

    def release(self, lease: Lease) -> None:
        if self._by_id.get(lease.lease_id) is lease:
            del self._by_id[lease.lease_id]
            del self._by_key[lease.key]

    def expired(self, now: float) -> list[Lease]:
        """Live, idle leases whose expiry has passed (still in the table: the caller releases them)."""
        out: list[Lease] = []
        busy: list[tuple[float, str]] = []
        seen: set[str] = set()
        while self._expiries and self._expiries[0][0] <= now:
            expiry, lease_id = heapq.heappop(self._expiries)
            lease = self._by_id.get(lease_id)
            if lease is None or lease.expiry != expiry or lease_id in seen:
                continue  # released, renewed (a later entry stands for it), or a duplicate (take_back)
            seen.add(lease_id)
            if lease.busy:
                busy.append((expiry, lease_id))  # looked at again once the finish is over
            else:
                out.append(lease)
        for entry in busy:
            heapq.heappush(self._expiries, entry)
        return out

    def next_expiry(self) -> float | None:
        return self._expiries[0][0] if self._expiries else None

    def leases(self) -> list[Lease]:
        return list(self._by_id.values())

    def of_partition(self, topic: str, partition: int) -> list[Lease]:
        return [x for x in self._by_id.values() if x.topic == topic and x.partition == partition]

    def drop_topic(self, topic: str, partitions: set[int] | None) -> None:
        for lease in [x for x in self._by_id.values() if x.topic == topic and (partitions is None or x.partition in partitions)]:
            self.release(lease)

    def _push(self, lease: Lease) -> None:
        heapq.heappush(self._expiries, (lease.expiry, lease.lease_id))
        if len(self._expiries) > 4 * len(self._by_id) + 64:
            self._expiries = [(x.expiry, x.lease_id) for x in self._by_id.values()]
            heapq.heapify(self._expiries)
