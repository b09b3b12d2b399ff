"""complete_even_if_cancelled: the write finishes after its caller is cancelled, and a write that
then fails is not left as a task whose exception nobody retrieved (seen in a full run: asyncio's
"Task exception was never retrieved" for PartitionController._apply_states, a store write that
timed out after the coordinator stepping down had cancelled its caller)."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from dmq.coordinator.metastore.base import StoreError
from dmq.coordinator.store_writes import complete_even_if_cancelled


async def _write(started: asyncio.Event, finish: asyncio.Event, fail: bool, done: list[str]) -> str:
    started.set()
    await finish.wait()
    if fail:
        raise StoreError("etcd did not update 1 partition states: DEADLINE_EXCEEDED")
    done.append("written")
    return "written"


async def _cancel_caller_then_finish(fail: bool, done: list[str]) -> None:
    started, finish = asyncio.Event(), asyncio.Event()
    caller = asyncio.create_task(complete_even_if_cancelled(_write(started, finish, fail, done)))
    await started.wait()
    caller.cancel()
    await asyncio.sleep(0.01)
    assert not caller.done(), "the caller must wait for the write to end"
    finish.set()
    with pytest.raises(asyncio.CancelledError):
        await caller


def test_a_cancelled_caller_waits_for_the_write_then_is_cancelled() -> None:
    done: list[str] = []
    asyncio.run(_cancel_caller_then_finish(False, done))
    assert done == ["written"]


def test_a_write_failing_after_its_caller_was_cancelled_is_logged_not_left_unretrieved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    unretrieved: list[dict[str, object]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, context: unretrieved.append(context))
        await _cancel_caller_then_finish(True, [])
        gc.collect()  # a task's unretrieved exception is reported when the task is collected
        await asyncio.sleep(0)

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
        gc.collect()
    assert not [c for c in unretrieved if "never retrieved" in str(c.get("message"))], unretrieved
