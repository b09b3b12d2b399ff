"""Every RPC of every service, table-driven (issue 18's first acceptance line), with tokens and with
mutual TLS: without credentials → refused and the cluster unchanged (tokens: UNAUTHENTICATED from
the server; mutual TLS: the TLS handshake refuses the client, UNAVAILABLE, see NO_CREDENTIALS); a
principal lacking the permission → PERMISSION_DENIED and the cluster unchanged; granted the
permission (the cluster principal for cluster-internal RPCs) → it works. The case table must cover
dmq.proto.server.security.rpc_table.RULES.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import records
from dmq.proto.grpc_options import channel_options
from dmq.proto.security.settings import ClientSecurity, sync_channel
from dmq.proto.server.security.rpc_table import RULES
from tests.security._stream_answers import AnswerRefused
from tests.security.conftest import client_as, tls_client, token_for

pytestmark = pytest.mark.timeout(120)
_names = itertools.count()


class Caller:
    """Raw stubs over one channel with one identity."""

    def __init__(self, address: str, security: ClientSecurity | None) -> None:
        self.channel = sync_channel(address, security, channel_options())
        self.metadata = pb_grpc.MetadataStub(self.channel)
        self.groups = pb_grpc.GroupCoordinatorStub(self.channel)
        self.broker = pb_grpc.BrokerStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.status = pb_grpc.CoordinatorStatusStub(self.channel)

    def call(self, method: str, request: Any) -> Any:
        service, name = method.strip("/").split("/")
        stub = {"dmq.v1.Metadata": self.metadata, "dmq.v1.GroupCoordinator": self.groups,
                "dmq.v1.Broker": self.broker, "grpc.health.v1.Health": self.health,
                "dmq.v1.CoordinatorStatus": self.status}[service]
        rpc = getattr(stub, name)
        if name in ("WatchGroup", "Watch", "EventSubscribe"):  # streams: the first event proves the call was served
            return next(iter(rpc(request, timeout=3)))
        if name == "EventAppendStream":  # a stream of requests: one, and its answer
            answer = next(iter(rpc(iter([request]), timeout=10)))
            if answer.status_code:  # refused: the message's answer carries the unary call's status
                raise AnswerRefused(answer)
            return answer
        return rpc(request, timeout=10)

    def close(self) -> None:
        self.channel.close()



@dataclass
class Case:
    # setup(admin, name) -> request: creates what the call needs (fresh per call), as a super-user
    setup: Callable[[Caller, str], Any]
    # grants(name) -> (resource type, resource name, operation, prefixed) the caller needs
    grants: Callable[[str], list[tuple[str, str, str, bool]]] = field(default=lambda n: [])
    works: grpc.StatusCode = grpc.StatusCode.OK  # the answer once authorized


def _topic(admin: Caller, name: str, partitions: int = 1) -> str:
    admin.metadata.CreateTopic(pb.CreateTopicRequest(name=name, partitions=partitions), timeout=10)
    return name


def _group(admin: Caller, topic: str) -> str:
    return admin.groups.FindOrCreateGroup(pb.FindOrCreateGroupRequest(topic=topic, app_id="app"), timeout=10).group_id


def _member(admin: Caller, name: str) -> tuple[str, pb.JoinGroupResponse]:
    group = _group(admin, _topic(admin, name))
    joined = admin.groups.JoinGroup(pb.JoinGroupRequest(group_id=group, consumer_id="c", client_id="c",
                                                        session_timeout_ms=30_000), timeout=10)
    return group, joined


def _batch() -> bytes:
    return records.encode([b"v"])


def G(name: str) -> str:  # noqa: N802 - the group id of `name`'s topic and app "app"
    return f"G_{name}_app"


def _queue_topic(admin: Caller, name: str) -> str:
    """A topic holding one record, for queue pops."""
    admin.broker.Produce(pb.ProduceRequest(topic=_topic(admin, name), partition=0, batch=_batch()), timeout=10)
    return name


def _lease(admin: Caller, name: str) -> str:
    """A live lease taken by the admin: its id is all a worker needs to finish it."""
    popped = admin.broker.QueuePop(pb.QueuePopRequest(topic=_queue_topic(admin, name), group=name + "q",
                                                      max_records=1, timeout_ms=5000), timeout=10)
    assert popped.lease_id, "the setup's pop found nothing"
    return popped.lease_id


def _event_topic(admin: Caller, name: str) -> str:
    """An event store holding one event of type "t" with attribute k=v."""
    admin.metadata.CreateTopic(pb.CreateTopicRequest(name=name, partitions=1, config=pb.TopicConfig(kind="event-store")),
                               timeout=10)
    admin.broker.EventAppend(pb.EventAppendRequest(topic=name, events=[pb.Event(type="t", tags=["k:v"])]), timeout=10)
    return name


def _event_group(admin: Caller, name: str) -> tuple[str, str]:
    topic, group = _event_topic(admin, name), name + "g"
    admin.broker.EventGroupControl(pb.EventGroupControlRequest(topic=topic, group=group,
                                                               action=pb.EVENT_GROUP_REGISTER), timeout=10)
    return topic, group


def _claim(admin: Caller, name: str) -> pb.EventClaimRef:
    """A partition claimed by worker "w" (the admin's call): the ref its worker finishes it with."""
    topic, group = _event_group(admin, name)
    got = admin.broker.EventClaimNext(pb.EventClaimRequest(topic=topic, group=group, partition_by=["k"],
                                                           handled_types=["t"], worker_id="w"), timeout=10)
    assert got.claimed, "the setup's claim found nothing"
    return pb.EventClaimRef(topic=topic, group=group, partition_key=got.partition_key, worker_id="w",
                            position=got.last_position)


def _read_topic_and_group(group_suffix: str, group_op: str = "read") -> Callable[[str], list[tuple[str, str, str, bool]]]:
    return lambda n: [("topic", n, "read", False), ("group", n + group_suffix, group_op, False)]


CLUSTER = [("cluster", "cluster", "describe", False)]
CASES: dict[str, Case] = {
    # Broker
    "/dmq.v1.Broker/Produce": Case(lambda a, n: pb.ProduceRequest(topic=_topic(a, n), partition=0, batch=_batch()),
                                   lambda n: [("topic", n, "write", False)]),
    "/dmq.v1.Broker/Fetch": Case(lambda a, n: pb.FetchRequest(partitions=[pb.FetchPartition(topic=_topic(a, n))]),
                                 lambda n: [("topic", n, "read", False)]),
    "/dmq.v1.Broker/ListOffsets": Case(lambda a, n: pb.ListOffsetsRequest(queries=[pb.OffsetQuery(topic=_topic(a, n), timestamp_ms=-1)]),
                                       lambda n: [("topic", n, "describe", False)]),
    "/dmq.v1.Broker/CommitOffsets": Case(  # an operator's reset: no member, generation -1
        lambda a, n: pb.CommitOffsetsRequest(group_id=_group(a, _topic(a, n)), member_id="", generation=-1,
                                             offsets=[pb.PartitionOffset(topic=n, partition=0, offset=0)]),
        lambda n: [("group", G(n), "delete", False), ("topic", n, "read", False)]),
    "/dmq.v1.Broker/FetchCommittedOffsets": Case(lambda a, n: pb.FetchCommittedOffsetsRequest(group_id=_group(a, _topic(a, n))),
                                                 lambda n: [("group", G(n), "describe", False)]),
    "/dmq.v1.Broker/DescribeLogs": Case(lambda a, n: pb.DescribeLogsRequest(partitions=[pb.TopicPartition(topic=_topic(a, n))]),
                                        lambda n: [("topic", n, "describe", False)]),
    "/dmq.v1.Broker/CreatePartitions": Case(lambda a, n: pb.CreatePartitionsRequest(
        topic=_topic(a, n), partitions=[0], config=pb.TopicConfig(retention_ms=1))),
    "/dmq.v1.Broker/DeletePartitions": Case(lambda a, n: pb.DeletePartitionsRequest(topic=_topic(a, n))),
    "/dmq.v1.Broker/DeleteGroupOffsets": Case(lambda a, n: pb.DeleteGroupOffsetsRequest(group_id=_group(a, _topic(a, n)))),
    # Broker: replication (the controller's pushes, a follower's epoch question)
    # Authorized, it reaches the handler, which fences it: controller_epoch 0 is older than the
    # epoch the broker took from its registration (the coordinator claims epoch >= 1 at start).
    "/dmq.v1.Broker/UpdatePartitionStates": Case(lambda a, n: pb.UpdatePartitionStatesRequest(states=[]),
                                                 works=grpc.StatusCode.FAILED_PRECONDITION),
    "/dmq.v1.Broker/OffsetForLeaderEpoch": Case(lambda a, n: pb.OffsetForLeaderEpochRequest(
        queries=[pb.EpochQuery(topic=_topic(a, n), partition=0, leader_epoch=0)], replica_id=0)),
    # Broker: queue mode (finishing a lease needs what popping it did, on the lease's topic and
    # group; a reject also write on the dead-letter topic)
    "/dmq.v1.Broker/QueuePop": Case(lambda a, n: pb.QueuePopRequest(topic=_queue_topic(a, n), group=n + "q", max_records=1,
                                                                    timeout_ms=2000),
                                    _read_topic_and_group("q")),
    "/dmq.v1.Broker/QueueAck": Case(lambda a, n: pb.QueueAckRequest(lease_id=_lease(a, n)), _read_topic_and_group("q")),
    "/dmq.v1.Broker/QueueNack": Case(lambda a, n: pb.QueueNackRequest(lease_id=_lease(a, n), error="test"),
                                     _read_topic_and_group("q")),
    "/dmq.v1.Broker/QueueReject": Case(lambda a, n: pb.QueueRejectRequest(lease_id=_lease(a, n), offset=0, error="test"),
                                       lambda n: [*_read_topic_and_group("q")(n), ("topic", n + ".dlq", "write", False)]),
    "/dmq.v1.Broker/QueueRenew": Case(lambda a, n: pb.QueueRenewRequest(lease_id=_lease(a, n)), _read_topic_and_group("q")),
    "/dmq.v1.Broker/QueueDescribe": Case(lambda a, n: pb.QueueDescribeRequest(topic=_queue_topic(a, n)),
                                         lambda n: [("topic", n, "describe", False)]),
    "/dmq.v1.Broker/FindTrace": Case(lambda a, n: pb.FindTraceRequest(trace_id=n),
                                     lambda n: [("cluster", "cluster", "read", False)]),
    # Broker: event store
    "/dmq.v1.Broker/EventAppend": Case(lambda a, n: pb.EventAppendRequest(topic=_event_topic(a, n), events=[pb.Event(type="t")]),
                                       lambda n: [("topic", n, "write", False)]),
    "/dmq.v1.Broker/EventAppendStream": Case(
        lambda a, n: pb.EventAppendRequest(topic=_event_topic(a, n), events=[pb.Event(type="t")]),
        lambda n: [("topic", n, "write", False)]),
    "/dmq.v1.Broker/EventRead": Case(lambda a, n: pb.EventReadRequest(topic=_event_topic(a, n)),
                                     lambda n: [("topic", n, "read", False)]),
    "/dmq.v1.Broker/EventSubscribe": Case(lambda a, n: pb.EventSubscribeRequest(topic=_event_topic(a, n)),
                                          lambda n: [("topic", n, "read", False)]),
    "/dmq.v1.Broker/EventGroupControl": Case(
        lambda a, n: pb.EventGroupControlRequest(topic=_event_topic(a, n), group=n + "g", action=pb.EVENT_GROUP_REGISTER),
        _read_topic_and_group("g", "alter")),
    "/dmq.v1.Broker/EventClaimNext": Case(
        lambda a, n: pb.EventClaimRequest(topic=_event_group(a, n)[0], group=n + "g", partition_by=["k"],
                                          handled_types=["t"], worker_id="w"),
        _read_topic_and_group("g")),
    "/dmq.v1.Broker/EventAck": Case(_claim, _read_topic_and_group("g")),
    "/dmq.v1.Broker/EventRelease": Case(_claim, _read_topic_and_group("g")),
    "/dmq.v1.Broker/EventRenewClaim": Case(_claim, _read_topic_and_group("g")),
    "/dmq.v1.Broker/EventGroupDescribe": Case(
        lambda a, n: pb.EventGroupDescribeRequest(topic=_event_group(a, n)[0], group=n + "g"),
        _read_topic_and_group("g", "describe")),
    "/dmq.v1.Broker/EventStoreDescribe": Case(lambda a, n: pb.EventStoreDescribeRequest(topic=_event_topic(a, n)),
                                              lambda n: [("topic", n, "describe", False)]),
    # Metadata
    "/dmq.v1.Metadata/RegisterBroker": Case(lambda a, n: _same_registration(a)),
    "/dmq.v1.Metadata/BrokerHeartbeat": Case(lambda a, n: pb.BrokerHeartbeatRequest(broker_id=0)),
    "/dmq.v1.Metadata/ListBrokers": Case(lambda a, n: pb.ListBrokersRequest(), lambda n: CLUSTER),
    "/dmq.v1.Metadata/CreateTopic": Case(lambda a, n: pb.CreateTopicRequest(name=n, partitions=1),
                                         lambda n: [("topic", n[:3], "create", True)]),
    "/dmq.v1.Metadata/DeleteTopic": Case(lambda a, n: pb.DeleteTopicRequest(name=_topic(a, n)),
                                         lambda n: [("topic", n, "delete", False)]),
    "/dmq.v1.Metadata/ListTopics": Case(lambda a, n: pb.ListTopicsRequest(), lambda n: CLUSTER),
    "/dmq.v1.Metadata/DescribeTopic": Case(lambda a, n: pb.DescribeTopicRequest(name=_topic(a, n)),
                                           lambda n: [("topic", n, "describe", False)]),
    "/dmq.v1.Metadata/AddPartitions": Case(lambda a, n: pb.AddPartitionsRequest(name=_topic(a, n), partitions=2),
                                           lambda n: [("topic", n, "alter", False)]),
    "/dmq.v1.Metadata/GetMetadata": Case(lambda a, n: pb.GetMetadataRequest(topics=[_topic(a, n)]),
                                         lambda n: [("topic", n, "describe", False)]),
    "/dmq.v1.Metadata/AddAcls": Case(lambda a, n: pb.AddAclsRequest(acls=[pb.AclEntry(
        principal="carol", resource_type="topic", resource_name=n, operation="read", permission="allow")]),
        lambda n: [("cluster", "cluster", "alter", False)]),
    "/dmq.v1.Metadata/RemoveAcls": Case(lambda a, n: _remove_acl(a, n), lambda n: [("cluster", "cluster", "alter", False)]),
    "/dmq.v1.Metadata/ListAcls": Case(lambda a, n: pb.ListAclsRequest(), lambda n: CLUSTER),
    "/dmq.v1.CoordinatorStatus/DescribeCoordinator": Case(lambda a, n: pb.DescribeCoordinatorRequest(), lambda n: CLUSTER),
    # the leader confirming its in-sync set as it is (cluster-internal)
    "/dmq.v1.Metadata/AlterIsr": Case(lambda a, n: _current_isr(a, _topic(a, n))),
    # moving the partition where it is: a change with nothing to move, still an admin's alter
    "/dmq.v1.Metadata/ReassignPartition": Case(
        lambda a, n: pb.ReassignPartitionRequest(topic=_topic(a, n), partition=0, replicas=_replicas(a, n)),
        lambda n: [("cluster", "cluster", "alter", False)]),
    # GroupCoordinator
    "/dmq.v1.GroupCoordinator/FindOrCreateGroup": Case(
        lambda a, n: pb.FindOrCreateGroupRequest(topic=_topic(a, n), app_id="app"),
        lambda n: [("group", G(n), "read", False), ("topic", n, "describe", False)]),
    "/dmq.v1.GroupCoordinator/JoinGroup": Case(
        lambda a, n: pb.JoinGroupRequest(group_id=_group(a, _topic(a, n)), consumer_id="c", session_timeout_ms=30_000),
        lambda n: [("group", G(n), "read", False)]),
    "/dmq.v1.GroupCoordinator/GetAssignment": Case(lambda a, n: _with_member(a, n, pb.GetAssignmentRequest),
                                                   lambda n: [("group", G(n), "read", False)]),
    "/dmq.v1.GroupCoordinator/Heartbeat": Case(lambda a, n: _with_member(a, n, pb.HeartbeatRequest, generation=True),
                                               lambda n: [("group", G(n), "read", False)]),
    "/dmq.v1.GroupCoordinator/WatchGroup": Case(lambda a, n: _with_member(a, n, pb.WatchGroupRequest),
                                                lambda n: [("group", G(n), "read", False)]),
    "/dmq.v1.GroupCoordinator/LeaveGroup": Case(lambda a, n: _with_member(a, n, pb.LeaveGroupRequest),
                                                lambda n: [("group", G(n), "read", False)]),
    "/dmq.v1.GroupCoordinator/ListGroups": Case(lambda a, n: pb.ListGroupsRequest(), lambda n: CLUSTER),
    "/dmq.v1.GroupCoordinator/DescribeGroup": Case(lambda a, n: pb.DescribeGroupRequest(group_id=_group(a, _topic(a, n))),
                                                   lambda n: [("group", G(n), "describe", False)]),
    "/dmq.v1.GroupCoordinator/DeleteGroup": Case(lambda a, n: pb.DeleteGroupRequest(group_id=_group(a, _topic(a, n))),
                                                 lambda n: [("group", G(n), "delete", False)]),
    "/dmq.v1.GroupCoordinator/CheckOwnership": Case(
        lambda a, n: pb.CheckOwnershipRequest(group_id=_group(a, _topic(a, n)), member_id="", generation=-1,
                                              topic=n, partitions=[0])),
    # Health: any authenticated principal
    "/grpc.health.v1.Health/Check": Case(lambda a, n: health_pb2.HealthCheckRequest()),
    "/grpc.health.v1.Health/Watch": Case(lambda a, n: health_pb2.HealthCheckRequest()),
    # grpcio-health-checking's servicer has no List: UNIMPLEMENTED comes from it, past the checks.
    "/grpc.health.v1.Health/List": Case(lambda a, n: health_pb2.HealthListRequest(), works=grpc.StatusCode.UNIMPLEMENTED),
}


def _same_registration(admin: Caller) -> pb.RegisterBrokerRequest:
    """Broker 0 registering again where it is (what a broker does after a coordinator restart)."""
    b = admin.metadata.ListBrokers(pb.ListBrokersRequest(), timeout=10).brokers[0]
    return pb.RegisterBrokerRequest(broker_id=b.broker_id, host=b.host, port=b.port)


def _replicas(admin: Caller, topic: str) -> list[int]:
    return list(admin.metadata.DescribeTopic(pb.DescribeTopicRequest(name=topic), timeout=10).partitions[0].replicas)


def _current_isr(admin: Caller, topic: str) -> pb.AlterIsrRequest:
    """Partition 0's leader asking for the in-sync set it has (a new partition: partition epoch 0)."""
    p = admin.metadata.DescribeTopic(pb.DescribeTopicRequest(name=topic), timeout=10).partitions[0]
    return pb.AlterIsrRequest(broker_id=p.leader_id, topic=topic, partition=0, leader_epoch=p.leader_epoch,
                              partition_epoch=0, isr=list(p.isr))


def _remove_acl(admin: Caller, name: str) -> pb.RemoveAclsRequest:
    entry = pb.AclEntry(principal="carol", resource_type="group", resource_name=name, operation="read", permission="allow")
    admin.metadata.AddAcls(pb.AddAclsRequest(acls=[entry]), timeout=10)
    return pb.RemoveAclsRequest(acls=[entry])


def _with_member(admin: Caller, name: str, cls: type, generation: bool = False) -> Any:
    group, joined = _member(admin, name)
    fields = dict(group_id=group, member_id=joined.member_id)
    if "member_secret" in cls.DESCRIPTOR.fields_by_name:
        fields["member_secret"] = joined.member_secret
    if generation:
        fields["generation"] = joined.generation
    return cls(**fields)


def snapshot(admin: Caller) -> dict[str, Any]:
    """What a refused call must leave as it was: topics, brokers, ACLs, groups, logs, commits."""
    topics = admin.metadata.ListTopics(pb.ListTopicsRequest(), timeout=10).topics
    groups = admin.groups.ListGroups(pb.ListGroupsRequest(), timeout=10).groups
    out: dict[str, Any] = {
        "topics": sorted((t.name, t.partition_count, t.config.SerializeToString()) for t in topics),
        "brokers": sorted((b.broker_id, b.host, b.port) for b in admin.metadata.ListBrokers(pb.ListBrokersRequest(), timeout=10).brokers),
        "acls": sorted(a.SerializeToString() for a in admin.metadata.ListAcls(pb.ListAclsRequest(), timeout=10).acls),
        "groups": sorted((g.group_id, g.member_count) for g in groups),
        "logs": sorted((lg.topic, lg.partition, lg.log_end_offset, lg.log_start_offset)
                       for lg in admin.broker.DescribeLogs(pb.DescribeLogsRequest(), timeout=10).logs),
    }
    out["commits"] = sorted(
        (g.group_id, o.topic, o.partition, o.offset) for g in groups
        for o in admin.broker.FetchCommittedOffsets(pb.FetchCommittedOffsetsRequest(group_id=g.group_id), timeout=10).offsets)
    return out


def _code(fn: Callable[..., Any], *args: Any) -> grpc.StatusCode:
    return _answer(fn, *args)[0]


def _answer(fn: Callable[..., Any], *args: Any) -> tuple[grpc.StatusCode, str]:
    try:
        fn(*args)
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


# Without credentials. Tokens: the call reaches the server, which refuses it. Mutual TLS: grpcio's
# server credentials either require a client certificate or never ask for one (require_client_auth
# maps to the C core's REQUEST_AND_REQUIRE_..._AND_VERIFY or DONT_REQUEST; its REQUEST_..._AND_VERIFY,
# which would let a certificate-less call through to the interceptor, is not exposed), so the TLS
# handshake refuses the client: no connection is ever READY, no call is made, gRPC says UNAVAILABLE.
NO_CREDENTIALS = {
    "tokens": (grpc.StatusCode.UNAUTHENTICATED, "no credentials: this cluster requires a token"),
    "mtls": (grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses"),
}


def test_the_case_table_covers_every_rule():
    assert set(CASES) == set(RULES)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["tokens", "mtls"])
def test_every_rpc_needs_credentials_and_its_permission(secure_cluster, certs, mode):
    c = secure_cluster(mode)
    admin = Caller(c.bootstrap, client_as(certs, mode, "admin"))
    alice = Caller(c.bootstrap, client_as(certs, mode, "alice"))
    nobody = Caller(c.bootstrap, tls_client(certs))
    cluster_security = (tls_client(certs, token=token_for("dmq-cluster")) if mode == "tokens"
                        else tls_client(certs, name="server"))
    node = Caller(c.bootstrap, cluster_security)
    states: list[grpc.ChannelConnectivity] = []
    watch = states.append  # called on a gRPC thread with each connectivity state of the channel
    nobody.channel.subscribe(watch)
    failures = []
    try:
        for method, case in CASES.items():
            rule = RULES[method]
            name = f"t{next(_names)}x"
            request = case.setup(admin, name)
            before = snapshot(admin)
            code, details = _answer(nobody.call, method, request)
            if code is not NO_CREDENTIALS[mode][0] or NO_CREDENTIALS[mode][1] not in details:
                failures.append(f"{method} without credentials: {code.name} {details!r}")
            if snapshot(admin) != before:
                failures.append(f"{method} without credentials refused, yet the cluster changed")
            internal = rule.access.name == "CLUSTER"
            denied_to = [alice, admin] if internal else ([alice] if case.grants(name) else [])
            for who in denied_to:
                before = snapshot(admin)
                code = _code(who.call, method, request)
                if code is not grpc.StatusCode.PERMISSION_DENIED:
                    failures.append(f"{method} without permission: {code.name}")
                if snapshot(admin) != before:
                    failures.append(f"{method} refused, yet the cluster changed")
            entries = [pb.AclEntry(principal="alice", resource_type=rt, resource_name=rn, operation=op,
                                   pattern_type="prefixed" if prefixed else "literal", permission="allow")
                       for rt, rn, op, prefixed in case.grants(name)]
            if entries:
                admin.metadata.AddAcls(pb.AddAclsRequest(acls=entries), timeout=10)
            code = _code((node if internal else alice).call, method, request)
            if code is not case.works:
                failures.append(f"{method} with permission: {code.name}")
            if entries:
                admin.metadata.RemoveAcls(pb.RemoveAclsRequest(acls=entries), timeout=10)
        # With tokens the certificate-less channel connects; with mutual TLS it never did.
        assert (grpc.ChannelConnectivity.READY in states) is (mode == "tokens"), states
    finally:
        nobody.channel.unsubscribe(watch)
        for caller in (admin, alice, nobody, node):
            caller.close()
    assert not failures, "\n".join(failures)


def test_a_replica_fetch_needs_the_cluster_principal(secure_cluster, certs):
    """A Fetch with replica_id reads past the high watermark and moves the in-sync set: read on
    the topic is not enough, nor is being a super-user; only the cluster principal may send it."""
    c = secure_cluster("tokens")
    admin = Caller(c.bootstrap, client_as(certs, "tokens", "admin"))
    alice = Caller(c.bootstrap, client_as(certs, "tokens", "alice"))
    node = Caller(c.bootstrap, tls_client(certs, token=token_for("dmq-cluster")))
    try:
        name = _topic(admin, f"t{next(_names)}x")
        admin.metadata.AddAcls(pb.AddAclsRequest(acls=[pb.AclEntry(
            principal="alice", resource_type="topic", resource_name=name, operation="read", permission="allow")]),
            timeout=10)
        consumer = pb.FetchRequest(partitions=[pb.FetchPartition(topic=name)])
        replica = pb.FetchRequest(partitions=[pb.FetchPartition(topic=name)], replica_id=1)
        assert _code(alice.call, "/dmq.v1.Broker/Fetch", consumer) is grpc.StatusCode.OK
        for who in (alice, admin):
            assert _code(who.call, "/dmq.v1.Broker/Fetch", replica) is grpc.StatusCode.PERMISSION_DENIED
        # let through; this unreplicated partition has no followers, which the answer says
        answer = node.call("/dmq.v1.Broker/Fetch", replica)
        assert answer.partitions[0].error == pb.NOT_LEADER
    finally:
        for caller in (admin, alice, node):
            caller.close()
