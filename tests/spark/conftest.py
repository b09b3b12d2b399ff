"""Spark fixtures: ONE local SparkSession for every Spark test (starting one costs ~10 s).

The session runs its Python workers with this interpreter (local_session sets PYSPARK_PYTHON /
PYSPARK_DRIVER_PYTHON and spark.pyspark.python), so they import the same `dmq`. Each test still
gets its own DMQ cluster (the `cluster` fixture of tests/conftest.py) and fresh topic names.
"""

from __future__ import annotations

import itertools
import shutil
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dmq.client import AdminClient, Producer, SimpleConsumer


def _spark_available() -> str | None:
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as e:
        return f"pyspark/pyarrow not installed: {e}"
    if shutil.which("java") is None:
        return "no java on PATH (Spark needs Java 17)"
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    reason = _spark_available()
    if reason:
        pytest.skip(reason)
    from dmq.client.spark import local_session

    session = local_session(
        "dmq-tests",
        conf={
            # tiny jobs: fewer tasks and no adaptive re-planning keep each query well under a second
            "spark.sql.shuffle.partitions": "1",
            "spark.sql.adaptive.enabled": "false",
            "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        },
        log_level="ERROR",
    )
    yield session
    session.stop()


_names = itertools.count()


@pytest.fixture
def topic_name() -> Callable[[str], str]:
    def make(prefix: str = "t") -> str:
        return f"{prefix}{next(_names)}x{int(time.time() * 1000) % 100000}"

    return make


class Helper:
    """Produce, read back and administer against one test cluster."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.admin = AdminClient(bootstrap)
        self.producer = Producer(bootstrap, linger_ms=0)

    def create(self, topic: str, partitions: int = 1, config: dict[str, int] | None = None) -> str:
        self.admin.create_topic(topic, partitions, config)
        return topic

    def send(self, topic: str, rows: list[dict[str, Any]]) -> list[Any]:
        """Send rows (value, key, headers, partition, timestamp_ms); return their RecordMetadata."""
        futures = [
            self.producer.send(
                topic,
                r["value"],
                key=r.get("key"),
                headers=r.get("headers"),
                partition=r.get("partition"),
                timestamp_ms=r.get("timestamp_ms"),
            )
            for r in rows
        ]
        self.producer.flush(30)
        return [f.get(30) for f in futures]

    def send_values(self, topic: str, values: list[bytes], partition: int | None = None) -> list[Any]:
        fut = self.producer.send_many(topic, values, partition=partition)
        self.producer.flush(30)
        return fut.get(30)

    def read_all(self, topic: str) -> list[Any]:
        """Every record of every partition of `topic`, through SimpleConsumer."""
        out = []
        with SimpleConsumer(self.bootstrap, max_wait_ms=0) as c:
            for p in range(self.admin.describe_topic(topic).partition_count):
                start, end = c.offsets(topic, p)
                offset = start
                while offset < end:
                    got = c.consume(topic, p, offset, max_records=10_000)
                    out.extend(got)
                    offset = got[-1].offset + 1
        return out

    def close(self) -> None:
        self.producer.close(30)
        self.admin.close()


@pytest.fixture
def dmq(cluster: Any) -> Iterator[Helper]:
    h = Helper(cluster.bootstrap)
    yield h
    h.close()


@pytest.fixture
def dmq3(cluster3: Any) -> Iterator[Helper]:
    """Three brokers, each on its own port: partitions have different leaders."""
    h = Helper(cluster3.bootstrap)
    yield h
    h.close()
