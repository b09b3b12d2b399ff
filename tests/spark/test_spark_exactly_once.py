"""Exactly-once output from a stream through driver crashes: a query copies topic A to topic B
with the dmq sink; its driver (the Python process, its JVM and its Python workers: one process
group) is SIGKILLed three times while micro-batches are being written, and restarted from the
checkpoint each time; a last run with Trigger.AvailableNow finishes the copy. B must then hold
every record of A exactly once.

A kill lands while a micro-batch's tasks are producing (B has grown past a mark; a micro-batch
takes far longer to write than the test takes to notice), so the restarted query re-runs that
batch: its rows already in B must not be written again."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import pytest

from dmq.client import SimpleConsumer
from tests.spark.conftest import _spark_available

# four driver starts (a JVM each: 30-76 s apiece measured at load average ~9 on 2 cores) do not
# fit the suite's 300 s default timeout; the waits inside have their own deadlines
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

DRIVER = pathlib.Path(__file__).with_name("exactly_once_driver.py")
RECORDS = 100_000
PARTITIONS = 4
KILLS = 3
PROGRESS_TIMEOUT_S = 180  # a driver's start (a JVM) and its first rows, on a loaded 2-core machine
FINISH_TIMEOUT_S = 300


def start_driver(bootstrap: str, source: str, target: str, checkpoint: pathlib.Path, mode: str,
                 log: pathlib.Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    with open(log, "ab") as out:
        # its own session: the whole driver (Python, JVM, Python workers) is killed as one group
        return subprocess.Popen([sys.executable, str(DRIVER), bootstrap, source, target, str(checkpoint), mode],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL every process of the driver's group and wait until none is left."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)
    deadline = time.monotonic() + 30
    while True:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        assert time.monotonic() < deadline, "the killed driver's processes did not exit"
        time.sleep(0.05)


def records_in(consumer: SimpleConsumer, topic: str) -> int:
    return sum(consumer.offsets(topic, p)[1] for p in range(PARTITIONS))


def test_stream_writes_each_record_once_through_driver_kills(dmq: Any, topic_name: Any,
                                                             tmp_path: pathlib.Path) -> None:
    reason = _spark_available()
    if reason:
        pytest.skip(reason)
    source = dmq.create(topic_name("a"), partitions=PARTITIONS)
    # the window outlasts a driver's restart on a loaded machine (README: the window is the limit)
    target = dmq.create(topic_name("b"), partitions=PARTITIONS, config={"dedup_window_ms": 600_000})
    keys = [f"k{i}".encode() for i in range(RECORDS)]
    values = [f"v{i}".encode() for i in range(RECORDS)]
    for i in range(0, RECORDS, 10_000):
        dmq.producer.send_many(source, values[i:i + 10_000], keys[i:i + 10_000])
    dmq.producer.flush(60)

    checkpoint = tmp_path / "checkpoint"
    log = tmp_path / "driver.log"
    with SimpleConsumer(dmq.bootstrap, max_wait_ms=0) as consumer:
        for kill in range(1, KILLS + 1):
            mark = records_in(consumer, target) + 10_000
            t0 = time.monotonic()
            proc = start_driver(dmq.bootstrap, source, target, checkpoint, "stream", log)
            try:
                deadline = time.monotonic() + PROGRESS_TIMEOUT_S
                while records_in(consumer, target) < mark:
                    assert proc.poll() is None, f"driver exited ({proc.returncode}):\n{log.read_text()[-6000:]}"
                    assert time.monotonic() < deadline, f"no progress to {mark} in B:\n{log.read_text()[-6000:]}"
                    time.sleep(0.02)
            finally:
                kill_group(proc)
            print(f"kill {kill}: {records_in(consumer, target)} records in B after {time.monotonic() - t0:.1f} s")

        proc = start_driver(dmq.bootstrap, source, target, checkpoint, "available-now", log)
        try:
            assert proc.wait(FINISH_TIMEOUT_S) == 0, f"driver failed:\n{log.read_text()[-6000:]}"
        finally:
            kill_group(proc)

    got = dmq.read_all(target)
    copies = Counter((r.key, r.value) for r in got)
    duplicated = {kv: n for kv, n in copies.items() if n > 1}
    assert not duplicated, f"{sum(duplicated.values()) - len(duplicated)} duplicates, e.g. {list(duplicated.items())[:3]}"
    assert len(got) == RECORDS
    assert set(copies) == set(zip(keys, values))
