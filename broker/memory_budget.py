"""Bytes in flight on one broker: fetch answers and produce requests share one bounded budget.

Without it, 40 unread 45 MB fetches took the broker to 2.9 GB and a produce flood left 1.49 GB
behind. Every Produce holds its batch's size and every Fetch its answer's size from before the
bytes exist (a fetch reserves before it reads) until they are gone (a produce: appended; a fetch:
the RPC is over, i.e. gRPC has sent the answer or given up on it).

Backpressure, not growth: a request that does not fit waits, at most until its deadline (or
MAX_WAIT_S), then gets RESOURCE_EXHAUSTED with a message naming the limit. Waiters are bounded too
(their bytes, held by gRPC already, may not exceed the budget), so holding memory stays bounded.

Fairness, in two rules:
  1. no single request reserves more than `max_request_bytes` (a fetch is answered with less data
     instead; Kafka's rule of at least one whole batch still holds, the batch is accounted as read);
  2. large requests (over `small_request_bytes`) may fill only `large_share` of the budget; the rest
     is kept for small ones, so a small producer is never starved by big fetches or a flood of
     large batches.
  3. large produce requests take turns: at most `large_in_service` of them are being appended at
     a time (the wait for the fsync is outside the turn). Each costs milliseconds of the event loop (copies,
     CRC); 32 of them in progress at once put ~130 ms of work ahead of every small request in the
     loop's queue, so a small producer's latency was that of the flood. Taking turns bounds the work
     queued ahead of it to a couple of large requests. The appends themselves now run in the
     broker's append threads (broker.appender.Appender, as many threads as turns), so the turns
     also bound how many large batches wait for those threads.
Waiters are woken in order, skipping those that do not fit yet, so a small request is not queued
behind a large one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

DEFAULT_LIMIT_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024
DEFAULT_SMALL_REQUEST_BYTES = 1024 * 1024
DEFAULT_LARGE_SHARE = 0.75
DEFAULT_LARGE_IN_SERVICE = 2
# A request without a deadline waits at most this long for room.
MAX_WAIT_S = 30.0
# A waiter gives up this long before its deadline, so that the client hears the broker's reason
# (RESOURCE_EXHAUSTED naming the limit) rather than its own DEADLINE_EXCEEDED.
DEADLINE_MARGIN_S = 0.05


class BudgetExhaustedError(Exception):
    """No room in the budget before the request's deadline."""


@dataclass(slots=True)
class _Waiter:
    size: int
    future: asyncio.Future[None]


class Lease:
    """Bytes held in a budget; `resize()` lowers (or raises, unchecked) them, `release()` returns them."""

    __slots__ = ("_budget", "size")

    def __init__(self, budget: ByteBudget, size: int) -> None:
        self._budget = budget
        self.size = size

    def resize(self, size: int) -> None:
        delta = size - self.size
        self.size = size
        self._budget._adjust(delta)

    def release(self) -> None:
        if self.size:
            size, self.size = self.size, 0
            self._budget._adjust(-size)

    def __repr__(self) -> str:
        return f"<Lease {self.size} bytes>"


class ByteBudget:
    def __init__(
        self,
        limit_bytes: int = DEFAULT_LIMIT_BYTES,
        *,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        small_request_bytes: int = DEFAULT_SMALL_REQUEST_BYTES,
        large_share: float = DEFAULT_LARGE_SHARE,
        large_in_service: int = DEFAULT_LARGE_IN_SERVICE,
    ) -> None:
        if limit_bytes <= 0:
            raise ValueError(f"limit_bytes must be > 0, got {limit_bytes}")
        if not 0 < large_share <= 1:
            raise ValueError(f"large_share must be within (0, 1], got {large_share}")
        self.limit_bytes = limit_bytes
        self.max_request_bytes = min(max_request_bytes, int(limit_bytes * large_share))
        self.small_request_bytes = small_request_bytes
        self.large_limit_bytes = int(limit_bytes * large_share)
        self.max_wait_s = MAX_WAIT_S
        self.large_in_service = large_in_service
        self._turns = asyncio.Semaphore(large_in_service)
        self.in_use = 0
        self.peak = 0
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._waiting_bytes = 0

    def __repr__(self) -> str:
        return (
            f"<ByteBudget in_use={self.in_use} limit={self.limit_bytes} waiters={len(self._waiters)} "
            f"peak={self.peak}>"
        )

    def clamp(self, size: int) -> int:
        """The most one request may reserve of `size`."""
        return max(0, min(size, self.max_request_bytes))

    def _fits(self, size: int) -> bool:
        ceiling = self.limit_bytes if size <= self.small_request_bytes else self.large_limit_bytes
        return self.in_use + size <= ceiling

    def try_acquire(self, size: int) -> Lease | None:
        size = self.clamp(size)
        if self._fits(size):
            self._adjust(size)
            return Lease(self, size)
        return None

    async def acquire(self, size: int, timeout_s: float | None, what: str) -> Lease:
        """Hold `size` bytes (clamped to max_request_bytes), waiting at most `timeout_s` for room."""
        size = self.clamp(size)
        if self._fits(size):
            self._adjust(size)
            return Lease(self, size)
        if self._waiting_bytes + size > self.limit_bytes:
            raise BudgetExhaustedError(self._message(size, what, waited=False))
        wait_s = self.max_wait_s if timeout_s is None else max(0.0, min(timeout_s - DEADLINE_MARGIN_S, self.max_wait_s))
        waiter = _Waiter(size, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        self._waiting_bytes += size
        started = time.monotonic()
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), wait_s)
        except TimeoutError:
            pass
        except BaseException:
            if waiter.future.done() and not waiter.future.cancelled():
                self._adjust(-size)  # granted just as the caller was cancelled: give it back
            raise
        finally:
            self._waiting_bytes -= size
            if not waiter.future.done():
                self._waiters.remove(waiter)
                waiter.future.cancel()
        if waiter.future.cancelled():
            log.warning("memory budget exhausted", what=what, size=size, in_use=self.in_use,
                        waited_s=round(time.monotonic() - started, 3))
            raise BudgetExhaustedError(self._message(size, what, waited=True))
        return Lease(self, size)  # _wake() counted the bytes when it resolved the future

    @contextlib.asynccontextmanager
    async def turn(self, size: int, timeout_s: float | None, what: str) -> AsyncIterator[None]:
        """Work on a request of `size` bytes; a large one waits for its turn (rule 3)."""
        if size <= self.small_request_bytes:
            yield
            return
        wait_s = self.max_wait_s if timeout_s is None else max(0.0, min(timeout_s - DEADLINE_MARGIN_S, self.max_wait_s))
        try:
            await asyncio.wait_for(self._turns.acquire(), wait_s)
        except TimeoutError:
            raise BudgetExhaustedError(
                f"broker busy: {what} ({size} bytes) waited {wait_s:.1f} s for one of "
                f"{self.large_in_service} turns for large requests (large_in_service): retry with backoff"
            ) from None
        try:
            yield
        finally:
            self._turns.release()

    def _message(self, size: int, what: str, *, waited: bool) -> str:
        why = "no room before the deadline" if waited else "too many requests already waiting"
        return (
            f"broker memory budget exhausted: {what} needs {size} bytes, {self.in_use} of "
            f"{self.limit_bytes} bytes in flight (max_in_flight_bytes), {why}: retry with backoff"
        )

    def _adjust(self, delta: int) -> None:
        self.in_use += delta
        if self.in_use > self.peak:
            self.peak = self.in_use
        if delta < 0:
            self._wake()

    def _wake(self) -> None:
        """Grant waiters in order, skipping those that do not fit yet (small ones pass large ones)."""
        for waiter in list(self._waiters):
            if waiter.future.done():
                self._waiters.remove(waiter)
            elif self._fits(waiter.size):
                self._waiters.remove(waiter)
                self.in_use += waiter.size
                self.peak = max(self.peak, self.in_use)
                waiter.future.set_result(None)
