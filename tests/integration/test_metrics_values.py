"""Gauges against the truth over real servers (issue 29 audit): dmq_broker_partitions_led
equals what `dmq brokers list` (AdminClient.list_brokers) says each broker leads, for
unreplicated partitions (the embedded `dmq server`) as for replicated ones."""

from __future__ import annotations

from collections.abc import Callable

from dmq.client import AdminClient
from dmq.client.cli.runner import ClusterThread
from tests.integration.test_metrics import scrape, value, wait_for


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
