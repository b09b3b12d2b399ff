"""The coordinator's Prometheus metrics (see dmq.proto.server.metrics for the endpoint and RPC timings).

`CoordinatorCollector` reads the metadata and the group registry when scraped: whether this
coordinator is active and its controller epoch (dmq.coordinator.controller.status), brokers alive,
topics, partitions, offline partitions, leader elections, groups by state, members, rebalances.
Their handlers and the scrape run on the coordinator's event loop, and a collect() has no await,
so what it reads is one consistent moment.

Consumer lag per (group, topic, partition) and its sum per group are computed as `dmq groups
describe` computes them (GroupBrokers.partition_offsets, then describe_to_proto: committed
offset, or the subscription's start, against the log end). That needs broker calls, so it is a
refresh hook of the endpoint (`LagCache.refresh`), awaited before each scrape and cached for
`cache_s`: a scrape costs at most one round of calls every few seconds, for at most `max_groups`
groups, LAG_CONCURRENCY at a time. Per-partition lag series stop at `max_partition_series`
partitions over all groups; past that only the per-group sums are exported.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dmq.coordinator.controller.status import status_of
from dmq.coordinator.group import GroupState
from dmq.coordinator.group_admin import describe_to_proto

if TYPE_CHECKING:
    from dmq.coordinator.node import CoordinatorNode

DEFAULT_MAX_PARTITION_SERIES = 1000
DEFAULT_LAG_CACHE_S = 5.0
MAX_LAG_GROUPS = 1000
LAG_CONCURRENCY = 16
REBALANCE_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class LagCache:
    """Each group's lag, as DescribeGroup answers it, refreshed at most every `cache_s` seconds."""

    def __init__(self, node: CoordinatorNode, cache_s: float = DEFAULT_LAG_CACHE_S) -> None:
        self._node = node
        self.cache_s = cache_s
        self._refreshed = float("-inf")
        # group -> (topic, {partition: lag}, total); a partition whose broker did not answer is left out
        self.lags: dict[str, tuple[str, dict[int, int], int]] = {}
        self._running: asyncio.Future[None] | None = None

    def __repr__(self) -> str:
        return f"<LagCache groups={len(self.lags)} cache_s={self.cache_s}>"

    async def refresh(self) -> None:
        if time.monotonic() - self._refreshed < self.cache_s:
            return
        if self._running is None or self._running.done():  # concurrent scrapes share one refresh
            self._running = asyncio.ensure_future(self._refresh())
        await asyncio.shield(self._running)

    async def _refresh(self) -> None:
        service = self._node.groups
        if service is None:
            return
        descriptions = [g.describe() for g in service.registry.groups()[:MAX_LAG_GROUPS]]
        gate = asyncio.Semaphore(LAG_CONCURRENCY)
        lags: dict[str, tuple[str, dict[int, int], int]] = {}

        async def one(d: object) -> None:
            async with gate:
                offsets = await service.brokers.partition_offsets(
                    d.group_id, d.topic, d.partition_count, d.subscription)  # type: ignore[attr-defined]
            answer = describe_to_proto(d, offsets)  # type: ignore[arg-type]
            lags[answer.group_id] = (answer.topic, {p.partition: p.lag for p in answer.partitions if p.lag >= 0},
                                     answer.total_lag)

        await asyncio.gather(*(one(d) for d in descriptions))
        self.lags = lags
        self._refreshed = time.monotonic()


class CoordinatorCollector(Collector):
    def __init__(self, node: CoordinatorNode, lag: LagCache,
                 max_partition_series: int = DEFAULT_MAX_PARTITION_SERIES) -> None:
        if max_partition_series < 0:
            raise ValueError(f"max_partition_series must be >= 0, got {max_partition_series}")
        self._node = node
        self._lag = lag
        self.max_partition_series = max_partition_series

    def __repr__(self) -> str:
        return f"<CoordinatorCollector max_partition_series={self.max_partition_series}>"

    def describe(self) -> Iterator[Metric]:
        # Registering must not read the node: the registry's auto_describe would otherwise run
        # collect() at install time, before the group service is built and its state loaded.
        return iter(())

    def collect(self) -> Iterator[Metric]:
        status = status_of(self._node)
        yield _gauge("dmq_coordinator_active",
                     "1 while this coordinator is the active one and acting; 0 standing by or stepped down",
                     1 if status.active else 0)
        yield _gauge("dmq_coordinator_controller_epoch",
                     "The controller epoch this coordinator claimed when it last took control (kept after "
                     "it steps down); 0 for a standby that never took control",
                     status.controller_epoch)
        metadata = self._node.metadata
        yield _gauge("dmq_coordinator_brokers_alive", "Brokers with a live session", len(metadata.live_broker_ids()))
        yield _gauge("dmq_coordinator_brokers_registered", "Brokers ever registered", len(metadata.brokers()))
        topics = metadata.topics()
        yield _gauge("dmq_coordinator_topics", "Topics", len(topics))
        yield _gauge("dmq_coordinator_partitions", "Partitions of all topics", sum(t.partition_count for t in topics))
        states = [s for t in topics for s in t.states.values()]
        yield _gauge("dmq_coordinator_offline_partitions", "Partitions with no leader", sum(1 for s in states if s.leader < 0))
        yield _gauge("dmq_coordinator_under_replicated_partitions",
                     "Partitions whose in-sync set is smaller than their replica set",
                     sum(1 for s in states if len(s.isr) < len(s.replicas)))
        elections = CounterMetricFamily(
            "dmq_coordinator_leader_elections",
            "Leadership changes: the sum of the partitions' leader epochs (falls when a topic is deleted)")
        elections.add_metric([], sum(s.leader_epoch for s in states))
        yield elections
        yield from self._groups()
        yield from self._lags()

    def _groups(self) -> Iterator[Metric]:
        service = self._node.groups
        groups = service.registry.groups() if service is not None else []
        by_state = GaugeMetricFamily("dmq_coordinator_groups", "Consumer groups by state", labels=["state"])
        counts = {s.name: 0 for s in GroupState}
        for g in groups:
            counts[g.state.name] += 1
        for state, n in counts.items():
            by_state.add_metric([state], n)
        yield by_state
        yield _gauge("dmq_coordinator_group_members", "Members of all consumer groups", sum(len(g.members) for g in groups))
        rebalances = CounterMetricFamily("dmq_coordinator_rebalances", "Generations started (completed rebalances)")
        rebalances.add_metric([], service.rebalances if service is not None else 0)
        yield rebalances

    def _lags(self) -> Iterator[Metric]:
        lags = self._lag.lags
        total = GaugeMetricFamily("dmq_consumer_group_lag_sum_records",
                                  "Records a consumer group has still to read, summed over its partitions "
                                  "(as `dmq groups describe` computes it)", labels=["group", "topic"])
        for group, (topic, _parts, sum_lag) in sorted(lags.items()):
            total.add_metric([group, topic], sum_lag)
        yield total
        per = GaugeMetricFamily("dmq_consumer_group_lag_records",
                                "Records a consumer group has still to read on one partition",
                                labels=["group", "topic", "partition"])
        if sum(len(parts) for _t, parts, _s in lags.values()) <= self.max_partition_series:
            for group, (topic, parts, _sum) in sorted(lags.items()):
                for p, lag in sorted(parts.items()):
                    per.add_metric([group, topic, str(p)], lag)
        yield per


def install(node: CoordinatorNode, registry: CollectorRegistry, *,
            max_partition_series: int = DEFAULT_MAX_PARTITION_SERIES) -> LagCache:
    """Register the coordinator's collector and rebalance histogram; returns the lag cache whose
    refresh the metrics endpoint awaits before each scrape."""
    lag = LagCache(node)
    registry.register(CoordinatorCollector(node, lag, max_partition_series))
    histogram = Histogram("dmq_coordinator_rebalance_duration_seconds",
                          "From a group's first scheduled rebalance to its new generation",
                          registry=registry, buckets=REBALANCE_BUCKETS_S)
    if node.groups is not None:
        node.groups.on_rebalance = histogram.observe
    return lag


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)
