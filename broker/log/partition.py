"""The durable log of one topic-partition.

Directory `<data_dir>/<topic>-<partition>/`:

    <base:020d>.log / .index / .timeindex   segments (see segment.py, index.py)
    <base:020d>.traceindex                  trace id -> offsets of the segment (trace_index.py)
    <offset:020d>.snapshot                  idempotent-producer state as of `offset` (producer_state.py)
    checkpoint                              "dmq-log-checkpoint 1 <log_start_offset> <recovery_offset>
                                             <last_append_ms> <crc32>" (last_append_ms keeps append
                                             times monotonic when retention removed every batch)
    .clean_shutdown                         written by close(): "dmq-clean-shutdown 1 <log_end_offset>
                                             <active_base> <active_size> <last_append_ms>\n" followed by
                                             the producer state snapshot as of the log end
    config.json                             the LogConfig, when it differs from the owner's default

Invariants:
  - every segment whose base offset is below `recovery_offset` is fully fsynced together with its
    index files; segments from the one containing `recovery_offset` on may have a torn tail.
  - `log_start_offset` only grows; it is written to `checkpoint` (fsynced) BEFORE the segments
    below it are deleted, so a crash in between only leaves files that open() deletes.
  - `.clean_shutdown` exists only while the files are exactly as close() left them: it is removed
    (and the removal made durable by the next flush) before the first change after opening.
  - `durable_end_offset` <= `log_end_offset`: everything below it has been fsynced.

Opening (`_load`):
  1. clean marker present and matching the active segment's size: trust everything, no scan;
     indexes of older segments are loaded lazily on first use.
  2. otherwise: every segment from the one containing `recovery_offset` is scanned in 8 MiB reads
     (header checks, CRC, contiguous offsets); a torn/corrupt tail is truncated and later segments
     deleted (WARNING logged with topic, partition, segment, position, bytes); indexes are rebuilt.
  3. producer state: newest readable snapshot at or below the log end, then the batch headers
     from its offset to the log end are replayed.

Concurrency: appends, reads and retention may come from the event loop and from worker threads
(the broker runs retention and interval flushes with asyncio.to_thread), so state changes happen
under one per-partition lock. fsync never runs under it: a flush job is prepared under the lock
(descriptors pinned in the FileCache), fsynced outside, and completed under the lock again.

I/O errors are transient (EMFILE, ENOSPC, EINTR, EIO ...): the operation fails with a
StorageUnavailableError and the log stays consistent and writable:
  - a failed write cuts its partial bytes off at once (or before the next append, if that cut
    failed too), so nothing after it lands behind garbage;
  - a failed group-commit flush (flush_policy "fsync") ROLLS THE LOG BACK to durable_end_offset:
    every batch appended since the last successful fsync is removed (files truncated, producer
    state forgotten) and every acks=all waiter gets the error. Why not keep those bytes and fsync
    them later: after a failed fsync Linux may already have dropped the dirty pages' error state
    (a later fsync succeeds without writing them), and a produce reported as failed must not
    reappear later (a non-idempotent retry would duplicate it). acks=1 batches appended since the
    last fsync are removed too: exactly what a crash at that moment would do, which is all acks=1
    promises. Under flush_policy "interval" every batch was acknowledged already, so nothing is
    rolled back and the next interval flush retries.
  - batches of acks=all produces are not visible to readers (`visible_end_offset`) until they are
    durable, so no consumer ever reads a batch that a rollback then removes.
Only damage in the files (CorruptLogError) takes the partition offline, for appends only: reads
are served around the damaged batches (see segment.py), which are never served.

Group commit (`append_durable`): a caller waits until `durable_end_offset` covers its batch. If a
flush is already in flight it waits for that one and, if the flush started before its write (so
does not cover it), for the next; one flush is in flight at a time and it covers every write made
before it started, so N concurrent callers cost ~2 fsyncs, not N. While the disk answers fast, the
LogManager's FsyncPlacement runs that flush on the event loop's thread instead of the pool (after
one yield, so that appends already due join it): see fsync_placement.py for why and the limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import struct
import threading
import time
import zlib
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import structlog

from dmq.broker.log.append_info import AppendInfo
from dmq.broker.log.dedup import DEFAULT_MAX_ENTRIES
from dmq.broker.log.errors import (
    CorruptLogError,
    InvalidBatchError,
    LogClosedError,
    LogError,
    OffsetOutOfRangeError,
    StorageUnavailableError,
)
from dmq.broker.log.fsync_placement import FsyncPlacement
from dmq.broker.log.handles import FileCache
from dmq.broker.log.index import fsync_path
from dmq.broker.log.producer_state import SNAPSHOT_SUFFIX, ProducerStateManager, list_snapshots, snapshot_path
from dmq.broker.log.record_ids import RecordIds
from dmq.broker.log.scan import Damaged
from dmq.broker.log.segment import LOG_SUFFIX, MAX_RELATIVE_OFFSET, Segment, SegmentCorruptError
from dmq.proto.limits import DEDUP_WINDOW_MS_DEFAULT, DEDUP_WINDOW_MS_MAX
from dmq.proto.records import (
    ATTR_HAS_TRACE_IDS,
    ATTR_HAS_TXN_IDS,
    DEFAULT_MAX_BATCH_BYTES,
    BatchHeader,
    RecordsError,
    patch_base_offset,
    validate_batch,
)

__all__ = ["AppendInfo", "LogConfig", "PartitionLog", "RecoveryInfo"]

log = structlog.get_logger(__name__)

CHECKPOINT_FILE = "checkpoint"
CLEAN_SHUTDOWN_FILE = ".clean_shutdown"
CONFIG_FILE = "config.json"
_CHECKPOINT_MAGIC = "dmq-log-checkpoint 1"
_MARKER_MAGIC = "dmq-clean-shutdown 1"
_INT64 = struct.Struct("<q")
SNAPSHOTS_KEPT = 2
TIME_INDEX_SYNC_INTERVAL_S = 1.0
FLUSH_POLICIES = ("fsync", "interval")

GiB = 1024**3
DAY_MS = 24 * 3600 * 1000


class _PartitionLogger:
    """Adds topic/partition to every event. Not a bound logger: binding at construction would
    freeze the structlog configuration of that moment (tests capture logs, the CLI configures
    rendering later)."""

    __slots__ = ("_fields",)

    def __init__(self, topic: str, partition: int) -> None:
        self._fields = {"topic": topic, "partition": partition}

    def debug(self, event: str, **kw: Any) -> None:
        log.debug(event, **self._fields, **kw)

    def info(self, event: str, **kw: Any) -> None:
        log.info(event, **self._fields, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        log.warning(event, **self._fields, **kw)

    def error(self, event: str, **kw: Any) -> None:
        log.error(event, **self._fields, **kw)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class LogConfig:
    segment_bytes: int = 1 * GiB
    segment_ms: int = 7 * DAY_MS
    retention_ms: int = 7 * DAY_MS  # -1 = keep forever
    retention_bytes: int = -1  # -1 = no size limit
    index_interval_bytes: int = 4096
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    flush_policy: str = "fsync"  # "fsync": acks=all waits for a (group-commit) fsync; "interval"
    flush_interval_ms: int = 1000
    producer_id_expiration_ms: int = DAY_MS  # idle producers' de-duplication state is dropped
    dedup_window_ms: int = DEDUP_WINDOW_MS_DEFAULT  # transaction ids (dedup.py); 0 = off
    dedup_max_entries: int = DEFAULT_MAX_ENTRIES  # transaction ids kept per partition (dedup.py)

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> None:
            raise ValueError(f"LogConfig.{name}={getattr(self, name)!r}: {why}")

        if not 1024 <= self.segment_bytes <= 2**31 - 1:
            bad("segment_bytes", "must be within 1024..2**31-1 (positions are stored as uint32)")
        if self.segment_ms <= 0:
            bad("segment_ms", "must be > 0")
        if self.retention_ms < -1:
            bad("retention_ms", "must be >= 0, or -1 for unlimited")
        if self.retention_bytes < -1:
            bad("retention_bytes", "must be >= 0, or -1 for unlimited")
        if self.index_interval_bytes < 1:
            bad("index_interval_bytes", "must be >= 1")
        if not 64 <= self.max_batch_bytes <= 2**31 - 1:
            bad("max_batch_bytes", "must be within 64..2**31-1")
        if self.flush_policy not in FLUSH_POLICIES:
            bad("flush_policy", f"must be one of {FLUSH_POLICIES}")
        if self.flush_interval_ms <= 0:
            bad("flush_interval_ms", "must be > 0")
        if not 0 <= self.dedup_window_ms <= DEDUP_WINDOW_MS_MAX:
            bad("dedup_window_ms", f"must be within 0..{DEDUP_WINDOW_MS_MAX}")
        if self.dedup_max_entries < 1:
            bad("dedup_max_entries", "must be >= 1")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LogConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in json.loads(text).items() if k in known})


@dataclass(slots=True)
class RecoveryInfo:
    """How the last open went; `clean` means no segment was scanned."""

    clean: bool
    segments_scanned: int = 0
    bytes_scanned: int = 0
    bytes_truncated: int = 0
    segments_deleted: int = 0
    damaged_batches: int = 0  # kept on disk (valid batches follow them), never served
    producer_batches_replayed: int = 0
    duration_s: float = 0.0


@dataclass(slots=True)
class _FlushJob:
    end_offset: int
    fds: list[tuple[str, int]]
    extra_paths: list[str]  # index and snapshot files of rolled segments
    dir_gen: int  # directory generation to fsync up to, 0 when clean
    sync_parent: bool  # the partition directory itself is new: fsync its parent too
    recovery_offset: int | None
    segments: list[Segment]
    epoch: int  # the log's rollback epoch when prepared: a flush from before a rollback proves nothing


@dataclass(slots=True)
class VerifyReport:
    """What `PartitionLog.verify()` found; `ok` when nothing."""

    segments: int = 0
    batches: int = 0
    bytes: int = 0
    problems: list[str] = field(default_factory=list)  # damage: the partition is corrupt
    indexes_rebuilt: list[str] = field(default_factory=list)  # index files that were inconsistent
    first_corrupt_offset: int | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(slots=True)
class _Marker:
    log_end_offset: int
    active_base: int
    active_size: int
    last_append_ms: int
    producers: ProducerStateManager | None


def _read_small(path: str, cache: FileCache) -> str | None:
    with cache.reserve():
        try:
            with open(path, encoding="ascii") as f:
                return f.read(4096)
        except (FileNotFoundError, UnicodeDecodeError):
            return None


def _atomic_write(path: str, data: bytes, fsync_fn: Callable[[int], None] | None, cache: FileCache) -> None:
    """tmp + rename, with fsyncs of the file and the directory when fsync_fn is given."""
    tmp = path + ".tmp"
    with cache.reserve():
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            os.write(fd, data)
            if fsync_fn is not None:
                fsync_fn(fd)
        finally:
            os.close(fd)
    os.replace(tmp, path)
    if fsync_fn is not None:
        _fsync_dir(os.path.dirname(path), fsync_fn, cache)


def _fsync_dir(path: str, fsync_fn: Callable[[int], None], cache: FileCache) -> None:
    """Through the cache's descriptor for the directory (kept for the next time)."""
    fd = cache.pin(path, directory=True)
    try:
        fsync_fn(fd)
    finally:
        cache.unpin(path, fd)


class PartitionLog:
    """See the module docstring. Public attributes are read-only for callers."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        topic: str,
        partition: int,
        config: LogConfig | None = None,
        *,
        clock_ms: Callable[[], int] | None = None,
        fsync: Callable[[int], None] | None = None,
        file_cache: FileCache | None = None,
        executor: Executor | None = None,
        fsync_placement: FsyncPlacement | None = None,
        persist_config: bool = True,
    ) -> None:
        self.directory = os.fspath(directory)
        self.topic = topic
        self.partition = partition
        self._clock = clock_ms or wall_clock_ms
        # fdatasync: the data and the file size, without the inode's timestamps.
        self._fsync: Callable[[int], None] = fsync if fsync is not None else getattr(os, "fdatasync", os.fsync)
        self._owns_cache = file_cache is None
        self._cache = file_cache or FileCache(64)
        self._owns_executor = executor is None
        self._executor: Executor | None = executor
        # None: every group-commit fsync runs in the executor (see fsync_placement.py)
        self._placement = fsync_placement
        self._log = _PartitionLogger(topic, partition)
        self._where = f"{topic}[{partition}]: "  # error message prefix
        self._lock = threading.RLock()
        self._ckpt_lock = threading.Lock()

        self.log_start_offset = 0
        self.log_end_offset = 0
        self.size_bytes = 0
        self.durable_end_offset = 0
        self.recovery: RecoveryInfo = RecoveryInfo(clean=True)
        self._recovery_offset = 0
        self._checkpoint_written: tuple[int, int] | None = None  # (log_start, recovery) on disk
        self._segments: list[Segment] = []
        self._bases: list[int] = []
        self._unflushed: list[Segment] = []  # rolled, not yet fsynced
        self._pending_paths: list[str] = []  # files written at roll, fsynced by the next flush
        self._last_append_ms = 0
        self._producers = ProducerStateManager()
        self._record_ids = RecordIds()  # transaction ids and trace ids (record_ids.py)
        self._marker_present = False
        self._dir_gen = 0  # bumped on every directory change (create, unlink, rename)
        self._parent_dirty = False  # the partition directory was created and not yet fsynced in its parent
        self._dir_synced_gen = 0
        self._time_index_synced: tuple[str, int] = ("", 0)  # (path, entries) last fsynced
        self._time_index_synced_at = 0.0  # time.monotonic() of that fsync
        self._inflight: asyncio.Future[None] | None = None
        self._background: set[Future[Any]] = set()
        # Bumped by every rollback: a waiter whose batch was appended in an older epoch lost it.
        self._rollback_epoch = 0
        self._rollback_cause = ""
        self._rollback_errno: int | None = None
        self._rollbacks: deque[tuple[int, int]] = deque(maxlen=64)  # (epoch, offset), recent ones
        self._rollback_unfinished: list[str] = []  # files a rollback could not remove yet
        self._rollback_pending = False  # a rollback's file work is not all done
        # Base offsets of acks=all batches not yet durable, ascending: readers stop at the first.
        self._held: deque[int] = deque()
        self._corruption: CorruptLogError | None = None  # first damage found; appends refused
        self._reported: set[tuple[str, int]] = set()  # (segment, position) of damage logged
        self._closed = False

        fresh = not os.path.isdir(self.directory)
        if fresh:
            os.makedirs(self.directory, exist_ok=True)
            self._parent_dirty = True
        config_path = os.path.join(self.directory, CONFIG_FILE)
        if fresh and not persist_config:
            config = config or LogConfig()
        elif config is None:
            text = _read_small(config_path, self._cache)
            try:
                config = LogConfig.from_json(text) if text else LogConfig()
            except (ValueError, TypeError):
                config = LogConfig()
        elif not persist_config:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(config_path)  # a stale override must not come back on the next open
        elif _read_small(config_path, self._cache) != config.to_json():
            _atomic_write(config_path, config.to_json().encode(), None, self._cache)
        self.config = config
        if fresh:
            self._create_empty(0)
        else:
            self._load()

    def __repr__(self) -> str:
        return (
            f"PartitionLog({self.topic}[{self.partition}], start={self.log_start_offset}, "
            f"end={self.log_end_offset}, durable={self.durable_end_offset}, segments={len(self._segments)}, "
            f"size_bytes={self.size_bytes}{', closed' if self._closed else ''})"
        )

    # -- properties ------------------------------------------------------------------------------

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def segment_base_offsets(self) -> list[int]:
        with self._lock:
            return list(self._bases)

    @property
    def recovery_offset(self) -> int:
        return self._recovery_offset

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def rollback_epoch(self) -> int:
        """Bumped whenever the log is cut back (a failed flush rolled back, a truncation to the
        leader's history, a restart at the leader's log start): bytes read at an offset are still
        the bytes there while it stays the same (readers that keep a batch: queue pops)."""
        return self._rollback_epoch

    @property
    def visible_end_offset(self) -> int:
        """Readers see offsets below this: the log end, except that a batch of an acks=all
        produce (and everything after it) stays hidden until it is durable."""
        with self._lock:
            held = self._held
            while held and held[0] < self.durable_end_offset:
                held.popleft()
            return held[0] if held else self.log_end_offset

    @property
    def corruption(self) -> CorruptLogError | None:
        """The first damage found in this partition's files (None: none known)."""
        return self._corruption

    @property
    def status(self) -> str:
        """"ok", or "corrupt" (damage found: appends refused, reads served around it)."""
        return "corrupt" if self._corruption is not None else "ok"

    # -- files kept beside the log by its owner (the replication's epoch cache) ------------------

    def write_side_file(self, name: str, data: bytes) -> None:
        """Replace `name` in the partition directory atomically and durably (tmp + fsync +
        rename + directory fsync). Raises StorageUnavailableError."""
        try:
            _atomic_write(os.path.join(self.directory, name), data, self._fsync, self._cache)
        except OSError as e:
            raise StorageUnavailableError.from_os_error(self._where, f"writing {name}", e) from e

    def read_side_file(self, name: str, max_chars: int = 1 << 20) -> str | None:
        """The text of `name` in the partition directory (at most max_chars), None when absent
        or not ASCII."""
        with self._cache.reserve():
            try:
                with open(os.path.join(self.directory, name), encoding="ascii") as f:
                    return f.read(max_chars)
            except (FileNotFoundError, UnicodeDecodeError):
                return None

    # -- opening ---------------------------------------------------------------------------------

    def _load(self) -> None:
        t0 = time.perf_counter()
        d = self.directory
        bases = []
        with self._cache.reserve():
            names = os.listdir(d)
        for name in names:
            if name.endswith(".tmp"):
                os.unlink(os.path.join(d, name))
            elif name.endswith(LOG_SUFFIX) and name[: -len(LOG_SUFFIX)].isdigit():
                bases.append(int(name[: -len(LOG_SUFFIX)]))
        bases.sort()
        ckpt = self._read_checkpoint()
        marker = self._read_marker()
        self._marker_present = marker is not None
        interval = self.config.index_interval_bytes

        if not bases:
            self._create_empty(ckpt[0] if ckpt else 0)
            self._last_append_ms = max(ckpt[2] if ckpt else 0, marker.last_append_ms if marker else 0)
            self.recovery.clean = marker is not None
            return

        log_start = max(ckpt[0], bases[0]) if ckpt else bases[0]
        # Segments entirely below log_start: a crash hit retention between checkpoint and unlink.
        while len(bases) > 1 and bases[1] <= log_start:
            Segment(d, bases.pop(0), self._cache, interval).delete_files()
            self._dir_gen += 1
        if bases[-1] < log_start:
            # The log start is a segment base except after a crash inside restart_at(), before
            # its new segment existed: every segment is below it and goes.
            for b in bases:
                Segment(d, b, self._cache, interval).delete_files()
            self._create_empty(log_start)
            self._last_append_ms = ckpt[2] if ckpt else 0
            self.recovery.clean = False
            return
        recovery_offset = ckpt[1] if ckpt else bases[0]
        segments = []
        for b in bases:
            size = os.stat(os.path.join(d, f"{b:020d}{LOG_SUFFIX}")).st_size
            segments.append(Segment(d, b, self._cache, interval, size=size))
        for seg, nxt in zip(segments, bases[1:]):
            seg.next_offset = nxt
        active = segments[-1]
        self._segments, self._bases = segments, list(bases)
        self.log_start_offset = log_start
        self._recovery_offset = recovery_offset

        clean = marker is not None and marker.active_base == active.base_offset and marker.active_size == active.size
        info = RecoveryInfo(clean=clean)
        # The floor for append times, before _recover() rewrites the checkpoint that carries it:
        # when retention has emptied the log, no segment holds the last append time any more.
        self._last_append_ms = ckpt[2] if ckpt else 0
        if clean:
            assert marker is not None
            active.next_offset = marker.log_end_offset
            active.ensure_indexes()
            active.set_active_state(marker.log_end_offset)
        else:
            if marker is not None:
                self._log.warning(
                    "clean-shutdown marker does not match the files; recovering",
                    marker=(marker.log_end_offset, marker.active_base, marker.active_size),
                    active_base=active.base_offset,
                    active_size=active.size,
                )
            self._recover(info)
        self.log_end_offset = self._segments[-1].next_offset
        self.durable_end_offset = self.log_end_offset
        self.size_bytes = sum(s.size for s in self._segments)
        last_time = self._segments[-1].largest_time_ms
        if last_time is None and len(self._segments) > 1:
            last_time = self._segments[-2].largest_time_ms
        self._last_append_ms = max(last_time or 0, self._last_append_ms)
        if clean and marker is not None and marker.producers is not None:
            self._last_append_ms = max(self._last_append_ms, marker.last_append_ms)
            self._producers = marker.producers
        else:
            info.producer_batches_replayed = self._load_producer_state()
        info.duration_s = time.perf_counter() - t0
        self.recovery = info
        self._log.info(
            "log opened",
            clean=clean,
            log_start_offset=self.log_start_offset,
            log_end_offset=self.log_end_offset,
            segments=len(self._segments),
            segments_scanned=info.segments_scanned,
            bytes_truncated=info.bytes_truncated,
            damaged_batches=info.damaged_batches,
            duration_s=round(info.duration_s, 4),
        )

    def _create_empty(self, start: int) -> None:
        """A new log (or one whose segments are all gone) starting at `start`."""
        seg = Segment.create(self.directory, start, self._cache, self.config.index_interval_bytes)
        self._segments, self._bases = [seg], [start]
        self.log_start_offset = self.log_end_offset = self.durable_end_offset = start
        self._recovery_offset = start
        self._dir_gen += 1
        self.recovery = RecoveryInfo(clean=True)
        self._log.debug("log created", directory=self.directory, base_offset=start)

    def _recover(self, info: RecoveryInfo) -> None:
        """Scan the segments that may have torn tails (see module docstring)."""
        segs = self._segments
        first = max(bisect_right(self._bases, self._recovery_offset) - 1, 0)
        now = self._clock()
        min_time = 0
        if first > 0:
            min_time = segs[first - 1].largest_time_ms or 0
        max_batch = max(self.config.max_batch_bytes, DEFAULT_MAX_BATCH_BYTES)
        i = first
        while i < len(segs):
            seg = segs[i]
            result = seg.scan(max_batch_bytes=max_batch, min_time_ms=min_time, now_ms=now)
            for d in result.damaged:
                info.damaged_batches += 1
                self._record_damage(seg, d.position, d.first_offset, d.last_offset, d.reason, at="recovery")
            info.segments_scanned += 1
            info.bytes_scanned += result.valid_bytes + result.truncated_bytes
            min_time = seg.largest_time_ms or min_time
            if result.truncated_bytes:
                info.bytes_truncated += result.truncated_bytes
                self._log.warning(
                    "truncated log tail",
                    segment=os.path.basename(seg.log_path),
                    position=result.valid_bytes,
                    bytes_truncated=result.truncated_bytes,
                    reason=result.reason,
                )
            later = segs[i + 1 :]
            if later and not result.truncated_bytes and seg.next_offset != later[0].base_offset:
                self._log.warning(
                    "segment does not end where the next one starts",
                    segment=os.path.basename(seg.log_path),
                    next_offset=seg.next_offset,
                    next_segment_base=later[0].base_offset,
                )
            if later and result.truncated_bytes:
                # Offsets must continue into the next segment; everything after a cut is unusable.
                for dead in later:
                    self._log.warning(
                        "deleted segment after a truncated one",
                        segment=os.path.basename(dead.log_path),
                        bytes=dead.size,
                    )
                    info.bytes_truncated += dead.size
                    dead.delete_files()
                    info.segments_deleted += 1
                del segs[i + 1 :]
                del self._bases[i + 1 :]
                self._dir_gen += 1
            i += 1
        # What was recovered may only be in the page cache (process crash): make it durable so the
        # recovery offset can move to the active segment and durable_end_offset = log end is true.
        for seg in segs[first:]:
            self._fsync(self._cache.fd(seg.log_path))
            if seg is not segs[-1]:
                fsync_path(seg.index.path, self._fsync, self._cache)
                fsync_path(seg.time_index.path, self._fsync, self._cache)
        self._recovery_offset = segs[-1].base_offset
        self._write_checkpoint(sync=True)

    def _load_producer_state(self) -> int:
        """Newest usable snapshot <= log end, then replay the headers after it. Returns batches replayed."""
        end = self.log_end_offset
        state = None
        start = self.log_start_offset
        with self._cache.reserve():
            snapshot_offsets = list_snapshots(self.directory)
        for off in reversed(snapshot_offsets):
            path = snapshot_path(self.directory, off)
            if off > end:
                os.unlink(path)  # describes batches that were truncated away
                continue
            if state is not None:
                continue
            try:
                with self._cache.reserve(), open(path, "rb") as f:
                    snap_off, snap = ProducerStateManager.from_bytes(f.read())
            except (OSError, ValueError, KeyError, TypeError) as e:
                self._log.warning("ignoring unreadable producer state snapshot", file=path, error=str(e))
                continue
            state, start = snap, max(snap_off, self.log_start_offset)
        self._producers = state or ProducerStateManager()
        if start >= end:
            return 0
        replayed = 0
        i = max(bisect_right(self._bases, start) - 1, 0)
        for seg in self._segments[i:]:
            seg.ensure_indexes()
            for _pos, h in seg.iter_headers(max(start, seg.base_offset)):
                if h[8] < 0:
                    continue
                t = seg.time_index.time_of(h[0] - seg.base_offset)
                if t is None:
                    t = self._last_append_ms
                self._producers.update(h[8], h[9], h[10], h[5], h[0], h[0] + h[5] - 1, t)
                replayed += 1
        return replayed

    def _read_checkpoint(self) -> tuple[int, int, int] | None:
        """(log_start_offset, recovery_offset, last_append_ms) or None."""
        text = _read_small(os.path.join(self.directory, CHECKPOINT_FILE), self._cache)
        if not text:
            return None
        try:
            body, _, crc = text.strip().rpartition(" ")
            words = body.split(" ")
            if " ".join(words[:2]) != _CHECKPOINT_MAGIC or len(words) != 5:
                raise ValueError("bad checkpoint")
            if int(crc, 16) != zlib.crc32(body.encode()):
                raise ValueError("bad checkpoint crc")
            self._checkpoint_written = (int(words[2]), int(words[3]))
            return int(words[2]), int(words[3]), int(words[4])
        except ValueError:
            self._log.warning("ignoring unreadable checkpoint file", content=text[:200])
            return None

    def _write_checkpoint(self, *, sync: bool) -> None:
        """Persist log_start_offset and recovery_offset (any thread)."""
        with self._ckpt_lock:
            start, recovery = self.log_start_offset, self._recovery_offset
            body = f"{_CHECKPOINT_MAGIC} {start} {recovery} {self._last_append_ms}"
            data = f"{body} {zlib.crc32(body.encode()):08x}\n".encode()
            _atomic_write(os.path.join(self.directory, CHECKPOINT_FILE), data, self._fsync if sync else None, self._cache)
            self._checkpoint_written = (start, recovery)

    def _read_marker(self) -> _Marker | None:
        path = os.path.join(self.directory, CLEAN_SHUTDOWN_FILE)
        with self._cache.reserve():
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                return None
        first, _, rest = data.partition(b"\n")
        try:
            words = first.decode("ascii").split()
            if " ".join(words[:2]) != _MARKER_MAGIC or len(words) != 6:
                raise ValueError(f"bad marker line {first[:100]!r}")
            end, base, size, last_ms = (int(x) for x in words[2:])
        except (ValueError, UnicodeDecodeError) as e:
            self._log.warning("ignoring unreadable clean-shutdown marker", error=str(e))
            return None
        producers = None
        try:
            snap_end, producers = ProducerStateManager.from_bytes(rest)
            if snap_end != end:
                raise ValueError(f"snapshot at {snap_end}, log end {end}")
        except (ValueError, KeyError, TypeError) as e:
            self._log.warning("producer state in the clean-shutdown marker unreadable; rebuilding", error=str(e))
            producers = None
        return _Marker(end, base, size, last_ms, producers)

    def _before_change(self) -> None:
        """First change after opening: the files are no longer as close() left them."""
        if self._marker_present:
            try:
                os.unlink(os.path.join(self.directory, CLEAN_SHUTDOWN_FILE))
            except FileNotFoundError:
                pass
            self._marker_present = False
            self._dir_gen += 1

    def _check_writable(self) -> None:
        if self._closed:
            raise LogClosedError(f"log {self.topic}[{self.partition}] is closed")
        if self._corruption is not None:
            c = self._corruption
            raise CorruptLogError(
                f"{self._where}offline for appends: {c}", topic=self.topic, partition=self.partition,
                offset=c.offset, segment=c.segment, position=c.position,
            )
        if self._rollback_pending:
            self._finish_rollback()

    # -- damage ----------------------------------------------------------------------------------

    def _damage_error(self, seg: Segment, position: int, first: int, last: int, reason: str) -> CorruptLogError:
        offsets = f"offsets {first}..{last}" if last >= first else f"after offset {first - 1}"
        return CorruptLogError(
            f"{self._where}corrupt data at {offsets} ({os.path.basename(seg.log_path)} position {position}: "
            f"{reason}); it is never served: check the files with `dmq topics verify {self.topic}`",
            topic=self.topic, partition=self.partition, offset=first,
            segment=seg.log_path, position=position,
        )

    def _record_damage(
        self, seg: Segment, position: int, first: int, last: int, reason: str, *, at: str
    ) -> CorruptLogError:
        """Log damage found in `seg` (once per place) and take the partition offline for appends
        (under the lock or while opening)."""
        err = self._damage_error(seg, position, first, last, reason)
        if (seg.log_path, position) in self._reported:
            return err
        self._reported.add((seg.log_path, position))
        self._log.error(
            "corrupt batch in the log; partition offline for appends, valid data around it kept",
            segment=os.path.basename(seg.log_path), position=position, first_offset=first,
            last_offset=last, reason=reason, found_by=at,
        )
        if self._corruption is None:
            self._corruption = err
        return err

    def _damage_found(self, seg: Segment, e: SegmentCorruptError, offset: int) -> CorruptLogError:
        """A read met bad bytes: find where valid batches resume after them (a scan just past the
        damage, not of the whole segment: the event loop waits for it), so later reads stop
        before them and offsets after them stay readable (under the lock)."""
        try:
            found = seg.find_damage(
                e.position, e.expected_offset, max(self.config.max_batch_bytes, DEFAULT_MAX_BATCH_BYTES)
            )
        except OSError as oe:
            raise StorageUnavailableError.from_os_error(self._where, f"scan of {seg.log_path}", oe) from oe
        for d in found:
            self._record_damage(seg, d.position, d.first_offset, d.last_offset, d.reason, at="read")
        for d in found:
            if d.first_offset <= offset <= d.last_offset or d.position == e.position:
                return self._damage_error(seg, d.position, d.first_offset, d.last_offset, d.reason)
        if found:
            d = found[0]
            return self._damage_error(seg, d.position, d.first_offset, d.last_offset, d.reason)
        # The scan found nothing wrong (a transient read problem): report it, don't mark the log.
        return self._damage_error(seg, e.position, offset, offset, str(e))

    # -- rollback --------------------------------------------------------------------------------

    def _rollback(self, offset: int, cause: str, errno_: int | None = None) -> None:
        """Cut the log back to `offset` (>= log start, a batch boundary: durable_end_offset) after
        a failed flush: in memory first, then the files (under the lock). What the files could not
        take yet is retried before the next append (`_finish_rollback`)."""
        position = None
        if offset < self.log_end_offset:
            target = self._segments[max(bisect_right(self._bases, offset) - 1, 0)]
            try:
                position = target.position_of(offset)  # before any change: may fail (damage, I/O)
            except (LogError, OSError) as e:
                self._log.error("cannot roll back after a failed flush; batches stay", offset=offset, error=str(e))
                return
        self._rollback_epoch += 1
        self._rollbacks.append((self._rollback_epoch, offset))
        self._rollback_cause = cause
        self._rollback_errno = errno_
        self._held.clear()
        if position is None:
            return
        dropped = self.log_end_offset - offset
        self._cut_locked(offset, position)
        self._log.warning(
            "flush failed; log rolled back to its durable end", offset=offset, offsets_dropped=dropped,
            cause=cause,
        )
        try:
            self._finish_rollback()
        except StorageUnavailableError as e:  # retried before the next append
            self._log.warning("rollback not finished on disk yet", error=str(e))

    def _cut_locked(self, offset: int, position: int) -> None:
        """Drop everything from `offset` (at byte `position` of its segment) on, in memory and
        then in the files; what the files could not take yet is retried by _finish_rollback.
        Shared by a rollback and a replica's truncation (truncate_to)."""
        segs = self._segments
        doomed: list[str] = []
        while len(segs) > 1 and segs[-1].base_offset > offset:
            dead = segs.pop()
            self._bases.pop()
            snap = snapshot_path(self.directory, dead.base_offset)
            gone = (dead.index.path, dead.time_index.path, dead.trace_index.path, snap)
            self._pending_paths = [p for p in self._pending_paths if p not in gone]
            dead.close()
            doomed += [dead.log_path, *gone]
        active = segs[-1]
        self._unflushed = [s for s in self._unflushed if s is not active and s in segs]
        self.log_end_offset = offset
        self._producers.truncate(offset)
        self._record_ids.truncate(offset)
        self._dir_gen += 1
        self._rollback_unfinished = doomed
        self._rollback_pending = True
        try:
            active.truncate_to(position, offset)
        except OSError as e:
            self._log.warning("rollback could not cut the file yet; retried before the next append", error=str(e))
        self.size_bytes = sum(seg.size for seg in segs)

    def _finish_rollback(self) -> None:
        """Remove the files of segments a rollback dropped and cut the active one (idempotent)."""
        try:
            for path in list(self._rollback_unfinished):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                self._rollback_unfinished.remove(path)
            active = self._segments[-1]
            if active.tail_dirty or active.index.persisted > len(active.index) or (
                active.time_index.persisted > len(active.time_index)
            ):
                active.truncate_to(active.size, active.next_offset)
        except OSError as e:
            raise StorageUnavailableError.from_os_error(self._where, "finishing a rollback", e) from e
        self._rollback_pending = False

    # -- append ----------------------------------------------------------------------------------

    def awaits_predecessor(self, producer_id: int, epoch: int, base_sequence: int, record_count: int) -> bool:
        """Whether an idempotent batch is ahead of its producer's next sequence here, i.e. earlier
        batches of the same epoch have not been appended yet (ProducerStateManager.awaits_predecessor)."""
        if producer_id < 0:
            return False
        # Without the log's lock: the event loop asks, while a large append may hold the lock in
        # an append thread for milliseconds. The state is read atomically (see the method); a
        # read racing an append can only make the caller wait for a wake-up it then gets, or
        # not wait (the append then answers as without the wait).
        return self._producers.awaits_predecessor(producer_id, epoch, base_sequence, record_count)

    def append(self, batch: bytes | bytearray | memoryview) -> AppendInfo:
        """Validate and append one batch (not fsynced). A bytearray is patched in place."""
        return self._append(batch, hold=False)[0]

    def _append(self, batch: bytes | bytearray | memoryview, *, hold: bool) -> tuple[AppendInfo, int]:
        """append(); also the rollback epoch it happened in, and with hold the batch stays hidden
        from readers until durable."""
        h = validate_batch(batch, max_batch_bytes=self.config.max_batch_bytes)
        size = h.total_size
        view = memoryview(batch)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        if len(view) != size:
            raise InvalidBatchError(f"append takes exactly one batch: got {len(view)} bytes, the batch is {size}")
        attributes = h.attributes
        if attributes & ATTR_HAS_TRACE_IDS or (attributes & ATTR_HAS_TXN_IDS and self.config.dedup_window_ms):
            # Records with trace ids, or transaction ids to de-duplicate: decoded (record_ids.py);
            # no other batch is.
            return self._record_ids.append(self, batch, view, h, hold=hold)
        with self._lock:
            self._check_writable()
            dup = self._producers.check(
                h.producer_id, h.producer_epoch, h.base_sequence, h.record_count, where=self._where
            )
            if dup is not None:
                return AppendInfo(dup.base_offset, dup.last_offset, dup.append_time_ms, True), self._rollback_epoch
            return self._write_locked(batch, view, h, hold), self._rollback_epoch

    def _write_locked(
        self, batch: bytes | bytearray | memoryview, view: memoryview, h: BatchHeader, hold: bool
    ) -> AppendInfo:
        """Write a checked batch at the log end (under the lock, after the producer check)."""
        size = h.total_size
        now = max(self._clock(), self._last_append_ms)
        base = self.log_end_offset
        last = base + h.record_count - 1
        seg = self._segments[-1]
        try:
            self._before_change()
            if seg.size and (
                seg.size + size > self.config.segment_bytes
                or now - (seg.first_time_ms or now) >= self.config.segment_ms
                or last - seg.base_offset > MAX_RELATIVE_OFFSET
            ):
                seg = self._roll(base)
            if isinstance(batch, bytearray):
                patch_base_offset(batch, 0, base)
                parts = [view]
            else:
                # Immutable input: write a patched 8-byte prefix and the rest, no copy.
                parts = [memoryview(_INT64.pack(base)), view[8:]]
            seg.append(parts, size, base, last, now)
        except OSError as e:
            # Nothing of this batch is in the log (segment.append cuts a partial write off).
            raise StorageUnavailableError.from_os_error(self._where, f"write to {seg.log_path}", e) from e
        self.log_end_offset = last + 1
        self.size_bytes += size
        self._last_append_ms = now
        if h.producer_id >= 0:
            self._producers.update(
                h.producer_id, h.producer_epoch, h.base_sequence, h.record_count, base, last, now
            )
        if hold:
            self._held.append(base)
        return AppendInfo(base, last, now, False)

    def append_held(self, batch: bytes | bytearray | memoryview) -> tuple[AppendInfo, int]:
        """append(), the batch hidden from readers until durable; also the rollback epoch to give
        wait_durable(). For writers that must know the log order before they wait (the offset
        store's view follows its appends)."""
        return self._append(batch, hold=True)

    async def append_durable(self, batch: bytes | bytearray | memoryview) -> AppendInfo:
        """append() then wait for an fsync covering the batch (group commit), unless the
        flush_policy is "interval", where the periodic flusher makes it durable. Raises
        StorageUnavailableError when the flush failed (the batch is then not in the log)."""
        if self.config.flush_policy != "fsync":
            return self.append(batch)
        info, epoch = self._append(batch, hold=True)
        await self.wait_durable(info.last_offset + 1, epoch=epoch)
        return info

    def append_replica(self, data: bytes | bytearray | memoryview) -> int:
        """Append a leader's batches as they are, at the leader's offsets (a follower, DESIGN.md
        "Replication"): each batch is checked (header, CRC) and must start at the log end; no
        offset is assigned and no byte changed, so the replicas' logs are byte-identical. The
        producer state and the transaction-id and trace indexes are updated as for a leader's
        append (a promoted follower de-duplicates retries), without the leader's checks: the
        leader decided. Not fsynced. Returns the new log end; a bad batch raises
        InvalidBatchError after the batches before it were appended."""
        view = memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        max_batch = max(self.config.max_batch_bytes, DEFAULT_MAX_BATCH_BYTES)
        pos = 0
        while pos < len(view):
            try:
                h = validate_batch(view, pos, max_batch_bytes=max_batch)
            except RecordsError as e:
                raise InvalidBatchError(f"{self._where}replicated batch at byte {pos}: {e}") from e
            batch = view[pos:pos + h.total_size]
            if h.attributes & (ATTR_HAS_TRACE_IDS | ATTR_HAS_TXN_IDS):
                self._record_ids.append_replica(self, batch, h)
            else:
                with self._lock:
                    self._write_replica_locked(batch, h)
            pos += h.total_size
        return self.log_end_offset

    def _write_replica_locked(self, batch: memoryview, h: BatchHeader) -> AppendInfo:
        self._check_writable()
        if h.base_offset != self.log_end_offset:
            raise InvalidBatchError(
                f"{self._where}replicated batch starts at offset {h.base_offset}, the log ends at "
                f"{self.log_end_offset}: the replica must truncate to the leader's history first"
            )
        return self._write_locked(batch, batch, h, False)

    def restart_at(self, offset: int) -> None:
        """Drop the whole log and continue at `offset`, beyond its end (a replica whose leader's
        retention passed this log's end: Kafka's truncateFullyAndStartAt). Crash-safe: the
        producer snapshots go first, then the checkpoint naming the new log start is made
        durable before any segment changes; open() drops every segment below that start,
        however far this got (see _load)."""
        with self._lock:
            self._check_writable()
            if offset < self.log_end_offset:
                raise ValueError(f"{self._where}restart_at({offset}) is below the log end {self.log_end_offset}")
            self._before_change()
            old = self._segments
            try:
                with self._cache.reserve():
                    snapshots = list_snapshots(self.directory)
                for off in snapshots:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(snapshot_path(self.directory, off))
                before = self.log_start_offset, self._recovery_offset
                self.log_start_offset = self._recovery_offset = offset
                try:
                    self._write_checkpoint(sync=True)
                except OSError:
                    self.log_start_offset, self._recovery_offset = before  # nothing changed yet
                    raise
                self._rollback_epoch += 1  # a flush prepared before this publishes nothing now
                self._rollbacks.append((self._rollback_epoch, offset))
                self._rollback_cause = "the log restarted at its leader's log start"
                self._held.clear()
                self._unflushed, self._pending_paths = [], []
                self._producers = ProducerStateManager()
                self._record_ids = RecordIds()
                self._create_empty(offset)
                for seg in old:
                    seg.delete_files()
                _fsync_dir(self.directory, self._fsync, self._cache)
            except OSError as e:
                raise StorageUnavailableError.from_os_error(self._where, "restarting the log", e) from e
            self._dir_synced_gen = self._dir_gen
            self.size_bytes = 0
        self._log.warning("log restarted at its leader's log start", offset=offset, segments_dropped=len(old))

    def truncate_to(self, offset: int) -> int:
        """Cut the log to end at `offset` (a batch boundary; a replica matching its leader's
        history, KIP-101) and make the cut durable. Crash-safe: the recovery point is moved below
        the cut (checkpoint fsynced) before any file changes, so a crash half-way rescans from
        there and finds either the old tail (the replica truncates again when it next follows)
        or the cut one, never a mix. Returns how many offsets were dropped."""
        with self._lock:
            self._check_writable()
            offset = max(offset, self.log_start_offset)
            if offset >= self.log_end_offset:
                return 0
            target = self._segments[max(bisect_right(self._bases, offset) - 1, 0)]
            try:
                position = target.position_of(offset)
                if position < target.size:  # inside a batch: the whole batch goes
                    offset = _INT64.unpack(os.pread(self._cache.fd(target.log_path), 8, position))[0]
            except OSError as e:
                raise StorageUnavailableError.from_os_error(self._where, "truncation (finding the offset)", e) from e
            self._before_change()
            if self._recovery_offset > target.base_offset:
                self._recovery_offset = target.base_offset
                try:
                    self._write_checkpoint(sync=True)
                except OSError as e:
                    raise StorageUnavailableError.from_os_error(self._where, "truncation (checkpoint)", e) from e
            dropped = self.log_end_offset - offset
            # A flush prepared before the cut must not publish its (now wrong) end, and a waiter
            # for a batch above the cut learns it is gone (see _check_epoch).
            self._rollback_epoch += 1
            self._rollbacks.append((self._rollback_epoch, offset))
            self._rollback_cause = "the log was truncated to match the partition's new leader"
            self._rollback_errno = None
            self._held.clear()
            self._cut_locked(offset, position)
            self._finish_rollback()
            self.durable_end_offset = min(self.durable_end_offset, offset)
            try:
                self._fsync(self._cache.fd(self._segments[-1].log_path))
                _fsync_dir(self.directory, self._fsync, self._cache)
            except OSError as e:
                raise StorageUnavailableError.from_os_error(self._where, "truncation (fsync)", e) from e
            self._dir_synced_gen = self._dir_gen
            self.durable_end_offset = offset
        self._log.warning("log truncated to the leader's history", offset=offset, offsets_dropped=dropped)
        return dropped

    def _check_epoch(self, epoch: int, end_offset: int) -> None:
        """Raise if a rollback since `epoch` cut the log below end_offset."""
        if epoch == self._rollback_epoch:
            return
        rollbacks = self._rollbacks
        if not rollbacks or rollbacks[0][0] > epoch + 1 or any(
            e > epoch and offset < end_offset for e, offset in rollbacks
        ):
            raise StorageUnavailableError(
                f"{self._where}the flush covering offsets below {end_offset} failed and the log was rolled "
                f"back to its durable end: nothing of this produce was stored ({self._rollback_cause}); retry",
                errno_=self._rollback_errno,
            )

    async def wait_durable(self, end_offset: int, *, epoch: int | None = None, may_block_loop: bool = True) -> None:
        """Return once every offset below end_offset is fsynced (sharing fsyncs; never on the loop's thread
        unless may_block_loop). `epoch` (from _append): raise if a rollback removed the batch meanwhile."""
        if epoch is None:
            epoch = self._rollback_epoch
        loop = asyncio.get_running_loop()
        while True:
            self._check_epoch(epoch, end_offset)
            if not (self.durable_end_offset < end_offset and self.log_start_offset < end_offset):
                return
            try:
                fut = self._inflight
                if fut is None or fut.done() or fut.get_loop() is not loop:
                    if may_block_loop and self._placement is not None and self._placement.inline_ok():
                        await self._flush_inline(end_offset)
                        continue
                    job = self._prepare_or_rollback()
                    if job is None:
                        continue  # durable already, or the epoch check above raises
                    fut = loop.run_in_executor(self._get_executor(), self._run_job, job)
                    self._inflight = fut
                    fut.add_done_callback(self._clear_inflight)
                # shield: a cancelled waiter must not cancel the flush the other waiters share
                await asyncio.shield(fut)
            except StorageUnavailableError as e:
                # A flush prepared before this batch's epoch began (i.e. before the rollback this
                # batch was appended after) did not cover it: try the next one. Otherwise the
                # failure rolled this batch back (the epoch check raises) or, without a
                # rollback (flush_policy "interval"), it is this caller's failure.
                if e.flush_epoch is not None and e.flush_epoch < epoch:
                    continue
                self._check_epoch(epoch, end_offset)
                raise

    def begin_flush(self) -> bool:
        """Start now, in the flush pool, the group-commit flush that wait_durable() would start
        for what is written so far (flush policy "fsync"), so that a writer with more to do
        before it waits (an event store writing its index record) does it while the disk syncs.
        Nothing (False) when a flush is in flight (wait_durable waits for it, then the next),
        everything is durable, the fsync would run on the loop's own thread anyway
        (FsyncPlacement: the disk is fast), or the flush cannot be prepared (wait_durable then
        fails it as usual). On the event loop; never blocks."""
        if self.config.flush_policy != "fsync" or self.durable_end_offset >= self.log_end_offset:
            return False
        loop = asyncio.get_running_loop()
        fut = self._inflight
        if fut is not None and not fut.done() and fut.get_loop() is loop:
            return False
        if self._placement is not None and self._placement.inline_ok():
            return False
        try:
            with self._lock:
                job = self._prepare_flush()
        except LogError:
            return False
        if job is None:
            return False
        try:
            fut = loop.run_in_executor(self._get_executor(), self._run_job, job)
        except RuntimeError:  # the pool is shut down: the log is closing
            for path, fd in job.fds:
                self._cache.unpin(path, fd)
            return False
        self._inflight = fut
        fut.add_done_callback(self._clear_inflight)
        return True

    async def _flush_inline(self, end_offset: int) -> None:
        """One flush on this (the event loop's) thread. It first yields once, so that the appends
        of requests already due on the loop join this fsync (group commit), as they would join a
        flush in flight in the pool."""
        await asyncio.sleep(0)
        if self.durable_end_offset >= end_offset or self.log_start_offset >= end_offset:
            return  # another waiter's flush covered this one
        fut = self._inflight
        if fut is not None and not fut.done():
            return  # another waiter started a pooled flush meanwhile: the caller waits for it
        job = self._prepare_or_rollback()
        if job is None:
            return
        self._run_job(job, inline=True)

    def _clear_inflight(self, fut: asyncio.Future[None]) -> None:
        if self._inflight is fut:
            self._inflight = None
        if not fut.cancelled():
            fut.exception()  # mark retrieved: each waiter re-raises it from its own await

    def roll(self) -> bool:
        """Start a new segment now if the active one holds data (admin, tests). True if rolled."""
        with self._lock:
            self._check_writable()
            if not self._segments[-1].size:
                return False
            self._before_change()
            self._roll(self.log_end_offset)
            return True

    def _roll(self, new_base: int) -> Segment:
        """Start a new active segment at new_base (called under the lock)."""
        old = self._segments[-1]
        old.write_indexes()
        snap = snapshot_path(self.directory, new_base)
        _atomic_write(snap, self._producers.to_bytes(new_base), None, self._cache)
        seg = Segment.create(self.directory, new_base, self._cache, self.config.index_interval_bytes)
        self._segments.append(seg)
        self._bases.append(new_base)
        self._unflushed.append(old)
        self._pending_paths += [old.index.path, old.time_index.path, snap]
        self._dir_gen += 1
        self._prune_snapshots()
        self._log.info("rolled segment", segment=os.path.basename(seg.log_path), previous_size=old.size)
        # Make the old segment durable soon so the recovery offset advances even if nobody
        # else flushes (acks=1 traffic under the fsync policy).
        if self.config.flush_policy == "fsync":
            job = self._prepare_flush()
            if job is not None:
                fut = self._get_executor().submit(self._run_job_logged, job)
                self._background.add(fut)
                fut.add_done_callback(self._background.discard)
        return seg

    def _prune_snapshots(self) -> None:
        with self._cache.reserve():
            offs = list_snapshots(self.directory)
        for off in offs[:-SNAPSHOTS_KEPT]:
            path = snapshot_path(self.directory, off)
            if path in self._pending_paths:
                continue
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    # -- flushing --------------------------------------------------------------------------------

    def _get_executor(self) -> Executor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"dmq-log-{self.topic}-{self.partition}")
        return self._executor

    def _prepare_flush(self) -> _FlushJob | None:
        """Decide what the next flush covers (under the lock); None if everything is durable."""
        if self._closed:
            raise LogClosedError(f"log {self.topic}[{self.partition}] is closed")
        end = self.log_end_offset
        active = self._segments[-1]
        segs = list(self._unflushed)
        dir_gen = self._dir_gen if self._dir_gen > self._dir_synced_gen else 0
        if not segs and end <= self.durable_end_offset and not dir_gen:
            return None
        extra = list(self._pending_paths)
        # Append times exist only in the time index: its entries are written at append (see
        # index.py); fsync it at most once a second rather than doubling the fsyncs per commit.
        ti = active.time_index
        if len(ti) and ti.persisted < len(ti):
            try:
                ti.write_pending()
            except OSError as e:  # stays pending; the log data does not depend on it
                self._log.warning("time index write failed", error=str(e))
        if ti.persisted > self._time_index_synced[1] or ti.path != self._time_index_synced[0]:
            now = time.monotonic()
            if now - self._time_index_synced_at >= TIME_INDEX_SYNC_INTERVAL_S:
                self._time_index_synced_at = now
                self._time_index_synced = (ti.path, ti.persisted)
                extra.append(ti.path)
        fds: list[tuple[str, int]] = []
        try:
            for seg in [*segs, active]:
                fds.append((seg.log_path, self._cache.pin(seg.log_path)))
        except OSError as e:
            for path, fd in fds:
                self._cache.unpin(path, fd)
            raise StorageUnavailableError.from_os_error(self._where, "flush (opening a segment)", e) from e
        recovery = active.base_offset if active.base_offset > self._recovery_offset else None
        return _FlushJob(end, fds, extra, dir_gen, self._parent_dirty, recovery, segs, self._rollback_epoch)

    def _run_job(self, job: _FlushJob, *, inline: bool = False) -> None:
        """fsync outside the lock (any thread), then publish the new durable offset. On failure
        (fsync policy) roll the log back to its durable end and raise StorageUnavailableError:
        the log stays writable (see the module docstring)."""
        try:
            started = time.perf_counter()
            for _path, fd in job.fds:
                self._fsync(fd)
            if self._placement is not None:
                self._placement.record(time.perf_counter() - started, inline=inline)
            for path in job.extra_paths:
                try:
                    fsync_path(path, self._fsync, self._cache)
                except OSError as e:
                    if not path.endswith(SNAPSHOT_SUFFIX):
                        raise
                    # A snapshot only spares a replay of batch headers: a torn one is detected
                    # (CRC) and an older one (or the log itself) used instead.
                    self._log.warning("producer state snapshot not fsynced", file=path, error=str(e))
            if job.dir_gen:
                _fsync_dir(self.directory, self._fsync, self._cache)
            if job.sync_parent:
                _fsync_dir(os.path.dirname(os.path.abspath(self.directory)), self._fsync, self._cache)
            if job.recovery_offset is not None and not self._closed:
                self._advance_recovery_offset(job.recovery_offset)
        except OSError as e:
            err = StorageUnavailableError.from_os_error(self._where, "flush (fsync)", e)
            err.flush_epoch = job.epoch
            with self._lock:
                if not self._closed and self.config.flush_policy == "fsync" and job.epoch == self._rollback_epoch:
                    self._rollback(self.durable_end_offset, str(err), e.errno)
                else:
                    self._log.warning("flush failed; retried by the next one", error=str(err))
            raise err from e
        finally:
            for path, fd in job.fds:
                self._cache.unpin(path, fd)
        with self._lock:
            if job.epoch != self._rollback_epoch:
                return  # it synced bytes a rollback removed since: it proves nothing now
            self.durable_end_offset = max(self.durable_end_offset, job.end_offset)
            done = {id(s) for s in job.segments}
            self._unflushed = [s for s in self._unflushed if id(s) not in done]
            self._pending_paths = [p for p in self._pending_paths if p not in set(job.extra_paths)]
            self._dir_synced_gen = max(self._dir_synced_gen, job.dir_gen)
            if job.sync_parent:
                self._parent_dirty = False

    def _prepare_or_rollback(self) -> _FlushJob | None:
        """_prepare_flush(); if it cannot even start (no descriptor), the log is rolled back as
        for a failed fsync (fsync policy), since the waiters are told their batches failed."""
        with self._lock:
            try:
                return self._prepare_flush()
            except StorageUnavailableError as e:
                e.flush_epoch = self._rollback_epoch
                if self.config.flush_policy == "fsync":
                    self._rollback(self.durable_end_offset, str(e), e.errno)
                raise

    def _advance_recovery_offset(self, offset: int) -> None:
        """Persist a higher recovery offset after the segments below it were fsynced. A failure
        (no descriptor for the tmp file, disk full) does not fail the flush: the data is durable;
        the old checkpoint only makes the next recovery scan more."""
        with self._lock:
            before = self._recovery_offset
            self._recovery_offset = max(before, offset)
        try:
            self._write_checkpoint(sync=True)
        except OSError as e:
            with self._lock:
                self._recovery_offset = before
            self._log.warning("checkpoint not written; recovery offset not advanced", error=str(e))

    def _run_job_logged(self, job: _FlushJob) -> None:
        try:
            self._run_job(job)
        except BaseException as e:  # background: nobody awaits it
            self._log.error("background flush failed", error=repr(e))

    def flush(self) -> None:
        """fsync everything appended so far (blocking; callable from any thread)."""
        with self._lock:
            if self._closed:
                return
        job = self._prepare_or_rollback()
        if job is not None:
            self._run_job(job)

    async def flush_async(self) -> None:
        """flush() sharing the group-commit machinery, fsync in a worker thread."""
        await self.wait_durable(self.log_end_offset)
        if self._unflushed or self._dir_gen > self._dir_synced_gen:
            job = self._prepare_or_rollback()
            if job is not None:
                await asyncio.get_running_loop().run_in_executor(self._get_executor(), self._run_job, job)

    @property
    def needs_flush(self) -> bool:
        return (
            self.log_end_offset > self.durable_end_offset
            or bool(self._unflushed)
            or self._dir_gen > self._dir_synced_gen
        )

    # -- reads -----------------------------------------------------------------------------------

    def _out_of_range(self, offset: int) -> OffsetOutOfRangeError:
        return OffsetOutOfRangeError(
            f"offset {offset} is out of range for {self.topic}[{self.partition}]: "
            f"log start {self.log_start_offset}, log end {self.log_end_offset}",
            offset=offset,
            log_start_offset=self.log_start_offset,
            log_end_offset=self.log_end_offset,
        )

    def read(self, offset: int, max_bytes: int, *, max_offset: int | None = None) -> bytes:
        """Whole batches starting with the one containing `offset`, about max_bytes of them
        (at least one whole batch however large), from one segment; b"" at the visible end
        (see visible_end_offset). max_offset (e.g. durable_end_offset) hides batches at or
        beyond it. Damaged bytes are never returned: a read that starts in them raises
        CorruptLogError naming the offsets, one that reaches them ends before them."""
        with self._lock:
            if self._closed:
                raise LogClosedError(f"log {self.topic}[{self.partition}] is closed")
            if offset < self.log_start_offset or offset > self.log_end_offset:
                raise self._out_of_range(offset)
            end = self.visible_end_offset if max_offset is None else min(max_offset, self.visible_end_offset)
            if offset >= end:
                return b""
            seg = self._segments[bisect_right(self._bases, offset) - 1]
            try:
                end_pos = None if end >= seg.next_offset else seg.position_of(end)
                return seg.read(offset, max(max_bytes, 1), end_pos)
            except SegmentCorruptError as e:
                raise self._damage_found(seg, e, offset) from e
            except OSError as e:
                raise StorageUnavailableError.from_os_error(self._where, f"read of {seg.log_path}", e) from e

    def offset_for_time(self, timestamp_ms: int) -> int | None:
        """First offset whose append time is >= timestamp_ms, None if there is none."""
        with self._lock:
            for seg in self._segments:
                largest = seg.largest_time_ms
                if largest is None or largest < timestamp_ms:
                    continue
                found = seg.offset_for_time(timestamp_ms)
                if found is not None:
                    return max(found, self.log_start_offset)
            return None

    @property
    def last_append_ms(self) -> int:
        """Wall-clock ms of the newest append (restored at open), 0 when there was none."""
        return self._last_append_ms

    def append_time_of(self, offset: int) -> int | None:
        """Append time (ms) of the batch holding `offset` from the time index, None when the
        offset is not in the log. Queue mode's delay_ms / max_wait_ms read it."""
        with self._lock:
            if not self.log_start_offset <= offset < self.log_end_offset:
                return None
            seg = self._segments[bisect_right(self._bases, offset) - 1]
            seg.ensure_indexes()
            return seg.time_index.time_of(offset - seg.base_offset)
    def find_trace(self, trace_id: str, max_records: int) -> tuple[list[tuple[int, bytes]], bool]:
        """([(offset, batch holding it)], truncated): the visible records carrying trace_id,
        through the segments' trace indexes (see record_ids.py). Blocking: call it in a thread."""
        return self._record_ids.find_trace(self, trace_id, max_records)

    def verify(self) -> VerifyReport:
        """Check every segment: the CRC and layout of every batch, contiguous offsets, and that
        the indexes agree with the log. Damage found is recorded as a read would (the partition
        goes offline for appends); an inconsistent index is rebuilt. Scans run without the lock
        (see Segment.verify), so appends and reads go on meanwhile. Callable from any thread."""
        with self._lock:
            if self._closed:
                raise LogClosedError(f"log {self.topic}[{self.partition}] is closed")
            snapshot = []
            for seg in self._segments:
                seg.ensure_indexes()
                snapshot.append(
                    (seg, seg.size, (list(seg.index.rel_offsets), list(seg.index.positions)),
                     (list(seg.time_index.times), list(seg.time_index.rel_offsets)))
                )
        report = VerifyReport(segments=len(snapshot))
        max_batch = max(self.config.max_batch_bytes, DEFAULT_MAX_BATCH_BYTES)
        for seg, size, index, times in snapshot:
            name = os.path.basename(seg.log_path)
            try:
                result = seg.verify(max_batch, size=size, index=index, times=times)
            except FileNotFoundError:
                continue  # deleted by retention meanwhile
            except OSError as e:
                raise StorageUnavailableError.from_os_error(self._where, f"verify of {seg.log_path}", e) from e
            report.batches += result.batches
            report.bytes += size
            damage = list(result.damaged)
            if result.tail is not None:
                damage.append(
                    Damaged(result.tail.position, size, result.next_offset, seg.next_offset - 1, result.tail.reason)
                )
            with self._lock:
                for d in damage:
                    err = self._damage_error(seg, d.position, d.first_offset, d.last_offset, d.reason)
                    report.problems.append(str(err))
                    if report.first_corrupt_offset is None:
                        report.first_corrupt_offset = err.offset
                    seg.damaged.setdefault(d.position, d)
                    self._record_damage(seg, d.position, d.first_offset, d.last_offset, d.reason, at="verify")
                if result.index_problems and not damage and seg in self._segments:
                    self._log.warning("index inconsistent with the log; rebuilding it", segment=name,
                                      problems=result.index_problems)
                    try:
                        seg._rebuild_indexes(rebuild_times="time index is not increasing" in result.index_problems)
                    except OSError as e:
                        raise StorageUnavailableError.from_os_error(self._where, f"index rebuild of {name}", e) from e
                    report.indexes_rebuilt += [f"{name}: {p}" for p in result.index_problems]
        return report

    # -- retention -------------------------------------------------------------------------------

    def enforce_retention(self, now_ms: int | None = None) -> int:
        """Delete whole non-active segments past retention_ms (by their largest append time) or
        beyond retention_bytes (oldest first, keeping at least retention_bytes, as Kafka does).
        Returns the number of segments deleted."""
        with self._lock:
            if self._closed:
                return 0
            now = self._clock() if now_ms is None else now_ms
            cfg = self.config
            self._producers.expire(now, cfg.producer_id_expiration_ms)
            segs = self._segments
            n = 0
            reason = None
            if cfg.retention_ms >= 0:
                while n < len(segs) - 1:
                    largest = segs[n].largest_time_ms
                    if largest is None:
                        largest = int(os.stat(segs[n].log_path).st_mtime * 1000)
                    if now - largest <= cfg.retention_ms:
                        break
                    n += 1
                    reason = "retention_ms"
            if cfg.retention_bytes >= 0:
                excess = self.size_bytes - sum(s.size for s in segs[:n]) - cfg.retention_bytes
                while n < len(segs) - 1 and excess - segs[n].size >= 0:
                    excess -= segs[n].size
                    n += 1
                    reason = reason or "retention_bytes"
            if n == 0:
                return 0
            return self._delete_leading_segments(n, reason)  # the lock is re-entrant: n stays right

    def delete_segments_before(self, offset: int) -> int:
        """Delete the whole segments that end at or before `offset` (never the active one): the log
        start moves to the first kept segment. For a compacted log whose state from `offset` on is
        complete (the offset store's snapshots). Returns the number of segments deleted."""
        with self._lock:
            if self._closed:
                return 0
            n = bisect_right(self._bases, offset) - 1
            n = min(max(n, 0), len(self._segments) - 1)
            if n == 0:
                return 0
            return self._delete_leading_segments(n, "compaction")

    def _delete_leading_segments(self, n: int, reason: str | None) -> int:
        """Delete the first n segments: the checkpoint first, then the files (the caller may hold
        the lock; the files are deleted outside it when it does not)."""
        with self._lock:
            if self._closed:
                return 0
            segs = self._segments
            n = min(n, len(segs) - 1)
            if n <= 0:
                return 0
            self._before_change()
            doomed = segs[:n]
            del segs[:n]
            del self._bases[:n]
            self.log_start_offset = segs[0].base_offset
            self.size_bytes -= sum(s.size for s in doomed)
            gone = {id(s) for s in doomed}
            self._unflushed = [s for s in self._unflushed if id(s) not in gone]
            self._dir_gen += 1
            # Durable before any file goes: a crash in between leaves files open() removes.
            self._write_checkpoint(sync=True)
        for seg in doomed:
            seg.delete_files()
        with self._lock:
            if self._corruption is not None and all(s.log_path != self._corruption.segment for s in self._segments):
                self._log.info("the damaged segment was deleted by retention; partition writable again")
                self._corruption = None
                for seg in self._segments:
                    for d in seg.damaged.values():
                        self._corruption = self._corruption or self._damage_error(
                            seg, d.position, d.first_offset, d.last_offset, d.reason
                        )
        self._log.info(
            "deleted segments by retention",
            segments=len(doomed),
            reason=reason,
            bytes=sum(s.size for s in doomed),
            log_start_offset=self.log_start_offset,
        )
        return len(doomed)

    # -- closing ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush everything, persist indexes and producer state, write the clean-shutdown marker."""
        if self._close_data(sync=True):
            self._close_marker(sync=True)
        self._close_handles()

    def _close_data(self, *, sync: bool) -> bool:
        """Phase 1 of close: make the files complete; fsynced only if sync. False if the log needs
        no marker (already closed, offline, or unchanged since a clean open)."""
        for fut in list(self._background):
            fut.result(timeout=60)
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            if self._rollback_pending:
                try:
                    self._finish_rollback()
                except StorageUnavailableError as e:
                    self._log.warning("closing without a clean-shutdown marker", error=str(e))
                    return False  # the next open scans and cuts what is beyond the log end
            if self._marker_present and not self.needs_flush:
                return False  # untouched since a clean open: the marker still holds
            active = self._segments[-1]
            for seg in (*self._unflushed, active):
                seg.write_indexes()
            if sync:
                for seg in (*self._unflushed, active):
                    self._fsync(self._cache.fd(seg.log_path))
                    fsync_path(seg.index.path, self._fsync, self._cache)
                    fsync_path(seg.time_index.path, self._fsync, self._cache)
                for path in self._pending_paths:
                    fsync_path(path, self._fsync, self._cache)
                if self._parent_dirty:
                    _fsync_dir(os.path.dirname(os.path.abspath(self.directory)), self._fsync, self._cache)
                    self._parent_dirty = False
            self._unflushed.clear()
            self._pending_paths.clear()
            self._recovery_offset = max(self._recovery_offset, active.base_offset)
            # A log that is one segment from offset 0.. needs no checkpoint: its defaults say as much
            # (this spares a file per partition when a broker with 10,000 mostly small ones stops).
            implied = self._checkpoint_written is None and (
                self.log_start_offset == self._recovery_offset == self._segments[0].base_offset
            )
            if not implied and self._checkpoint_written != (self.log_start_offset, self._recovery_offset):
                self._write_checkpoint(sync=sync)
            if sync:
                self.durable_end_offset = self.log_end_offset
            return True

    def _close_marker(self, *, sync: bool) -> None:
        """Phase 2 of close: the marker, carrying the producer state (one file, not two)."""
        active = self._segments[-1]
        end = self.log_end_offset
        head = f"{_MARKER_MAGIC} {end} {active.base_offset} {active.size} {self._last_append_ms}\n"
        data = head.encode() + self._producers.to_bytes(end)
        _atomic_write(os.path.join(self.directory, CLEAN_SHUTDOWN_FILE), data, self._fsync if sync else None, self._cache)
        self._marker_present = True

    def _close_handles(self) -> None:
        for seg in self._segments:
            seg.close()
        self._cache.close(self.directory)
        if self._owns_executor and self._executor is not None:
            self._executor.shutdown(wait=True)
        if self._owns_cache:
            self._cache.close_all()

    def abandon(self) -> None:
        """Drop the log without flushing or marking it clean (partition deletion, tests)."""
        with self._lock:
            self._closed = True
        for fut in list(self._background):
            fut.result(timeout=60)
        self._close_handles()
