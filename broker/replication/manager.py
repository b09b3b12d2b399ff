"""The replica manager: this broker's role for each replicated partition, and the leader's duties.

The controller (the coordinator's metadata service) says who leads each partition with a
PartitionState (in CreatePartitions' `states` and in UpdatePartitionStates); a state whose
partition_epoch is not newer than the one applied is ignored. For each partition with a state:

  - leader: its epoch is appended to the leader-epoch cache (at the log end), the followers are
    tracked by isr.PartitionReplicas from the state's ISR; a replica fetch moves a follower's log
    end, the high watermark (smallest log end in the ISR) follows, and acks=all produces waiting
    for it are answered. Every `isr_check_interval` the lagging followers are found and a smaller
    ISR is proposed to the controller (Metadata.AlterIsr); a follower that caught up is proposed
    back. The leader acts on a new ISR only once the controller answered it (its answer is the
    accepted state), never on its own proposal;
  - follower: produce and consumer fetches answer "not leader" naming the leader; the partition
    is handed to the fetcher of its leader (fetcher.py), which first truncates the log to the
    leader's history (OffsetForLeaderEpoch, truncation.py) and then copies the leader's batches.

A partition without a state (an unreplicated topic, CreatePartitions with empty `states`) has no
entry here: every path checks `get()` (one dict lookup) and then behaves exactly as before.

Everything runs on the broker's event loop; the tasks (the ISR check, the fetchers, AlterIsr
calls) are owned here and stopped by `stop()`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Iterable
from typing import Any

import grpc
import structlog

from dmq.broker.log import AppendInfo, LogError, PartitionLog, UnknownPartitionError
from dmq.broker.offsets import LocalDurability, OffsetStore, is_offsets_log, offsets_log_topic
from dmq.broker.replication.checkpoint import load_epochs, save_epochs
from dmq.broker.replication.fetcher import LeaderFetcher
from dmq.broker.replication.isr import PartitionReplicas
from dmq.broker.replication.ports import NO_LISTENER, ReplicaHost, ReplicaLogListener
from dmq.broker.replication.replica import NotEnoughReplicas, NotLeaderForPartition, Replica, ReplicaFetcher
from dmq.broker.replication.settings import REPLICA_ACK_TIMEOUT_MS_DEFAULT, REPLICA_LAG_TIME_MAX_MS_DEFAULT
from dmq.proto import dmq_pb2 as pb

log = structlog.get_logger(__name__)

ALTER_ISR_TIMEOUT_S = 5.0


def min_insync_for(config: pb.TopicConfig, replicas: int) -> int:
    """The topic's min_insync_replicas, or the contract's default (2 when RF >= 3, else 1)."""
    if config.HasField("min_insync_replicas"):
        return config.min_insync_replicas
    rf = config.replication_factor if config.HasField("replication_factor") else replicas
    return 2 if rf >= 3 else 1


class ReplicaManager:
    def __init__(
        self,
        node: ReplicaHost,
        *,
        replica_lag_time_max_ms: int = REPLICA_LAG_TIME_MAX_MS_DEFAULT,
        replica_ack_timeout_ms: int = REPLICA_ACK_TIMEOUT_MS_DEFAULT,
    ) -> None:
        if replica_lag_time_max_ms <= 0:
            raise ValueError(f"replica_lag_time_max_ms must be > 0, got {replica_lag_time_max_ms}")
        if replica_ack_timeout_ms <= 0:
            raise ValueError(f"replica_ack_timeout_ms must be > 0, got {replica_ack_timeout_ms}")
        self._node = node
        # Told about a follower's truncations and appends (the event stores' index follows the
        # log); set by the node once the event stores exist, which are built on this manager.
        self.log_listener: ReplicaLogListener = NO_LISTENER
        self.lag_time_max_ms = replica_lag_time_max_ms
        self.ack_timeout_ms = replica_ack_timeout_ms
        self._replicas: dict[tuple[str, int], Replica] = {}
        self._fetchers: dict[tuple[int, str], LeaderFetcher] = {}
        self._retiring: set[ReplicaFetcher] = set()  # no partition left: stopping
        self._tasks: set[asyncio.Task[None]] = set()
        self._checker: asyncio.Task[None] | None = None
        self._stopped = False
        # In-sync set changes proposed (dmq_broker_isr_shrinks / _expands), read by the metrics.
        self.isr_shrinks = 0
        self.isr_expands = 0

    def __repr__(self) -> str:
        led = sum(1 for r in self._replicas.values() if r.leading is not None)
        return f"<ReplicaManager partitions={len(self._replicas)} led={led} fetchers={len(self._fetchers)}>"

    @property
    def broker_id(self) -> int:
        return self._node.broker_id

    def get(self, topic: str, partition: int) -> Replica | None:
        return self._replicas.get((topic, partition))

    def replicas(self) -> Iterable[Replica]:
        return self._replicas.values()

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        if self._checker is None and not self._stopped:
            self._checker = asyncio.create_task(self._isr_check_loop(), name=f"broker-{self.broker_id}-isr-check")

    async def stop(self) -> None:
        """Stop the fetchers, the ISR check and AlterIsr calls; fail the waiting produces."""
        self._stopped = True
        tasks = [t for t in (self._checker, *self._tasks) if t is not None]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        fetchers = [*self._fetchers.values(), *self._retiring]
        self._fetchers.clear()
        self._retiring.clear()
        for f in fetchers:
            await f.stop()  # again for a retiring one whose stop was cancelled above
        for r in self._replicas.values():
            self._fail_waiters(r, f"broker {self.broker_id} is shutting down")

    # -- states from the controller --------------------------------------------------------------

    def configure(self, request: pb.CreatePartitionsRequest) -> list[pb.PartitionStateError]:
        """CreatePartitions: the states of its partitions (empty: unreplicated, nothing to do);
        also the topic's min_insync_replicas for the replicas known already."""
        for r in self._replicas.values():
            if r.topic == request.topic:
                r.min_insync = min_insync_for(request.config, len(r.state.replicas))
        return self.apply(request.states, request.config)

    def apply(
        self, states: Iterable[pb.PartitionState], config: pb.TopicConfig | None = None
    ) -> list[pb.PartitionStateError]:
        errors: list[pb.PartitionStateError] = []
        if self._stopped:
            return errors  # the broker is stopping: it follows and leads nothing any more
        for state in _with_offsets_logs(states, self._node.offsets):
            key = (state.topic, state.partition)
            r = self._replicas.get(key)
            if r is not None and state.partition_epoch <= r.state.partition_epoch:
                continue  # not newer than what this broker acts on
            try:
                if r is None:
                    r = self._new_replica(state, config)
                self._apply(r, state)
            except UnknownPartitionError:
                errors.append(pb.PartitionStateError(
                    topic=state.topic, partition=state.partition, error=pb.UNKNOWN_TOPIC_OR_PARTITION,
                    error_message=f"broker {self.broker_id} holds no replica of {state.topic}[{state.partition}]"))
            except LogError as e:
                log.error("partition state not applied", topic=state.topic, partition=state.partition, error=str(e))
                errors.append(pb.PartitionStateError(
                    topic=state.topic, partition=state.partition, error=pb.STORAGE_ERROR,
                    error_message=f"broker {self.broker_id}: {e}"))
        return errors

    def _new_replica(self, state: pb.PartitionState, config: pb.TopicConfig | None) -> Replica:
        plog = self._node.logs.get(state.topic, state.partition)
        same_topic = next((r for r in self._replicas.values() if r.topic == state.topic), None)
        if config is not None:
            min_insync = min_insync_for(config, len(state.replicas))
        elif same_topic is not None:
            min_insync = same_topic.min_insync
        else:
            min_insync = min_insync_for(pb.TopicConfig(), len(state.replicas))
        # partition_epoch -1: any state the controller sends is newer
        r = Replica(state.topic, state.partition, plog, load_epochs(plog), pb.PartitionState(partition_epoch=-1),
                    min_insync=min_insync)
        self._replicas[r.key] = r
        return r

    def _apply(self, r: Replica, state: pb.PartitionState) -> None:
        old = r.state
        r.state = state
        me = self.broker_id
        if state.leader_id == me:
            if r.leading is not None and old.leader_epoch == state.leader_epoch and (
                list(old.replicas) == list(state.replicas)
            ):
                if r.leading.set_isr(m for m in state.isr if m in r.leading.replicas):
                    self._hw_moved(r)
                return
            self._stop_following(r)
            self._become_leader(r, state)
            return
        self._stop_leading(r)
        if state.leader_id < 0 or me not in state.replicas:
            self._stop_following(r)
            log.info("partition has no leader to follow", topic=r.topic, partition=r.partition,
                     leader=state.leader_id, epoch=state.leader_epoch)
            return
        if r.fetcher is not None and (old.leader_id, old.leader_epoch, old.leader_address) == (
            state.leader_id, state.leader_epoch, state.leader_address
        ):
            return  # an ISR change: the follower goes on as it was
        self._stop_following(r)
        r.needs_truncation = True
        fetcher = self._fetcher_for(state.leader_id, state.leader_address)
        fetcher.add(r)
        log.info("following", topic=r.topic, partition=r.partition, leader=state.leader_id,
                 leader_address=state.leader_address, epoch=state.leader_epoch)

    def offsets_replica(self, r: Replica) -> Replica | None:
        """The replica of a data partition's internal offsets log (dmq.broker.offsets)."""
        return self._replicas.get((offsets_log_topic(r.topic), r.partition))

    def _become_leader(self, r: Replica, state: pb.PartitionState) -> None:
        leo = r.plog.log_end_offset
        if r.cache.assign(state.leader_epoch, leo):
            save_epochs(r.plog, r.cache)
        # where this epoch began: the log end now, or earlier when only the replicas changed
        epoch_start = next((e.start_offset for e in r.cache.entries if e.epoch == state.leader_epoch), leo)
        leading = PartitionReplicas(
            self.broker_id, state.replicas, (m for m in state.isr if m in state.replicas),
            log_end_offset=leo, high_watermark=r.high_watermark, epoch_start_offset=epoch_start, now_ms=_now_ms(),
        )
        leading.on_append(leo)  # an ISR of the leader alone: the high watermark is its log end
        r.leading = leading
        r.high_watermark = leading.high_watermark
        r.alter_pending = False
        log.info("leading", topic=r.topic, partition=r.partition, epoch=state.leader_epoch,
                 isr=sorted(leading.isr), log_end_offset=leo, high_watermark=leading.high_watermark)
        if is_offsets_log(r.topic):
            self._node.offsets.reload_log(r.topic, r.partition)  # serve the commits it copied
        self._node.notifier.notify(r.topic, r.partition)

    def _stop_leading(self, r: Replica) -> None:
        if r.leading is not None:
            r.high_watermark = r.leading.high_watermark
            r.leading = None
            self._fail_waiters(r, r.not_leader_message(self.broker_id))

    def _stop_following(self, r: Replica) -> None:
        fetcher, r.fetcher = r.fetcher, None
        if fetcher is not None:
            fetcher.remove(r)
            if fetcher.empty:
                self._fetchers.pop(fetcher.key, None)
                self._retiring.add(fetcher)
                self._spawn(self._retire(fetcher), f"stop fetcher {fetcher.key}")

    async def _retire(self, fetcher: ReplicaFetcher) -> None:
        await fetcher.stop()
        self._retiring.discard(fetcher)

    def _fetcher_for(self, leader_id: int, address: str) -> LeaderFetcher:
        key = (leader_id, address)
        fetcher = self._fetchers.get(key)
        if fetcher is None:
            fetcher = self._fetchers[key] = LeaderFetcher(self._node, self.log_listener, leader_id, address,
                                                              lag_time_max_ms=self.lag_time_max_ms)
            fetcher.start()
        return fetcher

    def forget(self, topic: str, partitions: set[int] | None) -> None:
        """DeletePartitions: the replicas go (their logs are deleted by the caller)."""
        for key in [k for k in self._replicas if k[0] == topic and (partitions is None or k[1] in partitions)]:
            r = self._replicas.pop(key)
            self._stop_leading(r)
            self._stop_following(r)

    def after_retention(self) -> None:
        """Retention moved log starts: the epoch caches drop what lies before them (Kafka's
        truncateFromStart), so they stay as small as the logs' history."""
        for r in self._replicas.values():
            entries = r.cache.entries
            start = r.plog.log_start_offset
            if entries and entries[0].start_offset < start:
                r.cache.truncate_from_start(start)
                try:
                    save_epochs(r.plog, r.cache)
                except LogError as e:  # kept in memory; written with the next change
                    log.warning("leader-epoch file not rewritten after retention", topic=r.topic,
                                partition=r.partition, error=str(e))

    # -- leader ------------------------------------------------------------------------------------

    def sync_leader(self, r: Replica) -> None:
        """Bring the leader's view up to its log end (appends by any path: produce, queue mode,
        event store); a lone in-sync leader's high watermark moves with it."""
        leading = r.leading
        if leading is not None and r.plog.log_end_offset > leading.log_end_offset:
            if leading.on_append(r.plog.log_end_offset):
                self._hw_moved(r)

    def high_watermark(self, r: Replica) -> int:
        """What consumers may read (below this)."""
        if r.leading is None:
            return r.high_watermark
        self.sync_leader(r)
        return r.leading.high_watermark

    def readable_end(self, topic: str, partition: int, plog: PartitionLog) -> int | None:
        """Where readers of this broker's log stop (queue mode's pops): the visible end, below
        the high watermark when replicated; None on a follower (it serves no reads)."""
        r = self._replicas.get((topic, partition))
        if r is None:
            return plog.visible_end_offset
        if r.leading is None:
            return None
        return min(plog.visible_end_offset, self.high_watermark(r))

    def check_fetch_epoch(self, r: Replica, current_leader_epoch: int) -> pb.ErrorCode:
        """A fetcher's view of the leader's epoch against this leader's (-1: not checked)."""
        if current_leader_epoch < 0 or current_leader_epoch == r.leader_epoch:
            return pb.NONE
        return pb.FENCED_LEADER_EPOCH if current_leader_epoch < r.leader_epoch else pb.UNKNOWN_LEADER_EPOCH

    def on_replica_fetch(self, r: Replica, replica_id: int, offset: int) -> None:
        """A follower asked for `offset`: it holds everything below (durably, see fetcher.py).
        Raises KeyError (not a follower of this partition) or ValueError (beyond the log end)."""
        leading = r.leading
        assert leading is not None
        self.sync_leader(r)
        self._node.stage_trace.mark(f"replica_fetch.{replica_id}", r.topic, r.partition, offset)
        expanded, moved = leading.on_fetch(replica_id, offset, _now_ms())
        if moved:
            self._hw_moved(r)
        if expanded is not None and not self._offsets_caught_up(r, replica_id):
            expanded = None
        if expanded is not None and not r.alter_pending:
            self._alter_isr(r, expanded, "follower caught up")

    def _offsets_caught_up(self, r: Replica, replica_id: int) -> bool:
        """The in-sync set is the data partition's and covers its internal offsets log too: an
        internal log never proposes a change of its own, and a follower rejoins only once it also
        holds the offsets log up to its high watermark (else a leader elected from the set could
        lack an acknowledged commit)."""
        if is_offsets_log(r.topic):
            return False
        companion = self.offsets_replica(r)
        if companion is None or companion.leading is None:
            return True
        follower = companion.leading.followers.get(replica_id)
        # ... and is not lagging on it by the rule that removes members (_offsets_lagging), or it
        # would be removed again at the next check
        return (follower is not None and follower.log_end_offset >= companion.leading.high_watermark
                and _now_ms() - follower.last_caught_up_ms <= self.lag_time_max_ms)

    def _hw_moved(self, r: Replica) -> None:
        assert r.leading is not None
        hw = r.leading.high_watermark
        r.high_watermark = hw
        self._node.stage_trace.mark("high_watermark", r.topic, r.partition, hw)
        if r.waiters:
            keep = []
            for end, fut in r.waiters:
                if end <= hw:
                    if not fut.done():
                        fut.set_result(None)
                else:
                    keep.append((end, fut))
            r.waiters = keep
        self._node.notifier.notify(r.topic, r.partition)

    def notify(self, r: Replica) -> None:
        self._node.notifier.notify(r.topic, r.partition)

    def _fail_waiters(self, r: Replica, message: str) -> None:
        waiters, r.waiters = r.waiters, []
        for _, fut in waiters:
            if not fut.done():
                fut.set_exception(NotLeaderForPartition(message))

    def enough_replicas(self, r: Replica) -> bool:
        return r.leading is not None and r.leading.enough_replicas(r.min_insync)

    async def wait_replicated(self, r: Replica, end_offset: int, timeout_s: float) -> bool | None:
        """acks=all: wait until the high watermark reaches `end_offset`. True: acknowledged;
        False: reached with fewer in-sync replicas than min_insync_replicas; None: not within
        timeout_s. Raises NotLeaderForPartition when leadership moves meanwhile."""
        deadline = time.monotonic() + timeout_s
        while True:
            leading = r.leading
            if leading is None:
                raise NotLeaderForPartition(r.not_leader_message(self.broker_id))
            self.sync_leader(r)
            answer = leading.acknowledged(end_offset, r.min_insync)
            if answer is not None:
                return answer
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            r.waiters.append((end_offset, fut))
            try:
                await asyncio.wait_for(fut, left)
            except TimeoutError:
                return None
            finally:
                r.waiters = [(e, f) for e, f in r.waiters if f is not fut]

    # -- the in-sync set ---------------------------------------------------------------------------

    async def _isr_check_loop(self) -> None:
        interval_s = min(max(self.lag_time_max_ms / 4, 10), 1000) / 1000
        while True:
            await asyncio.sleep(interval_s)
            now = _now_ms()
            for r in list(self._replicas.values()):
                leading = r.leading
                if leading is None or r.alter_pending or is_offsets_log(r.topic):
                    continue  # an offsets log's in-sync set is its data partition's
                self.sync_leader(r)
                lagging = leading.lagging(now, self.lag_time_max_ms) | self._offsets_lagging(r, now)
                if lagging:
                    self._alter_isr(r, leading.isr - lagging, f"followers {sorted(lagging)} lagging")

    def _offsets_lagging(self, r: Replica, now_ms: int) -> set[int]:
        """Followers of the shared in-sync set that keep up with the data but not with its internal
        offsets log. Commits wait for every member on the offsets log, so such a follower must
        leave the set as a lagging one of the data does; checking the data alone left it in,
        and every commit waited out replica_ack_timeout_ms and was refused (issue 28)."""
        companion = self.offsets_replica(r)
        if companion is None or companion.leading is None:
            return set()
        self.sync_leader(companion)
        return companion.leading.lagging(now_ms, self.lag_time_max_ms)

    def _alter_isr(self, r: Replica, isr: set[int], why: str) -> None:
        if r.leading is not None and len(isr) < len(r.leading.isr):
            self.isr_shrinks += 1
        else:
            self.isr_expands += 1
        r.alter_pending = True
        self._spawn(self._send_alter_isr(r, sorted(isr), why), f"alter isr {r.topic}[{r.partition}]")

    async def _send_alter_isr(self, r: Replica, isr: list[int], why: str) -> None:
        state = r.state
        try:
            stub = self._node.metadata_stub
            if stub is None:
                return
            log.info("proposing in-sync set", topic=r.topic, partition=r.partition, isr=isr, reason=why,
                     epoch=state.leader_epoch, partition_epoch=state.partition_epoch)
            try:
                answer = await stub.AlterIsr(
                    pb.AlterIsrRequest(broker_id=self.broker_id, topic=r.topic, partition=r.partition,
                                       leader_epoch=state.leader_epoch, partition_epoch=state.partition_epoch,
                                       isr=isr),
                    timeout=ALTER_ISR_TIMEOUT_S,
                )
            except grpc.aio.AioRpcError as e:
                # Refused (stale epoch: the controller's push brings the news) or unreachable:
                # the next check proposes again.
                log.warning("in-sync set change not accepted", topic=r.topic, partition=r.partition, isr=isr,
                            code=e.code().name, error=e.details())
                return
            if answer.HasField("state") and self._replicas.get(r.key) is r:
                self.apply([answer.state])
        finally:
            r.alter_pending = False

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        if self._stopped:
            coro.close()
            return
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("replication task failed", task=what, error=repr(t.exception()))

        task.add_done_callback(done)


def _with_offsets_logs(states: Iterable[pb.PartitionState], offsets: OffsetStore) -> list[pb.PartitionState]:
    """Each data partition's state, followed by the same state for its internal offsets log: the
    two have one leader, one epoch and one in-sync set, and are replicated together."""
    out = []
    for state in states:
        out.append(state)
        if is_offsets_log(state.topic):
            continue
        try:
            offsets.log_for(state.topic, state.partition)  # a topic from before the internal logs
        except UnknownPartitionError:
            continue  # no replica of the data here: the data's own state reports it
        derived = pb.PartitionState()
        derived.CopyFrom(state)
        derived.topic = offsets_log_topic(state.topic)
        out.append(derived)
    return out


class ReplicatedDurability:
    """The offsets store's writes on a replicated partition (dmq.broker.offsets.Durability): only
    the leader takes them, refused below min_insync_replicas, stored once every in-sync replica
    has them (the internal log's high watermark), as an acks=all produce."""

    def __init__(self, manager: ReplicaManager) -> None:
        self._manager = manager
        self._local = LocalDurability()

    def check(self, plog: PartitionLog) -> None:
        r = self._manager.get(plog.topic, plog.partition)
        if r is None:
            return
        if r.leading is None:
            raise NotLeaderForPartition(r.not_leader_message(self._manager.broker_id))
        if not self._manager.enough_replicas(r):
            isr = sorted(r.leading.isr)
            raise NotEnoughReplicas(f"{r.topic}[{r.partition}]: {len(isr)} in-sync replicas {isr}, "
                                    f"min_insync_replicas is {r.min_insync}; nothing stored, retry")

    async def wait(self, plog: PartitionLog, info: AppendInfo, epoch: int) -> None:
        r = self.appended(plog)
        await self._local.wait(plog, info, epoch)
        await self.replicated(r, info.last_offset + 1)

    def appended(self, plog: PartitionLog) -> Replica | None:
        """Right after an append: the followers' parked fetches take it while the leader fsyncs.
        The partition's replica (None: unreplicated)."""
        manager = self._manager
        r = manager.get(plog.topic, plog.partition)
        if r is not None:
            manager.sync_leader(r)
            manager.notify(r)
        return r

    async def replicated(self, r: Replica | None, end_offset: int) -> None:
        """Return once every in-sync replica has the log below end_offset (at once when
        unreplicated); NotEnoughReplicas / NotLeaderForPartition when it cannot be acknowledged."""
        if r is None:
            return
        manager = self._manager
        answer = await manager.wait_replicated(r, end_offset, manager.ack_timeout_ms / 1000)
        if not answer:
            raise NotEnoughReplicas(f"{r.topic}[{r.partition}]: the in-sync replicas did not all get the write "
                                    f"(in time, or the set shrank below min_insync_replicas {r.min_insync}); retry")


def _now_ms() -> int:
    return int(time.monotonic() * 1000)
