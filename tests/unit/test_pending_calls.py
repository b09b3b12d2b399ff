"""The seam the sync and asyncio clients share for calls kept in flight (dmq.client._calls
PendingCall, Cluster.start_unary): the fetch reader run on loop tasks, as the asyncio consumer
runs it, with no grpc.Future adapter in between. No server: the calls are tasks the test ends."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from dmq.client._calls import CALL_CANCELLED
from dmq.client._reader import INLINE, FetchWant, PartitionReader
from dmq.client.errors import IllegalStateError

LEADER = "broker:1"


class FakeCluster:
    """What the reader asks of a Cluster: a leader, the Fetch method, the request timeout."""

    timeout_s = 5.0

    def __init__(self) -> None:
        self.invalidated: list[str] = []

    def leader_for(self, topic: str, partition: int, **_: Any) -> str:
        return LEADER

    def raw_fetch(self, address: str) -> Any:
        async def fetch(request: Any, timeout: float) -> bytes:
            await asyncio.Event().wait()  # never answers: the test ends the task
            raise AssertionError("unreachable")

        return fetch

    def invalidate(self, topic: str) -> None:
        self.invalidated.append(topic)


class Failed(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "broker going away"


def task_reader(cluster: FakeCluster, tasks: list[asyncio.Task[Any]]) -> PartitionReader:
    def start(call: Any, request: Any, timeout: float) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(call(request, timeout=timeout))
        tasks.append(task)
        return task

    return PartitionReader(cluster, start=start, retry_backoff_ms=10)  # type: ignore[arg-type]


def test_every_cancelled_form_is_named() -> None:
    # a grpc Future's, a thread pool's and a loop task's: the shared parts catch all three
    assert grpc.FutureCancelledError in CALL_CANCELLED
    assert asyncio.CancelledError in CALL_CANCELLED
    assert issubclass(asyncio.CancelledError, BaseException) and not issubclass(asyncio.CancelledError, Exception)


async def test_a_fetch_task_cancelled_by_close_is_dropped_not_raised() -> None:
    cluster, tasks = FakeCluster(), []
    reader = task_reader(cluster, tasks)
    reader.send([FetchWant("t", 0, 0)])
    assert reader.in_flight(("t", 0)) and len(tasks) == 1
    tasks[0].cancel()  # what AsyncCluster.aclose() does to the calls in flight
    await asyncio.wait(tasks)
    assert reader.answers() == []
    assert not reader.busy and not reader.in_flight(("t", 0))
    assert cluster.invalidated == []  # a cancelled call is no broker failure: no backoff, no refresh
    assert reader.retry_at(LEADER) == 0.0
    reader.close()


async def test_a_failed_fetch_task_is_an_answer_with_the_error_and_backs_the_broker_off() -> None:
    cluster, tasks = FakeCluster(), []
    reader = task_reader(cluster, tasks)

    async def failing(request: Any, timeout: float) -> bytes:
        raise Failed()

    cluster.raw_fetch = lambda address: failing  # type: ignore[method-assign]
    reader.send([FetchWant("t", 0, 0)])
    await asyncio.wait(tasks)
    (answer,) = reader.answers()
    assert answer.error is not None and answer.error.retriable
    assert "broker going away" in str(answer.error)
    assert reader.retry_at(LEADER) > 0.0 and cluster.invalidated == ["t"]
    reader.close()


async def test_result_is_refused_on_a_reader_whose_fetches_are_tasks() -> None:
    # result() waits for the Fetch, which on the loop's own thread could never finish
    cluster, tasks = FakeCluster(), []
    reader = task_reader(cluster, tasks)
    with pytest.raises(IllegalStateError, match="pool"):
        reader.result(FetchWant("t", 0, 0))
    reader.close()
    await asyncio.wait(tasks)  # close() cancelled the one it sent


def test_a_reader_takes_a_pool_or_start_not_both() -> None:
    with pytest.raises(ValueError, match="pool or start"):
        PartitionReader(FakeCluster(), pool=INLINE, start=lambda *a, **k: None)  # type: ignore[arg-type]
