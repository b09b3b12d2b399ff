"""Telling brokers their partitions' new states: Broker.UpdatePartitionStates (Kafka's
LeaderAndIsr), sent by the controller after every change it recorded.

A push goes to every live broker holding a replica of the changed partition, all brokers at once,
each call bounded by the broker call timeout. Outcomes, per broker:
  1. Applied (its per-partition errors, if any, are logged: a broker refuses only what it cannot
     hold, and the next registration hands it everything again).
  2. Lost (unreachable, timed out, refused as a whole): the states wait in `pending` for that broker
     (latest per partition, so bounded by the partitions it holds) and are sent again when it next
     heartbeats, at most MAX_ATTEMPTS times; a broker that re-registers gets every state in its
     registration answer, which clears them.
  3. UNIMPLEMENTED (a broker of a version without replication): dropped at once, logged once per
     broker; that broker keeps leading what it has (the unreplicated meaning).
Order: brokers ignore a state whose partition_epoch is not newer than theirs, so two pushes that
overtake each other cannot undo a change.

Tasks: every call runs in a task this object owns; `close()` cancels them (bounded). A deposed
coordinator (`acting()` false: its lease may lapse) sends nothing, even from a task that was already
scheduled; its step-down closes the pusher, and `reopen()` starts the next term with nothing pending.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
import structlog

from dmq.coordinator.broker_pool import BrokerPool
from dmq.coordinator.metastore.base import NO_LEADER, PartitionRecord
from dmq.proto import dmq_pb2 as pb

log = structlog.get_logger(__name__)

MAX_ATTEMPTS = 10
CLOSE_TIMEOUT_S = 5.0

# (topic, partition) -> state
StateChanges = Mapping[tuple[str, int], PartitionRecord]


def partition_state(
    topic: str, partition: int, state: PartitionRecord, address_of: Callable[[int], str | None]
) -> pb.PartitionState:
    return pb.PartitionState(
        topic=topic,
        partition=partition,
        leader_id=state.leader,
        leader_address=(address_of(state.leader) or "") if state.leader != NO_LEADER else "",
        leader_epoch=state.leader_epoch,
        replicas=state.replicas,
        isr=state.isr,
        partition_epoch=state.partition_epoch,
    )


@dataclass(slots=True)
class _Pending:
    states: dict[tuple[str, int], PartitionRecord] = field(default_factory=dict)
    attempts: int = 0


class StatePusher:
    def __init__(
        self,
        broker_pool: BrokerPool,
        address_of: Callable[[int], str | None],
        *,
        call_timeout_ms: int,
    ) -> None:
        self.broker_pool = broker_pool
        self.address_of = address_of
        self.call_timeout_ms = call_timeout_ms
        # The epoch this coordinator claimed (the node sets it): sent with every push and every
        # answer to a broker, which refuses pushes of an older one (a deposed coordinator's).
        self.controller_epoch = 0
        self.pending: dict[int, _Pending] = {}
        self._unimplemented: set[int] = set()  # brokers told once that they cannot take states
        self._retrying: dict[int, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        # With several coordinators, the lease check (dmq.coordinator.controller.leadership; the node sets it).
        self.acting: Callable[[], bool] = lambda: True

    def __repr__(self) -> str:
        waiting = {b: len(p.states) for b, p in self.pending.items()}
        return f"<StatePusher pending={waiting} tasks={len(self._tasks)}>"

    def push(self, changes: StateChanges, live: Iterable[int], *, also: Iterable[int] = ()) -> asyncio.Task[None]:
        """Send each changed state to its live replicas (and to the brokers in `also`); the task
        ends when every broker answered or its call failed."""
        live_set = set(live)
        by_broker: dict[int, dict[tuple[str, int], PartitionRecord]] = {}
        extra = set(also)
        for key, state in changes.items():
            for broker_id in {*state.replicas, *extra}:
                if broker_id in live_set:
                    by_broker.setdefault(broker_id, {})[key] = state
        return self._spawn(self._push_all(by_broker), "controller-push")

    def on_heartbeat(self, broker_id: int) -> None:
        """A broker with states still to receive gets them again (one retry at a time)."""
        if broker_id not in self.pending or broker_id in self._retrying or self._closed or not self.acting():
            return
        waiting = self.pending.pop(broker_id)
        task = self._spawn(self._send(broker_id, waiting.states, attempts=waiting.attempts), "controller-push-retry")
        self._retrying[broker_id] = task
        task.add_done_callback(lambda _t: self._retrying.pop(broker_id, None))

    def on_registered(self, broker_id: int) -> None:
        """Its registration answer carries every state: nothing is pending for it any more."""
        self.pending.pop(broker_id, None)
        self._unimplemented.discard(broker_id)

    def reopen(self) -> None:
        """A new term of control (elected again after stepping down): the old term's leftovers go,
        its registrations answer every broker afresh."""
        self._closed = False
        self.pending.clear()
        self._unimplemented.clear()

    async def close(self) -> None:
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _push_all(self, by_broker: Mapping[int, Mapping[tuple[str, int], PartitionRecord]]) -> None:
        await asyncio.gather(*(self._send(b, states) for b, states in sorted(by_broker.items())))

    async def _send(self, broker_id: int, states: Mapping[tuple[str, int], PartitionRecord], *, attempts: int = 0) -> None:
        address = self.address_of(broker_id)
        if address is None or self._closed or not self.acting():
            return
        request = pb.UpdatePartitionStatesRequest(
            states=[partition_state(t, p, s, self.address_of) for (t, p), s in sorted(states.items())],
            controller_epoch=self.controller_epoch,
        )
        try:
            response = await self.broker_pool.stub(address).UpdatePartitionStates(
                request, timeout=self.call_timeout_ms / 1000
            )
        except grpc.aio.AioRpcError as e:
            self._failed(broker_id, address, states, attempts + 1, e.code(), e.details() or "")
            return
        except Exception:  # noqa: BLE001 - a bug in one push must not stop the others; kept for a retry
            log.exception("pushing partition states failed", broker_id=broker_id, address=address)
            self._failed(broker_id, address, states, attempts + 1, grpc.StatusCode.UNKNOWN, "")
            return
        for error in response.errors:
            log.warning(
                "broker refused a partition state",
                broker_id=broker_id,
                topic=error.topic,
                partition=error.partition,
                error=pb.ErrorCode.Name(error.error),
                message=error.error_message,
            )

    def _failed(
        self,
        broker_id: int,
        address: str,
        states: Mapping[tuple[str, int], PartitionRecord],
        attempts: int,
        code: grpc.StatusCode,
        details: str,
    ) -> None:
        if code == grpc.StatusCode.UNIMPLEMENTED:
            if broker_id not in self._unimplemented:
                self._unimplemented.add(broker_id)
                log.warning("broker does not take partition states (no replication in its version)",
                            broker_id=broker_id, address=address)
            return
        if attempts >= MAX_ATTEMPTS:
            log.error("partition states not delivered; the broker gets them when it re-registers",
                      broker_id=broker_id, address=address, partitions=len(states), code=code.name, error=details)
            return
        log.warning("partition states not delivered; retried at its next heartbeat", broker_id=broker_id,
                    address=address, partitions=len(states), attempt=attempts, code=code.name, error=details)
        waiting = self.pending.setdefault(broker_id, _Pending())
        for key, state in states.items():
            current = waiting.states.get(key)
            if current is None or current.partition_epoch < state.partition_epoch:
                waiting.states[key] = state
        waiting.attempts = max(waiting.attempts, attempts)
