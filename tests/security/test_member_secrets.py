"""Group membership is proven with the secret JoinGroup issues (slice 4 of issue 18).

DescribeGroup shows member ids (operators need them), so an id alone must not let anyone act as
the member: heartbeats, assignment fetches, watches, leaves and commits without the member's
secret are refused, with security on or off.
"""

from __future__ import annotations

import grpc
import pytest

from dmq.client import DMQConsumer, Producer
from dmq.client.consumer import ConsumerConfig
from dmq.coordinator import group as machine
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.grpc_options import channel_options
from tests.security.conftest import token_for

pytestmark = pytest.mark.timeout(60)


def _code(fn, *args, **kwargs) -> grpc.StatusCode:
    try:
        fn(*args, **kwargs)
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


def test_a_stranger_with_a_member_id_cannot_act_as_the_member(cluster):
    channel = grpc.insecure_channel(cluster.bootstrap, options=channel_options())
    md, groups, broker = (pb_grpc.MetadataStub(channel), pb_grpc.GroupCoordinatorStub(channel),
                          pb_grpc.BrokerStub(channel))
    try:
        md.CreateTopic(pb.CreateTopicRequest(name="t", partitions=2), timeout=5)
        gid = groups.FindOrCreateGroup(pb.FindOrCreateGroupRequest(topic="t", app_id="a"), timeout=5).group_id
        joined = groups.JoinGroup(pb.JoinGroupRequest(group_id=gid, client_id="real"), timeout=5)
        secret = joined.member_secret
        assert len(secret) >= 32
        assignment = groups.GetAssignment(pb.GetAssignmentRequest(
            group_id=gid, member_id=joined.member_id, member_secret=secret, wait_ms=3_000), timeout=5)
        assert sorted(assignment.partitions) == [0, 1]

        described = groups.DescribeGroup(pb.DescribeGroupRequest(group_id=gid), timeout=5)
        assert [m.member_id for m in described.members] == [joined.member_id]
        assert secret.encode() not in described.SerializeToString()

        member = joined.member_id
        for secret_given in ("", "x" * 32, "é"):
            hostile = {
                "heartbeat": lambda s=secret_given: groups.Heartbeat(pb.HeartbeatRequest(
                    group_id=gid, member_id=member, generation=assignment.generation, member_secret=s), timeout=5),
                "get assignment": lambda s=secret_given: groups.GetAssignment(pb.GetAssignmentRequest(
                    group_id=gid, member_id=member, member_secret=s), timeout=5),
                "watch": lambda s=secret_given: next(iter(groups.WatchGroup(pb.WatchGroupRequest(
                    group_id=gid, member_id=member, member_secret=s), timeout=5))),
                "commit for its partitions": lambda s=secret_given: broker.CommitOffsets(pb.CommitOffsetsRequest(
                    group_id=gid, member_id=member, generation=assignment.generation, member_secret=s,
                    offsets=[pb.PartitionOffset(topic="t", partition=0, offset=0)]), timeout=5),
                "make it leave": lambda s=secret_given: groups.LeaveGroup(pb.LeaveGroupRequest(
                    group_id=gid, member_id=member, member_secret=s), timeout=5),
            }
            for what, call in hostile.items():
                assert _code(call) is grpc.StatusCode.PERMISSION_DENIED, (what, secret_given)
        committed = broker.FetchCommittedOffsets(pb.FetchCommittedOffsetsRequest(group_id=gid), timeout=5)
        assert all(o.offset == -1 for o in committed.offsets)
        assert groups.DescribeGroup(pb.DescribeGroupRequest(group_id=gid), timeout=5).members[0].member_id == member
        # The member itself, with its secret: all of it works.
        broker.CommitOffsets(pb.CommitOffsetsRequest(
            group_id=gid, member_id=member, generation=assignment.generation, member_secret=secret,
            offsets=[pb.PartitionOffset(topic="t", partition=0, offset=0)]), timeout=5)
        groups.LeaveGroup(pb.LeaveGroupRequest(group_id=gid, member_id=member, member_secret=secret), timeout=5)
        assert not groups.DescribeGroup(pb.DescribeGroupRequest(group_id=gid), timeout=5).members
    finally:
        channel.close()


def test_the_machine_checks_the_secret_and_draws_no_randomness():
    registry = machine.GroupRegistry(machine.GroupConfig(member_id_factory=lambda client: f"{client}-1"))
    registry.find_or_create(machine.FindOrCreateGroupRequest("t", "a", 2), 0)
    group = registry.get("G_t_a")
    joined = machine.handle_join(group, machine.JoinGroupRequest(client_id="c", member_secret="s" * 32), 0).response
    assert joined.member_secret == "s" * 32
    with pytest.raises(machine.MemberSecretError, match="member_secret is missing or wrong"):
        machine.handle_heartbeat(group, machine.HeartbeatRequest(joined.member_id), 1)
    ok = machine.handle_heartbeat(group, machine.HeartbeatRequest(joined.member_id, member_secret="s" * 32), 1)
    assert ok.response.generation == group.generation
    assert "s" * 32 not in repr(group.members[joined.member_id])


def test_a_consumer_group_works_end_to_end_with_tokens_and_acls(secure_cluster, certs):
    c = secure_cluster("tokens")
    admin_token, alice = token_for("admin"), token_for("alice")
    ca = str(certs / "ca.pem")
    channel = grpc.secure_channel(c.bootstrap, grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes()),
                                  options=channel_options())
    md = pb_grpc.MetadataStub(channel)
    meta = (("authorization", f"Bearer {admin_token}"),)
    md.CreateTopic(pb.CreateTopicRequest(name="orders", partitions=2), timeout=5, metadata=meta)
    md.AddAcls(pb.AddAclsRequest(acls=[
        pb.AclEntry(principal="alice", resource_type="topic", resource_name="orders", operation=op, permission="allow")
        for op in ("read", "write")] + [
        pb.AclEntry(principal="alice", resource_type="group", resource_name="G_orders_", pattern_type="prefixed",
                    operation="read", permission="allow")]), timeout=5, metadata=meta)
    channel.close()
    with Producer(c.bootstrap, ssl_cafile=ca, token=alice) as producer:
        for i in range(10):
            producer.send("orders", f"o{i}".encode(), partition=i % 2)
    config = ConsumerConfig(bootstrap_servers=c.bootstrap, group_id="app", ssl_cafile=ca, token=alice,
                            heartbeat_interval_ms=200, auto_offset_reset="earliest")
    got: list[bytes] = []
    with DMQConsumer(config) as consumer:
        consumer.subscribe("orders")
        for _ in range(100):
            got += [r.value for r in consumer.poll(200)]
            if len(got) >= 10:
                break
        consumer.commit_sync()
    assert sorted(got) == sorted(f"o{i}".encode() for i in range(10))
