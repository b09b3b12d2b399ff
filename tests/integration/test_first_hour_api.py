"""The first hour of a Kafka user (issue 14 item 3): what failed for them, over a real server.

Each test is written with the public API only, as a kafka-python user would write it, so the file
runs unchanged against the code from before the fix (where every one of them failed).
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from dmq.client import AdminClient, DMQConsumer, OffsetAndMetadata, Producer, TopicPartition
from dmq.client.cli.runner import ClusterThread

TIMEOUT_S = 15.0
FAST = {"heartbeat_interval_ms": 200, "session_timeout_ms": 3000, "retry_backoff_ms": 50}


@pytest.fixture
def server(cluster_factory: Callable[..., ClusterThread]) -> ClusterThread:
    return cluster_factory(rebalance_debounce_ms=100, topics={"events": 2})


def _drain(c: DMQConsumer, n: int) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(got) < n and time.monotonic() < deadline:
        got.extend(c.poll(200))
    return got


def test_kafka_style_settings_produce_and_consume_json(server: ClusterThread) -> None:
    """bootstrap_servers, value_serializer, auto_offset_reset and value_deserializer, as typed
    from a kafka-python tutorial (before: TypeError on the first unknown keyword)."""
    producer = Producer(bootstrap_servers=server.bootstrap, value_serializer=lambda v: json.dumps(v).encode())
    with producer:
        for i in range(4):
            producer.send("events", {"n": i})
        producer.flush(TIMEOUT_S)
    consumer = DMQConsumer(
        bootstrap_servers=server.bootstrap,
        group_id="first-hour",
        auto_offset_reset="earliest",
        value_deserializer=lambda b: json.loads(b),
        **FAST,
    )
    with consumer:
        consumer.subscribe("events")
        values = sorted(r.value["n"] for r in _drain(consumer, 4))
    assert values == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda b: Producer(bootstrap=b, value_serializer=str.encode), id="Producer-value_serializer"),
        pytest.param(lambda b: DMQConsumer(metadata_service_url=b, group_id="g", auto_offset_reset="latest"),
                     id="DMQConsumer-auto_offset_reset"),
        pytest.param(lambda b: DMQConsumer(bootstrap_servers=b, group_id="g"), id="DMQConsumer-bootstrap_servers"),
        pytest.param(lambda b: Producer(bootstrap_servers=b), id="Producer-bootstrap_servers"),
        pytest.param(lambda b: Producer(bootstrap_servers=[b]), id="Producer-bootstrap_servers-list"),
        pytest.param(lambda b: AdminClient(bootstrap_servers=b), id="AdminClient-bootstrap_servers"),
    ],
)
def test_each_kafka_setting_name_is_accepted(server: ClusterThread, make: Callable[[str], Any]) -> None:
    """Before: each gave a bare TypeError (unexpected keyword argument)."""
    client = make(server.bootstrap)
    client.close()


def test_producer_takes_a_list_of_bootstrap_servers(server: ClusterThread) -> None:
    """Before: AttributeError: 'list' object has no attribute 'strip'."""
    with Producer([server.bootstrap]) as producer:
        meta = producer.send("events", b"x", partition=1).get(TIMEOUT_S)
    assert (meta.topic, meta.partition, meta.offset) == ("events", 1, 0)


def test_committed_returns_the_commit_metadata(server: ClusterThread) -> None:
    """Before: committed() returned the bare offset, dropping the metadata."""
    with Producer(server.bootstrap, linger_ms=0) as producer:
        producer.send("events", b"a", partition=0).get(TIMEOUT_S)
    with DMQConsumer(metadata_service_url=server.bootstrap, group_id="meta", **FAST) as consumer:
        consumer.subscribe("events")
        assert len(_drain(consumer, 1)) == 1
        tp = TopicPartition("events", 0)
        consumer.commit_sync({tp: OffsetAndMetadata(1, "checkpoint-7")})
        assert consumer.committed(tp) == OffsetAndMetadata(1, "checkpoint-7")
        assert consumer.committed([tp, TopicPartition("events", 1)]) == {
            tp: OffsetAndMetadata(1, "checkpoint-7"),
            TopicPartition("events", 1): None,
        }


def test_send_futures_work_with_concurrent_futures_wait_and_as_completed(server: ClusterThread) -> None:
    """Before: concurrent.futures.wait() raised AttributeError (no _condition) on send()'s handle."""
    with Producer(server.bootstrap) as producer:
        futures = [producer.send("events", b"%d" % i, partition=i % 2) for i in range(10)]
        done, not_done = concurrent.futures.wait(futures, timeout=TIMEOUT_S)
        assert not_done == set() and done == set(futures)
        assert all(isinstance(f, concurrent.futures.Future) for f in futures)
        offsets = sorted((f.result().partition, f.result().offset) for f in done)
        assert offsets == sorted((p, o) for p in range(2) for o in range(5))

        more = [producer.send("events", b"late", partition=0) for _ in range(3)]
        completed = list(concurrent.futures.as_completed(more, timeout=TIMEOUT_S))
        assert set(completed) == set(more)
        assert sorted(f.result().offset for f in completed) == [5, 6, 7]
