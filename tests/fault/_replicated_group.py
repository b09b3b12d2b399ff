"""A replicated topic and a consumer group over ProcCluster processes, for the fault tests of
committed offsets (the offsets log beside each partition shares its in-sync set)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import grpc

from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import records


def partition_info(metadata: pb_grpc.MetadataStub, topic: str, partition: int = 0) -> pb.PartitionInfo:
    return metadata.GetMetadata(pb.GetMetadataRequest(topics=[topic]), timeout=10).topics[0].partitions[partition]


def wait_partition(
    metadata: pb_grpc.MetadataStub, topic: str, ok: Callable[[pb.PartitionInfo], bool], what: str,
    timeout_s: float, poll_s: float,
) -> pb.PartitionInfo:
    """Partition 0's metadata once ok(it) holds; AssertionError naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = partition_info(metadata, topic)
        if ok(info):
            return info
        assert time.monotonic() < deadline, f"{what} did not happen: {info}"
        time.sleep(poll_s)  # polling a condition under a deadline


def create_topic_and_group(channel: grpc.Channel, topic: str, app_id: str, partitions: int = 1) -> str:
    """`topic` with replication factor 3 and min_insync_replicas 2, and its group for `app_id`:
    the group id."""
    metadata = pb_grpc.MetadataStub(channel)
    config = pb.TopicConfig(replication_factor=3, min_insync_replicas=2)
    metadata.CreateTopic(pb.CreateTopicRequest(name=topic, partitions=partitions, config=config), timeout=30)
    return str(pb_grpc.GroupCoordinatorStub(channel).FindOrCreateGroup(
        pb.FindOrCreateGroupRequest(topic=topic, app_id=app_id), timeout=10).group_id)


def produce_ten(address: str, topic: str) -> None:
    """Ten records to partition 0 at its leader `address`, acks=all."""
    with grpc.insecure_channel(address) as conn:
        pb_grpc.BrokerStub(conn).Produce(pb.ProduceRequest(
            topic=topic, partition=0, batch=records.encode([b"x"] * 10), acks=pb.ACKS_ALL), timeout=20)


def in_sync_group_with_ten_records(
    channel: grpc.Channel, broker_addresses: Mapping[int, str], topic: str, app_id: str, timeout_s: float,
    poll_s: float,
) -> tuple[str, pb.PartitionInfo]:
    """create_topic_and_group(), then, once all three replicas are in sync, produce_ten() at the
    leader: (the group id, partition 0's metadata then)."""
    group = create_topic_and_group(channel, topic, app_id)
    info = wait_partition(pb_grpc.MetadataStub(channel), topic, lambda i: len(i.isr) == 3, "all in sync", timeout_s,
                          poll_s)
    produce_ten(broker_addresses[info.leader_id], topic)
    return group, info
