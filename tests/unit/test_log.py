"""Partition log: append/read, segments and indexes, time lookups, retention, idempotence,
group commit and reopening. Real files in tmp_path; time and fsync are injected."""

from __future__ import annotations

import asyncio
import os
import threading
import zlib

import pytest
import structlog

from dmq.broker.log import (
    AppendInfo,
    BatchTooLargeError,
    CorruptBatchError,
    InvalidBatchError,
    LogConfig,
    LogManager,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    PartitionLog,
    ProducerFencedError,
    TruncatedBatchError,
    UnknownPartitionError,
)
from dmq.proto import records
from tests.clocks import ManualClockMs


def batch(n: int = 1, size: int = 10, *, pid: int = -1, epoch: int = -1, seq: int = -1, tag: int = 0) -> bytes:
    values = [bytes([(tag + i) % 256]) * size for i in range(n)]
    return records.encode(values, producer_id=pid, producer_epoch=epoch, base_sequence=seq, timestamp_ms=1)


def offsets_of(data: bytes) -> list[tuple[int, int]]:
    return [(b.header.base_offset, b.header.last_offset) for b in records.decode_batches(data)]


def open_log(path, config=None, **kw) -> PartitionLog:  # type: ignore[no-untyped-def]
    return PartitionLog(path / "t-0", "t", 0, config or LogConfig(), **kw)


def clocked_log(path, config=None, now_ms: int = 1_000_000) -> tuple[PartitionLog, ManualClockMs]:  # type: ignore[no-untyped-def]
    """open_log() on a clock the test moves by hand (clock.now_ms)."""
    clock = ManualClockMs(now_ms)
    return open_log(path, config, clock_ms=clock), clock


# -- append / read -------------------------------------------------------------------------------


def test_append_assigns_offsets_and_reads_back_whole_batches(tmp_path):
    plog = open_log(tmp_path)
    infos = [plog.append(batch(n=3, tag=i)) for i in range(5)]
    assert [(i.base_offset, i.last_offset) for i in infos] == [(0, 2), (3, 5), (6, 8), (9, 11), (12, 14)]
    assert not any(i.duplicate for i in infos)
    assert plog.log_start_offset == 0 and plog.log_end_offset == 15
    assert plog.size_bytes == sum(len(batch(n=3, tag=i)) for i in range(5))

    everything = plog.read(0, 1 << 20)
    assert offsets_of(everything) == [(0, 2), (3, 5), (6, 8), (9, 11), (12, 14)]
    # an offset inside a batch returns the whole batch holding it
    assert offsets_of(plog.read(7, 1 << 20))[0] == (6, 8)
    decoded = records.decode(plog.read(4, 1))
    recs = list(decoded)
    assert [r.offset for r in recs] == [3, 4, 5] and recs[0].value == bytes([1]) * 10
    assert plog.read(15, 100) == b""
    plog.close()


def test_read_returns_at_least_one_batch_and_respects_max_bytes(tmp_path):
    plog = open_log(tmp_path, LogConfig(index_interval_bytes=100))
    big = batch(n=1, size=5000)
    small = batch(n=1, size=10)
    plog.append(big)
    for _ in range(20):
        plog.append(small)
    assert offsets_of(plog.read(0, 10)) == [(0, 0)]  # bigger than max_bytes, returned anyway
    limit = 5 * len(small) + 3
    got = offsets_of(plog.read(1, limit))
    assert got == [(i, i) for i in range(1, 6)]
    assert len(plog.read(1, 5 * len(small))) == 5 * len(small)  # exact fit
    plog.close()


def test_read_max_offset_hides_later_batches(tmp_path):
    plog = open_log(tmp_path)
    for i in range(4):
        plog.append(batch(n=2, tag=i))
    assert offsets_of(plog.read(0, 1 << 20, max_offset=4)) == [(0, 1), (2, 3)]
    assert plog.read(4, 1 << 20, max_offset=4) == b""
    plog.close()


def test_offset_out_of_range(tmp_path):
    plog = open_log(tmp_path)
    plog.append(batch())
    with pytest.raises(OffsetOutOfRangeError) as e:
        plog.read(2, 100)
    assert e.value.log_end_offset == 1 and "log end 1" in str(e.value)
    with pytest.raises(OffsetOutOfRangeError):
        plog.read(-1, 100)
    plog.close()


@pytest.mark.parametrize("crc_implementation", ["fast", "zlib"])
def test_append_rejects_bad_batches(tmp_path, monkeypatch, crc_implementation):
    if crc_implementation == "zlib":  # the fallback when isal is missing: same values, slower
        monkeypatch.setattr(records, "crc32", zlib.crc32)
    plog = open_log(tmp_path, LogConfig(max_batch_bytes=1000))
    truncated = batch()[:-1]
    with pytest.raises(TruncatedBatchError):
        plog.append(truncated)
    good = bytearray(batch())
    good[-1] ^= 0xFF
    with pytest.raises(CorruptBatchError):
        plog.append(bytes(good))
    with pytest.raises(BatchTooLargeError):
        plog.append(batch(size=2000))
    with pytest.raises(InvalidBatchError):
        plog.append(batch() + batch())
    assert plog.log_end_offset == 0 and plog.size_bytes == 0
    plog.close()


def test_bytearray_batch_is_patched_in_place(tmp_path):
    plog = open_log(tmp_path)
    plog.append(batch(n=5))
    buf = bytearray(batch(n=1))
    info = plog.append(buf)
    assert info.base_offset == 5
    assert records.read_header(buf).base_offset == 5
    assert plog.read(5, 1000) == bytes(buf)
    plog.close()


# -- segments and indexes ------------------------------------------------------------------------


def test_roll_by_size_and_reads_across_segments(tmp_path):
    one = len(batch(size=100))
    plog = open_log(tmp_path, LogConfig(segment_bytes=max(1024, 4 * one), index_interval_bytes=1))
    for i in range(40):
        plog.append(batch(size=100, tag=i))
    per_segment = max(1024, 4 * one) // one
    assert plog.segment_count == -(-40 // per_segment)
    files = sorted(f for f in os.listdir(tmp_path / "t-0") if f.endswith(".log"))
    assert files[0] == "00000000000000000000.log"
    assert files[1] == f"{per_segment:020d}.log"
    for off in range(40):
        got = records.decode(plog.read(off, 1))
        assert got.header.base_offset == off and next(iter(got)).value == bytes([off]) * 100
    # a read stays within one segment
    assert offsets_of(plog.read(0, 1 << 20))[-1] == (per_segment - 1, per_segment - 1)
    plog.close()


def test_roll_by_time_uses_the_injected_clock(tmp_path):
    plog, clock = clocked_log(tmp_path, LogConfig(segment_ms=1000))
    plog.append(batch())
    clock.now_ms += 999
    plog.append(batch())
    assert plog.segment_count == 1
    clock.now_ms += 1
    plog.append(batch())
    assert plog.segment_count == 2 and plog.segment_base_offsets == [0, 2]
    plog.close()


def test_offset_index_is_sparse_and_lookups_are_exact(tmp_path):
    one = len(batch(n=2, size=50))
    plog = open_log(tmp_path, LogConfig(index_interval_bytes=3 * one))
    for i in range(100):
        plog.append(batch(n=2, size=50, tag=i))
    seg = plog._segments[-1]
    # an entry every ~3 batches, pointing at batch boundaries
    assert 30 <= len(seg.index) <= 34
    assert all(p % one == 0 for p in seg.index.positions)
    assert all(r * one == 2 * p for r, p in zip(seg.index.rel_offsets, seg.index.positions))
    for off in range(200):
        assert records.read_header(plog.read(off, 1)).base_offset == off - off % 2
    plog.close()
    # persisted on close and loaded again without a rebuild
    index_file = tmp_path / "t-0" / "00000000000000000000.index"
    assert index_file.stat().st_size == 8 * len(seg.index)
    again = open_log(tmp_path)
    assert list(again._segments[-1].index.positions) == list(seg.index.positions)
    assert records.read_header(again.read(151, 1)).base_offset == 150
    again.close()


def test_offset_for_time_is_exact_and_monotonic(tmp_path):
    plog, clock = clocked_log(tmp_path, LogConfig(segment_bytes=1024), now_ms=10_000)
    times = {}
    for i in range(30):
        clock.now_ms += 10 if i % 3 else 0  # several batches share a millisecond
        info = plog.append(batch(size=60, tag=i))
        times[info.base_offset] = info.append_time_ms
    assert plog.segment_count > 2
    clock.now_ms -= 5000  # the wall clock steps back: append time stays monotonic
    info = plog.append(batch())
    assert info.append_time_ms == max(times.values())
    times[info.base_offset] = info.append_time_ms
    for ts in range(9_990, 10_300, 3):
        expected = min((o for o, t in times.items() if t >= ts), default=None)
        assert plog.offset_for_time(ts) == expected, ts
    assert plog.offset_for_time(10_000_000) is None
    plog.close()
    again = open_log(tmp_path)
    assert again.offset_for_time(10_105) == min(o for o, t in times.items() if t >= 10_105)
    again.close()


# -- retention -----------------------------------------------------------------------------------


def test_retention_by_age_deletes_old_segments_and_moves_log_start(tmp_path):
    config = LogConfig(segment_bytes=1024, retention_ms=60_000)
    plog, clock = clocked_log(tmp_path, config)
    for i in range(10):
        plog.append(batch(size=300, tag=i))  # ~1 batch per segment after the first few
        clock.now_ms += 10_000
    bases = plog.segment_base_offsets
    assert len(bases) >= 4
    # now = start + 100 s: segments whose newest batch is older than 60 s go
    deleted = plog.enforce_retention()
    assert deleted >= 1
    assert plog.log_start_offset == plog.segment_base_offsets[0] > 0
    with pytest.raises(OffsetOutOfRangeError):
        plog.read(plog.log_start_offset - 1, 100)
    assert records.read_header(plog.read(plog.log_start_offset, 1)).base_offset == plog.log_start_offset
    start = plog.log_start_offset
    assert plog.enforce_retention() == 0
    plog.close()
    again = open_log(tmp_path, config, clock_ms=clock)
    assert again.log_start_offset == start
    with pytest.raises(OffsetOutOfRangeError):
        again.read(start - 1, 100)
    again.close()


def test_retention_by_age_keeps_the_active_segment(tmp_path):
    plog, clock = clocked_log(tmp_path, LogConfig(retention_ms=1))
    plog.append(batch())
    clock.now_ms += 1_000_000
    assert plog.enforce_retention() == 0 and plog.log_end_offset == 1
    plog.close()


def test_retention_by_bytes_deletes_oldest_segments_keeping_the_limit(tmp_path):
    one = len(batch(size=400))
    plog = open_log(tmp_path, LogConfig(segment_bytes=1024, retention_bytes=3 * one, retention_ms=-1))
    for i in range(10):
        plog.append(batch(size=400, tag=i))
    assert plog.segment_count == 5  # two batches per segment
    assert plog.enforce_retention() == 3
    assert plog.size_bytes == 4 * one >= 3 * one
    assert plog.log_start_offset == 6
    assert plog.enforce_retention() == 0
    plog.close()


def test_log_manager_retention_opens_lazily_registered_partitions(tmp_path):
    config = LogConfig(segment_bytes=1024, retention_bytes=0, retention_ms=-1)
    mgr = LogManager(tmp_path, config)
    plog = mgr.create("a", 0)
    for _ in range(6):
        plog.append(batch(size=400))
    mgr.close()
    mgr = LogManager(tmp_path, config)
    mgr.open_existing()
    assert mgr.open_logs() == [] and mgr.partitions() == [("a", 0)]
    assert mgr.enforce_retention() == 2
    assert mgr.get("a", 0).log_start_offset == 4
    mgr.close()


# -- idempotent producers ------------------------------------------------------------------------


def test_duplicate_batch_returns_original_offsets_and_is_not_written(tmp_path):
    plog, clock = clocked_log(tmp_path)
    plog.append(batch())
    first = plog.append(batch(n=3, pid=7, epoch=0, seq=0))
    clock.now_ms += 50
    second = plog.append(batch(n=2, pid=7, epoch=0, seq=3))
    size = plog.size_bytes
    again = plog.append(batch(n=3, pid=7, epoch=0, seq=0))
    assert again == AppendInfo(first.base_offset, first.last_offset, first.append_time_ms, duplicate=True)
    assert plog.append(batch(n=2, pid=7, epoch=0, seq=3)).base_offset == second.base_offset == 4
    assert plog.size_bytes == size and plog.log_end_offset == 6
    assert plog.append(batch(n=1, pid=7, epoch=0, seq=5)).base_offset == 6
    plog.close()


def test_sequence_gap_is_out_of_order(tmp_path):
    plog = open_log(tmp_path)
    plog.append(batch(n=2, pid=1, epoch=0, seq=0))
    with pytest.raises(OutOfOrderSequenceError, match="expected sequence 2, got 5"):
        plog.append(batch(n=1, pid=1, epoch=0, seq=5))
    with pytest.raises(OutOfOrderSequenceError, match="overlaps"):
        plog.append(batch(n=1, pid=1, epoch=0, seq=1))
    assert plog.log_end_offset == 2
    plog.close()


def test_retry_older_than_the_cached_batches_is_rejected(tmp_path):
    plog = open_log(tmp_path)
    for i in range(7):
        plog.append(batch(pid=1, epoch=0, seq=i))
    assert plog.append(batch(pid=1, epoch=0, seq=2)).duplicate  # among the last 5
    with pytest.raises(OutOfOrderSequenceError, match="older than the last 5"):
        plog.append(batch(pid=1, epoch=0, seq=1))
    plog.close()


def test_stale_epoch_is_fenced_and_new_epoch_restarts_at_zero(tmp_path):
    plog = open_log(tmp_path)
    plog.append(batch(pid=3, epoch=1, seq=0))
    with pytest.raises(ProducerFencedError, match="epoch 0 is fenced: the current epoch is 1"):
        plog.append(batch(pid=3, epoch=0, seq=1))
    with pytest.raises(OutOfOrderSequenceError, match="must start at sequence 0"):
        plog.append(batch(pid=3, epoch=2, seq=4))
    assert plog.append(batch(pid=3, epoch=2, seq=0)).base_offset == 1
    with pytest.raises(ProducerFencedError):
        plog.append(batch(pid=3, epoch=1, seq=1))
    with pytest.raises(InvalidBatchError):
        plog.append(batch(pid=3, epoch=-1, seq=0))
    plog.close()


@pytest.mark.parametrize("clean", [True, False])
def test_producer_state_survives_reopen(tmp_path, clean):
    config = LogConfig(segment_bytes=1024)
    plog = open_log(tmp_path, config)
    infos = [plog.append(batch(n=2, size=200, pid=9, epoch=4, seq=2 * i)) for i in range(8)]
    assert plog.segment_count > 1
    if clean:
        plog.close()
    else:
        plog.abandon()
    again = open_log(tmp_path, config)
    assert again.recovery.clean is clean
    dup = again.append(batch(n=2, size=200, pid=9, epoch=4, seq=14))
    assert dup.duplicate and dup.base_offset == infos[-1].base_offset
    with pytest.raises(ProducerFencedError):
        again.append(batch(pid=9, epoch=3, seq=0))
    assert again.append(batch(pid=9, epoch=4, seq=16)).base_offset == 16
    again.close()


# -- durability ----------------------------------------------------------------------------------


class CountingFsync:
    """Counts fsyncs of .log files; optionally slow, or held until released."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.log_fsyncs = 0
        self.calls = 0
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        with self.lock:
            self.calls += 1
            if os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
                self.log_fsyncs += 1
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        if self.delay_s:
            threading.Event().wait(self.delay_s)
        os.fsync(fd)


async def test_group_commit_shares_fsyncs_between_concurrent_appenders(tmp_path):
    fsync = CountingFsync(delay_s=0.05)
    plog = open_log(tmp_path, fsync=fsync)
    infos = await asyncio.gather(*(plog.append_durable(batch(tag=i)) for i in range(50)))
    assert sorted(i.base_offset for i in infos) == list(range(50))
    assert plog.durable_end_offset == 50
    # the first caller's fsync started before the others wrote; one more covers all 49 others
    assert fsync.log_fsyncs == 2
    plog.close()


async def test_write_after_an_fsync_started_waits_for_the_next_one(tmp_path):
    fsync = CountingFsync()
    plog = open_log(tmp_path, fsync=fsync)
    fsync.gate = threading.Event()
    first = asyncio.create_task(plog.append_durable(batch()))
    assert await asyncio.to_thread(fsync.entered.wait, 10)  # the first fsync is running
    fsync.entered.clear()
    second = asyncio.create_task(plog.append_durable(batch()))
    await asyncio.sleep(0)  # `second` has written and is waiting
    assert plog.log_end_offset == 2 and plog.durable_end_offset == 0
    fsync.gate.set()
    await first
    assert plog.durable_end_offset >= 1
    info = await asyncio.wait_for(second, 10)
    assert info.base_offset == 1 and plog.durable_end_offset == 2
    assert fsync.log_fsyncs == 2
    plog.close()


async def test_duplicate_durable_append_waits_for_the_original_to_be_durable(tmp_path):
    fsync = CountingFsync()
    plog = open_log(tmp_path, fsync=fsync)
    plog.append(batch(pid=1, epoch=0, seq=0))  # acks=1: not fsynced
    assert plog.durable_end_offset == 0
    info = await plog.append_durable(batch(pid=1, epoch=0, seq=0))
    assert info.duplicate and plog.durable_end_offset == 1 and fsync.log_fsyncs == 1
    plog.close()


async def test_interval_policy_acks_without_fsync_and_the_flusher_flushes(tmp_path):
    fsync = CountingFsync()
    mgr = LogManager(tmp_path, LogConfig(flush_policy="interval", flush_interval_ms=20), fsync=fsync)
    plog = mgr.create("t", 0)
    await plog.append_durable(batch())
    assert fsync.log_fsyncs == 0 and plog.durable_end_offset == 0
    stop = asyncio.Event()
    flusher = asyncio.create_task(mgr.run_flusher(stop))
    for _ in range(500):
        if plog.durable_end_offset == 1:
            break
        await asyncio.sleep(0.01)
    assert plog.durable_end_offset == 1 and fsync.log_fsyncs == 1
    stop.set()
    await asyncio.wait_for(flusher, 5)
    mgr.close()


def test_flush_all_from_a_thread(tmp_path):
    mgr = LogManager(tmp_path)
    logs = [mgr.create("t", p) for p in range(3)]
    for plog in logs:
        plog.append(batch())
    t = threading.Thread(target=mgr.flush_all)
    t.start()
    t.join(10)
    assert [p.durable_end_offset for p in logs] == [1, 1, 1]
    mgr.close()


# -- reopening -----------------------------------------------------------------------------------


REOPEN_CONFIG = LogConfig(segment_bytes=2048, index_interval_bytes=128)


def fifty_batches(tmp_path) -> PartitionLog:  # type: ignore[no-untyped-def]
    """A log of 50 one-record batches over several small segments, to close or crash and reopen."""
    plog = open_log(tmp_path, REOPEN_CONFIG)
    for i in range(50):
        plog.append(batch(size=100, tag=i))
    return plog


def test_reopen_after_clean_close_does_not_scan(tmp_path):
    plog = fifty_batches(tmp_path)
    before = plog.read(0, 1 << 30)
    plog.close()
    with structlog.testing.capture_logs() as logs:
        again = open_log(tmp_path, REOPEN_CONFIG)
    assert again.recovery.clean and again.recovery.segments_scanned == 0
    opened = [e for e in logs if e["event"] == "log opened"]
    assert opened and opened[0]["clean"] is True and opened[0]["topic"] == "t"
    assert again.log_end_offset == 50 and again.read(0, 1 << 30) == before
    assert again.append(batch()).base_offset == 50
    again.close()


def test_reopen_after_unclean_close_scans_and_keeps_everything(tmp_path):
    plog = fifty_batches(tmp_path)
    plog.flush()
    expected = {o: plog.read(o, 1) for o in range(50)}
    plog.abandon()  # like a crash: no marker, no final index writes
    again = open_log(tmp_path, REOPEN_CONFIG)
    assert not again.recovery.clean and again.recovery.segments_scanned >= 1
    assert again.recovery.bytes_truncated == 0
    assert again.log_end_offset == 50
    assert all(again.read(o, 1) == expected[o] for o in range(50))
    assert again.append(batch()).base_offset == 50
    again.close()
    # the close after recovery is clean again
    third = open_log(tmp_path, REOPEN_CONFIG)
    assert third.recovery.clean and third.log_end_offset == 51
    third.close()


def test_marker_is_removed_on_the_first_change(tmp_path):
    plog = open_log(tmp_path)
    plog.append(batch())
    plog.close()
    again = open_log(tmp_path)
    marker = tmp_path / "t-0" / ".clean_shutdown"
    assert marker.exists()
    again.read(0, 100)
    assert marker.exists()  # reads change nothing
    again.append(batch())
    assert not marker.exists()
    again.abandon()
    assert not open_log(tmp_path).recovery.clean


# -- manager -------------------------------------------------------------------------------------


def test_log_manager_create_get_delete(tmp_path):
    mgr = LogManager(tmp_path, LogConfig(segment_bytes=4096))
    a = mgr.create("orders-v2", 3, LogConfig(segment_bytes=8192))
    assert mgr.create("orders-v2", 3) is a and a.config.segment_bytes == 8192
    assert mgr.get("orders-v2", 3) is a
    with pytest.raises(UnknownPartitionError):
        mgr.get("orders-v2", 4)
    mgr.create("x", 0).append(batch())
    assert mgr.partitions() == [("orders-v2", 3), ("x", 0)]
    mgr.delete("x", 0)
    assert mgr.partitions() == [("orders-v2", 3)]
    assert not (tmp_path / "x-0").exists()
    with pytest.raises(UnknownPartitionError):
        mgr.delete("x", 0)
    a.append(batch())
    mgr.close()
    mgr = LogManager(tmp_path)
    mgr.open_existing()
    b = mgr.get("orders-v2", 3)
    assert b.config.segment_bytes == 8192 and b.log_end_offset == 1 and b.recovery.clean
    assert repr(b).startswith("PartitionLog(orders-v2[3], start=0, end=1")
    mgr.close()


def test_log_manager_recovers_unclean_partitions_eagerly(tmp_path):
    mgr = LogManager(tmp_path)
    mgr.create("a", 0).append(batch())
    mgr.create("b", 0).append(batch())
    mgr.close()
    # make b look crashed
    (tmp_path / "b-0" / ".clean_shutdown").unlink()
    mgr = LogManager(tmp_path)
    mgr.open_existing()
    assert [(p.topic, p.recovery.clean) for p in mgr.open_logs()] == [("b", False)]
    assert mgr.get("a", 0).recovery.clean
    mgr.close()


@pytest.mark.slow
def test_appends_and_reads_stay_consistent_while_threads_flush_and_apply_retention(tmp_path):
    """The broker runs flush_all and enforce_retention in worker threads next to the event loop."""
    clock = ManualClockMs()
    config = LogConfig(segment_bytes=1024, retention_bytes=4096, retention_ms=-1)
    mgr = LogManager(tmp_path, config, clock_ms=clock)
    plog = mgr.create("t", 0)
    stop = threading.Event()
    errors: list[BaseException] = []

    def background() -> None:
        try:
            while not stop.is_set():
                mgr.flush_all()
                mgr.enforce_retention()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    worker = threading.Thread(target=background)
    worker.start()
    try:
        for i in range(1500):
            info = plog.append(batch(size=100, tag=i))
            assert info.base_offset == i
            start = plog.log_start_offset
            assert records.validate_batch(plog.read(i, 1)).base_offset == i
            if start < i:
                try:
                    assert records.validate_batch(plog.read(start, 1)).base_offset >= start
                except OffsetOutOfRangeError:
                    assert plog.log_start_offset > start  # retention moved it meanwhile
    finally:
        stop.set()
        worker.join(10)
    assert not errors, errors
    # The worker may have stopped between the last appends and its next retention pass: one more
    # pass bounds the size (retention_bytes plus the active segment).
    mgr.enforce_retention()
    assert plog.log_start_offset > 0 and plog.size_bytes <= 4096 + 1024
    mgr.close()
    again = LogManager(tmp_path, config)
    again.open_existing()
    reopened = again.get("t", 0)
    assert reopened.log_end_offset == 1500 and reopened.recovery.clean
    again.close()
