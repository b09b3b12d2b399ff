"""The group coordinator's admin operations and the broker calls they (and `new` subscriptions) need.

`GroupBrokers` talks to the brokers that lead a topic's partitions: log end offsets for the snapshot
of a `new` subscription, committed offsets and log ends for DescribeGroup's lag, DeleteGroupOffsets
before a group is deleted. Its collaborators (the cluster metadata, the broker connection pool)
are passed in. `describe_to_proto` / `summaries_to_proto` translate the machine's views for the
admin RPCs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

import grpc
import structlog

from dmq.coordinator.broker_pool import BrokerPool
from dmq.coordinator.group import Group, GroupDescription, Subscription, SubscriptionMode
from dmq.coordinator.metadata import MetadataManager
from dmq.proto import dmq_pb2 as pb
from dmq.proto.offset_markers import EARLIEST, LATEST
from dmq.proto.server.server_errors import RpcAbort, fail

__all__ = ["GroupBrokers", "describe_to_proto", "summaries_to_proto"]

log = structlog.get_logger(__name__)

_MODE_TO_PROTO = {
    SubscriptionMode.ALL: pb.SUBSCRIPTION_MODE_ALL,
    SubscriptionMode.NEW: pb.SUBSCRIPTION_MODE_NEW,
    SubscriptionMode.TIMESTAMP: pb.SUBSCRIPTION_MODE_TIMESTAMP,
}


def subscription_to_proto(sub: Subscription) -> pb.Subscription:
    return pb.Subscription(mode=_MODE_TO_PROTO[sub.mode], from_ms=sub.from_ms or 0, created_ms=sub.created_ms)


class GroupBrokers:
    """Calls to the brokers leading a topic's partitions, on behalf of the group coordinator."""

    def __init__(self, metadata: MetadataManager, broker_pool: BrokerPool) -> None:
        self._metadata = metadata
        self._broker_pool = broker_pool

    def __repr__(self) -> str:
        return f"<GroupBrokers timeout_s={self.timeout_s}>"

    @property
    def timeout_s(self) -> float:
        return float(self._metadata.broker_call_timeout_ms) / 1000

    def leaders(self, topic: str, partitions: Iterable[int], *, need_alive: bool) -> dict[str, list[int]]:
        """partitions grouped by their leader's "host:port"; UNAVAILABLE when one has none (or,
        with need_alive, when its broker is down)."""
        record = self._metadata.topic(topic)
        if record is None:
            fail(grpc.StatusCode.NOT_FOUND, f"topic {topic!r} not found")
        by_address: dict[str, list[int]] = {}
        for p in partitions:
            broker_id = record.leader(p)
            address = None if broker_id is None else self._metadata.broker_address(broker_id)
            if (
                broker_id is None
                or address is None
                or (need_alive and not self._metadata.is_broker_alive(broker_id))
            ):
                fail(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the broker of {topic}[{p}] (broker {broker_id}) is not available: start it, then retry",
                )
            by_address.setdefault(address, []).append(p)
        return by_address

    async def latest_offsets(self, topic: str, partition_count: int) -> dict[int, int]:
        """Each partition's log end offset, for the snapshot of a `new` subscription."""
        by_address = self.leaders(topic, range(partition_count), need_alive=True)

        async def ask(address: str, parts: list[int]) -> list[pb.OffsetAnswer]:
            request = pb.ListOffsetsRequest(
                queries=[pb.OffsetQuery(topic=topic, partition=p, timestamp_ms=LATEST) for p in parts]
            )
            try:
                stub = self._broker_pool.stub(address)
                response = await stub.ListOffsets(request, timeout=self.timeout_s)
            except grpc.aio.AioRpcError as e:
                fail(
                    grpc.StatusCode.UNAVAILABLE,
                    f"cannot read the log end offsets of {topic} from {address} ({e.code().name}: {e.details()}): "
                    f"retry",
                )
            return list(response.answers)

        answers = await asyncio.gather(*(ask(a, ps) for a, ps in by_address.items()))
        offsets: dict[int, int] = {}
        for answer in (a for batch in answers for a in batch):
            if answer.error != pb.NONE:
                fail(
                    grpc.StatusCode.UNAVAILABLE,
                    f"cannot read the log end offset of {topic}[{answer.partition}]: {answer.error_message}: retry",
                )
            offsets[answer.partition] = answer.offset
        missing = sorted(set(range(partition_count)) - set(offsets))
        if missing:
            fail(grpc.StatusCode.UNAVAILABLE, f"no log end offset for {topic} partitions {missing}: retry")
        return offsets

    async def partition_offsets(
        self, group_id: str, topic: str, partition_count: int, sub: Subscription
    ) -> dict[int, tuple[int, int, int]]:
        """partition -> (committed offset, log end offset, start position of the subscription),
        one FetchCommittedOffsets and one ListOffsets per leading broker, concurrently. A broker
        that does not answer leaves its partitions out (logged)."""
        try:
            by_address = self.leaders(topic, range(partition_count), need_alive=False)
        except RpcAbort:
            return {}
        # ListOffsets timestamps: LATEST, EARLIEST, >= 0 the first offset at or after it.
        start_ts = sub.from_ms if sub.mode is SubscriptionMode.TIMESTAMP and sub.from_ms is not None else EARLIEST

        async def ask(address: str, parts: list[int]) -> dict[int, tuple[int, int, int]]:
            stub = self._broker_pool.stub(address)
            timeout = self.timeout_s
            committed_call = stub.FetchCommittedOffsets(
                pb.FetchCommittedOffsetsRequest(
                    group_id=group_id, partitions=[pb.TopicPartition(topic=topic, partition=p) for p in parts]
                ),
                timeout=timeout,
            )
            queries = [
                pb.OffsetQuery(topic=topic, partition=p, timestamp_ms=ts) for p in parts for ts in (LATEST, start_ts)
            ]
            offsets_call = stub.ListOffsets(pb.ListOffsetsRequest(queries=queries), timeout=timeout)
            try:
                committed_resp, offsets_resp = await asyncio.gather(committed_call, offsets_call)
            except grpc.aio.AioRpcError as e:
                log.warning("describe: broker did not answer", group=group_id, topic=topic, address=address,
                            partitions=parts, code=e.code().name, error=e.details())
                return {}
            committed = {o.partition: o.offset for o in committed_resp.offsets if o.topic == topic}
            answers = list(offsets_resp.answers)
            out = {}
            for i, p in enumerate(parts):
                latest, start = answers[2 * i], answers[2 * i + 1]
                if latest.error != pb.NONE or start.error != pb.NONE:
                    continue
                if sub.mode is SubscriptionMode.NEW:
                    start_offset = max(sub.start_position(p), start.log_start_offset)
                else:
                    start_offset = start.offset
                out[p] = (committed.get(p, -1), latest.offset, start_offset)
            return out

        results = await asyncio.gather(*(ask(a, ps) for a, ps in by_address.items()))
        merged: dict[int, tuple[int, int, int]] = {}
        for r in results:
            merged.update(r)
        return merged

    async def delete_offsets(self, group_id: str, topic: str) -> None:
        metadata = self._metadata
        record = metadata.topic(topic)
        if record is not None:
            down = sorted({b for b in record.placement.values() if not metadata.is_broker_alive(b)})
            if down:
                # Their offsets would outlive the group and come back when it is created again.
                fail(
                    grpc.StatusCode.UNAVAILABLE,
                    f"brokers {down} holding offsets of {topic!r} are down: start them, then delete the group",
                )
        addresses = [a for b in metadata.live_broker_ids() if (a := metadata.broker_address(b)) is not None]

        async def delete(address: str) -> None:
            try:
                await self._broker_pool.stub(address).DeleteGroupOffsets(
                    pb.DeleteGroupOffsetsRequest(group_id=group_id), timeout=self.timeout_s
                )
            except grpc.aio.AioRpcError as e:
                fail(
                    grpc.StatusCode.UNAVAILABLE,
                    f"could not delete the offsets of {group_id!r} on {address} ({e.code().name}: {e.details()}): "
                    f"the group is kept, retry",
                )

        await asyncio.gather(*(delete(a) for a in addresses))


def summaries_to_proto(groups: Iterable[Group]) -> list[pb.GroupSummary]:
    return [
        pb.GroupSummary(
            group_id=g.group_id,
            topic=g.topic,
            state=g.state.value,  # type: ignore[arg-type]  # protoc's .pyi omits the int an enum field takes
            generation=g.generation,
            member_count=len(g.members),
        )
        for g in groups
    ]


def describe_to_proto(d: GroupDescription, offsets: Mapping[int, tuple[int, int, int]]) -> pb.DescribeGroupResponse:
    """DescribeGroup's answer: the machine's description, with each partition's committed offset,
    log end and lag from `offsets` (GroupBrokers.partition_offsets)."""
    partitions = []
    total_lag = 0
    for p, owner in d.owners:
        committed, log_end, start = offsets.get(p, (-1, -1, -1))
        if log_end < 0:  # its broker did not answer: unknown, left out of the total
            lag = -1
        else:
            # Lag counts what the group has still to read: from the committed offset, or
            # where the subscription would start it when nothing is committed yet.
            position = committed if committed >= 0 else start
            lag = max(0, log_end - max(position, 0))
            total_lag += lag
        partitions.append(
            pb.PartitionLag(
                partition=p, committed_offset=committed, log_end_offset=log_end, lag=lag,
                owner_member_id=owner or "",
            )
        )
    return pb.DescribeGroupResponse(
        group_id=d.group_id,
        topic=d.topic,
        state=d.state.value,  # type: ignore[arg-type]  # protoc's .pyi omits the int an enum field takes
        generation=d.generation,
        subscription=subscription_to_proto(d.subscription),
        members=[
            pb.MemberDescription(
                member_id=m.member_id, client_id=m.client_id, host=m.host,
                partitions=m.partitions, target_partitions=m.target_partitions,
            )
            for m in d.members
        ],
        partitions=partitions,
        total_lag=total_lag,
    )
