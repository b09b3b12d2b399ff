"""Operators' view of queue mode: `AdminClient.describe_queue()` and `AdminClient.list_queues()`.

A queue's state lives on the leaders of its partitions (DESIGN.md "Queue mode"), so a description
asks each leader of the topic (QueueDescribe) and adds up: the depth (records not acknowledged by
every queue group), the limit and the capacity left, how many partitions are leased now, every
live lease with its record count and seconds left, the leases about to expire, and the depth of the
dead-letter topic. Mixed into AdminClient (`QueueAdminMixin`), which provides `_cluster`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from dmq.client._cluster import Cluster
from dmq.client.errors import TopicNotFoundError
from dmq.client.queue import call_broker
from dmq.proto import dmq_pb2 as pb

__all__ = ["QueueAdminMixin", "QueueDescription", "QueueGroupState", "QueueLeaseInfo", "EXPIRING_SOON_S"]

DLQ_SUFFIX = ".dlq"  # dmq.broker.queue.dead_letters names them so; the client may not import the broker
# A lease with less than this left is listed as about to expire.
EXPIRING_SOON_S = 5.0


@dataclass(frozen=True, slots=True)
class QueueLeaseInfo:
    partition: int
    group: str
    lease_id: str  # "" unless the caller may read the group and the topic
    records: int
    seconds_left: float


@dataclass(frozen=True, slots=True)
class QueueGroupState:
    """One queue group on one partition."""

    group: str
    partition: int
    acked_offset: int
    pending: int
    delivery_count: int  # failed deliveries of the head record
    last_error: str
    lease: QueueLeaseInfo | None


@dataclass(frozen=True, slots=True)
class QueueDescription:
    topic: str
    partition_count: int
    depth: int  # records not acknowledged by every queue group
    max_queue_size: int  # 0 = unlimited
    remaining: int | None  # capacity left; None when unlimited
    partitions_leased: int
    groups: tuple[QueueGroupState, ...]
    dead_letters: int  # records in <topic>.dlq

    @property
    def utilisation(self) -> float:
        """Percent of the topic's partitions leased now."""
        return 100.0 * self.partitions_leased / self.partition_count if self.partition_count else 0.0

    @property
    def leases(self) -> tuple[QueueLeaseInfo, ...]:
        return tuple(g.lease for g in self.groups if g.lease is not None)

    @property
    def expiring_soon(self) -> tuple[QueueLeaseInfo, ...]:
        return tuple(x for x in self.leases if x.seconds_left < EXPIRING_SOON_S)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["utilisation_pct"] = round(self.utilisation, 1)
        out["leases"] = [asdict(x) for x in self.leases]
        out["expiring_soon"] = [asdict(x) for x in self.expiring_soon]
        out["dead_letter_topic"] = self.topic + DLQ_SUFFIX
        return out


def _group_state(row: pb.QueueGroupPartition, now_ms: int) -> QueueGroupState:
    lease = None
    # lease_id is empty for those who may not read the group (a worker's secret): still a lease
    if row.lease_id or row.lease_expiry_ms:
        lease = QueueLeaseInfo(
            row.partition, row.group, row.lease_id, row.lease_records, max(row.lease_expiry_ms - now_ms, 0) / 1000
        )
    return QueueGroupState(
        row.group, row.partition, row.acked_offset, row.pending, row.delivery_count, row.last_error, lease
    )


class QueueAdminMixin:
    _cluster: Cluster

    def _queue_call(self, address: str, method: str, request: Any, what: str) -> Any:
        return call_broker(self._cluster, address, method, request, what)

    def describe_queue(self, topic: str, group: str | None = None) -> QueueDescription:
        """The queue state of `topic` (one group's, or every group's), from its leaders."""
        md = self._cluster.topic_metadata(topic)
        leaders = sorted({p.leader_address for p in md.partitions if p.leader_address})
        answers = [
            self._queue_call(a, "QueueDescribe", pb.QueueDescribeRequest(topic=topic, group=group or ""), f"describe queue {topic!r}")
            for a in leaders
        ]
        return self._description(topic, md.partition_count, answers)

    def list_queues(self) -> list[QueueDescription]:
        """Every topic with queue groups or a max_queue_size, from every live broker."""
        answers: dict[str, list[pb.QueueDescribeResponse]] = {}
        for broker in self._cluster.brokers(refresh=True):
            if not broker.alive:
                continue
            answer = self._queue_call(broker.address, "QueueDescribe", pb.QueueDescribeRequest(), "list queues")
            for limit in answer.limits:
                answers.setdefault(limit.topic, []).append(answer)
        out = []
        for topic in sorted(answers):
            try:
                count = self._cluster.topic_metadata(topic).partition_count
            except TopicNotFoundError:
                continue  # deleted meanwhile
            out.append(self._description(topic, count, answers[topic]))
        return out

    def _description(self, topic: str, partition_count: int, answers: list[pb.QueueDescribeResponse]) -> QueueDescription:
        now_ms = int(time.time() * 1000)
        depth = 0
        limit = 0
        groups: list[QueueGroupState] = []
        for answer in answers:
            depth += sum(p.depth for p in answer.partitions if p.topic == topic)
            limit = max([limit, *(x.max_queue_size for x in answer.limits if x.topic == topic)])
            groups.extend(_group_state(g, now_ms) for g in answer.groups if g.topic == topic)
        groups.sort(key=lambda g: (g.group, g.partition))
        leased = len({g.partition for g in groups if g.lease is not None})
        return QueueDescription(
            topic, partition_count, depth, limit, max(limit - depth, 0) if limit else None, leased,
            tuple(groups), self._dead_letters(topic),
        )

    def _dead_letters(self, topic: str) -> int:
        """Records in the dead-letter topic (0 while it does not exist)."""
        dlq = topic + DLQ_SUFFIX
        try:
            md = self._cluster.topic_metadata(dlq)
        except TopicNotFoundError:
            return 0
        total = 0
        for p in md.partitions:
            if not p.leader_address:
                continue
            answer = self._queue_call(
                p.leader_address, "ListOffsets",
                pb.ListOffsetsRequest(queries=[pb.OffsetQuery(topic=dlq, partition=p.partition, timestamp_ms=-1)]),
                f"list offsets of {dlq!r}",
            )
            total += sum(a.log_end_offset - a.log_start_offset for a in answer.answers if not a.error)
        return total
