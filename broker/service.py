"""The Broker gRPC service: produce, fetch (long-poll), list offsets, committed offsets.

Handlers validate every field before touching a log, so a hostile request gets a status and a
message naming the field and the limit, and never reaches storage. Record batches are checked at
the header level (size, magic, CRC) and stored as they came, their base offset patched: the broker
decodes the records of no batch except those flagged as carrying transaction or trace ids
(dmq.proto.records attribute bits 5 / 6; see dmq.broker.log.record_ids).

Storage errors (one mapping, dmq.broker.storage_status, for every RPC): a full disk (ENOSPC / EDQUOT, or
SQLite's "database or disk is full") -> RESOURCE_EXHAUSTED "disk full on broker N"; any other
I/O error -> UNAVAILABLE (the log stays writable, the client retries); damaged log data ->
DATA_LOSS naming topic, partition and offset. The reason also travels as trailing metadata
(dmq.proto.error_details) so clients never parse messages. In Fetch they are per-partition
errors (STORAGE_ERROR, CORRUPT_DATA), so one bad partition never fails or stalls the others.

Fetch long-polls: when the first read returns fewer than `min_bytes`, the handler parks on the
partitions' append notifiers until an append lands or `max_wait_ms` passes, then reads again.

Replicated partitions (a PartitionState from the controller; dmq.broker.replication.manager):
a follower answers produce and consumer fetches "not leader" naming the leader; on the leader,
consumers read below the high watermark (ListOffsets latest = it), a Fetch with replica_id (a
follower broker) reads up to the log end and moves the in-sync set, and acks=all waits for the
high watermark (NOT_ENOUGH_REPLICAS below min_insync_replicas). Unreplicated partitions take
none of these paths.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

import grpc
import structlog

from dmq.broker.append_notifier import AppendNotifier
from dmq.broker.appender import Appender
from dmq.broker.events.registry import EventStores
from dmq.broker.host import StorageHost
from dmq.broker.log import (
    CorruptLogError,
    LogClosedError,
    LogError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    PartitionLog,
    ProducerFencedError,
    UnknownPartitionError,
)
from dmq.broker.memory_budget import BudgetExhaustedError, ByteBudget, Lease
from dmq.broker.metrics import TopicTraffic
from dmq.broker.offsets import check_offsets_log_name, is_offsets_log
from dmq.broker.queue.manager import QueueManager
from dmq.broker.readiness import require_started
from dmq.broker.replication.manager import ReplicaManager
from dmq.broker.replication.replica import NotLeaderForPartition, Replica
from dmq.broker.replication.stage_trace import StageTrace
from dmq.broker.sequence_gate import SequenceGate
from dmq.broker.storage_status import translate_storage
from dmq.proto import dmq_pb2 as pb
from dmq.proto import error_details, limits, names, records
from dmq.proto.grpc_options import MAX_FETCH_RESPONSE_BYTES
from dmq.proto.offset_markers import EARLIEST, LATEST
from dmq.proto.server.server_errors import RpcAbort, rpc_handler
from dmq.proto.server.server_errors import fail as _fail
from dmq.proto.wire import frame_fetch_response

log = structlog.get_logger(__name__)

MAX_FETCH_WAIT_MS = 60_000
MAX_FETCH_PARTITIONS = 10_000
MAX_COMMIT_PARTITIONS = 10_000
MAX_OFFSET_METADATA_CHARS = 4096
DEFAULT_FETCH_MAX_BYTES = 50 * 1024 * 1024
# FindTrace: records per answer (default, most), and the batch bytes that hold them
TRACE_RECORDS_DEFAULT = 1_000
TRACE_RECORDS_MAX = 10_000
TRACE_ANSWER_MAX_BYTES = 32 * 1024 * 1024


def _checked(check: Callable[..., None], value: object, field: str) -> None:
    """Run one of dmq.proto's shared rules; its FieldError is INVALID_ARGUMENT naming field and limit
    (rpc_handler's one mapping, dmq.proto.server.server_errors)."""
    check(value, field=field)


def _not_enough_replicas(replica: Replica, broker_id: int, *, stored: bool = False) -> str:
    isr = sorted(replica.leading.isr) if replica.leading is not None else []
    outcome = ("the batch is stored but not acknowledged (the in-sync set shrank before it was replicated); "
               "retry (an idempotent producer's retry is answered as a duplicate)" if stored else
               "acks=all refused, nothing stored; retry once the replicas are back")
    return (
        f"{replica.topic}[{replica.partition}] on broker {broker_id}: {len(isr)} in-sync replicas {isr}, "
        f"min_insync_replicas is {replica.min_insync}; {outcome}"
    )


def _check_states(states: Sequence[pb.PartitionState], field: str = "states") -> None:
    """The controller's partition states: valid names, numbers and broker ids."""
    if len(states) > limits.PARTITIONS_PER_TOPIC_MAX * 10:
        _fail(grpc.StatusCode.INVALID_ARGUMENT,
              f"{field} has {len(states)} entries; the limit is {limits.PARTITIONS_PER_TOPIC_MAX * 10}")
    for i, st in enumerate(states):
        _check_topic(st.topic, f"{field}[{i}].topic")
        _check_partition(st.partition, f"{field}[{i}].partition")
        if st.leader_id < -1 or st.leader_epoch < 0 or st.partition_epoch < 0:
            _fail(grpc.StatusCode.INVALID_ARGUMENT,
                  f"{field}[{i}]: leader_id must be >= -1, leader_epoch and partition_epoch >= 0 "
                  f"(got {st.leader_id}, {st.leader_epoch}, {st.partition_epoch})")
        if not st.replicas or any(b < 0 for b in st.replicas) or len(set(st.replicas)) != len(st.replicas):
            _fail(grpc.StatusCode.INVALID_ARGUMENT,
                  f"{field}[{i}].replicas must list distinct broker ids (>= 0), got {list(st.replicas)}")
        if st.leader_id >= 0 and st.leader_id not in st.replicas:
            _fail(grpc.StatusCode.INVALID_ARGUMENT,
                  f"{field}[{i}].leader_id {st.leader_id} is not one of the replicas {list(st.replicas)}")


def _check_topic_partitions(topic: str, partitions: Sequence[int]) -> None:
    """The coordinator's CreatePartitions / DeletePartitions: a valid topic and partition list."""
    _check_topic(topic)
    if len(partitions) > limits.PARTITIONS_PER_TOPIC_MAX:
        _fail(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"partitions has {len(partitions)} entries; the limit is {limits.PARTITIONS_PER_TOPIC_MAX}",
        )
    for i, p in enumerate(partitions):
        _check_partition(p, f"partitions[{i}]")


def _check_topic(topic: str, field: str = "topic") -> None:
    _checked(names.check_topic_name, topic, field)


def _check_log_name(topic: str, field: str, *, internal: bool) -> None:
    """A topic name, or with `internal` (replica fetches, cluster-only calls) also the name of a
    partition's internal offsets log (dmq.broker.offsets), which replicas copy like the data."""
    if internal and is_offsets_log(topic):
        why = check_offsets_log_name(topic)
        if why is not None:
            _fail(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {why}")
        return
    _check_topic(topic, field)


def _check_partition(partition: int, field: str = "partition") -> None:
    _checked(limits.check_partition_number, partition, field)


def _check_group(group_id: str) -> None:
    _checked(names.check_group_id, group_id, "group_id")


def _check_topic_config(config: pb.TopicConfig) -> None:
    """The topic settings a coordinator sends, checked by the same table it used (dmq.proto.limits)."""
    values = {name: getattr(config, name) for name in limits.TOPIC_CONFIG_RANGES if config.HasField(name)}
    limits.check_topic_config(values, field_prefix="config.")


def _translate(service: BrokerService, e: Exception) -> RpcAbort | None:
    """A storage failure's status (see the module docstring); None for anything else (a bug)."""
    return translate_storage(service._node.broker_id, e)


# Validation failures become their status, storage failures theirs, anything else INTERNAL.
_guarded = rpc_handler(log=log, translate=_translate)
# The same, for the RPCs that answer from state loaded at start: UNAVAILABLE until it is loaded
# (dmq.broker.readiness). Every RPC here but the controller's CreatePartitions / DeletePartitions.
_loaded = rpc_handler(log=log, translate=_translate, before=require_started)


class BrokerHost(StorageHost, Protocol):
    """The broker as its data-path servicer sees it (the BrokerNode is one): a Protocol, so this
    module names no node and the node imports it without a cycle. Its id, logs and offsets
    store are StorageHost's."""

    controller_epoch: int  # the newest heard of; UpdatePartitionStates moves it

    @property
    def ready(self) -> bool: ...

    @property
    def replication(self) -> ReplicaManager: ...

    @property
    def queues(self) -> QueueManager: ...

    @property
    def event_stores(self) -> EventStores: ...

    @property
    def notifier(self) -> AppendNotifier: ...

    @property
    def traffic(self) -> TopicTraffic: ...

    @property
    def stage_trace(self) -> StageTrace: ...

    async def leader_hint(self, topic: str, partition: int) -> str | None: ...

    async def check_ownership(
        self, group_id: str, member_id: str, generation: int, topic: str, partitions: list[int],
        *, member_secret: str = "",
    ) -> None: ...

    def create_partitions(self, request: pb.CreatePartitionsRequest) -> None: ...

    async def delete_partitions(self, topic: str, partitions: set[int] | None) -> None: ...


class BrokerService:
    """The data path and the cluster's calls: Produce, Fetch, ListOffsets, committed offsets,
    DescribeLogs, FindTrace and the controller's and followers' RPCs. Queue mode's and the event
    store's RPCs are servicers of their own (dmq.broker.queue.service, dmq.broker.events.service),
    registered beside this one (dmq.broker.servicers)."""

    def __init__(self, node: BrokerHost, budget: ByteBudget | None = None) -> None:
        self._node = node
        self.notifier = node.notifier  # wakes long-polling fetches (shared with replication, dead letters)
        self.traffic = node.traffic  # records / bytes in and out per topic (dmq.broker.metrics)
        self.appender = Appender()
        # Fetch answers and produce requests in flight, together (see memory_budget.py).
        self.budget = budget or ByteBudget()
        # One idempotent producer's batches of a partition, appended in sequence order.
        self.sequences = SequenceGate()

    @contextlib.asynccontextmanager
    async def _turn(self, size: int, context: grpc.aio.ServicerContext[Any, Any], what: str) -> AsyncIterator[None]:
        """A large request's turn to be worked on (see memory_budget.py, rule 3)."""
        try:
            async with self.budget.turn(size, context.time_remaining(), what):
                yield
        except BudgetExhaustedError as e:
            raise RpcAbort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e), error_details.BUSY) from None

    async def _reserve(self, size: int, context: grpc.aio.ServicerContext[Any, Any], what: str) -> Lease:
        """Hold `size` bytes of the budget, waiting until the call's deadline; RESOURCE_EXHAUSTED after."""
        try:
            return await self.budget.acquire(size, context.time_remaining(), what)
        except BudgetExhaustedError as e:
            raise RpcAbort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e), error_details.BUSY) from None

    # -- helpers -------------------------------------------------------------------------------

    async def _not_here(self, topic: str, partition: int) -> tuple[pb.ErrorCode, str]:
        """The per-partition error for a partition this broker does not hold, naming its leader."""
        leader = await self._node.leader_hint(topic, partition)
        if leader is None:
            return pb.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic or partition: {topic}[{partition}]"
        return (
            pb.NOT_LEADER,
            f"broker {self._node.broker_id} does not lead {topic}[{partition}]; the leader is {leader}",
        )

    async def _log_for(self, topic: str, partition: int) -> PartitionLog:
        node = self._node
        try:
            plog = node.logs.get(topic, partition)
        except UnknownPartitionError:
            pass
        else:
            r = node.replication.get(topic, partition)
            if r is not None and r.leading is None:  # a follower: the controller named another leader
                _fail(grpc.StatusCode.UNAVAILABLE, r.not_leader_message(node.broker_id))
            return plog
        leader = await node.leader_hint(topic, partition)
        if leader is None:
            _fail(grpc.StatusCode.NOT_FOUND, f"unknown topic or partition: {topic}[{partition}]")
        _fail(
            grpc.StatusCode.UNAVAILABLE,
            f"broker {node.broker_id} does not lead {topic}[{partition}]; the leader is {leader}",
        )

    # -- produce ---------------------------------------------------------------------------------

    @_loaded
    async def Produce(
        self, request: pb.ProduceRequest, context: grpc.aio.ServicerContext[pb.ProduceRequest, pb.ProduceResponse]
    ) -> pb.ProduceResponse:
        _check_topic(request.topic)
        _check_partition(request.partition)
        # Read once: every access to a bytes field of a parsed message copies it (1 MB each).
        batch = request.batch
        if not batch:
            _fail(grpc.StatusCode.INVALID_ARGUMENT, "batch must not be empty")
        plog = await self._log_for(request.topic, request.partition)
        if self._node.event_stores.is_event_store(request.topic):
            # Events enter through EventAppend only: it checks conditions and indexes them.
            _fail(grpc.StatusCode.FAILED_PRECONDITION,
                  f"topic {request.topic!r} is an event store: append events with EventAppend (`dmq events append`)")
        limit = plog.config.max_batch_bytes
        if len(batch) > limit:
            _fail(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"batch is {len(batch)} bytes; the limit (max_batch_bytes) is {limit}",
            )
        replica = self._node.replication.get(request.topic, request.partition)  # None: unreplicated
        acks_all = request.acks == pb.ACKS_ALL
        if replica is not None and acks_all and not self._node.replication.enough_replicas(replica):
            _fail(grpc.StatusCode.UNAVAILABLE, _not_enough_replicas(replica, self._node.broker_id),
                  error_details.NOT_ENOUGH_REPLICAS)
        # An idempotent producer's earlier batches are appended first (dmq.broker.sequence_gate):
        # waited for here, before the budget and the turn, whose waits could reorder them.
        try:
            header: records.BatchHeader | None = records.read_header(batch, max_batch_bytes=limit)
        except records.RecordsError:
            header = None  # the append refuses it, naming what is wrong
        producer_id = -1 if header is None else header.producer_id
        if header is not None and producer_id >= 0:
            await self.sequences.wait(plog, producer_id, header.producer_epoch, header.base_sequence,
                                      header.record_count, len(batch), context.time_remaining())
        # The batch is in memory already; holding its size until it is appended makes a flood
        # of produces wait (or be refused) instead of piling up in the broker.
        what = f"produce to {request.topic}[{request.partition}]"
        lease = await self._reserve(len(batch), context, what)
        trace = self._node.stage_trace
        trace.mark("produce_received", request.topic, request.partition, plog.log_end_offset)
        try:
            # The turn covers the append (checks, write; in a thread when large), not the wait
            # for the fsync: large acks=all batches still share group commits.
            async with self._turn(len(batch), context, what):
                with self._node.queues.admission(request.topic, batch):  # max_queue_size: refused whole
                    info = await self.appender.append(plog, batch)
            self.sequences.appended(request.topic, request.partition, producer_id)  # its successors go on
            trace.mark("leader_appended", request.topic, request.partition, info.last_offset + 1)
            if replica is not None:
                # the followers' parked fetches take it now, while the leader fsyncs
                self._node.replication.sync_leader(replica)
                self.notifier.notify(request.topic, request.partition)
            if acks_all and plog.config.flush_policy == "fsync":
                # PartitionLog.append_durable() in two steps, the turn released in between; a
                # leader's fsync off the loop, so that the followers' fetches run beside it
                await plog.wait_durable(info.last_offset + 1, may_block_loop=replica is None)
                trace.mark("leader_durable", request.topic, request.partition, info.last_offset + 1)
        except records.BatchTooLargeError as e:
            _fail(grpc.StatusCode.RESOURCE_EXHAUSTED, f"batch: {e}")
        except records.RecordsError as e:
            _fail(grpc.StatusCode.INVALID_ARGUMENT, f"batch: {e}")
        except ProducerFencedError as e:
            _fail(grpc.StatusCode.FAILED_PRECONDITION, str(e), error_details.PRODUCER_FENCED)
        except OutOfOrderSequenceError as e:
            _fail(grpc.StatusCode.FAILED_PRECONDITION, str(e), error_details.OUT_OF_ORDER_SEQUENCE)
        except UnknownPartitionError as e:
            _fail(grpc.StatusCode.NOT_FOUND, str(e))
        finally:
            lease.release()
        if not info.duplicate:
            self.traffic.produced(request.topic, info.last_offset - info.base_offset + 1, len(batch))
            self.notifier.notify(request.topic, request.partition)
            self._node.queues.on_append(request.topic, request.partition)
        if replica is not None and acks_all:
            await self._wait_replicated(replica, info.last_offset + 1, context)
        trace.mark("produce_acked", request.topic, request.partition, info.last_offset + 1)
        return pb.ProduceResponse(
            base_offset=info.base_offset,
            log_append_time_ms=info.append_time_ms,
            log_start_offset=plog.log_start_offset,
            duplicate=info.duplicate,
            record_offsets=info.record_offsets or (),
        )

    async def _wait_replicated(self, replica: Replica, end_offset: int, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """acks=all on a replicated partition: answered once the high watermark covers the batch
        (every in-sync replica has it durably), within the call's deadline and the broker's
        replica_ack_timeout_ms; fails retriable otherwise (the batch may be stored: an idempotent
        producer's retry is then answered as a duplicate)."""
        manager = self._node.replication
        timeout_s = manager.ack_timeout_ms / 1000
        remaining = context.time_remaining()
        if remaining is not None:
            timeout_s = max(min(timeout_s, remaining - 0.05), 0.0)
        try:
            answer = await manager.wait_replicated(replica, end_offset, timeout_s)
        except NotLeaderForPartition as e:
            _fail(grpc.StatusCode.UNAVAILABLE, f"{e}; the batch is not acknowledged, retry")
        if answer is None:
            _fail(grpc.StatusCode.UNAVAILABLE,
                  f"{replica.topic}[{replica.partition}]: the in-sync replicas did not all get the batch within "
                  f"{timeout_s * 1000:.0f} ms; not acknowledged, retry", error_details.NOT_ENOUGH_REPLICAS)
        if not answer:
            _fail(grpc.StatusCode.UNAVAILABLE, _not_enough_replicas(replica, self._node.broker_id, stored=True),
                  error_details.NOT_ENOUGH_REPLICAS)

    # -- fetch -----------------------------------------------------------------------------------

    def _validate_fetch(self, request: pb.FetchRequest) -> None:
        if len(request.partitions) == 0:
            _fail(grpc.StatusCode.INVALID_ARGUMENT, "partitions must name at least one partition")
        if len(request.partitions) > MAX_FETCH_PARTITIONS:
            _fail(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"partitions has {len(request.partitions)} entries; the limit is {MAX_FETCH_PARTITIONS}",
            )
        if not 0 <= request.max_wait_ms <= MAX_FETCH_WAIT_MS:
            _fail(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"max_wait_ms must be within 0..{MAX_FETCH_WAIT_MS}, got {request.max_wait_ms}",
            )
        if not 0 <= request.max_bytes <= MAX_FETCH_RESPONSE_BYTES:
            _fail(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"max_bytes must be within 0..{MAX_FETCH_RESPONSE_BYTES}, got {request.max_bytes}",
            )
        if request.min_bytes < 0:
            _fail(grpc.StatusCode.INVALID_ARGUMENT, f"min_bytes must be >= 0, got {request.min_bytes}")
        if request.HasField("replica_id") and request.replica_id < 0:
            _fail(grpc.StatusCode.INVALID_ARGUMENT, f"replica_id must be a broker id (>= 0), got {request.replica_id}")
        replica = request.HasField("replica_id")
        for i, p in enumerate(request.partitions):
            _check_log_name(p.topic, f"partitions[{i}].topic", internal=replica)
            _check_partition(p.partition, f"partitions[{i}].partition")
            if p.offset < 0:
                _fail(grpc.StatusCode.INVALID_ARGUMENT, f"partitions[{i}].offset must be >= 0, got {p.offset}")
            if not 0 <= p.max_bytes <= MAX_FETCH_RESPONSE_BYTES:
                _fail(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"partitions[{i}].max_bytes must be within 0..{MAX_FETCH_RESPONSE_BYTES}, got {p.max_bytes}",
                )

    async def _read_all(
        self, request: pb.FetchRequest, total_limit: int
    ) -> tuple[list[tuple[pb.FetchPartitionResult, bytes]], int]:
        """Per partition: the result without its records, and the records (framed later)."""
        node = self._node
        replication = node.replication
        replica_id = request.replica_id if request.HasField("replica_id") else None
        total = 0
        results: list[tuple[pb.FetchPartitionResult, bytes]] = []
        for p in request.partitions:
            result = pb.FetchPartitionResult(topic=p.topic, partition=p.partition)
            data = b""
            try:
                plog = node.logs.get(p.topic, p.partition)
            except UnknownPartitionError:
                result.error, result.error_message = await self._not_here(p.topic, p.partition)
                results.append((result, data))
                continue
            # Batches of acks=all produces are readable once durable (see PartitionLog)
            max_offset = None
            result.high_watermark = plog.visible_end_offset
            result.log_start_offset = plog.log_start_offset
            replica = replication.get(p.topic, p.partition)
            if replica is not None or replica_id is not None:
                # replicated: consumers read below the high watermark, followers up to the log end
                if not self._replicated_read(replica, replica_id, p, result):
                    results.append((result, data))
                    continue
                if replica_id is None:
                    max_offset = result.high_watermark
            # Kafka's rule: the first partition with data returns at least one whole batch even
            # when it exceeds the limits, so a consumer can never get stuck behind a large batch.
            remaining = total_limit - total
            limit = min(p.max_bytes or total_limit, remaining)
            if limit <= 0 and total > 0:
                results.append((result, data))
                continue
            try:
                data = plog.read(p.offset, max(limit, 1), max_offset=max_offset)
            except OffsetOutOfRangeError:
                result.error = pb.OFFSET_OUT_OF_RANGE
                result.error_message = (
                    f"offset {p.offset} is out of range for {p.topic}[{p.partition}]: "
                    f"log start {plog.log_start_offset}, log end {plog.log_end_offset}"
                )
            except CorruptLogError as e:
                # already logged where it was found; the consumer learns partition and offsets
                result.error = pb.CORRUPT_DATA
                result.error_message = f"broker {node.broker_id}: {e}"
            except LogError as e:
                result.error = pb.STORAGE_ERROR
                result.error_message = f"broker {node.broker_id}: {e}"
                log.error("fetch read failed", topic=p.topic, partition=p.partition, error=str(e))
            else:
                total += len(data)
            results.append((result, data))
        return results, total

    def _replicated_read(
        self, replica: Replica | None, replica_id: int | None, p: pb.FetchPartition, result: pb.FetchPartitionResult
    ) -> bool:
        """Fill a replicated partition's result (high watermark; for a follower's fetch also the
        log end, epoch and epoch starts, and its position recorded). False: an error is set."""
        node = self._node
        if replica is None or replica.leading is None:
            result.error = pb.NOT_LEADER
            result.error_message = (replica.not_leader_message(node.broker_id) if replica is not None else
                                    f"broker {node.broker_id} does not lead {p.topic}[{p.partition}] as a replicated partition")
            return False
        manager = node.replication
        epoch = p.current_leader_epoch if p.HasField("current_leader_epoch") else -1
        code = manager.check_fetch_epoch(replica, epoch)
        if code != pb.NONE:
            result.error = code
            result.error_message = (f"{p.topic}[{p.partition}]: the fetch names leader epoch {epoch}, broker "
                                    f"{node.broker_id} leads at epoch {replica.leader_epoch}")
            return False
        plog = replica.plog
        if replica_id is not None:
            try:
                manager.on_replica_fetch(replica, replica_id, p.offset)
            except KeyError:
                result.error = pb.NOT_LEADER
                result.error_message = (f"broker {replica_id} is not a replica of {p.topic}[{p.partition}] "
                                        f"(replicas {list(replica.state.replicas)})")
                return False
            except ValueError:
                result.error = pb.OFFSET_OUT_OF_RANGE
                result.error_message = (f"offset {p.offset} is beyond the log end {plog.log_end_offset} of "
                                        f"{p.topic}[{p.partition}] on its leader: truncate to the leader's history")
                result.log_end_offset = plog.log_end_offset
                return False
            result.log_end_offset = plog.log_end_offset
            result.leader_epoch = replica.leader_epoch
            entries = replica.cache.entries
            first = max((i for i, e in enumerate(entries) if e.start_offset <= p.offset), default=0)
            result.epochs.extend(pb.EpochStart(epoch=e.epoch, start_offset=e.start_offset) for e in entries[first:])
        result.high_watermark = manager.high_watermark(replica)
        return True

    @_loaded
    async def Fetch(self, request: pb.FetchRequest, context: grpc.aio.ServicerContext[pb.FetchRequest, bytes]) -> bytes:
        """Answers a serialised FetchResponse (registered without a response serializer, see
        BrokerNode.add_to_server): framing it by hand copies the records once, not three times."""
        self._validate_fetch(request)
        deadline = time.monotonic() + request.max_wait_ms / 1000
        keys = [(p.topic, p.partition) for p in request.partitions]
        min_bytes = max(request.min_bytes, 1)
        wanted = request.max_bytes or DEFAULT_FETCH_MAX_BYTES
        what = f"fetch of up to {wanted} bytes"
        while True:
            # Reserve before reading, so the answer's bytes never exist unaccounted; a fetch gets at
            # most the budget's per-request share (and answers with less data, not an error).
            lease = await self._reserve(wanted, context, what)
            try:
                # No turn here (memory_budget rule 3 is for produce): an empty fetch reserves the
                # most it may get, and _read_all() may wait on the coordinator for a leader hint.
                results, total = await self._read_all(request, max(lease.size, 1))
                lease.resize(total)  # more only when one whole batch exceeded the limit (Kafka's rule)
                remaining_s = deadline - time.monotonic()
                if total >= min_bytes or remaining_s <= 0 or any(r.error for r, _ in results):
                    answer = frame_fetch_response(results)
                    if not request.HasField("replica_id"):  # followers' fetches are replication, not bytes out
                        for result, data in results:
                            if data:
                                self.traffic.fetched(result.topic, data)
                                self._node.stage_trace.mark("consumer_answer", result.topic, result.partition,
                                                            result.high_watermark)
                    # Held until gRPC is done with the answer (sent, or the call ended), not just
                    # until this handler returns: an unread answer still occupies memory.
                    # grpc-stubs 1.53 declares DoneCallback a class, not a Protocol: no function matches it
                    context.add_done_callback(lambda _ctx, lease=lease: lease.release())  # type: ignore[arg-type]
                    return answer
            except BaseException:
                lease.release()
                raise
            lease.release()
            await self.notifier.wait_any(keys, remaining_s)

    # -- offsets ---------------------------------------------------------------------------------

    @_loaded
    async def ListOffsets(
        self, request: pb.ListOffsetsRequest, context: grpc.aio.ServicerContext[pb.ListOffsetsRequest, pb.ListOffsetsResponse]
    ) -> pb.ListOffsetsResponse:
        if len(request.queries) > MAX_FETCH_PARTITIONS:
            _fail(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"queries has {len(request.queries)} entries; the limit is {MAX_FETCH_PARTITIONS}",
            )
        answers = []
        for i, q in enumerate(request.queries):
            _check_topic(q.topic, f"queries[{i}].topic")
            _check_partition(q.partition, f"queries[{i}].partition")
            if q.timestamp_ms < -2:
                _fail(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"queries[{i}].timestamp_ms must be -2 (earliest), -1 (latest) or >= 0, got {q.timestamp_ms}",
                )
            answer = pb.OffsetAnswer(topic=q.topic, partition=q.partition)
            try:
                plog = self._node.logs.get(q.topic, q.partition)
            except UnknownPartitionError:
                answer.error, answer.error_message = await self._not_here(q.topic, q.partition)
                answers.append(answer)
                continue
            end = plog.log_end_offset
            replica = self._node.replication.get(q.topic, q.partition)
            if replica is not None:
                if replica.leading is None:
                    answer.error = pb.NOT_LEADER
                    answer.error_message = replica.not_leader_message(self._node.broker_id)
                    answers.append(answer)
                    continue
                end = self._node.replication.high_watermark(replica)  # what consumers can read
            answer.log_start_offset = plog.log_start_offset
            answer.log_end_offset = end
            if q.timestamp_ms == EARLIEST:
                answer.offset = plog.log_start_offset
            elif q.timestamp_ms == LATEST:
                answer.offset = end
            else:
                found = plog.offset_for_time(q.timestamp_ms)
                answer.offset = end if found is None or found > end else found
            answers.append(answer)
        return pb.ListOffsetsResponse(answers=answers)

    @_loaded
    async def CommitOffsets(
        self,
        request: pb.CommitOffsetsRequest,
        context: grpc.aio.ServicerContext[pb.CommitOffsetsRequest, pb.CommitOffsetsResponse],
    ) -> pb.CommitOffsetsResponse:
        _check_group(request.group_id)
        _checked(names.check_member_id, request.member_id, "member_id")
        if not request.offsets:
            _fail(grpc.StatusCode.INVALID_ARGUMENT, "offsets must name at least one partition")
        if len(request.offsets) > MAX_COMMIT_PARTITIONS:
            _fail(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"offsets has {len(request.offsets)} entries; the limit is {MAX_COMMIT_PARTITIONS}",
            )
        by_topic: dict[str, list[int]] = {}
        rows: list[tuple[str, int, int, str]] = []
        for i, o in enumerate(request.offsets):
            _check_topic(o.topic, f"offsets[{i}].topic")
            _check_partition(o.partition, f"offsets[{i}].partition")
            if len(o.metadata) > MAX_OFFSET_METADATA_CHARS:
                _fail(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"offsets[{i}].metadata is {len(o.metadata)} characters; the limit is {MAX_OFFSET_METADATA_CHARS}",
                )
            plog = await self._log_for(o.topic, o.partition)
            if not 0 <= o.offset <= plog.log_end_offset:
                _fail(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"offsets[{i}].offset must be within 0..{plog.log_end_offset} (the log end of "
                    f"{o.topic}[{o.partition}]), got {o.offset}",
                )
            by_topic.setdefault(o.topic, []).append(o.partition)
            rows.append((o.topic, o.partition, o.offset, o.metadata))
        for topic, partitions in by_topic.items():
            await self._node.check_ownership(request.group_id, request.member_id, request.generation, topic, partitions,
                                            member_secret=request.member_secret)
        await self._node.offsets.commit(request.group_id, rows)
        log.debug("offsets committed", group=request.group_id, member=request.member_id, count=len(rows))
        return pb.CommitOffsetsResponse()

    @_loaded
    async def FetchCommittedOffsets(
        self,
        request: pb.FetchCommittedOffsetsRequest,
        context: grpc.aio.ServicerContext[pb.FetchCommittedOffsetsRequest, pb.FetchCommittedOffsetsResponse],
    ) -> pb.FetchCommittedOffsetsResponse:
        _check_group(request.group_id)
        store = self._node.offsets
        out = []
        if len(request.partitions) > MAX_COMMIT_PARTITIONS:
            _fail(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"partitions has {len(request.partitions)} entries; the limit is {MAX_COMMIT_PARTITIONS}",
            )
        replication = self._node.replication
        if request.partitions:
            for i, tp in enumerate(request.partitions):
                _check_topic(tp.topic, f"partitions[{i}].topic")
                _check_partition(tp.partition, f"partitions[{i}].partition")
            for tp in request.partitions:
                # Only the leader's view is current: a follower copies the commits' log without
                # applying it, and answering from an old view would rewind the group.
                r = replication.get(tp.topic, tp.partition)
                if r is not None and r.leading is None:
                    _fail(grpc.StatusCode.UNAVAILABLE, r.not_leader_message(self._node.broker_id))
            for tp in request.partitions:
                c = store.get(request.group_id, tp.topic, tp.partition)
                out.append(
                    pb.PartitionOffset(
                        topic=tp.topic,
                        partition=tp.partition,
                        offset=-1 if c is None else c.offset,
                        metadata="" if c is None else c.metadata,
                    )
                )
        else:
            for (topic, partition), c in sorted(store.for_group(request.group_id).items()):
                r = replication.get(topic, partition)
                if r is not None and r.leading is None:
                    continue  # "every partition this broker holds": the ones it leads
                out.append(pb.PartitionOffset(topic=topic, partition=partition, offset=c.offset, metadata=c.metadata))
        return pb.FetchCommittedOffsetsResponse(offsets=out)

    @_loaded
    async def DescribeLogs(
        self, request: pb.DescribeLogsRequest, context: grpc.aio.ServicerContext[pb.DescribeLogsRequest, pb.DescribeLogsResponse]
    ) -> pb.DescribeLogsResponse:
        logs = self._node.logs
        if len(request.partitions) > MAX_FETCH_PARTITIONS:
            _fail(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"partitions has {len(request.partitions)} entries; the limit is {MAX_FETCH_PARTITIONS}",
            )
        for i, tp in enumerate(request.partitions):
            _check_topic(tp.topic, f"partitions[{i}].topic")
            _check_partition(tp.partition, f"partitions[{i}].partition")
        keys = [(tp.topic, tp.partition) for tp in request.partitions] or sorted(logs.partitions())
        out = []
        for topic, partition in keys:
            info = pb.LogInfo(topic=topic, partition=partition)
            try:
                plog = logs.get(topic, partition)
            except UnknownPartitionError:
                info.error = pb.UNKNOWN_TOPIC_OR_PARTITION
            else:
                if request.verify:
                    # reads every byte: in a thread, so other requests go on meanwhile
                    try:
                        report = await asyncio.to_thread(plog.verify)
                    except LogError as e:  # one partition's I/O error does not hide the others
                        info.error = pb.STORAGE_ERROR
                        info.status_detail = str(e)
                        out.append(info)
                        continue
                    info.problems.extend(report.problems)
                    info.indexes_rebuilt.extend(report.indexes_rebuilt)
                    info.batches_checked = report.batches
                info.log_start_offset = plog.log_start_offset
                info.log_end_offset = plog.log_end_offset
                info.size_bytes = plog.size_bytes
                info.segment_count = plog.segment_count
                info.status = plog.status
                if plog.corruption is not None:
                    info.status_detail = str(plog.corruption)
            out.append(info)
        return pb.DescribeLogsResponse(logs=out)

    @_loaded
    async def FindTrace(
        self, request: pb.FindTraceRequest, context: grpc.aio.ServicerContext[pb.FindTraceRequest, pb.FindTraceResponse]
    ) -> pb.FindTraceResponse:
        try:
            trace_id = records.check_record_id(request.trace_id, "trace_id")
        except records.InvalidRecordIdError as e:
            _fail(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if not 0 <= request.max_records <= TRACE_RECORDS_MAX:
            _fail(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"max_records must be within 0..{TRACE_RECORDS_MAX} (0 = {TRACE_RECORDS_DEFAULT}), got {request.max_records}",
            )
        # Reads index files and batches: in a thread, so other requests go on meanwhile.
        return await asyncio.to_thread(self._find_trace, trace_id, request.max_records or TRACE_RECORDS_DEFAULT)

    def _find_trace(self, trace_id: str, max_records: int) -> pb.FindTraceResponse:
        logs = self._node.logs
        answer = pb.FindTraceResponse()
        left, size = max_records, 0
        for topic, partition in sorted(logs.partitions()):
            try:
                plog = logs.get(topic, partition)
                found, more = plog.find_trace(trace_id, left)
            except (UnknownPartitionError, LogClosedError):
                continue  # deleted meanwhile, or the broker is stopping
            if found:
                raws = {id(raw): raw for _, raw in found}
                answer.partitions.append(
                    pb.TracePartition(
                        topic=topic, partition=partition, offsets=[o for o, _ in found], records=b"".join(raws.values())
                    )
                )
                left -= len(found)
                size += sum(map(len, raws.values()))
            if more or left == 0 or size > TRACE_ANSWER_MAX_BYTES:
                answer.truncated = more or left == 0 or size > TRACE_ANSWER_MAX_BYTES
                break
        return answer

    # -- internal: called by the coordinator -------------------------------------------------------

    @_guarded
    async def CreatePartitions(
        self,
        request: pb.CreatePartitionsRequest,
        context: grpc.aio.ServicerContext[pb.CreatePartitionsRequest, pb.CreatePartitionsResponse],
    ) -> pb.CreatePartitionsResponse:
        _check_topic_partitions(request.topic, request.partitions)
        _check_topic_config(request.config)
        _check_states(request.states)
        if request.states and [(st.topic, st.partition) for st in request.states] != [
            (request.topic, p) for p in request.partitions
        ]:
            _fail(grpc.StatusCode.INVALID_ARGUMENT,
                  "states must describe the partitions, in their order (same topic, same partition numbers)")
        self._node.create_partitions(request)
        return pb.CreatePartitionsResponse()

    @_loaded
    async def UpdatePartitionStates(
        self,
        request: pb.UpdatePartitionStatesRequest,
        context: grpc.aio.ServicerContext[pb.UpdatePartitionStatesRequest, pb.UpdatePartitionStatesResponse],
    ) -> pb.UpdatePartitionStatesResponse:
        _check_states(request.states)
        node = self._node
        if request.controller_epoch < node.controller_epoch:  # Kafka's controller epoch fencing
            _fail(grpc.StatusCode.FAILED_PRECONDITION,
                  f"controller_epoch {request.controller_epoch} is older than {node.controller_epoch}, the current "
                  "coordinator's: this coordinator was deposed; nothing applied")
        node.controller_epoch = request.controller_epoch
        return pb.UpdatePartitionStatesResponse(errors=node.replication.apply(request.states))

    @_loaded
    async def OffsetForLeaderEpoch(
        self,
        request: pb.OffsetForLeaderEpochRequest,
        context: grpc.aio.ServicerContext[pb.OffsetForLeaderEpochRequest, pb.OffsetForLeaderEpochResponse],
    ) -> pb.OffsetForLeaderEpochResponse:
        """A follower's question (KIP-101 / KIP-279): where `leader_epoch` ends in this leader's log."""
        if len(request.queries) > MAX_FETCH_PARTITIONS:
            _fail(grpc.StatusCode.INVALID_ARGUMENT,
                  f"queries has {len(request.queries)} entries; the limit is {MAX_FETCH_PARTITIONS}")
        node = self._node
        out = []
        for i, q in enumerate(request.queries):
            _check_log_name(q.topic, f"queries[{i}].topic", internal=True)
            _check_partition(q.partition, f"queries[{i}].partition")
            answer = pb.EpochEndOffset(topic=q.topic, partition=q.partition, leader_epoch=-1, end_offset=-1)
            replica = node.replication.get(q.topic, q.partition)
            if replica is None or replica.leading is None:
                answer.error = pb.NOT_LEADER
                answer.error_message = (replica.not_leader_message(node.broker_id) if replica is not None else
                                        f"broker {node.broker_id} does not lead {q.topic}[{q.partition}] as a replicated partition")
            elif (code := node.replication.check_fetch_epoch(replica, q.current_leader_epoch)) != pb.NONE:
                answer.error = code
                answer.error_message = (f"{q.topic}[{q.partition}]: the query names leader epoch "
                                        f"{q.current_leader_epoch}, broker {node.broker_id} leads at epoch {replica.leader_epoch}")
            else:
                answer.leader_epoch, answer.end_offset = replica.cache.end_offset_for(
                    q.leader_epoch, replica.plog.log_end_offset)
            out.append(answer)
        return pb.OffsetForLeaderEpochResponse(results=out)

    @_guarded
    async def DeletePartitions(
        self,
        request: pb.DeletePartitionsRequest,
        context: grpc.aio.ServicerContext[pb.DeletePartitionsRequest, pb.DeletePartitionsResponse],
    ) -> pb.DeletePartitionsResponse:
        _check_topic_partitions(request.topic, request.partitions)
        await self._node.delete_partitions(request.topic, set(request.partitions) or None)
        return pb.DeletePartitionsResponse()

    @_loaded
    async def DeleteGroupOffsets(
        self,
        request: pb.DeleteGroupOffsetsRequest,
        context: grpc.aio.ServicerContext[pb.DeleteGroupOffsetsRequest, pb.DeleteGroupOffsetsResponse],
    ) -> pb.DeleteGroupOffsetsResponse:
        _check_group(request.group_id)
        removed = await self._node.offsets.delete_group(request.group_id)
        log.info("group offsets deleted", group=request.group_id, partitions=removed)
        return pb.DeleteGroupOffsetsResponse()
