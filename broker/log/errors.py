"""Errors raised by the partition log.

`LogError` is the root of the log's own errors. Problems with the bytes of a batch (bad length,
magic, CRC, too large) come from the codec as the `RecordsError` family and are re-exported here
so callers of `dmq.broker.log` need one import. The broker maps them to gRPC codes:
OffsetOutOfRangeError -> OUT_OF_RANGE, UnknownPartitionError -> NOT_FOUND,
OutOfOrderSequenceError / InvalidBatchError / RecordsError -> INVALID_ARGUMENT (BatchTooLargeError
-> RESOURCE_EXHAUSTED), ProducerFencedError -> FAILED_PRECONDITION.
"""

from __future__ import annotations

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
