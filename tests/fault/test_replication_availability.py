"""A replicated partition with real broker processes: writable with one replica down, acks=all
refused (NOT_ENOUGH_REPLICAS, nothing acknowledged, nothing appended) with two down, writable again
once a replica has caught up (issue 15)."""

from __future__ import annotations

import pathlib
import signal
import time

import grpc
import pytest
from _isolation_procs import ProcCluster

from dmq.client import Producer, SimpleConsumer
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import error_details, records

pytestmark = pytest.mark.timeout(180)

TOPIC = "replicated"
LAG_TIME_MS = 1000


def _partition(metadata: pb_grpc.MetadataStub) -> pb.PartitionInfo:
    return metadata.GetMetadata(pb.GetMetadataRequest(topics=[TOPIC]), timeout=10).topics[0].partitions[0]


def _wait_isr(metadata: pb_grpc.MetadataStub, isr: set[int], timeout_s: float = 30.0) -> pb.PartitionInfo:
    deadline = time.monotonic() + timeout_s
    info = _partition(metadata)
    while set(info.isr) != isr:
        assert time.monotonic() < deadline, f"ISR {list(info.isr)} never became {sorted(isr)}"
        time.sleep(0.1)
        info = _partition(metadata)
    return info


def _log_end(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        answer = pb_grpc.BrokerStub(channel).DescribeLogs(
            pb.DescribeLogsRequest(partitions=[pb.TopicPartition(topic=TOPIC, partition=0)]), timeout=10
        )
    return answer.logs[0].log_end_offset


def _send_all(bootstrap: str, values: list[bytes]) -> list[int]:
    with Producer(bootstrap, acks="all", linger_ms=0, delivery_timeout_ms=60_000) as producer:
        futures = [producer.send(TOPIC, v, partition=0) for v in values]
        return [f.get(60).offset for f in futures]


def test_one_replica_down_stays_writable_and_two_down_refuse_acks_all(tmp_path: pathlib.Path) -> None:
    with ProcCluster(
        tmp_path, 3, broker_session_timeout_ms=1000, broker_args=["--replica-lag-time-max-ms", str(LAG_TIME_MS)]
    ) as cluster, grpc.insecure_channel(cluster.bootstrap) as channel:
        metadata = pb_grpc.MetadataStub(channel)
        config = pb.TopicConfig(replication_factor=3, min_insync_replicas=2)
        metadata.CreateTopic(pb.CreateTopicRequest(name=TOPIC, partitions=1, config=config), timeout=30)
        info = _wait_isr(metadata, {0, 1, 2})
        leader = info.leader_id
        first, second = [b for b in info.replicas if b != leader]
        leader_address = cluster.broker_addresses[leader]

        acked = _send_all(cluster.bootstrap, [f"a{i}".encode() for i in range(50)])

        cluster.signal_broker(first, signal.SIGKILL)
        _wait_isr(metadata, {leader, second})
        acked += _send_all(cluster.bootstrap, [f"b{i}".encode() for i in range(50)])

        cluster.signal_broker(second, signal.SIGKILL)
        _wait_isr(metadata, {leader})
        end_before = _log_end(leader_address)
        with grpc.insecure_channel(leader_address) as leader_channel:
            broker = pb_grpc.BrokerStub(leader_channel)
            request = pb.ProduceRequest(topic=TOPIC, partition=0, batch=records.encode([b"refused"]), acks=pb.ACKS_ALL)
            with pytest.raises(grpc.RpcError) as refused:
                broker.Produce(request, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert error_details.reason_of(refused.value.trailing_metadata()) == error_details.NOT_ENOUGH_REPLICAS
            assert "min_insync_replicas" in (refused.value.details() or "")
            assert _log_end(leader_address) == end_before, "a refused acks=all produce was appended"

        # One follower back and caught up: acks=all works again.
        cluster.start_broker(first)
        _wait_isr(metadata, {leader, first})
        acked += _send_all(cluster.bootstrap, [f"c{i}".encode() for i in range(50)])

        assert acked == sorted(acked) and len(set(acked)) == 150
        with SimpleConsumer(cluster.bootstrap) as consumer:
            got = [r.value for r in consumer.consume(TOPIC, 0, 0, max_records=1000, max_wait_ms=2000)]
        assert got == [f"{p}{i}".encode() for p in "abc" for i in range(50)]
