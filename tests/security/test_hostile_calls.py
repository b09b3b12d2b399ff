"""Regression tests for each hostile call of issue 18's first paragraph.

With security on, a client (even one allowed to use the group and the topic) cannot call the
cluster-internal RPCs; with security off, a live broker's id still cannot be re-pointed.
"""

from __future__ import annotations

import grpc
import pytest

from dmq.client import Producer
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.grpc_options import channel_options
from dmq.proto.security.settings import sync_channel
from tests.security.conftest import tls_client, token_for

pytestmark = pytest.mark.timeout(60)


def _stubs(address: str, security):
    channel = sync_channel(address, security, channel_options())
    return channel, pb_grpc.MetadataStub(channel), pb_grpc.BrokerStub(channel), pb_grpc.GroupCoordinatorStub(channel)


def _code(fn) -> grpc.StatusCode:
    try:
        fn()
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def test_a_live_brokers_id_is_never_re_pointed_even_with_security_off(cluster):
    channel = grpc.insecure_channel(cluster.bootstrap, options=channel_options())
    metadata = pb_grpc.MetadataStub(channel)
    try:
        before = [(b.broker_id, b.host, b.port) for b in metadata.ListBrokers(pb.ListBrokersRequest(), timeout=5).brokers]
        for stray in (pb.RegisterBrokerRequest(broker_id=0, host="10.9.9.9", port=1234),
                      pb.RegisterBrokerRequest(host="127.0.0.1", port=1)):  # the fuzzed one: id left unset
            with pytest.raises(grpc.RpcError) as info:
                metadata.RegisterBroker(stray, timeout=5)
            assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert "broker id 0 is live at" in info.value.details()
        after = [(b.broker_id, b.host, b.port) for b in metadata.ListBrokers(pb.ListBrokersRequest(), timeout=5).brokers]
        assert after == before
        metadata.CreateTopic(pb.CreateTopicRequest(name="still-works", partitions=1), timeout=5)
    finally:
        channel.close()
    with Producer(cluster.bootstrap, delivery_timeout_ms=5_000, request_timeout_ms=4_000) as producer:
        producer.send("still-works", b"v").get(5)


def test_clients_cannot_call_the_cluster_internal_rpcs(secure_cluster, certs):
    c = secure_cluster("tokens")
    admin_channel, admin_md, admin_broker, admin_groups = _stubs(c.bootstrap, tls_client(certs, token=token_for("admin")))
    admin_md.CreateTopic(pb.CreateTopicRequest(name="t", partitions=2, config=pb.TopicConfig(retention_ms=3_600_000)),
                         timeout=5)
    group = admin_groups.FindOrCreateGroup(pb.FindOrCreateGroupRequest(topic="t", app_id="a"), timeout=5).group_id
    # alice may use topic t and its group fully: still no internal call.
    admin_md.AddAcls(pb.AddAclsRequest(acls=[
        pb.AclEntry(principal="alice", resource_type=rt, resource_name=n, operation=op, permission="allow")
        for rt, n in (("topic", "t"), ("group", group))
        for op in ("read", "write", "create", "delete", "describe", "alter")]), timeout=5)
    channel, md, broker, groups = _stubs(c.bootstrap, tls_client(certs, token=token_for("alice")))
    try:
        before_brokers = admin_md.ListBrokers(pb.ListBrokersRequest(), timeout=5)
        before_topic = admin_md.DescribeTopic(pb.DescribeTopicRequest(name="t"), timeout=5)
        hostile = {
            "re-point broker 0": lambda: md.RegisterBroker(pb.RegisterBrokerRequest(broker_id=0, host="10.0.0.9", port=9), timeout=5),
            "register a fake broker": lambda: md.RegisterBroker(pb.RegisterBrokerRequest(broker_id=5, host="10.0.0.9", port=9), timeout=5),
            "fake broker heartbeats": lambda: md.BrokerHeartbeat(pb.BrokerHeartbeatRequest(broker_id=0), timeout=5),
            "DeletePartitions": lambda: broker.DeletePartitions(pb.DeletePartitionsRequest(topic="t"), timeout=5),
            "CreatePartitions replacing the config": lambda: broker.CreatePartitions(pb.CreatePartitionsRequest(
                topic="t", partitions=[0, 1], config=pb.TopicConfig(retention_ms=1)), timeout=5),
            "DeleteGroupOffsets": lambda: broker.DeleteGroupOffsets(pb.DeleteGroupOffsetsRequest(group_id=group), timeout=5),
            "CheckOwnership": lambda: groups.CheckOwnership(pb.CheckOwnershipRequest(
                group_id=group, member_id="", generation=-1, topic="t", partitions=[0]), timeout=5),
        }
        for what, call in hostile.items():
            assert _code(call) is grpc.StatusCode.PERMISSION_DENIED, what
        assert admin_md.ListBrokers(pb.ListBrokersRequest(), timeout=5) == before_brokers
        assert admin_md.DescribeTopic(pb.DescribeTopicRequest(name="t"), timeout=5) == before_topic
        # Super-users are clients too: the internal RPCs are the cluster principal's alone.
        assert _code(lambda: admin_broker.DeletePartitions(pb.DeletePartitionsRequest(topic="t"), timeout=5)) \
            is grpc.StatusCode.PERMISSION_DENIED
    finally:
        channel.close()
        admin_channel.close()


def test_strangers_cannot_join_a_group_to_take_its_partitions(secure_cluster, certs):
    c = secure_cluster("tokens")
    channel, md, _broker, groups = _stubs(c.bootstrap, tls_client(certs, token=token_for("admin")))
    md.CreateTopic(pb.CreateTopicRequest(name="t", partitions=4), timeout=5)
    group = groups.FindOrCreateGroup(pb.FindOrCreateGroupRequest(topic="t", app_id="a"), timeout=5).group_id
    channel.close()
    channel, _md, _broker, groups = _stubs(c.bootstrap, tls_client(certs, token=token_for("mallory")))
    try:
        for i in range(40):
            join = pb.JoinGroupRequest(group_id=group, consumer_id=f"fake-{i}")
            assert _code(lambda r=join: groups.JoinGroup(r, timeout=5)) is grpc.StatusCode.PERMISSION_DENIED
        assert _code(lambda: groups.DescribeGroup(pb.DescribeGroupRequest(group_id=group), timeout=5)) \
            is grpc.StatusCode.PERMISSION_DENIED
    finally:
        channel.close()
