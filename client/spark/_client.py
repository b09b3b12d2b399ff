"""The Spark source's conversations with the cluster, on top of the client library.

Used on the driver (planning: partitions, offsets by position or time, group commits) through
`SourceClient`, a thin user of `AdminClient` (ListOffsets grouped by leader, operator commits)
and its `Cluster` (metadata); and in executors (`PartitionFetcher`: fetch one offset range from
the partition's leader). Errors are `dmq.client.errors` classes; per-partition error codes of
Fetch become the same classes through `from_partition_error`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import grpc

from dmq.client._log import get_logger
from dmq.client._cluster import Cluster, single_fetch_result
from dmq.client.admin import AdminClient, OffsetInfo
from dmq.client.errors import (
    DMQError,
    DMQTimeoutError,
    TopicNotFoundError,
    from_partition_error,
    from_rpc_error,
)
from dmq.proto import dmq_pb2 as pb
from dmq.proto.wire import FetchPartitionView

log = get_logger(__name__)

TopicPartition = tuple[str, int]

RETRY_BACKOFF_S = 0.2

__all__ = ["SourceClient", "PartitionFetcher", "OffsetInfo", "TopicPartition"]


class SourceClient:
    """Driver-side helper; not picklable (holds channels): create it where it is used, close it."""

    def __init__(self, bootstrap: str, *, request_timeout_ms: int = 30_000) -> None:
        self.admin = AdminClient(bootstrap, request_timeout_ms=request_timeout_ms)
        self.cluster = self.admin.cluster
        self._group_ids: dict[tuple[str, str], str] = {}

    def __repr__(self) -> str:
        return f"<SourceClient bootstrap={self.cluster.bootstrap!r}>"

    def close(self) -> None:
        self.admin.close()

    def __enter__(self) -> SourceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- metadata ----------------------------------------------------------------------------------

    def partition_counts(self, topics: Iterable[str], *, missing_ok: bool = False) -> dict[str, int]:
        """Current partition count per topic (fresh from the coordinator, not the cache).

        A topic that does not exist raises TopicNotFoundError, or is left out with `missing_ok`.
        """
        names = sorted(set(topics))
        out: dict[str, int] = {}
        try:
            self.cluster.refresh(names)
        except TopicNotFoundError:
            if not missing_ok:
                raise
            # One request failed for all: ask topic by topic to learn which ones exist.
            for name in names:
                try:
                    self.cluster.refresh([name])
                except TopicNotFoundError:
                    continue
                out[name] = self.cluster.partitions_for(name)
            return out
        for name in names:
            out[name] = self.cluster.partitions_for(name)
        return out

    def leader(self, topic: str, partition: int) -> str:
        return self.cluster.leader_for(topic, partition)

    # -- offsets -------------------------------------------------------------------------------------

    def list_offsets(self, queries: dict[TopicPartition, int]) -> dict[TopicPartition, OffsetInfo]:
        """ListOffsets for each (topic, partition) -> timestamp_ms (-2 earliest, -1 latest, >= 0
        first offset appended at or after that time, log end when none): AdminClient's, one call
        per leading broker, retried while leaders move."""
        return self.admin.list_partition_offsets(queries)

    # -- consumer groups -----------------------------------------------------------------------------

    def group_id_for(self, topic: str, app_id: str) -> str:
        """The group DMQ uses for (topic, app_id): G_<topic>_<app_id>, created when missing."""
        key = (topic, app_id)
        gid = self._group_ids.get(key)
        if gid is None:
            gid = self._group_ids[key] = self.admin.group_id_for(topic, app_id)
        return gid

    def commit_as_operator(self, app_id: str, offsets: dict[TopicPartition, int]) -> None:
        """Commit next-offsets to each topic's group as an operator (member "", generation -1):
        accepted while the group has no members, i.e. no DMQConsumer shares the app id."""
        by_topic: dict[str, dict[TopicPartition, int]] = {}
        for (topic, partition), offset in offsets.items():
            by_topic.setdefault(topic, {})[(topic, partition)] = offset
        for topic, entries in sorted(by_topic.items()):
            self.admin.commit_group_offsets(self.group_id_for(topic, app_id), entries, metadata="spark")


class PartitionFetcher:
    """Executor side: fetches one partition from its leader, one request in flight ahead.

    Owns one channel (through its Cluster) for the duration of a read() call.
    """

    def __init__(
        self, bootstrap: str, topic: str, partition: int, *, leader_hint: str | None, poll_timeout_ms: int
    ) -> None:
        self.cluster = Cluster(bootstrap)
        self.topic = topic
        self.partition = partition
        self._leader = leader_hint
        self._deadline_s = poll_timeout_ms / 1000

    def close(self) -> None:
        self.cluster.close()

    def _address(self) -> str:
        if not self._leader:
            self._leader = self.cluster.leader_for(self.topic, self.partition)
        return self._leader

    def request(self, offset: int, max_bytes: int) -> grpc.Future:
        """Start a Fetch of `offset` (no long-poll: the data was there at planning time). The
        answer stays serialised: result() parses it with the records as views, not copies."""
        req = pb.FetchRequest(
            partitions=[pb.FetchPartition(topic=self.topic, partition=self.partition, offset=offset, max_bytes=max_bytes)],
            max_wait_ms=0,
            min_bytes=0,
            max_bytes=max_bytes,
        )
        return self.cluster.raw_fetch(self._address()).future(req, timeout=self.cluster.timeout_s)

    def result(self, future: grpc.Future, offset: int, max_bytes: int) -> FetchPartitionView:
        """The answer of `future`, re-sent to a fresh leader while the broker is unavailable
        (bounded by pollTimeoutMs). Per-partition errors other than NOT_LEADER are returned."""
        started = time.monotonic()
        attempt = 0
        current: grpc.Future | None = future
        while True:
            last: DMQError
            if current is None:
                try:
                    current = self.request(offset, max_bytes)
                except DMQError as e:  # the metadata lookup for the leader failed
                    if not e.retriable:
                        raise
                    last = e
            if current is not None:
                try:
                    response = current.result()
                except grpc.RpcError as e:
                    err = from_rpc_error(e, context=f"Fetch {self.topic}[{self.partition}] at {self._leader}")
                    if not err.retriable:
                        raise err from e
                    last = err
                else:
                    result = single_fetch_result(response, f"Fetch {self.topic}[{self.partition}] at {self._leader}")
                    if result.error != pb.NOT_LEADER:
                        return result
                    last = from_partition_error(result.error, result.error_message, self.topic, self.partition)
            if time.monotonic() - started > self._deadline_s:
                raise DMQTimeoutError(
                    f"{last}; gave up after pollTimeoutMs={int(self._deadline_s * 1000)} ms "
                    f"(raise the option if the broker is just slow to come back)"
                ) from last
            attempt += 1
            log.warning("fetch failed, retrying", topic=self.topic, partition=self.partition, error=str(last))
            time.sleep(min(RETRY_BACKOFF_S * attempt, 2.0))
            self.cluster.invalidate(self.topic)
            self._leader = None
            current = None
