"""Which batches wait for a predecessor (ProducerStateManager.awaits_predecessor) and the gate's
bounds (dmq.broker.sequence_gate); the races themselves are in
tests/integration/test_produce_sequence_order.py."""

from __future__ import annotations

import asyncio
import time

from dmq.broker.log.producer_state import INT32_MAX, ProducerStateManager
from dmq.broker.sequence_gate import SequenceGate


def _state() -> ProducerStateManager:
    state = ProducerStateManager()
    state.update(7, 0, 0, 5, 0, 4, 1)  # sequences 0-4
    state.update(7, 0, 5, 5, 5, 9, 1)  # 5-9: next expected 10
    return state


def test_only_a_batch_ahead_of_the_next_sequence_in_the_same_epoch_waits() -> None:
    state = _state()
    assert state.awaits_predecessor(7, 0, 12, 3)  # 10-11 are not there yet
    assert not state.awaits_predecessor(7, 0, 10, 3)  # the next one
    assert not state.awaits_predecessor(7, 0, 5, 5)  # a duplicate: answered at once
    assert not state.awaits_predecessor(7, 0, 3, 1)  # an old retry: refused at once
    assert not state.awaits_predecessor(7, 1, 12, 3)  # another epoch: the append decides
    assert not state.awaits_predecessor(8, 0, 12, 3)  # unknown producer: accepted at any sequence
    assert not state.awaits_predecessor(-1, -1, -1, 3)  # not idempotent


def test_sequences_wrap() -> None:
    state = ProducerStateManager()
    state.update(7, 0, INT32_MAX - 4, 5, 0, 4, 1)  # ends at INT32_MAX: next is 0
    assert not state.awaits_predecessor(7, 0, 0, 2)
    assert state.awaits_predecessor(7, 0, 2, 2)


class _Log:
    topic, partition = "t", 0

    def __init__(self) -> None:
        self.state = _state()

    def awaits_predecessor(self, *args: int) -> bool:
        return self.state.awaits_predecessor(*args)


def test_the_gate_lets_a_batch_through_when_its_predecessor_is_appended() -> None:
    async def run() -> float:
        gate, plog = SequenceGate(max_wait_s=5.0), _Log()
        waiter = asyncio.ensure_future(gate.wait(plog, 7, 0, 12, 3, 100, None))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        assert not waiter.done() and gate.waiting_bytes == 100
        plog.state.update(7, 0, 10, 2, 10, 11, 2)
        started = time.monotonic()
        gate.appended("t", 0, 7)
        await waiter
        assert gate.waiting_bytes == 0 and gate.waited == 1
        return time.monotonic() - started

    assert asyncio.run(run()) < 1.0


def test_the_gate_is_bounded_in_time_and_bytes() -> None:
    async def run() -> None:
        gate, plog = SequenceGate(max_wait_s=0.1, max_waiting_bytes=1000), _Log()
        started = time.monotonic()
        await gate.wait(plog, 7, 0, 12, 3, 100, None)  # type: ignore[arg-type]
        assert 0.09 <= time.monotonic() - started < 2.0
        started = time.monotonic()
        await gate.wait(plog, 7, 0, 12, 3, 2000, None)  # more than max_waiting_bytes: no wait
        await gate.wait(plog, 7, 0, 12, 3, 100, 0.0)  # no time left before the deadline
        assert time.monotonic() - started < 0.05
        assert gate.waiting_bytes == 0

    asyncio.run(run())
