"""Writing records to a topic's dead-letter topic, `<topic>.dlq`.

The dead-letter topic is an ordinary topic with one partition, created on demand through the
coordinator (the broker already talks to it). A dead letter keeps the record's key, value,
timestamp and headers, and adds headers that say why it is there:

    dmq.dlq.topic / .partition / .offset   where the record came from
    dmq.dlq.group                          the queue group that gave up on it
    dmq.dlq.attempts                       failed deliveries (0 for a record that expired unread)
    dmq.dlq.error                          the last error a worker reported (or why it expired)
    dmq.dlq.reason                         rejected | max-delivery-attempts | expired

The write is acknowledged only when durable (acks=all, fsynced on the leader) and before the
group moves past the record, so a crash in between leaves the record where it was: it may then be
dead-lettered twice, never lost.

When the dead-letter partition lives on another broker, the record goes there with an ordinary
Produce call; those channels are owned here and closed by `close()`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc
import structlog

from dmq.broker.log import UnknownPartitionError
from dmq.broker.queue.ports import TopicPort
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import names, records
from dmq.proto.grpc_options import channel_options
from dmq.proto.server.server_errors import fail

log = structlog.get_logger(__name__)

DLQ_SUFFIX = ".dlq"
HEADER_PREFIX = "dmq.dlq."
PRODUCE_TIMEOUT_S = 10.0
REASON_REJECTED = "rejected"
REASON_MAX_ATTEMPTS = "max-delivery-attempts"
REASON_EXPIRED = "expired"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    record: records.Record
    attempts: int
    error: str
    reason: str


@dataclass(frozen=True, slots=True)
class Written:
    topic: str
    partition: int
    base_offset: int


def dlq_topic_for(topic: str) -> str:
    return topic + DLQ_SUFFIX


def encode_dead_letters(source_topic: str, partition: int, group: str, letters: Sequence[DeadLetter]) -> bytes:
    """One batch of dead letters, each with the source record's data and the dmq.dlq.* headers."""
    headers = []
    for d in letters:
        r = d.record
        headers.append(
            (
                *r.headers,
                (HEADER_PREFIX + "topic", source_topic.encode()),
                (HEADER_PREFIX + "partition", str(partition).encode()),
                (HEADER_PREFIX + "offset", str(r.offset).encode()),
                (HEADER_PREFIX + "group", group.encode()),
                (HEADER_PREFIX + "attempts", str(d.attempts).encode()),
                (HEADER_PREFIX + "error", d.error.encode()),
                (HEADER_PREFIX + "reason", d.reason.encode()),
            )
        )
    return records.encode(
        [d.record.value for d in letters],
        keys=[d.record.key for d in letters],
        headers=headers,
        timestamps=[d.record.timestamp for d in letters],
        max_record_bytes=records.DEFAULT_MAX_BATCH_BYTES,
    )


class DeadLetterWriter:
    def __init__(self, node: TopicPort, *, appended: Callable[[str, int], None]) -> None:
        self._node = node
        self._appended = appended  # the queue manager's: pops waiting on the dead-letter topic wake
        self._channels: dict[str, grpc.aio.Channel] = {}

    def __repr__(self) -> str:
        return f"<DeadLetterWriter remote_channels={len(self._channels)}>"

    async def write(self, source_topic: str, partition: int, group: str, letters: Sequence[DeadLetter]) -> Written:
        """Append the dead letters durably to `<source_topic>.dlq`; RpcAbort when that cannot be done."""
        dlq = dlq_topic_for(source_topic)
        try:
            names.check_topic_name(dlq, field="topic")
        except names.FieldError:
            fail(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"topic {source_topic!r} has no room for a dead-letter topic: {dlq!r} would be longer "
                f"than {names.TOPIC_NAME_MAX_BYTES} bytes; use a shorter topic name for queues",
            )
        batch = encode_dead_letters(source_topic, partition, group, letters)
        node = self._node
        try:
            plog = node.logs.get(dlq, 0)
        except UnknownPartitionError:
            leader = await self._leader_of(dlq)
            if leader != node.address:
                return await self._produce_remote(leader, dlq, batch)
            plog = node.logs.get(dlq, 0)  # created here by the coordinator meanwhile
        info = await plog.append_durable(batch)
        node.notifier.notify(dlq, 0)
        self._appended(dlq, 0)
        return Written(dlq, 0, info.base_offset)

    async def _leader_of(self, dlq: str) -> str:
        """The dead-letter partition's leader, creating the topic when it does not exist."""
        try:
            info = await self._node.ensure_topic(dlq, partitions=1)
        except grpc.aio.AioRpcError as e:
            fail(
                grpc.StatusCode.UNAVAILABLE,
                f"cannot create the dead-letter topic {dlq!r} through the coordinator: "
                f"{e.code().name}: {e.details()}; retry",
            )
        for p in info.partitions:
            if p.partition == 0 and p.leader_address:
                return p.leader_address
        fail(grpc.StatusCode.UNAVAILABLE, f"the dead-letter topic {dlq!r} has no leader yet; retry")

    async def _produce_remote(self, address: str, dlq: str, batch: bytes) -> Written:
        channel = self._channels.get(address)
        if channel is None:
            channel = grpc.aio.insecure_channel(address, options=channel_options())
            self._channels[address] = channel
        started = time.monotonic()
        try:
            response = await pb_grpc.BrokerStub(channel).Produce(  # type: ignore[no-untyped-call]  # generated stubs are untyped
                pb.ProduceRequest(topic=dlq, partition=0, batch=batch, acks=pb.ACKS_ALL), timeout=PRODUCE_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as e:
            fail(
                grpc.StatusCode.UNAVAILABLE,
                f"writing to the dead-letter topic {dlq!r} at {address} failed: {e.code().name}: {e.details()}; retry",
            )
        log.debug("dead letters sent", topic=dlq, leader=address, ms=round((time.monotonic() - started) * 1000, 1))
        return Written(dlq, 0, response.base_offset)

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close(None)
