"""Noticing that this coordinator was not running (issue 28: DESIGN.md "A coordinator never counts
time it was not running against brokers' or members' sessions").

A coordinator stopped by SIGSTOP, a suspended VM or a stalled event loop hears no heartbeats
meanwhile; when it runs again every broker's and member's last heartbeat looks as old as the
pause, and expiring them on that evidence moved every partition's leadership and rebalanced every
group (a 20 s SIGSTOP did both). The pause is the coordinator's, not theirs: whoever was alive when
it stopped gets a fresh session from the moment it resumes.

How a pause is seen: the owner's periodic task (the broker liveness monitor, the group ticker)
observes at a short, known interval; every liveness decision observes first. A gap between two
observations much longer than that interval (`threshold_ms`) means nothing ran in between. The gap
is measured on the monotonic clock, never on the injected clocks that sessions use, so a test
that moves a fake clock does not look like a pause. A watch is armed by its owner's loop: callers
without one (unit tests that drive expiry by hand) never see a pause.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class PauseWatch:
    def __init__(self, threshold_ms: int, *, clock_ms: Callable[[], int] = monotonic_ms) -> None:
        if threshold_ms <= 0:
            raise ValueError(f"threshold_ms must be > 0, got {threshold_ms}")
        self.threshold_ms = threshold_ms
        self.clock_ms = clock_ms
        self.pauses = 0
        self._observed_ms: int | None = None  # None: not armed

    def __repr__(self) -> str:
        return f"<PauseWatch threshold_ms={self.threshold_ms} armed={self._observed_ms is not None} pauses={self.pauses}>"

    def arm(self) -> None:
        """Start watching (the owner's loop is running from now on)."""
        self._observed_ms = self.clock_ms()

    def disarm(self) -> None:
        self._observed_ms = None

    def observe(self) -> int:
        """How long this process was not running before now (ms; 0: it was running), and record
        now as observed. A positive answer is given once per pause."""
        if self._observed_ms is None:
            return 0
        now = self.clock_ms()
        gap_ms = now - self._observed_ms
        self._observed_ms = max(self._observed_ms, now)
        if gap_ms <= self.threshold_ms:
            return 0
        self.pauses += 1
        return gap_ms
