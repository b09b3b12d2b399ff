"""A follower's fetch loop: one per leader broker, covering every partition this broker follows
there, in one Fetch per round (DESIGN.md "Replication").

Each round:
  1. partitions that just started following (or whose leader refused their offset) are truncated
     to the leader's history first: OffsetForLeaderEpoch for their latest epochs, in one call,
     repeated for the few whose answer names an epoch they lack (truncation.py decides), then
     PartitionLog.truncate_to (crash-safe) and the epoch cache cut to match;
  2. a Fetch with replica_id = this broker and each partition's current_leader_epoch, from each
     log end, bounded in bytes (REPLICA_FETCH_MAX_BYTES in all, a share per partition) and
     long-polling at most FETCH_WAIT_MS;
  3. the answer's batches are appended as they are (PartitionLog.append_replica: the leader's
     offsets and bytes), the epoch cache takes the leader's `epochs` that start below the new log
     end, and, under flush_policy "fsync", the log is fsynced before the next Fetch: the offset
     that fetch reports makes the leader count the data as held by this replica (the high
     watermark, acks=all), so it must be durable. The leader's high watermark is kept.
Errors back off (BACKOFF_MIN_S doubling to BACKOFF_MAX_S) per partition, or for the whole loop when
the leader cannot be reached; the loop stops when the manager stops it (no partition left, the
leader moved, or the broker stops).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import structlog

from dmq.broker.log import InvalidBatchError, LogError
from dmq.broker.offsets import is_offsets_log
from dmq.broker.replication.checkpoint import save_epochs
from dmq.broker.replication.epochs import UNDEFINED_EPOCH
from dmq.broker.replication.ports import ReplicaHost, ReplicaLogListener
from dmq.broker.replication.replica import Replica
from dmq.broker.replication.truncation import truncation_offset
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.grpc_options import channel_options
from dmq.proto.security.settings import aio_channel

log = structlog.get_logger(__name__)

REPLICA_FETCH_MAX_BYTES = 16 * 1024 * 1024
REPLICA_FETCH_PARTITION_MAX_BYTES = 4 * 1024 * 1024
FETCH_WAIT_MS_MAX = 500
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0
TRUNCATION_ROUNDS_MAX = 8
RPC_TIMEOUT_S = 10.0
# Appends of more than this many bytes run in a worker thread (CRC checks of megabytes).
APPEND_INLINE_MAX_BYTES = 256 * 1024


class _Unanswered(Exception):
    def __init__(self, epoch: int) -> None:
        super().__init__(epoch)
        self.epoch = epoch


class LeaderFetcher:
    def __init__(
        self, node: ReplicaHost, listener: ReplicaLogListener, leader_id: int, address: str, *, lag_time_max_ms: int
    ) -> None:
        self._node = node
        self._listener = listener
        self.leader_id = leader_id
        self.address = address
        self._partitions: dict[tuple[str, int], Replica] = {}
        self._retry_at: dict[tuple[str, int], tuple[float, float]] = {}  # key -> (when, backoff)
        self._task: asyncio.Task[None] | None = None
        self._channel: grpc.aio.Channel | None = None
        self._call: grpc.aio.UnaryUnaryCall[pb.FetchRequest, pb.FetchResponse] | None = None
        self._changed = asyncio.Event()
        # Long-poll well within the lag limit: a parked fetch does not tell the leader anything.
        self.wait_ms = max(1, min(FETCH_WAIT_MS_MAX, lag_time_max_ms // 4))

    def __repr__(self) -> str:
        return f"<LeaderFetcher leader={self.leader_id} at {self.address} partitions={len(self._partitions)}>"

    @property
    def key(self) -> tuple[int, str]:
        return self.leader_id, self.address

    @property
    def empty(self) -> bool:
        return not self._partitions

    def add(self, r: Replica) -> None:
        self._partitions[r.key] = r
        r.fetcher = self
        self._retry_at.pop(r.key, None)
        self._wake()

    def remove(self, r: Replica) -> None:
        if self._partitions.get(r.key) is r:
            del self._partitions[r.key]
            self._retry_at.pop(r.key, None)
            self._wake()

    def _wake(self) -> None:
        """The set of partitions changed: end a parked fetch so the next one covers them."""
        self._changed.set()
        if self._call is not None:
            self._call.cancel()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"broker-{self._node.broker_id}-fetch-from-{self.leader_id}")

    async def stop(self) -> None:
        """Idempotent, and safe to call again when a first call was itself cancelled."""
        task = self._task
        if task is not None:
            task.cancel()
            await asyncio.wait([task], timeout=5)
            if task.done():
                self._task = None
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close(None)

    # -- the loop ----------------------------------------------------------------------------------

    async def _run(self) -> None:
        self._channel = aio_channel(self.address, self._node.client_security, channel_options())
        stub = pb_grpc.BrokerStub(self._channel)  # type: ignore[no-untyped-call]  # generated stubs are untyped
        backoff = BACKOFF_MIN_S
        while True:
            self._changed.clear()
            try:
                await self._truncate_pending(stub)
                await self._fetch_once(stub)
                backoff = BACKOFF_MIN_S
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is None or current.cancelling():
                    raise
                continue  # our own cancel of a parked call: the partitions changed
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.CANCELLED and self._changed.is_set():
                    continue
                log.warning("replica fetch failed; retrying", leader=self.leader_id, address=self.address,
                            code=e.code().name, error=e.details(), backoff_ms=round(backoff * 1000))
                await self._sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            except LogError as e:
                log.error("replica append failed; retrying", leader=self.leader_id, error=str(e))
                await self._sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            except Exception:  # noqa: BLE001 - a bug must not end replication from this leader for good
                log.exception("replica fetch loop failed; retrying", leader=self.leader_id)
                await self._sleep(BACKOFF_MAX_S)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), seconds)

    def _ready(self) -> list[Replica]:
        now = time.monotonic()
        return [r for r in self._partitions.values() if self._retry_at.get(r.key, (0.0, 0.0))[0] <= now]

    def _back_off(self, r: Replica, why: str) -> None:
        _, last = self._retry_at.get(r.key, (0.0, 0.0))
        backoff = min(max(last * 2, BACKOFF_MIN_S), BACKOFF_MAX_S)
        self._retry_at[r.key] = (time.monotonic() + backoff, backoff)
        log.info("replica of a partition backs off", topic=r.topic, partition=r.partition, leader=self.leader_id,
                 reason=why, backoff_ms=round(backoff * 1000))

    # -- truncation ----------------------------------------------------------------------------------

    async def _truncate_pending(self, stub: pb_grpc.BrokerStub) -> None:
        pending = [r for r in self._ready() if r.needs_truncation]
        answers: dict[tuple[str, int], dict[int, tuple[int, int]]] = {r.key: {} for r in pending}
        for _ in range(TRUNCATION_ROUNDS_MAX):
            if not pending:
                return
            queries: list[pb.EpochQuery] = []
            asked: list[Replica] = []
            for r in pending:
                known = answers[r.key]

                def leader_end_for(epoch: int, known: dict[int, tuple[int, int]] = known) -> tuple[int, int]:
                    if epoch not in known:
                        raise _Unanswered(epoch)
                    return known[epoch]

                try:
                    end = truncation_offset(r.cache, r.plog.log_end_offset, leader_end_for,
                                            high_watermark=r.high_watermark)
                except _Unanswered as unanswered:
                    queries.append(pb.EpochQuery(topic=r.topic, partition=r.partition, leader_epoch=unanswered.epoch,
                                                 current_leader_epoch=r.leader_epoch))
                    asked.append(r)
                    continue
                await self._truncate(r, end)
            pending = asked
            if not queries:
                return
            response = await stub.OffsetForLeaderEpoch(
                pb.OffsetForLeaderEpochRequest(queries=queries, replica_id=self._node.broker_id), timeout=RPC_TIMEOUT_S)
            by_key = {(a.topic, a.partition): a for a in response.results}
            still = []
            for r, q in zip(asked, queries, strict=True):
                a = by_key.get(r.key)
                if a is None or a.error != pb.NONE:
                    self._back_off(r, a.error_message if a is not None else "no answer for the partition")
                    continue
                answers[r.key][q.leader_epoch] = (a.leader_epoch, a.end_offset)
                still.append(r)
            pending = still
        for r in pending:
            self._back_off(r, f"no common epoch found in {TRUNCATION_ROUNDS_MAX} rounds")

    async def _truncate(self, r: Replica, end: int) -> None:
        if r.fetcher is not self:
            return
        plog = r.plog
        if end < plog.log_end_offset:
            before = plog.log_end_offset
            await self._listener.truncating(r.topic, end)  # its index is cut first
            await asyncio.to_thread(plog.truncate_to, end)
            log.warning("replica truncated to the leader's history", topic=r.topic, partition=r.partition,
                        leader=self.leader_id, epoch=r.leader_epoch, from_offset=before, to_offset=plog.log_end_offset)
        end = plog.log_end_offset
        if r.cache.entries and r.cache.entries[-1].start_offset >= end:
            r.cache.truncate_from_end(end)
            save_epochs(plog, r.cache)
        r.high_watermark = min(r.high_watermark, end)
        r.needs_truncation = False

    # -- fetching ------------------------------------------------------------------------------------

    async def _fetch_once(self, stub: pb_grpc.BrokerStub) -> None:
        ready = [r for r in self._ready() if not r.needs_truncation]
        if not ready:
            waits = [t for t, _ in self._retry_at.values()]
            await self._sleep(max(min(waits) - time.monotonic(), 0.0) if waits else BACKOFF_MAX_S)
            return
        share = max(REPLICA_FETCH_MAX_BYTES // len(ready), 64 * 1024)
        request = pb.FetchRequest(
            replica_id=self._node.broker_id, max_wait_ms=self.wait_ms, min_bytes=1,
            max_bytes=REPLICA_FETCH_MAX_BYTES,
            partitions=[
                pb.FetchPartition(topic=r.topic, partition=r.partition, offset=r.plog.log_end_offset,
                                  max_bytes=min(share, REPLICA_FETCH_PARTITION_MAX_BYTES),
                                  current_leader_epoch=r.leader_epoch)
                for r in ready
            ],
        )
        self._call = stub.Fetch(request, timeout=self.wait_ms / 1000 + RPC_TIMEOUT_S)
        try:
            response = await self._call
        finally:
            self._call = None
        by_key = {r.key: r for r in ready}
        trace = self._node.stage_trace
        appended: list[tuple[Replica, int]] = []
        for result in response.partitions:
            r = by_key.get((result.topic, result.partition))
            if r is None or r.fetcher is not self:
                continue  # moved elsewhere meanwhile
            if await self._take(r, result):
                appended.append((r, result.high_watermark))
                if trace.enabled and result.records:
                    trace.mark("follower_received", r.topic, r.partition, r.plog.log_end_offset)
        # Durable before the next fetch reports the new log ends to the leader; the partitions'
        # fsyncs run together.
        synced = await asyncio.gather(*(self._sync(r) for r, _ in appended), return_exceptions=True)
        for (r, leader_hw), outcome in zip(appended, synced, strict=True):
            if isinstance(outcome, LogError):
                self._back_off(r, f"fsync failed: {outcome}")  # the log rolled back; fetched again
            elif isinstance(outcome, BaseException):
                raise outcome
            elif trace.enabled:
                trace.mark("follower_durable", r.topic, r.partition, r.plog.log_end_offset)
            r.high_watermark = min(leader_hw, r.plog.log_end_offset)

    @staticmethod
    async def _sync(r: Replica) -> None:
        if r.plog.config.flush_policy == "fsync":
            await r.plog.wait_durable(r.plog.log_end_offset)

    async def _take(self, r: Replica, result: pb.FetchPartitionResult) -> bool:
        """Apply one partition's answer; True when the answer was taken (its high watermark then
        applies once the log is durable)."""
        plog = r.plog
        if result.error == pb.OFFSET_OUT_OF_RANGE:
            if plog.log_end_offset > result.log_end_offset:
                r.needs_truncation = True  # ahead of the leader: not its history
            elif plog.log_end_offset < result.log_start_offset:
                # the leader's retention passed this replica's log end: what it has is gone from
                # the cluster's history; it starts over where the leader's log starts
                before = plog.log_end_offset
                await self._listener.truncating(r.topic, 0)
                await asyncio.to_thread(plog.restart_at, result.log_start_offset)
                r.cache.truncate_from_start(result.log_start_offset)
                save_epochs(plog, r.cache)
                r.high_watermark = result.log_start_offset
                log.warning("replica restarted its log at the leader's log start", topic=r.topic,
                            partition=r.partition, leader=self.leader_id, from_offset=before,
                            to_offset=result.log_start_offset)
            else:
                self._back_off(r, result.error_message)
            return False
        if result.error != pb.NONE:
            self._back_off(r, f"{pb.ErrorCode.Name(result.error)}: {result.error_message}")
            return False
        self._retry_at.pop(r.key, None)
        data = result.records
        if data:
            try:
                if len(data) > APPEND_INLINE_MAX_BYTES:
                    await asyncio.to_thread(plog.append_replica, data)
                else:
                    plog.append_replica(data)
            except InvalidBatchError as e:
                log.warning("leader's batches do not continue this replica's log; truncating again",
                            topic=r.topic, partition=r.partition, error=str(e))
                r.needs_truncation = True
                return False
            self._listener.replica_appended(r.topic)
        if is_offsets_log(r.topic) and result.log_start_offset > plog.log_start_offset:
            # the leader compacted its offsets log (dmq.broker.offsets): the older segments here go too
            try:
                plog.delete_segments_before(result.log_start_offset)
            except LogError as e:
                log.warning("old offsets segments not deleted", topic=r.topic, partition=r.partition, error=str(e))
        end = plog.log_end_offset
        changed = False
        for start in result.epochs:
            if start.start_offset < end and start.epoch != UNDEFINED_EPOCH:
                changed |= r.cache.assign(start.epoch, start.start_offset)
        if changed:
            save_epochs(plog, r.cache)
        return True
