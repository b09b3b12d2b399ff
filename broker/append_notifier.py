"""Wakes long-polling fetches when a partition gets new data.

The node owns one; the Broker servicer's Fetch parks on it, and whatever makes data readable
(a produce, a replica fetch moving the high watermark, a dead letter written) notifies it.
"""

from __future__ import annotations

import asyncio

__all__ = ["AppendNotifier"]


class AppendNotifier:
    """Wakes long-polling fetches when a partition gets new data.

    Waiters park a future per partition they read; an append resolves them. Futures are removed by
    the waiter itself, so the table only holds partitions with fetches in flight.
    """

    def __init__(self) -> None:
        self._waiters: dict[tuple[str, int], set[asyncio.Future[None]]] = {}

    def notify(self, topic: str, partition: int) -> None:
        waiters = self._waiters.pop((topic, partition), None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    async def wait_any(self, keys: list[tuple[str, int]], timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        for key in keys:
            self._waiters.setdefault(key, set()).add(fut)
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            pass
        finally:
            for key in keys:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(fut)
                    if not waiters:
                        del self._waiters[key]
