"""Transaction ids of one partition: which were stored within the de-duplication window, and where.

A record carrying a transaction id (header ``dmq.txn``, see dmq.proto.records) is stored once per
partition within the topic's ``dedup_window_ms``: a later record with the same id is acknowledged
with the offset of the first and not written. The producer sends records with a transaction id
and no key to the partition the id hashes to, so duplicates meet on one leader.

State: ``id -> (offset, append_time_ms)`` in append order (a dict keeps insertion order, and append
times are monotonic per partition), so expiry pops from the front. It is not persisted: the log is
the truth, and the first transactional append after a (re)start rebuilds the map from the log's
last ``dedup_window_ms`` (the time index finds where that starts; only batches flagged with
transaction ids are decoded).

Memory is bounded twice: by the window, and by ``max_entries`` per partition. Policy at the cap:
the OLDEST id is forgotten early (eviction, as Kafka forgets idle producer ids), and the broker
logs a warning naming the partition and the effective window then left. Why not refuse the
produce: a refusal stops every transactional producer of the partition until the window passes,
for the sake of retries that are usually seconds, not minutes, old; eviction keeps the guarantee
for the newest ``max_entries`` ids and says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

__all__ = ["DEFAULT_MAX_ENTRIES", "TransactionIds"]

DEFAULT_MAX_ENTRIES = 200_000  # ~40 MB of ids of 20-40 characters, in one partition at most


class TransactionIds:
    """See the module docstring. Callers hold the partition's lock."""

    __slots__ = ("window_ms", "max_entries", "entries", "evicted")

    def __init__(self, window_ms: int, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if window_ms <= 0 or max_entries <= 0:
            raise ValueError(f"window_ms ({window_ms}) and max_entries ({max_entries}) must be > 0")
        self.window_ms = window_ms
        self.max_entries = max_entries
        # id -> (offset, append_time_ms), oldest first; read directly by the append path (a
        # lookup per record, where a method call would cost as much as the lookup)
        self.entries: dict[str, tuple[int, int]] = {}
        self.evicted = 0  # ids forgotten before their window ended (the cap)

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return (
            f"TransactionIds(entries={len(self.entries)}, window_ms={self.window_ms}, "
            f"max_entries={self.max_entries}, evicted={self.evicted})"
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def expire(self, now_ms: int) -> None:
        """Forget the ids stored before now_ms - window_ms."""
        ids = self.entries
        oldest = now_ms - self.window_ms
        while ids:
            first = next(iter(ids))
            if ids[first][1] >= oldest:
                break
            del ids[first]

    def get(self, txn_id: str) -> int | None:
        """The offset the id was stored at within the window, or None."""
        entry = self.entries.get(txn_id)
        return None if entry is None else entry[0]

    def add(self, txn_id: str, offset: int, append_time_ms: int) -> int | None:
        """Remember a stored id; returns the append time of an id evicted for room (None: none)."""
        return self.add_all(((txn_id, offset),), append_time_ms)

    def add_all(self, stored: Iterable[tuple[str | None, int]], append_time_ms: int) -> int | None:
        """Remember the ids of records stored at append_time_ms ((id or None, offset) each);
        returns the append time of the newest id evicted for room (None: none was)."""
        ids = self.entries
        cap = self.max_entries
        evicted_time = None
        for txn_id, offset in stored:
            if txn_id is None:
                continue
            if txn_id in ids:
                del ids[txn_id]  # stored again after its window: it moves to the end
            elif len(ids) >= cap:
                evicted_time = ids.pop(next(iter(ids)))[1]
                self.evicted += 1
            ids[txn_id] = (offset, append_time_ms)
        return evicted_time

    def truncate(self, offset: int) -> None:
        """The log was cut back to `offset`: forget the ids stored at or beyond it."""
        for txn_id in [t for t, (o, _) in self.entries.items() if o >= offset]:
            del self.entries[txn_id]
