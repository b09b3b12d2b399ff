"""One LogManager holding 10,000 partitions with a small file-descriptor budget: the process's
open descriptors must stay within baseline + max_open_files the whole time."""

from __future__ import annotations

import os

import pytest

from dmq.broker.log import LogConfig, LogManager
from dmq.proto import records

PARTITIONS = 10_000
MAX_OPEN_FILES = 256


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.slow
def test_ten_thousand_partitions_with_bounded_file_descriptors(tmp_path):
    baseline = open_fds()
    bound = baseline + MAX_OPEN_FILES
    peak = baseline
    config = LogConfig(segment_bytes=1024)  # so that some partitions roll segments
    mgr = LogManager(tmp_path, config, max_open_files=MAX_OPEN_FILES)

    def check() -> None:
        nonlocal peak
        peak = max(peak, open_fds())
        assert peak <= bound, f"{peak} open descriptors, bound {bound}: {mgr!r}"

    keys = [(f"topic-{i % 100}", i // 100) for i in range(PARTITIONS)]
    payload = records.encode([b"x" * 250], timestamp_ms=1)
    for i, (t, p) in enumerate(keys):
        plog = mgr.create(t, p)
        plog.append(records.encode([f"{t}/{p}".encode()], timestamp_ms=1))
        if i % 500 == 0:
            check()
    # a second pass in another order: every partition's files were evicted and reopen lazily
    for i, (t, p) in enumerate(reversed(keys)):
        plog = mgr.get(t, p)
        assert records.decode(plog.read(0, 1 << 16)).header.base_offset == 0
        assert next(iter(records.decode(plog.read(0, 1 << 16)))).value == f"{t}/{p}".encode()
        plog.append(payload)
        if i % 500 == 0:
            check()
    assert mgr.file_cache.evictions > PARTITIONS
    # some partitions roll several segments; reads across them reopen old segments too
    for t, p in keys[:50]:
        plog = mgr.get(t, p)
        for _ in range(10):
            plog.append(payload)
        assert plog.segment_count > 1
        for offset in range(plog.log_end_offset):
            assert records.read_header(plog.read(offset, 1)).last_offset >= offset
    check()
    mgr.close()
    check()

    # reopen: cleanly closed partitions are registered, not opened, until used
    mgr = LogManager(tmp_path, config, max_open_files=MAX_OPEN_FILES)
    mgr.open_existing()
    assert len(mgr.partitions()) == PARTITIONS and mgr.open_logs() == []
    for i, (t, p) in enumerate(keys[::7]):
        plog = mgr.get(t, p)
        assert plog.recovery.clean and plog.log_end_offset >= 2
        assert records.read_header(plog.read(1, 100)).base_offset == 1
        if i % 200 == 0:
            check()
    mgr.close()
    check()
