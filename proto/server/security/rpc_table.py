"""The one table of what every RPC needs: who may call it and which permission it checks.

Every method of every service the servers host is here (a test walks the proto's services and
the health service against it); a method not in the table is refused, so a new RPC cannot slip
through unguarded. Each rule says:
  - `access`:
      CLUSTER        cluster-internal: only the cluster principal (the nodes themselves) may call
                     it, never a client, super-users included (registration, the brokers'
                     partition and offset management, ownership checks);
      AUTHENTICATED  any principal (health checks);
      ACL            the principal needs every permission `needs(request)` lists;
      HANDLER        the request names no resource, only something the server holds (a queue
                     lease id): the interceptor authenticates, and the handler looks up what it
                     belongs to and checks the permissions with `current_access` before acting
                     (dmq.proto.server.security.interceptor), the same ACL decision;
  - `needs(request)`: the (resource type, name, operation) triples, read from the request;
  - `admin`: an administrative change (or a test of the request telling one: an offset reset is a
    commit with no member), logged as an audit event with its outcome;
  - `quota`: which byte-rate quota the call is charged to (produce: the request's bytes; fetch:
    the answer's).

The permissions follow the issue and Kafka: produce = write on the topic; fetch = read on each
topic; commit = read on the group (and on the topics); an operator's offset reset (a commit with no
member) = delete on the group; create/delete/alter topics = create/delete/alter on the topic;
listing the cluster's topics, groups, brokers or ACLs = describe on the cluster; changing ACLs =
alter on the cluster.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dmq.proto.names import group_id_for
from dmq.proto.security.acls import CLUSTER_RESOURCE, Operation, ResourceType

__all__ = ["Access", "Need", "RULES", "RpcRule", "rule_for"]


class Access(enum.Enum):
    CLUSTER = "cluster"
    AUTHENTICATED = "authenticated"
    ACL = "acl"
    HANDLER = "handler"


@dataclass(frozen=True, slots=True)
class Need:
    resource_type: ResourceType
    name: str
    operation: Operation

    def __str__(self) -> str:
        return f"{self.operation} on {self.resource_type} {self.name!r}"


Needs = Callable[[Any], list[Need]]


@dataclass(frozen=True, slots=True)
class RpcRule:
    access: Access
    needs: Needs | None = None
    admin: bool | Callable[[Any], bool] = False  # or: whether this request is one
    quota: str | None = None  # "produce" | "fetch"
    # Some requests of an RPC need more than the rule says (a follower broker's Fetch): the rule
    # that applies to this request instead, or None for this rule.
    stricter: Callable[[Any], RpcRule | None] | None = None

    def is_admin(self, request: Any) -> bool:
        return self.admin(request) if callable(self.admin) else self.admin

    def for_request(self, request: Any) -> RpcRule:
        """The rule that decides this request (see `stricter`)."""
        if self.stricter is None:
            return self
        return self.stricter(request) or self


def _topic(op: Operation, field: str = "topic") -> Needs:
    return lambda r: [Need(ResourceType.TOPIC, getattr(r, field), op)]


def _group(op: Operation) -> Needs:
    return lambda r: [Need(ResourceType.GROUP, r.group_id, op)]


def _cluster(op: Operation) -> Needs:
    return lambda _r: [Need(ResourceType.CLUSTER, CLUSTER_RESOURCE, op)]


def _each_topic(op: Operation, items: Callable[[Any], Any]) -> Needs:
    return lambda r: [Need(ResourceType.TOPIC, t, op) for t in sorted({i.topic for i in items(r)})]


def _metadata(r: Any) -> list[Need]:
    if not r.topics:  # every topic: seeing the whole cluster
        return [Need(ResourceType.CLUSTER, CLUSTER_RESOURCE, Operation.DESCRIBE)]
    return [Need(ResourceType.TOPIC, t, Operation.DESCRIBE) for t in sorted(set(r.topics))]


def _commit(r: Any) -> list[Need]:
    # No member and generation -1: an operator's offset reset (dmq groups reset-offsets), which
    # rewinds a whole group: delete on the group, as Kafka's DeleteGroupOffsets/alter offsets.
    op = Operation.DELETE if not r.member_id else Operation.READ
    needs = [Need(ResourceType.GROUP, r.group_id, op)]
    needs += [Need(ResourceType.TOPIC, t, Operation.READ) for t in sorted({o.topic for o in r.offsets})]
    return needs


def _find_group(r: Any) -> list[Need]:
    try:
        group = group_id_for(r.topic, r.app_id)
    except ValueError:  # the handler refuses the bad name with INVALID_ARGUMENT, naming the field
        group = f"G_{r.topic}_{r.app_id}"
    return [Need(ResourceType.GROUP, group, Operation.READ), Need(ResourceType.TOPIC, r.topic, Operation.DESCRIBE)]


def _topic_and_group(group_op: Operation, group_field: str = "group") -> Needs:
    """Queue pops and event-store claims: read on the topic and `group_op` on the group (Kafka's
    share groups need READ on both)."""
    return lambda r: [
        Need(ResourceType.TOPIC, r.topic, Operation.READ),
        Need(ResourceType.GROUP, getattr(r, group_field), group_op),
    ]


def _queue_describe(r: Any) -> list[Need]:
    if not r.topic:  # every topic's queues: seeing the whole cluster
        return [Need(ResourceType.CLUSTER, CLUSTER_RESOURCE, Operation.DESCRIBE)]
    needs = [Need(ResourceType.TOPIC, r.topic, Operation.DESCRIBE)]
    if r.group:
        needs.append(Need(ResourceType.GROUP, r.group, Operation.DESCRIBE))
    return needs


def _logs(r: Any) -> list[Need]:
    if not r.partitions:
        return [Need(ResourceType.CLUSTER, CLUSTER_RESOURCE, Operation.DESCRIBE)]
    return _each_topic(Operation.DESCRIBE, lambda q: q.partitions)(r)


_B = "/dmq.v1.Broker/"
_M = "/dmq.v1.Metadata/"
_G = "/dmq.v1.GroupCoordinator/"
_C = "/dmq.v1.CoordinatorStatus/"
_H = "/grpc.health.v1.Health/"
_INTERNAL = RpcRule(Access.CLUSTER)

RULES: dict[str, RpcRule] = {
    # -- Broker ------------------------------------------------------------------------------------
    _B + "Produce": RpcRule(Access.ACL, _topic(Operation.WRITE), quota="produce"),
    # a Fetch with replica_id is a follower broker replicating (reads past the high watermark,
    # moves the in-sync set): the cluster only
    _B + "Fetch": RpcRule(Access.ACL, _each_topic(Operation.READ, lambda r: r.partitions), quota="fetch",
                          stricter=lambda r: _INTERNAL if r.HasField("replica_id") else None),
    _B + "ListOffsets": RpcRule(Access.ACL, _each_topic(Operation.DESCRIBE, lambda r: r.queries)),
    _B + "CommitOffsets": RpcRule(Access.ACL, _commit, admin=lambda r: not r.member_id),
    _B + "FetchCommittedOffsets": RpcRule(Access.ACL, _group(Operation.DESCRIBE)),
    _B + "DescribeLogs": RpcRule(Access.ACL, _logs),
    _B + "CreatePartitions": _INTERNAL,
    _B + "DeletePartitions": _INTERNAL,
    _B + "DeleteGroupOffsets": _INTERNAL,
    # replication (the controller's pushes and a follower's epoch questions): the cluster only
    _B + "UpdatePartitionStates": _INTERNAL,
    _B + "OffsetForLeaderEpoch": _INTERNAL,
    # queue mode: a pop takes a lease (read on the topic and the group). A request that finishes
    # or renews a lease names only its id, so the broker's handler checks the lease's own topic
    # and group (dmq.broker.queue.service): read on both, as a pop (an ack riding on a pop too);
    # a reject also write on the dead-letter topic it writes to. A lease id is shown by
    # QueueDescribe only to those who may read the group and the topic.
    _B + "QueuePop": RpcRule(Access.ACL, _topic_and_group(Operation.READ)),
    _B + "QueueAck": RpcRule(Access.HANDLER),
    _B + "QueueNack": RpcRule(Access.HANDLER),
    _B + "QueueReject": RpcRule(Access.HANDLER),
    _B + "QueueRenew": RpcRule(Access.HANDLER),
    _B + "QueueDescribe": RpcRule(Access.ACL, _queue_describe),
    # a trace search answers records of every topic: read on the cluster (granted explicitly)
    _B + "FindTrace": RpcRule(Access.ACL, _cluster(Operation.READ)),
    # event store: appends write, reads and subscriptions read; its groups as queue groups, and
    # stopping / starting / resetting a group (forgetting its progress) is an admin change
    _B + "EventAppend": RpcRule(Access.ACL, _topic(Operation.WRITE), quota="produce"),
    # the same appends on one stream: each request admitted as an EventAppend (interceptor.py)
    _B + "EventAppendStream": RpcRule(Access.ACL, _topic(Operation.WRITE), quota="produce"),
    _B + "EventRead": RpcRule(Access.ACL, _topic(Operation.READ)),
    _B + "EventSubscribe": RpcRule(Access.ACL, _topic(Operation.READ)),
    _B + "EventGroupControl": RpcRule(Access.ACL, _topic_and_group(Operation.ALTER), admin=True),
    _B + "EventClaimNext": RpcRule(Access.ACL, _topic_and_group(Operation.READ)),
    _B + "EventAck": RpcRule(Access.ACL, _topic_and_group(Operation.READ)),
    _B + "EventRelease": RpcRule(Access.ACL, _topic_and_group(Operation.READ)),
    _B + "EventRenewClaim": RpcRule(Access.ACL, _topic_and_group(Operation.READ)),
    _B + "EventGroupDescribe": RpcRule(Access.ACL, _topic_and_group(Operation.DESCRIBE)),
    # the store's types, tags and every group's progress, as QueueDescribe answers a topic's groups
    _B + "EventStoreDescribe": RpcRule(Access.ACL, _topic(Operation.DESCRIBE)),
    # -- Metadata ----------------------------------------------------------------------------------
    _M + "RegisterBroker": _INTERNAL,
    _M + "BrokerHeartbeat": _INTERNAL,
    _M + "ListBrokers": RpcRule(Access.ACL, _cluster(Operation.DESCRIBE)),
    _M + "CreateTopic": RpcRule(Access.ACL, _topic(Operation.CREATE, "name"), admin=True),
    _M + "DeleteTopic": RpcRule(Access.ACL, _topic(Operation.DELETE, "name"), admin=True),
    _M + "ListTopics": RpcRule(Access.ACL, _cluster(Operation.DESCRIBE)),
    _M + "DescribeTopic": RpcRule(Access.ACL, _topic(Operation.DESCRIBE, "name")),
    _M + "AddPartitions": RpcRule(Access.ACL, _topic(Operation.ALTER, "name"), admin=True),
    _M + "GetMetadata": RpcRule(Access.ACL, _metadata),
    _M + "AlterIsr": _INTERNAL,
    # moving replicas between brokers is a cluster change (Kafka: ALTER on the cluster)
    _M + "ReassignPartition": RpcRule(Access.ACL, _cluster(Operation.ALTER), admin=True),
    _M + "AddAcls": RpcRule(Access.ACL, _cluster(Operation.ALTER), admin=True),
    _M + "RemoveAcls": RpcRule(Access.ACL, _cluster(Operation.ALTER), admin=True),
    _M + "ListAcls": RpcRule(Access.ACL, _cluster(Operation.DESCRIBE)),
    # -- CoordinatorStatus (`dmq coordinators list`): describing the cluster, as listing brokers --
    _C + "DescribeCoordinator": RpcRule(Access.ACL, _cluster(Operation.DESCRIBE)),
    # -- GroupCoordinator --------------------------------------------------------------------------
    _G + "FindOrCreateGroup": RpcRule(Access.ACL, _find_group),
    _G + "JoinGroup": RpcRule(Access.ACL, _group(Operation.READ)),
    _G + "GetAssignment": RpcRule(Access.ACL, _group(Operation.READ)),
    _G + "Heartbeat": RpcRule(Access.ACL, _group(Operation.READ)),
    _G + "WatchGroup": RpcRule(Access.ACL, _group(Operation.READ)),
    _G + "LeaveGroup": RpcRule(Access.ACL, _group(Operation.READ)),
    _G + "ListGroups": RpcRule(Access.ACL, _cluster(Operation.DESCRIBE)),
    _G + "DescribeGroup": RpcRule(Access.ACL, _group(Operation.DESCRIBE)),
    _G + "DeleteGroup": RpcRule(Access.ACL, _group(Operation.DELETE), admin=True),
    _G + "CheckOwnership": _INTERNAL,
    # -- grpc.health.v1 (probes and `dmq health`) -----------------------------------------------
    _H + "Check": RpcRule(Access.AUTHENTICATED),
    _H + "Watch": RpcRule(Access.AUTHENTICATED),
    _H + "List": RpcRule(Access.AUTHENTICATED),
}


def rule_for(method: str) -> RpcRule | None:
    """The rule of a full method name ("/dmq.v1.Broker/Produce"); None = not in the table."""
    return RULES.get(method)
