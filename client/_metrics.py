"""Client-side metrics in Kafka's spirit (`Producer.metrics()`, the consumers' `metrics()`).

Rates and request latencies are over a sliding window of WINDOW_S seconds (Kafka's clients use
samples of 30 s in all): `Windowed` keeps one bucket per second, so a reading costs at most
WINDOW_S buckets and recording is O(1). Totals count from the client's creation. Recorded once
per request or per poll, never per record, from the client's own threads; read from any thread,
hence the lock.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 30


class Windowed:
    """Sums, counts and the maximum of what was recorded in the last `window_s` whole seconds."""

    __slots__ = ("window_s", "_clock", "_buckets", "_started")

    def __init__(self, window_s: int = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._buckets: deque[list[float]] = deque()  # [second, sum, count, max]
        self._started = clock()

    def __repr__(self) -> str:
        return f"<Windowed window_s={self.window_s} buckets={len(self._buckets)}>"

    def record(self, value: float, count: int = 1) -> None:
        second = int(self._clock())
        if self._buckets and self._buckets[-1][0] == second:
            b = self._buckets[-1]
            b[1] += value
            b[2] += count
            if value > b[3]:
                b[3] = value
        else:
            self._buckets.append([second, value, count, value])
            while self._buckets and self._buckets[0][0] <= second - self.window_s:
                self._buckets.popleft()

    def _live(self) -> list[list[float]]:
        oldest = int(self._clock()) - self.window_s
        return [b for b in self._buckets if b[0] > oldest]

    def _elapsed(self) -> float:
        return min(float(self.window_s), max(self._clock() - self._started, 1e-3))

    def rate(self) -> float:
        """The values' sum per second over the window (or since creation, when younger)."""
        return sum(b[1] for b in self._live()) / self._elapsed()

    def count_rate(self) -> float:
        """Recordings per second over the window."""
        return sum(b[2] for b in self._live()) / self._elapsed()

    def avg(self) -> float:
        live = self._live()
        count = sum(b[2] for b in live)
        return sum(b[1] for b in live) / count if count else 0.0

    def max(self) -> float:
        return max((b[3] for b in self._live()), default=0.0)


class ClientStats:
    """What the producer's sender and the consumers' fetches record; `snapshot()` is `metrics()`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self.records = Windowed(clock=clock)
        self.bytes = Windowed(clock=clock)
        self.requests = Windowed(clock=clock)  # value: latency in seconds
        self.commits = Windowed(clock=clock)
        self.record_total = 0
        self.byte_total = 0
        self.request_total = 0
        self.request_error_total = 0
        self.commit_total = 0
        self.rebalance_total = 0
        self.records_lag_max = 0  # the largest lag of an assigned partition at the last fetch

    def __repr__(self) -> str:
        return f"<ClientStats records={self.record_total} bytes={self.byte_total} requests={self.request_total}>"

    def request(self, latency_s: float, *, ok: bool = True) -> None:
        with self._lock:
            self.requests.record(latency_s)
            self.request_total += 1
            if not ok:
                self.request_error_total += 1

    def transferred(self, records: int, size: int) -> None:
        with self._lock:
            self.records.record(records)
            self.bytes.record(size)
            self.record_total += records
            self.byte_total += size

    def committed(self) -> None:
        with self._lock:
            self.commits.record(1)
            self.commit_total += 1

    def rebalanced(self) -> None:
        with self._lock:
            self.rebalance_total += 1

    def lag(self, lag_max: int) -> None:
        with self._lock:
            self.records_lag_max = lag_max

    def snapshot(self, direction: str) -> dict[str, float]:
        """`direction` is "send" (producer) or "consumed" (consumers), Kafka's words."""
        with self._lock:
            out: dict[str, float] = {
                f"record_{direction}_rate": self.records.rate(),
                f"record_{direction}_total": self.record_total,
                f"bytes_{direction}_rate": self.bytes.rate(),
                f"bytes_{direction}_total": self.byte_total,
                "request_rate": self.requests.count_rate(),
                "request_total": self.request_total,
                "request_error_total": self.request_error_total,
                "request_latency_avg_ms": self.requests.avg() * 1000,
                "request_latency_max_ms": self.requests.max() * 1000,
            }
            return out

    def consumer_snapshot(self) -> dict[str, float]:
        out = self.snapshot("consumed")
        with self._lock:
            out.update({
                "records_lag_max": self.records_lag_max,
                "commit_rate": self.commits.rate(),
                "commit_total": self.commit_total,
                "rebalance_total": self.rebalance_total,
            })
        return out
