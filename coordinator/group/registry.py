"""All groups of one coordinator: creation, deletion, replay of records, timers of every group.

``find_or_create`` and ``delete_group`` are the only operations that produce records; they
apply them through ``replay`` (the same code that rebuilds the registry at start-up) and hand
them back for the caller to persist. Group ids are ``G_<topic>_<app_id>`` (see DESIGN.md).
"""

from __future__ import annotations

from collections.abc import Callable

from dmq.proto import names
from dmq.proto.names import group_id_for

from .effects import (
    Event,
    GroupCreated,
    GroupDeleted,
    Record,
    Result,
    Subscription,
    SubscriptionMode,
)
from .errors import (
    ConsumerGroupNotEmptyError,
    ConsumerGroupNotFoundError,
    GroupIdCollisionError,
    InvalidRequestError,
)
from .group import Group, GroupConfig
from .handlers import handle_partition_count_change, tick
from .messages import (
    DeleteGroupResponse,
    FindOrCreateGroupRequest,
    FindOrCreateGroupResponse,
    PartitionCountResponse,
    TickResponse,
)


class GroupRegistry:
    __slots__ = ("config", "_groups", "_by_topic")

    def __init__(self, config: GroupConfig | None = None) -> None:
        self.config = config if config is not None else GroupConfig()
        self._groups: dict[str, Group] = {}
        self._by_topic: dict[str, set[str]] = {}

    # ------------------------------------------------------------------ lookups

    def find(self, group_id: str) -> Group | None:
        return self._groups.get(group_id)

    def get(self, group_id: str) -> Group:
        group = self._groups.get(group_id)
        if group is None:
            raise ConsumerGroupNotFoundError(group_id)
        return group

    def groups(self) -> list[Group]:
        return [self._groups[g] for g in sorted(self._groups)]

    def groups_for_topic(self, topic: str) -> list[Group]:
        return [self._groups[g] for g in sorted(self._by_topic.get(topic, ()))]

    def __len__(self) -> int:
        return len(self._groups)

    # ------------------------------------------------------------------ record-producing

    def find_or_create(
        self, request: FindOrCreateGroupRequest, now_ms: int
    ) -> Result[FindOrCreateGroupResponse]:
        """Return the group for (topic, app_id), creating it on first use.

        The subscription is recorded once: a later request with another mode gets the
        recorded one (first wins). A larger ``partition_count`` than the group knows is
        applied as a partition count change (it may schedule a rebalance).
        """
        _check_name(names.check_topic_name, request.topic, "topic")
        _check_name(names.check_app_id, request.app_id, "app_id")
        if request.partition_count < 0:
            raise InvalidRequestError(f"partition_count={request.partition_count} must be >= 0")
        group_id = group_id_for(request.topic, request.app_id)

        existing = self._groups.get(group_id)
        if existing is not None:
            if existing.topic != request.topic:
                raise GroupIdCollisionError(group_id, existing.topic, request.topic)
            events: tuple[Event, ...] = ()
            if request.partition_count > existing.partition_count:
                events = handle_partition_count_change(
                    existing, request.partition_count, now_ms
                ).events
            return Result(_found(existing, created=False), events=events)

        subscription = self._subscription_for(request)
        record = GroupCreated(
            group_id=group_id,
            topic=request.topic,
            app_id=request.app_id,
            partition_count=request.partition_count,
            subscription=subscription,
        )
        self.replay(record)
        return Result(_found(self._groups[group_id], created=True), records=(record,))

    def delete_group(self, group_id: str, now_ms: int) -> Result[DeleteGroupResponse]:
        """Only an EMPTY group may be deleted (the caller also deletes its committed offsets
        on the brokers)."""
        group = self.get(group_id)
        if group.members:
            raise ConsumerGroupNotEmptyError(group_id, len(group.members), "delete it")
        record = GroupDeleted(group_id)
        self.replay(record)
        return Result(DeleteGroupResponse(group_id), records=(record,))

    def replay(self, record: Record) -> None:
        """Apply a record: live (from the handlers above) and at start-up, in log order.

        Idempotent: a GroupCreated for an existing id keeps the existing group (first wins),
        a GroupDeleted for a missing id does nothing.
        """
        if isinstance(record, GroupCreated):
            if record.group_id in self._groups:
                return
            self._groups[record.group_id] = Group(
                group_id=record.group_id,
                topic=record.topic,
                app_id=record.app_id,
                partition_count=record.partition_count,
                subscription=record.subscription,
                config=self.config,
            )
            self._by_topic.setdefault(record.topic, set()).add(record.group_id)
        elif isinstance(record, GroupDeleted):
            group = self._groups.pop(record.group_id, None)
            if group is not None:
                ids = self._by_topic.get(group.topic)
                if ids is not None:
                    ids.discard(record.group_id)
                    if not ids:
                        del self._by_topic[group.topic]
        else:  # pragma: no cover - the Record union is closed
            raise TypeError(f"not a group record: {record!r}")

    def topic_deleted(self, topic: str, now_ms: int) -> Result[tuple[str, ...]]:
        """The topic is gone: its groups go too, members or not (their next request gets
        NOT_FOUND). Answers the deleted group ids; records a GroupDeleted for each."""
        records = tuple(GroupDeleted(g.group_id) for g in self.groups_for_topic(topic))
        for record in records:
            self.replay(record)
        return Result(tuple(r.group_id for r in records), records=records)

    # ------------------------------------------------------------------ no records

    def partition_count_changed(
        self, topic: str, partition_count: int, now_ms: int
    ) -> Result[PartitionCountResponse]:
        """The metadata service added partitions to ``topic``; every group on it learns."""
        groups = self.groups_for_topic(topic)
        for group in groups:  # validate all before changing any
            if partition_count < group.partition_count:
                raise InvalidRequestError(
                    f"partition count of {topic!r} cannot shrink "
                    f"({group.partition_count} -> {partition_count})"
                )
        events: list[Event] = []
        for group in groups:
            events.extend(handle_partition_count_change(group, partition_count, now_ms).events)
        return Result(PartitionCountResponse(partition_count), events=tuple(events))

    def tick(self, now_ms: int) -> Result[TickResponse]:
        """Fire the due timers of every group. O(groups) per call, O(1) for an idle group."""
        events: list[Event] = []
        for group in self._groups.values():
            deadline_ms = group.next_deadline_ms()
            if deadline_ms is not None and deadline_ms <= now_ms:
                events.extend(tick(group, now_ms).events)
        return Result(TickResponse(self.next_deadline_ms()), events=tuple(events))

    def next_deadline_ms(self) -> int | None:
        deadlines = [
            d for g in self._groups.values() if (d := g.next_deadline_ms()) is not None
        ]
        return min(deadlines) if deadlines else None

    def _subscription_for(self, request: FindOrCreateGroupRequest) -> Subscription:
        mode = request.subscription_mode or self.config.default_subscription_mode
        from_ms: int | None = None
        snapshot: dict[int, int] = {}
        if mode is SubscriptionMode.TIMESTAMP:
            if request.subscription_from_ms is None or request.subscription_from_ms < 0:
                raise InvalidRequestError(
                    "subscription_mode 'timestamp' needs subscription_from_ms >= 0 "
                    "(wall-clock milliseconds)"
                )
            from_ms = request.subscription_from_ms
        elif mode is SubscriptionMode.NEW:
            snapshot = dict(request.snapshot_offsets or {})
            if set(snapshot) != set(range(request.partition_count)) or any(
                o < 0 for o in snapshot.values()
            ):
                raise InvalidRequestError(
                    f"subscription_mode 'new' needs a log end offset >= 0 for each of partitions "
                    f"0..{request.partition_count - 1}, got {sorted(snapshot)}"
                )
        return Subscription(
            mode=mode, from_ms=from_ms, created_ms=request.created_ms, snapshot_offsets=snapshot
        )

    def __repr__(self) -> str:
        return f"GroupRegistry(groups={len(self._groups)}, topics={len(self._by_topic)})"


def _found(group: Group, *, created: bool) -> FindOrCreateGroupResponse:
    return FindOrCreateGroupResponse(
        group_id=group.group_id,
        created=created,
        subscription=group.subscription,
        partition_count=group.partition_count,
    )


def _check_name(check: Callable[..., None], value: str, field: str) -> None:
    """The rules of dmq.proto.names (shared by every server and the client), as this machine's error."""
    try:
        check(value, field=field)
    except names.FieldError as e:
        raise InvalidRequestError(str(e)) from None
