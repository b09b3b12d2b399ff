"""AsyncProducer: the Producer's batching, retries and idempotence on asyncio (aiokafka's shape).

    async with AsyncProducer(bootstrap_servers="127.0.0.1:9091") as producer:
        fut = await producer.send("orders", b'{"id": 1}', key=b"customer-7")   # queued
        meta = await fut                                                        # acknowledged
        meta = await producer.send_and_wait("orders", b"...")

What is shared with the synchronous Producer (dmq.client.producer): the batches, their size
bounds and the buffer-memory accounting (dmq.client._accumulator), the partitioners, the
request framing, and the whole sender: sealing lingering batches, encoding, one Produce in
flight per partition, retries with backoff until delivery_timeout_ms, idempotent sequences and
epoch bumps, error mapping (dmq.client._sender.Sender). What differs: the sender runs as a task
on the caller's event loop (AsyncSender) with grpc.aio calls (AsyncCluster), send() never
blocks the loop (it awaits metadata and buffer memory, up to max_block_ms), and a record's
handle is awaitable.

Every task this object starts (the sender and its calls) is owned by it and ended by stop().
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Generator
from typing import Any

from dmq.client._accumulator import (
    HEADER_OFFSET_BYTES,
    MEMORY_CHUNK_BYTES,
    RECORD_OVERHEAD_BYTES,
    Accumulator,
    BufferPool,
    ProducerBatch,
    RecordFuture,
    accounted_cap,
)
from dmq.client._partitioner import Partitioner, StickyChooser, crc32_partition
from dmq.client._sender import Sender, new_producer_id
from dmq.client.aio._cluster import AsyncCluster, Wakeup, bootstrap_address
from dmq.client.errors import (
    ClientClosedError,
    DMQError,
    DMQTimeoutError,
    IllegalStateError,
    RecordTooLargeError,
    UnknownPartitionError,
)
from dmq.client.producer import (
    _ACKS,
    _CODECS,
    DEFAULT_BATCH_SIZE,
    DEFAULT_BUFFER_MEMORY,
    IN_FLIGHT_POLL_S,
    Headers,
    _as_bytes,
    _headers_size,
    _normalise_headers,
    check_settings,
)
from dmq.client.records import RecordMetadata
from dmq.proto import records

log = logging.getLogger(__name__)

__all__ = ["AsyncProducer", "AsyncRecordFuture"]

SENDER_STOP_TIMEOUT_S = 5.0
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
    Its Produce calls are CallFutures (AsyncCluster.raw_produce), so `_dispatch` and
    `_on_response` are the sync ones unchanged."""

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
                wakeup.clear()
                if self._stopping:
                    break
                timeout = self._step(time.monotonic())
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - report, fail every pending record, end
            log.exception("producer sender task crashed")
            self.error = e
            with self._acc.lock:
                self._acc.closed = True
                self._acc.seal_all()
            self.fail_all(ClientClosedError(f"the producer's sender task crashed: {e!r}"))

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
        idempotent = check_settings(
            acks=acks, compression=compression, enable_idempotence=enable_idempotence, linger_ms=linger_ms,
            batch_size=batch_size, buffer_memory=buffer_memory, max_block_ms=max_block_ms, retries=retries,
            retry_backoff_ms=retry_backoff_ms, retry_backoff_max_ms=retry_backoff_max_ms,
            request_timeout_ms=request_timeout_ms, delivery_timeout_ms=delivery_timeout_ms,
            max_record_bytes=max_record_bytes,
        )
        codec_name = compression.lower() if isinstance(compression, str) else compression
        self.acks = acks
        self.client_id = client_id or f"aio-producer-{id(self):x}"
        self.producer_id = new_producer_id() if idempotent else -1
        self._settings = dict(
            acks=_ACKS[acks], codec=_CODECS[codec_name], linger_ms=linger_ms, request_timeout_ms=request_timeout_ms,
            retries=retries, retry_backoff_ms=retry_backoff_ms,
            retry_backoff_max_ms=max(retry_backoff_ms, retry_backoff_max_ms), producer_id=self.producer_id,
            max_record_bytes=max_record_bytes, name=f"dmq-sender-{self.client_id}",
        )
        self._batch_size = batch_size
        self._buffer_memory = buffer_memory
        self._delivery_timeout_ms = delivery_timeout_ms
        self._request_timeout_ms = request_timeout_ms
        self._compressed = _CODECS[codec_name] is not records.Codec.NONE
        self._caps: dict[int | None, tuple[int, int]] = {}
        self._max_block_s = max_block_ms / 1000
        self._max_record_bytes = max_record_bytes
        self._partitioner = partitioner or crc32_partition
        self._chooser = StickyChooser()
        self._cluster: AsyncCluster | None = None
        self._acc: Accumulator | None = None
        self._sender: AsyncSender | None = None
        self._state: Any = None  # the Accumulator's ThreadState of the loop (send()'s fast path)
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
        self._cluster = AsyncCluster(self._bootstrap,
                                     request_timeout_ms=max(100, min(self._request_timeout_ms, int(self._max_block_s * 1000))))
        wakeup = Wakeup()
        self._acc = Accumulator(self._batch_size, self._delivery_timeout_ms, wakeup,  # type: ignore[arg-type]
                                BufferPool(self._buffer_memory))
        self._state = self._acc.thread_state(_LOOP_THREAD)
        self._sender = AsyncSender(self._acc, self._cluster, **self._settings)
        self._sender.start()
        try:
            await self._cluster.acheck_reachable()  # as the sync Producer, max_block_ms bounds it too
            await self._cluster.wait_refresh(None, self._max_block_s)
        except BaseException:
            await self.stop()
            raise
        log.debug("async producer started: client_id=%s producer_id=%s", self.client_id, self.producer_id)

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
            # else runs on this thread between the check and the append.
            st = self._state
            if st is not None:
                b = st.sticky.get(topic)
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
        acc = self._check_open()
        value = _as_bytes(value, "value")
        if key is not None:
            key = _as_bytes(key, "key")
        hdrs = _normalise_headers(headers)
        if timestamp_ms is not None and (isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int) or timestamp_ms < 0):
            raise TypeError(f"timestamp_ms must be a non-negative int (ms since the epoch), got {timestamp_ms!r}")
        record_bytes = len(value) + (len(key) if key is not None else 0) + _headers_size(hdrs)
        if record_bytes > self._max_record_bytes:
            raise RecordTooLargeError(f"record for {topic!r} is {record_bytes} bytes (key + value + headers), "
                                      f"above max_record_bytes {self._max_record_bytes}")
        size = record_bytes + RECORD_OVERHEAD_BYTES
        alone = size + (HEADER_OFFSET_BYTES if hdrs else 0)
        assert self._cluster is not None
        meta = await self._cluster.metadata(topic, self._max_block_s)
        batch_cap, record_cap = self._caps_for(meta.max_message_bytes)
        if alone > record_cap:
            raise RecordTooLargeError(f"record for {topic!r} is {record_bytes} bytes (key + value + headers): "
                                      f"as a batch it may exceed the topic's max batch size; send a smaller record")
        if partition is not None:
            if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < meta.partition_count:
                raise UnknownPartitionError(f"partition must be an int in 0..{meta.partition_count - 1} "
                                            f"(topic {topic!r}), got {partition!r}")
        elif key is not None:
            partition = self._partitioner(key, meta.partition_count)
        sticky = partition is None
        st = self._state
        while True:
            acc = self._check_open()
            if sticky:
                current = st.sticky.get(topic)
                partition = current.partition if current is not None and not current.sealed else \
                    self._chooser.next(topic, meta.available)
            p: int = partition  # type: ignore[assignment]
            b = st.batches.get((topic, p))
            if b is not None and not b.sealed and b.values and (
                    b.size + size + b.header_cost(hdrs is not None) > b.cap
                    or not b.accepts_timestamp(b.created_ms if timestamp_ms is None else timestamp_ms)):
                acc.seal(b)  # full (or the timestamp is too far off): the next batch takes it
                # Let the sender ship it now: a loop of sends that never waits would otherwise
                # hold every batch until buffer_memory is full (no pipelining).
                await asyncio.sleep(0)
                continue
            if b is None or b.sealed:
                need = max(min(MEMORY_CHUNK_BYTES, batch_cap), alone)
            else:
                cost = size + b.header_cost(hdrs is not None)
                need = 0 if b.size + cost <= b.reserved else \
                    max(cost, min(MEMORY_CHUNK_BYTES, b.cap - b.size)) - (b.reserved - b.size)
            if need and not await self._reserve(need):
                continue  # waited for memory: the batches may have changed, look again
            if b is None or b.sealed:
                b = acc.new_batch(st, topic, p, need, max(batch_cap, alone))
            elif need:
                acc.grow(b, need)
            index = b.append_full(value, key, hdrs, timestamp_ms, size + b.header_cost(hdrs is not None))
            if sticky:
                st.sticky[topic] = b
            if b.size >= b.cap:
                acc.seal(b)
            return AsyncRecordFuture(b, index)

    async def _reserve(self, nbytes: int) -> bool:
        """Take nbytes of buffer memory: True when taken at once; False after waiting for some to
        be freed (the caller looks at its batch again, then asks again). DMQTimeoutError after
        max_block_ms."""
        acc, sender = self._acc, self._sender
        assert acc is not None and sender is not None
        pool = acc.pool
        if pool.available >= nbytes:
            pool.reserve(nbytes, 0)  # available: returns at once
            return True
        if nbytes > pool.total_bytes:
            pool.reserve(nbytes, 0)  # raises RecordTooLargeError naming buffer_memory
        deadline = time.monotonic() + self._max_block_s
        pool.waiters += 1  # the sender ships open batches at once, so memory comes back
        acc.wakeup.set()
        try:
            while pool.available < nbytes:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DMQTimeoutError(
                        f"buffer_memory ({pool.total_bytes} bytes) stayed full for max_block_ms "
                        f"({int(self._max_block_s * 1000)} ms): the brokers are not keeping up or cannot be "
                        "reached; raise buffer_memory or max_block_ms, or produce more slowly")
                sender.memory_freed.clear()
                try:
                    await asyncio.wait_for(sender.memory_freed.wait(), remaining)
                except TimeoutError:
                    pass
                self._check_open()
        finally:
            pool.waiters -= 1
        return False

    def _caps_for(self, limit: int | None) -> tuple[int, int]:
        """(batch cap, single-record cap) in accounted bytes: see the sync Producer._caps_for."""
        caps = self._caps.get(limit)
        if caps is None:
            topic_limit = limit if limit is not None else records.DEFAULT_MAX_BATCH_BYTES
            caps = self._caps[limit] = (accounted_cap(min(self._batch_size, topic_limit), self._compressed),
                                        accounted_cap(topic_limit, self._compressed))
        return caps

    async def partitions_for(self, topic: str) -> set[int]:
        cluster = self._check_started()
        meta = await cluster.metadata(topic, self._max_block_s)
        return set(range(meta.partition_count))

    # -- flush / stop ----------------------------------------------------------------------------

    async def flush(self, timeout: float | None = None) -> None:
        """Send everything buffered now and wait until it is acknowledged or failed (failures go
        to the records' handles). DMQTimeoutError when `timeout` seconds pass first."""
        acc = self._check_open()
        with acc.lock:
            acc.seal_all()
            pending = [asyncio.wrap_future(b.future) for b in acc.incomplete]
        acc.wakeup.set()
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
        if acc is not None and sender is not None:
            with acc.lock:
                acc.closed = True
                acc.seal_all()
                pending = [asyncio.wrap_future(b.future) for b in acc.incomplete]
            acc.wakeup.set()
            started = time.monotonic()
            if pending:
                await asyncio.wait(pending, timeout=timeout)
            # acks=0: calls still in flight would be cancelled with the channels (see Producer.close)
            limit_s = sender.request_timeout_s if timeout is None else timeout - (time.monotonic() - started)
            deadline = time.monotonic() + limit_s
            while acc.unreleased() and time.monotonic() < deadline:
                await asyncio.sleep(IN_FLIGHT_POLL_S)
            if not await sender.astop(SENDER_STOP_TIMEOUT_S):
                log.error("producer sender task did not stop in time; cancelled: client_id=%s", self.client_id)
            failed = sender.fail_all(ClientClosedError(
                f"the producer was stopped (timeout={timeout}) before these records were acknowledged"))
            if failed:
                log.warning("producer stopped with %d unacknowledged records: client_id=%s", failed, self.client_id)
        if cluster is not None:
            await cluster.aclose()
        log.debug("async producer stopped: client_id=%s", self.client_id)

    close = stop

    def _check_started(self) -> AsyncCluster:
        if self._cluster is None:
            raise IllegalStateError("call `await producer.start()` (or use `async with`) first")
        return self._cluster

    def _check_open(self) -> Accumulator:
        self._check_started()
        acc = self._acc
        assert acc is not None
        if acc.closed:
            if self._sender is not None and self._sender.error is not None:
                raise IllegalStateError(f"the producer's sender task crashed: {self._sender.error!r}")
            raise ClientClosedError("send() after stop(): create a new AsyncProducer")
        return acc

    def metrics(self) -> dict[str, float]:
        """Producer.metrics()'s keys (README "Metrics"); {} before start()."""
        acc = self._acc
        if acc is None:
            return {}
        sent = self._sender.stats.snapshot("send") if self._sender is not None else {}
        return {**sent, "records_failed": acc.records_failed, "open_batches": len(acc.open),
                "incomplete_batches": len(acc.incomplete), "buffer_available_bytes": acc.pool.available}
