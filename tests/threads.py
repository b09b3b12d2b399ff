"""Running one piece of test code in several threads at once."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_in_threads(target: Callable[[], None], count: int, join_timeout_s: float) -> None:
    """target in `count` threads started together; returns once each has been joined (waiting at
    most join_timeout_s for each: the caller's assertions then find what one still running left)."""
    threads = [threading.Thread(target=target) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_timeout_s)
