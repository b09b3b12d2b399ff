"""Keyed deadlines: the group machine's timer facility.

A `Timer` holds at most one deadline per key. ``schedule`` replaces a key's deadline,
``cancel`` drops it, ``pop_expired(now_ms)`` hands back due keys in deadline order, and
``next_deadline_ms()`` tells the driver how long it may sleep. Nothing here reads a clock or
runs callbacks: whoever owns the timer decides what a due key means.

Implementation: a heap of ``(deadline_ms, seq, key)`` with lazy deletion (a heap entry counts
only if it is still the key's live entry), compacted when stale entries outnumber live ones, so
a member heartbeating every second does not grow the heap without bound.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

# Compact when the heap holds this many more entries than live keys (and twice as many).
_COMPACT_SLACK = 64


class Timer(Generic[K]):
    __slots__ = ("_live", "_heap", "_seq")

    def __init__(self) -> None:
        self._live: dict[K, tuple[int, int]] = {}  # key -> (deadline_ms, seq)
        self._heap: list[tuple[int, int, K]] = []
        self._seq = 0

    def schedule(self, key: K, deadline_ms: int) -> None:
        self._seq += 1
        self._live[key] = (deadline_ms, self._seq)
        heapq.heappush(self._heap, (deadline_ms, self._seq, key))
        if len(self._heap) > 2 * len(self._live) + _COMPACT_SLACK:
            self._compact()

    def cancel(self, key: K) -> None:
        self._live.pop(key, None)

    def deadline_ms(self, key: K) -> int | None:
        entry = self._live.get(key)
        return None if entry is None else entry[0]

    def __contains__(self, key: object) -> bool:
        return key in self._live

    def __len__(self) -> int:
        return len(self._live)

    def next_deadline_ms(self) -> int | None:
        self._drop_stale_top()
        return self._heap[0][0] if self._heap else None

    def pop_expired(self, now_ms: int) -> K | None:
        """Remove and return the earliest key due at ``now_ms`` (deadline <= now), or None.

        One at a time on purpose: handling a due key may schedule or cancel others.
        """
        self._drop_stale_top()
        if not self._heap or self._heap[0][0] > now_ms:
            return None
        _, _, key = heapq.heappop(self._heap)
        del self._live[key]
        return key

    def keys(self) -> Iterator[K]:
        return iter(list(self._live))

    def _is_live(self, entry: tuple[int, int, K]) -> bool:
        deadline_ms, seq, key = entry
        return self._live.get(key) == (deadline_ms, seq)

    def _drop_stale_top(self) -> None:
        while self._heap and not self._is_live(self._heap[0]):
            heapq.heappop(self._heap)

    def _compact(self) -> None:
        self._heap = [(d, s, k) for k, (d, s) in self._live.items()]
        heapq.heapify(self._heap)

    def __repr__(self) -> str:
        return f"Timer(live={len(self._live)}, next_deadline_ms={self.next_deadline_ms()})"
