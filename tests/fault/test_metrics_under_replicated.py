"""Under-replicated partitions on /metrics go 0 -> N -> 0 around a SIGSTOP of a follower (issue 29).

Real processes: a `dmq coordinator` and three `dmq broker`s, each broker serving /metrics on a
free port (`--metrics-port auto`, its URL read from the line it prints). A topic of 3 partitions,
replication factor 3. One broker is stopped (SIGSTOP); the live leaders drop it from their
in-sync sets after --replica-lag-time-max-ms, so the sum of dmq_broker_under_replicated_partitions
over the live brokers becomes N, the partitions the stopped broker does not lead; the coordinator
sees the same. After SIGCONT it catches up and both go back to 0. Every wait is on a condition
with a deadline; the broker session (30 s) is far longer than the stop, so no leadership moves.
"""

from __future__ import annotations

import functools
import pathlib
import signal
import sys

import grpc
import pytest

from dmq.client import AdminClient, Producer
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _isolation_procs import ProcCluster  # noqa: E402
from _scrape import scrape, total, url_in  # noqa: E402

from tests import polling  # noqa: E402

pytestmark = pytest.mark.timeout(180)

TOPIC = "watched"
PARTITIONS = 3
WAIT_S = 30.0
LAG_TIME_MAX_MS = 1000


wait_for = functools.partial(polling.wait_for, timeout_s=WAIT_S, poll_s=0.1)


def gauge(url: str, name: str) -> float:
    return total(scrape(url), name)


def metrics_url(log: pathlib.Path, broker: int) -> str:
    return url_in(log, f"broker {broker}")


def test_under_replicated_partitions_follow_a_stopped_follower(tmp_path: pathlib.Path) -> None:
    procs = ProcCluster(tmp_path, 3, broker_session_timeout_ms=30_000,
                        broker_args=["--metrics-port", "auto", "--replica-lag-time-max-ms", str(LAG_TIME_MAX_MS)])
    try:
        urls = {i: metrics_url(tmp_path / f"broker{i}.log", i) for i in range(3)}
        with AdminClient(procs.bootstrap) as admin:
            wait_for(lambda: len(admin.list_brokers()) == 3, "three brokers registered")
            admin.create_topic(TOPIC, PARTITIONS, {"replication_factor": 3})
            with Producer(procs.bootstrap, linger_ms=0) as producer:
                for p in range(PARTITIONS):
                    producer.send(TOPIC, b"before", partition=p)
                producer.flush(WAIT_S)
        channel = grpc.insecure_channel(procs.bootstrap)
        metadata = pb_grpc.MetadataStub(channel)

        def infos() -> list[pb.PartitionInfo]:
            return list(metadata.GetMetadata(pb.GetMetadataRequest(topics=[TOPIC]), timeout=10).topics[0].partitions)

        def under(brokers: list[int]) -> float:
            return sum(gauge(urls[i], "dmq_broker_under_replicated_partitions") for i in brokers)

        try:
            wait_for(lambda: all(len(i.isr) == 3 for i in infos()), "every partition fully in sync")
            assert under([0, 1, 2]) == 0
            leaders = {i.partition: i.leader_id for i in infos()}
            # stop the broker leading fewest partitions: N, what the others lead, is largest
            stopped = min(range(3), key=lambda b: (sum(1 for v in leaders.values() if v == b), b))
            live = [b for b in range(3) if b != stopped]
            n = sum(1 for v in leaders.values() if v != stopped)
            procs.signal_broker(stopped, signal.SIGSTOP)
            try:
                wait_for(lambda: under(live) == n, f"{n} under-replicated partitions on brokers {live}")
                assert {i.partition: i.leader_id for i in infos()} == leaders  # no leadership moved meanwhile
            finally:
                procs.signal_broker(stopped, signal.SIGCONT)
            wait_for(lambda: under([0, 1, 2]) == 0, "no under-replicated partition after SIGCONT")
            wait_for(lambda: all(len(i.isr) == 3 for i in infos()), "every partition in sync again")
            shrinks = sum(gauge(urls[i], "dmq_broker_isr_shrinks_total") for i in live)
            expands = sum(gauge(urls[i], "dmq_broker_isr_expands_total") for i in live)
            assert shrinks >= n and expands >= n
        finally:
            channel.close()
    finally:
        procs.close()
