"""SubscriptionState: where the group client, the fetcher and the consumer meet.

It holds what the application subscribed to and, per assigned partition, where consumption
stands. The group client writes the assignment; the fetcher reads fetchable partitions and
advances positions; the consumer's public methods seek and pause. None of those modules imports
another: they share this object. Only the application's (poll()) thread touches it, so it has
no lock.

Per partition (``PartitionState``)::

    position          next offset to hand to the application; None until known
    reset             how to find an unknown position: None (ask the committed offset first),
                      or a ListOffsets timestamp: -2 earliest, -1 latest, >= 0 by time
    start_position    where the group says to start when nothing is committed
                      (dmq.v1.StartPosition: >= 0 exact, -2 log start, -3 by subscription time)
    committed         the last offset this consumer knows to be committed (skip no-op commits)
    paused            not fetched, no records returned
    epoch             bumped whenever the position jumps (seek, reset, pause, new owner): a fetch
                      answer that was requested under an older epoch is dropped, never returned

Position lifecycle: assigned -> (committed offset | start position | reset lookup) -> known ->
advanced by poll() -> committed by commit / auto-commit / rebalance.
"""

from __future__ import annotations

from collections.abc import Iterable

from dmq.client.consumer._records import TopicPartition
from dmq.proto.offset_markers import (  # re-exported (the `as` form says so to type checkers)
    EARLIEST as EARLIEST,
)
from dmq.proto.offset_markers import (
    LATEST as LATEST,
)
from dmq.proto.offset_markers import (
    START_AT_LOG_START as START_AT_LOG_START,
)
from dmq.proto.offset_markers import (
    START_BY_TIMESTAMP as START_BY_TIMESTAMP,
)

# dmq.v1.StartPosition.offset sentinels and ListOffsets timestamps: EARLIEST, LATEST,
# START_AT_LOG_START, START_BY_TIMESTAMP (dmq.proto.offset_markers), re-exported for the consumers.


class PartitionState:
    __slots__ = ("position", "reset", "start_position", "committed", "paused", "epoch")

    def __init__(self, start_position: int = START_AT_LOG_START) -> None:
        self.position: int | None = None
        self.reset: int | None = None
        self.start_position = start_position
        self.committed: int | None = None
        self.paused = False
        self.epoch = 0

    def __repr__(self) -> str:
        return (
            f"PartitionState(position={self.position}, reset={self.reset}, committed={self.committed}, "
            f"paused={self.paused}, epoch={self.epoch})"
        )


class SubscriptionState:
    def __init__(self) -> None:
        self.topics: tuple[str, ...] = ()
        self.listener: object | None = None
        self._assigned: dict[TopicPartition, PartitionState] = {}
        # Bumped on every assignment change, so callers can cache derived views cheaply.
        self.assignment_version = 0

    def __repr__(self) -> str:
        return f"<SubscriptionState topics={list(self.topics)} assigned={len(self._assigned)}>"

    # -- subscription ----------------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str], listener: object | None) -> None:
        self.topics = tuple(dict.fromkeys(topics))
        self.listener = listener

    # -- assignment ------------------------------------------------------------------------------

    def add(self, tp: TopicPartition, start_position: int) -> PartitionState:
        state = self._assigned.get(tp)
        if state is None:
            state = self._assigned[tp] = PartitionState(start_position)
            self.assignment_version += 1
        else:
            state.start_position = start_position
        return state

    def remove(self, tp: TopicPartition) -> None:
        if self._assigned.pop(tp, None) is not None:
            self.assignment_version += 1

    def assigned(self, topic: str | None = None) -> list[TopicPartition]:
        if topic is None:
            return list(self._assigned)
        return [tp for tp in self._assigned if tp.topic == topic]

    def state(self, tp: TopicPartition) -> PartitionState:
        """The state of an assigned partition; KeyError when it is not assigned."""
        return self._assigned[tp]

    def get(self, tp: TopicPartition) -> PartitionState | None:
        return self._assigned.get(tp)

    def items(self) -> list[tuple[TopicPartition, PartitionState]]:
        return list(self._assigned.items())

    # -- positions -------------------------------------------------------------------------------

    def seek(self, tp: TopicPartition, offset: int) -> None:
        state = self._assigned[tp]
        state.position = offset
        state.reset = None
        state.epoch += 1

    def request_reset(self, tp: TopicPartition, timestamp: int) -> None:
        """Forget the position; find it with ListOffsets(timestamp) (-2 earliest, -1 latest)."""
        state = self._assigned[tp]
        state.position = None
        state.reset = timestamp
        state.epoch += 1

    def needing_position(self) -> list[TopicPartition]:
        return [tp for tp, s in self._assigned.items() if s.position is None]

    def fetchable(self) -> list[tuple[TopicPartition, PartitionState]]:
        return [(tp, s) for tp, s in self._assigned.items() if s.position is not None and not s.paused]

    def consumed(self, only_changed: bool = False) -> dict[TopicPartition, int]:
        """Positions to commit: every known position, or only those ahead of the last commit."""
        return {
            tp: s.position
            for tp, s in self._assigned.items()
            if s.position is not None and not (only_changed and s.committed == s.position)
        }

    def mark_committed(self, offsets: dict[TopicPartition, int]) -> None:
        for tp, offset in offsets.items():
            state = self._assigned.get(tp)
            if state is not None:
                state.committed = offset

    # -- pause -----------------------------------------------------------------------------------

    def pause(self, tp: TopicPartition) -> None:
        state = self._assigned[tp]
        if not state.paused:
            state.paused = True
            state.epoch += 1

    def resume(self, tp: TopicPartition) -> None:
        state = self._assigned[tp]
        if state.paused:
            state.paused = False
            state.epoch += 1

    def paused(self) -> set[TopicPartition]:
        return {tp for tp, s in self._assigned.items() if s.paused}
