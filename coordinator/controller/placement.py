"""Where a new partition's replicas go (DESIGN.md "Replication").

Leaders round-robin over the live brokers sorted by id, starting at crc32(topic) mod N so that
partition 0 of different topics lands on different brokers: partition p is led by
live[(start + p) % N] (the placement before replication, unchanged). Its followers are on the next
brokers, spread over racks first when brokers carry rack labels (election.place_replicas).
AddPartitions continues the same sequence over the brokers live then.

A new partition starts with every replica in sync (all are empty) and its first replica leading
at epoch 0.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping

from dmq.coordinator.controller.election import place_replicas
from dmq.coordinator.metastore.base import PartitionRecord


def place_partitions(
    topic: str,
    partitions: Iterable[int],
    replication_factor: int,
    live_broker_ids: Iterable[int],
    racks: Mapping[int, str] | None = None,
) -> dict[int, PartitionRecord]:
    """partition -> its new state, for the given partition numbers. ValueError when there are
    fewer live brokers than replication_factor (callers check first, to say it better)."""
    brokers = sorted(live_broker_ids)
    wanted = sorted(partitions)
    if not wanted:
        return {}
    start = zlib.crc32(topic.encode()) % len(brokers) if brokers else 0
    labelled = {b: r for b, r in (racks or {}).items() if r and b in brokers}
    plan = place_replicas(wanted[-1] + 1, replication_factor, brokers, labelled or None, start=start)
    return {p: PartitionRecord(plan[p], plan[p], plan[p][0]) for p in wanted}
