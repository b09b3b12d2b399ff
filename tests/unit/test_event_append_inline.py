"""Appends and reads on the event loop while the event store's writer thread is idle (store.py,
_idle_index), on a real log: no thread hand-off then; behind a busy writer they wait for it and
appends keep their order; a condition is still checked before anything is stored; the index
file's periodic fsync is handed to the writer."""

from __future__ import annotations

import asyncio
import pathlib
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from dmq.broker.events import index as index_module
from dmq.broker.events.errors import ConditionFailedError
from dmq.broker.events.progress import SqliteProgressStore
from dmq.broker.events.query import QueryItem
from dmq.broker.events.store import Condition, EventStore, NewEvent
from dmq.broker.log import LogConfig, PartitionLog

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def store(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[EventStore]:
    # no periodic index fsync (a writer job) in the middle of a test that counts writer jobs: on
    # a loaded machine a test outlived the 1 s interval (a test that wants it sets it back)
    monkeypatch.setattr(index_module, "SYNC_INTERVAL_S", 3600.0)
    plog = PartitionLog(tmp_path / "es-0", "es", 0, LogConfig(flush_policy="fsync"))
    s = EventStore(plog, progress=lambda: SqliteProgressStore(str(plog.directory)))
    await s.ensure_open()
    yield s
    await s.close()
    await asyncio.to_thread(plog.close)


def count_writer_jobs(store: EventStore) -> list[str]:
    """Record the name of every function handed to the writer from now on."""
    jobs: list[str] = []
    submit = store._submit

    def counted(fn: Callable[..., Any], *args: object) -> asyncio.Future[Any]:
        jobs.append(getattr(fn, "__name__", repr(fn)))
        return submit(fn, *args)

    store._submit = counted  # type: ignore[method-assign]
    return jobs


def event(tag: str) -> NewEvent:
    return NewEvent("t", (tag,), tag.encode())


async def test_an_append_runs_on_the_loop_while_the_writer_is_idle(store: EventStore) -> None:
    jobs = count_writer_jobs(store)
    assert (await store.append([event("a:1"), event("a:2")], None))[0] == 2
    last, _ = await store.append([event("a:3")], Condition((QueryItem(tags=("a:9",)),), 0))
    assert last == 3 and jobs == []
    # a read too, and the events are there; the writer still runs what only it does (the groups)
    events, head = await store.read((QueryItem(tags=("a:2",)),), 0, 10)
    assert (events.positions, events.payloads, head) == ([2], [b"a:2"], 3) and jobs == []
    await store.groups(lambda g, until, now: g.register("g"))
    assert jobs == ["run"]


async def hold_the_writer(store: EventStore) -> tuple[asyncio.Future[Any], threading.Event]:
    """Keep the writer thread busy with a job named `busy` until the returned event is set."""
    started, release = threading.Event(), threading.Event()

    def busy() -> None:
        started.set()
        assert release.wait(10)

    blocker = asyncio.ensure_future(store.on_writer(busy))
    await asyncio.to_thread(started.wait, 10)
    return blocker, release


async def test_a_read_behind_a_busy_writer_waits_for_it(store: EventStore) -> None:
    await store.append([event("r:1")], None)
    blocker, release = await hold_the_writer(store)
    read = asyncio.ensure_future(store.read((QueryItem(tags=("r:1",)),), 0, 10))
    await asyncio.sleep(0.05)
    assert not read.done()  # the index is the writer's while it runs a job
    release.set()
    await blocker
    assert (await read)[0].positions == [1]


async def test_a_failed_condition_stores_nothing(store: EventStore) -> None:
    await store.append([event("k:1")], None)
    with pytest.raises(ConditionFailedError) as failed:
        await store.append([event("k:2")], Condition((QueryItem(tags=("k:1",)),), 0))
    assert failed.value.position == 1  # type: ignore[attr-defined]
    assert store.plog.log_end_offset == 1 and store._index is not None and store._index.end == 1
    assert (await store.append([event("k:2")], Condition((QueryItem(tags=("k:1",)),), 1)))[0] == 2


async def test_appends_queue_behind_a_busy_writer_and_keep_their_order(store: EventStore) -> None:
    jobs = count_writer_jobs(store)
    blocker, release = await hold_the_writer(store)
    appends = [asyncio.ensure_future(store.append([event(f"q:{i}")], Condition((QueryItem(tags=(f"q:{i}",)),), 0)))
               for i in range(3)]
    # the second append in the same job sees the first (the same tag would conflict)
    conflicting = asyncio.ensure_future(store.append([event("q:0")], Condition((QueryItem(tags=("q:0",)),), 0)))
    await asyncio.sleep(0.05)
    # none ran on the loop: the first was handed to the writer (behind `busy`), the rest wait for it
    assert not any(a.done() for a in appends) and len(store._queue) == 3
    release.set()
    await blocker
    assert [(await a)[0] for a in appends] == [1, 2, 3]
    with pytest.raises(ConditionFailedError):
        await conflicting
    assert jobs == ["busy", "_append_all", "_append_all"]  # the first append, then the three queued meanwhile
    assert store._writer_jobs == 0
    assert (await store.append([event("q:4")], None))[0] == 4 and len(jobs) == 3  # inline again


async def test_the_index_files_periodic_fsync_goes_to_the_writer(store: EventStore,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    index = store._index
    assert index is not None
    monkeypatch.setattr(index_module, "SYNC_INTERVAL_S", 0.0)
    synced_in: list[str] = []
    sync = index.sync

    def recorded() -> None:
        synced_in.append(threading.current_thread().name)
        sync()

    index.sync = recorded  # type: ignore[method-assign]
    jobs = count_writer_jobs(store)
    await store.append([event("s:1")], None)
    await store.on_writer(lambda: None)  # after the sync (one writer, in order)
    assert jobs == ["recorded", "<lambda>"] and len(synced_in) == 1 and synced_in[0].startswith("dmq-events-es-w")
    assert not index._dirty


async def test_the_index_record_is_written_while_the_log_fsyncs(tmp_path: pathlib.Path) -> None:
    """The append starts the log's pooled fsync (PartitionLog.begin_flush) before it builds and
    writes the index record, instead of after."""
    plog = PartitionLog(tmp_path / "es-0", "es", 0, LogConfig(flush_policy="fsync"))  # no placement: the pool
    s = EventStore(plog, progress=lambda: SqliteProgressStore(str(plog.directory)))
    await s.ensure_open()
    index = s._index
    assert index is not None
    flushing: list[bool] = []
    stage = index.stage_columns

    def recorded(*args: Any) -> None:
        flushing.append(plog._inflight is not None and not plog._inflight.done())
        stage(*args)

    index.stage_columns = recorded  # type: ignore[method-assign]
    assert (await s.append([event("f:1")], None))[0] == 1
    assert flushing == [True] and plog.durable_end_offset == 1
    await s.close()
    await asyncio.to_thread(plog.close)


async def test_an_index_write_failure_on_the_loop_is_indexed_again_by_the_writer(store: EventStore,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    index = store._index
    assert index is not None
    write = index._write_all
    failures = [OSError(28, "No space left on device")]

    def full_once(data: bytes | memoryview, at: int) -> None:
        if failures:
            raise failures.pop()
        write(data, at)

    monkeypatch.setattr(index, "_write_all", full_once)
    jobs = count_writer_jobs(store)
    # the batch is in the log (the truth): reported stored; its index record failed
    assert (await store.append([event("x:1")], None))[0] == 1
    await store.on_writer(lambda: None)  # after the writer's catch-up
    assert jobs[0] == "_follow_log" and index.end == 1 and index.matching((QueryItem(tags=("x:1",)),), 0, 1, 10) == [1]
    with pytest.raises(ConditionFailedError):
        await store.append([event("x:2")], Condition((QueryItem(tags=("x:1",)),), 0))
