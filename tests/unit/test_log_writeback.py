"""Write-back pacing (broker/log/writeback.py): a segment starts the write-back of what it appended
every `writeback_bytes`, on the descriptor of the handle cache, never past the written end, from
where the last start stopped (also after a truncation), and a failing start changes nothing."""

from __future__ import annotations

import ctypes
import errno
import os
import sys

import pytest

from dmq.broker.log import LogConfig, PartitionLog, writeback
from dmq.proto import records


def batch(size: int, tag: int = 0) -> bytes:
    return records.encode([bytes([tag % 256]) * size], timestamp_ms=1)


class Recorder:
    """Stands in for libc's sync_file_range: records each call and the file's size at that time."""

    def __init__(self, fail: int = 0) -> None:
        self.calls: list[tuple[int, int, int, int, int]] = []  # fd, offset, nbytes, flags, file size
        self.fail = fail

    def __call__(self, fd: int, offset: int, nbytes: int, flags: int) -> int:
        self.calls.append((fd, offset, nbytes, flags, os.fstat(fd).st_size))
        if self.fail:
            ctypes.set_errno(self.fail)
            return -1
        return 0


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(writeback, "_sync_file_range", rec)
    monkeypatch.setattr(writeback, "WRITEBACK_BYTES", 10_000)
    return rec


def open_log(path) -> PartitionLog:  # type: ignore[no-untyped-def]
    return PartitionLog(path / "t-0", "t", 0, LogConfig())


def test_writeback_starts_every_n_bytes_on_the_cached_descriptor(tmp_path, recorder):
    plog = open_log(tmp_path)
    sizes = []
    for i in range(20):
        plog.append(batch(3_000, tag=i))
        sizes.append(plog.size_bytes)
    seg = plog._segments[-1]
    cached_fd = plog._cache.fd(seg.log_path)
    assert len(recorder.calls) >= 5
    expected_start = 0
    for fd, offset, nbytes, flags, file_size in recorder.calls:
        assert fd == cached_fd  # from the handle cache, not a new open
        assert flags == writeback.SYNC_FILE_RANGE_WRITE
        assert offset == expected_start  # contiguous: every byte is started exactly once
        assert nbytes >= 10_000
        assert offset + nbytes <= file_size  # never past what is written
        assert offset + nbytes in sizes  # at a batch boundary
        expected_start = offset + nbytes
    # What is left unstarted is less than one step.
    assert 0 <= seg.size - expected_start < 10_000
    plog.close()


def test_writeback_resumes_from_a_truncation_point(tmp_path, recorder):
    plog = open_log(tmp_path)
    for i in range(8):
        plog.append(batch(3_000, tag=i))
    seg = plog._segments[-1]
    started = sum(n for _, _, n, _, _ in recorder.calls)
    assert started > 0
    keep = seg.position_of(2)  # cut back below what was started
    seg.truncate_to(keep, 2)
    recorder.calls.clear()
    for i in range(6):
        plog._segments[-1].append([memoryview(batch(3_000, tag=i))], len(batch(3_000)), 100 + i, 100 + i, 1)
    assert recorder.calls
    assert recorder.calls[0][1] == keep  # starts again where the file now ends, not past it
    for _, offset, nbytes, _, file_size in recorder.calls:
        assert offset + nbytes <= file_size
    plog.close()


def test_a_failing_writeback_is_ignored(tmp_path, monkeypatch):
    rec = Recorder(fail=errno.EIO)
    monkeypatch.setattr(writeback, "_sync_file_range", rec)
    monkeypatch.setattr(writeback, "WRITEBACK_BYTES", 10_000)
    with pytest.raises(OSError) as e:
        writeback.start(0, 0, 1)
    assert e.value.errno == errno.EIO
    rec.calls.clear()
    plog = open_log(tmp_path)
    infos = [plog.append(batch(3_000, tag=i)) for i in range(10)]
    assert rec.calls  # it was tried, failed, and the appends went on
    assert [i.base_offset for i in infos] == list(range(10))
    plog.flush()
    data = plog.read(0, 1 << 20)
    assert [b.header.base_offset for b in records.decode_batches(data)] == list(range(10))
    plog.close()


def test_writeback_zero_disables(tmp_path, recorder, monkeypatch):
    monkeypatch.setattr(writeback, "WRITEBACK_BYTES", 0)
    plog = open_log(tmp_path)
    for i in range(10):
        plog.append(batch(3_000, tag=i))
    assert recorder.calls == []
    plog.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux only")
def test_real_sync_file_range(tmp_path):
    assert writeback._sync_file_range is not None
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"x" * 100_000)
        writeback.start(fd, 0, 100_000)  # succeeds
    finally:
        os.close(fd)
    with pytest.raises(OSError) as e:
        writeback.start(fd, 0, 100_000)  # closed descriptor
    assert e.value.errno == errno.EBADF
