"""A bounded, LRU cache of open file descriptors shared by every segment of a LogManager.

Why: one broker holds ~10,000 partitions with several segments each, far more files than the
process may keep open. Segments do not own descriptors; they ask the cache for one by path on each
read/write. The least recently used descriptor is closed when the cache is full, and reopened
lazily the next time that segment is touched.

Short-lived descriptors (index files, directories, tmp files) are opened outside the cache but
inside `reserve()`, which counts them against the same bound while they are open, so the process
never holds more than max_open_files for the logs (barring the all-pinned case below).

Pinning: a descriptor used outside the event-loop thread (the group-commit fsync) is pinned so
eviction cannot close it (and the number reused by another open) while the thread uses it. Pins are
short; if every cached descriptor is pinned the cache briefly exceeds its bound rather than block.

Descriptors for fsync come from here too (index files, directories: `pin(path, directory=True)`),
not from new opens by path: a process whose descriptors are exhausted by other things (sockets)
can still make durable what it wrote. When an open fails with EMFILE / ENFILE anyway, the cache
closes some of its least recently used unpinned descriptors and tries once more.

All methods are called from one thread (the event loop), except `unpin`, which takes the lock too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator

import structlog

__all__ = ["FileCache", "reserve"]

log = structlog.get_logger(__name__)

# Segments are opened read-write in append mode: writes always land at the end (the log's own
# size bookkeeping is the source of truth; recovery truncates anything beyond it), reads use pread.
_OPEN_FLAGS = os.O_RDWR | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
_OUT_OF_FDS = (errno.EMFILE, errno.ENFILE)


class FileCache:
    def __init__(self, max_open_files: int) -> None:
        if max_open_files < 1:
            raise ValueError(f"max_open_files must be >= 1, got {max_open_files}")
        self.max_open_files = max_open_files
        self._fds: OrderedDict[str, int] = OrderedDict()
        self._pins: dict[str, int] = {}
        # Descriptors whose path was closed/evicted while pinned: closed on the last unpin.
        self._doomed: dict[int, int] = {}
        self._transient = 0  # descriptors open under reserve()
        self._lock = threading.Lock()
        self.opens = 0  # total os.open calls, for tests and metrics
        self.evictions = 0

    def __repr__(self) -> str:
        return (
            f"FileCache(open={len(self._fds)}, max_open_files={self.max_open_files}, "
            f"pinned={len(self._pins)}, opens={self.opens}, evictions={self.evictions})"
        )

    @property
    def open_count(self) -> int:
        with self._lock:
            return len(self._fds) + len(self._doomed) + self._transient

    @contextlib.contextmanager
    def reserve(self) -> Iterator[None]:
        """Count one descriptor the caller opens (and closes) inside the block against the bound."""
        with self._lock:
            self._make_room_locked()
            self._transient += 1
        try:
            yield
        finally:
            with self._lock:
                self._transient -= 1

    def fd(self, path: str, *, create: bool = False, directory: bool = False) -> int:
        """Descriptor for `path` (an existing file unless create; a directory, read-only, if
        directory), opening it if needed; marks it most recent."""
        with self._lock:
            return self._fd_locked(path, create, directory)

    def _fd_locked(self, path: str, create: bool, directory: bool) -> int:
        fd = self._fds.get(path)
        if fd is not None:
            self._fds.move_to_end(path)
            return fd
        self._make_room_locked()
        flags = _DIR_FLAGS if directory else _OPEN_FLAGS | (os.O_CREAT if create else 0)
        fd = self._open_locked(path, flags)
        self._fds[path] = fd
        return fd

    def create(self, path: str) -> int:
        """Create a new empty file (must not exist) and cache its descriptor."""
        with self._lock:
            self._make_room_locked()
            fd = self._open_locked(path, _OPEN_FLAGS | os.O_CREAT | os.O_EXCL)
            self._fds[path] = fd
            return fd

    def _open_locked(self, path: str, flags: int) -> int:
        """os.open; out of descriptors, close an eighth of the idle cached ones and retry once."""
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as e:
            if e.errno not in _OUT_OF_FDS or not self._evict_locked(max(1, len(self._fds) // 8)):
                raise
            log.warning("out of file descriptors; closed idle log files and retrying", path=path, error=str(e))
            fd = os.open(path, flags, 0o644)
        self.opens += 1
        return fd

    def _evict_locked(self, n: int) -> int:
        victims = [p for p in self._fds if p not in self._pins][:n]
        for p in victims:
            os.close(self._fds.pop(p))
            self.evictions += 1
        return len(victims)

    def pin(self, path: str, *, directory: bool = False) -> int:
        """Like fd(), and the descriptor stays open until unpin(path, fd)."""
        with self._lock:  # one critical section: another thread must not evict it in between
            fd = self._fd_locked(path, False, directory)
            self._pins[path] = self._pins.get(path, 0) + 1
        return fd

    def unpin(self, path: str, fd: int) -> None:
        with self._lock:
            if fd in self._doomed:
                self._doomed[fd] -= 1
                if self._doomed[fd] == 0:
                    del self._doomed[fd]
                    os.close(fd)
                return
            n = self._pins.get(path, 0) - 1
            if n <= 0:
                self._pins.pop(path, None)
            else:
                self._pins[path] = n

    def close(self, path: str) -> None:
        """Close the descriptor for `path` if open (before deleting or renaming the file)."""
        with self._lock:
            fd = self._fds.pop(path, None)
            if fd is None:
                return
            pins = self._pins.pop(path, 0)
            if pins:
                self._doomed[fd] = pins
            else:
                os.close(fd)

    def close_all(self) -> None:
        with self._lock:
            paths = list(self._fds)
        for path in paths:
            self.close(path)

    def _make_room_locked(self) -> None:
        while len(self._fds) + len(self._doomed) + self._transient >= self.max_open_files:
            victim = next((p for p in self._fds if p not in self._pins), None)
            if victim is None:
                return  # everything pinned: exceed briefly rather than block
            os.close(self._fds.pop(victim))
            self.evictions += 1


def reserve(cache: FileCache | None) -> contextlib.AbstractContextManager[None]:
    """cache.reserve(), or nothing when there is no cache."""
    return cache.reserve() if cache is not None else contextlib.nullcontext()
