"""Quotas: token buckets per principal, enforced by delaying calls, as Kafka throttles.

Three rates per principal: produce bytes/s (a Produce request's batch bytes), fetch bytes/s (a
Fetch answer's bytes) and requests/s (every call). Each has a default for every principal and may
be set per principal; 0 = unlimited. A bucket holds up to one second of its rate (the burst) and
may go into debt: a call that takes more than the bucket holds is served after the debt is paid
back at the rate. The delay is the debt divided by the rate, capped at `max_delay_ms`, so a greedy
client is slowed to its rate and never refused, and since the wait is an asyncio sleep of that
call alone, other principals' calls are not slowed at all.

Produce and requests are charged and waited for before the handler runs; a fetch's bytes are known
only from its answer, so the answer is held back by the fetch's delay (Kafka delays responses the
same way).

Bounded: at most `max_principals` buckets; past it the buckets that are full (idle) are dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = ["QuotaSettings", "Quotas", "Rates"]

DEFAULT_MAX_DELAY_MS = 5_000
DEFAULT_MAX_PRINCIPALS = 10_000
KINDS = ("produce", "fetch", "requests")


@dataclass(frozen=True, slots=True)
class Rates:
    produce_bytes_per_s: int = 0
    fetch_bytes_per_s: int = 0
    requests_per_s: int = 0

    def __post_init__(self) -> None:
        for name in ("produce_bytes_per_s", "fetch_bytes_per_s", "requests_per_s"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0 (0 = unlimited), got {value!r}")

    def of(self, kind: str) -> int:
        if kind == "produce":
            return self.produce_bytes_per_s
        if kind == "fetch":
            return self.fetch_bytes_per_s
        return self.requests_per_s

    @property
    def unlimited(self) -> bool:
        return not (self.produce_bytes_per_s or self.fetch_bytes_per_s or self.requests_per_s)


@dataclass(frozen=True, slots=True)
class QuotaSettings:
    default: Rates = field(default_factory=Rates)
    principals: Mapping[str, Rates] = field(default_factory=dict)
    max_delay_ms: int = DEFAULT_MAX_DELAY_MS

    @property
    def enabled(self) -> bool:
        return not self.default.unlimited or any(not r.unlimited for r in self.principals.values())

    def rates_for(self, principal: str) -> Rates:
        return self.principals.get(principal, self.default)


class _Bucket:
    __slots__ = ("level", "rate", "stamp")

    def __init__(self, rate: int, now: float) -> None:
        self.rate = rate
        self.level = float(rate)  # full: one second of burst
        self.stamp = now

    def charge(self, amount: int, now: float) -> float:
        """Take `amount`; the seconds the caller must wait for the debt (0 when none)."""
        self.level = min(float(self.rate), self.level + (now - self.stamp) * self.rate) - amount
        self.stamp = now
        return -self.level / self.rate if self.level < 0 else 0.0

    def full(self, now: float) -> bool:
        return self.level + (now - self.stamp) * self.rate >= self.rate


class Quotas:
    def __init__(
        self,
        settings: QuotaSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_principals: int = DEFAULT_MAX_PRINCIPALS,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self.max_principals = max_principals
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        # Seconds of delay imposed so far, per kind (dmq_quota_throttle_seconds_total).
        self.throttled_s: dict[str, float] = dict.fromkeys(KINDS, 0.0)

    def __repr__(self) -> str:
        return f"<Quotas default={self.settings.default} buckets={len(self._buckets)}>"

    def delay_s(self, principal: str, kind: str, amount: int) -> float:
        """Charge `amount` (bytes, or 1 request) to the principal's `kind` bucket; the seconds to
        delay the call by (0 when within its rate or unlimited), at most max_delay_ms."""
        rate = self.settings.rates_for(principal).of(kind)
        if rate <= 0 or amount <= 0:
            return 0.0
        now = self._clock()
        key = (principal, kind)
        bucket = self._buckets.get(key)
        if bucket is None or bucket.rate != rate:
            if len(self._buckets) >= self.max_principals * len(KINDS):
                self._buckets = {k: b for k, b in self._buckets.items() if not b.full(now)}
            bucket = self._buckets[key] = _Bucket(rate, now)
        delay = min(bucket.charge(amount, now), self.settings.max_delay_ms / 1000)
        if delay > 0:
            self.throttled_s[kind] = self.throttled_s.get(kind, 0.0) + delay
        return delay
