"""ConsumerRecords: what poll() returns, and the small value types of the consumer API.

poll() hands over sequences of ``dmq.client.records.ConsumerRecord`` (NamedTuples built in C from
a batch's columns as a loop or an index reaches them: ``RecordSequence``, which compares equal to
a list of the same records) grouped by partition; ConsumerRecords only wraps that dict, so
iterating it is ``chain.from_iterable`` over the sequences and costs no Python code per record.

Two habits meet in it. kafka-python's poll() returns a dict {TopicPartition: [records]}, read
with ``.items()``, ``[tp]``, ``.get(tp)``, ``tp in``; Java's ConsumerRecords is iterated for
its records. ConsumerRecords answers both: the mapping methods are the dict's (``[tp]`` of a
partition without records raises KeyError, as the dict does), while iterating it and len()
give records (Java's), not partitions.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, KeysView, Mapping, Sequence, ValuesView
from itertools import chain
from typing import Any, NamedTuple

from dmq.client.records import ConsumerRecord

__all__ = ["TopicPartition", "OffsetAndMetadata", "OffsetAndTimestamp", "ConsumerRecords", "ConsumerRecord"]


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


class OffsetAndMetadata(NamedTuple):
    """A committed position: the next offset to consume, plus free-form metadata (<= 4096 chars)."""

    offset: int
    metadata: str = ""


class OffsetAndTimestamp(NamedTuple):
    """What offsets_for_times() finds (kafka-python's): the first record appended at or after the
    time asked, and that record's own timestamp (ms)."""

    offset: int
    timestamp: int


class ConsumerRecords:
    """The records of one poll(), in offset order within each partition."""

    __slots__ = ("_by_partition", "_count")

    def __init__(self, by_partition: Mapping[TopicPartition, Sequence[ConsumerRecord]] | None = None) -> None:
        self._by_partition = dict(by_partition or {})
        self._count = sum(map(len, self._by_partition.values()))

    def __iter__(self) -> Iterator[ConsumerRecord]:
        return chain.from_iterable(self._by_partition.values())

    def __len__(self) -> int:
        return self._count

    def count(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def is_empty(self) -> bool:
        return self._count == 0

    def partitions(self) -> list[TopicPartition]:
        """The partitions that have records in this poll."""
        return list(self._by_partition)

    def records(self, partition: TopicPartition) -> Sequence[ConsumerRecord]:
        """The records of one partition (empty when it has none in this poll)."""
        return self._by_partition.get(partition, [])

    # The dict kafka-python's poll() returns: {TopicPartition: [records]}.

    def __getitem__(self, partition: TopicPartition) -> Sequence[ConsumerRecord]:
        """The records of one partition; KeyError when it has none in this poll (the dict's rule)."""
        return self._by_partition[partition]

    def get(self, partition: TopicPartition, default: Any = None) -> Any:
        return self._by_partition.get(partition, default)

    def __contains__(self, partition: object) -> bool:
        """Whether a TopicPartition has records in this poll (a dict's key test)."""
        return partition in self._by_partition

    def keys(self) -> KeysView[TopicPartition]:
        return self._by_partition.keys()

    def values(self) -> ValuesView[Sequence[ConsumerRecord]]:
        return self._by_partition.values()

    def items(self) -> ItemsView[TopicPartition, Sequence[ConsumerRecord]]:
        return self._by_partition.items()

    def by_partition(self) -> dict[TopicPartition, Sequence[ConsumerRecord]]:
        return dict(self._by_partition)

    def __repr__(self) -> str:
        parts = ", ".join(f"{tp}: {len(rs)}" for tp, rs in self._by_partition.items())
        return f"<ConsumerRecords count={self._count} {{{parts}}}>"
