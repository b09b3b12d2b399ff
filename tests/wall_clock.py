"""The wall clock as brokers read it, for tests that compare a time with records' append times.

A broker stamps each batch with `time.time_ns() // 1_000_000` taken under the partition lock
(broker/log/partition.py wall_clock_ms). A test that reads the clock right after an append was
acknowledged can read the very millisecond that batch was stamped with, so "the first record at
or after now" is that batch, not the next one (issue 33: offsets_for_times found offset 2, not 3,
in about one run in three). A fixed sleep between the two only makes that unlikely.
"""

from __future__ import annotations

import time


def wall_ms() -> int:
    """The wall clock in ms, read as the broker reads it."""
    return time.time_ns() // 1_000_000


def wait_wall_clock_past(ms: int, slack_s: float = 5.0) -> int:
    """Wait until the wall clock reads later than `ms` and return that reading: polled, with a
    deadline (a clock that does not move fails the test rather than hanging it)."""
    deadline = time.monotonic() + max(0, ms - wall_ms()) / 1000 + slack_s
    while (now := wall_ms()) <= ms:
        if time.monotonic() > deadline:
            raise AssertionError(f"the wall clock did not pass {ms} ms (it reads {now})")
        time.sleep(min(0.05, max(0.0005, (ms - now) / 2000)))
    return now


def ms_after_acknowledged() -> int:
    """A wall-clock ms later than the append time of every batch acknowledged before the call,
    and not later than that of any batch appended after it returns.

    A batch acknowledged before the call was stamped at or before the ms read first here; the ms
    returned is the first one after it."""
    return wait_wall_clock_past(wall_ms())
