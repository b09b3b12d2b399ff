"""Prometheus /metrics over real servers (issue 29 item 1): the text parses with prometheus_client's
own parser; bytes-in grows by exactly what was produced; the consumer-lag gauges equal
`AdminClient.describe_group`'s lag (what `dmq groups describe` prints); every call is timed with
its status code (refusals included); per-partition series stop at the configured bound."""

from __future__ import annotations

import functools
import urllib.request
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dmq.client import AdminClient, Producer
from dmq.client.cli.runner import ClusterThread
from dmq.client.consumer import DMQConsumer
from dmq.client.simple_consumer import SimpleConsumer
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import records
from tests import polling
from tests.groups import commit_as_sole_member

TOPIC = "metered"
WAIT_S = 15.0
FAST = {"heartbeat_interval_ms": 200, "session_timeout_ms": 3000, "retry_backoff_ms": 50}

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(url: str) -> Samples:
    """name -> [(labels, value)], parsed by prometheus_client's own parser."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain")
        text = answer.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((dict(s.labels), s.value))
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when there are none)."""
    return sum(v for ls, v in samples.get(name, []) if all(ls.get(k) == w for k, w in labels.items()))


wait_for = functools.partial(polling.wait_for, timeout_s=WAIT_S, poll_s=0.05)


@pytest.fixture
def metered(cluster_factory: Callable[..., ClusterThread]) -> ClusterThread:
    """The embedded shape (coordinator and broker on one server) with its endpoint on a free port."""
    return cluster_factory(metrics_port=0)


def test_bytes_in_grows_by_what_was_produced_and_the_text_parses(metered: ClusterThread) -> None:
    [endpoint] = metered.cluster.metrics_endpoints
    with AdminClient(metered.bootstrap) as admin:
        admin.create_topic(TOPIC, 2)
    before = scrape(endpoint.url)
    assert value(before, "dmq_broker_bytes_in_total", topic=TOPIC) == 0
    assert value(before, "dmq_coordinator_topics") == 1
    assert value(before, "dmq_coordinator_partitions") == 2
    assert value(before, "dmq_coordinator_brokers_alive") == 1

    # Produce raw batches, so the bytes the broker appends are known to the byte.
    channel = grpc.insecure_channel(metered.bootstrap)
    try:
        stub = pb_grpc.BrokerStub(channel)
        batches = [records.encode([b"x" * (100 + i)] * 5) for i in range(3)]
        for i, batch in enumerate(batches):
            stub.Produce(pb.ProduceRequest(topic=TOPIC, partition=i % 2, batch=batch, acks=pb.ACKS_ALL), timeout=10)
    finally:
        channel.close()
    after = scrape(endpoint.url)
    assert value(after, "dmq_broker_bytes_in_total", topic=TOPIC) == sum(len(b) for b in batches)
    assert value(after, "dmq_broker_records_in_total", topic=TOPIC) == 15
    assert value(after, "dmq_log_size_bytes", topic=TOPIC) == sum(len(b) for b in batches)
    assert value(after, "dmq_log_segments", topic=TOPIC, partition="0") == 1
    assert value(after, "dmq_rpc_server_duration_seconds_count", method="Produce", code="OK") == 3
    assert value(after, "dmq_log_fsync_duration_seconds_count") >= 3  # acks=all under the fsync policy
    assert value(after, "dmq_open_connections") >= 1


def test_records_out_grows_by_what_was_consumed(metered: ClusterThread) -> None:
    [endpoint] = metered.cluster.metrics_endpoints
    with AdminClient(metered.bootstrap) as admin:
        admin.create_topic(TOPIC, 2)
    # Batches of different sizes in both partitions, so a count of batches or of partitions is wrong.
    batches = [records.encode([b"v%d" % i] * (3 + i)) for i in range(4)]
    channel = grpc.insecure_channel(metered.bootstrap)
    try:
        stub = pb_grpc.BrokerStub(channel)
        for i, batch in enumerate(batches):
            stub.Produce(pb.ProduceRequest(topic=TOPIC, partition=i % 2, batch=batch, acks=pb.ACKS_ALL), timeout=10)
    finally:
        channel.close()
    assert value(scrape(endpoint.url), "dmq_broker_records_out_total", topic=TOPIC) == 0
    consumed = 0
    with SimpleConsumer(metered.bootstrap, prefetch=False) as consumer:
        for partition, end in ((0, 3 + 5), (1, 4 + 6)):
            got = consumer.consume(TOPIC, partition, 0, max_records=100, max_wait_ms=0)
            assert len(got) == end  # one Fetch answered every batch of the partition
            consumed += len(got)
    after = scrape(endpoint.url)
    assert value(after, "dmq_broker_records_out_total", topic=TOPIC) == consumed == 18
    assert value(after, "dmq_broker_bytes_out_total", topic=TOPIC) == sum(len(b) for b in batches)


def test_refused_calls_are_timed_with_their_code_never_unknown(metered: ClusterThread) -> None:
    [endpoint] = metered.cluster.metrics_endpoints
    channel = grpc.insecure_channel(metered.bootstrap)
    try:
        stub = pb_grpc.BrokerStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Produce(pb.ProduceRequest(topic="bad name!", partition=0, batch=b"x"), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as missing:
            stub.Produce(pb.ProduceRequest(topic="absent", partition=0, batch=b"x"), timeout=10)
    finally:
        channel.close()
    samples = scrape(endpoint.url)
    assert value(samples, "dmq_rpc_server_duration_seconds_count", method="Produce", code="INVALID_ARGUMENT") == 1
    assert value(samples, "dmq_rpc_server_duration_seconds_count", method="Produce",
                 code=missing.value.code().name) >= 1
    assert value(samples, "dmq_rpc_server_duration_seconds_count", code="UNKNOWN") == 0
    assert value(samples, "dmq_rpc_server_duration_seconds_count", code="INTERNAL") == 0


def test_lag_gauges_equal_describe_group(metered: ClusterThread) -> None:
    [endpoint] = metered.cluster.metrics_endpoints
    group = f"G_{TOPIC}_billing"
    with AdminClient(metered.bootstrap) as admin:
        admin.create_topic(TOPIC, 2)
        with Producer(metered.bootstrap, linger_ms=0) as producer:
            for i in range(10):
                for part in (0, 1):
                    producer.send(TOPIC, b"v%d" % i, partition=part)
            producer.flush(WAIT_S)
        commit_as_sole_member(metered.bootstrap, "billing", TOPIC, {0: 3, 1: 1})
        described = admin.describe_group(group)
    assert described.total_lag == 16
    samples = scrape(endpoint.url)
    assert value(samples, "dmq_consumer_group_lag_sum_records", group=group, topic=TOPIC) == described.total_lag
    for p in described.partitions:
        assert value(samples, "dmq_consumer_group_lag_records", group=group, topic=TOPIC,
                     partition=str(p.partition)) == p.lag
    assert value(samples, "dmq_coordinator_rebalances_total") >= 1
    assert value(samples, "dmq_coordinator_rebalance_duration_seconds_count") >= 1
    assert sum(v for _ls, v in samples["dmq_coordinator_groups"]) == 1


def test_per_partition_series_stop_at_the_bound(cluster_factory: Callable[..., ClusterThread]) -> None:
    cluster = cluster_factory(metrics_port=0, max_partition_series=2)
    [endpoint] = cluster.cluster.metrics_endpoints
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic(TOPIC, 3)
        with Producer(cluster.bootstrap, linger_ms=0) as producer:
            for part in range(3):
                producer.send(TOPIC, b"v", partition=part)
            producer.flush(WAIT_S)
    samples = scrape(endpoint.url)
    rows = [ls for ls, _v in samples["dmq_log_size_bytes"] if ls["topic"] == TOPIC]
    assert [r["partition"] for r in rows] == ["*"]  # three partitions > 2: one series for the topic
    assert value(samples, "dmq_log_size_bytes", topic=TOPIC) > 0


def test_separate_servers_have_their_own_endpoints(cluster_factory: Callable[..., ClusterThread]) -> None:
    cluster = cluster_factory(brokers=2, shared_port=False, metrics_port=0)
    endpoints = cluster.cluster.metrics_endpoints
    assert len({e.port for e in endpoints}) == 3
    coordinator, *brokers = (scrape(e.url) for e in endpoints)
    assert value(coordinator, "dmq_coordinator_brokers_alive") == 2
    assert "dmq_broker_bytes_in_total" not in coordinator  # each registry answers for its own server
    assert [value(b, "dmq_coordinator_brokers_alive") for b in brokers] == [0, 0]
    assert all("dmq_broker_under_replicated_partitions" in b for b in brokers)


def test_client_metrics_count_what_was_sent_and_consumed(cluster: ClusterThread) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic(TOPIC, 2)
    with Producer(cluster.bootstrap, linger_ms=0) as producer:
        for i in range(20):
            producer.send(TOPIC, b"value-%02d" % i, partition=i % 2)
        producer.flush(WAIT_S)
        sent = producer.metrics()
    assert sent["record_send_total"] == 20 and sent["records_failed"] == 0
    assert sent["bytes_send_total"] > 20 * 8  # the batches' bytes: headers and values
    assert sent["request_total"] >= 2 and sent["request_error_total"] == 0
    assert 0 < sent["request_latency_avg_ms"] <= sent["request_latency_max_ms"]
    assert sent["record_send_rate"] > 0 and sent["request_rate"] > 0

    consumer = DMQConsumer(bootstrap_servers=cluster.bootstrap, group_id="metered", enable_auto_commit=False,
                           max_poll_records=5, **FAST)
    try:
        consumer.subscribe(TOPIC)
        got: list[Any] = []
        first: dict[str, float] = {}

        def read() -> bool:
            got.extend(consumer.poll(200))
            if got and not first:
                first.update(consumer.metrics())
            return len(got) >= 20

        wait_for(read, "20 records")
        consumer.commit_sync()
        m = consumer.metrics()
    finally:
        consumer.close()
    assert m["record_consumed_total"] == 20 and m["bytes_consumed_total"] > 20 * 8
    assert m["request_total"] >= 1 and m["request_latency_max_ms"] > 0
    assert m["commit_total"] == 1 and m["commit_rate"] > 0
    assert m["rebalance_total"] >= 1  # the first assignment
    assert m["records_lag_max"] == 0  # read to the end
    assert 0 <= first["records_lag_max"] <= 10


def test_event_store_appends_conflicts_and_claims(metered: ClusterThread) -> None:
    from dmq.client.errors import AppendConditionError
    from dmq.client.events import EventStore, EventType

    created = EventType("course.created", ["course_name"])
    renamed = EventType("course.renamed", ["course_name"])
    [endpoint] = metered.cluster.metrics_endpoints
    with AdminClient(metered.bootstrap) as admin:
        admin.create_topic("courses", 1, kind="event-store")
    with EventStore(metered.bootstrap, "courses") as store:
        store.register_group("g")
        store.append([created.new(course_name="Algebra"), created.new(course_name="History")])
        claim = store.claim_next("g", ["course_name"], [created, renamed], "w1")
        assert claim is not None
        store.append(renamed.new(course_name="Algebra"), claim.guard)
        with pytest.raises(AppendConditionError):
            store.append(renamed.new(course_name="Algebra"), claim.guard)  # the rename conflicts now
    samples = scrape(endpoint.url)
    assert value(samples, "dmq_event_store_appended_events_total", topic="courses") == 3
    assert value(samples, "dmq_event_store_condition_conflicts_total", topic="courses") == 1
    assert value(samples, "dmq_event_store_claims_total", topic="courses") == 1


def test_bytes_in_flight_is_exported_and_idle_at_zero(metered: ClusterThread) -> None:
    [endpoint] = metered.cluster.metrics_endpoints
    samples = scrape(endpoint.url)
    assert value(samples, "dmq_broker_bytes_in_flight") == 0  # nothing held between calls
