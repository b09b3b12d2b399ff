"""The consumer's Fetcher against a real broker: pipelining, lazy decoding, stale data dropped.

The SubscriptionState is filled by hand here (no group), which is exactly the seam between the
group client and the fetcher.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from dmq.client._cluster import Cluster
from dmq.client.admin import AdminClient
from dmq.client.cli.runner import ClusterThread
from dmq.client.consumer._config import ConsumerConfig
from dmq.client.consumer._fetcher import Fetcher
from dmq.client.consumer._records import TopicPartition
from dmq.client.consumer._subscription import SubscriptionState
from dmq.proto import dmq_pb2 as pb
from dmq.proto import records

TOPIC = "fetched"


@pytest.fixture
def setup(cluster: ClusterThread) -> Iterator[tuple[Cluster, ClusterThread]]:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic(TOPIC, 3)
    c = Cluster(cluster.bootstrap)
    yield c, cluster
    c.close()


def produce(c: Cluster, partition: int, start: int, count: int, per_batch: int = 100) -> None:
    stub = c.broker_stub(c.leader_for(TOPIC, partition))
    for base in range(start, start + count, per_batch):
        values = [b"%d-%d" % (partition, i) for i in range(base, min(base + per_batch, start + count))]
        stub.Produce(pb.ProduceRequest(topic=TOPIC, partition=partition, batch=records.encode(values)), timeout=10)


def make(c: Cluster, cluster: ClusterThread, **kw: object) -> tuple[Fetcher, SubscriptionState, threading.Event]:
    config = ConsumerConfig(cluster.bootstrap, "g", fetch_max_wait_ms=200, **kw)  # type: ignore[arg-type]
    subs = SubscriptionState()
    wakeup = threading.Event()
    return Fetcher(c, subs, config, wakeup), subs, wakeup


def assign(subs: SubscriptionState, partition: int, position: int = 0) -> TopicPartition:
    """The partition of TOPIC added to the subscription (no group) and positioned at `position`."""
    tp = TopicPartition(TOPIC, partition)
    subs.add(tp, -2).position = position
    return tp


def drain(f: Fetcher, wakeup: threading.Event, want: int, max_records: int = 1000, timeout_s: float = 10) -> list:
    out: list = []
    deadline = time.monotonic() + timeout_s
    while len(out) < want and time.monotonic() < deadline:
        wakeup.clear()
        got = f.collect(max_records)
        f.send_fetches()
        for recs in got.values():
            out.extend(recs)
        if not got:
            wakeup.wait(0.5)
    return out


def test_reads_every_partition_in_order_within_max_records(setup: tuple[Cluster, ClusterThread]) -> None:
    c, cluster = setup
    for p in range(3):
        produce(c, p, 0, 1000)
    f, subs, wakeup = make(c, cluster)
    for p in range(3):
        assign(subs, p, 0 if p != 2 else 950)
    f.send_fetches()
    wakeup.wait(5)
    got = f.collect(120)
    assert 0 < sum(map(len, got.values())) <= 120
    rest = drain(f, wakeup, 2050 - sum(map(len, got.values())), max_records=120)
    every = [r for recs in got.values() for r in recs] + rest
    by_partition: dict[int, list[int]] = {}
    for r in every:
        by_partition.setdefault(r.partition, []).append(r.offset)
        assert r.value == b"%d-%d" % (r.partition, r.offset) and r.topic == TOPIC and r.key is None
    assert by_partition[0] == list(range(1000)) and by_partition[1] == list(range(1000))
    assert by_partition[2] == list(range(950, 1000))  # the batch holding 950 starts at 900
    assert [subs.state(TopicPartition(TOPIC, p)).position for p in range(3)] == [1000, 1000, 1000]
    f.close()


def test_next_fetch_travels_while_records_are_buffered_and_undecoded(setup: tuple[Cluster, ClusterThread]) -> None:
    c, cluster = setup
    produce(c, 0, 0, 5000, per_batch=500)
    f, subs, wakeup = make(c, cluster, max_partition_fetch_bytes=20_000)
    tp = assign(subs, 0)
    f.send_fetches()
    assert wakeup.wait(5)
    f.harvest()
    buf = f._buffers[tp]
    # lazily decoded: the answer is held as raw bytes until records are asked for
    assert len(buf.chunks) == 1 and not buf.batches
    assert buf.next_fetch_offset > 0
    got = f.collect(10)[tp]
    assert [r.offset for r in got] == list(range(10))
    f.send_fetches()
    # the next answer is requested from where the buffered data ends, not from the position
    inflight = f._reader._inflight
    assert inflight and next(iter(inflight.values())).wants[tp].offset == buf.next_fetch_offset
    f.close()


def test_seek_drops_buffered_and_in_flight_data(setup: tuple[Cluster, ClusterThread]) -> None:
    c, cluster = setup
    produce(c, 1, 0, 300)
    f, subs, wakeup = make(c, cluster)
    tp = assign(subs, 1)
    f.send_fetches()
    subs.seek(tp, 200)  # while the fetch from 0 is in flight
    f.drop(tp)
    rest = drain(f, wakeup, 100)
    assert [r.offset for r in rest] == list(range(200, 300))


def test_pause_returns_nothing_and_resume_continues(setup: tuple[Cluster, ClusterThread]) -> None:
    c, cluster = setup
    produce(c, 0, 0, 100)
    f, subs, wakeup = make(c, cluster)
    tp = assign(subs, 0)
    first = drain(f, wakeup, 10, max_records=10)
    assert [r.offset for r in first] == list(range(10))
    subs.pause(tp)
    f.drop(tp)
    assert f.collect(100) == {} and f.send_fetches() == 0
    subs.resume(tp)
    assert [r.offset for r in drain(f, wakeup, 90)] == list(range(10, 100))


def test_position_beyond_the_log_end_moves_back_to_it(setup: tuple[Cluster, ClusterThread]) -> None:
    c, cluster = setup
    produce(c, 2, 0, 50)
    f, subs, wakeup = make(c, cluster)
    tp = assign(subs, 2, 10_000)
    deadline = time.monotonic() + 5
    while subs.state(tp).position != 50 and time.monotonic() < deadline:
        wakeup.clear()
        f.send_fetches()
        wakeup.wait(0.5)
        f.harvest()
    assert subs.state(tp).position == 50
    produce(c, 2, 50, 5)
    assert [r.offset for r in drain(f, wakeup, 5)] == [50, 51, 52, 53, 54]


def test_a_broker_that_goes_away_is_retried_after_a_metadata_refresh(cluster_factory) -> None:  # type: ignore[no-untyped-def]
    cluster = cluster_factory(brokers=2, shared_port=False)
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic(TOPIC, 2)
    c = Cluster(cluster.bootstrap)
    produce(c, 0, 0, 10)
    produce(c, 1, 0, 10)
    f, subs, wakeup = make(c, cluster, retry_backoff_ms=50)
    for p in range(2):
        assign(subs, p)
    assert len(drain(f, wakeup, 20)) == 20
    gone = cluster.cluster.brokers[1].address
    alive_partition = next(p for p in range(2) if c.leader_for(TOPIC, p) != gone)
    cluster.call(cluster.cluster.stop_broker(1))
    # the live broker's partition keeps flowing while the other broker's fetch fails, backs off
    # and is retried with fresh metadata
    produce(c, alive_partition, 10, 5)
    more = drain(f, wakeup, 5, timeout_s=5)
    assert [(r.partition, r.offset) for r in more] == [(alive_partition, o) for o in range(10, 15)]
    deadline = time.monotonic() + 5
    while not f._reader.retry_at(gone) and time.monotonic() < deadline:
        drain(f, wakeup, 1, timeout_s=0.2)
    assert f._reader.retry_at(gone)
    f.close()
    c.close()
