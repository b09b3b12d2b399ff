"""Waiting for a condition under a deadline: the one polling loop of the tests that wait for a
state of real servers and processes (a bound on each wait, never a timed assertion).

- `wait_for`: the predicate's first truthy value (what was waited for: a URL, a list, True).
- `seconds_until`: how long the predicate took to hold (takeover and failover tests print it or
  compare it with a bound).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["seconds_until", "wait_for"]


def wait_for(predicate: Callable[[], Any], what: str, timeout_s: float, poll_s: float = 0.1) -> Any:
    """predicate()'s first truthy value, polled every poll_s; AssertionError naming `what` and the
    last value after timeout_s."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(poll_s)  # polling a condition under a deadline
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")


def seconds_until(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.02) -> float:
    """Seconds until predicate() held; AssertionError "no <what> within <timeout_s>s" after timeout_s."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"no {what} within {timeout_s:.1f}s")
        time.sleep(poll_s)  # polling a condition under a deadline
    return time.monotonic() - started
