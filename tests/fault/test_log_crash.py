"""SIGKILL a process appending with acks=all at random moments; every acknowledged batch must
survive intact, nothing partial may be visible, and appends must continue at the right offset.

The child (log_crash_child.py) prints a line per acknowledged batch; the parent kills it after a
random delay (sometimes during start-up or recovery), reopens the log in-process and checks.
The seed is printed; rerun with DMQ_CRASH_SEED=<seed> to replay the same kill times.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from dmq.broker.log import LogConfig, PartitionLog
from dmq.proto import records

CHILD = Path(__file__).with_name("log_crash_child.py")
KILLS = 24
CONFIG = LogConfig(segment_bytes=256 * 1024, index_interval_bytes=1024)


OPEN_TIMEOUT_S = 30.0  # a loaded machine can take seconds to start a Python child


def run_child(
    directory: Path, seed: int, run: int, delay_s: float, out: Path, *, after_open: bool = False
) -> list[tuple[int, ...]]:
    """Kill the child delay_s after it started or, with after_open, after it opened the log (so
    that on a loaded machine the kill still lands during appends, not in the interpreter's
    start-up)."""
    with open(out, "wb") as stdout, open(out.with_suffix(".err"), "wb") as stderr:
        child = subprocess.Popen(
            [sys.executable, str(CHILD), str(directory), str(seed), str(run)], stdout=stdout, stderr=stderr
        )
        if after_open:
            deadline = time.monotonic() + OPEN_TIMEOUT_S
            while b"OPEN" not in out.read_bytes() and child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
        try:
            child.wait(timeout=delay_s)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=10)
        else:
            raise AssertionError(f"child exited by itself ({child.returncode}): {out.with_suffix('.err').read_text()}")
    acks = []
    for line in out.read_bytes().split(b"\n")[:-1]:  # a torn last line has no newline
        if line.startswith(b"ACK "):
            acks.append(tuple(int(x) for x in line.split()[1:]))
    return acks


def test_sigkill_during_durable_appends_loses_no_acknowledged_batch(tmp_path):
    seed = int(os.environ.get("DMQ_CRASH_SEED", random.randrange(1 << 31)))
    print(f"DMQ_CRASH_SEED={seed}")
    rng = random.Random(seed)
    directory = tmp_path / "crash-0"
    acked: dict[int, tuple[int, int]] = {}  # base offset -> (last offset, crc), over all runs
    started = time.monotonic()
    runs_with_acks = 0
    for run in range(KILLS):
        early = run % 5 == 0  # killed during start-up or recovery
        delay_s = rng.choice([0.05, 0.2]) if early else rng.uniform(0.05, 0.5)
        acks = run_child(
            directory, rng.randrange(1 << 31), run + 1, delay_s, tmp_path / f"run{run}.out", after_open=not early
        )
        runs_with_acks += bool(acks)
        for base, last, crc, *_ in acks:
            acked[base] = (last, crc)
        where = f"seed={seed} run={run} delay={delay_s:.2f}s"

        plog = PartitionLog(directory, "crash", 0, CONFIG)
        try:
            # every acknowledged batch is there, byte-exact (its CRC) and valid
            for base, (last, crc) in acked.items():
                h = records.validate_batch(plog.read(base, 1))
                assert (h.base_offset, h.last_offset, h.crc) == (base, last, crc), where
            # nothing partial is visible: the whole log is valid batches with contiguous offsets
            offset = plog.log_start_offset
            while offset < plog.log_end_offset:
                chunk = plog.read(offset, 1 << 20)
                for b in records.decode_batches(chunk):  # CRC-verified
                    assert b.header.base_offset == offset, where
                    offset = b.header.last_offset + 1
            assert offset == plog.log_end_offset
            if acked:
                assert plog.log_end_offset > max(last for last, _ in acked.values()), where
            # a retry of each producer's last acknowledged batch is answered with its original offset
            last_per_producer: dict[int, tuple[int, ...]] = {}
            for ack in acks:
                last_per_producer[ack[3]] = ack
            for base, _last, _crc, pid, seq, count in last_per_producer.values():
                retry = records.encode([b"r"] * count, producer_id=pid, producer_epoch=0, base_sequence=seq)
                info = plog.append(retry)
                assert info.duplicate and info.base_offset == base, where
            # and a fresh append continues right at the end
            end = plog.log_end_offset
            info = plog.append(records.encode([b"after crash"]))
            assert info.base_offset == end, where
            acked[info.base_offset] = (info.last_offset, records.read_header(plog.read(end, 1)).crc)
        finally:
            if run % 3 == 0:
                plog.close()
            else:
                plog.flush()  # the parent's own append is acknowledged too: make it durable
                plog.abandon()
    assert runs_with_acks >= KILLS // 2, f"too few runs got to acknowledge anything (seed={seed})"
    assert len(acked) > 100
    print(f"{KILLS} kills, {len(acked)} acknowledged batches checked in {time.monotonic() - started:.1f}s")
