"""Which partition a record goes to.

Keyed records: ``partition = zlib.crc32(key) % partition_count``.

CRC-32 here is the ISO-HDLC / IEEE 802.3 polynomial (0xEDB88320 reflected), the one of zip, PNG,
Java's ``java.util.zip.CRC32``, Go's ``hash/crc32.ChecksumIEEE`` and Python's ``zlib.crc32``: any
client in any language can place a key on the same partition. It was chosen over Kafka's murmur2
because it runs in C in the standard library (about 50 ns for a short key against microseconds for
murmur2 in pure Python). The mapping is part of the wire contract: changing it moves keys to other
partitions and breaks per-key ordering across the change, so tests pin known values.

Records without a key but with a transaction id are placed by the same function of the id's UTF-8
bytes: a transaction sent again (a producer restart, a retry by the application) lands on the
partition that stored it, whose leader de-duplicates it (broker/log/dedup.py).

Records without a key or transaction id use sticky partitioning: a producer thread keeps appending to one partition
until that batch is sealed (full or shipped), then moves to the next partition in a round robin
shared by all threads, so batches are big and load still spreads evenly.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Sequence

__all__ = ["Partitioner", "crc32_partition", "StickyChooser"]

# (key, partition_count) -> partition in [0, partition_count)
Partitioner = Callable[[bytes, int], int]


def crc32_partition(key: bytes, partition_count: int) -> int:
    """The default key partitioner: zlib.crc32(key) % partition_count (crc32 is unsigned)."""
    return zlib.crc32(key) % partition_count


class StickyChooser:
    """Round robin over a topic's available partitions, advanced once per sealed sticky batch.

    ``next(topic, available)`` is safe from any thread: itertools.count's ``next`` is a single C
    call, so two threads never get the same tick.
    """

    def __init__(self) -> None:
        self._counters: dict[str, itertools.count[int]] = {}

    def next(self, topic: str, available: Sequence[int]) -> int:
        counter = self._counters.get(topic)
        if counter is None:
            # Start each topic at a different place so many producers do not all begin at 0.
            counter = self._counters.setdefault(topic, itertools.count(zlib.crc32(topic.encode()) + id(self)))
        return available[next(counter) % len(available)]
