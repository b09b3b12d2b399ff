"""The Broker servicer's appends of produced batches: large ones in worker threads, each
partition's appends kept in arrival order (see `Appender`)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from dmq.broker.log import AppendInfo, LogClosedError, PartitionLog

__all__ = ["APPEND_INLINE_MAX_BYTES", "APPEND_THREADS", "Appender"]

# Batches above this are appended in a worker thread (see Appender); smaller ones on the loop.
APPEND_INLINE_MAX_BYTES = 256 * 1024
APPEND_THREADS = 2


class Appender:
    """Appends large batches in worker threads, keeping each partition's appends in arrival order.

    Why: a 1 MB append on the event loop (CRC, write() into the page cache, which the kernel's
    dirty-page throttling may stall) blocked every other call for ~1-3 ms, and a flood of them
    put that in front of every small request (bench/load_bench.py: a small producer's p99). In a
    thread those wait on the disk, not the loop. A thread hop costs more than appending a small
    batch, so small batches stay on the loop, unless the partition has appends queued: then they
    queue behind them (FIFO per partition; asyncio.Lock serves waiters in order). At most
    APPEND_THREADS run at once, and the memory budget's turns bound how many large ones wait.
    PartitionLog.append is thread-safe; durability (wait_durable after the append) is unchanged.
    """

    def __init__(self, threads: int = APPEND_THREADS, inline_max_bytes: int = APPEND_INLINE_MAX_BYTES) -> None:
        self.inline_max_bytes = inline_max_bytes
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="dmq-append")
        self._locks: dict[int, asyncio.Lock] = {}
        self._queued: dict[int, int] = {}  # per log: appends waiting or running in a thread

    def close(self) -> None:
        """Wait for the appends in progress (blocking: call it from a thread)."""
        self._pool.shutdown(wait=True)

    async def append(self, plog: PartitionLog, batch: bytes) -> AppendInfo:
        key = id(plog)
        if len(batch) <= self.inline_max_bytes and not self._queued.get(key):
            return plog.append(batch)
        self._queued[key] = self._queued.get(key, 0) + 1
        lock = self._locks.setdefault(key, asyncio.Lock())
        try:
            await lock.acquire()
        except BaseException:
            self._done(key)
            raise
        if len(batch) <= self.inline_max_bytes:
            try:
                return plog.append(batch)
            finally:
                lock.release()
                self._done(key)
        try:
            fut = asyncio.get_running_loop().run_in_executor(self._pool, plog.append, batch)
        except BaseException as e:
            lock.release()
            self._done(key)
            if isinstance(e, RuntimeError):  # the pool is shut down: the broker is stopping
                raise LogClosedError(f"{plog.topic}[{plog.partition}]: the broker is stopping") from e
            raise

        def finished(_: asyncio.Future[AppendInfo]) -> None:
            # Held until the thread is done, also when the caller was cancelled meanwhile, so
            # the next append of this partition never overtakes it.
            lock.release()
            self._done(key)

        fut.add_done_callback(finished)
        return await asyncio.shield(fut)

    def _done(self, key: int) -> None:
        left = self._queued[key] - 1
        if left:
            self._queued[key] = left
        else:
            del self._queued[key]
            lock = self._locks.get(key)
            if lock is not None and not lock.locked():
                del self._locks[key]
