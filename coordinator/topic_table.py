"""The topics as the metadata service holds them in memory: name -> TopicRecord (placement,
partition states, settings, creator). Loaded from the store at start; every change is written to
the store first and applied here after it commits (dmq.coordinator.store_writes). One table is
shared by topic administration (dmq.coordinator.topic_admin), the controller
(dmq.coordinator.controller.controller) and the reads, so each sees the others' changes at once.
"""

from __future__ import annotations

from dmq.coordinator.metadata_errors import PartitionNotFoundError, UnknownTopicError
from dmq.coordinator.metastore.base import PartitionRecord, TopicRecord
from dmq.proto.names import shorten

StateChanges = dict[tuple[str, int], PartitionRecord]  # (topic, partition) -> its new state


def is_replicated(record: TopicRecord) -> bool:
    """Whether its brokers are sent partition states: some partition has several replicas or has
    moved (an unreplicated, never changed partition keeps the meaning of an empty `states`)."""
    return any(len(s.replicas) > 1 or s.partition_epoch > 0 for s in record.states.values())


class TopicTable(dict[str, TopicRecord]):
    """A dict by topic name, with the reads the parts share."""

    def sorted(self) -> list[TopicRecord]:
        return [self[name] for name in sorted(self)]

    def partitions_led(self, broker_id: int) -> int:
        return sum(1 for t in self.values() for b in t.placement.values() if b == broker_id)

    def partition_state(self, topic: str, partition: int) -> PartitionRecord | None:
        record = self.get(topic)
        return record.states.get(partition) if record else None

    def existing_state(self, topic: str, partition: int) -> PartitionRecord:
        record = self.get(topic)
        if record is None:
            raise UnknownTopicError([topic])
        state = record.states.get(partition)
        if state is None:
            raise PartitionNotFoundError(f"partition: topic {shorten(topic)} has {record.partition_count} partitions, got {partition}")
        return state

    def apply_states(self, changes: StateChanges) -> None:
        """Partition states the store has recorded; a topic deleted meanwhile is left alone."""
        by_topic: dict[str, dict[int, PartitionRecord]] = {}
        for (topic, p), state in changes.items():
            by_topic.setdefault(topic, {})[p] = state
        for topic, states in by_topic.items():
            record = self.get(topic)
            if record is not None:  # deleted meanwhile: nothing to change
                self[topic] = record.with_states(states)
