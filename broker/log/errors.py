"""Errors raised by the partition log.

`LogError` is the root of the log's own errors. Problems with the bytes of a batch (bad length,
magic, CRC, too large) come from the codec as the `RecordsError` family and are re-exported here
so callers of `dmq.broker.log` need one import. The broker maps them to gRPC codes:
OffsetOutOfRangeError -> OUT_OF_RANGE, UnknownPartitionError -> NOT_FOUND,
OutOfOrderSequenceError / InvalidBatchError / RecordsError -> INVALID_ARGUMENT (BatchTooLargeError
-> RESOURCE_EXHAUSTED), ProducerFencedError -> FAILED_PRECONDITION, StorageUnavailableError -> UNAVAILABLE (disk full:
RESOURCE_EXHAUSTED), CorruptLogError -> DATA_LOSS.

Transient vs permanent: an I/O error (EMFILE, ENOSPC, EINTR, EIO, ...) fails the one operation
with a StorageUnavailableError and leaves the log consistent and writable (partition.py rolls back
what was not made durable), so it serves again once the cause is gone. Only damage found in the
files (CorruptLogError) takes a partition offline for appends.
"""

from __future__ import annotations

import errno
import os

from dmq.proto.records import (
    BatchTooLargeError,
    CorruptBatchError,
    RecordsError,
    RecordTooLargeError,
    TruncatedBatchError,
)

__all__ = [
    "BatchTooLargeError",
    "CorruptBatchError",
    "CorruptLogError",
    "DISK_FULL_ERRNOS",
    "StorageUnavailableError",
    "InvalidBatchError",
    "LogClosedError",
    "LogError",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "ProducerFencedError",
    "RecordTooLargeError",
    "RecordsError",
    "TruncatedBatchError",
    "UnknownPartitionError",
]


class LogError(Exception):
    """Root of the partition log's errors."""


class OffsetOutOfRangeError(LogError):
    """The requested offset is below the log start offset or above the log end offset."""

    def __init__(self, message: str, *, offset: int, log_start_offset: int, log_end_offset: int):
        super().__init__(message)
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class UnknownPartitionError(LogError, KeyError):
    """No log exists for this topic-partition on this broker."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class OutOfOrderSequenceError(LogError):
    """An idempotent batch does not continue its producer's sequence (a batch was lost in between)."""


class ProducerFencedError(LogError):
    """An idempotent batch carries an epoch older than the producer's current one."""


class InvalidBatchError(LogError):
    """The batch is well formed but not acceptable to the log (e.g. inconsistent producer fields)."""


class LogClosedError(LogError):
    """The log (or its manager) was closed."""


# ENOSPC: no space; EDQUOT: over quota. Both are "disk full" to a client, retried after a while.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)})


class StorageUnavailableError(LogError):
    """An I/O error failed this operation; the log is consistent and accepts the next one.

    `errno` is the OSError's errno (None if unknown); `disk_full` says whether it was ENOSPC /
    EDQUOT. Nothing the failed operation wrote stays in the log (see partition.py, rollback).
    """

    def __init__(self, message: str, *, errno_: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno_
        self.flush_epoch: int | None = None  # a failed flush: the log's rollback epoch it was prepared in

    @property
    def disk_full(self) -> bool:
        return self.errno in DISK_FULL_ERRNOS

    @classmethod
    def from_os_error(cls, where: str, what: str, e: OSError) -> StorageUnavailableError:
        name = errno.errorcode.get(e.errno or 0, "I/O error")
        reason = os.strerror(e.errno) if e.errno else str(e)
        return cls(f"{where}{what} failed: {name} ({reason}); nothing was stored, retry", errno_=e.errno)


class CorruptLogError(LogError):
    """Bytes of the partition's files failed validation (CRC, layout, offsets): the damaged
    batch is never served and the partition refuses appends until an operator repairs it."""

    def __init__(
        self, message: str, *, topic: str, partition: int, offset: int | None, segment: str = "", position: int = -1
    ) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.segment = segment
        self.position = position
