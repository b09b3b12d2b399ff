"""The Spark source's conversations with the cluster, on top of the client library.

Used on the driver (planning: partitions, offsets by position or time, group commits) through
`SourceClient`, a thin user of `AdminClient` (ListOffsets grouped by leader, operator commits)
and its `Cluster` (metadata); and in executors (`PartitionFetcher`: fetch one offset range from
the partition's leader, through the client's PartitionReader). Errors are `dmq.client.errors`
classes; per-partition error codes of Fetch become the same classes through `from_partition_error`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from dmq.client._cluster import Cluster
from dmq.client._log import get_logger
from dmq.client._reader import FetchWant, PartitionReader
from dmq.client._security import client_security
from dmq.client.admin import AdminClient, OffsetInfo
from dmq.client.errors import (
    DMQError,
    DMQTimeoutError,
    TopicNotFoundError,
)
from dmq.proto import dmq_pb2 as pb
from dmq.proto.wire import FetchPartitionView

log = get_logger(__name__)

TopicPartition = tuple[str, int]

__all__ = ["SourceClient", "PartitionFetcher", "OffsetInfo", "TopicPartition"]


class SourceClient:
    """Driver-side helper; not picklable (holds channels): create it where it is used, close it."""

    def __init__(
        self, bootstrap: str, *, request_timeout_ms: int = 30_000, credentials: Iterable[tuple[str, str]] = ()
    ) -> None:
        """`credentials`: security keywords (ssl_cafile=..., token=...) over the environment's."""
        security: dict[str, Any] = dict(credentials)
        self.admin = AdminClient(bootstrap, request_timeout_ms=request_timeout_ms, **security)
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

    Owns one channel (through its Cluster) for the duration of a read() call. The planner's leader
    is used until it fails; then the leader is looked up afresh.
    """

    def __init__(
        self, bootstrap: str, topic: str, partition: int, *, leader_hint: str | None, poll_timeout_ms: int,
        credentials: Iterable[tuple[str, str]] = (),
    ) -> None:
        # The task's own environment fills in what the options left out (dmq.client._security).
        self.cluster = Cluster(bootstrap, security=client_security(dict(credentials)))
        self.topic = topic
        self.partition = partition
        self._deadline_s = poll_timeout_ms / 1000
        # No long-poll: the data was there at planning time.
        self._reader = PartitionReader(
            self.cluster,
            max_wait_ms=0,
            min_bytes=0,
            retry_backoff_ms=self.cluster.retry.retry_backoff_ms,
            leader_hints={(topic, partition): leader_hint} if leader_hint else None,
            name="dmq-spark-read",
        )

    def close(self) -> None:
        """Drops the Fetch in flight, if any (a LIMIT or a failed task stopped the read)."""
        self._reader.close()
        self.cluster.close()

    def request(self, offset: int, max_bytes: int) -> FetchWant:
        """Start a Fetch of `offset`; result() takes its answer. The answer stays serialised:
        the records are views into it, not copies."""
        want = FetchWant(self.topic, self.partition, offset, max_bytes)
        self._reader.send([want])
        return want

    def result(self, want: FetchWant, offset: int, max_bytes: int) -> FetchPartitionView:
        """The answer of the request for `offset`, sent again to a fresh leader while the broker is
        unavailable (bounded by pollTimeoutMs). Per-partition errors other than NOT_LEADER are
        returned."""
        try:
            return self._reader.result(want, deadline=time.monotonic() + self._deadline_s, retry_codes=(pb.NOT_LEADER,))
        except DMQError as e:
            if not e.retriable:
                raise
            raise DMQTimeoutError(
                f"{e}; gave up after pollTimeoutMs={int(self._deadline_s * 1000)} ms "
                f"(raise the option if the broker is just slow to come back)"
            ) from e
