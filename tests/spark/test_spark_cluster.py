"""The source and sink on a real standalone Spark cluster (a master and two workers, each its own
process), driven by a driver process submitting to spark://: the executors fetch and produce."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.spark.conftest import _spark_available
from tests.spark.standalone import StandaloneCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]

DRIVER = pathlib.Path(__file__).with_name("cluster_driver.py")
DRIVER_TIMEOUT_S = 300
PARTITIONS = 6
ROWS_PER_PARTITION = 200_000 // PARTITIONS + 1  # 200,004 in all


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    reason = _spark_available()
    if reason:
        pytest.skip(reason)
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"))
    try:
        cluster.start(workers=2)
        yield cluster
    finally:
        cluster.stop()


def run_driver(spark_cluster: Any, *args: str) -> dict[str, Any]:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    proc = subprocess.run([sys.executable, str(DRIVER), spark_cluster.master_url, *args], capture_output=True,
                          text=True, timeout=DRIVER_TIMEOUT_S, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("SUMMARY ")]
    assert proc.returncode == 0 and lines, f"driver failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    summary: dict[str, Any] = json.loads(lines[-1].removeprefix("SUMMARY "))
    return summary


def bytes_fetched(cluster: Any, topic: str) -> float:
    """Record bytes the broker answered to consumer fetches of `topic` (its dmq_broker_bytes_out)."""
    total = 0.0
    for metric in cluster.cluster.brokers[0].metrics.collect():
        for sample in metric.samples:
            if sample.name.startswith("dmq_broker_bytes_out") and sample.labels.get("topic") == topic:
                total += sample.value
    return total


def values(p: int) -> list[bytes]:
    return [f"p{p}-{i:06d}".encode() for i in range(ROWS_PER_PARTITION)]


def test_on_the_cluster_executors_read_and_write(spark_cluster, dmq, cluster, topic_name):
    """One driver application (a JVM start costs tens of seconds here): a batch read of 200,004
    records from 6 partitions, then a copy of another topic through the sink."""
    topic = dmq.create(topic_name("cl"), partitions=PARTITIONS)
    for p in range(PARTITIONS):
        dmq.send_values(topic, values(p), partition=p)
    source = dmq.create(topic_name("cls"), partitions=2)
    target = dmq.create(topic_name("clt"), partitions=2)
    sent = [f"v{i}".encode() for i in range(2000)]
    dmq.send_values(source, sent)
    before = bytes_fetched(cluster, topic)

    summary = run_driver(spark_cluster, dmq.bootstrap, topic, source, target)

    rows = PARTITIONS * ROWS_PER_PARTITION
    assert summary["partitions"] == {str(p): [ROWS_PER_PARTITION, 0, ROWS_PER_PARTITION - 1] for p in range(PARTITIONS)}
    assert (summary["rows"], summary["distinct_values"]) == (rows, rows)
    assert summary["crc_sum"] == sum(zlib.crc32(v) for p in range(PARTITIONS) for v in values(p))
    # every task (and only tasks call read(), which fetches) ran on the two executors, none in the
    # driver; the broker served the topic's records to those fetches
    tasks = summary["tasks_after_read"]
    assert tasks.get("driver", 0) == 0 and len([e for e in tasks if e != "driver"]) == 2, tasks
    assert sum(tasks.values()) >= PARTITIONS
    assert bytes_fetched(cluster, topic) - before >= sum(len(v) for p in range(PARTITIONS) for v in values(p))
    # the sink's tasks, too, ran on the executors and wrote every row
    assert sorted(r.value for r in dmq.read_all(target)) == sorted(sent)
    after = summary["tasks_after_copy"]
    assert after.get("driver", 0) == 0 and sum(after.values()) > sum(tasks.values()), after
