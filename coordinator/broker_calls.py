"""The metadata service's calls to brokers about their partitions: CreatePartitions when a topic
is created, grows or a partition gets a new replica, and DeletePartitions when they go; each call
bounded by the broker call timeout.

Broker answers to CreatePartitions (create topic, add partitions), two cases:
  1. Lost (unreachable, timed out, shutting down): the change stands; the broker gets its
     partitions when it next (re-)registers, as its session expires.
  2. Refused (any other status, e.g. RESOURCE_EXHAUSTED "disk full on broker N", or a reason such as
     storage-unavailable): the broker will not get the partitions by re-registering, so the change is
     undone (dmq.coordinator.topic_admin: store, memory, and DeletePartitions to the brokers, which may
     have created some) and the caller gets the broker's own status, message and reason
     (BrokerRefusedError): a retry once the cause is gone succeeds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from dmq.coordinator.broker_pool import BrokerPool
from dmq.coordinator.controller.pushes import partition_state
from dmq.coordinator.metadata_errors import MetadataError
from dmq.coordinator.metadata_proto import topic_config_to_proto
from dmq.coordinator.metastore.base import TopicRecord
from dmq.coordinator.topic_table import TopicTable, is_replicated
from dmq.proto import dmq_pb2 as pb
from dmq.proto import error_details
from dmq.proto.server.domain_errors import ErrorCode

log = structlog.get_logger(__name__)

DEFAULT_BROKER_CALL_TIMEOUT_MS = 5_000


@dataclass(frozen=True, slots=True)
class BrokerRefusal:
    """A broker's answer refusing a partition change (case 2 in the module docstring)."""

    broker_id: int
    code: grpc.StatusCode
    message: str
    reason: str | None


class BrokerRefusedError(MetadataError):
    """A topic change undone because a broker refused it; carries the broker's status and reason."""

    def __init__(self, refusal: BrokerRefusal, message: str, *, undone: bool) -> None:
        super().__init__(message)
        self.code = ErrorCode(refusal.code.name)  # the broker's status, relayed
        self.reason = refusal.reason
        self.refusal = refusal
        self.undone = undone  # False: the store could not undo it either (the message says what to do)


# Broker answers after which it gets its partitions anyway, at its next (re-)registration.
_LOST_CALL_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)


class BrokerCalls:
    """CreatePartitions / DeletePartitions to the brokers holding the partitions' replicas."""

    def __init__(
        self, broker_pool: BrokerPool, broker_address: Callable[[int], str | None], topics: TopicTable, *,
        broker_call_timeout_ms: int = DEFAULT_BROKER_CALL_TIMEOUT_MS,
    ) -> None:
        self.broker_pool = broker_pool
        self.broker_address = broker_address
        self.topics = topics
        self.broker_call_timeout_ms = broker_call_timeout_ms

    def partition_requests_for(self, broker_id: int) -> list[pb.CreatePartitionsRequest]:
        """One CreatePartitionsRequest per topic with replicas on the broker."""
        requests = []
        for topic in self.topics.sorted():
            partitions = topic.replicas_on(broker_id)
            if partitions:
                requests.append(self.create_request(topic, partitions))
        return requests

    def create_request(self, record: TopicRecord, partitions: list[int]) -> pb.CreatePartitionsRequest:
        """CreatePartitions for these partitions of the topic, with their states when it is replicated
        (is_replicated: otherwise an empty `states` keeps the unreplicated meaning)."""
        states = (
            [partition_state(record.name, p, record.states[p], self.broker_address) for p in partitions]
            if is_replicated(record)
            else []
        )
        return pb.CreatePartitionsRequest(
            topic=record.name,
            partitions=partitions,
            config=topic_config_to_proto(record.config),
            topic_partition_count=record.partition_count,
            states=states,
        )

    async def create_on_brokers(self, record: TopicRecord, partitions: Iterable[int]) -> BrokerRefusal | None:
        """Ask each broker to create its new partitions; the first refusal (by broker id), if any.
        A lost call is logged, not returned: the broker gets its partitions when it re-registers."""
        by_broker: dict[int, list[int]] = {}
        for p in partitions:
            for broker_id in record.states[p].replicas:
                by_broker.setdefault(broker_id, []).append(p)

        async def call(broker_id: int, parts: list[int]) -> BrokerRefusal | None:
            request = self.create_request(record, parts)
            return await self.call_broker(broker_id, "CreatePartitions", request, topic=record.name, partitions=parts)

        refusals = await asyncio.gather(*(call(b, parts) for b, parts in sorted(by_broker.items())))
        return next((r for r in refusals if r is not None), None)

    async def delete_on_brokers(self, record: TopicRecord, partitions: Iterable[int] | None = None) -> None:
        """Best effort (all of the topic's partitions, or `partitions`): a broker that misses the call
        keeps the files until an operator removes them."""
        wanted = set(record.states) if partitions is None else set(partitions)

        async def call(broker_id: int) -> None:
            parts = [p for p in record.replicas_on(broker_id) if p in wanted]
            request = pb.DeletePartitionsRequest(topic=record.name, partitions=parts)
            refusal = await self.call_broker(
                broker_id, "DeletePartitions", request, topic=record.name, partitions=parts
            )
            if refusal is not None:
                log.warning("broker DeletePartitions refused; its files stay", broker_id=broker_id,
                            topic=record.name, partitions=parts, code=refusal.code.name, error=refusal.message)

        await asyncio.gather(*(call(b) for b in sorted({b for p in wanted for b in record.states[p].replicas})))

    async def call_broker(self, broker_id: int, method: str, request: Any, **fields: Any) -> BrokerRefusal | None:
        """None when the broker did it or the call was lost (logged); its refusal otherwise."""
        address = self.broker_address(broker_id)
        if address is None:  # cannot happen: placement only uses registered brokers
            log.error("partition placed on an unknown broker", broker_id=broker_id, **fields)
            return None
        try:
            stub = self.broker_pool.stub(address)
            await getattr(stub, method)(request, timeout=self.broker_call_timeout_ms / 1000)
            return None
        except grpc.aio.AioRpcError as e:
            reason = error_details.reason_of(e.trailing_metadata())
            if e.code() in _LOST_CALL_CODES and reason is None:
                log.warning(
                    f"broker {method} failed; it gets its partitions when it re-registers",
                    broker_id=broker_id,
                    address=address,
                    code=e.code().name,
                    error=e.details(),
                    **fields,
                )
                return None
            return BrokerRefusal(broker_id, e.code(), e.details() or e.code().name, reason)
        except Exception:  # noqa: BLE001 - the topic is recorded either way; say what went wrong
            log.exception(f"broker {method} failed", broker_id=broker_id, address=address, **fields)
        return None
