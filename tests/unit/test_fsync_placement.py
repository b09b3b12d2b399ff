"""Group-commit fsyncs on the event loop's thread while the disk is fast, in the pool when not."""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time

import pytest

from dmq.broker.log import LogConfig, LogManager, PartitionLog, StorageUnavailableError
from dmq.broker.log.fsync_placement import WINDOW_S, FsyncPlacement
from dmq.proto import records


def batch(tag: int = 0) -> bytes:
    return records.encode([bytes([tag % 256]) * 10], timestamp_ms=1)


class ThreadRecordingFsync:
    """fsync that remembers which thread ran each .log fsync; optionally slow or failing."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.fail: OSError | None = None
        self.log_threads: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
            with self.lock:
                self.log_threads.append(threading.get_ident())
            if self.fail is not None:
                raise self.fail
        if self.delay_s:
            time.sleep(self.delay_s)
        os.fsync(fd)


def open_log(tmp_path, fsync, placement) -> PartitionLog:  # type: ignore[no-untyped-def]
    return PartitionLog(tmp_path / "t-0", "t", 0, LogConfig(), fsync=fsync, fsync_placement=placement)


# -- the policy ------------------------------------------------------------------------------------


def test_policy_goes_to_the_pool_while_fsyncs_are_slow_and_comes_back():
    p = FsyncPlacement(inline_max_ms=1.0)
    assert p.inline_ok()
    p.record(0.050, inline=False)  # one 50 ms fsync: ewma 10 ms
    assert not p.inline_ok()
    for _ in range(30):
        p.record(0.0002, inline=False)
    assert p.ewma_s < 0.001 and p.inline_ok()


def test_policy_caps_the_share_of_each_window_the_loop_spends_in_fsync():
    p = FsyncPlacement(inline_max_ms=1.0, max_loop_share=0.3)
    budget_s = 0.3 * WINDOW_S
    spent = 0.0
    while spent < budget_s:
        assert p.inline_ok()
        p.record(0.0009, inline=True)
        spent += 0.0009
    assert not p.inline_ok()  # budget used up for this window
    time.sleep(WINDOW_S * 1.2)
    assert p.inline_ok()  # a new window


def test_zero_disables_inline_fsync_and_bad_settings_are_refused():
    assert not FsyncPlacement(inline_max_ms=0).inline_ok()
    with pytest.raises(ValueError, match="inline_max_ms"):
        FsyncPlacement(inline_max_ms=-1)
    with pytest.raises(ValueError, match="max_loop_share"):
        FsyncPlacement(max_loop_share=0)


# -- on a partition log ----------------------------------------------------------------------------


async def test_fast_fsyncs_run_on_the_loop_thread_and_still_group_commit(tmp_path):
    fsync = ThreadRecordingFsync()
    plog = open_log(tmp_path, fsync, FsyncPlacement(inline_max_ms=1000))
    infos = await asyncio.gather(*(plog.append_durable(batch(i)) for i in range(50)))
    assert sorted(i.base_offset for i in infos) == list(range(50))
    assert plog.durable_end_offset == 50
    # all 50 appends were due together: the yield before the inline fsync lets them all join one
    assert fsync.log_threads == [threading.get_ident()]
    plog.close()


async def test_appenders_in_a_loop_keep_sharing_inline_fsyncs(tmp_path):
    fsync = ThreadRecordingFsync()
    plog = open_log(tmp_path, fsync, FsyncPlacement(inline_max_ms=1000, max_loop_share=1.0))

    async def appender(k: int) -> None:
        for i in range(10):
            await plog.append_durable(batch(k * 10 + i))

    await asyncio.gather(*(appender(k) for k in range(16)))
    assert plog.durable_end_offset == 160
    # one fsync per round of 16 (plus slack), not one per batch: a waiter whose batch another
    # waiter's fsync covered must not fsync again for the batches written after it
    assert len(fsync.log_threads) <= 20, len(fsync.log_threads)
    plog.close()


async def test_slow_fsyncs_move_to_the_pool(tmp_path):
    fsync = ThreadRecordingFsync(delay_s=0.01)  # 10 ms: above the 1 ms inline limit
    placement = FsyncPlacement(inline_max_ms=1.0)
    plog = open_log(tmp_path, fsync, placement)
    for i in range(5):
        await plog.append_durable(batch(i))
    loop_thread = threading.get_ident()
    assert fsync.log_threads[0] == loop_thread  # nothing measured yet: tried inline
    assert placement.ewma_s > 0.001
    assert fsync.log_threads[1:] and all(t != loop_thread for t in fsync.log_threads[1:])
    assert plog.durable_end_offset == 5
    plog.close()


async def test_a_failed_inline_fsync_fails_the_append_and_the_log_serves_again(tmp_path):
    # Before issue 13 the failure took the log offline until a restart; now it fails this append
    # (retriable), rolls back what was not durable, and the next append is stored.
    fsync = ThreadRecordingFsync()
    plog = open_log(tmp_path, fsync, FsyncPlacement(inline_max_ms=1000))
    await plog.append_durable(batch())
    fsync.fail = OSError(errno.EIO, "Input/output error")
    with pytest.raises(StorageUnavailableError, match="fsync"):
        await plog.append_durable(batch())
    assert plog.durable_end_offset == plog.log_end_offset == 1  # the failed batch is not in the log
    fsync.fail = None
    info = await plog.append_durable(batch())
    assert info.base_offset == 1 and plog.durable_end_offset == 2
    plog.close()


async def test_log_manager_shares_one_placement_and_can_turn_it_off(tmp_path):
    mgr = LogManager(tmp_path / "a")
    a, b = mgr.create("t", 0), mgr.create("t", 1)
    assert a._placement is b._placement is mgr.fsync_placement
    mgr.close()
    off = LogManager(tmp_path / "b", inline_fsync_max_ms=0)
    assert not off.fsync_placement.inline_ok()
    off.close()


# -- begin_flush: a writer starts the pooled fsync, then finishes its own work -----------------------


async def test_begin_flush_starts_the_pooled_fsync_at_once_and_wait_durable_joins_it(tmp_path):
    entered, release = threading.Event(), threading.Event()

    def held_fsync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
            entered.set()
            assert release.wait(10)
        os.fsync(fd)

    plog = open_log(tmp_path, held_fsync, None)  # no placement: every fsync in the pool
    info = plog.append(batch(1))
    assert plog.begin_flush() is True
    assert await asyncio.to_thread(entered.wait, 10)  # the fsync runs while this caller goes on
    assert plog.begin_flush() is False  # one in flight: wait_durable waits for it
    assert plog.durable_end_offset == 0
    waiter = asyncio.ensure_future(plog.wait_durable(info.last_offset + 1))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    release.set()
    await waiter
    assert plog.durable_end_offset == 1
    assert plog.begin_flush() is False  # everything durable
    plog.close()


async def test_begin_flush_leaves_fast_disks_and_interval_logs_alone(tmp_path):
    fsync = ThreadRecordingFsync()
    plog = open_log(tmp_path, fsync, FsyncPlacement(inline_max_ms=1000))  # fast: fsyncs on the loop
    plog.append(batch(1))
    assert plog.begin_flush() is False and fsync.log_threads == []
    await plog.wait_durable(1)
    assert fsync.log_threads == [threading.get_ident()]
    plog.close()
    interval = PartitionLog(tmp_path / "i-0", "i", 0, LogConfig(flush_policy="interval"), fsync=fsync)
    interval.append(batch(2))
    assert interval.begin_flush() is False
    interval.close()
