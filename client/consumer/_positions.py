"""PositionFinder: looks up where newly assigned partitions start, without ever blocking poll().

A partition with no position goes through (DESIGN.md "Subscription modes")::

    committed   FetchCommittedOffsets to its broker: the committed offset, if any
    start       else the group's start position: an exact offset, or a reset
    reset       ListOffsets to its broker: log start, log end, or first offset at a time

Like the fetcher, it keeps at most one look-up of each kind in flight per broker, each started
without waiting (Cluster.start_unary: a gRPC future, or a task on the asyncio consumer's loop)
with its own request_timeout_ms deadline; update() (called by every poll() iteration)
harvests the finished ones and starts new ones, and returns at once. So a dead or stopped broker
delays only its own partitions: the others get their positions, and their records, as soon as
their brokers answer. A failed look-up is retried after a per-broker backoff (retry_backoff_ms,
doubling up to 1 s). Answers for a partition that was revoked, sought or re-assigned in the
meantime are dropped (the PartitionState object and its epoch are compared).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from dmq.client._calls import CALL_CANCELLED, PendingCall
from dmq.client._cluster import Cluster
from dmq.client._log import get_logger
from dmq.client.consumer._config import ConsumerConfig
from dmq.client.consumer._offsets import OffsetClient
from dmq.client.consumer._records import TopicPartition
from dmq.client.consumer._subscription import EARLIEST, START_BY_TIMESTAMP, PartitionState, SubscriptionState
from dmq.client.errors import DMQError, from_rpc_error

log = get_logger(__name__)

MAX_BACKOFF_S = 1.0
_COMMITTED = "committed"
_RESET = "reset"


@dataclass(slots=True)
class _Lookup:
    kind: str
    address: str
    future: PendingCall[Any]  # ListOffsetsResponse or FetchCommittedOffsetsResponse, as `kind` says
    # tp -> (the state object and its epoch when asked)
    asked: dict[TopicPartition, tuple[PartitionState, int]]


class PositionFinder:
    def __init__(self, cluster: Cluster, offsets: OffsetClient, subscriptions: SubscriptionState,
                 config: ConsumerConfig, wakeup: threading.Event) -> None:
        self._cluster = cluster
        self._offsets = offsets
        self._subs = subscriptions
        self._config = config
        self._wakeup = wakeup
        self._inflight: dict[tuple[str, str], _Lookup] = {}  # (kind, address)
        self._backoff: dict[str, tuple[float, float]] = {}  # address -> (retry at, last delay)
        self._closed = False

    def __repr__(self) -> str:
        return f"<PositionFinder in_flight={sorted(self._inflight)} backing_off={sorted(self._backoff)}>"

    def update(self, group_ids: Mapping[str, str], timestamps: Callable[[str], int]) -> DMQError | None:
        """Harvest finished look-ups and start the ones needed. Never blocks. Returns the first
        non-retriable error met (the caller raises it), retriable ones are retried."""
        if self._closed:
            return None
        fatal = self._harvest(timestamps)
        if not self._subs.needing_position():
            return fatal
        now = time.monotonic()
        busy = {tp for lk in self._inflight.values() for tp in lk.asked}
        committed: dict[tuple[str, str], list[TopicPartition]] = {}
        resets: dict[str, dict[TopicPartition, int]] = {}  # leader -> the reset timestamp to look up per partition
        for tp, state in self._subs.items():
            if state.position is not None or tp in busy:
                continue
            try:
                # timeout 0: never wait for the coordinator here; a missing leader is looked up
                # in the background and found at a later poll().
                address = self._cluster.leader_for(tp.topic, tp.partition, timeout_s=0, allow_stale=True)
            except DMQError as e:
                log.debug("no leader to look the position up from", topic=tp.topic, partition=tp.partition, error=str(e))
                continue
            if self._backoff.get(address, (0.0, 0.0))[0] > now:
                continue
            if state.reset is None:
                if tp.topic in group_ids and (_COMMITTED, address) not in self._inflight:
                    committed.setdefault((tp.topic, address), []).append(tp)
            elif (_RESET, address) not in self._inflight:
                resets.setdefault(address, {})[tp] = state.reset
        for (topic, address), tps in committed.items():
            if (_COMMITTED, address) in self._inflight:
                continue  # one per broker: the other topic's partitions go next time
            self._start(_COMMITTED, address, tps,
                        functools.partial(self._offsets.start_fetch_committed, address, group_ids[topic], tps))
        for address, queries in resets.items():
            self._start(_RESET, address, list(queries),
                        functools.partial(self._offsets.start_list_offsets, address, queries))
        return fatal

    def _start(self, kind: str, address: str, tps: list[TopicPartition], send: Callable[[], PendingCall[Any]]) -> None:
        try:
            future = send()
        except (DMQError, ValueError) as e:  # closed client
            log.debug("position look-up not sent", broker=address, error=str(e))
            return
        asked = {tp: (self._subs.state(tp), self._subs.state(tp).epoch) for tp in tps}
        self._inflight[(kind, address)] = _Lookup(kind, address, future, asked)
        wakeup = self._wakeup
        future.add_done_callback(lambda _f: wakeup.set())

    def _harvest(self, timestamps: Callable[[str], int]) -> DMQError | None:
        fatal: DMQError | None = None
        for key, lk in list(self._inflight.items()):
            if not lk.future.done():
                continue
            del self._inflight[key]
            what = "FetchCommittedOffsets" if lk.kind == _COMMITTED else "ListOffsets"
            try:
                response = lk.future.result()
            except CALL_CANCELLED:
                continue
            except grpc.RpcError as e:
                err = from_rpc_error(e, context=f"{what} from broker {lk.address}")
                self._failed(lk, err)
                if not err.retriable:
                    fatal = fatal or err
                continue
            self._backoff.pop(lk.address, None)
            if lk.kind == _COMMITTED:
                for tp, found in OffsetClient.parse_committed(response).items():
                    state = self._current(lk, tp)
                    if state is None:
                        continue
                    if found is not None:
                        state.position = state.committed = found.offset
                    elif state.start_position >= 0:
                        state.position = state.start_position
                    elif state.start_position == START_BY_TIMESTAMP:
                        state.reset = timestamps(tp.topic)
                    else:
                        state.reset = EARLIEST
            else:
                for tp, answer in OffsetClient.parse_list_offsets(response).items():
                    state = self._current(lk, tp)
                    if state is None:
                        continue
                    if isinstance(answer, DMQError):
                        self._failed(lk, answer)
                        if not answer.retriable:
                            fatal = fatal or answer
                        continue
                    self._subs.seek(tp, answer)
        return fatal

    def _current(self, lk: _Lookup, tp: TopicPartition) -> PartitionState | None:
        """tp's state if the answer still applies to it (same assignment, no seek since)."""
        asked = lk.asked.get(tp)
        state = self._subs.get(tp)
        if asked is None or state is None or state is not asked[0] or state.epoch != asked[1] or state.position is not None:
            return None
        return state

    def _failed(self, lk: _Lookup, err: DMQError) -> None:
        _, last = self._backoff.get(lk.address, (0.0, 0.0))
        delay_s = min(MAX_BACKOFF_S, max(self._config.retry_backoff_ms / 1000, last * 2))
        self._backoff[lk.address] = (time.monotonic() + delay_s, delay_s)
        log.warning("position look-up failed; retrying", broker=lk.address, error=str(err),
                    partitions=sorted(map(str, lk.asked)), retry_in_ms=int(delay_s * 1000))
        if err.invalid_metadata:
            for topic in {tp.topic for tp in lk.asked}:
                self._cluster.invalidate(topic)

    def close(self) -> None:
        self._closed = True
        for lk in self._inflight.values():
            lk.future.cancel()
        self._inflight.clear()
