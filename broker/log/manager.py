"""All partition logs of one broker: creation, lazy opening, retention, flushing, shutdown.

Layout: `<data_dir>/<topic>-<partition>/` per partition (see partition.py). Topic names may
contain '-', the partition number is after the last one.

Scale: a broker holds ~10,000 partitions. Every segment of every partition shares one FileCache
bounded by `max_open_files` (LRU), so descriptors are reopened on demand. Partitions that were
closed cleanly are not even opened by `open_existing()`: they are registered and opened on first
use (`get`/`create`), which costs one small read instead of a scan; partitions without a
clean-shutdown marker are recovered eagerly by open_existing(), before the broker serves.

Owners: the manager owns the flush thread pool (fsyncs of every partition run there) and stops it
in close(). The broker owns the periodic tasks: `run_flusher(stop_event)` for flush_policy
"interval" (or `flush_all()` from a thread) and `enforce_retention()` on a schedule.

close() makes every changed partition durable with two syncs of the data directory's filesystem
(syncfs(2); os.sync() where it is missing) instead of ~6 fsyncs per partition: phase 1 writes
indexes, snapshots and checkpoints, sync, phase 2 writes the clean-shutdown markers, sync - a marker
is never durable before the data it vouches for.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import itertools
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import structlog

from dmq.broker.log.errors import LogClosedError, UnknownPartitionError
from dmq.broker.log.fsync_placement import FsyncPlacement
from dmq.broker.log.handles import FileCache
from dmq.broker.log.partition import CLEAN_SHUTDOWN_FILE, CONFIG_FILE, LogConfig, PartitionLog

__all__ = ["LogManager"]

log = structlog.get_logger(__name__)

_DELETED_SUFFIX = ".deleted"


def _load_syncfs() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_syncfs = _load_syncfs()


def sync_filesystem(path: str) -> None:
    """Flush every dirty page of the filesystem holding `path` (all filesystems if unsupported)."""
    if _syncfs is not None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            if _syncfs(fd) == 0:
                return
        finally:
            os.close(fd)
    os.sync()


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _parse_dir_name(name: str) -> tuple[str, int] | None:
    topic, sep, part = name.rpartition("-")
    if not sep or not topic or not part.isdigit() or name.endswith(_DELETED_SUFFIX):
        return None
    return topic, int(part)


def _check_name(topic: str, partition: int) -> None:
    if not topic or topic in (".", "..") or "/" in topic or "\0" in topic or os.sep in topic:
        raise ValueError(f"invalid topic name {topic!r} for a log directory")
    if partition < 0:
        raise ValueError(f"partition must be >= 0, got {partition}")


class LogManager:
    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        default_config: LogConfig | None = None,
        *,
        max_open_files: int = 1000,
        clock_ms: Callable[[], int] | None = None,
        fsync: Callable[[int], None] | None = None,
        flush_threads: int = 4,
        inline_fsync_max_ms: float = 1.0,
    ) -> None:
        self.data_dir = os.fspath(data_dir)
        self.default_config = default_config or LogConfig()
        self.max_open_files = max_open_files
        self._clock = clock_ms
        self._fsync = fsync
        self.file_cache = FileCache(max_open_files)
        self._executor = ThreadPoolExecutor(max(1, flush_threads), thread_name_prefix="dmq-log-flush")
        # Group-commit fsyncs run on the event loop's thread while the disk answers within
        # inline_fsync_max_ms (0: always in the pool); see fsync_placement.py.
        self.fsync_placement = FsyncPlacement(inline_fsync_max_ms)
        self._logs: dict[tuple[str, int], PartitionLog] = {}
        self._unopened: dict[tuple[str, int], str] = {}  # cleanly closed, opened on first use
        self._lock = threading.RLock()
        self._tombstones = itertools.count()
        self._closed = False
        os.makedirs(self.data_dir, exist_ok=True)

    def __repr__(self) -> str:
        return (
            f"LogManager({self.data_dir!r}, open={len(self._logs)}, unopened={len(self._unopened)}, "
            f"files={self.file_cache!r})"
        )

    def _dir(self, topic: str, partition: int) -> str:
        return os.path.join(self.data_dir, f"{topic}-{partition}")

    def _open(self, topic: str, partition: int, directory: str, config: LogConfig | None) -> PartitionLog:
        if config is None:
            config = self._stored_config(directory)
        plog = PartitionLog(
            directory,
            topic,
            partition,
            config,
            clock_ms=self._clock,
            fsync=self._fsync,
            file_cache=self.file_cache,
            executor=self._executor,
            fsync_placement=self.fsync_placement,
            # the default config is implied; only per-partition overrides get a config.json
            persist_config=config != self.default_config,
        )
        self._logs[(topic, partition)] = plog
        return plog

    def _stored_config(self, directory: str) -> LogConfig:
        try:
            with self.file_cache.reserve(), open(os.path.join(directory, CONFIG_FILE), encoding="utf-8") as f:
                return LogConfig.from_json(f.read())
        except (OSError, ValueError, TypeError):
            return self.default_config

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError("the log manager is closed")

    # -- partitions ------------------------------------------------------------------------------

    def open_existing(self) -> None:
        """Register every partition directory; recover those not cleanly closed right away."""
        started = time.monotonic()
        recovered = 0
        with self._lock:
            self._check_open()
            with self.file_cache.reserve():
                names = sorted(os.listdir(self.data_dir))
            for name in names:
                path = os.path.join(self.data_dir, name)
                if name.endswith(_DELETED_SUFFIX):
                    shutil.rmtree(path, ignore_errors=True)  # a delete() cut short by a crash
                    continue
                key = _parse_dir_name(name)
                if key is None or not os.path.isdir(path) or key in self._logs:
                    continue
                if os.path.exists(os.path.join(path, CLEAN_SHUTDOWN_FILE)):
                    self._unopened[key] = path
                else:
                    self._open(key[0], key[1], path, None)
                    recovered += 1
        log.info(
            "logs found",
            data_dir=self.data_dir,
            partitions=len(self._logs) + len(self._unopened),
            recovered=recovered,
            duration_s=round(time.monotonic() - started, 3),
        )

    def create(self, topic: str, partition: int, config: LogConfig | None = None) -> PartitionLog:
        """The partition's log, created if needed (idempotent). A given config replaces the
        existing log's config (it applies to later appends, rolls and retention)."""
        _check_name(topic, partition)
        key = (topic, partition)
        with self._lock:
            self._check_open()
            plog = self._logs.get(key)
            if plog is None:
                directory = self._unopened.pop(key, None)
                if directory is None:
                    directory = self._dir(topic, partition)
                    created = not os.path.isdir(directory)
                else:
                    created = False
                if config is None and created:
                    config = self.default_config
                plog = self._open(topic, partition, directory, config)
                if created:
                    log.info("partition log created", topic=topic, partition=partition)
            elif config is not None and config != plog.config:
                plog.config = config
            return plog

    def get(self, topic: str, partition: int) -> PartitionLog:
        key = (topic, partition)
        plog = self._logs.get(key)
        if plog is not None:
            return plog
        with self._lock:
            self._check_open()
            plog = self._logs.get(key)
            if plog is not None:
                return plog
            directory = self._unopened.pop(key, None)
            if directory is None:
                raise UnknownPartitionError(f"no log for {topic}[{partition}] on this broker")
            return self._open(topic, partition, directory, None)

    def delete(self, topic: str, partition: int) -> None:
        """Remove the partition's log and its files (UnknownPartitionError if absent)."""
        key = (topic, partition)
        with self._lock:
            self._check_open()
            plog = self._logs.pop(key, None)
            directory = self._unopened.pop(key, None)
            if plog is None and directory is None:
                raise UnknownPartitionError(f"no log for {topic}[{partition}] on this broker")
            if plog is not None:
                plog.abandon()
                directory = plog.directory
            assert directory is not None
            # Rename first so a crash mid-delete cannot leave a half-deleted log that looks valid.
            # The tombstone's name does not contain the topic: `<topic>-<partition>` may already
            # use 255 bytes, and a longer name failed the rename (ENAMETOOLONG), left the data
            # in place and brought it back when the topic was created again. A tombstone never
            # parses as a partition directory (it does not end in -<digits>), and open_existing()
            # removes any a crash left behind.
            doomed = os.path.join(self.data_dir, f"{time.time_ns()}-{next(self._tombstones)}{_DELETED_SUFFIX}")
            os.rename(directory, doomed)
            with self.file_cache.reserve():
                _fsync_directory(self.data_dir)  # the delete is durable before it is acknowledged
        with self.file_cache.reserve(), self.file_cache.reserve():  # rmtree holds 2 directory fds
            shutil.rmtree(doomed, ignore_errors=True)
        log.info("partition log deleted", topic=topic, partition=partition)

    def partitions(self) -> list[tuple[str, int]]:
        with self._lock:
            return sorted([*self._logs, *self._unopened])

    def open_logs(self) -> list[PartitionLog]:
        """The partitions opened so far (not the ones still waiting for first use)."""
        with self._lock:
            return list(self._logs.values())

    # -- periodic work ---------------------------------------------------------------------------

    def enforce_retention(self, now_ms: int | None = None) -> int:
        """Apply retention to every partition (opening the unopened); returns segments deleted."""
        with self._lock:
            self._check_open()
            for key in list(self._unopened):
                self.get(*key)
            logs = list(self._logs.values())
        deleted = 0
        for plog in logs:
            deleted += plog.enforce_retention(now_ms)
        return deleted

    def flush_all(self) -> None:
        """fsync every partition with unflushed data (blocking; run it in a thread)."""
        for plog in self.open_logs():
            if plog.needs_flush and not plog.closed:
                plog.flush()

    async def run_flusher(self, stop_event: asyncio.Event, *, max_concurrent: int = 8) -> None:
        """Periodic flush for partitions with flush_policy "interval", until stop_event is set.
        Each partition is flushed at most every flush_interval_ms; fsyncs run in the manager's
        thread pool, at most max_concurrent at a time."""
        last_flush: dict[tuple[str, int], float] = {}
        sem = asyncio.Semaphore(max_concurrent)

        async def flush_one(plog: PartitionLog) -> None:
            async with sem:
                try:
                    await plog.flush_async()
                except LogClosedError:
                    pass
                except Exception as e:  # noqa: BLE001 - one bad partition must not stop the rest
                    log.error("interval flush failed", topic=plog.topic, partition=plog.partition, error=repr(e))

        while not stop_event.is_set():
            logs = [p for p in self.open_logs() if p.config.flush_policy == "interval"]
            tick_ms = min((p.config.flush_interval_ms for p in logs), default=self.default_config.flush_interval_ms)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop_event.wait(), max(tick_ms, 10) / 1000)
            if stop_event.is_set():
                return
            now = time.monotonic()
            due = []
            for plog in logs:
                key = (plog.topic, plog.partition)
                if plog.closed or not plog.needs_flush:
                    continue
                if (now - last_flush.get(key, 0.0)) * 1000 >= plog.config.flush_interval_ms:
                    last_flush[key] = now
                    due.append(plog)
            if len(last_flush) > 2 * len(logs) + 1000:  # bound it after many partitions were deleted
                last_flush = {k: v for k, v in last_flush.items() if k in self._logs}
            if due:
                await asyncio.gather(*(flush_one(p) for p in due))

    # -- shutdown --------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush and cleanly close every open partition, then release threads and files."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            logs = list(self._logs.values())
        started = time.monotonic()
        changed = []
        for plog in logs:
            try:
                if plog._close_data(sync=False):
                    changed.append(plog)
            except Exception as e:  # noqa: BLE001 - close the others; this one will be recovered
                log.error("closing partition log failed", topic=plog.topic, partition=plog.partition, error=repr(e))
        if changed:
            sync_filesystem(self.data_dir)  # one flush instead of several fsyncs per partition
            for plog in changed:
                plog._close_marker(sync=False)
            sync_filesystem(self.data_dir)
        for plog in logs:
            plog._close_handles()
        self._executor.shutdown(wait=True)
        self.file_cache.close_all()
        log.info(
            "logs closed",
            partitions=len(logs),
            written=len(changed),
            duration_s=round(time.monotonic() - started, 3),
        )
