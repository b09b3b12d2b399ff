"""Clocks a test moves by hand, for code that takes its clock as a callable."""

from __future__ import annotations


class ManualClock:
    """Seconds: calling it returns `now`, which the test sets or advances."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class ManualClockMs:
    """Milliseconds: calling it returns `now_ms`, which the test sets or advances."""

    def __init__(self, now_ms: int = 1_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms
