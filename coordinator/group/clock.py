"""Injected time: the group machine never reads a clock itself.

Handlers take ``now_ms`` as an argument; the service reads it from a `Clock` and tests from a
`FakeClock` they advance by hand. ``now_ms`` is monotonic milliseconds: it orders deadlines
(sessions, poll intervals, the rebalance debounce) and is never persisted.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Monotonic milliseconds (arbitrary origin, never goes backwards)."""
        ...


class MonotonicClock:
    """The real clock, for the service; the machine itself never calls it."""

    __slots__ = ()

    def now_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    def __repr__(self) -> str:
        return "MonotonicClock()"


class FakeClock:
    """A clock that moves only when told to, for tests and simulations."""

    __slots__ = ("_now_ms",)

    def __init__(self, start_ms: int = 0) -> None:
        self._now_ms = start_ms

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, delta_ms: int) -> int:
        if delta_ms < 0:
            raise ValueError(f"time does not go backwards (delta_ms={delta_ms})")
        self._now_ms += delta_ms
        return self._now_ms

    def advance_to(self, when_ms: int) -> int:
        return self.advance(max(0, when_ms - self._now_ms))

    def __repr__(self) -> str:
        return f"FakeClock(now_ms={self._now_ms})"
