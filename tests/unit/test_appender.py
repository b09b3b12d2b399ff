"""The broker's appender (broker.appender.Appender): large batches in worker threads, in order.

A large append used to run on the event loop and hold up every other call (issue 13: a small
producer's latency under a produce flood). Now it runs in a thread; these tests pin down what must
not change: each partition's appends land in the order they arrived (small ones queue behind large
ones in flight, a cancelled caller does not let the next append overtake its batch), and the loop
keeps serving while a large append is in progress.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from dmq.broker.appender import Appender
from dmq.broker.log import PartitionLog
from dmq.proto import records

LARGE = records.encode([b"L" * (300 * 1024)])
SMALL = records.encode([b"s" * 10])


class _SlowLog(PartitionLog):
    """Appends of large batches wait on `gate` (in the worker thread), so a test can hold one."""

    gate: threading.Event

    def append(self, batch):  # type: ignore[no-untyped-def]
        if len(batch) > 100_000:
            assert self.gate.wait(10)
        return super().append(batch)


def _open(tmp_path) -> _SlowLog:  # type: ignore[no-untyped-def]
    plog = _SlowLog(tmp_path / "t-0", "t", 0)
    plog.gate = threading.Event()
    return plog


def _run_then_close(run: Callable[[], Coroutine[Any, Any, None]], appender: Appender, plog: PartitionLog) -> None:
    """asyncio.run(run()), then the appender and the log closed, whatever happened."""
    try:
        asyncio.run(run())
    finally:
        appender.close()
        plog.close()


def test_appends_keep_arrival_order_and_the_loop_runs_meanwhile(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plog = _open(tmp_path)
    appender = Appender(threads=2)

    async def run() -> None:
        kinds = [LARGE, SMALL, LARGE, SMALL, SMALL, LARGE, SMALL]
        tasks = []
        for batch in kinds:
            tasks.append(asyncio.create_task(appender.append(plog, batch)))
            await asyncio.sleep(0)  # arrival order = creation order
        ticks = 0
        for _ in range(20):  # the loop is free while the first large append waits in its thread
            await asyncio.sleep(0.005)
            ticks += 1
        assert ticks == 20
        assert not any(t.done() for t in tasks), "a small append overtook a large one queued before it"
        plog.gate.set()
        infos = await asyncio.gather(*tasks)
        assert [i.base_offset for i in infos] == list(range(len(kinds)))

    _run_then_close(run, appender, plog)


def test_a_cancelled_caller_keeps_its_place(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plog = _open(tmp_path)
    appender = Appender(threads=2)

    async def run() -> None:
        first = asyncio.create_task(appender.append(plog, LARGE))
        await asyncio.sleep(0.05)  # in its thread, held at the gate
        second = asyncio.create_task(appender.append(plog, SMALL))
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.sleep(0.05)
        assert not second.done(), "the next append overtook a batch still being written"
        plog.gate.set()
        info = await second
        assert info.base_offset == 1  # the cancelled caller's batch landed first, at offset 0
        assert plog.log_end_offset == 2

    _run_then_close(run, appender, plog)


def test_small_appends_with_nothing_queued_stay_on_the_loop(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plog = _open(tmp_path)
    appender = Appender(threads=1)
    seen: list[str] = []
    real_append = plog.append

    def spy(batch):  # type: ignore[no-untyped-def]
        seen.append(threading.current_thread().name)
        return real_append(batch)

    plog.append = spy  # type: ignore[method-assign]
    plog.gate.set()

    async def run() -> None:
        await appender.append(plog, SMALL)
        await appender.append(plog, LARGE)

    _run_then_close(run, appender, plog)
    assert seen[0] == threading.main_thread().name
    assert seen[1].startswith("dmq-append")
