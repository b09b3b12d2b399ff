"""A consumer group as its store row (dmq.coordinator.metastore.base.GroupRecord): its subscription, and its
membership as dmq.coordinator.group.durable snapshots it."""

from __future__ import annotations

import json
from dataclasses import replace

from dmq.coordinator.group import Group, GroupCreated, Subscription, SubscriptionMode, durable
from dmq.coordinator.metastore.base import GroupRecord


def record_to_row(record: GroupCreated) -> GroupRecord:
    sub = record.subscription
    return GroupRecord(
        group_id=record.group_id,
        topic=record.topic,
        app_id=record.app_id,
        subscription_mode=sub.mode.value,
        subscription_from_ms=sub.from_ms,
        created_ms=sub.created_ms,
        start_offsets=dict(sub.snapshot_offsets),
    )


def group_to_row(group: Group) -> GroupRecord:
    """The group's row with its membership (durable.snapshot)."""
    created = GroupCreated(group.group_id, group.topic, group.app_id, group.partition_count, group.subscription)
    return replace(
        record_to_row(created),
        generation=group.generation,
        state_json=json.dumps(durable.snapshot(group), separators=(",", ":")),
    )


def row_to_record(row: GroupRecord, partition_count: int) -> GroupCreated:
    return GroupCreated(
        group_id=row.group_id,
        topic=row.topic,
        app_id=row.app_id,
        partition_count=partition_count,
        subscription=Subscription(
            mode=SubscriptionMode(row.subscription_mode),
            from_ms=row.subscription_from_ms,
            created_ms=row.created_ms,
            snapshot_offsets=dict(row.start_offsets),
        ),
    )
