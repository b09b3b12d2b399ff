"""AsyncConsumer's parts that stand alone: the heartbeat tasks and the chunks of records
buffered for getone() / ``async for`` (see aio/consumer.py)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator, Sequence
from itertools import islice
from operator import length_hint
from typing import Any

from dmq.client.aio._cluster import AsyncCluster
from dmq.client.consumer._heartbeat import HeartbeatThread
from dmq.client.consumer._records import TopicPartition
from dmq.client.records import ConsumerRecord, RecordSequence

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

    The records are handed out through `it`, an iterator over the sequence shared by every
    reader (getone(), getmany(), each ``async for``): taking a record from it IS handing it out,
    so each record goes out once, and the position a commit must cover is read back from its
    cursor (RecordSequence.cursor(); a list's iterator is its own), whose length_hint is exactly
    the number of records left. Whoever must stop a reader that is draining the chunk between
    two records (group work starting, stop(), seek(), revocation) ends
    the iterator it holds (by exhausting the cursor), so ``async for`` needs no check per record:
    __anext__ finds the iterator ended and asks _ready_chunk() again."""

    __slots__ = ("tp", "records", "it", "cursor")

    def __init__(self, tp: TopicPartition, records: Sequence[ConsumerRecord]) -> None:
        self.tp = tp
        self._start(records)

    def _start(self, records: Sequence[ConsumerRecord]) -> None:
        self.records = records
        self.it: Iterator[ConsumerRecord]
        self.cursor: Iterator[object]
        if isinstance(records, RecordSequence):
            self.it, self.cursor = records.cursor()
        else:
            self.it = iter(records)
            self.cursor = self.it

    def __repr__(self) -> str:
        return f"<Chunk {self.tp} next={self.next_offset()} left={self.left()}>"

    def left(self) -> int:
        """How many records are not handed out yet."""
        return length_hint(self.cursor)

    def next_offset(self) -> int | None:
        """The offset of the next record to hand out; None when all were handed out."""
        left = length_hint(self.cursor)
        return self.records[len(self.records) - left].offset if left else None

    def take(self, n: int) -> Sequence[ConsumerRecord]:
        """Hand out up to n records at once: a slice (a RecordSequence's records are built when
        the application reaches them), stepped past on the shared iterator."""
        first = len(self.records) - length_hint(self.cursor)
        taken = self.records[first:first + n]
        deque(islice(self.it, len(taken)), maxlen=0)
        return taken

    def detach(self) -> None:
        """Keep the records not handed out yet, behind a new iterator: a reader holding the old
        one finds it ended and comes back through _ready_chunk(), which decides again."""
        first = len(self.records) - length_hint(self.cursor)
        deque(self.cursor, maxlen=0)  # ends the old iterator
        self._start(self.records[first:])

    def drop(self) -> None:
        """End the iterator: nothing more is handed out of this chunk (its records are dropped)."""
        deque(self.cursor, maxlen=0)
