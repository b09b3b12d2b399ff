"""Partitions per broker and in the cluster are bounded, with RESOURCE_EXHAUSTED naming the limit
(issue 13: one client created 200,011 partitions; restart then took 24.7 s and ListTopics timed out)."""

from __future__ import annotations

import grpc
import pytest

from dmq.client.cli.runner import ClusterThread
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.grpc_options import channel_options


@pytest.fixture
def meta(cluster: ClusterThread):
    channel = grpc.insecure_channel(cluster.bootstrap, options=channel_options())
    yield pb_grpc.MetadataStub(channel)
    channel.close()


def _refused(call, request) -> str:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
    return info.value.details()


def test_partitions_per_broker_are_bounded(cluster: ClusterThread, meta) -> None:
    cluster.cluster.coordinator.metadata.topic_admin.max_partitions_per_broker = 20
    meta.CreateTopic(pb.CreateTopicRequest(name="a", partitions=15), timeout=10)
    details = _refused(meta.CreateTopic, pb.CreateTopicRequest(name="b", partitions=6))
    assert "max_partitions_per_broker" in details and "20" in details and "broker 0" in details, details
    details = _refused(meta.AddPartitions, pb.AddPartitionsRequest(name="a", partitions=21))
    assert "max_partitions_per_broker" in details
    # nothing of the refused requests was recorded
    listed = meta.ListTopics(pb.ListTopicsRequest(), timeout=10)
    assert [(t.name, t.partition_count) for t in listed.topics] == [("a", 15)]
    meta.AddPartitions(pb.AddPartitionsRequest(name="a", partitions=20), timeout=10)
    meta.DeleteTopic(pb.DeleteTopicRequest(name="a"), timeout=10)
    meta.CreateTopic(pb.CreateTopicRequest(name="b", partitions=20), timeout=10)  # room again


def test_partitions_in_the_cluster_are_bounded(cluster: ClusterThread, meta) -> None:
    cluster.cluster.coordinator.metadata.topic_admin.max_partitions_total = 25
    meta.CreateTopic(pb.CreateTopicRequest(name="a", partitions=20), timeout=10)
    details = _refused(meta.CreateTopic, pb.CreateTopicRequest(name="b", partitions=6))
    assert "max_partitions_total" in details and "25" in details, details
