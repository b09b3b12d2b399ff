"""SimpleConsumer: read one partition from an offset you manage. No group, no commits.

    with SimpleConsumer("127.0.0.1:9091") as c:
        records = c.consume("orders", 0, offset=0)                  # list[ConsumerRecord]
        for batch in c.consume_batches("orders", 0, 0, end_offset=1000):
            for r in batch.iter_from(0): ...                        # the fast path

`consume()` does one Fetch (long-polling up to max_wait_ms for data) and returns ConsumerRecords.
`consume_batches()` yields the decoded, lazy `dmq.proto.records.RecordBatch` objects and keeps the
next Fetch in flight while the caller works on the current one. A fetch returns whole batches, so
the first may start before the requested offset: consume() skips those records, and
consume_batches() callers use ``batch.iter_from(offset)`` (or `consumer_records`).

Fetches go through the client's PartitionReader (dmq.client._reader): the leader is found
through the Cluster's metadata; a failed Fetch, NOT_LEADER or UNKNOWN_TOPIC_OR_PARTITION refresh
it and retry (up to FETCH_ATTEMPTS tries, paced by the cluster's RetryPolicy: dmq.client._calls). OFFSET_OUT_OF_RANGE raises OffsetOutOfRangeError
carrying the log's start and end. consume() makes its one call on the caller's thread; each
consume_batches() iteration has its own reader, so concurrent reads share nothing but channels.
"""

from __future__ import annotations

import concurrent.futures
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

from dmq.client._cluster import Cluster
from dmq.client.admin import AdminClient
from dmq.client._security import pop_security
from dmq.client._log import get_logger
from dmq.client._reader import INLINE, FetchWant, PartitionReader, partition_error
from dmq.client._settings import bootstrap_address, check_flag, check_positive, reject_unknown
from dmq.client.errors import CorruptRecordError, InvalidArgumentError
from dmq.client.records import ConsumerRecord, consumer_records
from dmq.proto import dmq_pb2 as pb
from dmq.proto import records
from dmq.proto.grpc_options import MAX_FETCH_RESPONSE_BYTES
from dmq.proto.records import RecordBatch
from dmq.proto.wire import FetchPartitionView

log = get_logger(__name__)

__all__ = ["SimpleConsumer"]

DEFAULT_MAX_WAIT_MS = 500
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
FETCH_ATTEMPTS = 4


class SimpleConsumer:
    """Fetches records of one partition at a time. Thread-safe; close() (or `with`) when done."""

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str] | None = None,
        *,
        max_wait_ms: int = DEFAULT_MAX_WAIT_MS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        request_timeout_ms: int = 30_000,
        verify_crc: bool = True,
        cluster: Cluster | None = None,
        bootstrap: str | Sequence[str] | None = None,
        **unknown: Any,
    ) -> None:
        """``bootstrap_servers``: the coordinator's "host:port" (a string, "h:p,h:p" or a list;
        ``bootstrap`` is the original name)."""
        security = pop_security(unknown)  # ssl_cafile, token, ... (dmq.client._security)
        reject_unknown("SimpleConsumer", unknown, _SETTINGS)
        check_positive("request_timeout_ms", request_timeout_ms)
        check_flag("verify_crc", verify_crc)
        _check_limits(max_wait_ms, max_bytes)
        self._own_cluster = cluster is None
        self._cluster = cluster or Cluster(
            bootstrap_address({"bootstrap_servers": bootstrap_servers, "bootstrap": bootstrap}, "SimpleConsumer"),
            request_timeout_ms=request_timeout_ms, security=security,
        )
        self.max_wait_ms = max_wait_ms
        self.max_bytes = max_bytes
        self.verify_crc = verify_crc

    def __repr__(self) -> str:
        return f"<SimpleConsumer bootstrap={self._cluster.bootstrap!r}>"

    @property
    def cluster(self) -> Cluster:
        return self._cluster

    # -- reading ---------------------------------------------------------------------------------

    def consume(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_records: int = 500,
        max_wait_ms: int | None = None,
        max_bytes: int | None = None,
    ) -> list[ConsumerRecord]:
        """Records from `offset` on (at most max_records); [] when none arrive within max_wait_ms."""
        if max_records <= 0:
            raise InvalidArgumentError(f"max_records must be >= 1, got {max_records}")
        want = FetchWant(topic, partition, offset)
        reader = self._reader(want, max_wait_ms, max_bytes, INLINE)
        try:
            result = _checked(reader.result(want, attempts=FETCH_ATTEMPTS))
        finally:
            reader.close()
        out: list[ConsumerRecord] = []
        for batch in self._decode(result, topic, partition, offset):
            out.extend(consumer_records(topic, partition, batch, offset, max_records - len(out)))
            if len(out) >= max_records:
                break
        return out

    def consume_batches(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        end_offset: int | None = None,
        max_wait_ms: int | None = None,
        max_bytes: int | None = None,
    ) -> Iterator[RecordBatch]:
        """Yield decoded batches from `offset` on, with the next Fetch already in flight.

        Stops after the batch holding ``end_offset - 1`` when end_offset is given; otherwise runs
        until the caller stops iterating, long-polling at the log end. The first batch may start
        before `offset`: iterate it with ``batch.iter_from(offset)``.
        """
        if end_offset is not None and end_offset <= offset:
            return
        first = FetchWant(topic, partition, offset)
        reader = self._reader(first, max_wait_ms, max_bytes, None)
        want: FetchWant | None = first
        try:
            reader.send([first])
            while want is not None:
                result = _checked(reader.result(want, attempts=FETCH_ATTEMPTS))
                batches = self._decode(result, topic, partition, want.offset)
                next_offset = batches[-1].last_offset + 1 if batches else want.offset
                want = None
                if end_offset is None or next_offset < end_offset:
                    want = FetchWant(topic, partition, next_offset)
                    reader.send([want])  # in flight while the caller works on these batches
                yield from batches
        finally:
            reader.close()  # a Fetch still in flight is dropped

    def offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """(log start, log end) of the partition: the first offset kept and the next to be written."""
        info = AdminClient(self._cluster.bootstrap, cluster=self._cluster).list_offsets(topic, partition, "latest")
        return info.log_start_offset, info.log_end_offset

    # -- fetch plumbing ----------------------------------------------------------------------------

    def _reader(
        self,
        want: FetchWant,
        max_wait_ms: int | None,
        max_bytes: int | None,
        pool: concurrent.futures.Executor | None,
    ) -> PartitionReader:
        wait = self.max_wait_ms if max_wait_ms is None else max_wait_ms
        limit = self.max_bytes if max_bytes is None else max_bytes
        _check_limits(wait, limit)
        if want.offset < 0:
            raise InvalidArgumentError(f"offset must be >= 0, got {want.offset}")
        return PartitionReader(
            self._cluster,
            max_wait_ms=wait,
            max_bytes=limit,
            partition_max_bytes=limit,
            retry_backoff_ms=self._cluster.retry.retry_backoff_ms,
            pool=pool,
            name="dmq-simple-consumer",
        )

    def _decode(self, result: FetchPartitionView, topic: str, partition: int, offset: int) -> list[RecordBatch]:
        if not result.records:
            return []
        try:
            batches = records.decode_batches(result.records, verify_crc=self.verify_crc)
        except records.RecordsError as e:
            raise CorruptRecordError(f"{topic}[{partition}] fetched at offset {offset}: {e}") from e
        # Whole batches come back: drop any that end before the requested offset.
        if batches and batches[0].last_offset < offset:
            batches = [b for b in batches if b.last_offset >= offset]
        return batches

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        if self._own_cluster:
            self._cluster.close()

    def __enter__(self) -> SimpleConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _checked(r: FetchPartitionView) -> FetchPartitionView:
    if r.error != pb.NONE:
        raise partition_error(r)
    return r


def _check_limits(max_wait_ms: int, max_bytes: int) -> None:
    if not 0 <= max_wait_ms <= 60_000:
        raise InvalidArgumentError(f"max_wait_ms must be within 0..60000, got {max_wait_ms}")
    if not 1 <= max_bytes <= MAX_FETCH_RESPONSE_BYTES:
        raise InvalidArgumentError(f"max_bytes must be within 1..{MAX_FETCH_RESPONSE_BYTES}, got {max_bytes}")


_SETTINGS = frozenset(
    name for name in inspect.signature(SimpleConsumer.__init__).parameters if name not in ("self", "unknown")
)
