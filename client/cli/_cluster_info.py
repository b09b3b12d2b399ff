"""Shared look-ups for the admin commands: topics with their logs, offsets, validation."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dmq.client.cli._session import CLIError, Session


def check_topic_name(name: str) -> None:
    from dmq.coordinator.validation import ValidationError, validate_topic_name

    try:
        validate_topic_name(name)
    except ValidationError as e:
        raise CLIError(f"invalid topic name: {str(e).removeprefix('name: ')}") from None


def describe_topic(sess: Session, name: str) -> Any:
    from dmq.proto import dmq_pb2 as pb

    check_topic_name(name)
    return sess.metadata("DescribeTopic", pb.DescribeTopicRequest(name=name))


@dataclass
class LogView:
    log_start_offset: int | None = None
    log_end_offset: int | None = None
    size_bytes: int | None = None
    segment_count: int | None = None
    error: str | None = None
    status: str | None = None  # "ok" | "corrupt" (None: unknown, e.g. an older broker)
    status_detail: str | None = None


def describe_logs(sess: Session, topics: Iterable[Any]) -> tuple[dict[tuple[str, int], LogView], list[str]]:
    """Log offsets and sizes for every partition of `topics` (TopicInfo), one DescribeLogs per broker.

    A broker that cannot be reached does not fail the command: its partitions show '-' and a
    warning names it.
    """
    from dmq.proto import dmq_pb2 as pb

    by_broker: dict[tuple[str, int], list[Any]] = defaultdict(list)
    views: dict[tuple[str, int], LogView] = {}
    for t in topics:
        for p in t.partitions:
            views[(t.name, p.partition)] = LogView()
            if p.leader_address:
                by_broker[(p.leader_address, p.leader_id)].append(pb.TopicPartition(topic=t.name, partition=p.partition))
    warnings: list[str] = []
    for (address, broker_id), parts in sorted(by_broker.items()):
        try:
            answer = sess.broker(address, "DescribeLogs", pb.DescribeLogsRequest(partitions=parts), broker_id=broker_id)
        except CLIError as e:
            warnings.append(e.message)
            for tp in parts:
                views[(tp.topic, tp.partition)].error = "broker unreachable"
            continue
        for info in answer.logs:
            key = (info.topic, info.partition)
            if key not in views:
                continue
            if info.error != pb.NONE:
                views[key].error = pb.ErrorCode.Name(info.error).lower()
                continue
            views[key] = LogView(
                info.log_start_offset, info.log_end_offset, info.size_bytes, info.segment_count,
                status=info.status or None, status_detail=info.status_detail or None,
            )
    return views, warnings


def list_offsets(sess: Session, topic_info: Any, partitions: Iterable[int], timestamp_ms: int) -> dict[int, Any]:
    """ListOffsets for some partitions of one topic, grouped by leader: partition -> OffsetAnswer."""
    from dmq.proto import dmq_pb2 as pb

    leaders = {p.partition: p for p in topic_info.partitions}
    by_broker: dict[tuple[str, int], list[Any]] = defaultdict(list)
    for part in partitions:
        p = leaders[part]
        if not p.leader_address:
            raise CLIError(f"partition {topic_info.name}[{part}] has no leader; is its broker registered? (dmq brokers list)")
        by_broker[(p.leader_address, p.leader_id)].append(
            pb.OffsetQuery(topic=topic_info.name, partition=part, timestamp_ms=timestamp_ms)
        )
    out: dict[int, Any] = {}
    for (address, broker_id), queries in sorted(by_broker.items()):
        answer = sess.broker(address, "ListOffsets", pb.ListOffsetsRequest(queries=queries), broker_id=broker_id)
        for a in answer.answers:
            if a.error != pb.NONE:
                raise CLIError(
                    f"{a.topic}[{a.partition}]: {a.error_message or pb.ErrorCode.Name(a.error).lower()} "
                    f"(broker {broker_id} at {address})"
                )
            out[a.partition] = a
    return out


def config_dict(config: Any) -> dict[str, int | None]:
    from dmq.client.cli._parse import CONFIG_KEYS

    return {k: (getattr(config, k) if config.HasField(k) else None) for k in CONFIG_KEYS}
