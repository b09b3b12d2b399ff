"""An exclusive lock on a data directory, so two servers never write the same files.

Two processes appending to one partition log (or one SQLite file) each keep their own idea of the
log end, overwrite each other's batches and lose acknowledged data. Every server therefore takes
`<data_dir>/dmq.lock` with `flock(LOCK_EX | LOCK_NB)` before it reads or writes anything there, and
holds it until it stops. The lock file holds the owner's pid, so a second process fails at once
with one line naming the holder (pid and command line) instead of waiting or corrupting.

flock rather than a pid file alone: the kernel drops the lock when its holder dies (SIGKILL
included), so a stale file never blocks a restart. The descriptor is not inherited by children
(Python opens files non-inheritable), so a process that spawns others keeps the lock its own.

Lives in `proto/server` because both the broker and the coordinator take it and neither may import the other.
"""

from __future__ import annotations

import errno
import fcntl
import os
import pathlib

LOCK_FILE = "dmq.lock"
_CMDLINE_MAX_CHARS = 200  # the holder's command line is shown on one line, shortened past this


class DataDirLocked(OSError):
    """The directory is locked by another live process (or another server in this one)."""

    def __init__(self, message: str, holder_pid: int | None) -> None:
        super().__init__(errno.EWOULDBLOCK, message)
        self.message = message
        self.holder_pid = holder_pid

    def __str__(self) -> str:
        return self.message


class DataDirLock:
    """`acquire()` before touching the directory, `release()` after the last write; idempotent."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.data_dir = pathlib.Path(data_dir)
        self.path = self.data_dir / LOCK_FILE
        self._fd: int | None = None

    def __repr__(self) -> str:
        return f"<DataDirLock path={str(self.path)!r} held={self.held}>"

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read_pid(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise DataDirLocked(_locked_message(self.data_dir, holder), holder) from None
        try:
            # The pid is only for the message above: the flock is what excludes.
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        # Closing the descriptor drops the flock; the file stays (deleting it would let a process
        # that opened the old file and one that creates a new one both hold "the" lock).
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        finally:
            os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _command_line(pid: int) -> str | None:
    try:
        raw = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    # Whitespace (newlines in a `python -c` script) collapsed: the message must stay one line.
    text = " ".join(" ".join(part.decode(errors="replace").split()) for part in raw.split(b"\0") if part)
    if len(text) > _CMDLINE_MAX_CHARS:
        text = text[: _CMDLINE_MAX_CHARS - 1] + "…"
    return text or None


def _locked_message(data_dir: pathlib.Path, pid: int | None) -> str:
    where = str(data_dir.resolve())
    if pid is None:
        who = "another process"
    elif pid == os.getpid():
        who = f"this process (pid {pid}: another server in it already uses it)"
    else:
        cmd = _command_line(pid)
        who = f"pid {pid}" + (f" ({cmd})" if cmd else "")
    return f"data directory {where} is in use by {who}: stop that process or choose another --data-dir"
