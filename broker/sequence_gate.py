"""Produce requests of one idempotent producer for one partition are appended in sequence order.

Why: a producer may keep up to 5 Produce requests per partition in flight
(max_in_flight_requests_per_connection, Kafka's setting and bound). They share one HTTP/2
connection and leave the client in sequence order, but the broker does not see them in that order
for sure: each call is its own handler coroutine, a large request's body can still be arriving
(HTTP/2 flow control) when the next small one is complete, and before its append a handler may
wait on the memory budget (memory_budget.py rules 1-2) or for a large request's turn (rule 3). Two
requests can therefore reach `PartitionLog.append` in the opposite order, and the later sequence
would be refused with OUT_OF_ORDER_SEQUENCE although nothing was lost.

So before any of those waits, a batch whose sequence is AHEAD of its producer's next expected
sequence (same epoch; `PartitionLog.awaits_predecessor`) waits here until an append of the same
producer on the same partition lets it through, at most `max_wait_s` (and the call's deadline).
Because a batch passes only when its predecessor is already in the log, the batches after it
cannot pass before it either, whatever awaits follow: the order is decided by the log's producer
state, not by arrival. If the predecessor does not come in time (it was refused, or lost), the
batch goes on to the append, which answers OUT_OF_ORDER_SEQUENCE as before; the producer retries
it after the predecessor (dmq.client._sender). A duplicate or an old retry never waits.

Bounds: a waiter holds no budget bytes and no turn (so it can never keep its predecessor from
being appended); its request bytes are held by gRPC already and are bounded here by
`max_waiting_bytes` (past it a batch does not wait, and is answered at once as before).
"""

from __future__ import annotations

import asyncio
import time

from dmq.broker.log import PartitionLog

__all__ = ["SEQUENCE_WAIT_MAX_S", "SequenceGate"]

# A predecessor normally lands within milliseconds (it was sent just before); one held longer was
# refused or lost, and the producer retries it anyway, so waiting longer only delays that answer.
SEQUENCE_WAIT_MAX_S = 0.5
DEFAULT_MAX_WAITING_BYTES = 64 * 1024 * 1024
# Give up this long before the call's deadline, so the client hears the broker's answer.
DEADLINE_MARGIN_S = 0.05

_Key = tuple[str, int, int]  # topic, partition, producer id


class SequenceGate:
    """See the module docstring. One per Broker servicer, used on its event loop only."""

    def __init__(self, max_wait_s: float = SEQUENCE_WAIT_MAX_S,
                 max_waiting_bytes: int = DEFAULT_MAX_WAITING_BYTES) -> None:
        self.max_wait_s = max_wait_s
        self.max_waiting_bytes = max_waiting_bytes
        self.waiting_bytes = 0
        self.waited = 0  # batches that waited for a predecessor (tests, debugging)
        self._waiters: dict[_Key, list[asyncio.Future[None]]] = {}

    def __repr__(self) -> str:
        return (f"<SequenceGate waiting={sum(len(w) for w in self._waiters.values())} "
                f"bytes={self.waiting_bytes} waited={self.waited}>")

    async def wait(self, plog: PartitionLog, producer_id: int, epoch: int, base_sequence: int, record_count: int,
                   size: int, timeout_s: float | None) -> None:
        """Return once the batch is not ahead of its producer's sequence any more, or after
        max_wait_s / the deadline (the append then decides, as without the gate)."""
        if producer_id < 0 or not plog.awaits_predecessor(producer_id, epoch, base_sequence, record_count):
            return
        if self.waiting_bytes + size > self.max_waiting_bytes:
            return
        wait_s = self.max_wait_s if timeout_s is None else min(self.max_wait_s, timeout_s - DEADLINE_MARGIN_S)
        deadline = time.monotonic() + wait_s
        key = (plog.topic, plog.partition, producer_id)
        loop = asyncio.get_running_loop()
        self.waiting_bytes += size
        self.waited += 1
        try:
            while plog.awaits_predecessor(producer_id, epoch, base_sequence, record_count):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                fut: asyncio.Future[None] = loop.create_future()
                waiters = self._waiters.setdefault(key, [])
                waiters.append(fut)
                try:
                    await asyncio.wait_for(fut, remaining)
                except TimeoutError:
                    pass
                finally:
                    waiters = self._waiters.get(key, [])
                    if fut in waiters:
                        waiters.remove(fut)
                    if not waiters:
                        self._waiters.pop(key, None)
        finally:
            self.waiting_bytes -= size

    def appended(self, topic: str, partition: int, producer_id: int) -> None:
        """A batch of `producer_id` was appended to the partition: its waiters look again."""
        if producer_id < 0:
            return
        waiters = self._waiters.pop((topic, partition, producer_id), None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
