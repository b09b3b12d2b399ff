"""Write-back pacing: start the kernel's write-back of a segment's newly written bytes early.

Why: an acks=leader flood writes hundreds of MB/s into the page cache, and the kernel writes it
back only later, in bulk. An acks=all produce's fdatasync on ext4 (data=ordered) commits the
journal, and that commit first writes out the newly allocated dirty data of every file, including
the flood's: the small producer's fsync waited 0.5 s and more (bench/load_bench.py). Starting the
write-back of every WRITEBACK_BYTES written (as RocksDB's bytes_per_sync does) keeps the dirty
data small, so a journal commit has little to wait for. It changes no durability promise: nothing
is acknowledged on the strength of it, and acks=all still fsyncs. It is advice: a failure is
ignored (the data stays dirty in the page cache and the next fsync writes it, as before).

`sync_file_range(SYNC_FILE_RANGE_WRITE)` is Linux only (ctypes on libc); elsewhere `start` does
nothing. It may block while the device's queue is full: call it off the event loop where it
matters (large appends run in the broker's append threads).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable

__all__ = ["SYNC_FILE_RANGE_WRITE", "WRITEBACK_BYTES", "start"]

# Start write-back after every this many bytes appended to one segment (0: never).
WRITEBACK_BYTES = 1024 * 1024
SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>


def _load() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn  # a CDLL function releases the GIL while it runs


_sync_file_range = _load()


def start(fd: int, offset: int, nbytes: int) -> None:
    """Start write-back of [offset, offset + nbytes) of `fd`; does not wait for it. Raises OSError
    when the call fails (the caller ignores it: this is advice, not durability)."""
    if _sync_file_range is None or nbytes <= 0:
        return
    if _sync_file_range(fd, offset, nbytes, SYNC_FILE_RANGE_WRITE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
