"""What DMQConsumer and AsyncConsumer do alike around the ConsumerCore (_core.py): carrying out
its outcomes on the parts they own (the fetcher's buffers, the heartbeats, the metrics), the
subscription's topics, position look-ups and the poll age. Calling the listener is each shell's
own: DMQConsumer calls it, AsyncConsumer also awaits coroutine callbacks."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from dmq.client.consumer._common import assigned_state
from dmq.client.consumer._config import ConsumerConfig
from dmq.client.consumer._core import Callbacks, ConsumerCore, Leaving, Outcome
from dmq.client.consumer._fetcher import Fetcher
from dmq.client.consumer._group import Membership, group_id_for
from dmq.client.consumer._positions import PositionFinder
from dmq.client.consumer._records import TopicPartition
from dmq.client.consumer._subscription import PartitionState, SubscriptionState
from dmq.client.errors import DMQTimeoutError, InvalidArgumentError


def topic_list(topics: Any) -> list[str]:
    """subscribe()'s topics: one name or an iterable of them, each once, in order."""
    wanted = list(dict.fromkeys([topics] if isinstance(topics, str) else topics))
    if not wanted or not all(isinstance(t, str) and t for t in wanted):
        raise InvalidArgumentError("subscribe() needs a topic name or a non-empty list of topic names")
    return wanted


class ConsumerShell:
    """The parts both shells keep under these names (set by their constructors / start())."""

    config: ConsumerConfig
    _core: ConsumerCore
    _subs: SubscriptionState
    _fetcher: Fetcher
    _positions: PositionFinder
    _heartbeat: Any  # HeartbeatThread, or AsyncConsumer's Heartbeats tasks
    _wakeup: Any  # threading.Event, or AsyncConsumer's Wakeup
    _manual: set[TopicPartition]  # partitions given to assign() (DMQConsumer only)

    def _drop(self, tps: Iterable[TopicPartition]) -> None:
        """Forget the fetched records of partitions no longer consumed."""
        for tp in tps:
            self._fetcher.drop(tp)

    def _carry_out(self, m: Membership, out: Outcome) -> Callbacks:
        """Carry out what the core made of an answer (see Outcome) up to the listener's
        callbacks, which are returned for the shell to call."""
        self._drop(out.dropped)
        if out.rebalanced:
            self._fetcher.stats.rebalanced()  # an assignment that changed: Kafka's rebalance count
        if out.track:
            self._heartbeat.track(m)
        return out.callbacks

    def _release(self, leaving: Leaving) -> Callbacks:
        """A left membership's partitions are no longer consumed: the callbacks to call."""
        callbacks = self._core.release(leaving)
        self._drop(leaving.owned)
        return callbacks

    def _update_positions(self) -> None:
        """Harvest and start position look-ups (never blocks; see _positions.py)."""
        group_ids = self._core.group_ids()
        for tp in self._manual:  # assign()ed partitions start at the group's commit, if any
            group_ids.setdefault(tp.topic, group_id_for(tp.topic, self.config.group_id))
        error = self._positions.update(group_ids, self._core.subscription_from_ms)
        if error is not None:
            raise error

    def _position_wait_s(self, tp: TopicPartition, state: PartitionState, deadline: float) -> float | None:
        """One round of position()'s look-up: None once the position is known (or the partition
        went meanwhile), else how long to wait for an answer; DMQTimeoutError after `deadline`."""
        self._wakeup.clear()
        self._update_positions()
        if state.position is not None or self._subs.get(tp) is not state:
            return None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DMQTimeoutError(f"position(): the position of {tp} was not found within request_timeout_ms "
                                  f"({self.config.request_timeout_ms}); is its broker up?")
        return min(remaining, self.config.retry_backoff_ms / 1000 or remaining)

    def _poll_age_s(self) -> float:
        """Seconds since the application last polled; 0 while it polls (the watchdog's)."""
        return self._core.poll_age_s(time.monotonic())

    def _assigned_state(self, tp: Any, what: str) -> tuple[TopicPartition, PartitionState]:
        return assigned_state(self._subs, tp, what)
