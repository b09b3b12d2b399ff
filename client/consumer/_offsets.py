"""Offset RPCs to the partitions' leaders: commit, read committed offsets, list offsets.

Commits go to each partition's leading broker (offsets live next to the data), which asks the
coordinator whether the member still owns the partition. A refusal (FAILED_PRECONDITION: not
owner / stale generation, or NOT_FOUND: the member is gone) becomes CommitFailedError, whose
message says which settings to change. Requests are grouped per (topic, leader): one
CommitOffsets names one group, and a group is one topic.

Isolation: one broker never holds up the partitions of another. Every call is per broker, sent
in parallel, with its own deadline; the answers of healthy brokers are used as they come, and
only the partitions of a failing broker are retried (dmq.client._calls: retry_backoff_ms pauses,
doubling up to 1 s) until the caller's deadline. A synchronous call reports which partitions it finished
(``Outcome``), so a commit to three brokers of which one is dead still records the two others.

The building blocks are exposed for the consumers' PositionFinder and the asyncio consumer:
`*_request` building a request, `start_*` starting the call without waiting (through
`Cluster.start_unary`: a grpc future, or a task on the asyncio consumer's loop), `parse_*` reading
the answer and `commit_error` mapping a refused commit. The asyncio consumer awaits its own calls
with them; the blocking paths here (`commit_sync`, `fetch_committed`, `list_offsets`) are the sync
consumer's.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import grpc

from dmq.client._calls import CALL_CANCELLED, FanOut, PendingCall, RetryPolicy, fan_out_by_leader
from dmq.client._cluster import Cluster
from dmq.client._log import get_logger
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
    rpc_error_reason,
)
from dmq.proto import dmq_pb2 as pb
from dmq.proto import error_details

log = get_logger(__name__)

V = TypeVar("V")
A = TypeVar("A")  # a call's answer


@dataclass(frozen=True, slots=True)
class CommitCall:
    address: str
    membership: Membership
    request: pb.CommitOffsetsRequest
    offsets: dict[TopicPartition, OffsetAndMetadata]


@dataclass(slots=True)
class Outcome(Generic[V]):
    """What a per-broker synchronous call finished, and why the rest did not."""

    done: dict[TopicPartition, V] = field(default_factory=dict)
    errors: dict[TopicPartition, DMQError] = field(default_factory=dict)

    def error(self, what: str) -> DMQError | None:
        """One error for the unfinished partitions: the first non-retriable one, else a
        retriable one whose message names every partition left."""
        if not self.errors:
            return None
        fatal = next((e for e in self.errors.values() if not e.retriable), None)
        if fatal is not None:
            return fatal
        first = next(iter(self.errors.values()))
        left = ", ".join(sorted(str(tp) for tp in self.errors))
        try:
            return type(first)(f"{what} of {left} did not finish: {first}", code=first.code, details=first.details)
        except TypeError:  # a subclass with its own constructor
            return first


class OffsetClient:
    def __init__(self, cluster: Cluster, config: ConsumerConfig) -> None:
        self._cluster = cluster
        self._config = config
        self._timeout_s = config.request_timeout_ms / 1000
        self._retry = RetryPolicy(retry_backoff_ms=config.retry_backoff_ms, request_timeout_ms=config.request_timeout_ms)

    # -- helpers -----------------------------------------------------------------------------------

    def _leaders(
        self, tps: Iterable[TopicPartition], timeout_s: float
    ) -> tuple[dict[tuple[str, str], list[TopicPartition]], dict[TopicPartition, DMQError]]:
        """Partitions grouped by (topic, leader address), and those whose leader is unknown.
        Cached metadata is used while the coordinator is away (partitions never move)."""
        out: dict[tuple[str, str], list[TopicPartition]] = {}
        errors: dict[TopicPartition, DMQError] = {}
        for tp in tps:
            try:
                address = self._cluster.leader_for(tp.topic, tp.partition, timeout_s=timeout_s, allow_stale=True)
            except DMQError as e:
                errors[tp] = e
                continue
            out.setdefault((tp.topic, address), []).append(tp)
        return out, errors

    def _per_broker(
        self,
        what: str,
        tps: Iterable[TopicPartition],
        send: Callable[[str, str, list[TopicPartition], float], PendingCall[A]],
        parse: Callable[[A, str], Mapping[TopicPartition, V | DMQError]],
        error: Callable[[grpc.RpcError, str, list[TopicPartition]], DMQError],
        timeout_s: float | None,
        retry: bool = True,
    ) -> Outcome[V]:
        """Run one call per (topic, broker) in parallel until every partition is done or failed
        for good, or the deadline passes (dmq.client._calls.fan_out_by_leader). Never raises for
        a partition: see the Outcome."""
        deadline = self._retry.deadline(self._timeout_s if timeout_s is None else timeout_s)

        def route(keys: list[TopicPartition], call_timeout_s: float) -> tuple[
                dict[tuple[str, str], list[TopicPartition]], dict[TopicPartition, DMQError]]:
            return self._leaders(keys, call_timeout_s)

        def on_retry(errors: Mapping[TopicPartition, DMQError]) -> None:
            for topic in {tp.topic for tp, e in errors.items() if e.invalid_metadata}:
                self._cluster.invalidate(topic)

        got: FanOut[TopicPartition, V] = fan_out_by_leader(
            tps, route=route, send=lambda r, part, t: send(r[0], r[1], part, t), parse=lambda a, r: parse(a, r[1]),
            error=lambda e, r, part: error(e, r[1], part), policy=self._retry, deadline=deadline, what=what,
            retriable=lambda e, _: retry and e.retriable, on_retry=on_retry, call_cap_s=self._timeout_s,
        )
        return Outcome(got.done, got.errors)

    def _read_per_broker(
        self,
        what: str,
        rpc: str,
        tps: Iterable[TopicPartition],
        send: Callable[[str, str, list[TopicPartition], float], PendingCall[A]],
        parse: Callable[[A, str], Mapping[TopicPartition, V | DMQError]],
        timeout_s: float | None,
    ) -> dict[TopicPartition, V]:
        """A read through _per_broker that answers for every partition or raises the Outcome's
        error (a timeout as _timed_out says); a failed call names the rpc and the broker."""
        outcome = self._per_broker(
            what, tps, send, parse, lambda e, address, _part: from_rpc_error(e, context=f"{rpc} from broker {address}"),
            timeout_s,
        )
        err = outcome.error(what)
        if err is not None:
            raise _timed_out(err, self._config)
        return outcome.done

    # -- commits -----------------------------------------------------------------------------------

    def commit_calls(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        memberships: Mapping[str, Membership],
        timeout_s: float | None = None,
    ) -> tuple[list[CommitCall], dict[TopicPartition, DMQError]]:
        """One CommitOffsets per (topic, leader), and the partitions whose leader is unknown."""
        calls = []
        groups, errors = self._leaders(offsets, self._timeout_s if timeout_s is None else timeout_s)
        for (topic, address), tps in groups.items():
            m = _member(memberships, topic)
            calls.append(CommitCall(address, m, _commit_request(m, tps, offsets), {tp: offsets[tp] for tp in tps}))
        return calls, errors

    def commit_error(self, e: grpc.RpcError, call: CommitCall) -> DMQError:
        """A CommitCall's failure as the DMQError the consumers act on (CommitFailedError: refused)."""
        return self._commit_error(e, call.address, call.membership, ", ".join(str(tp) for tp in call.offsets))

    def _commit_error(self, e: grpc.RpcError, address: str, membership: Membership, where: str) -> DMQError:
        c = self._config
        code = e.code() if callable(getattr(e, "code", None)) else None
        reason = rpc_error_reason(e)
        # Not owner (the reason), or a member the coordinator no longer knows (NOT_FOUND): the
        # group moved on without this consumer. Any other refusal says what it is itself.
        if code is not None and (reason == error_details.NOT_OWNER or code == grpc.StatusCode.NOT_FOUND):
            return CommitFailedError(
                f"commit of {where} for group {membership.group_id} was refused: {e.details()}. "
                f"This consumer no longer owns these partitions: the group rebalanced without it, "
                f"usually because poll() was not called within max_poll_interval_ms "
                f"({c.max_poll_interval_ms} ms) while the records of the previous poll were processed. "
                f"Raise max_poll_interval_ms, or lower max_poll_records ({c.max_poll_records}) so "
                f"each poll's records are processed sooner.",
                code=code.name,
                details=e.details(),
            )
        return from_rpc_error(e, context=f"CommitOffsets of {where} to broker {address}")

    def commit_sync(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        memberships: Mapping[str, Membership],
        timeout_s: float | None = None,
    ) -> Outcome[OffsetAndMetadata]:
        """Commit per broker in parallel within timeout_s (default request_timeout_ms)."""
        if not offsets:
            return Outcome()
        offsets = dict(offsets)
        # The membership (member id, generation) is read per attempt: a retry after a
        # re-join carries the new one.
        def send(
            topic: str, address: str, part: list[TopicPartition], call_timeout_s: float
        ) -> PendingCall[pb.CommitOffsetsResponse]:
            request = _commit_request(_member(memberships, topic), part, offsets)
            return self._cluster.start_unary(self._cluster.broker_stub(address).CommitOffsets, request,
                                             timeout=call_timeout_s)

        def parse(_response: pb.CommitOffsetsResponse, _address: str) -> dict[TopicPartition, OffsetAndMetadata]:
            return offsets

        def error(e: grpc.RpcError, address: str, part: list[TopicPartition]) -> DMQError:
            topic = part[0].topic
            m = memberships.get(topic)
            assert m is not None
            return self._commit_error(e, address, m, ", ".join(str(tp) for tp in part))

        outcome = self._per_broker("commit", offsets, send, parse, error, timeout_s)
        # A partition is done only if its own call succeeded (parse returns every offset).
        outcome.done = {tp: offsets[tp] for tp in outcome.done if tp not in outcome.errors}
        return outcome

    def send_commit(self, call: CommitCall, timeout_s: float | None = None) -> concurrent.futures.Future[
            dict[TopicPartition, OffsetAndMetadata]]:
        """Send one CommitOffsets once; the future resolves (on a gRPC thread) with its offsets."""
        result: concurrent.futures.Future[dict[TopicPartition, OffsetAndMetadata]] = concurrent.futures.Future()
        result.set_running_or_notify_cancel()
        try:
            f = self._cluster.start_unary(self._cluster.broker_stub(call.address).CommitOffsets, call.request,
                                          timeout=self._timeout_s if timeout_s is None else max(0.001, timeout_s))
        except (DMQError, ValueError) as e:
            result.set_exception(e if isinstance(e, DMQError) else DMQError(f"commit not sent: {e}"))
            return result

        def done(fut: PendingCall[pb.CommitOffsetsResponse]) -> None:
            try:
                fut.result()
            except grpc.RpcError as e:
                result.set_exception(self.commit_error(e, call))
                return
            except CALL_CANCELLED:
                result.set_exception(DMQError("commit cancelled: the consumer closed"))
                return
            result.set_result(call.offsets)

        f.add_done_callback(done)
        return result

    def commit_async(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata], memberships: Mapping[str, Membership],
        timeout_s: float | None = None,
    ) -> concurrent.futures.Future[dict[TopicPartition, OffsetAndMetadata]]:
        """Send the commits once; the future resolves (on a gRPC thread) with the offsets once
        every broker answered, or with the first error."""
        result: concurrent.futures.Future[dict[TopicPartition, OffsetAndMetadata]] = concurrent.futures.Future()
        result.set_running_or_notify_cancel()
        offsets = dict(offsets)
        if not offsets:
            result.set_result(offsets)
            return result
        try:
            calls, errors = self.commit_calls(offsets, memberships, timeout_s)
        except DMQError as e:
            result.set_exception(e)
            return result
        if errors:
            result.set_exception(next(iter(errors.values())))
            return result
        lock = threading.Lock()
        state: dict[str, Any] = {"pending": len(calls), "error": None}

        def done(f: concurrent.futures.Future[Any]) -> None:
            err = f.exception()
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
            self.send_commit(call).add_done_callback(done)
        return result

    # -- reading -----------------------------------------------------------------------------------

    @staticmethod
    def committed_request(group_id: str, tps: Iterable[TopicPartition]) -> pb.FetchCommittedOffsetsRequest:
        return pb.FetchCommittedOffsetsRequest(
            group_id=group_id,
            partitions=[pb.TopicPartition(topic=tp.topic, partition=tp.partition) for tp in tps],
        )

    def call_timeout_s(self, timeout_s: float | None) -> float:
        """A call's gRPC timeout: `timeout_s` (at least 1 ms), request_timeout_ms when None."""
        return self._timeout_s if timeout_s is None else max(0.001, timeout_s)

    def start_fetch_committed(self, address: str, group_id: str, tps: list[TopicPartition],
                              timeout_s: float | None = None) -> PendingCall[pb.FetchCommittedOffsetsResponse]:
        return self._cluster.start_unary(self._cluster.broker_stub(address).FetchCommittedOffsets,
                                         self.committed_request(group_id, tps), timeout=self.call_timeout_s(timeout_s))

    @staticmethod
    def parse_committed(response: pb.FetchCommittedOffsetsResponse, _address: str = "") -> dict[
            TopicPartition, OffsetAndMetadata | None]:
        return {
            TopicPartition(o.topic, o.partition): (None if o.offset < 0 else OffsetAndMetadata(o.offset, o.metadata))
            for o in response.offsets
        }

    def fetch_committed(
        self, tps: Iterable[TopicPartition], group_ids: Mapping[str, str], *, timeout_s: float | None = None
    ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        """Committed offsets of tps (None = nothing committed); group_ids maps topic -> group id.
        Raises the error of the partitions it could not read within timeout_s."""
        tps = list(tps)
        if not tps:
            return {}
        return self._read_per_broker(
            "reading committed offsets", "FetchCommittedOffsets", tps,
            lambda topic, address, part, t: self.start_fetch_committed(address, group_ids[topic], part, t),
            self.parse_committed, timeout_s,
        )

    @staticmethod
    def list_offsets_request(queries: Mapping[TopicPartition, int]) -> pb.ListOffsetsRequest:
        return pb.ListOffsetsRequest(
            queries=[pb.OffsetQuery(topic=tp.topic, partition=tp.partition, timestamp_ms=ts) for tp, ts in queries.items()]
        )

    def start_list_offsets(self, address: str, queries: Mapping[TopicPartition, int],
                           timeout_s: float | None = None) -> PendingCall[pb.ListOffsetsResponse]:
        return self._cluster.start_unary(self._cluster.broker_stub(address).ListOffsets,
                                         self.list_offsets_request(queries), timeout=self.call_timeout_s(timeout_s))

    @staticmethod
    def parse_list_offsets(response: pb.ListOffsetsResponse, _address: str = "") -> dict[TopicPartition, int | DMQError]:
        out: dict[TopicPartition, int | DMQError] = {}
        for a in response.answers:
            tp = TopicPartition(a.topic, a.partition)
            if a.error == pb.NONE:
                out[tp] = a.offset
            elif a.error == pb.NOT_LEADER:
                out[tp] = NotLeaderError(a.error_message)
            elif a.error == pb.UNKNOWN_TOPIC_OR_PARTITION:
                out[tp] = UnknownPartitionError(a.error_message)
            elif a.error == pb.OFFSET_OUT_OF_RANGE:
                out[tp] = OffsetOutOfRangeError(a.error_message)
            elif a.error == pb.STORAGE_ERROR:
                out[tp] = BrokerUnavailableError(a.error_message)
            else:
                out[tp] = UnknownServerError(a.error_message)
        return out

    def list_offsets(self, queries: Mapping[TopicPartition, int], *, timeout_s: float | None = None) -> dict[TopicPartition, int]:
        """ListOffsets: timestamp -2 = log start, -1 = log end, >= 0 = first offset appended at or
        after it (the log end when there is none)."""
        if not queries:
            return {}
        return self._read_per_broker(
            "listing offsets", "ListOffsets", queries,
            lambda _topic, address, part, t: self.start_list_offsets(address, {tp: queries[tp] for tp in part}, t),
            self.parse_list_offsets, timeout_s,
        )


def _member(memberships: Mapping[str, Membership], topic: str) -> Membership:
    m = memberships.get(topic)
    if m is None or not m.joined:
        raise IllegalStateError(
            f"cannot commit {topic}: this consumer is not a member of its group "
            f"(subscribe() to {topic!r} first, and poll() until it is assigned)"
        )
    return m


def _commit_request(
    m: Membership, tps: Iterable[TopicPartition], offsets: Mapping[TopicPartition, OffsetAndMetadata]
) -> pb.CommitOffsetsRequest:
    return pb.CommitOffsetsRequest(
        group_id=m.group_id,
        member_id=m.member_id,
        member_secret=m.member_secret,
        generation=m.generation,
        offsets=[
            pb.PartitionOffset(topic=tp.topic, partition=tp.partition, offset=offsets[tp].offset,
                               metadata=offsets[tp].metadata)
            for tp in tps
        ],
    )


def _timed_out(err: DMQError, config: ConsumerConfig) -> DMQError:
    if not err.retriable:
        return err
    return DMQTimeoutError(
        f"{err} (retried until the deadline; request_timeout_ms is {config.request_timeout_ms})",
        code=err.code, details=err.details,
    )

