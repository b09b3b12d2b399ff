"""Gauges that had no value test (issue 29 audit), against the truth, over real processes: a
`dmq coordinator` and `dmq broker`s, each serving /metrics on a free port (`--metrics-port auto`,
the URL read from the line it prints).

- A follower stopped with SIGSTOP: on its leaders, dmq_broker_follower_lag_records for it is
  exactly the records they appended since (its log end is frozen), growing with each write, and
  back to 0 after SIGCONT; the coordinator's dmq_coordinator_under_replicated_partitions goes
  0 -> N -> 0 as its metadata's in-sync sets do.
- A partition whose in-sync replicas are all down (its follower out of sync, its leader killed with
  SIGKILL): dmq_coordinator_offline_partitions and the surviving replica's
  dmq_broker_offline_partitions go 0 -> 1 -> 0 (the leader restarted).
- dmq_coordinator_leader_elections_total equals the sum of the partitions' leader epochs in the
  metadata, before and after leadership moves.

Every wait is on a condition with a deadline.
"""

from __future__ import annotations

import functools
import pathlib
import signal
import sys

import grpc
import pytest

from dmq.client import AdminClient
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import records

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _isolation_procs import ProcCluster  # noqa: E402
from _scrape import scrape, total, url_in  # noqa: E402

from tests import polling  # noqa: E402

pytestmark = pytest.mark.timeout(180)

WAIT_S = 30.0
LAG_TIME_MAX_MS = 1000
METRICS = ["--metrics-port", "auto"]


wait_for = functools.partial(polling.wait_for, timeout_s=WAIT_S, poll_s=0.1)


def follower_lags(url: str, topic: str) -> dict[tuple[int, int], float]:
    """(partition, follower) -> dmq_broker_follower_lag_records, on the broker at `url`."""
    return {(int(labels["partition"]), int(labels["follower"])): v for n, labels, v in scrape(url)
            if n == "dmq_broker_follower_lag_records" and labels["topic"] == topic}


class Metadata:
    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self._channel = grpc.insecure_channel(bootstrap)
        self._stub = pb_grpc.MetadataStub(self._channel)

    def infos(self) -> list[pb.PartitionInfo]:
        answer = self._stub.GetMetadata(pb.GetMetadataRequest(topics=[self.topic]), timeout=10)
        return list(answer.topics[0].partitions)

    def epochs(self) -> int:
        return sum(i.leader_epoch for i in self.infos())

    def close(self) -> None:
        self._channel.close()


def produce(address: str, topic: str, partition: int, count: int) -> None:
    """`count` records in one batch, acknowledged by the leader alone (a stopped follower must not hold it)."""
    with grpc.insecure_channel(address) as channel:
        pb_grpc.BrokerStub(channel).Produce(pb.ProduceRequest(
            topic=topic, partition=partition, batch=records.encode([b"r"] * count), acks=pb.ACKS_LEADER), timeout=10)


def test_follower_lag_and_under_replicated_follow_a_stopped_follower(tmp_path: pathlib.Path) -> None:
    topic, partitions = "lagging", 3
    procs = ProcCluster(tmp_path, 3, broker_session_timeout_ms=30_000, coordinator_args=METRICS,
                        broker_args=[*METRICS, "--replica-lag-time-max-ms", str(LAG_TIME_MAX_MS)])
    try:
        coordinator = url_in(tmp_path / "coordinator.log", "coordinator")
        urls = {i: url_in(tmp_path / f"broker{i}.log", f"broker {i}") for i in range(3)}
        with AdminClient(procs.bootstrap) as admin:
            wait_for(lambda: len(admin.list_brokers()) == 3, "three brokers registered")
            admin.create_topic(topic, partitions, {"replication_factor": 3})
        metadata = Metadata(procs.bootstrap, topic)
        try:
            wait_for(lambda: all(len(i.isr) == 3 for i in metadata.infos()), "every partition fully in sync")
            leaders = {i.partition: i.leader_id for i in metadata.infos()}
            for p, leader in leaders.items():
                produce(procs.broker_addresses[leader], topic, p, 2)

            def lags(brokers: list[int]) -> dict[tuple[int, int], float]:
                return {k: v for b in brokers for k, v in follower_lags(urls[b], topic).items()}

            # every (partition, follower) pair has its series, all caught up
            wait_for(lambda: (got := lags([0, 1, 2])) and len(got) == partitions * 2 and not any(got.values()),
                     "every follower caught up")
            samples = scrape(coordinator)
            assert total(samples, "dmq_coordinator_under_replicated_partitions") == 0
            assert total(samples, "dmq_coordinator_leader_elections_total") == metadata.epochs()

            stopped = min(range(3), key=lambda b: (sum(1 for v in leaders.values() if v == b), b))
            live = [b for b in range(3) if b != stopped]
            led_live = sorted(p for p, v in leaders.items() if v != stopped)
            procs.signal_broker(stopped, signal.SIGSTOP)
            try:
                written = 0
                for batch in (3, 4):  # the stopped follower's lag grows with every write...
                    for p in led_live:
                        produce(procs.broker_addresses[leaders[p]], topic, p, batch)
                    written += batch
                    expected = {p: written for p in led_live}
                    wait_for(lambda want=expected: {p: v for (p, f), v in lags(live).items() if f == stopped} == want,
                             f"the stopped follower's lag to be {expected}")
                # ...while the live followers catch up
                wait_for(lambda: not any(v for (_p, f), v in lags(live).items() if f != stopped),
                         "the live followers caught up")
                wait_for(lambda: total(scrape(coordinator), "dmq_coordinator_under_replicated_partitions")
                         == len(led_live) == sum(1 for i in metadata.infos() if len(i.isr) < 3),
                         f"{len(led_live)} under-replicated partitions on the coordinator")
                assert {i.partition: i.leader_id for i in metadata.infos()} == leaders  # nothing moved meanwhile
            finally:
                procs.signal_broker(stopped, signal.SIGCONT)
            wait_for(lambda: not any(lags([0, 1, 2]).values()), "every follower caught up after SIGCONT")
            wait_for(lambda: total(scrape(coordinator), "dmq_coordinator_under_replicated_partitions") == 0
                     and all(len(i.isr) == 3 for i in metadata.infos()), "no under-replicated partition")
            assert total(scrape(coordinator), "dmq_coordinator_leader_elections_total") == metadata.epochs()
        finally:
            metadata.close()
    finally:
        procs.close()


def test_offline_partition_gauges_and_elections(tmp_path: pathlib.Path) -> None:
    topic = "fragile"
    procs = ProcCluster(tmp_path, 2, broker_session_timeout_ms=2_000, coordinator_args=METRICS,
                        broker_args=[*METRICS, "--replica-lag-time-max-ms", str(LAG_TIME_MAX_MS)])
    try:
        coordinator = url_in(tmp_path / "coordinator.log", "coordinator")
        with AdminClient(procs.bootstrap) as admin:
            wait_for(lambda: sum(b.alive for b in admin.list_brokers()) == 2, "two brokers alive")
            admin.create_topic(topic, 1, {"replication_factor": 2})
        metadata = Metadata(procs.bootstrap, topic)
        try:
            [info] = wait_for(lambda: (got := metadata.infos()) and len(got[0].isr) == 2 and got, "both in sync")
            leader, follower = info.leader_id, next(b for b in info.replicas if b != info.leader_id)
            samples = scrape(coordinator)
            assert total(samples, "dmq_coordinator_offline_partitions") == 0
            assert total(samples, "dmq_coordinator_leader_elections_total") == metadata.epochs()
            follower_url = url_in(tmp_path / f"broker{follower}.log", f"broker {follower}")
            assert total(scrape(follower_url), "dmq_broker_offline_partitions") == 0

            # The follower stops and leaves the in-sync set; then the leader, the only in-sync
            # replica, dies: no replica may lead (unclean election is off).
            procs.signal_broker(follower, signal.SIGSTOP)
            try:
                wait_for(lambda: list(metadata.infos()[0].isr) == [leader], "the follower out of the in-sync set")
                procs.brokers[leader].kill()
                procs.brokers[leader].wait(10)
                wait_for(lambda: metadata.infos()[0].leader_id < 0, "the partition without a leader")
                wait_for(lambda: total(scrape(coordinator), "dmq_coordinator_offline_partitions") == 1,
                         "one offline partition on the coordinator")
            finally:
                procs.signal_broker(follower, signal.SIGCONT)
            # The surviving replica learns it has no leader to follow.
            wait_for(lambda: total(scrape(follower_url), "dmq_broker_offline_partitions") == 1,
                     "one offline partition on the surviving replica")
            assert total(scrape(coordinator), "dmq_coordinator_leader_elections_total") == metadata.epochs()

            procs.start_broker(leader)  # the last in-sync replica is back: it leads again
            wait_for(lambda: metadata.infos()[0].leader_id == leader, "the restarted broker leading")
            wait_for(lambda: total(scrape(coordinator), "dmq_coordinator_offline_partitions") == 0,
                     "no offline partition on the coordinator")
            wait_for(lambda: total(scrape(follower_url), "dmq_broker_offline_partitions") == 0,
                     "no offline partition on the follower")
            assert total(scrape(coordinator), "dmq_coordinator_leader_elections_total") == metadata.epochs() > info.leader_epoch
        finally:
            metadata.close()
    finally:
        procs.close()
