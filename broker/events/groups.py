"""Consumer groups over attribute partitions: register / stop / start / reset, claim_next, ack,
release, renew. Runs in the event store's writer thread (store.py), so one request at a time sees
and changes the state; time is passed in (`now_ms`), never read here.

A group partitions the store's events by the attributes `partition_by` names (fixed at its first
claim; reset the group to change it). Partitions are discovered from the events that carry all of
them, each distinct value combination one partition, incrementally: every claim_next first looks
at the events appended since the last one.

claim_next, in three steps:
  1. discover new partitions (above);
  2. pick the unclaimed partition whose earliest pending event is oldest (ties: the smallest key).
     Each partition's earliest pending position is kept in memory (`_Pending`), valid up to the
     group's `scanned` end: events appended since are run once through the partitions they belong
     to (only a partition with nothing pending can change), an ack recomputes its one partition
     with one index query, a new partition is computed once when discovered; a heap orders them.
     So a claim costs O(log partitions), not a scan of the log;
  3. fetch that partition's events: those of the handled types after its acknowledged position
     that carry one of its attribute tags (the index), filtered by the conditional AND, each once.
The guard (an append condition after the last returned position: for every handled type, one
item per attribute of the partition that the type declares, any of which fails the append, as
CCC's to_conditions) is built by the client from its event types' declared attributes; the answer
carries the last position for it.

Claims carry the worker id and expire `claim_timeout_ms` after their last renewal; an expired
claim is released the next time anything looks at it (claim, ack, renew, describe): the same
outcome as a timer, with no task to own. A renewing worker's claim never expires. Claims live in
this leader's memory only: a broker that becomes the leader starts its groups from their durable
progress (progress.py: the replicated offsets log) without claims, and workers claim again.

Progress is durable before it is answered: register / stop / start / reset / discovery write
before the view changes; an ack changes the view and hands its write to the caller
(`unwritten`), which answers once it is durable and reloads the groups if it fails.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import structlog

from dmq.broker.events.errors import (
    EventClaimNotHeldError,
    EventGroupNotFoundError,
    EventStoreFullError,
    GroupConflictError,
    InvalidEventRequestError,
)
from dmq.broker.events.index import EventIndex, split_tags
from dmq.broker.events.progress import AckWrite, GroupRecord, ProgressStore
from dmq.broker.events.query import belongs, partition_values
from dmq.proto.event_headers import attributes_of, partition_key

__all__ = ["GroupManager", "Claimed", "PartitionView", "GROUPS_MAX", "PARTITIONS_PER_GROUP_MAX"]

log = structlog.get_logger(__name__)

GROUPS_MAX = 1_000
PARTITIONS_PER_GROUP_MAX = 100_000
SCAN_PAGE = 1_000
DESCRIBE_PENDING_MAX = 100_000


@dataclass(slots=True)
class Claim:
    worker_id: str
    since_ms: int
    expires_ms: int
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class Claimed:
    key: str
    values: dict[str, str]
    events: list[tuple[int, int]]  # (position, batch offset)
    last_position: int


@dataclass(frozen=True, slots=True)
class PartitionView:
    key: str
    values: dict[str, str]
    acked: int
    claimed_by: str
    claimed_since_ms: int
    pending: int


@dataclass(slots=True)
class _Pending:
    """Per group, the earliest pending event of each partition: `first[key]` is the position of
    the first handled event after its acknowledged position that belongs to it, among the events
    up to `scanned` (None: none so far), computed for `types`."""

    scanned: int = 0
    types: tuple[str, ...] = ()
    first: dict[str, int | None] | None = None
    # (position, key) of every partition with something pending, smallest first; an entry whose
    # position is no longer first[key] is stale and skipped (removing it would cost O(n))
    heap: list[tuple[int, str]] = field(default_factory=list)
    idle: int = 0  # partitions with nothing pending (first[key] None): counted, not searched per claim

    def reset(self, first: dict[str, int | None]) -> None:
        self.first = first
        self.idle = sum(1 for p in first.values() if p is None)
        self.heap = [(p, k) for k, p in first.items() if p is not None]
        heapq.heapify(self.heap)

    def set(self, key: str, position: int | None) -> None:
        assert self.first is not None
        old = self.first.get(key, 0)
        self.idle += (position is None) - (key in self.first and old is None)
        self.first[key] = position
        if position is not None:
            heapq.heappush(self.heap, (position, key))


class GroupManager:
    def __init__(self, index: EventIndex, progress: ProgressStore) -> None:
        self._index = index
        self._progress = progress
        self._groups: dict[str, GroupRecord] = progress.load()
        self._claims: dict[tuple[str, str], Claim] = {}
        # group -> (attribute name, value) -> keys of the partitions with that value
        self._by_attr: dict[str, dict[tuple[str, str], set[str]]] = {}
        self._pending: dict[str, _Pending] = {}

    def __repr__(self) -> str:
        return f"<GroupManager groups={len(self._groups)} claims={len(self._claims)}>"

    # -- lifecycle ---------------------------------------------------------------------------------

    def record(self, group: str) -> GroupRecord | None:
        return self._groups.get(group)

    def names(self) -> list[str]:
        return sorted(self._groups)

    def status(self, group: str) -> tuple[bool, bool]:
        """(known, active)."""
        g = self._groups.get(group)
        return (g is not None, g is not None and g.active)

    def register(self, group: str) -> None:
        if group in self._groups:
            return
        if len(self._groups) >= GROUPS_MAX:
            raise EventStoreFullError(f"this event store has {GROUPS_MAX} groups, the limit: delete unused ones")
        g = GroupRecord(group)
        self._progress.put_group(g)
        self._groups[group] = g
        log.info("event group registered", group=group)

    def _get(self, group: str) -> GroupRecord:
        g = self._groups.get(group)
        if g is None:
            raise EventGroupNotFoundError(f"event group {group!r} is not registered on this store: register it first")
        return g

    def set_active(self, group: str, active: bool) -> None:
        g = self._get(group)
        if g.active != active:
            self._progress.put_group(replace(g, active=active))  # durable first, then the view
            g.active = active
            log.info("event group started" if active else "event group stopped", group=group)

    def reset(self, group: str) -> None:
        """Forget every partition and acknowledged position; claims end too (their acks fail)."""
        g = self._get(group)
        g.resets += 1  # first: an ack applied before and written after is then refused (store.write_acks)
        self._progress.reset(g)
        g.partitions.clear()
        g.discovered_end = 0
        self._by_attr.pop(group, None)
        self._pending.pop(group, None)
        for k in [k for k in self._claims if k[0] == group]:
            del self._claims[k]
        log.info("event group reset", group=group)

    # -- claims ------------------------------------------------------------------------------------

    def _live_claim(self, group: str, key: str, now_ms: int) -> Claim | None:
        claim = self._claims.get((group, key))
        if claim is not None and now_ms >= claim.expires_ms:
            del self._claims[(group, key)]
            log.warning("event claim expired: its worker stopped renewing it", group=group, partition=key,
                        worker=claim.worker_id, timeout_ms=claim.timeout_ms)
            return None
        return claim

    def _held(self, group: str, key: str, worker_id: str, now_ms: int) -> Claim:
        self._get(group)
        claim = self._live_claim(group, key, now_ms)
        if claim is None or claim.worker_id != worker_id:
            holder = f"it is held by worker {claim.worker_id!r}" if claim else "it is not claimed (expired or released)"
            raise EventClaimNotHeldError(
                f"worker {worker_id!r} does not hold the claim on partition {key!r} of group {group!r}: {holder}; "
                "claim again"
            )
        return claim

    def ack(
        self, group: str, key: str, worker_id: str, position: int, now_ms: int, head: int,
        *, unwritten: list[AckWrite] | None = None,
    ) -> None:
        """Advance the partition's acknowledged position and release its claim. Written durably
        before the view changes, or (`unwritten` given) the view changes now and the write is
        appended to `unwritten`: the caller writes it outside the writer thread (so concurrent
        acks share an fsync and the writer goes on) and answers only once it is durable; if that
        write fails, the caller reloads the groups from what is durable (store.write_acks)."""
        self._held(group, key, worker_id, now_ms)
        g = self._groups[group]
        values, acked = g.partitions[key]
        if not acked <= position <= head:
            raise InvalidEventRequestError(
                f"position must be within {acked}..{head} (the partition's acknowledged position .. the store's "
                f"head), got {position}"
            )
        if position != acked:
            if unwritten is None:
                self._progress.put_ack(group, key, values, position)
            else:
                unwritten.append(AckWrite(group, key, values, position, g, g.resets))
            g.partitions[key] = (values, position)
            pending = self._pending.get(group)
            if pending is not None and pending.first is not None:
                first = pending.first.get(key)
                if first is not None and first <= position:
                    pending.set(key, self._first_pending(g, key, pending.scanned))
        del self._claims[(group, key)]

    def release(self, group: str, key: str, worker_id: str, now_ms: int) -> None:
        self._held(group, key, worker_id, now_ms)
        del self._claims[(group, key)]

    def renew(self, group: str, key: str, worker_id: str, now_ms: int) -> None:
        claim = self._held(group, key, worker_id, now_ms)
        claim.expires_ms = now_ms + claim.timeout_ms

    # -- claim_next --------------------------------------------------------------------------------

    def claim_next(
        self,
        group: str,
        partition_by: Sequence[str],
        handled_types: Sequence[str],
        worker_id: str,
        *,
        limit: int,
        timeout_ms: int,
        until: int,
        now_ms: int,
    ) -> Claimed | None:
        """The next partition with pending events, claimed for `worker_id` (None: nothing pending,
        all claimed, or the group is stopped). `until`: the readable log end (positions <= it)."""
        g = self._get(group)
        if not g.active:
            return None
        self._settle(g, tuple(partition_by), tuple(handled_types))
        self._discover(g, until)
        pending = self._advance(g, until)
        key = self._pop_unclaimed(pending, group, now_ms)
        if key is None:
            return None
        values, acked = g.partitions[key]
        events = self._fetch(values, g.handled_types, acked, until, limit)
        self._claims[(group, key)] = Claim(worker_id, now_ms, now_ms + timeout_ms, timeout_ms)
        return Claimed(key, values, events, events[-1][0] if events else acked)

    def _settle(self, g: GroupRecord, partition_by: tuple[str, ...], handled: tuple[str, ...]) -> None:
        """The first claim fixes partition_by; handled types may change from claim to claim (the
        last ones are kept for describe)."""
        if g.partition_by and g.partition_by != partition_by:
            raise GroupConflictError(
                f"group {g.name!r} partitions by {list(g.partition_by)}, not {list(partition_by)}: "
                "reset the group to change it"
            )
        if g.partition_by != partition_by or g.handled_types != handled:
            self._progress.put_group(replace(g, partition_by=partition_by, handled_types=handled))
            g.partition_by, g.handled_types = partition_by, handled

    def _attr_map(self, g: GroupRecord) -> dict[tuple[str, str], set[str]]:
        m = self._by_attr.get(g.name)
        if m is None:
            m = {}
            for key, (values, _) in g.partitions.items():
                for item in values.items():
                    m.setdefault(item, set()).add(key)
            self._by_attr[g.name] = m
        return m

    def _discover(self, g: GroupRecord, until: int) -> None:
        if until <= g.discovered_end:
            return
        m = self._attr_map(g)
        found: dict[str, dict[str, str]] = {}
        for _position, tags in self._index.with_attribute(g.partition_by[0], g.discovered_end, until):
            values = partition_values(g.partition_by, split_tags(tags))
            if values is None:
                continue
            key = partition_key(values)
            if key in g.partitions or key in found:
                continue
            if len(g.partitions) + len(found) >= PARTITIONS_PER_GROUP_MAX:
                raise EventStoreFullError(
                    f"group {g.name!r} has {PARTITIONS_PER_GROUP_MAX} partitions, the limit: partition by "
                    "fewer attribute combinations"
                )
            found[key] = values
        if found:  # `discovered_end` alone need not be durable: rediscovering finds the same partitions
            self._progress.put_partitions(g, found, until)
        for key, values in found.items():
            g.partitions[key] = (values, 0)
            for item in values.items():
                m.setdefault(item, set()).add(key)
        g.discovered_end = until

    def _candidates(self, g: GroupRecord, tags: list[str]) -> set[str]:
        """The known partitions an event with these tags belongs to."""
        attrs = attributes_of(tags)
        present = [(n, attrs[n]) for n in g.partition_by if n in attrs]
        if not present:
            return set()
        if len(present) == len(g.partition_by):
            key = partition_key(dict(present))
            return {key} if key in g.partitions else set()
        m = self._attr_map(g)
        keys: set[str] | None = None
        for item in present:
            have = m.get(item, set())
            keys = set(have) if keys is None else keys & have
            if not keys:
                return set()
        return keys or set()

    def _first_pending(self, g: GroupRecord, key: str, until: int) -> int | None:
        values, acked = g.partitions[key]
        found = self._fetch(values, g.handled_types, acked, until, 1)
        return found[0][0] if found else None

    def _pop_unclaimed(self, pending: _Pending, group: str, now_ms: int) -> str | None:
        """The unclaimed partition with the smallest (earliest pending position, key)."""
        assert pending.first is not None
        heap, first = pending.heap, pending.first
        claimed: list[tuple[int, str]] = []
        found = None
        while heap:
            position, key = heap[0]
            if first.get(key) != position:
                heapq.heappop(heap)  # stale
            elif self._live_claim(group, key, now_ms) is not None:
                claimed.append(heapq.heappop(heap))  # put back below: pending once released
            else:
                found = key
                break
        for entry in claimed:
            heapq.heappush(heap, entry)
        return found

    def _advance(self, g: GroupRecord, until: int) -> _Pending:
        """Every partition's earliest pending position as of `until` (see _Pending)."""
        pending = self._pending.setdefault(g.name, _Pending())
        if pending.first is None or pending.types != g.handled_types:
            # first use (or other handled types): one query per partition
            pending.types = g.handled_types
            pending.reset({key: self._first_pending(g, key, until) for key in g.partitions})
            pending.scanned = until
            return pending
        first = pending.first
        if len(first) != len(g.partitions):  # discovered since: computed once
            for key in g.partitions.keys() - first.keys():
                pending.set(key, self._first_pending(g, key, pending.scanned))
        cursor = pending.scanned
        while cursor < until and pending.idle:
            rows = self._index.of_types(g.handled_types, cursor, until, SCAN_PAGE)
            for position, tags in rows:
                for key in self._candidates(g, split_tags(tags)):
                    if first[key] is None and g.partitions[key][1] < position:
                        pending.set(key, position)
            if len(rows) < SCAN_PAGE:
                break
            cursor = rows[-1][0]
        pending.scanned = until
        return pending

    def _fetch(
        self, values: dict[str, str], types: Sequence[str], acked: int, until: int, limit: int | None
    ) -> list[tuple[int, int]]:
        tags = [f"{n}:{v}" for n, v in values.items()]
        out = []
        for position, event_tags, batch in self._index.with_any_tag(tags, types, acked, until):
            if belongs(values, split_tags(event_tags)):
                out.append((position, batch))
                if limit is not None and len(out) >= limit:
                    break
        return out

    # -- describe ---------------------------------------------------------------------------------

    def describe(self, group: str, until: int, now_ms: int, max_partitions: int) -> tuple[GroupRecord, list[PartitionView]]:
        g = self._get(group)
        if g.partition_by:
            self._discover(g, until)
        views = []
        for key in sorted(g.partitions)[:max_partitions]:
            values, acked = g.partitions[key]
            claim = self._live_claim(group, key, now_ms)
            pending = len(self._fetch(values, g.handled_types, acked, until, DESCRIBE_PENDING_MAX)) if g.handled_types else 0
            views.append(PartitionView(key, values, acked, claim.worker_id if claim else "",
                                       claim.since_ms if claim else 0, pending))
        return g, views
