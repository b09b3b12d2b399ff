"""A queue group's durable state per partition: its acknowledged offset, the delivery count, and
its live lease.

Because a partition is worked strictly in order, a (group, partition) has at most one head record
that can have failed, so this is all the retry state there is (O(1) per partition): the next
offset to hand out, how many deliveries of the record there have failed, and the last error.

Where it lives is behind `ProgressStore`. `OffsetProgressStore` keeps it in the broker's
committed-offsets store (dmq.broker.offsets): records of the internal log beside the partition,
replicated with it, written with the same group commit and the same rule that a write is durable
(fsynced, and on every in-sync replica) before the caller is answered. Its entries use the key
``QUEUE_GROUP_PREFIX + group`` so they never meet a consumer group's (those are
``G_<topic>_<app>``); the delivery count and error ride in the entry's metadata as JSON.

The group's lease on the partition is the entry ``LEASE_KEY_PREFIX + group`` beside it (issue 15
item 6: a lease must survive a failover): written when it is granted, renewed or narrowed by a
reject, and tombstoned when it ends (ack, nack, expiry), in the same batch as the progress that
ends it, so "acknowledged" and "lease ended" are one record batch and one fsync. Its value is the
lease's start offset and, as JSON, its id, end offset, length and wall-clock expiry: a new leader
replays the log and rebuilds its lease table from them (dmq.broker.queue.manager).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Final, Protocol

import structlog

from dmq.broker.offsets import CommittedOffset, OffsetStore
from dmq.broker.queue.leases import Lease, StoredLease

log = structlog.get_logger(__name__)

QUEUE_GROUP_PREFIX = "queue:"
# A queue group's lease entry; as long as QUEUE_GROUP_PREFIX, so a group that fits one fits both.
LEASE_KEY_PREFIX = "lease:"
# The last error is kept for operators and the dead-letter headers, not as a log: cap it.
MAX_ERROR_CHARS = 1_000


@dataclass(frozen=True, slots=True)
class Progress:
    acked_offset: int  # the next offset the group will be given
    delivery_count: int = 0  # failed deliveries of the record at acked_offset
    last_error: str = ""


class _LeaseEnded:
    """`save(..., lease=LEASE_ENDED)`: the group's lease on the partition ended (a tombstone)."""

    def __repr__(self) -> str:
        return "LEASE_ENDED"


LEASE_ENDED: Final = _LeaseEnded()


class ProgressStore(Protocol):
    def get(self, topic: str, partition: int, group: str) -> Progress | None: ...

    def groups(self, topic: str, partition: int) -> dict[str, Progress]: ...

    def stored_leases(self, topic: str, partition: int) -> dict[str, StoredLease]:
        """The live lease entries of one partition, by group (for a new leader's lease table)."""
        ...

    def lease_partitions(self) -> set[tuple[str, int]]:
        """Every (topic, partition) with a live lease entry (for the lease table at broker start)."""
        ...

    async def save(
        self, topic: str, partition: int, group: str, progress: Progress | None,
        lease: Lease | _LeaseEnded | None = None,
    ) -> None:
        """Durable when it returns, in one batch: the progress (None: unchanged) and the lease
        (written live, LEASE_ENDED: ended, None: unchanged). The in-memory view changes only then."""
        ...

    def forget_topic(self, topic: str, partitions: set[int] | None) -> None: ...


def _encode(progress: Progress) -> str:
    return json.dumps({"deliveries": progress.delivery_count, "error": progress.last_error[:MAX_ERROR_CHARS]})


def _decode(offset: int, metadata: str) -> Progress:
    try:
        data = json.loads(metadata) if metadata else {}
        return Progress(offset, int(data.get("deliveries", 0)), str(data.get("error", "")))
    except (ValueError, TypeError, AttributeError):
        # A row this module did not write: keep the offset, start the count afresh.
        log.warning("queue progress metadata unreadable; delivery count reset", offset=offset)
        return Progress(offset)


def _encode_lease(lease: Lease) -> CommittedOffset:
    metadata = json.dumps(
        {"id": lease.lease_id, "end": lease.end_offset, "lease_ms": lease.lease_ms, "expiry_ms": lease.expiry_ms}
    )
    return CommittedOffset(lease.start_offset, metadata, int(time.time() * 1000))


def _decode_lease(entry: CommittedOffset) -> StoredLease | None:
    try:
        data = json.loads(entry.metadata)
        return StoredLease(
            str(data["id"]), entry.offset, int(data["end"]), int(data["lease_ms"]), int(data["expiry_ms"])
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        # Not this module's: no lease (its records go to the next pop, as after an expiry).
        log.warning("queue lease entry unreadable; ignored", offset=entry.offset)
        return None


class OffsetProgressStore:
    """ProgressStore over the broker's OffsetStore, with an index by partition for pops."""

    def __init__(self, offsets: OffsetStore) -> None:
        self._offsets = offsets
        self._by_partition: dict[tuple[str, int], dict[str, Progress]] = {}
        # the partition's commits were replayed (this broker became its leader): so is its index
        offsets.add_reload_listener(lambda topic, partition: self.load((topic, partition)))

    def __repr__(self) -> str:
        return f"<OffsetProgressStore partitions={len(self._by_partition)}>"

    def load(self, only: tuple[str, int] | None = None) -> None:
        """Build the index from the open OffsetStore (at broker start), or one partition's."""
        if only is not None:
            self._by_partition[only] = {
                key[len(QUEUE_GROUP_PREFIX):]: _decode(c.offset, c.metadata)
                for key, c in self._offsets.partition_items(*only).items()
                if key.startswith(QUEUE_GROUP_PREFIX)
            }
            return
        self._by_partition.clear()
        for (key, topic, partition), committed in self._offsets.items():
            if key.startswith(QUEUE_GROUP_PREFIX):
                group = key[len(QUEUE_GROUP_PREFIX):]
                self._by_partition.setdefault((topic, partition), {})[group] = _decode(
                    committed.offset, committed.metadata
                )

    def get(self, topic: str, partition: int, group: str) -> Progress | None:
        groups = self._by_partition.get((topic, partition))
        return None if groups is None else groups.get(group)

    def groups(self, topic: str, partition: int) -> dict[str, Progress]:
        return self._by_partition.get((topic, partition), {})

    def stored_leases(self, topic: str, partition: int) -> dict[str, StoredLease]:
        out = {}
        for key, entry in self._offsets.partition_items(topic, partition).items():
            if key.startswith(LEASE_KEY_PREFIX) and (stored := _decode_lease(entry)) is not None:
                out[key[len(LEASE_KEY_PREFIX):]] = stored
        return out

    def lease_partitions(self) -> set[tuple[str, int]]:
        return {(t, p) for (key, t, p), _ in self._offsets.items() if key.startswith(LEASE_KEY_PREFIX)}

    async def save(
        self, topic: str, partition: int, group: str, progress: Progress | None,
        lease: Lease | _LeaseEnded | None = None,
    ) -> None:
        entries: list[tuple[str, CommittedOffset | None]] = []
        now_ms = int(time.time() * 1000)
        if progress is not None:
            entries.append(
                (QUEUE_GROUP_PREFIX + group, CommittedOffset(progress.acked_offset, _encode(progress), now_ms))
            )
        if isinstance(lease, Lease):
            entries.append((LEASE_KEY_PREFIX + group, _encode_lease(lease)))
        elif lease is LEASE_ENDED:
            entries.append((LEASE_KEY_PREFIX + group, None))
        if not entries:
            return
        await self._offsets.put(topic, partition, entries)
        if progress is not None:
            self._by_partition.setdefault((topic, partition), {})[group] = progress

    def forget_topic(self, topic: str, partitions: set[int] | None) -> None:
        """The partitions were deleted (their rows went with OffsetStore.delete_topic)."""
        for key in [k for k in self._by_partition if k[0] == topic and (partitions is None or k[1] in partitions)]:
            del self._by_partition[key]
