"""Offset RPCs to the partitions' leaders: commit, read committed offsets, list offsets.

Commits go to each partition's leading broker (offsets live next to the data), which asks the
coordinator whether the member still owns the partition. A refusal (FAILED_PRECONDITION: not
owner / stale generation, or NOT_FOUND: the member is gone) becomes CommitFailedError, whose
message says which settings to change. Requests are grouped per (topic, leader): one
CommitOffsets names one group, and a group is one topic.

Synchronous calls retry retriable errors (broker restarting, leader moved: the metadata cache is
invalidated first) with retry_backoff_ms pauses until request_timeout_ms; asynchronous commits
are sent once, like Kafka's commitAsync, since a later commit supersedes them anyway.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import structlog

from dmq.client._cluster import Cluster
from dmq.client.consumer._config import ConsumerConfig
from dmq.client.consumer._group import Membership
from dmq.client.consumer._records import OffsetAndMetadata, TopicPartition
from dmq.client.errors import (
    BrokerUnavailableError,
    CommitFailedError,
    DMQError,
    DMQTimeoutError,
    IllegalStateError,
    NotLeaderError,
    OffsetOutOfRangeError,
    UnknownPartitionError,
    UnknownServerError,
    from_rpc_error,
)
from dmq.proto import dmq_pb2 as pb

log = structlog.get_logger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _CommitCall:
    address: str
    membership: Membership
    request: pb.CommitOffsetsRequest
    offsets: dict[TopicPartition, OffsetAndMetadata]


class OffsetClient:
    def __init__(self, cluster: Cluster, config: ConsumerConfig) -> None:
        self._cluster = cluster
        self._config = config
        self._timeout_s = config.request_timeout_ms / 1000

    # -- retry helper ------------------------------------------------------------------------------

    def _retrying(self, what: str, topics: Iterable[str], fn: Callable[[], T], retry: bool = True) -> T:
        if not retry:
            try:
                return fn()
            except DMQError as e:
                if e.invalid_metadata:
                    for t in set(topics):
                        self._cluster.invalidate(t)
                raise
        deadline = time.monotonic() + self._timeout_s
        delay_s = self._config.retry_backoff_ms / 1000
        while True:
            try:
                return fn()
            except DMQError as e:
                if not e.retriable or time.monotonic() + delay_s > deadline:
                    if e.retriable:
                        raise DMQTimeoutError(
                            f"{what} did not succeed within request_timeout_ms "
                            f"({self._config.request_timeout_ms}): {e}"
                        ) from e
                    raise
                if e.invalid_metadata:
                    for t in set(topics):
                        self._cluster.invalidate(t)
                log.info("retrying", what=what, error=str(e), delay_ms=int(delay_s * 1000))
                time.sleep(delay_s)
                delay_s = min(delay_s * 2, 1.0)

    def _leaders(self, tps: Iterable[TopicPartition]) -> dict[tuple[str, str], list[TopicPartition]]:
        """Partitions grouped by (topic, leader address)."""
        out: dict[tuple[str, str], list[TopicPartition]] = {}
        for tp in tps:
            out.setdefault((tp.topic, self._cluster.leader_for(tp.topic, tp.partition)), []).append(tp)
        return out

    # -- commits -----------------------------------------------------------------------------------

    def _commit_calls(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata], memberships: Mapping[str, Membership]
    ) -> list[_CommitCall]:
        calls = []
        for (topic, address), tps in self._leaders(offsets).items():
            m = memberships.get(topic)
            if m is None or not m.joined:
                raise IllegalStateError(
                    f"cannot commit {topic}: this consumer is not a member of its group "
                    f"(subscribe() to {topic!r} first, and poll() until it is assigned)"
                )
            request = pb.CommitOffsetsRequest(
                group_id=m.group_id,
                member_id=m.member_id,
                generation=m.generation,
                offsets=[
                    pb.PartitionOffset(topic=tp.topic, partition=tp.partition, offset=offsets[tp].offset,
                                       metadata=offsets[tp].metadata)
                    for tp in tps
                ],
            )
            calls.append(_CommitCall(address, m, request, {tp: offsets[tp] for tp in tps}))
        return calls

    def _commit_error(self, e: grpc.RpcError, call: _CommitCall) -> DMQError:
        c = self._config
        code = e.code() if callable(getattr(e, "code", None)) else None
        where = ", ".join(str(tp) for tp in call.offsets)
        if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
            return CommitFailedError(
                f"commit of {where} for group {call.membership.group_id} was refused: {e.details()}. "
                f"This consumer no longer owns these partitions: the group rebalanced without it, "
                f"usually because poll() was not called within max_poll_interval_ms "
                f"({c.max_poll_interval_ms} ms) while the records of the previous poll were processed. "
                f"Raise max_poll_interval_ms, or lower max_poll_records ({c.max_poll_records}) so "
                f"each poll's records are processed sooner.",
                code=code.name,
                details=e.details(),
            )
        return from_rpc_error(e, context=f"CommitOffsets of {where} to broker {call.address}")

    def commit_sync(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata], memberships: Mapping[str, Membership]
    ) -> None:
        if not offsets:
            return

        def attempt() -> None:
            calls = self._commit_calls(offsets, memberships)
            futures = [
                (call, self._cluster.broker_stub(call.address).CommitOffsets.future(call.request, timeout=self._timeout_s))
                for call in calls
            ]
            first: DMQError | None = None
            for call, f in futures:
                try:
                    f.result()
                except grpc.RpcError as e:
                    err = self._commit_error(e, call)
                    if first is None or (first.retriable and not err.retriable):
                        first = err
            if first is not None:
                raise first

        self._retrying("commit", {tp.topic for tp in offsets}, attempt)

    def commit_async(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata], memberships: Mapping[str, Membership]
    ) -> concurrent.futures.Future[dict[TopicPartition, OffsetAndMetadata]]:
        """Send the commits once; the future resolves (on a gRPC thread) with the offsets."""
        result: concurrent.futures.Future[dict[TopicPartition, OffsetAndMetadata]] = concurrent.futures.Future()
        result.set_running_or_notify_cancel()
        offsets = dict(offsets)
        if not offsets:
            result.set_result(offsets)
            return result
        try:
            calls = self._commit_calls(offsets, memberships)
        except DMQError as e:
            result.set_exception(e)
            return result
        lock = threading.Lock()
        state: dict[str, Any] = {"pending": len(calls), "error": None}

        def done(call: _CommitCall, f: grpc.Future) -> None:
            err = None
            try:
                f.result()
            except grpc.RpcError as e:
                err = self._commit_error(e, call)
            except grpc.FutureCancelledError:
                err = DMQError("commit cancelled: the consumer closed")
            with lock:
                if err is not None and state["error"] is None:
                    state["error"] = err
                state["pending"] -= 1
                last = state["pending"] == 0
            if last:
                if state["error"] is not None:
                    result.set_exception(state["error"])
                else:
                    result.set_result(offsets)

        for call in calls:
            try:
                f = self._cluster.broker_stub(call.address).CommitOffsets.future(call.request, timeout=self._timeout_s)
            except (DMQError, ValueError) as e:
                result_err = e if isinstance(e, DMQError) else DMQError(f"commit not sent: {e}")
                with lock:
                    state["error"] = state["error"] or result_err
                    state["pending"] -= 1
                    last = state["pending"] == 0
                if last:
                    result.set_exception(state["error"])
                continue
            f.add_done_callback(lambda fut, call=call: done(call, fut))
        return result

    # -- reading -----------------------------------------------------------------------------------

    def fetch_committed(
        self, tps: Iterable[TopicPartition], group_ids: Mapping[str, str], *, retry: bool = True
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """Committed offsets of tps (None = nothing committed); group_ids maps topic -> group id.
        With retry=False a retriable failure is raised at once (the caller retries later)."""
        tps = list(tps)
        if not tps:
            return {}

        def attempt() -> dict[TopicPartition, OffsetAndMetadata | None]:
            out: dict[TopicPartition, OffsetAndMetadata | None] = {}
            for (topic, address), part in self._leaders(tps).items():
                request = pb.FetchCommittedOffsetsRequest(
                    group_id=group_ids[topic],
                    partitions=[pb.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in part],
                )
                try:
                    response = self._cluster.broker_stub(address).FetchCommittedOffsets(request, timeout=self._timeout_s)
                except grpc.RpcError as e:
                    raise from_rpc_error(e, context=f"FetchCommittedOffsets from broker {address}") from e
                for o in response.offsets:
                    out[TopicPartition(o.topic, o.partition)] = (
                        None if o.offset < 0 else OffsetAndMetadata(o.offset, o.metadata)
                    )
            return out

        return self._retrying("reading committed offsets", {tp.topic for tp in tps}, attempt, retry)

    def list_offsets(self, queries: Mapping[TopicPartition, int], *, retry: bool = True) -> dict[TopicPartition, int]:
        """ListOffsets: timestamp -2 = log start, -1 = log end, >= 0 = first offset appended at or
        after it (the log end when there is none)."""
        if not queries:
            return {}

        def attempt() -> dict[TopicPartition, int]:
            out: dict[TopicPartition, int] = {}
            for (_, address), part in self._leaders(queries).items():
                request = pb.ListOffsetsRequest(
                    queries=[pb.OffsetQuery(topic=tp.topic, partition=tp.partition, timestamp_ms=queries[tp]) for tp in part]
                )
                try:
                    response = self._cluster.broker_stub(address).ListOffsets(request, timeout=self._timeout_s)
                except grpc.RpcError as e:
                    raise from_rpc_error(e, context=f"ListOffsets from broker {address}") from e
                for a in response.answers:
                    tp = TopicPartition(a.topic, a.partition)
                    if a.error == pb.NONE:
                        out[tp] = a.offset
                    elif a.error == pb.NOT_LEADER:
                        raise NotLeaderError(a.error_message)
                    elif a.error == pb.UNKNOWN_TOPIC_OR_PARTITION:
                        raise UnknownPartitionError(a.error_message)
                    elif a.error == pb.OFFSET_OUT_OF_RANGE:
                        raise OffsetOutOfRangeError(a.error_message)
                    elif a.error == pb.STORAGE_ERROR:
                        raise BrokerUnavailableError(a.error_message)
                    else:
                        raise UnknownServerError(a.error_message)
            return out

        return self._retrying("listing offsets", {tp.topic for tp in queries}, attempt, retry)
