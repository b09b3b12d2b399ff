"""TopicTail: every chosen partition of one topic from chosen starts, without a group or commits.

For `dmq consume` without --group and `dmq bench consume --no-group`: a console tail wants all
partitions at once, one long-poll per broker, and records as soon as any broker answers. The
fetching is the PartitionReader's (one Fetch in flight per broker with its own deadline,
per-broker backoff, leaders looked up again after NOT_LEADER); the tail adds its policy:

  - a start given as EARLIEST / LATEST is looked up (AdminClient.list_offsets) on a small pool, one
    partition at a time, so a tail started while a broker is down reads the other partitions at
    once; a failed look-up is tried again every UNREACHABLE_RETRY_S;
  - OFFSET_OUT_OF_RANGE below the log start (retention deleted the data) jumps to the log start
    with a warning, like Kafka's auto.offset.reset=earliest; any other partition error is raised;
  - a broker that cannot be reached is warned about once (and again when it answers) and retried
    after its backoff while the others are read; only when no broker the partitions are on can be
    reached is the error raised.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Mapping

from dmq.client._cluster import Cluster
from dmq.client._reader import (
    DEFAULT_MAX_WAIT_MS,
    DEFAULT_PARTITION_MAX_BYTES,
    REFRESH_CODES,
    FetchAnswer,
    FetchWant,
    PartitionReader,
    partition_error,
)
from dmq.client.admin import AdminClient, OffsetInfo
from dmq.client.errors import BrokerUnavailableError, CorruptRecordError, DMQError
from dmq.client.records import ConsumerRecord, consumer_records
from dmq.proto import dmq_pb2 as pb
from dmq.proto import records

__all__ = ["TopicTail"]

UNREACHABLE_RETRY_S = 1.0
# While nothing is in flight (every broker backing off), how often poll() looks again.
IDLE_CHECK_S = 0.1
# A round waits for the long-poll plus this margin for the call itself.
WAIT_MARGIN_S = 0.1
LOOKUP_THREADS = 4


class TopicTail:
    """Positions per partition of one topic, read round by round. Not thread-safe; close() it.

    `starts` maps partition -> offset (>= 0), or EARLIEST / LATEST (dmq.proto.offset_markers) to
    look up. `warn` receives one-line warnings (a broker unreachable, data skipped)."""

    def __init__(
        self,
        cluster: Cluster,
        topic: str,
        starts: Mapping[int, int],
        *,
        max_wait_ms: int = DEFAULT_MAX_WAIT_MS,
        partition_max_bytes: int = DEFAULT_PARTITION_MAX_BYTES,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.topic = topic
        self.positions = {p: o for p, o in starts.items() if o >= 0}
        self.resets = {p: o for p, o in starts.items() if o < 0}
        self.max_wait_ms = max_wait_ms
        self._cluster = cluster
        self._warn = warn or (lambda _msg: None)
        self._event = threading.Event()  # set by any fetch or look-up completing
        self._reader = PartitionReader(
            cluster,
            max_wait_ms=max_wait_ms,
            partition_max_bytes=partition_max_bytes,
            allow_stale=True,
            wakeup=self._event,
            name="dmq-tail",
        )
        self._admin = AdminClient(cluster.bootstrap, cluster=cluster)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=LOOKUP_THREADS, thread_name_prefix="dmq-tail-lookup")
        self._lookups: dict[int, concurrent.futures.Future[OffsetInfo]] = {}
        self._lookup_retry_at: dict[int, float] = {}
        self._down: set[str] = set()  # brokers warned about as unreachable

    def __repr__(self) -> str:
        return f"<TopicTail {self.topic} positions={self.positions} resets={self.resets}>"

    def poll(self) -> list[ConsumerRecord]:
        """One round: records in offset order per partition (none when no broker had any within
        max_wait_ms)."""
        now = time.monotonic()
        self._event.clear()  # before looking: a completion from here on sets it again
        self._start_lookups(now)
        failed = self._reader.send([FetchWant(self.topic, p, o) for p, o in self.positions.items()], now=now)
        for err in failed.values():
            if not err.retriable:
                raise err  # the topic or partition is gone
        if not self._reader.ready and not any(f.done() for f in self._lookups.values()):
            busy = self._reader.busy or self._lookups
            self._event.wait(self.max_wait_ms / 1000 + WAIT_MARGIN_S if busy else IDLE_CHECK_S)
        self._take_lookups()
        out: list[ConsumerRecord] = []
        for answer in self._reader.answers():
            self._take(answer, out)
        return out

    # -- starts looked up ----------------------------------------------------------------------------

    def _start_lookups(self, now: float) -> None:
        for p, marker in self.resets.items():
            if p in self._lookups or self._lookup_retry_at.get(p, 0.0) > now:
                continue
            future = self._pool.submit(self._admin.list_offsets, self.topic, p, marker)
            future.add_done_callback(self._wake)
            self._lookups[p] = future

    def _take_lookups(self) -> None:
        for p, future in list(self._lookups.items()):
            if not future.done():
                continue
            del self._lookups[p]
            try:
                info = future.result()
            except DMQError as e:
                if not e.retriable:
                    raise
                self._lookup_retry_at[p] = time.monotonic() + UNREACHABLE_RETRY_S
                address = self._leader_address(p)
                if address:
                    self._unreachable(address, [p], e)
                continue
            del self.resets[p]
            self.positions[p] = info.offset

    def _wake(self, _future: object) -> None:
        self._event.set()

    # -- answers -------------------------------------------------------------------------------------

    def _take(self, answer: FetchAnswer, out: list[ConsumerRecord]) -> None:
        if answer.error is not None:
            if not answer.error.retriable:
                raise answer.error
            self._unreachable(answer.address, sorted(p for _, p in answer.wants), answer.error)
            return
        if answer.address in self._down:
            self._down.discard(answer.address)
            self._warn(f"broker {self._broker_id(answer.address)} at {answer.address} answers again")
        for r in answer.results:
            p = r.partition
            want = answer.wants.get((r.topic, p))
            if want is None or self.positions.get(p) != want.offset:
                continue
            if r.error == pb.NONE:
                if r.records:
                    got = self._records(r.records, p, want.offset)
                    if got:
                        out.extend(got)
                        self.positions[p] = got[-1].offset + 1
            elif r.error == pb.OFFSET_OUT_OF_RANGE and want.offset < r.log_start_offset:
                self._warn(f"{self.topic}[{p}]: offset {want.offset} was deleted by retention; continuing from "
                           f"the log start {r.log_start_offset}")
                self.positions[p] = r.log_start_offset
            elif r.error not in REFRESH_CODES:  # those: the reader looks the leader up again
                raise partition_error(r)

    def _records(self, data: memoryview, partition: int, position: int) -> list[ConsumerRecord]:
        try:
            batches = records.decode_batches(data)
        except records.RecordsError as e:
            raise CorruptRecordError(f"fetched data of {self.topic}[{partition}] at offset {position} is corrupt: {e}") from e
        got: list[ConsumerRecord] = []
        for batch in batches:
            got.extend(consumer_records(self.topic, partition, batch, position))
        return got

    # -- brokers that cannot be reached ------------------------------------------------------------

    def _unreachable(self, address: str, parts: list[int], err: DMQError) -> None:
        leaders = {self._leader_address(p) for p in [*self.positions, *self.resets]}
        if isinstance(err, BrokerUnavailableError) and leaders <= self._down | {address}:
            raise err  # nothing of the topic can be read: say so rather than wait forever
        if address not in self._down:
            self._down.add(address)
            self._warn(f"cannot reach broker {self._broker_id(address)} at {address}; reading the other "
                       f"partitions, {self.topic}{parts} resume when it is back ({err})")

    def _leader_address(self, partition: int) -> str:
        try:
            meta = self._cluster.topic_metadata(self.topic, timeout_s=0, allow_stale=True)
        except DMQError:
            return ""
        return meta.partitions[partition].leader_address if partition < len(meta.partitions) else ""

    def _broker_id(self, address: str) -> int:
        try:
            meta = self._cluster.topic_metadata(self.topic, timeout_s=0, allow_stale=True)
        except DMQError:
            return -1
        return next((p.leader_id for p in meta.partitions if p.leader_address == address), -1)

    def close(self) -> None:
        """Drop the fetches and look-ups in flight (the owner closes the cluster)."""
        self._reader.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._lookups.clear()
