"""AsyncProducer: the Producer's batching, retries and idempotence on asyncio (aiokafka's shape).

    async with AsyncProducer(bootstrap_servers="127.0.0.1:9091") as producer:
        fut = await producer.send("orders", b'{"id": 1}', key=b"customer-7")   # queued
        meta = await fut                                                        # acknowledged
        meta = await producer.send_and_wait("orders", b"...")

What is shared with the synchronous Producer (dmq.client.producer): the core
(dmq.client._producer_core: the settings and their rules, record checks, the batch caps,
partition placement, every batching decision, flush / close bookkeeping, metrics), the
batches and the buffer-memory accounting (dmq.client._accumulator), and the whole sender:
sealing lingering batches, encoding, one Produce in flight per partition, retries with backoff
until delivery_timeout_ms, idempotent sequences and epoch bumps, error mapping
(dmq.client._sender.Sender). What differs is the waiting: the sender runs as a task on the
caller's event loop (AsyncSender) with grpc.aio calls (AsyncCluster), send() never blocks the
loop (it awaits metadata and buffer memory, up to max_block_ms), and a record's handle is
awaitable.

Every task this object starts (the sender and its calls) is owned by it and ended by stop().
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator
from typing import Any

from dmq.client._accumulator import RECORD_OVERHEAD_BYTES, ProducerBatch, RecordFuture, ThreadState
from dmq.client._cluster import TopicMetadata
from dmq.client._log import get_logger
from dmq.client._partitioner import Partitioner
from dmq.client._producer_core import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_BUFFER_MEMORY,
    IN_FLIGHT_POLL_S,
    SENDER_STOP_TIMEOUT_S,
    Headers,
    ProducerCore,
)
from dmq.client._sender import Sender
from dmq.client.aio._cluster import AsyncCluster, Wakeup, bootstrap_address
from dmq.client.errors import ClientClosedError, DMQError, DMQTimeoutError, IllegalStateError
from dmq.client.records import RecordMetadata
from dmq.proto import records

log = get_logger(__name__)

__all__ = ["AsyncProducer", "AsyncRecordFuture"]

_LOOP_THREAD = 0  # the Accumulator's per-thread state: every send() runs on the loop's thread


class AsyncRecordFuture(RecordFuture):
    """A queued record: ``await`` it for its RecordMetadata (or its DMQError). done(),
    result() (once done) and add_callback() work as on the sync RecordFuture."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        if not self._batch.future.done():
            waiter = asyncio.get_running_loop().create_future()
            # The callback runs on the sender task, on this loop: no thread hop.
            def wake(_m: RecordMetadata | None, _e: DMQError | None) -> None:
                if not waiter.done():
                    waiter.set_result(None)

            self.add_callback(wake)
            yield from waiter.__await__()
        return self.get(0)

    def result(self, timeout: float | None = None) -> RecordMetadata:
        if not self._batch.future.done():
            raise asyncio.InvalidStateError("the record is not acknowledged yet: await it")
        return self.get(0)


class AsyncSender(Sender):
    """The sync Sender's turn (`_step`) and outcome handling, run by a task instead of a thread.
    Its Produce calls are tasks on the loop (AsyncCluster.start_unary); a task's done-callback
    and result() are what the Sender asks of a call, so `_dispatch` and `_on_response` are the
    sync ones unchanged."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.task: asyncio.Task[None] | None = None
        self.memory_freed = asyncio.Event()

    def start(self) -> None:
        self.task = asyncio.create_task(self._run_async(), name=self.thread.name)

    async def _run_async(self) -> None:
        wakeup: Wakeup = self._wakeup  # type: ignore[assignment]
        timeout: float | None = 0.0
        try:
            while not self._stopping:
                await wakeup.wait(timeout)
                timeout = self._turn()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - report, fail every pending record, end
            self._crashed(e, ClientClosedError(f"the producer's sender task crashed: {e!r}"))

    async def astop(self, timeout_s: float) -> bool:
        """End the loop (cancelling it after timeout_s); True when it ended by itself."""
        self._stopping = True
        self._wakeup.set()
        task = self.task
        if task is None or task.done():
            return True
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=timeout_s)
            return False
        return True

    def _release(self, b: ProducerBatch) -> None:
        super()._release(b)
        self.memory_freed.set()  # send()s waiting for buffer memory look again


class AsyncProducer:
    """Sends records to DMQ topics from asyncio code. ``await start()`` (or ``async with``),
    then ``await send()``; ``await stop()`` delivers what is buffered and ends the tasks.

    Settings are the sync Producer's (same names, defaults and rules); ``bootstrap_servers``
    is the coordinator's "host:port" (a list is accepted; its first entry is used)."""

    def __init__(
        self,
        bootstrap_servers: str | list[str] = "127.0.0.1:9091",
        *,
        acks: str | int = "all",
        linger_ms: float = 5,
        batch_size: int = DEFAULT_BATCH_SIZE,
        compression: str | None = None,
        enable_idempotence: bool | None = None,
        buffer_memory: int = DEFAULT_BUFFER_MEMORY,
        max_block_ms: int = 60_000,
        retries: int = 2_147_483_647,
        retry_backoff_ms: int = 100,
        retry_backoff_max_ms: int = 1_000,
        request_timeout_ms: int = 30_000,
        delivery_timeout_ms: int = 120_000,
        max_record_bytes: int = records.DEFAULT_MAX_RECORD_BYTES,
        partitioner: Partitioner | None = None,
        client_id: str | None = None,
    ) -> None:
        self._bootstrap = bootstrap_address(bootstrap_servers)
        # The settings, the accumulator and every decision both producers share (_producer_core).
        self._core = core = ProducerCore(
            acks=acks, linger_ms=linger_ms, batch_size=batch_size, compression=compression,
            enable_idempotence=enable_idempotence, buffer_memory=buffer_memory, max_block_ms=max_block_ms,
            retries=retries, retry_backoff_ms=retry_backoff_ms, retry_backoff_max_ms=retry_backoff_max_ms,
            request_timeout_ms=request_timeout_ms, delivery_timeout_ms=delivery_timeout_ms,
            max_record_bytes=max_record_bytes, partitioner=partitioner, client_id=client_id, wakeup=Wakeup(),
            shell="AsyncProducer", runner="task", closer="stop()",
        )
        self.acks = acks
        self.client_id = client_id or f"aio-producer-{id(self):x}"
        self.producer_id = core.producer_id
        self._max_block_s = max_block_ms / 1000
        self._acc = core.acc
        self._state: ThreadState = self._acc.thread_state(_LOOP_THREAD)  # send()'s fast path
        self._cluster: AsyncCluster | None = None
        self._sender: AsyncSender | None = None
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "started" if self._sender is not None else "not started"
        return f"<AsyncProducer {self.client_id} bootstrap={self._bootstrap!r} {state}>"

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect to the coordinator (metadata) and start the sender task."""
        if self._closed:
            raise ClientClosedError("this AsyncProducer is stopped; create a new one")
        if self._sender is not None:
            return
        # Metadata waits inside send() are bounded by max_block_ms too (as in the sync Producer).
        self._cluster = AsyncCluster(self._bootstrap, request_timeout_ms=self._core.metadata_timeout_ms)
        self._sender = AsyncSender(self._acc, self._cluster, **self._core.sender_settings(self.client_id))
        self._sender.start()
        try:
            await self._cluster.acheck_reachable()  # as the sync Producer, max_block_ms bounds it too
            await self._cluster.wait_refresh(None, self._max_block_s)
        except BaseException:
            await self.stop()
            raise
        log.debug("async producer started", client_id=self.client_id, producer_id=self.producer_id)

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- send ------------------------------------------------------------------------------------

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Headers | None = None,
    ) -> AsyncRecordFuture:
        """Queue one record; ``await`` the returned handle for its RecordMetadata. Waits (without
        blocking the loop) only for the topic's metadata on first use and for buffer memory when
        it is full, up to max_block_ms each (then DMQTimeoutError)."""
        if key is None and partition is None and headers is None and timestamp_ms is None and type(value) is bytes:
            # Fast path, as the sync send(): append to the topic's open sticky batch. Nothing
            # else runs on this thread between the check and the append, so no seal can race it.
            b = self._state.sticky.get(topic)
            if b is not None and not b.sealed:
                size = b.size + len(value) + RECORD_OVERHEAD_BYTES
                if size <= b.limit:
                    b.size = size
                    b.values.append(value)
                    return AsyncRecordFuture(b, len(b.values) - 1)
        return await self._send_slow(topic, value, key, partition, timestamp_ms, headers)

    async def send_and_wait(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                            partition: int | None = None, timestamp_ms: int | None = None,
                            headers: Headers | None = None) -> RecordMetadata:
        """send() and wait for the acknowledgement (bounded by delivery_timeout_ms)."""
        return await (await self.send(topic, value, key, partition, timestamp_ms, headers))

    async def _send_slow(self, topic: str, value: Any, key: Any, partition: int | None,
                         timestamp_ms: int | None, headers: Headers | None) -> AsyncRecordFuture:
        """send() of every record the fast path does not take: the sync Producer._send_slow's
        steps (see _producer_core), awaiting where it blocks."""
        core, acc, cluster = self._core, self._acc, self._check_started()
        self._check_open()
        record = core.prepare(topic, value, key, headers, timestamp_ms)
        meta = await cluster.metadata(topic, self._max_block_s)
        batch_cap = core.fit(topic, meta, record)
        if partition is not None:
            meta = await self._check_partition(topic, partition, meta)
        partition = core.place(meta, partition, record.key)
        sticky = partition is None
        st = self._state
        credit = 0  # reserved buffer memory not yet given to a batch
        try:
            while True:
                with acc.lock:  # never held across an await
                    self._check_open()
                    if sticky:
                        partition = core.sticky_partition(st, topic, meta, partition)
                    assert partition is not None
                    b, n = core.append(st, topic, partition, sticky, record, batch_cap, credit)
                if b is not None:
                    credit = 0
                    return AsyncRecordFuture(b, n)
                if n == 0:
                    # Sealed full: let the sender ship it now (a loop of sends that never waits
                    # would otherwise hold every batch until buffer_memory is full), then look again.
                    partition = None if sticky else partition
                    await asyncio.sleep(0)
                elif await self._reserve(n):
                    credit += n
        finally:
            if credit:
                acc.pool.release(credit)

    async def _check_partition(self, topic: str, partition: Any, meta: TopicMetadata) -> TopicMetadata:
        """`partition` must exist; the topic may have grown since we cached it, so ask once more."""
        if not self._core.partition_in(partition, meta):
            cluster = self._check_started()
            cluster.invalidate(topic)
            meta = await cluster.metadata(topic, self._max_block_s)
            if not self._core.partition_in(partition, meta):
                raise self._core.missing_partition(topic, partition, meta)
        return meta

    async def _reserve(self, nbytes: int) -> bool:
        """Take nbytes of buffer memory: True when taken at once; False after waiting for some to
        be freed (the caller looks at its batch again, then asks again). DMQTimeoutError after
        max_block_ms."""
        acc, sender = self._acc, self._sender
        assert sender is not None
        pool = acc.pool
        if pool.try_reserve(nbytes):  # RecordTooLargeError naming buffer_memory if it never could
            return True
        deadline = time.monotonic() + self._max_block_s
        pool.waiters += 1  # the sender ships open batches at once, so memory comes back
        acc.wakeup.set()
        try:
            while pool.available < nbytes:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise pool.stayed_full(self._core.max_block_ms)
                sender.memory_freed.clear()
                try:
                    await asyncio.wait_for(sender.memory_freed.wait(), remaining)
                except TimeoutError:
                    pass
                self._check_open()
        finally:
            pool.waiters -= 1
        return False

    async def partitions_for(self, topic: str) -> set[int]:
        cluster = self._check_started()
        meta = await cluster.metadata(topic, self._max_block_s)
        return set(range(meta.partition_count))

    # -- flush / stop ----------------------------------------------------------------------------

    async def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and wait until it is acknowledged or failed (failures go
        to the records' handles). DMQTimeoutError when `timeout` seconds pass first."""
        self._check_open()
        pending = [asyncio.wrap_future(f) for f in self._core.flush_batches()]
        if not pending:
            return
        _, not_done = await asyncio.wait(pending, timeout=timeout)
        if not_done:
            raise DMQTimeoutError(f"flush: {len(not_done)} batches still unacknowledged after {timeout} s")

    async def stop(self, timeout: float | None = None) -> None:
        """Deliver what is buffered (up to `timeout` s; None = each batch until its
        delivery_timeout_ms), end the sender task and its calls, close the channels. Records
        still unacknowledged then fail with ClientClosedError. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        acc, sender, cluster = self._acc, self._sender, self._cluster
        if sender is not None:
            pending = [asyncio.wrap_future(f) for f in self._core.close_batches()]
            started = time.monotonic()
            if pending:
                await asyncio.wait(pending, timeout=timeout)
            deadline = self._core.drain_deadline(timeout, started)  # acks=0: calls still in flight
            while acc.unreleased() and time.monotonic() < deadline:
                await asyncio.sleep(IN_FLIGHT_POLL_S)
            if not await sender.astop(SENDER_STOP_TIMEOUT_S):
                log.error("producer sender task did not stop in time; cancelled", client_id=self.client_id)
            failed = sender.fail_all(ClientClosedError(
                f"the producer was stopped (timeout={timeout}) before these records were acknowledged"))
            if failed:
                log.warning("producer stopped with unacknowledged records", client_id=self.client_id, records=failed)
        else:
            acc.closed = True
        if cluster is not None:
            await cluster.aclose()
        log.debug("async producer stopped", client_id=self.client_id)

    close = stop

    def _check_started(self) -> AsyncCluster:
        if self._cluster is None:
            raise IllegalStateError("call `await producer.start()` (or use `async with`) first")
        return self._cluster

    def _check_open(self) -> None:
        self._check_started()
        if self._acc.closed:
            self._core.check_open(self._sender.error if self._sender is not None else None)

    def metrics(self) -> dict[str, float]:
        """Producer.metrics()'s keys (README "Metrics"); {} before start()."""
        if self._sender is None:
            return {}
        return self._core.metrics(self._sender.stats)
