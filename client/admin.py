"""AdminClient: topics, brokers, offsets and log sizes.

Layers (as in nats.py): gRPC messages -> this thin synchronous client -> small frozen
dataclasses built with ``from_response()``. Requests are checked with the coordinator's own rules
(`dmq.coordinator.validation`) before they are sent, so a bad name fails fast with the same
message the server would give; every gRPC error is translated into a `dmq.client.errors` class.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc

from dmq.client._security import pop_security
from dmq.client._log import get_logger
from dmq.client._settings import bootstrap_address, check_positive, reject_unknown
from dmq.client._cluster import Cluster
from dmq.client.errors import (
    CoordinatorUnavailableError,
    InvalidArgumentError,
    TopicAlreadyExistsError,
    TopicNotFoundError,
    from_partition_error,
    from_rpc_error,
)
from dmq.coordinator.validation import (
    TopicSettings,
    ValidationError,
    validate_partition_count,
    validate_topic_name,
)
from dmq.proto import dmq_pb2 as pb
from dmq.proto.offset_markers import EARLIEST, LATEST

log = get_logger(__name__)

__all__ = [
    "AdminClient",
    "TopicDescription",
    "PartitionDescription",
    "BrokerDescription",
    "OffsetInfo",
    "LogDescription",
    "EARLIEST",
    "LATEST",
]

# ListOffsets timestamps with a special meaning (dmq.proto OffsetQuery).

_CONFIG_FIELDS = ("retention_ms", "retention_bytes", "segment_bytes", "segment_ms", "max_message_bytes")

_METADATA_ERRORS = {
    grpc.StatusCode.NOT_FOUND: TopicNotFoundError,
    grpc.StatusCode.ALREADY_EXISTS: TopicAlreadyExistsError,
    grpc.StatusCode.UNAVAILABLE: CoordinatorUnavailableError,
}

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PartitionDescription:
    partition: int
    leader_id: int
    leader_address: str
    leader_alive: bool

    @classmethod
    def from_response(cls, p: pb.PartitionInfo) -> PartitionDescription:
        return cls(p.partition, p.leader_id, p.leader_address, p.leader_alive)


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    partition_count: int
    partitions: tuple[PartitionDescription, ...]
    config: dict[str, int] = field(default_factory=dict)  # only the settings that are set
    created_ms: int = 0

    @classmethod
    def from_response(cls, info: pb.TopicInfo) -> TopicDescription:
        config = {name: getattr(info.config, name) for name in _CONFIG_FIELDS if info.config.HasField(name)}
        parts = tuple(sorted((PartitionDescription.from_response(p) for p in info.partitions), key=_by_partition))
        return cls(info.name, info.partition_count, parts, config, info.created_ms)


@dataclass(frozen=True, slots=True)
class BrokerDescription:
    broker_id: int
    host: str
    port: int
    alive: bool
    last_heartbeat_ms: int
    partitions_led: int

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @classmethod
    def from_response(cls, b: pb.BrokerInfo) -> BrokerDescription:
        return cls(b.broker_id, b.host, b.port, b.alive, b.last_heartbeat_ms, b.partitions_led)


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
    topic: str
    partition: int
    broker_address: str
    log_start_offset: int
    log_end_offset: int
    size_bytes: int
    segment_count: int

    @classmethod
    def from_response(cls, info: pb.LogInfo, broker_address: str) -> LogDescription:
        return cls(
            info.topic,
            info.partition,
            broker_address,
            info.log_start_offset,
            info.log_end_offset,
            info.size_bytes,
            info.segment_count,
        )


def _by_partition(p: PartitionDescription) -> int:
    return p.partition


def topic_config(config: Mapping[str, int] | None) -> pb.TopicConfig:
    """A TopicConfig from a dict; Kafka spellings ("retention.ms") are accepted too."""
    if not config:
        return pb.TopicConfig()
    normalised = {str(k).replace(".", "_"): v for k, v in config.items()}
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


class AdminClient:
    """Topic and cluster administration. Synchronous, thread-safe; close() (or `with`) when done."""

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
        stub = self._cluster.metadata_stub()
        try:
            return getattr(stub, method)(request, timeout=self._cluster.timeout_s)
        except grpc.RpcError as e:
            raise from_rpc_error(
                e, context=f"{what} (coordinator {self._cluster.bootstrap})", overrides=_METADATA_ERRORS
            ) from e

    # -- topics -------------------------------------------------------------------------------------

    def create_topic(
        self, name: str, partitions: int = 1, config: Mapping[str, int] | None = None
    ) -> TopicDescription:
        """Create a topic; raises TopicAlreadyExistsError if it exists.

        ``config`` keys: retention_ms, retention_bytes, segment_bytes, segment_ms, max_message_bytes.
        """
        _check(validate_topic_name, name)
        _check(validate_partition_count, partitions)
        request = pb.CreateTopicRequest(name=name, partitions=partitions, config=topic_config(config))
        info = self._metadata_call("CreateTopic", request, f"create topic {name!r}")
        self._cluster.invalidate(name)
        log.info("topic created", topic=name, partitions=partitions)
        return TopicDescription.from_response(info)

    def delete_topic(self, name: str) -> None:
        _check(validate_topic_name, name)
        self._metadata_call("DeleteTopic", pb.DeleteTopicRequest(name=name), f"delete topic {name!r}")
        self._cluster.invalidate(name)
        log.info("topic deleted", topic=name)

    def list_topics(self) -> list[TopicDescription]:
        response = self._metadata_call("ListTopics", pb.ListTopicsRequest(), "list topics")
        return sorted((TopicDescription.from_response(t) for t in response.topics), key=lambda t: t.name)

    def describe_topic(self, name: str) -> TopicDescription:
        _check(validate_topic_name, name)
        info = self._metadata_call("DescribeTopic", pb.DescribeTopicRequest(name=name), f"describe topic {name!r}")
        return TopicDescription.from_response(info)

    def add_partitions(self, name: str, total: int) -> TopicDescription:
        """Grow `name` to `total` partitions (the new total, not the number to add)."""
        _check(validate_topic_name, name)
        _check(validate_partition_count, total)
        request = pb.AddPartitionsRequest(name=name, partitions=total)
        info = self._metadata_call("AddPartitions", request, f"add partitions to {name!r}")
        self._cluster.invalidate(name)
        log.info("partitions added", topic=name, partitions=total)
        return TopicDescription.from_response(info)

    def list_brokers(self) -> list[BrokerDescription]:
        response = self._metadata_call("ListBrokers", pb.ListBrokersRequest(), "list brokers")
        return sorted((BrokerDescription.from_response(b) for b in response.brokers), key=lambda b: b.broker_id)

    # -- offsets and logs (asked of the brokers) ----------------------------------------------------

    def list_offsets(self, topic: str, partition: int, timestamp: int | str = LATEST) -> OffsetInfo:
        """The offset for `timestamp`: "earliest" (-2), "latest" (-1), or ms since the epoch (the
        first offset whose broker append time is >= it; the log end when there is none)."""
        ts = _timestamp(timestamp)
        query = pb.OffsetQuery(topic=topic, partition=partition, timestamp_ms=ts)
        answer = self._on_leader(
            topic,
            partition,
            lambda stub: stub.ListOffsets(pb.ListOffsetsRequest(queries=[query]), timeout=self._cluster.timeout_s),
            "ListOffsets",
        ).answers[0]
        if answer.error != pb.NONE:
            raise from_partition_error(answer.error, answer.error_message, topic, partition)
        return OffsetInfo.from_response(answer)

    def describe_logs(self, topic: str | None = None) -> list[LogDescription]:
        """Size and offsets of each partition log: of `topic`, or of every partition on every broker."""
        cluster = self._cluster
        targets: dict[str, list[pb.TopicPartition]] = {}
        if topic is None:
            for broker in cluster.brokers(refresh=True):
                if broker.alive:
                    targets[broker.address] = []
        else:
            cluster.invalidate(topic)
            meta = cluster.topic_metadata(topic)
            for p in meta.partitions:
                targets.setdefault(p.leader_address, []).append(pb.TopicPartition(topic=topic, partition=p.partition))
        out: list[LogDescription] = []
        for address, partitions in sorted(targets.items()):
            if not address:
                continue
            try:
                response = cluster.broker_stub(address).DescribeLogs(
                    pb.DescribeLogsRequest(partitions=partitions), timeout=cluster.timeout_s
                )
            except grpc.RpcError as e:
                raise from_rpc_error(e, context=f"DescribeLogs on broker {address}") from e
            out.extend(LogDescription.from_response(info, address) for info in response.logs if info.error == pb.NONE)
        return sorted(out, key=lambda d: (d.topic, d.partition))

    def _on_leader(self, topic: str, partition: int, call: Callable[[Any], T], what: str) -> T:
        """Call the partition's leader; on a stale leader, refresh metadata and try once more."""
        for attempt in (1, 2):
            address = self._cluster.leader_for(topic, partition)
            try:
                result = call(self._cluster.broker_stub(address))
            except grpc.RpcError as e:
                err = from_rpc_error(e, context=f"{what} for {topic}[{partition}] on broker {address}")
                if err.invalid_metadata and attempt == 1:
                    self._cluster.invalidate(topic)
                    continue
                raise err from e
            answers = getattr(result, "answers", None)
            if attempt == 1 and answers and answers[0].error == pb.NOT_LEADER:
                self._cluster.invalidate(topic)
                continue
            return result
        raise AssertionError("unreachable")

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        if self._own_cluster:
            self._cluster.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
