"""Gauges against the truth over real servers (issue 29 audit): dmq_broker_partitions_led
equals what `dmq brokers list` (AdminClient.list_brokers) says each broker leads, for
unreplicated partitions (the embedded `dmq server`) as for replicated ones; the members gauge
equals describe_group's members; the lag gauges equal describe_group's lag under load."""

from __future__ import annotations

import threading
from collections.abc import Callable

from dmq.client import AdminClient, Producer
from dmq.client.admin import GroupDescription
from dmq.client.cli.runner import ClusterThread
from dmq.client.consumer import DMQConsumer
from tests.integration.test_metrics import TOPIC, WAIT_S, scrape, value, wait_for

# Quick heartbeats for a quick first assignment; the default 10 s session, so that a starved
# machine (a heartbeat thread late by seconds) cannot expel a member in the middle of a test.
CONSUMER = {"heartbeat_interval_ms": 200, "retry_backoff_ms": 50}


def _led_gauges(cluster: ClusterThread) -> dict[int, float]:
    """broker id -> dmq_broker_partitions_led, over every endpoint of the cluster."""
    led: dict[int, float] = {}
    for endpoint in cluster.cluster.metrics_endpoints:
        for labels, v in scrape(endpoint.url).get("dmq_broker_partitions_led", []):
            led[int(labels["broker"])] = v
    return led


def test_partitions_led_counts_unreplicated_partitions(cluster_factory: Callable[..., ClusterThread]) -> None:
    """`dmq server`'s shape: one broker, replication factor 1: it leads every partition."""
    cluster = cluster_factory(metrics_port=0)
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("solo", 2)
        [broker] = admin.list_brokers()
    assert broker.partitions_led == 2
    [endpoint] = cluster.cluster.metrics_endpoints
    assert value(scrape(endpoint.url), "dmq_broker_partitions_led", broker=str(broker.broker_id)) == 2


def test_partitions_led_equals_brokers_list_with_mixed_replication(
    cluster_factory: Callable[..., ClusterThread],
) -> None:
    """Two brokers on their own servers: an unreplicated topic of 3 partitions and a replicated
    one of 2 (replication factor 2); each broker's gauge equals its partitions_led."""
    cluster = cluster_factory(brokers=2, shared_port=False, metrics_port=0)
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("solo", 3, {"replication_factor": 1})
        admin.create_topic("pair", 2, {"replication_factor": 2})
        listed = {b.broker_id: b.partitions_led for b in admin.list_brokers()}
    assert sum(listed.values()) == 5
    # The replicated partitions' leaders learn of their leadership from the controller's push,
    # which may land just after create_topic returns: wait for the gauges to agree.
    wait_for(lambda: _led_gauges(cluster) == listed, f"the partitions_led gauges to equal {listed}")


def test_group_members_gauge_equals_describe_group(cluster_factory: Callable[..., ClusterThread]) -> None:
    cluster = cluster_factory(metrics_port=0)
    [endpoint] = cluster.cluster.metrics_endpoints
    group = f"G_{TOPIC}_members"
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic(TOPIC, 2)
        assert value(scrape(endpoint.url), "dmq_coordinator_group_members") == 0
        consumers = [DMQConsumer(bootstrap_servers=cluster.bootstrap, group_id="members", enable_auto_commit=False,
                                 **CONSUMER) for _ in range(2)]
        try:
            for c in consumers:
                c.subscribe(TOPIC)

            def members() -> int:
                for c in consumers:
                    c.poll(50)
                return len(admin.describe_group(group).members)

            wait_for(lambda: members() == 2, "two members in the group")
            assert value(scrape(endpoint.url), "dmq_coordinator_group_members") == 2
            consumers.pop().close()  # leaves the group
            wait_for(lambda: members() == 1, "one member left")
            assert value(scrape(endpoint.url), "dmq_coordinator_group_members") == 1
        finally:
            for c in consumers:
                c.close()


def test_lag_gauge_matches_describe_group_under_load(cluster_factory: Callable[..., ClusterThread]) -> None:
    """A producer keeps producing while a group consumes slowly and commits as it goes, so both
    the log ends and the committed offsets move while the lag is read. The gauge and
    describe_group are not read atomically, so each scrape is bracketed by a describe before and
    one after it: per partition lag = log end - committed, both only grow, so the gauge (computed
    at some moment between the two) lies in [end_before - committed_after, end_after -
    committed_before]; and so does the per-group sum over the partitions' sums."""
    cluster = cluster_factory(metrics_port=0)
    [endpoint] = cluster.cluster.metrics_endpoints
    # Each scrape computes the lag afresh: the endpoint caches it for 5 s by default (README), and
    # under load the log ends move meanwhile. What is compared is the computation, not the cache.
    cluster.cluster.coordinator.lag_cache.cache_s = 0.0
    group = f"G_{TOPIC}_slow"
    stop = threading.Event()
    committed = threading.Event()  # the group exists and has committed once
    failures: list[BaseException] = []

    def produce() -> None:
        try:
            with Producer(cluster.bootstrap, linger_ms=5) as producer:
                i = 0
                while not stop.is_set():
                    producer.send(TOPIC, b"v%d" % i, partition=i % 2)
                    i += 1
                    stop.wait(0.002)  # pacing, not a wait for readiness
        except BaseException as e:  # noqa: BLE001 - reported by the test's thread
            failures.append(e)

    def consume() -> None:
        try:
            consumer = DMQConsumer(bootstrap_servers=cluster.bootstrap, group_id="slow", enable_auto_commit=False,
                                   max_poll_records=3, **CONSUMER)
            try:
                consumer.subscribe(TOPIC)
                while not stop.is_set():
                    if consumer.poll(100):
                        consumer.commit_sync()
                        committed.set()
                    stop.wait(0.02)  # slower than the producer: the lag is never all read
            finally:
                consumer.close()
        except BaseException as e:  # noqa: BLE001 - reported by the test's thread
            failures.append(e)

    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic(TOPIC, 2)
        threads = [threading.Thread(target=produce, name="lag-producer"),
                   threading.Thread(target=consume, name="lag-consumer")]
        for t in threads:
            t.start()
        try:
            wait_for(lambda: committed.is_set() or failures, "the group's first commit")
            rounds: list[tuple[GroupDescription, GroupDescription]] = []

            def bracketed() -> bool:
                assert not failures, failures
                before = admin.describe_group(group)
                samples = scrape(endpoint.url)
                after = admin.describe_group(group)
                lo_sum = hi_sum = 0
                for b, a in zip(before.partitions, after.partitions, strict=True):
                    assert b.log_end_offset is not None and a.log_end_offset is not None
                    lo = max(0, b.log_end_offset - (a.committed_offset or 0))
                    hi = a.log_end_offset - (b.committed_offset or 0)
                    gauge = value(samples, "dmq_consumer_group_lag_records", group=group, topic=TOPIC,
                                  partition=str(b.partition))
                    assert lo <= gauge <= hi, (b.partition, lo, gauge, hi, before, after)
                    lo_sum += lo
                    hi_sum += hi
                gauge_sum = value(samples, "dmq_consumer_group_lag_sum_records", group=group, topic=TOPIC)
                assert lo_sum <= gauge_sum <= hi_sum, (lo_sum, gauge_sum, hi_sum)
                rounds.append((before, after))
                first, last = rounds[0][0], rounds[-1][1]
                # Under load, not at rest: enough rounds, with the log ends and the commits moving
                # between the first and the last, and something still to read.
                return (len(rounds) >= 5 and _committed(last) > _committed(first) and _ends(last) > _ends(first)
                        and last.total_lag > 0)

            wait_for(bracketed, "bracketed reads with the log ends and commits moving")
        finally:
            stop.set()
            for t in threads:
                t.join(WAIT_S)
    assert not failures, failures


def _committed(d: GroupDescription) -> int:
    return sum(p.committed_offset or 0 for p in d.partitions)


def _ends(d: GroupDescription) -> int:
    return sum(p.log_end_offset or 0 for p in d.partitions)
