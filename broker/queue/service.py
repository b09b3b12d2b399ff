"""The queue RPCs of the Broker service: validate, call the QueueManager, build the answer.

`QueueServicer` is a servicer of its own, registered on the broker's server beside the others
(dmq.broker.servicers); it sees the broker through `QueueServiceHost`, not the node. Every field is
checked here before the manager sees it, so a bad request gets INVALID_ARGUMENT naming the field
and the limit. The manager refuses with DomainErrors (broker/queue/errors.py: a lease that is not
live, a full queue), which rpc_handler maps; storage failures are mapped by the broker's one
mapping (dmq.broker.storage_status).

Who may use a lease (dmq.proto.server.security.rpc_table, Access.HANDLER): a request that acks, nacks,
rejects or renews names only the lease id, so the lease's topic and group are looked up here and
checked with the call's `current_access` before the manager acts, with no await in between: read
on both, what QueuePop needs (its riding ack included); a reject also write on the dead-letter
topic. A lease id is a worker's secret: QueueDescribe shows it only to the group's readers.
Dead letters written because a record ran out of delivery attempts (a nack, an expiry) are the
broker's own writes, as the cluster principal: the topic's max_delivery_attempts asked for them.
"""

from __future__ import annotations

from typing import Any, Protocol

import grpc
import structlog

from dmq.broker.queue.dead_letters import DLQ_SUFFIX
from dmq.broker.queue.manager import QueueManager
from dmq.broker.queue.progress import MAX_ERROR_CHARS, QUEUE_GROUP_PREFIX
from dmq.broker.readiness import require_started
from dmq.broker.storage_status import translate_storage
from dmq.proto import dmq_pb2 as pb
from dmq.proto import limits, names
from dmq.proto.grpc_options import MAX_FETCH_RESPONSE_BYTES
from dmq.proto.security.acls import Operation, ResourceType
from dmq.proto.server.security.interceptor import current_access
from dmq.proto.server.security.rpc_table import Need
from dmq.proto.server.server_errors import RpcAbort, fail, rpc_handler

log = structlog.get_logger(__name__)

MAX_POP_RECORDS = 100_000
MAX_POP_WAIT_MS = 60_000
DEFAULT_POP_MAX_BYTES = 4 * 1024 * 1024
LEASE_ID_MAX_CHARS = 64
# A worker's error text is kept (progress, dead-letter header) up to MAX_ERROR_CHARS; far longer
# input is refused rather than silently cut.
MAX_ERROR_INPUT_CHARS = 16 * MAX_ERROR_CHARS


def _translate(servicer: QueueServicer, e: Exception) -> RpcAbort | None:
    return translate_storage(servicer._node.broker_id, e)


# Every queue RPC reads progress and leases loaded at start: UNAVAILABLE until then (dmq.broker.readiness).
_guarded = rpc_handler(log=log, translate=_translate, before=require_started)


# A broken shared rule (FieldError) is INVALID_ARGUMENT through rpc_handler (dmq.proto.server.server_errors).
def _check(check: Any, value: object, field: str) -> None:
    check(value, field=field)


def _check_group(group: str) -> None:
    names.check_id(group, "group", "queue group", names.GROUP_ID_MAX_BYTES - len(QUEUE_GROUP_PREFIX))


def _check_range(value: int, low: int, high: int, field: str, *, zero_ok: bool = False) -> None:
    if zero_ok and value == 0:
        return
    if not low <= value <= high:
        extra = " (or 0 for the default)" if zero_ok else ""
        fail(grpc.StatusCode.INVALID_ARGUMENT, f"{field} must be within {low}..{high}{extra}, got {value}")


def _check_lease_id(lease_id: str, field: str = "lease_id") -> None:
    if not lease_id or len(lease_id) > LEASE_ID_MAX_CHARS:
        fail(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{field} must be a lease id from QueuePop (1..{LEASE_ID_MAX_CHARS} characters), got {len(lease_id)} characters",
        )


def _check_error(error: str) -> None:
    if len(error) > MAX_ERROR_INPUT_CHARS:
        fail(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"error is {len(error)} characters; the limit is {MAX_ERROR_INPUT_CHARS} (the first {MAX_ERROR_CHARS} are kept)",
        )


def _readers(topic: str, group: str) -> list[Need]:
    """What QueuePop needs, and so whoever finishes or renews a lease of (topic, group)."""
    return [Need(ResourceType.TOPIC, topic, Operation.READ), Need(ResourceType.GROUP, group, Operation.READ)]


class QueueServiceHost(Protocol):
    """The broker as the queue RPCs see it: started yet (dmq.broker.readiness), its id, its queues."""

    @property
    def ready(self) -> bool: ...

    @property
    def broker_id(self) -> int: ...

    @property
    def queues(self) -> QueueManager: ...


class QueueServicer:
    """QueuePop / QueueAck / QueueNack / QueueReject / QueueRenew / QueueDescribe."""

    def __init__(self, node: QueueServiceHost) -> None:
        self._node = node  # `_node`: what require_started reads

    def __repr__(self) -> str:
        return f"<QueueServicer broker={self._node.broker_id}>"

    def _queues(self) -> QueueManager:
        return self._node.queues

    def _check_lease(self, lease_id: str, rpc: str, *, field: str = "lease_id", dead_letters: bool = False) -> None:
        """INVALID_ARGUMENT (naming `field`) unless lease_id is one QueuePop could have given, then
        PERMISSION_DENIED unless the caller may read the lease's topic and group (and, for a
        reject, write its dead-letter topic). A lease not live is left to the manager to refuse."""
        _check_lease_id(lease_id, field)
        lease = self._queues().lease_of(lease_id)
        if lease is None:
            return
        needs = _readers(lease.topic, lease.group)
        if dead_letters:
            needs.append(Need(ResourceType.TOPIC, lease.topic + DLQ_SUFFIX, Operation.WRITE))
        current_access.get().require(needs, rpc)

    @_guarded
    async def QueuePop(
        self, request: pb.QueuePopRequest, context: grpc.aio.ServicerContext[pb.QueuePopRequest, pb.QueuePopResponse]
    ) -> pb.QueuePopResponse:
        _check(names.check_topic_name, request.topic, "topic")
        _check_group(request.group)
        _check_range(request.max_records, 1, MAX_POP_RECORDS, "max_records")
        _check_range(request.lease_ms, limits.LEASE_MS_MIN, limits.LEASE_MS_MAX, "lease_ms", zero_ok=True)
        _check_range(request.timeout_ms, 0, MAX_POP_WAIT_MS, "timeout_ms")
        _check_range(request.max_bytes, 1, MAX_FETCH_RESPONSE_BYTES, "max_bytes", zero_ok=True)
        if request.ack_lease_id:  # may be another group's lease
            self._check_lease(request.ack_lease_id, "QueuePop", field="ack_lease_id")
        elif request.HasField("ack_up_to_offset"):
            fail(grpc.StatusCode.INVALID_ARGUMENT, "ack_up_to_offset needs ack_lease_id (the lease it acknowledges)")
        queues = self._queues()
        response = pb.QueuePopResponse()
        lease_ms = request.lease_ms or queues.default_lease_ms(request.topic)
        timeout_s = request.timeout_ms / 1000
        max_bytes = request.max_bytes or DEFAULT_POP_MAX_BYTES
        if request.ack_lease_id:
            up_to = request.ack_up_to_offset if request.HasField("ack_up_to_offset") else None
            response.acked_offset, popped = await queues.ack_and_pop(
                request.ack_lease_id, request.topic, request.group, request.max_records, lease_ms, timeout_s, max_bytes,
                up_to,
            )
        else:
            popped = await queues.pop(request.topic, request.group, request.max_records, lease_ms, timeout_s, max_bytes)
        if popped is None:
            return response
        lease = popped.lease
        response.lease_id = lease.lease_id
        response.partition = lease.partition
        response.start_offset = lease.start_offset
        response.end_offset = lease.end_offset
        response.expiry_ms = lease.expiry_ms
        response.lease_ms = lease.lease_ms
        response.delivery_count = popped.delivery_count
        response.records = popped.records
        return response

    @_guarded
    async def QueueAck(
        self, request: pb.QueueAckRequest, context: grpc.aio.ServicerContext[pb.QueueAckRequest, pb.QueueAckResponse]
    ) -> pb.QueueAckResponse:
        self._check_lease(request.lease_id, "QueueAck")
        up_to = request.up_to_offset if request.HasField("up_to_offset") else None
        acked = await self._queues().ack(request.lease_id, up_to, request.keep_lease)
        return pb.QueueAckResponse(acked_offset=acked)

    @_guarded
    async def QueueNack(
        self, request: pb.QueueNackRequest, context: grpc.aio.ServicerContext[pb.QueueNackRequest, pb.QueueNackResponse]
    ) -> pb.QueueNackResponse:
        self._check_lease(request.lease_id, "QueueNack")
        _check_error(request.error)
        failed = request.failed_offset if request.HasField("failed_offset") else None
        acked, count, dead = await self._queues().nack(request.lease_id, request.error, failed)
        return pb.QueueNackResponse(acked_offset=acked, delivery_count=count, dead_lettered=dead)

    @_guarded
    async def QueueReject(
        self, request: pb.QueueRejectRequest, context: grpc.aio.ServicerContext[pb.QueueRejectRequest, pb.QueueRejectResponse]
    ) -> pb.QueueRejectResponse:
        self._check_lease(request.lease_id, "QueueReject", dead_letters=True)
        _check_error(request.error)
        acked, written = await self._queues().reject(request.lease_id, request.offset, request.error)
        return pb.QueueRejectResponse(
            acked_offset=acked, dlq_topic=written.topic, dlq_partition=written.partition, dlq_offset=written.base_offset
        )

    @_guarded
    async def QueueRenew(
        self, request: pb.QueueRenewRequest, context: grpc.aio.ServicerContext[pb.QueueRenewRequest, pb.QueueRenewResponse]
    ) -> pb.QueueRenewResponse:
        self._check_lease(request.lease_id, "QueueRenew")
        _check_range(request.lease_ms, limits.LEASE_MS_MIN, limits.LEASE_MS_MAX, "lease_ms", zero_ok=True)
        return pb.QueueRenewResponse(expiry_ms=await self._queues().renew(request.lease_id, request.lease_ms))

    @_guarded
    async def QueueDescribe(
        self,
        request: pb.QueueDescribeRequest,
        context: grpc.aio.ServicerContext[pb.QueueDescribeRequest, pb.QueueDescribeResponse],
    ) -> pb.QueueDescribeResponse:
        if request.topic:
            _check(names.check_topic_name, request.topic, "topic")
        if request.group:
            _check_group(request.group)
        described = self._queues().describe(request.topic, request.group)
        access = current_access.get()
        for row in described.groups:
            if row.lease_id and not access.allows(_readers(row.topic, row.group)):
                row.lease_id = ""  # the worker's secret: the lease's size and expiry stay shown
        return described
