"""Batch and streaming readers of the `dmq` source: planning offset ranges, reading them.

Planning (driver): the topic-partitions come from `subscribe` (every partition, from metadata),
`subscribePattern` (every partition of each topic whose whole name matches, listed afresh at each
plan, so a stream picks up new topics) or `assign`; start and end positions are resolved with ListOffsets (earliest / latest / by append
time) or taken from the offsets JSON. Each non-empty range [start, until) of one partition is one
input partition; with `minPartitions` the large ones are split like Spark's Kafka source does
(pieces proportional to the range's share of all rows).

Streaming offsets are JSON objects `{"topic": {"partition": next_offset}}`, built with sorted keys
so equal positions serialise identically (Spark compares them to detect "no new data"). A
partition that appears in a newer metadata answer is read from offset 0; one that disappears, or
whose log end went backwards (topic re-created), is data loss.

Reading (executor, `read_range`): Fetch from the leader with one request in flight ahead of the
conversion, each asking for about the bytes the rows left need (`FetchSizer`); each answer becomes
one Arrow batch (`ArrowBuilder`), trimmed to the range. Missing
data - below the log start after retention, a shorter log, a deleted partition, a gap - raises
`DataLossError` with failOnDataLoss=true (default) or is skipped with a warning.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from dmq.client._log import get_logger
from dmq.client.errors import DMQError, from_partition_error
from dmq.client.spark._client import PartitionFetcher, SourceClient, TopicPartition
from dmq.client.spark._worker import prepare_worker
from dmq.client.spark.arrow import ArrowBuilder
from dmq.client.spark.options import Credentials, OffsetSpec, OptionError, SourceOptions
from dmq.proto import dmq_pb2 as pb
from dmq.proto import records
from dmq.proto.offset_markers import EARLIEST, LATEST

try:  # Spark >= 4.2: admission control (read limits) and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    HAS_READ_LIMITS = True
except ImportError:  # pragma: no cover - older Spark: latestOffset() takes no arguments
    HAS_READ_LIMITS = False

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass


log = get_logger(__name__)

__all__ = ["OffsetRange", "DataLossError", "DMQBatchReader", "DMQStreamReader", "read_range", "split_ranges"]


class DataLossError(DMQError):
    """Records the query should read are gone (retention, a re-created or deleted topic).

    Raised when failOnDataLoss is true (the default); set it to false to skip them with a warning.
    """


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """Rows start <= offset < until of topic[partition]; `leader` is the planner's hint."""

    topic: str
    partition: int
    start: int
    until: int
    leader: str = ""

    @property
    def size(self) -> int:
        return self.until - self.start


@dataclass(frozen=True)
class ReadSettings:
    """What executors need from the options (picklable, small)."""

    bootstrap: str
    include_headers: bool
    fail_on_data_loss: bool
    fetch_max_bytes: int
    poll_timeout_ms: int
    credentials: Credentials = field(default=(), repr=False)  # the security options (a token: not shown)

    @classmethod
    def of(cls, opts: SourceOptions) -> ReadSettings:
        return cls(opts.bootstrap, opts.include_headers, opts.fail_on_data_loss, opts.fetch_max_bytes,
                   opts.poll_timeout_ms, opts.credentials)


# ---------------------------------------------------------------------------------------------
# Planning


def current_partitions(
    client: SourceClient, opts: SourceOptions, *, streaming: bool, warned: set[str] | None = None
) -> list[TopicPartition]:
    """The topic-partitions the query reads now.

    A subscribed topic that does not exist fails a batch query; a stream waits for it (it is read
    from offset 0 once created), warning once per topic in `warned`. A pattern matches whole topic
    names (Kafka's), never the internal `__` topics; matching none reads nothing.
    """
    if opts.pattern is not None:
        matched = [t for t in client.admin.list_topics()
                   if not t.name.startswith("__") and re.fullmatch(opts.pattern, t.name)]
        return [(t.name, p) for t in matched for p in range(t.partition_count)]
    if opts.assign is not None:
        counts = client.partition_counts(opts.assign)
        tps: list[TopicPartition] = []
        for topic, parts in sorted(opts.assign.items()):
            missing = [p for p in parts if p >= counts[topic]]
            if missing:
                raise OptionError(
                    f"option 'assign' names partitions {missing} of topic {topic!r}, which has "
                    f"partitions 0..{counts[topic] - 1}"
                )
            tps.extend((topic, p) for p in parts)
        return tps
    counts = client.partition_counts(opts.topics, missing_ok=streaming)
    for topic in opts.topics:
        if topic not in counts and (warned is None or topic not in warned):
            log.warning("subscribed topic does not exist yet: reading it from offset 0 once created", topic=topic)
            if warned is not None:
                warned.add(topic)
    return [(t, p) for t in sorted(counts) for p in range(counts[t])]


def resolve(client: SourceClient, spec: OffsetSpec, tps: Sequence[TopicPartition], option: str) -> dict[TopicPartition, int]:
    """Concrete offsets of `spec` for each partition."""
    if not tps:
        return {}
    if spec.kind in ("earliest", "latest", "timestamp"):
        ts = {"earliest": EARLIEST, "latest": LATEST}.get(spec.kind, spec.timestamp_ms)
        answers = client.list_offsets({tp: ts for tp in tps})
        return {tp: answers[tp].offset for tp in tps}
    if spec.kind == "timestamps":
        missing = [tp for tp in tps if tp not in spec.offsets]
        if missing:
            raise OptionError(
                f"option {option + 'ByTimestamp'!r} must give a timestamp for every partition read; missing: "
                + ", ".join(f"{t}[{p}]" for t, p in missing)
            )
        answers = client.list_offsets({tp: spec.offsets[tp] for tp in tps})
        return {tp: answers[tp].offset for tp in tps}
    missing = [tp for tp in tps if tp not in spec.offsets]
    if missing:
        raise OptionError(
            f"option {option!r} must give an offset for every partition read; missing: "
            + ", ".join(f"{t}[{p}]" for t, p in missing)
        )
    out = {tp: spec.offsets[tp] for tp in tps}
    special = {tp: off for tp, off in out.items() if off in (EARLIEST, LATEST)}
    if special:
        answers = client.list_offsets(special)
        out.update({tp: answers[tp].offset for tp in special})
    return out


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Split ranges so there are about `min_partitions` of them, each range getting pieces in
    proportion to its share of all rows (Spark's KafkaOffsetRangeCalculator)."""
    ranges = [r for r in ranges if r.size > 0]
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)
    out = []
    for r in ranges:
        parts = max(round(r.size / total * min_partitions), 1)
        remaining = r.size
        start = r.start
        for part in range(parts):
            piece = remaining // (parts - part)  # the last piece takes the rounding
            remaining -= piece
            end = min(start + piece, r.until)
            if end > start:
                out.append(OffsetRange(r.topic, r.partition, start, end, r.leader))
            start = end
    return out


def _leaders(client: SourceClient, tps: Sequence[TopicPartition]) -> dict[TopicPartition, str]:
    out = {}
    for tp in tps:
        try:
            out[tp] = client.leader(*tp)
        except DMQError:
            out[tp] = ""  # the executor looks it up again
    return out


def to_json(offsets: dict[TopicPartition, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), off in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = int(off)
    return out


def from_json(data: dict[str, Any] | None) -> dict[TopicPartition, int]:
    out = {}
    for topic, parts in (data or {}).items():
        for p, off in parts.items():
            out[(topic, int(p))] = int(off)
    return out


# ---------------------------------------------------------------------------------------------
# Reading


def _loss(settings: ReadSettings, message: str, **fields: object) -> None:
    if settings.fail_on_data_loss:
        raise DataLossError(
            f"{message}. Set the option failOnDataLoss=false to skip missing records and continue"
        )
    log.warning("data loss: skipping records", reason=message, **fields)


class FetchSizer:
    """How many bytes to ask for in each Fetch of one range: enough for the rows left in it.

    The broker answers whole batches up to max_bytes (at least one). Asking for fetchMaxBytes when
    a few rows remain makes it read and ship up to that much, which the reader then drops: a
    1-row range took 26 ms and 15.7 MB that way, 7 ms and 1 MB sized (bench/spark_small_ranges.py);
    the last Fetch of every micro-batch and `minPartitions` piece paid the same. So the first
    request guesses GUESS_BYTES_PER_RECORD per row left; later ones use the bytes per record seen
    so far, plus one average batch, since the batch holding the range's last row is answered
    whole. A guess that is short costs one more round trip, never rows: the loop asks until the
    range is read.
    """

    MIN_BYTES = 64 * 1024
    # A 100-byte value takes ~110 B in a batch. Guessing high over-reads small ranges; guessing
    # low only adds a round trip before the observed rate takes over.
    GUESS_BYTES_PER_RECORD = 128

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self._bytes = 0
        self._records = 0
        self._batches = 0

    def observe(self, answer_bytes: int, records: int, batches: int) -> None:
        self._bytes += answer_bytes
        self._records += records
        self._batches += batches

    def next_bytes(self, remaining_records: int) -> int:
        if self._records:
            want = remaining_records * self._bytes // self._records + self._bytes // self._batches
        else:
            want = remaining_records * self.GUESS_BYTES_PER_RECORD
        return max(min(want, self.limit_bytes), min(self.MIN_BYTES, self.limit_bytes))


def read_range(settings: ReadSettings, r: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Arrow batches of the rows in `r`, one per Fetch answer, from the partition's leader."""
    # In Spark's Python worker (a process Spark dedicates to such work), the process-wide set-up:
    # logging, the allocator's large buffers, the frozen import-time heap.
    prepare_worker()
    fetcher = PartitionFetcher(
        settings.bootstrap, r.topic, r.partition, leader_hint=r.leader or None, poll_timeout_ms=settings.poll_timeout_ms,
        credentials=settings.credentials,
    )
    builder = ArrowBuilder(r.topic, r.partition, settings.include_headers)
    sizer = FetchSizer(settings.fetch_max_bytes)
    name = f"{r.topic}[{r.partition}]"
    asked: Any = None  # the Fetch in flight, if any, and the max_bytes it asked for
    asked_bytes = 0

    def ask(offset: int) -> None:
        nonlocal asked, asked_bytes
        asked_bytes = sizer.next_bytes(r.until - offset)
        asked = fetcher.request(offset, asked_bytes)

    try:
        offset = r.start
        ask(offset)
        while offset < r.until:
            result = fetcher.result(asked, offset, asked_bytes)
            if result.error == pb.OFFSET_OUT_OF_RANGE:
                if offset < result.log_start_offset:
                    _loss(
                        settings,
                        f"offsets {offset}..{min(r.until, result.log_start_offset) - 1} of {name} were deleted "
                        f"(retention; the log now starts at {result.log_start_offset}) before the query read them",
                        topic=r.topic,
                        partition=r.partition,
                    )
                    offset = result.log_start_offset
                    if offset >= r.until:
                        return
                    ask(offset)
                    continue
                _loss(
                    settings,
                    f"{name} now ends at offset {result.high_watermark} but offsets up to {r.until - 1} were "
                    f"planned: the log was truncated or the topic re-created",
                    topic=r.topic,
                    partition=r.partition,
                )
                return
            if result.error == pb.UNKNOWN_TOPIC_OR_PARTITION:
                _loss(settings, f"{name} no longer exists (deleted)", topic=r.topic, partition=r.partition)
                return
            if result.error != pb.NONE:
                raise from_partition_error(
                    result.error, result.error_message, r.topic, r.partition,
                    log_start_offset=result.log_start_offset, log_end_offset=result.high_watermark,
                )
            batches = records.decode_batches(result.records)
            if not batches:
                _loss(
                    settings,
                    f"{name} has no records at offset {offset} (log end {result.high_watermark}) but offsets up to "
                    f"{r.until - 1} were planned: the log was truncated or the topic re-created",
                    topic=r.topic,
                    partition=r.partition,
                )
                return
            first = batches[0].base_offset
            if first > offset:
                _loss(
                    settings,
                    f"offsets {offset}..{first - 1} of {name} are missing from the log",
                    topic=r.topic,
                    partition=r.partition,
                )
            next_offset = batches[-1].last_offset + 1
            sizer.observe(len(result.records), next_offset - first, len(batches))
            if next_offset < r.until:
                ask(next_offset)  # in flight while we convert
            rb = builder.build(batches, offset, r.until)
            if rb is not None:
                yield rb
            offset = next_offset
    finally:
        fetcher.close()  # drops a Fetch in flight when the consumer stopped early (a LIMIT, a failed task)


# ---------------------------------------------------------------------------------------------
# Batch


class DMQBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.settings = ReadSettings.of(opts)

    def plan(self) -> list[OffsetRange]:
        opts = self.opts
        with SourceClient(opts.bootstrap, credentials=opts.credentials) as client:
            tps = current_partitions(client, opts, streaming=False)
            starts = resolve(client, opts.starting, tps, "startingOffsets")
            ends = resolve(client, opts.ending, tps, "endingOffsets")
            latest = client.list_offsets({tp: LATEST for tp in tps}) if opts.ending.kind == "specific" else {}
            leaders = _leaders(client, tps)
        ranges = []
        for tp in tps:
            start, end = starts[tp], ends[tp]
            if tp in latest and end > latest[tp].log_end_offset:
                raise OptionError(
                    f"endingOffsets for {tp[0]}[{tp[1]}] is {end}, past the log end {latest[tp].log_end_offset}"
                )
            if start > end:
                raise OptionError(
                    f"the starting offset {start} of {tp[0]}[{tp[1]}] is after its ending offset {end} "
                    f"(from {opts.starting.describe()} and {opts.ending.describe()})"
                )
            ranges.append(OffsetRange(tp[0], tp[1], start, end, leaders[tp]))
        return split_ranges(ranges, opts.min_partitions)

    def partitions(self) -> Sequence[InputPartition]:
        return self.plan()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):  # Spark's placeholder when there is nothing to read
            return iter(())
        return read_range(self.settings, partition)


# ---------------------------------------------------------------------------------------------
# Streaming


def rate_limit(
    start: dict[TopicPartition, int], end: dict[TopicPartition, int], max_rows: int
) -> dict[TopicPartition, int]:
    """End offsets holding at most `max_rows` rows in all, shared in proportion to each
    partition's backlog (largest remainders get the leftover rows, so the sum is exact)."""
    sizes = {tp: max(end[tp] - start.get(tp, 0), 0) for tp in end}
    total = sum(sizes.values())
    if total <= max_rows:
        return dict(end)
    shares = {tp: max_rows * size / total for tp, size in sizes.items()}
    take = {tp: int(share) for tp, share in shares.items()}
    leftover = max_rows - sum(take.values())
    for tp in sorted(shares, key=lambda tp: (take[tp] - shares[tp], tp)):
        if leftover <= 0:
            break
        if take[tp] < sizes[tp]:
            take[tp] += 1
            leftover -= 1
    return {tp: start.get(tp, 0) + take[tp] if sizes[tp] else end[tp] for tp in end}


class DMQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader. Runs in one long-lived Python process on the driver, so it keeps a
    client between calls; the copy pickled to executors only needs `settings` for read()."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.settings = ReadSettings.of(opts)
        self._client: SourceClient | None = None
        self._latest: dict[TopicPartition, int] | None = None  # last seen log ends (for progress)
        self._target: dict[TopicPartition, int] | None = None  # Trigger.AvailableNow's end
        self._last_end: dict[TopicPartition, int] | None = None  # for Spark without read limits
        self._leaders: dict[TopicPartition, str] = {}
        self._group_committed: dict[TopicPartition, int] | None = None
        self._warned: set[str] = set()  # missing topics already logged
        self._group_error: str | None = None  # the last group commit failure, logged once

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        return state

    @property
    def client(self) -> SourceClient:
        if self._client is None:
            self._client = SourceClient(self.opts.bootstrap, credentials=self.opts.credentials)
        return self._client

    def _log_ends(self) -> dict[TopicPartition, int]:
        tps = current_partitions(self.client, self.opts, streaming=True, warned=self._warned)
        answers = self.client.list_offsets({tp: LATEST for tp in tps})
        self._leaders = _leaders(self.client, tps)
        return {tp: answers[tp].log_end_offset for tp in tps}

    def initialOffset(self) -> dict[str, dict[str, int]]:
        tps = current_partitions(self.client, self.opts, streaming=True, warned=self._warned)
        offsets = resolve(self.client, self.opts.starting, tps, "startingOffsets")
        self._last_end = offsets
        return to_json(offsets)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._log_ends()
        log.info("available-now target fixed", partitions=len(self._target), rows_max=sum(self._target.values()))

    def getDefaultReadLimit(self) -> Any:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None) -> dict[str, dict[str, int]]:
        begin = from_json(start) if start is not None else dict(self._last_end or {})
        if start is not None:
            self._commit_to_group(begin)  # the batch ending at `start` is complete
        ends = self._log_ends()
        self._latest = dict(ends)
        if self._target is not None:
            # AvailableNow: nothing appended after the trigger started, nor partitions added since
            ends = {tp: min(end, self._target[tp]) for tp, end in ends.items() if tp in self._target}
        for tp, off in begin.items():
            if tp not in ends:
                if self._target is not None and tp not in self._target:
                    continue
                _loss(
                    self.settings,
                    f"{tp[0]}[{tp[1]}] was read up to offset {off} but no longer exists (topic deleted)",
                    topic=tp[0],
                    partition=tp[1],
                )
        max_rows: int | None = None
        if HAS_READ_LIMITS and isinstance(limit, ReadMaxRows):
            max_rows = limit.max_rows
        elif limit is None and start is None and self._last_end is not None:
            max_rows = self.opts.max_offsets_per_trigger  # older Spark: no ReadLimit
        if max_rows is not None:
            ends = rate_limit({tp: min(begin.get(tp, 0), ends[tp]) for tp in ends}, ends, max_rows)
        # partitions that were dropped with failOnDataLoss=false stay out of the offsets
        self._last_end = ends
        return to_json(ends)

    def reportLatestOffset(self) -> dict[str, dict[str, int]] | None:
        return None if self._latest is None else to_json(self._latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = from_json(start)
        stop = from_json(end)
        ranges = []
        for tp, until in sorted(stop.items()):
            since = begin.get(tp, 0)  # a partition added since the last batch starts at 0
            if since > until:
                _loss(
                    self.settings,
                    f"{tp[0]}[{tp[1]}] was read up to offset {since} but its log now ends at {until} "
                    f"(the topic was re-created?)",
                    topic=tp[0],
                    partition=tp[1],
                )
                since = 0  # the new log's records are read rather than skipped
            ranges.append(OffsetRange(tp[0], tp[1], since, until, self._leaders.get(tp, "")))
        return split_ranges(ranges, self.opts.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):
            return iter(())
        return read_range(self.settings, partition)

    def commit(self, end: dict[str, Any]) -> None:
        self._last_end = from_json(end)
        self._commit_to_group(from_json(end))

    def _commit_to_group(self, offsets: dict[TopicPartition, int]) -> None:
        """Mirror finished offsets into the groupId's consumer groups, best effort.

        Spark calls commit(end) only when it starts the batch after the one ending at `end`, so
        an availableNow query's last batch would never be committed; latestOffset(start) comes
        right after a batch completes (start = its end, already in the checkpoint's commit log),
        so both call this. Progress itself lives in the checkpoint; this is for
        `dmq groups describe` and lag monitoring.
        """
        if not self.opts.group_id or not offsets or offsets == self._group_committed:
            return
        try:
            self.client.commit_as_operator(self.opts.group_id, offsets)
        except DMQError as e:
            # once per distinct failure: a group shared with live consumers refuses every commit
            level = log.debug if str(e) == self._group_error else log.warning
            level("committing the stream's offsets to its group failed", group=self.opts.group_id, error=str(e))
            self._group_error = str(e)
        else:
            self._group_error = None
            self._group_committed = dict(offsets)
            log.debug("stream offsets committed", group=self.opts.group_id, partitions=len(offsets))

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
