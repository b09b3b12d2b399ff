"""Durable partition logs: segments, offset and time indexes, recovery, retention, group commit.

Public API (see partition.py and manager.py for the formats and invariants):

    LogConfig, AppendInfo, RecoveryInfo, PartitionLog, LogManager, FileCache
    errors: LogError, OffsetOutOfRangeError, UnknownPartitionError, OutOfOrderSequenceError,
            ProducerFencedError, InvalidBatchError, LogClosedError,
            StorageUnavailableError, CorruptLogError and the RecordsError family.
"""

from dmq.broker.log.errors import (
    BatchTooLargeError,
    CorruptBatchError,
    CorruptLogError,
    InvalidBatchError,
    LogClosedError,
    LogError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    RecordsError,
    RecordTooLargeError,
    StorageUnavailableError,
    TruncatedBatchError,
    UnknownPartitionError,
)
from dmq.broker.log.handles import FileCache
from dmq.broker.log.manager import LogManager
from dmq.broker.log.partition import AppendInfo, LogConfig, PartitionLog, RecoveryInfo

__all__ = [
    "AppendInfo",
    "BatchTooLargeError",
    "CorruptBatchError",
    "CorruptLogError",
    "FileCache",
    "InvalidBatchError",
    "LogClosedError",
    "LogConfig",
    "LogError",
    "LogManager",
    "OffsetOutOfRangeError",
    "OutOfOrderSequenceError",
    "PartitionLog",
    "ProducerFencedError",
    "RecordTooLargeError",
    "RecordsError",
    "RecoveryInfo",
    "StorageUnavailableError",
    "TruncatedBatchError",
    "UnknownPartitionError",
]
