"""A broker's Prometheus metrics (see dmq.proto.server.metrics for the endpoint and the RPC timings).

Two kinds, so the hot path stays O(1) per request:
  - `TopicTraffic`: plain per-topic integers that Produce and Fetch add to, one dict lookup and
    two additions per produced batch or fetched partition (no lock: the handlers and the scrape
    all run on the broker's event loop);
  - `BrokerCollector`: reads the broker's existing state when scraped: the logs (size, segments),
    the replicas (partitions led, under-replicated, offline, followers' lag, ISR changes), the queue
    groups (depth, live leases, dead letters).
The fsync histogram is observed by the logs' fsync function (`timed_fsync`), in whichever thread
the fsync runs; prometheus_client's histograms are thread-safe.

Label sets are bounded: per-partition series (`partition` label) for at most
`max_partition_series` partitions; past that, each topic's partitions are summed into one series
with partition="*".
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dmq.broker.log import LogManager
from dmq.broker.memory_budget import ByteBudget
from dmq.broker.offsets import is_offsets_log
from dmq.broker.replication.manager import ReplicaManager
from dmq.proto import dmq_pb2 as pb
from dmq.proto.records import count_records

DEFAULT_MAX_PARTITION_SERIES = 1000
# From 50 us (a page-cache-only device) to 2.5 s (a dying disk).
FSYNC_BUCKETS_S = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5)


class TopicTraffic:
    """Records and bytes in and out, per topic, since the broker started; for event stores,
    events appended, appends refused by their condition, and partitions claimed by groups."""

    __slots__ = ("records_in", "bytes_in", "records_out", "bytes_out", "event_appends", "event_conflicts", "event_claims")

    def __init__(self) -> None:
        self.records_in: dict[str, int] = {}
        self.bytes_in: dict[str, int] = {}
        self.records_out: dict[str, int] = {}
        self.bytes_out: dict[str, int] = {}
        self.event_appends: dict[str, int] = {}
        self.event_conflicts: dict[str, int] = {}
        self.event_claims: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"<TopicTraffic topics={len(self.bytes_in)} bytes_in={sum(self.bytes_in.values())}>"

    def produced(self, topic: str, records: int, size: int) -> None:
        self.records_in[topic] = self.records_in.get(topic, 0) + records
        self.bytes_in[topic] = self.bytes_in.get(topic, 0) + size

    def fetched(self, topic: str, data: bytes) -> None:
        """`data`: the whole batches answered; their records are counted from the batch headers."""
        self.records_out[topic] = self.records_out.get(topic, 0) + count_records(data)
        self.bytes_out[topic] = self.bytes_out.get(topic, 0) + len(data)

    def events_appended(self, topic: str, events: int) -> None:
        self.event_appends[topic] = self.event_appends.get(topic, 0) + events

    def event_conflict(self, topic: str) -> None:
        self.event_conflicts[topic] = self.event_conflicts.get(topic, 0) + 1

    def events_claimed(self, topic: str, claims: int) -> None:
        self.event_claims[topic] = self.event_claims.get(topic, 0) + claims

    def forget(self, topic: str) -> None:
        for counts in (self.records_in, self.bytes_in, self.records_out, self.bytes_out, self.event_appends,
                       self.event_conflicts, self.event_claims):
            counts.pop(topic, None)


def timed_fsync(registry: CollectorRegistry) -> Callable[[int], None]:
    """The logs' fsync (fdatasync where there is one), timed into dmq_log_fsync_duration_seconds."""
    histogram = Histogram("dmq_log_fsync_duration_seconds", "Time of one fsync of a partition log file",
                          registry=registry, buckets=FSYNC_BUCKETS_S)
    observe = histogram.observe

    def fsync(fd: int) -> None:
        started = time.perf_counter()
        try:
            # looked up per call, as a fault test may patch os.fdatasync after the broker is built
            getattr(os, "fdatasync", os.fsync)(fd)
        finally:
            observe(time.perf_counter() - started)

    return fsync


class QueueDepths(Protocol):
    """Queue mode as the metrics read it (the QueueManager's describe)."""

    def describe(self, topic: str, group: str) -> pb.QueueDescribeResponse: ...


class CollectedBroker(Protocol):
    """The broker as its collector reads it; a Protocol, so this module (which the servicers
    import for TopicTraffic) names no node."""

    @property
    def broker_id(self) -> int: ...

    @property
    def logs(self) -> LogManager: ...

    @property
    def replication(self) -> ReplicaManager: ...

    @property
    def queues(self) -> QueueDepths: ...

    @property
    def traffic(self) -> TopicTraffic: ...

    @property
    def budget(self) -> ByteBudget: ...


class BrokerCollector(Collector):
    def __init__(self, node: CollectedBroker, max_partition_series: int = DEFAULT_MAX_PARTITION_SERIES) -> None:
        if max_partition_series < 0:
            raise ValueError(f"max_partition_series must be >= 0, got {max_partition_series}")
        self._node = node
        self.max_partition_series = max_partition_series

    def __repr__(self) -> str:
        return f"<BrokerCollector broker={self._node.broker_id} max_partition_series={self.max_partition_series}>"

    def collect(self) -> Iterator[Metric]:
        node = self._node
        broker = str(node.broker_id)
        yield from self._traffic(broker)
        yield _gauge("dmq_broker_bytes_in_flight", "Request and answer bytes held in memory now (produce batches "
                     "being appended, fetch answers not yet sent)", broker, node.budget.in_use)
        yield from self._logs(broker)
        yield from self._replication(broker)
        yield from self._queues(broker)

    def _traffic(self, broker: str) -> Iterator[Metric]:
        traffic = self._node.traffic
        for name, doc, counts in (
            ("dmq_broker_records_in", "Records appended by produce requests, per topic", traffic.records_in),
            ("dmq_broker_bytes_in", "Batch bytes appended by produce requests, per topic", traffic.bytes_in),
            ("dmq_broker_records_out", "Records answered to consumer fetches (not followers'), per topic; "
             "counted per whole batch, as fetches answer whole batches", traffic.records_out),
            ("dmq_broker_bytes_out", "Record bytes answered to consumer fetches (not followers'), per topic",
             traffic.bytes_out),
            ("dmq_event_store_appended_events", "Events appended to an event store", traffic.event_appends),
            ("dmq_event_store_condition_conflicts", "Event appends refused because their condition matched "
             "a later event", traffic.event_conflicts),
            ("dmq_event_store_claims", "Partitions (attribute values) claimed by event-store groups",
             traffic.event_claims),
        ):
            family = CounterMetricFamily(name, doc, labels=["broker", "topic"])
            for topic, value in sorted(counts.items()):
                family.add_metric([broker, topic], value)
            yield family

    def _per_partition(self, rows: Iterable[tuple[str, int, float]], count: int) -> Iterator[tuple[str, str, float]]:
        """(topic, partition label, value): one per partition, or summed per topic past the bound."""
        if count <= self.max_partition_series:
            for topic, partition, value in rows:
                yield topic, str(partition), value
            return
        sums: dict[str, float] = {}
        for topic, _partition, value in rows:
            sums[topic] = sums.get(topic, 0) + value
        for topic, value in sorted(sums.items()):
            yield topic, "*", value

    def _logs(self, broker: str) -> Iterator[Metric]:
        logs = self._node.logs.open_logs()
        size = GaugeMetricFamily("dmq_log_size_bytes", "Bytes of a partition's log segments (open partitions)",
                                 labels=["broker", "topic", "partition"])
        segments = GaugeMetricFamily("dmq_log_segments", "Segments of a partition's log (open partitions)",
                                     labels=["broker", "topic", "partition"])
        for topic, p, value in self._per_partition(((lg.topic, lg.partition, lg.size_bytes) for lg in logs), len(logs)):
            size.add_metric([broker, topic, p], value)
        for topic, p, value in self._per_partition(((lg.topic, lg.partition, lg.segment_count) for lg in logs), len(logs)):
            segments.add_metric([broker, topic, p], value)
        yield size
        yield segments

    def _replication(self, broker: str) -> Iterator[Metric]:
        replication = self._node.replication
        replicas = [r for r in replication.replicas() if not is_offsets_log(r.topic)]
        led = [(r, r.leading) for r in replicas if r.leading is not None]
        under = sum(1 for _r, leading in led if len(leading.isr) < len(leading.replicas))
        offline = sum(1 for r in replicas if r.state.leader_id < 0)
        yield _gauge("dmq_broker_partitions_led", "Partitions this broker leads (replicated or not)", broker,
                     self._partitions_led(len(led)))
        yield _gauge("dmq_broker_under_replicated_partitions",
                     "Partitions led here whose in-sync set is smaller than their replica set", broker, under)
        yield _gauge("dmq_broker_offline_partitions",
                     "Partitions replicated here that have no leader (every in-sync replica down)", broker, offline)
        shrinks = CounterMetricFamily("dmq_broker_isr_shrinks", "In-sync set changes proposed that remove followers",
                                      labels=["broker"])
        shrinks.add_metric([broker], replication.isr_shrinks)
        yield shrinks
        expands = CounterMetricFamily("dmq_broker_isr_expands", "In-sync set changes proposed that add a follower",
                                      labels=["broker"])
        expands.add_metric([broker], replication.isr_expands)
        yield expands
        lag = GaugeMetricFamily("dmq_broker_follower_lag_records",
                                "Records a follower is behind the leader's log end (on the leader)",
                                labels=["broker", "topic", "partition", "follower"])
        rows = [(r, f, max(0, leading.log_end_offset - st.log_end_offset))
                for r, leading in led for f, st in sorted(leading.followers.items())]
        if len(rows) <= self.max_partition_series:
            for r, follower, behind in rows:
                lag.add_metric([broker, r.topic, str(r.partition), str(follower)], behind)
        else:
            worst: dict[str, int] = {}
            for r, _follower, behind in rows:
                worst[r.topic] = max(worst.get(r.topic, 0), behind)
            for topic, behind in sorted(worst.items()):
                lag.add_metric([broker, topic, "*", "*"], behind)
        yield lag

    def _partitions_led(self, replicated_led: int) -> int:
        """The replicated partitions led, plus the unreplicated ones held: a partition with no
        replica state has this broker as its only replica, and Produce serves it here (as
        BrokerService._log_for decides), so it is led here, as `dmq brokers list` counts it."""
        replication = self._node.replication
        unreplicated = sum(1 for topic, partition in self._node.logs.partitions()
                           if not is_offsets_log(topic) and replication.get(topic, partition) is None)
        return replicated_led + unreplicated

    def _queues(self, broker: str) -> Iterator[Metric]:
        answer = self._node.queues.describe("", "")
        depth: dict[tuple[str, str], int] = {}
        leases: dict[tuple[str, str], int] = {}
        for row in answer.groups:
            key = (row.topic, row.group)
            depth[key] = depth.get(key, 0) + row.pending
            leases[key] = leases.get(key, 0) + (1 if row.lease_id else 0)
        depth_family = GaugeMetricFamily("dmq_queue_depth_records",
                                         "Records not yet acknowledged by a queue group, on partitions led here",
                                         labels=["broker", "topic", "group"])
        lease_family = GaugeMetricFamily("dmq_queue_live_leases", "Live leases of a queue group",
                                         labels=["broker", "topic", "group"])
        for (topic, group), value in sorted(depth.items()):
            depth_family.add_metric([broker, topic, group], value)
            lease_family.add_metric([broker, topic, group], leases[(topic, group)])
        yield depth_family
        yield lease_family
        dead = GaugeMetricFamily("dmq_queue_dead_letters", "Records in a queue topic's dead-letter topic (<topic>.dlq) "
                                 "on partitions held here", labels=["broker", "topic"])
        counts: dict[str, int] = {}
        for plog in self._node.logs.open_logs():
            if plog.topic.endswith(".dlq"):
                queue = plog.topic.removesuffix(".dlq")
                counts[queue] = counts.get(queue, 0) + plog.log_end_offset - plog.log_start_offset
        for topic, value in sorted(counts.items()):
            dead.add_metric([broker, topic], value)
        yield dead


def _gauge(name: str, doc: str, broker: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["broker"])
    family.add_metric([broker], value)
    return family
