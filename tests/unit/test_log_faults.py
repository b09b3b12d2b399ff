"""Issue 13, storage under faults: transient I/O errors fail one operation and never take a log
offline; what was not made durable is rolled back (a produce reported as failed never shows up
later); fsync descriptors come from the handle cache; damage found after a clean shutdown is
reported and never served; an inconsistent index is rebuilt from the log."""

from __future__ import annotations

import asyncio
import errno
import os
import pathlib
import threading

import pytest
import structlog

from dmq.broker.log import (
    CorruptLogError,
    FileCache,
    LogConfig,
    LogManager,
    PartitionLog,
    StorageUnavailableError,
)
from dmq.broker.log import handles as handles_mod
from dmq.broker.log import segment as segment_mod
from dmq.broker.log.producer_state import ProducerStateManager
from dmq.broker.log.scan import Batch, Damaged, Tail, scan_batches
from dmq.proto import records
from tests.unit.test_log_corruption import flip

CONFIG = LogConfig(segment_bytes=8192, index_interval_bytes=256)


def batch(tag: int = 0, n: int = 2, size: int = 100, **kw: int) -> bytes:
    return records.encode([bytes([tag % 256]) * size] * n, timestamp_ms=1, **kw)


class FailingFsync:
    """os.fsync that fails the next `fail` calls with `err` (then works)."""

    def __init__(self) -> None:
        self.fail = 0
        self.err = errno.EIO
        self.calls = 0

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.fail > 0:
            self.fail -= 1
            raise OSError(self.err, os.strerror(self.err))
        os.fsync(fd)


def open_log(tmp_path, fsync=None, config: LogConfig = CONFIG) -> PartitionLog:  # type: ignore[no-untyped-def]
    return PartitionLog(tmp_path / "t-0", "t", 0, config, fsync=fsync)


def all_batches(plog: PartitionLog) -> list[records.RecordBatch]:
    out = []
    offset = plog.log_start_offset
    while offset < plog.log_end_offset:
        chunk = plog.read(offset, 1 << 20)
        got = records.decode_batches(chunk)
        out += got
        offset = got[-1].header.last_offset + 1
    return out


# -- transient errors ------------------------------------------------------------------------------


@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC, errno.EMFILE])
async def test_failed_fsync_is_retriable_rolls_back_and_the_log_serves_again(tmp_path, err):
    fsync = FailingFsync()
    plog = open_log(tmp_path, fsync=fsync)
    ok = await plog.append_durable(batch(1, producer_id=7, producer_epoch=0, base_sequence=0))
    fsync.fail, fsync.err = 1, err
    with pytest.raises(StorageUnavailableError) as e:
        await plog.append_durable(batch(2, producer_id=7, producer_epoch=0, base_sequence=2))
    assert e.value.disk_full == (err == errno.ENOSPC)
    assert "retry" in str(e.value) and "t[0]" in str(e.value)
    # the failed batch is not in the log, its bytes are gone from the file, the log is consistent
    assert plog.log_end_offset == plog.durable_end_offset == ok.last_offset + 1
    assert os.path.getsize(plog._segments[-1].log_path) == plog.size_bytes
    assert plog.status == "ok"
    # once the cause is gone the same (idempotent) retry is stored as new, not as a duplicate
    again = await plog.append_durable(batch(2, producer_id=7, producer_epoch=0, base_sequence=2))
    assert not again.duplicate and again.base_offset == ok.last_offset + 1
    assert [b.header.base_offset for b in all_batches(plog)] == [0, 2]
    plog.close()
    reopened = open_log(tmp_path)
    assert [r.value[:1] for b in all_batches(reopened) for r in b] == [b"\x01"] * 2 + [b"\x02"] * 2
    reopened.close()


async def test_every_waiter_of_a_failed_flush_fails_and_none_of_their_batches_stays(tmp_path):
    fsync = FailingFsync()
    plog = open_log(tmp_path, fsync=fsync)
    await plog.append_durable(batch(0))
    fsync.fail = 1
    results = await asyncio.gather(*(plog.append_durable(batch(i)) for i in range(1, 6)), return_exceptions=True)
    failed = [r for r in results if isinstance(r, StorageUnavailableError)]
    stored = [r for r in results if not isinstance(r, BaseException)]
    assert len(failed) + len(stored) == 5 and failed
    # exactly the acknowledged batches are in the log, contiguous after the first one
    assert plog.log_end_offset == 2 + 2 * len(stored)
    assert sorted(r.base_offset for r in stored) == list(range(2, 2 + 2 * len(stored), 2))
    plog.close()


async def test_batches_of_acks_all_produces_are_hidden_until_durable(tmp_path):
    gate = threading.Event()
    entered = threading.Event()

    def slow_fsync(fd: int) -> None:
        entered.set()
        assert gate.wait(10)
        os.fsync(fd)

    plog = PartitionLog(tmp_path / "t-0", "t", 0, CONFIG, fsync=slow_fsync)
    plog.append(batch(0))  # acks=1: visible at once
    task = asyncio.create_task(plog.append_durable(batch(1)))
    assert await asyncio.to_thread(entered.wait, 10)
    assert plog.log_end_offset == 4 and plog.visible_end_offset == 2
    assert len(records.decode_batches(plog.read(0, 1 << 20))) == 1
    assert plog.read(2, 1 << 20) == b""
    gate.set()
    await asyncio.wait_for(task, 10)
    assert plog.visible_end_offset == 4 and len(records.decode_batches(plog.read(0, 1 << 20))) == 2
    plog.close()


def test_failed_write_leaves_no_partial_batch_and_the_next_append_lands_right(tmp_path, monkeypatch):
    plog = open_log(tmp_path)
    plog.append(batch(0))
    size = plog.size_bytes
    real_write = os.write

    def short_then_enospc(fd, data):  # type: ignore[no-untyped-def]
        real_write(fd, bytes(data)[:10])
        raise OSError(errno.ENOSPC, "No space left on device")

    def failing_truncate(fd, length):  # type: ignore[no-untyped-def]
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(segment_mod.os, "writev", lambda fd, parts: short_then_enospc(fd, b"".join(parts)))
    monkeypatch.setattr(segment_mod.os, "ftruncate", failing_truncate)
    with pytest.raises(StorageUnavailableError) as e:
        plog.append(batch(1))
    assert e.value.disk_full and "ENOSPC" in str(e.value)
    assert os.path.getsize(plog._segments[-1].log_path) == size + 10  # the cut failed too
    monkeypatch.undo()
    info = plog.append(batch(2))  # cuts the partial bytes first
    assert info.base_offset == 2
    assert os.path.getsize(plog._segments[-1].log_path) == plog.size_bytes
    assert [next(iter(b)).value[:1] for b in all_batches(plog)] == [b"\x00", b"\x02"]
    plog.close()


async def test_flush_needs_no_new_descriptor_when_the_process_is_out_of_them(tmp_path, monkeypatch):
    """Before issue 13 the index files (and directories) were fsynced through new opens by path:
    with the descriptors exhausted (EMFILE) the acks=all produce after a segment roll failed, and
    the log stayed offline until a restart."""
    mgr = LogManager(tmp_path, CONFIG)
    plog = mgr.create("t", 0)
    await plog.append_durable(batch(0))
    segments = plog.segment_count
    while plog.segment_count == segments:  # a roll: the next flush must fsync its index files
        plog.append(batch(1))
    # The process is out of descriptors: an open succeeds only after a close freed one.
    real_open, real_close = os.open, os.close
    freed = [0]

    def no_fds(path, flags, mode=0o777, **kw):  # type: ignore[no-untyped-def]
        if freed[0] <= 0:
            raise OSError(errno.EMFILE, "Too many open files")
        freed[0] -= 1
        return real_open(path, flags, mode, **kw)

    def close(fd: int) -> None:
        real_close(fd)
        freed[0] += 1

    monkeypatch.setattr(os, "open", no_fds)
    monkeypatch.setattr(os, "close", close)
    info = await plog.append_durable(batch(2))
    assert plog.durable_end_offset == info.last_offset + 1
    assert not plog._unflushed and not plog._pending_paths  # the rolled segment's files too
    # a roll needs new files: a retriable error, nothing stored, the log still writable
    end = plog.log_end_offset
    with pytest.raises(StorageUnavailableError) as e:
        for i in range(40):
            await plog.append_durable(batch(200 + i))
            end = plog.log_end_offset
    assert e.value.errno == errno.EMFILE and plog.log_end_offset == end
    monkeypatch.setattr(os, "open", real_open)
    monkeypatch.setattr(os, "close", real_close)
    info = await plog.append_durable(batch(250))
    assert info.base_offset == end and plog.status == "ok"
    mgr.close()
    again = LogManager(tmp_path, CONFIG)
    again.open_existing()
    assert again.get("t", 0).log_end_offset == info.last_offset + 1
    again.close()


def test_file_cache_closes_idle_descriptors_and_retries_when_out_of_them(tmp_path, monkeypatch):
    cache = FileCache(100)
    for i in range(8):
        (tmp_path / f"f{i}").write_bytes(b"x")
        cache.fd(str(tmp_path / f"f{i}"))
    (tmp_path / "new").write_bytes(b"y")
    real_open = os.open
    calls = []

    def emfile_once(path, flags, mode=0o777):  # type: ignore[no-untyped-def]
        calls.append(path)
        if len(calls) == 1:
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, mode)

    monkeypatch.setattr(handles_mod.os, "open", emfile_once)
    fd = cache.fd(str(tmp_path / "new"))
    assert os.pread(fd, 1, 0) == b"y" and len(calls) == 2
    assert cache.evictions == 1 and cache.open_count == 8
    cache.close_all()


def test_producer_state_truncate_forgets_removed_batches():
    state = ProducerStateManager()
    state.update(1, 0, 0, 2, 0, 1, 10)
    state.update(1, 0, 2, 2, 2, 3, 11)
    state.update(2, 0, 0, 1, 4, 4, 12)
    assert state.truncate(3) == 2
    assert state.check(1, 0, 2, 2) is None  # seq 2 is expected next again, not a duplicate
    assert state.check(1, 0, 0, 2) is not None  # the kept batch is still de-duplicated
    assert 2 not in state.producers


# -- corruption ------------------------------------------------------------------------------------


def build(tmp_path, count: int = 10) -> tuple[PartitionLog, list[bytes]]:  # type: ignore[no-untyped-def]
    plog = PartitionLog(tmp_path / "t-3", "t", 3, CONFIG)
    for i in range(count):
        plog.append(batch(i))
    stored = [plog.read(o, 1) for o in range(0, plog.log_end_offset, 2)]
    return plog, stored


def test_damage_after_a_clean_shutdown_is_found_on_first_read_and_never_served(tmp_path):
    """Before issue 13 segments of a cleanly closed log were trusted: the damaged batch was
    served as it was, and nothing was logged."""
    plog, stored = build(tmp_path, 10)
    path = plog._segments[-1].log_path
    plog.close()
    pos = sum(len(b) for b in stored[:4]) + 120  # inside batch 4 (offsets 8, 9)
    flip(path, pos, mask=0x10)
    with structlog.testing.capture_logs() as logs:
        again = PartitionLog(tmp_path / "t-3", "t", 3, CONFIG)
        assert again.recovery.clean  # no scan at start
        assert again.read(0, 1) == stored[0]
        with pytest.raises(CorruptLogError) as e:
            again.read(8, 1 << 20)
    assert e.value.offset == 8 and "offsets 8..9" in str(e.value) and "t[3]" in str(e.value)
    (err,) = [x for x in logs if x["log_level"] == "error"]
    assert err["topic"] == "t" and err["partition"] == 3 and err["first_offset"] == 8
    # a read running into the damage stops before it; everything after it is kept and served
    assert again.read(0, 1 << 20) == b"".join(stored[:4])
    for i in range(5, 10):
        assert again.read(2 * i, 1) == stored[i]
    assert again.read(10, 1 << 20) == b"".join(stored[5:])
    assert again.status == "corrupt" and again.log_end_offset == 20
    with pytest.raises(CorruptLogError):
        again.append(batch(99))
    again.close()


def test_after_a_clean_restart_each_batch_is_crc_checked_once_not_on_every_read(tmp_path, monkeypatch):
    """The lazy check remembers what it checked: a consumer reading on from its commit (not
    from the segment's start) after a restart paid a CRC of every batch on every fetch, since
    only a read from position 0 grew the known-good prefix."""
    plog, stored = build(tmp_path, 10)
    plog.close()
    again = PartitionLog(tmp_path / "t-3", "t", 3, CONFIG)
    checked: list[int] = []
    real = segment_mod.crc32
    monkeypatch.setattr(segment_mod, "crc32", lambda data: checked.append(len(data)) or real(data))
    assert again.read(10, 1 << 20) == b"".join(stored[5:])
    assert len(checked) == 5  # batches 5..9, checked on first read
    again.append(batch(10))
    checked.clear()
    assert again.read(10, 1 << 20) == b"".join(stored[5:]) + again.read(20, 1 << 20)
    assert again.read(14, 1 << 20)[: len(stored[7])] == stored[7]
    assert checked == []  # known good now, and so is what was appended since the restart
    again.close()


def test_inconsistent_offset_index_is_detected_and_rebuilt_from_the_log(tmp_path):
    plog, stored = build(tmp_path, 30)
    seg = plog._segments[0]
    index_path, positions = seg.index.path, list(seg.index.positions)
    plog.close()
    assert len(positions) >= 3
    # plausible (increasing, inside the file) but wrong: every entry points 7 bytes too far
    data = bytearray(pathlib.Path(index_path).read_bytes())
    for i in range(len(positions)):
        pos = int.from_bytes(data[8 * i + 4 : 8 * i + 8], "little")
        data[8 * i + 4 : 8 * i + 8] = (pos + 7).to_bytes(4, "little")
    pathlib.Path(index_path).write_bytes(bytes(data))
    with structlog.testing.capture_logs() as logs:
        again = PartitionLog(tmp_path / "t-3", "t", 3, CONFIG)
        for i in range(len(stored)):
            assert again.read(2 * i, 1) == stored[i]
    assert any(x["event"] == "offset index inconsistent with the log; rebuilding it" for x in logs)
    assert again.status == "ok"
    again.close()


def test_verify_reports_damage_and_rebuilds_an_inconsistent_index(tmp_path):
    plog, stored = build(tmp_path, 60)
    assert plog.segment_count >= 3
    first, second = plog._segments[0], plog._segments[1]
    plog.close()
    flip(first.log_path, 57 + 30, mask=0x10)  # the body of the first batch
    with open(second.index.path, "r+b") as f:
        f.write((1).to_bytes(4, "little") + (3).to_bytes(4, "little"))
    again = PartitionLog(tmp_path / "t-3", "t", 3, CONFIG)
    report = again.verify()
    assert not report.ok and report.first_corrupt_offset == 0
    assert len(report.problems) == 1 and "offsets 0..1" in report.problems[0]
    assert len(report.indexes_rebuilt) == 1 and os.path.basename(second.log_path) in report.indexes_rebuilt[0]
    assert report.batches == 59 and again.status == "corrupt"
    assert again.verify().indexes_rebuilt == []  # rebuilt once, consistent now
    again.close()


def test_scan_tells_a_torn_tail_from_damage_in_the_middle():
    raw = [records.encode([bytes([i]) * 50], timestamp_ms=1) for i in range(4)]
    parts = []
    for i, b in enumerate(raw):
        ba = bytearray(b)
        records.patch_base_offset(ba, 0, 10 + i)
        parts.append(bytes(ba))
    data = bytearray(b"".join(parts))
    size = len(parts[0])

    def events(buf: bytes) -> list[object]:
        return list(
            scan_batches(lambda n, pos: bytes(buf[pos : pos + n]), len(buf), 10, max_batch_bytes=1 << 20,
                         max_relative_offset=2**32 - 1, chunk_bytes=64)
        )

    assert [type(e) for e in events(bytes(data))] == [Batch] * 4
    torn = bytes(data[: 3 * size + 20])
    ev = events(torn)
    assert [type(e) for e in ev] == [Batch, Batch, Batch, Tail] and ev[-1].position == 3 * size
    # the length field of batch 1 damaged: found again by the magic byte of batch 2
    bad = bytearray(data)
    bad[size + 9] ^= 0x7F
    ev = events(bytes(bad))
    assert [type(e) for e in ev] == [Batch, Damaged, Batch, Batch]
    d = ev[1]
    assert (d.position, d.end, d.first_offset, d.last_offset) == (size, 2 * size, 11, 11)
    # garbage in the middle holding no offsets
    ev = events(bytes(data[:size]) + os.urandom(33) + bytes(data[size:]))
    assert [type(e) for e in ev] == [Batch, Damaged, Batch, Batch, Batch]
    assert ev[1].last_offset < ev[1].first_offset


async def test_rollback_across_a_roll_removes_the_new_segment_and_reopens_consistent(tmp_path):
    fsync = FailingFsync()
    plog = open_log(tmp_path, fsync=fsync)
    await plog.append_durable(batch(0))
    durable = plog.log_end_offset
    segments = plog.segment_count
    fsync.fail = 1_000  # every fsync fails until the "disk" is repaired
    new_files = []
    while plog.segment_count == segments:  # acks=1 appends until a roll (nothing fsynced since)
        plog.append(batch(1))
        new_files = [s.log_path for s in plog._segments[segments:]]
    for fut in list(plog._background):  # the roll's own background flush fails and rolls back
        fut.result(10)
    assert plog.log_end_offset == durable and plog.segment_count == segments
    assert new_files and not any(os.path.exists(p) for p in new_files)
    assert os.path.getsize(plog._segments[-1].log_path) == plog.size_bytes
    with pytest.raises(StorageUnavailableError):
        await plog.append_durable(batch(2))
    assert plog.log_end_offset == durable
    fsync.fail = 0
    info = await plog.append_durable(batch(3))
    assert info.base_offset == durable
    plog.close()
    again = open_log(tmp_path)
    assert again.recovery.clean and again.log_end_offset == info.last_offset + 1
    assert [next(iter(b)).value[:1] for b in all_batches(again)] == [b"\x00", b"\x03"]
    again.close()


def test_damage_at_the_end_of_a_sealed_segment_names_the_lost_offsets(tmp_path):
    plog, stored = build(tmp_path, 60)
    first = plog._segments[0]
    next_base = plog._segments[1].base_offset
    plog.close()
    # the last batch of the first segment: its length field (an impossible value: no resync)
    size = os.path.getsize(first.log_path)
    last_pos = size - len(stored[next_base // 2 - 1])
    with open(first.log_path, "r+b") as f:
        f.seek(last_pos + 8)
        f.write((2**31 - 1).to_bytes(4, "little"))
    again = PartitionLog(tmp_path / "t-3", "t", 3, CONFIG)
    with pytest.raises(CorruptLogError) as e:
        again.read(next_base - 2, 1 << 20)
    assert e.value.offset == next_base - 2 and f"offsets {next_base - 2}..{next_base - 1}" in str(e.value)
    assert again.read(next_base, 1) == stored[next_base // 2]  # the next segment is intact
    assert again.read(0, 1) == stored[0]
    again.close()
