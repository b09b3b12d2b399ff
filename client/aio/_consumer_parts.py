"""AsyncConsumer's parts that stand alone: the heartbeat tasks and the chunks of records
buffered for getone() / ``async for`` (see aio/consumer.py)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from itertools import islice
from operator import length_hint
from typing import Any

from dmq.client.aio._cluster import AsyncCluster
from dmq.client.consumer._heartbeat import HeartbeatThread
from dmq.client.consumer._records import TopicPartition
from dmq.client.records import ConsumerRecord

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


class Chunk:
    """Records of one partition fetched for getone() / ``async for`` and not all handed out yet.

    The records are handed out through `it`, an iterator over the list shared by every reader
    (getone(), getmany(), each ``async for``): taking a record from it IS handing it out, so each
    record goes out once, and the position a commit must cover is read back from it (a list
    iterator's length_hint is exactly the number of records left). Whoever must stop a reader
    that is draining the chunk between two records (group work starting, stop(), seek(),
    revocation) ends the iterator it holds with detach() or drop(), so ``async for`` needs no
    check per record: __anext__ finds the iterator ended and asks _ready_chunk() again."""

    __slots__ = ("tp", "records", "it")

    def __init__(self, tp: TopicPartition, records: list[ConsumerRecord]) -> None:
        self.tp = tp
        self.records = records
        self.it: Iterator[ConsumerRecord] = iter(records)

    def __repr__(self) -> str:
        return f"<Chunk {self.tp} next={self.next_offset()} left={length_hint(self.it)}>"

    def next_offset(self) -> int | None:
        """The offset of the next record to hand out; None when all were handed out."""
        left = length_hint(self.it)
        return self.records[len(self.records) - left].offset if left else None

    def take(self, n: int) -> list[ConsumerRecord]:
        """Hand out up to n records at once."""
        return list(islice(self.it, n))

    def detach(self) -> None:
        """Keep the records not handed out yet, behind a new iterator: a reader holding the old
        one finds it ended and comes back through _ready_chunk(), which decides again."""
        self.records = list(self.it)  # ends the old iterator
        self.it = iter(self.records)

    def drop(self) -> None:
        """End the iterator: nothing more is handed out of this chunk (its records are dropped)."""
        deque(self.it, maxlen=0)
