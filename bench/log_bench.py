"""Partition log benchmark: append / read / recovery throughput against the raw disk.

Prints, in one run:
  - raw sequential os.write MB/s (1 MiB writes, files of segment_bytes, same directory)
  - log append MB/s and records/s, 100-byte values in ~1 MiB batches, no fsync
  - the same with acks=all (append_durable, group commit) and several concurrent appenders,
    with the number of fsyncs and batches per fsync; and with small batches, where grouping matters
  - sequential read MB/s (PartitionLog.read, 1 MiB max_bytes)
  - recovery seconds of an unclean --size active segment (page cache warm, then cold)
  - records.encode / records.decode records/s for 100-byte values

    python bench/log_bench.py [--size BYTES] [--dir DIR] [--appenders N]

Every write phase starts after os.sync() on an empty directory so that write-back of an earlier
phase does not slow the next one. The goal: log append >= 80% of the raw write bandwidth.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import threading
import time

import structlog

from dmq.broker.log import LogConfig, PartitionLog
from dmq.broker.log.fsync_placement import FsyncPlacement
from dmq.proto import records

MiB = 1024 * 1024
VALUE_BYTES = 100
RECORDS_PER_BATCH = 9000  # ~1 MiB batches with 100-byte values


def fmt_rate(nbytes: float, seconds: float) -> str:
    return f"{nbytes / MiB / seconds:9.1f} MB/s"


def make_batches(records_per_batch: int, distinct: int = 4) -> list[bytes]:
    out = []
    for i in range(distinct):
        values = [bytes([65 + (i + j) % 26]) * VALUE_BYTES for j in range(records_per_batch)]
        out.append(records.encode(values, timestamp_ms=1_700_000_000_000))
    return out


def fresh_dir(root: str, name: str) -> str:
    path = os.path.join(root, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    os.sync()
    return path


def bench_raw_write(root: str, size: int, segment_bytes: int) -> float:
    d = fresh_dir(root, "raw")
    chunk = os.urandom(MiB)
    written = 0
    t0 = time.perf_counter()
    n_file = 0
    while written < size:
        fd = os.open(os.path.join(d, f"{n_file:020d}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        in_file = 0
        while in_file + len(chunk) <= segment_bytes and written < size:
            os.write(fd, chunk)
            in_file += len(chunk)
            written += len(chunk)
        os.close(fd)
        n_file += 1
    dt = time.perf_counter() - t0
    shutil.rmtree(d)
    return written / dt


def bench_append(root: str, size: int, segment_bytes: int, batches: list[bytes]) -> tuple[float, float]:
    d = fresh_dir(root, "append")
    config = LogConfig(segment_bytes=segment_bytes, flush_policy="interval")  # no fsync at all
    plog = PartitionLog(os.path.join(d, "bench-0"), "bench", 0, config)
    n = 0
    written = 0
    count = records.read_header(batches[0]).record_count
    t0 = time.perf_counter()
    while written < size:
        b = batches[n % len(batches)]
        plog.append(b)
        written += len(b)
        n += 1
    dt = time.perf_counter() - t0
    plog.abandon()
    shutil.rmtree(d)
    return written / dt, n * count / dt


def bench_interleaved(
    root: str, size: int, segment_bytes: int, batches: list[bytes], flush_policy: str
) -> tuple[float, float, float]:
    """Raw os.write and log append of the same bytes, alternating batch by batch, so both see
    the same page-cache and write-back conditions (standalone runs on a shared VM disk vary
    several-fold from run to run). Returns (raw B/s, append B/s, append records/s)."""
    d = fresh_dir(root, "interleaved")
    plog = PartitionLog(
        os.path.join(d, "bench-0"), "bench", 0, LogConfig(segment_bytes=segment_bytes, flush_policy=flush_policy)
    )
    count = records.read_header(batches[0]).record_count
    raw_fd, raw_in_file, raw_files = -1, segment_bytes, 0
    raw_s = log_s = 0.0
    written = n = 0
    perf = time.perf_counter
    while written < size:
        b = batches[n % len(batches)]
        if raw_in_file + len(b) > segment_bytes:  # roll the raw file like the log rolls segments
            if raw_fd >= 0:
                os.close(raw_fd)
            raw_fd = os.open(os.path.join(d, f"raw-{raw_files}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            raw_files += 1
            raw_in_file = 0
        # alternate which goes first so neither always meets the other's write-back
        if n % 2:
            t0 = perf()
            os.write(raw_fd, b)
            t1 = perf()
            plog.append(b)
            t2 = perf()
            raw_s += t1 - t0
            log_s += t2 - t1
        else:
            t0 = perf()
            plog.append(b)
            t1 = perf()
            os.write(raw_fd, b)
            t2 = perf()
            log_s += t1 - t0
            raw_s += t2 - t1
        raw_in_file += len(b)
        written += len(b)
        n += 1
    os.close(raw_fd)
    plog.abandon()
    shutil.rmtree(d)
    return written / raw_s, written / log_s, n * count / log_s


class CountingFsync:
    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def __call__(self, fd: int) -> None:
        with self.lock:
            self.calls += 1
        os.fdatasync(fd)


def bench_durable(
    root: str, size: int, segment_bytes: int, batches: list[bytes], appenders: int, inline: bool
) -> tuple[float, float, int, int]:
    """inline: with the broker's FsyncPlacement (fast fsyncs on the loop thread); else all in the pool."""
    d = fresh_dir(root, "durable")
    fsync = CountingFsync()
    plog = PartitionLog(
        os.path.join(d, "bench-0"),
        "bench",
        0,
        LogConfig(segment_bytes=segment_bytes),
        fsync=fsync,
        fsync_placement=FsyncPlacement() if inline else None,
    )
    count = records.read_header(batches[0]).record_count
    per_appender = size // appenders
    appended = 0

    async def appender(k: int) -> None:
        nonlocal appended
        written = 0
        i = k
        while written < per_appender:
            b = batches[i % len(batches)]
            await plog.append_durable(b)
            written += len(b)
            appended += 1
            i += 1

    async def run() -> float:
        t0 = time.perf_counter()
        await asyncio.gather(*(appender(k) for k in range(appenders)))
        return time.perf_counter() - t0

    dt = asyncio.run(run())
    total = appended * len(batches[0])
    plog.abandon()
    shutil.rmtree(d)
    return total / dt, appended * count / dt, fsync.calls, appended


def bench_read_and_recovery(root: str, size: int, batches: list[bytes]) -> dict[str, float]:
    d = fresh_dir(root, "recovery")
    path = os.path.join(d, "bench-0")
    config = LogConfig(segment_bytes=2**31 - 1)  # one active segment of `size` bytes
    plog = PartitionLog(path, "bench", 0, config)
    written = 0
    n = 0
    while written < size:
        b = batches[n % len(batches)]
        plog.append(b)
        written += len(b)
        n += 1
    plog.flush()
    out: dict[str, float] = {"segment_bytes": float(plog.size_bytes)}

    # sequential read of everything, 1 MiB per call
    t0 = time.perf_counter()
    offset, total = 0, 0
    while offset < plog.log_end_offset:
        data = plog.read(offset, MiB)
        total += len(data)
        offset = records.read_header(data, len(data) - len(batches[0])).last_offset + 1
    out["read_bps"] = total / (time.perf_counter() - t0)
    plog.abandon()  # unclean: no clean-shutdown marker, so reopening scans the active segment

    t0 = time.perf_counter()
    plog = PartitionLog(path, "bench", 0, config)
    out["recovery_warm_s"] = time.perf_counter() - t0
    assert not plog.recovery.clean and plog.recovery.bytes_scanned >= size
    plog.abandon()

    # cold: drop this file from the page cache (no root needed) and scan again
    seg = os.path.join(path, f"{0:020d}.log")
    fd = os.open(seg, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    t0 = time.perf_counter()
    plog = PartitionLog(path, "bench", 0, config)
    out["recovery_cold_s"] = time.perf_counter() - t0
    plog.abandon()
    shutil.rmtree(d)
    return out


def bench_codec(n_records: int = 200_000, per_batch: int = 1000) -> tuple[float, float]:
    values = [os.urandom(VALUE_BYTES) for _ in range(per_batch)]
    t0 = time.perf_counter()
    encoded = [records.encode(values, timestamp_ms=1) for _ in range(n_records // per_batch)]
    enc = n_records / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    seen = 0
    for buf in encoded:
        for rec in records.decode(buf):
            seen += len(rec.value)
    dec = n_records / (time.perf_counter() - t0)
    assert seen == n_records * VALUE_BYTES
    return enc, dec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=1024 * MiB, help="bytes per write phase and recovery segment")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir next to this repo)")
    parser.add_argument("--segment-bytes", type=int, default=256 * MiB)
    parser.add_argument("--appenders", type=int, default=8, help="concurrent acks=all appenders")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved runs per flush policy")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # warnings only

    root = args.dir or tempfile.mkdtemp(prefix="dmq-log-bench-", dir=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.makedirs(root, exist_ok=True)
    size, seg = args.size, args.segment_bytes
    big = make_batches(RECORDS_PER_BATCH)
    small = make_batches(100)  # ~11 KiB batches
    print(f"log_bench: size={size / MiB:.0f} MiB, segment_bytes={seg / MiB:.0f} MiB, dir={root}, python {sys.version.split()[0]}")
    print(f"batches: {len(big[0]) / MiB:.2f} MiB ({RECORDS_PER_BATCH} x {VALUE_BYTES}-byte values); small {len(small[0])} bytes (100 values)")
    try:
        raw = bench_raw_write(root, size, seg)
        print(f"raw os.write (1 MiB writes), alone       {fmt_rate(raw, 1)}")
        bps, rps = bench_append(root, size, seg, big)
        print(f"log append, no fsync, alone              {fmt_rate(bps, 1)}  {rps / 1e6:6.2f} M records/s")
        print("  (alone figures swing several-fold between runs on this disk; the interleaved ratio is the stable one)")
        print(f"interleaved with raw writes, batch by batch, {args.repeat} runs each (CRC: {records.crc32.__module__}):")
        for policy, what in (
            ("interval", "no fsync at all"),
            ("fsync", "acks=1; rolled segments fsynced in the background"),
        ):
            runs = sorted(
                (bench_interleaved(root, size, seg, big, policy) for _ in range(args.repeat)),
                key=lambda r: r[1] / r[0],
            )
            raw_i, bps, rps = runs[len(runs) // 2]
            ratios = ", ".join(f"{100 * r[1] / r[0]:.0f}%" for r in runs)
            print(
                f"  flush_policy={policy:8} raw {raw_i / MiB:7.1f} MB/s, log append {bps / MiB:7.1f} MB/s "
                f"{rps / 1e6:6.2f} M records/s: median {100 * bps / raw_i:.0f}% of raw (runs: {ratios}) - {what}"
            )
        for inline in (False, True):
            where = "fsync inline/pool" if inline else "fsync in pool    "
            bps, rps, fsyncs, n = bench_durable(root, size, seg, big, args.appenders, inline)
            print(
                f"log append_durable x{args.appenders} (acks=all), {where}        {fmt_rate(bps, 1)}  "
                f"{rps / 1e6:6.2f} M records/s  ({n} batches, {fsyncs} fsyncs, {n / max(fsyncs, 1):.1f} batches/fsync)"
            )
            small_size = min(size, 64 * MiB)
            bps, rps, fsyncs, n = bench_durable(root, small_size, seg, small, 4 * args.appenders, inline)
            print(
                f"log append_durable x{4 * args.appenders} small batches, {where}    {fmt_rate(bps, 1)}  "
                f"{rps / 1e6:6.2f} M records/s  ({n} batches, {fsyncs} fsyncs, {n / max(fsyncs, 1):.1f} batches/fsync)"
            )
        r = bench_read_and_recovery(root, size, big)
        print(f"log read (1 MiB max_bytes, page cache)   {fmt_rate(r['read_bps'], 1)}")
        print(
            f"recovery of a {r['segment_bytes'] / MiB:.0f} MiB active segment        "
            f"{r['recovery_warm_s']:6.2f} s warm ({r['segment_bytes'] / MiB / r['recovery_warm_s']:.0f} MB/s), "
            f"{r['recovery_cold_s']:6.2f} s cold ({r['segment_bytes'] / MiB / r['recovery_cold_s']:.0f} MB/s)"
        )
        enc, dec = bench_codec()
        print(f"records.encode, 100-byte values          {enc / 1e6:9.2f} M records/s (1000 per batch)")
        print(f"records.decode + iterate, 100-byte values{dec / 1e6:9.2f} M records/s")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
