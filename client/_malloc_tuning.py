"""Keep large message buffers in the heap instead of fresh mmap()s (glibc only).

Every Fetch answer and every large Produce request passes through several multi-megabyte buffers
(the log read, the protobuf field, the serialized message, gRPC's slices, the Python bytes on the
other side). glibc serves allocations above its mmap threshold with a fresh mmap() and returns them
with munmap(), and trims the heap top back to the kernel, so every such buffer is page-faulted in
again: `perf` put ~30% of a broker's CPU in page faults while serving 2 MiB fetches, and reading
1,000,000 × 100-byte records over two partitions took 600 ms (broker CPU 500 ms). With the
threshold raised to 32 MiB (glibc's ceiling) and the trim threshold to 128 MiB, the same read takes
175 ms (broker CPU 105 ms). The price is up to 128 MiB of freed heap kept per process for reuse.

Called by processes DMQ owns: brokers, and Spark's Python workers reading a topic. The client library
does not change an application's allocator on its own; applications can set the same through the
environment (MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=134217728).

Lives in dmq.client, not with the servers: the allocator is process-wide, so the nodes never set it;
its two callers are process owners in dmq.client (dmq.client.cli.runner for a process that hosts a
broker, dmq.client.spark._worker), and the Spark worker may not import server code.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["keep_large_buffers", "MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES"]

# mallopt parameter numbers from <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc refuses more (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024

_applied: bool | None = None


def keep_large_buffers() -> bool:
    """Raise glibc's mmap and trim thresholds for this process, once. True if they are in effect;
    False where there is no glibc (macOS, musl) or mallopt refused."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # Trim first: raising the mmap threshold alone would still hand the heap top back each time.
    _applied = bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)) and bool(
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    )
    return _applied
