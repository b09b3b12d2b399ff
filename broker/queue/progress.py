"""A queue group's durable progress per partition: its acknowledged offset and the delivery count.

Because a partition is worked strictly in order, a (group, partition) has at most one head record
that can have failed, so this is all the retry state there is (O(1) per partition): the next
offset to hand out, how many deliveries of the record there have failed, and the last error.

Where it lives is behind `ProgressStore`. `OffsetProgressStore` keeps it in the broker's
committed-offsets store (dmq.broker.offsets): records of the internal log beside the partition,
replicated with it, written with the same group commit and the same rule that a write is durable
before the caller is answered. Its entries use the group id ``QUEUE_GROUP_PREFIX + group`` so they
never meet a consumer group's (those are ``G_<topic>_<app>``); the delivery count and error ride
in the entry's metadata as JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol

import structlog

from dmq.broker.offsets import OffsetStore

log = structlog.get_logger(__name__)

QUEUE_GROUP_PREFIX = "queue:"
# The last error is kept for operators and the dead-letter headers, not as a log: cap it.
MAX_ERROR_CHARS = 1_000


@dataclass(frozen=True, slots=True)
class Progress:
    acked_offset: int  # the next offset the group will be given
    delivery_count: int = 0  # failed deliveries of the record at acked_offset
    last_error: str = ""


class ProgressStore(Protocol):
    def get(self, topic: str, partition: int, group: str) -> Progress | None: ...

    def groups(self, topic: str, partition: int) -> dict[str, Progress]: ...

    async def save(self, topic: str, partition: int, group: str, progress: Progress) -> None:
        """Durable when it returns; the in-memory view changes only then."""
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
        if only is None:
            self._by_partition.clear()
        else:
            self._by_partition[only] = {}
        for (group_id, topic, partition), committed in self._offsets.items():
            if group_id.startswith(QUEUE_GROUP_PREFIX) and only in (None, (topic, partition)):
                group = group_id[len(QUEUE_GROUP_PREFIX):]
                self._by_partition.setdefault((topic, partition), {})[group] = _decode(
                    committed.offset, committed.metadata
                )

    def get(self, topic: str, partition: int, group: str) -> Progress | None:
        groups = self._by_partition.get((topic, partition))
        return None if groups is None else groups.get(group)

    def groups(self, topic: str, partition: int) -> dict[str, Progress]:
        return self._by_partition.get((topic, partition), {})

    async def save(self, topic: str, partition: int, group: str, progress: Progress) -> None:
        await self._offsets.commit(
            QUEUE_GROUP_PREFIX + group, [(topic, partition, progress.acked_offset, _encode(progress))]
        )
        self._by_partition.setdefault((topic, partition), {})[group] = progress

    def forget_topic(self, topic: str, partitions: set[int] | None) -> None:
        """The partitions were deleted (their rows went with OffsetStore.delete_topic)."""
        for key in [k for k in self._by_partition if k[0] == topic and (partitions is None or k[1] in partitions)]:
            del self._by_partition[key]
