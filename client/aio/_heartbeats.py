"""The asyncio consumer's heartbeats: the sync consumer's HeartbeatThread coroutines (heartbeat
and WatchGroup per membership, the max_poll_interval_ms watchdog), run as tasks on the consumer's
loop instead of a thread's, on the consumer's own channels."""

from __future__ import annotations

import asyncio
from typing import Any

from dmq.client.aio._cluster import AsyncCluster
from dmq.client.consumer._heartbeat import HeartbeatThread

HEARTBEAT_STOP_TIMEOUT_S = 1.0


class Heartbeats(HeartbeatThread):
    """HeartbeatThread's coroutines (heartbeat and WatchGroup per membership, the
    max_poll_interval_ms watchdog) run as tasks on the consumer's loop instead of a thread's."""

    _main_task: asyncio.Task[None] | None = None

    def __init__(self, cluster: AsyncCluster, *args: Any) -> None:
        super().__init__(*args)
        self._cluster = cluster

    def _stub(self, address: str) -> Any:
        # The consumer's own channels, through its coordinator router when there are several
        # coordinators: heartbeats and watches follow the active one as the group calls do.
        return self._cluster.group_stub(address)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._main_task = asyncio.create_task(self._main(), name=f"{self.name}-heartbeats")

    @property
    def alive(self) -> bool:
        return self._main_task is not None and not self._main_task.done()

    def _call(self, fn: Any, *args: object) -> None:
        fn(*args)  # already on the loop

    async def astop(self, timeout_s: float = HEARTBEAT_STOP_TIMEOUT_S) -> None:
        task = self._main_task
        if task is None or task.done():
            return
        if self._stopping is None:  # _main has not run yet
            task.cancel()
        else:
            self._stopping.set()  # _main cancels its tasks and closes its channels
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=timeout_s)
