"""AdminClient: topics, brokers, offsets, log sizes and consumer groups.

Layers (as in nats.py): gRPC messages -> this thin synchronous client -> small frozen
dataclasses built with ``from_response()``. Requests are checked with the coordinator's own rules
(`dmq.proto.topic_settings`) before they are sent, so a bad name fails fast with the same
message the server would give; every gRPC error is translated into a `dmq.client.errors` class.

This is the one place that talks admin to the servers: the `dmq` CLI and the Spark source use
it rather than stubs of their own. Calls to the coordinator are retried while it answers
UNAVAILABLE itself ("starting", "no live brokers": right after `dmq server` starts) until
request_timeout_ms; nothing listening at the address fails at once, since waiting would only
delay the message. Multi-partition calls to brokers (ListOffsets, DescribeLogs, CommitOffsets)
are grouped by leader: one call per broker, sent together.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from dmq.client._acl_admin import AclAdminMixin
from dmq.client._calls import call_coordinator, fan_out_by_leader
from dmq.client._closing import ClosedOnExit
from dmq.client._cluster import Cluster
from dmq.client._coordinator_status import CoordinatorDescription, describe_coordinators
from dmq.client._groups import (
    RESET_TARGETS,
    GroupDescription,
    GroupMember,
    GroupSubscription,
    GroupSummary,
    OffsetReset,
    PartitionLag,
    ResetTarget,
    check_group_id,
    check_reset,
    plan_reset,
)
from dmq.client._log import get_logger
from dmq.client._security import pop_security
from dmq.client._settings import bootstrap_address, check_positive, reject_unknown
from dmq.client._trace import TraceMixin
from dmq.client.errors import (
    CommitFailedError,
    CoordinatorUnavailableError,
    DMQError,
    DMQTimeoutError,
    GroupNotEmptyError,
    GroupNotFoundError,
    InvalidArgumentError,
    TopicAlreadyExistsError,
    TopicNotFoundError,
    UnknownPartitionError,
    from_partition_error,
    from_rpc_error,
    is_connect_failure,
)
from dmq.client.events import STORE_DESCRIBE_LIMIT_DEFAULT, EventStore, StoreDescription
from dmq.client.queue_admin import QueueAdminMixin
from dmq.proto import dmq_pb2 as pb
from dmq.proto import limits
from dmq.proto.offset_markers import EARLIEST, LATEST
from dmq.proto.topic_settings import (
    TopicSettings,
    ValidationError,
)
from dmq.proto.topic_settings import (
    # explicit re-exports: dmq.client.aio.admin imports these two from here
    validate_partition_count as validate_partition_count,
)
from dmq.proto.topic_settings import (
    validate_topic_name as validate_topic_name,
)
from dmq.proto.values import parse_setting
from dmq.proto.wire import BROKER_SERVICE

log = get_logger(__name__)

__all__ = [
    "AdminClient",
    "TopicDescription",
    "PartitionDescription",
    "BrokerDescription",
    "CoordinatorDescription",
    "OffsetInfo",
    "LogDescription",
    "GroupSummary",
    "GroupMember",
    "GroupSubscription",
    "GroupDescription",
    "PartitionLag",
    "OffsetReset",
    "ServerHealth",
    "RESET_TARGETS",
    "plan_reset",
    "check_topic_name",
    "EARLIEST",
    "LATEST",
]

TopicPartition = tuple[str, int]

_CONFIG_FIELDS = (*limits.TOPIC_CONFIG_RANGES, "unclean_leader_election")

_METADATA_ERRORS = {
    grpc.StatusCode.NOT_FOUND: TopicNotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: TopicAlreadyExistsError,
    grpc.StatusCode.UNAVAILABLE: CoordinatorUnavailableError,
}
_GROUP_ERRORS = {
    grpc.StatusCode.NOT_FOUND: GroupNotFoundError,
    grpc.StatusCode.UNAVAILABLE: CoordinatorUnavailableError,
}
# DeleteGroup and an operator's commit refuse a group with members with FAILED_PRECONDITION.
_NOT_EMPTY_ERRORS = {**_GROUP_ERRORS, grpc.StatusCode.FAILED_PRECONDITION: GroupNotEmptyError}


@dataclass(frozen=True, slots=True)
class PartitionDescription:
    partition: int
    leader_id: int  # -1: no leader (offline)
    leader_address: str
    leader_alive: bool
    replicas: tuple[int, ...] = ()  # broker ids; the first is the preferred leader
    isr: tuple[int, ...] = ()  # the in-sync replicas
    leader_epoch: int = 0

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)

    @classmethod
    def from_response(cls, p: pb.PartitionInfo) -> PartitionDescription:
        return cls(p.partition, p.leader_id, p.leader_address, p.leader_alive, tuple(p.replicas), tuple(p.isr),
                   p.leader_epoch)


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    partition_count: int
    partitions: tuple[PartitionDescription, ...]
    config: dict[str, int] = field(default_factory=dict)  # only the settings that are set
    created_ms: int = 0
    kind: str = "log"  # or "event-store" (dmq.proto.event_headers)

    @classmethod
    def from_response(cls, info: pb.TopicInfo) -> TopicDescription:
        config = {name: getattr(info.config, name) for name in _CONFIG_FIELDS if info.config.HasField(name)}
        parts = tuple(sorted((PartitionDescription.from_response(p) for p in info.partitions), key=_by_partition))
        kind = info.config.kind if info.config.HasField("kind") else "log"
        return cls(info.name, info.partition_count, parts, config, info.created_ms, kind)


@dataclass(frozen=True, slots=True)
class BrokerDescription:
    broker_id: int
    host: str
    port: int
    alive: bool
    last_heartbeat_ms: int
    partitions_led: int
    rack: str = ""
    partitions_followed: int = 0
    partitions_under_replicated: int = 0  # led by it with fewer in-sync replicas than replicas

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @classmethod
    def from_response(cls, b: pb.BrokerInfo) -> BrokerDescription:
        return cls(b.broker_id, b.host, b.port, b.alive, b.last_heartbeat_ms, b.partitions_led, b.rack,
                   b.partitions_followed, b.partitions_under_replicated)


@dataclass(frozen=True, slots=True)
class OffsetInfo:
    """The answer to list_offsets: ``offset`` is what the query asked for."""

    topic: str
    partition: int
    offset: int
    log_start_offset: int
    log_end_offset: int

    @classmethod
    def from_response(cls, a: pb.OffsetAnswer) -> OffsetInfo:
        return cls(a.topic, a.partition, a.offset, a.log_start_offset, a.log_end_offset)


@dataclass(frozen=True, slots=True)
class LogDescription:
    """One partition log as its leader sees it. When ``error`` is set (the broker's error code in
    lower case, "no leader", or "broker unreachable") the figures are -1: unknown."""

    topic: str
    partition: int
    broker_address: str
    log_start_offset: int
    log_end_offset: int
    size_bytes: int
    segment_count: int
    error: str | None = None
    status: str | None = None  # "ok" | "corrupt": appends refused, the damage never served
    status_detail: str | None = None
    # Only from describe_logs(verify=True): batches whose CRC was read, damage found, indexes rebuilt.
    batches_checked: int | None = None
    problems: tuple[str, ...] = ()
    indexes_rebuilt: tuple[str, ...] = ()

    @classmethod
    def from_response(cls, info: pb.LogInfo, broker_address: str, *, verify: bool = False) -> LogDescription:
        if info.error != pb.NONE:
            return cls.unknown(info.topic, info.partition, broker_address, pb.ErrorCode.Name(info.error).lower(),
                               status_detail=info.status_detail or None)
        return cls(
            info.topic,
            info.partition,
            broker_address,
            info.log_start_offset,
            info.log_end_offset,
            info.size_bytes,
            info.segment_count,
            status=info.status or None,
            status_detail=info.status_detail or None,
            batches_checked=info.batches_checked if verify else None,
            problems=tuple(info.problems),
            indexes_rebuilt=tuple(info.indexes_rebuilt),
        )

    @classmethod
    def unknown(cls, topic: str, partition: int, broker_address: str, error: str, *,
                status_detail: str | None = None) -> LogDescription:
        return cls(topic, partition, broker_address, -1, -1, -1, -1, error=error, status_detail=status_detail)


@dataclass(frozen=True, slots=True)
class ServerHealth:
    """One server's answer to check_health()."""

    component: str  # "coordinator" | "broker" | "etcd" (the coordinators' metadata store, when on etcd)
    broker_id: int | None  # None but for a broker
    address: str
    up: bool
    detail: str  # SERVING, or why it counts as down

    @property
    def name(self) -> str:
        return self.component if self.broker_id is None else f"broker {self.broker_id}"


def _by_partition(p: PartitionDescription) -> int:
    return p.partition


def topic_config(config: Mapping[str, int | str] | None) -> pb.TopicConfig:
    """A TopicConfig from a dict; Kafka spellings ("retention.ms") are accepted too, and values
    as text in the CLI's grammar ("1s", "64MiB": dmq.proto.values)."""
    if not config:
        return pb.TopicConfig()
    normalised: dict[str, object] = {str(k).replace(".", "_"): v for k, v in config.items()}
    for name, value in normalised.items():
        try:
            normalised[name] = parse_setting(name, value)
        except ValueError as e:
            raise InvalidArgumentError(f"config.{name}: {e}") from e
    try:
        settings = TopicSettings.from_dict(normalised)
        settings.validate()
    except (ValidationError, TypeError) as e:
        raise InvalidArgumentError(str(e)) from e
    return pb.TopicConfig(**settings.to_dict())


def _check(fn: Callable[..., None], *args: Any) -> None:
    try:
        fn(*args)
    except ValidationError as e:
        raise InvalidArgumentError(str(e)) from e


def check_topic_name(name: str) -> None:
    """InvalidArgumentError unless `name` follows the coordinator's topic name rules."""
    try:
        validate_topic_name(name)
    except ValidationError as e:
        raise InvalidArgumentError(f"invalid topic name: {str(e).removeprefix('name: ')}") from e


class AdminClient(QueueAdminMixin, TraceMixin, AclAdminMixin, ClosedOnExit):
    """Topic and cluster administration. Synchronous, thread-safe; close() (or `with`) when done.

    Queue operations (describe_queue, list_queues) come from dmq.client.queue_admin, find_trace
    from dmq.client._trace, add_acls / remove_acls / list_acls from dmq.client._acl_admin."""

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str] | None = None,
        *,
        request_timeout_ms: int = 30_000,
        cluster: Cluster | None = None,
        bootstrap: str | Sequence[str] | None = None,
        **unknown: Any,
    ) -> None:
        """``bootstrap_servers``: the coordinator's "host:port" (a string, "h:p,h:p" or a list;
        ``bootstrap`` is the original name)."""
        security = pop_security(unknown)  # ssl_cafile, token, ... (dmq.client._security)
        reject_unknown("AdminClient", unknown, _SETTINGS)
        check_positive("request_timeout_ms", request_timeout_ms)
        self._own_cluster = cluster is None
        self._cluster = cluster or Cluster(
            bootstrap_address({"bootstrap_servers": bootstrap_servers, "bootstrap": bootstrap}, "AdminClient"),
            request_timeout_ms=request_timeout_ms, security=security,
        )

    def __repr__(self) -> str:
        return f"<AdminClient bootstrap={self._cluster.bootstrap!r}>"

    @property
    def cluster(self) -> Cluster:
        return self._cluster

    def _metadata_call(self, method: str, request: Any, what: str) -> Any:
        return self._coordinator_call(self._cluster.metadata_stub(), method, request, what, _METADATA_ERRORS)

    def _group_call(self, method: str, request: Any, what: str,
                    overrides: Mapping[grpc.StatusCode, type[DMQError]] = _GROUP_ERRORS) -> Any:
        return self._coordinator_call(self._cluster.group_stub(), method, request, what, overrides)

    def _coordinator_call(
        self, stub: Any, method: str, request: Any, what: str, overrides: Mapping[grpc.StatusCode, type[DMQError]]
    ) -> Any:
        """One request to the coordinator, asked again while it answers UNAVAILABLE itself, until
        request_timeout_ms; a refused connection fails at once (see the module docstring)."""
        return call_coordinator(stub, method, request, policy=self._cluster.retry,
                                context=f"{what} (coordinator at {self._cluster.bootstrap})", overrides=overrides)

    # -- topics -------------------------------------------------------------------------------------

    def create_topic(
        self, name: str, partitions: int = 1, config: Mapping[str, int | str] | None = None, *, kind: str = "log"
    ) -> TopicDescription:
        """Create a topic; raises TopicAlreadyExistsError if it exists.

        ``config`` keys: the names of dmq.proto.limits.TOPIC_CONFIG_RANGES (retention_ms,
        retention_bytes, segment_bytes, segment_ms, max_message_bytes, dedup_window_ms, the queue
        settings, replication_factor, min_insync_replicas) and unclean_leader_election (bool); values
        are ints or text with units as the CLI takes them ("7d", "64MiB"). ``kind``: "log" or "event-store" (one partition of typed, tagged events).
        """
        check_topic_name(name)
        _check(validate_partition_count, partitions)
        request = pb.CreateTopicRequest(name=name, partitions=partitions, config=topic_config(config))
        if kind != "log":
            request.config.kind = kind  # the coordinator checks it (one partition, no retention)
        info = self._metadata_call("CreateTopic", request, f"create topic {name!r}")
        self._cluster.invalidate(name)
        log.info("topic created", topic=name, partitions=partitions)
        return TopicDescription.from_response(info)

    def delete_topic(self, name: str) -> None:
        check_topic_name(name)
        self._metadata_call("DeleteTopic", pb.DeleteTopicRequest(name=name), f"delete topic {name!r}")
        self._cluster.invalidate(name)
        log.info("topic deleted", topic=name)

    def list_topics(self) -> list[TopicDescription]:
        response = self._metadata_call("ListTopics", pb.ListTopicsRequest(), "list topics")
        return sorted((TopicDescription.from_response(t) for t in response.topics), key=lambda t: t.name)

    def describe_topic(self, name: str) -> TopicDescription:
        check_topic_name(name)
        info = self._metadata_call("DescribeTopic", pb.DescribeTopicRequest(name=name), f"describe topic {name!r}")
        return TopicDescription.from_response(info)

    def describe_event_store(self, name: str, limit: int = STORE_DESCRIBE_LIMIT_DEFAULT) -> StoreDescription:
        """An event store's types and tags with their event counts and its consumer groups with
        their claims and progress (`EventStore.describe`; each list at most `limit` long)."""
        store = EventStore(topic=name, cluster=self._cluster)
        try:
            return store.describe(limit)
        finally:
            store.close()

    def add_partitions(self, name: str, total: int) -> TopicDescription:
        """Grow `name` to `total` partitions (the new total, not the number to add)."""
        check_topic_name(name)
        _check(validate_partition_count, total)
        request = pb.AddPartitionsRequest(name=name, partitions=total)
        info = self._metadata_call("AddPartitions", request, f"add partitions to {name!r}")
        self._cluster.invalidate(name)
        log.info("partitions added", topic=name, partitions=total)
        return TopicDescription.from_response(info)

    def list_brokers(self) -> list[BrokerDescription]:
        response = self._metadata_call("ListBrokers", pb.ListBrokersRequest(), "list brokers")
        return sorted((BrokerDescription.from_response(b) for b in response.brokers), key=lambda b: b.broker_id)

    def describe_coordinators(self) -> list[CoordinatorDescription]:
        """Each coordinator address of bootstrap_servers, asked directly: active, standby or
        unreachable, with the controller epoch it claimed (see dmq.client._coordinator_status)."""
        channels = [(a, self._cluster.channel(a)) for a in self._cluster.coordinator_addresses()]
        return describe_coordinators(channels, self._cluster.timeout_s)

    def reassign_partition(
        self, topic: str, partition: int, replicas: Sequence[int], *, wait_s: float | None = None
    ) -> PartitionDescription:
        """Move a partition's replicas to `replicas` (broker ids, the first the preferred leader). The
        new replicas catch up before the old ones are dropped; with `wait_s`, wait up to that long
        for it to complete (DMQTimeoutError naming the state reached when it does not), else return
        at once. The partition as described when it returns."""
        check_topic_name(topic)
        _check(limits.check_partition_number, partition)
        target = tuple(replicas)
        request = pb.ReassignPartitionRequest(topic=topic, partition=partition, replicas=target)
        self._metadata_call("ReassignPartition", request, f"reassign {topic!r} partition {partition}")
        log.info("reassignment started", topic=topic, partition=partition, replicas=list(target))
        current = self._partition(topic, partition)
        if wait_s is None:
            return current
        deadline = time.monotonic() + wait_s
        while current.replicas != target:
            if time.monotonic() >= deadline:
                raise DMQTimeoutError(
                    f"reassigning {topic!r} partition {partition} to {list(target)} did not complete within "
                    f"{wait_s:g} s (replicas {list(current.replicas)}, in sync {list(current.isr)}): the new "
                    "replicas are still catching up; it continues on the coordinator"
                )
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            current = self._partition(topic, partition)
        self._cluster.invalidate(topic)
        return current

    def _partition(self, topic: str, partition: int) -> PartitionDescription:
        info = self.describe_topic(topic)
        found = next((p for p in info.partitions if p.partition == partition), None)
        if found is None:
            raise UnknownPartitionError(f"topic {topic!r} has {info.partition_count} partitions, not {partition}")
        return found

    # -- offsets and logs (asked of the brokers) ----------------------------------------------------

    def list_offsets(self, topic: str, partition: int, timestamp: int | str = LATEST) -> OffsetInfo:
        """The offset for `timestamp`: "earliest" (-2), "latest" (-1), or ms since the epoch (the
        first offset whose broker append time is >= it; the log end when there is none)."""
        return self.list_partition_offsets({(topic, partition): timestamp})[(topic, partition)]

    def list_partition_offsets(self, queries: Mapping[TopicPartition, int | str]) -> dict[TopicPartition, OffsetInfo]:
        """ListOffsets for many partitions at once: (topic, partition) -> timestamp as for
        list_offsets(). One call per leading broker, sent together; partitions whose leader moved
        or whose broker is unavailable are asked again (fresh metadata) until request_timeout_ms."""
        pending = {(str(t), int(p)): _timestamp(ts) for (t, p), ts in queries.items()}
        cluster = self._cluster

        def route(keys: list[TopicPartition], timeout_s: float) -> tuple[dict[str, list[TopicPartition]],
                                                                          dict[TopicPartition, DMQError]]:
            by_leader: dict[str, list[TopicPartition]] = {}
            errors: dict[TopicPartition, DMQError] = {}
            for key in sorted(keys):
                try:
                    by_leader.setdefault(cluster.leader_for(*key), []).append(key)
                except DMQError as e:
                    errors[key] = e
            return by_leader, errors

        def send(address: str, keys: list[TopicPartition], timeout_s: float) -> grpc.Future[pb.ListOffsetsResponse]:
            qs = [pb.OffsetQuery(topic=t, partition=p, timestamp_ms=pending[(t, p)]) for t, p in keys]
            request = pb.ListOffsetsRequest(queries=qs)
            stub = cluster.broker_stub(address)
            future: grpc.Future[pb.ListOffsetsResponse] = stub.ListOffsets.future(request, timeout=timeout_s)
            return future

        def parse(response: pb.ListOffsetsResponse, address: str) -> dict[TopicPartition, OffsetInfo | DMQError]:
            return {
                (a.topic, a.partition): OffsetInfo.from_response(a) if a.error == pb.NONE
                else from_partition_error(a.error, a.error_message, a.topic, a.partition)
                for a in response.answers
            }

        def error(e: grpc.RpcError, address: str, keys: list[TopicPartition]) -> DMQError:
            return from_rpc_error(e, context=f"ListOffsets (broker at {address})")

        def retriable(e: DMQError, retry: int) -> bool:
            # A partition the broker does not know yet may just have been added: one more look.
            return e.retriable or (e.invalid_metadata and retry == 0)

        def on_retry(errors: Mapping[TopicPartition, DMQError]) -> None:
            for topic in {t for t, _ in errors}:
                cluster.invalidate(topic)

        got = fan_out_by_leader(pending, route=route, send=send, parse=parse, error=error, policy=cluster.retry,
                                deadline=cluster.retry.deadline(), what="ListOffsets", retriable=retriable,
                                on_retry=on_retry)
        if got.errors:
            # The first error that asking again could not cure, else the first.
            errs = list(got.errors.values())
            raise next((e for e in errs if not (e.retriable or e.invalid_metadata)), errs[0])
        return got.done

    def describe_logs(
        self,
        topic: str | Iterable[str | TopicDescription] | None = None,
        *,
        verify: bool = False,
        on_broker_error: Callable[[str, DMQError], None] | None = None,
    ) -> list[LogDescription]:
        """Size and offsets of each partition log of `topic` (a name, or several names or
        descriptions already at hand; None = every topic), one DescribeLogs per leading broker.

        ``verify`` makes each broker read every batch of the logs (CRCs, index agreement;
        inconsistent indexes are rebuilt): slow on large topics. A broker that fails raises,
        unless ``on_broker_error(address, error)`` is given: then its partitions come back with
        ``error="broker unreachable"`` and the others are still reported.
        """
        cluster = self._cluster
        if topic is None:
            topics = self.list_topics()
        else:
            given = [topic] if isinstance(topic, str) else list(topic)
            topics = [t if isinstance(t, TopicDescription) else self.describe_topic(t) for t in given]
        out: list[LogDescription] = []
        targets: dict[str, list[pb.TopicPartition]] = {}
        for t in topics:
            for p in t.partitions:
                if p.leader_address:
                    targets.setdefault(p.leader_address, []).append(pb.TopicPartition(topic=t.name, partition=p.partition))
                else:
                    out.append(LogDescription.unknown(t.name, p.partition, "", "no leader"))
        calls = [
            (address, parts, cluster.broker_stub(address).DescribeLogs.future(
                pb.DescribeLogsRequest(partitions=parts, verify=verify), timeout=cluster.timeout_s))
            for address, parts in sorted(targets.items())
        ]
        for address, parts, call in calls:
            try:
                response = call.result()
            except grpc.RpcError as e:
                err = from_rpc_error(e, context=f"DescribeLogs (broker at {address})")
                if on_broker_error is None:
                    raise err from e
                on_broker_error(address, err)
                out.extend(LogDescription.unknown(tp.topic, tp.partition, address, "broker unreachable") for tp in parts)
                continue
            asked = {(tp.topic, tp.partition) for tp in parts}
            out.extend(
                LogDescription.from_response(info, address, verify=verify)
                for info in response.logs if (info.topic, info.partition) in asked
            )
        return sorted(out, key=lambda d: (d.topic, d.partition))

    # -- consumer groups ---------------------------------------------------------------------------

    def list_groups(self) -> list[GroupSummary]:
        response = self._group_call("ListGroups", pb.ListGroupsRequest(), "list groups")
        return sorted((GroupSummary.from_response(g) for g in response.groups), key=lambda g: g.group_id)

    def describe_group(self, group_id: str) -> GroupDescription:
        """Members, assignment, and per partition the committed offset, log end and lag."""
        check_group_id(group_id)
        response = self._group_call(
            "DescribeGroup", pb.DescribeGroupRequest(group_id=group_id), f"describe group {group_id!r}"
        )
        return GroupDescription.from_response(response)

    def delete_group(self, group_id: str) -> None:
        """Delete an empty group with its committed offsets and subscription; GroupNotEmptyError
        while it has members, GroupNotFoundError when there is no such group."""
        check_group_id(group_id)
        self._group_call(
            "DeleteGroup", pb.DeleteGroupRequest(group_id=group_id), f"delete group {group_id!r}", _NOT_EMPTY_ERRORS
        )
        log.info("group deleted", group=group_id)

    def group_id_for(self, topic: str, app_id: str) -> str:
        """The group of application `app_id` on `topic` (G_<topic>_<app_id>), created when missing
        (with the coordinator's default subscription mode)."""
        check_topic_name(topic)
        response = self._group_call(
            "FindOrCreateGroup", pb.FindOrCreateGroupRequest(topic=topic, app_id=app_id),
            f"find group of {app_id!r} on {topic!r}",
        )
        return str(response.group_id)

    def commit_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int], *, metadata: str = ""
    ) -> None:
        """Commit next offsets for `group_id` as an operator (no member, generation -1), one
        CommitOffsets per leading broker. The coordinator accepts it only while the group has no
        members (GroupNotEmptyError otherwise), so a running consumer never has its position
        changed under it."""
        check_group_id(group_id)
        by_leader: dict[str, list[pb.PartitionOffset]] = {}
        for (topic, partition), offset in sorted(offsets.items()):
            by_leader.setdefault(self._cluster.leader_for(topic, partition), []).append(
                pb.PartitionOffset(topic=topic, partition=partition, offset=offset, metadata=metadata)
            )
        calls = [
            (address, self._cluster.broker_stub(address).CommitOffsets.future(
                pb.CommitOffsetsRequest(group_id=group_id, member_id="", generation=-1, offsets=entries),
                timeout=self._cluster.timeout_s))
            for address, entries in by_leader.items()
        ]
        for address, call in calls:
            try:
                call.result()
            except grpc.RpcError as e:
                err = from_rpc_error(e, context=f"commit offsets of group {group_id!r} (broker at {address})",
                                     overrides=_NOT_EMPTY_ERRORS)
                if isinstance(err, CommitFailedError):  # refused as "not owner": someone joined meanwhile
                    err = GroupNotEmptyError(str(err), code=err.code, details=err.details)
                raise err from e

    def reset_offsets(
        self,
        group_id: str,
        topic: str | None = None,
        *,
        to: ResetTarget | str,
        value: int | None = None,
        partitions: Iterable[int] | None = None,
        dry_run: bool = False,
    ) -> list[OffsetReset]:
        """Move the committed offsets of an empty group, or with ``dry_run`` only say where they
        would go. Returns the plan, one OffsetReset per partition.

        ``to``: "earliest" / "latest" (each partition's log start / end), "offset" (``value``),
        "timestamp" (the first offset appended at or after ``value`` ms since the epoch) or
        "shift" (each committed offset moved by ``value``; from the log start when none). New
        offsets are clamped to [log start, log end]. ``topic`` defaults to the group's (a group
        is one topic); ``partitions`` to all of them. Refused with GroupNotEmptyError while the
        group has members: stop its consumers first, so none overwrites the new offsets.
        """
        check_reset(to, value)
        group = self.describe_group(group_id)
        if topic is not None and topic != group.topic:
            raise InvalidArgumentError(f"group {group_id} reads topic {group.topic!r}, not {topic!r}")
        if group.members:
            clients = ", ".join(sorted({m.client_id or m.member_id for m in group.members}))
            raise GroupNotEmptyError(
                f"group {group_id} has {len(group.members)} active member(s) ({clients}); offsets can only be reset "
                "while it is empty: stop its consumers (or wait for their session timeout) and retry"
            )
        count = self.describe_topic(group.topic).partition_count
        selected = sorted(set(partitions)) if partitions is not None else list(range(count))
        unknown = [p for p in selected if not 0 <= p < count]
        if unknown:
            raise UnknownPartitionError(f"topic {group.topic!r} has partitions 0..{count - 1}; no partition {unknown[0]}")
        ends = self.list_partition_offsets({(group.topic, p): LATEST for p in selected})
        bounds = {p: (ends[(group.topic, p)].log_start_offset, ends[(group.topic, p)].log_end_offset) for p in selected}
        by_time = None
        if to == "timestamp":
            assert value is not None
            found = self.list_partition_offsets({(group.topic, p): value for p in selected})
            by_time = {p: found[(group.topic, p)].offset for p in selected}
        plan = plan_reset(group.topic, to, value, selected, group.committed(), bounds, by_time)
        if not dry_run:
            self.commit_group_offsets(group_id, {(group.topic, r.partition): r.new_offset for r in plan})
            log.info("group offsets reset", group=group_id, to=to, partitions=len(plan))
        return plan

    # -- health ------------------------------------------------------------------------------------

    def check_health(self, timeout_s: float = 5.0) -> list[ServerHealth]:
        """Ask the coordinator, then every broker it has registered (all at once), through the
        standard gRPC health service (grpc.health.v1). A broker counts as up only when it answers
        SERVING *and* the coordinator sees its heartbeats: one without the other is a broker
        clients cannot use. With several coordinators (bootstrap_servers "h1:p,h2:p"), each is
        reported (active, standby or unreachable) and the active one is asked for the brokers; when
        the coordinators keep their metadata on etcd, the etcd they use is reported as they last
        checked it (a read within a second), the active one's word first. Never raises for a
        server that is down: it is reported."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        cluster = self._cluster

        def ask(address: str, service: str) -> Any:
            stub = health_pb2_grpc.HealthStub(cluster.channel(address))
            return stub.Check.future(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)

        def verdict(future: Any) -> tuple[bool, str]:
            try:
                answer = future.result()
            except grpc.RpcError as e:
                return False, _health_failure(e, timeout_s)
            name = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
            return answer.status == health_pb2.HealthCheckResponse.SERVING, name

        addresses = cluster.coordinator_addresses()
        # In flight while the coordinators are described: a paused one costs one timeout, not two.
        checks = {a: ask(a, "") for a in addresses}
        try:
            described = describe_coordinators([(a, cluster.channel(a)) for a in addresses], timeout_s)
        except DMQError:  # not allowed to ask (or too old to answer): the health service still is
            described = []
        stores = sorted((d for d in described if d.metadata_store == "etcd"), key=lambda d: d.state != "active")
        store = ([ServerHealth("etcd", None, stores[0].metadata_store_address or "?", bool(stores[0].metadata_store_healthy),
                               f"{stores[0].metadata_store_detail} (as {stores[0].address} checked it)")]
                 if stores else [])
        coordinator = cluster.bootstrap
        others: list[ServerHealth] = []
        if len(addresses) > 1 and described:
            active = [d.address for d in described if d.state == "active"]
            if not active:
                return [ServerHealth("coordinator", None, d.address, False,
                                     d.error or f"{d.state}; no coordinator is active") for d in described] + store
            coordinator = active[0]
            others = [ServerHealth("coordinator", None, d.address, d.error is None,
                                   d.error or f"{d.state} (active: {coordinator})")
                      for d in described if d.address != coordinator]
        up, detail = verdict(checks[coordinator] if coordinator in checks else ask(coordinator, ""))
        if not up:
            return [ServerHealth("coordinator", None, coordinator, False, detail), *others, *store]
        try:
            listed = cluster.metadata_stub().ListBrokers(pb.ListBrokersRequest(), timeout=timeout_s)
        except grpc.RpcError as e:
            return [ServerHealth("coordinator", None, coordinator, False,
                                 f"cannot list brokers: {_health_failure(e, timeout_s)}"), *others, *store]
        if len(addresses) > 1 and described:
            detail += ", active"
        out = [ServerHealth("coordinator", None, coordinator, True, detail), *others, *store]
        brokers = sorted((BrokerDescription.from_response(b) for b in listed.brokers), key=lambda b: b.broker_id)
        futures = [ask(b.address, BROKER_SERVICE) for b in brokers]  # all in flight at once
        for b, future in zip(brokers, futures):
            up, detail = verdict(future)
            if up and not b.alive:
                up, detail = False, "SERVING, but the coordinator has had no heartbeat from it (session expired)"
            elif not up and b.alive:
                detail += "; the coordinator still counts it alive until its session expires"
            out.append(ServerHealth("broker", b.broker_id, b.address, up, detail))
        return out

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        if self._own_cluster:
            self._cluster.close()


def _health_failure(e: grpc.RpcError, timeout_s: float) -> str:
    code = e.code() if callable(getattr(e, "code", None)) else None
    details = (e.details() if callable(getattr(e, "details", None)) else "") or ""
    if code == grpc.StatusCode.UNAVAILABLE and is_connect_failure(details):
        return "unreachable (nothing answers at this address)"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"no answer within {timeout_s:g}s"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return "no health service (an older dmq?)"
    return f"{code.name if code is not None else 'error'}: {details}"


def _timestamp(timestamp: int | str) -> int:
    if isinstance(timestamp, str):
        named = {"earliest": EARLIEST, "latest": LATEST}
        if timestamp.lower() not in named:
            raise InvalidArgumentError(f"timestamp must be 'earliest', 'latest' or ms since the epoch, got {timestamp!r}")
        return named[timestamp.lower()]
    if isinstance(timestamp, bool) or not isinstance(timestamp, int) or timestamp < EARLIEST:
        raise InvalidArgumentError(
            f"timestamp must be -2 (earliest), -1 (latest) or ms since the epoch, got {timestamp!r}"
        )
    return timestamp


_SETTINGS = frozenset(
    name for name in inspect.signature(AdminClient.__init__).parameters if name not in ("self", "unknown")
)
