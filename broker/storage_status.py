"""The status of a storage failure, one mapping for every broker RPC (dmq.broker.service's, the
queue's and the event store's).

A full disk (ENOSPC / EDQUOT, or SQLite's "database or disk is full") -> RESOURCE_EXHAUSTED "disk
full on broker N"; any other I/O error -> UNAVAILABLE (the log stays writable, the client retries);
damaged log data -> DATA_LOSS naming topic, partition and offset; a write to a replicated internal
log this broker cannot complete (not the leader, too few in-sync replicas) -> UNAVAILABLE. The
reason also travels as trailing metadata (dmq.proto.error_details).

A module of its own so that every servicer of the Broker service (dmq.broker.service, the queue's
and the event store's, dmq.broker.servicers) uses the one mapping without importing another.
"""

from __future__ import annotations

import errno
import sqlite3

import grpc
import structlog

from dmq.broker.log import CorruptLogError, LogClosedError, StorageUnavailableError
from dmq.broker.log.errors import DISK_FULL_ERRNOS
from dmq.broker.replication.replica import NotEnoughReplicas, NotLeaderForPartition
from dmq.proto import error_details
from dmq.proto.server.server_errors import RpcAbort

log = structlog.get_logger(__name__)


def is_disk_full(e: BaseException) -> bool:
    if isinstance(e, StorageUnavailableError):
        return e.disk_full
    if isinstance(e, OSError):
        return e.errno in DISK_FULL_ERRNOS
    if isinstance(e, sqlite3.Error):  # aiosqlite passes sqlite3's errors through
        return getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in str(e)
    return False


def storage_status(e: BaseException, broker_id: int) -> RpcAbort | None:
    """The status for a storage failure (see the module docstring) or for a write to a replicated
    internal log that this broker cannot complete (not the leader, too few in-sync replicas),
    None if `e` is neither."""
    if is_disk_full(e):
        return RpcAbort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"disk full on broker {broker_id}: {e}; retry once space is freed",
            error_details.DISK_FULL,
        )
    if isinstance(e, CorruptLogError):
        return RpcAbort(grpc.StatusCode.DATA_LOSS, f"broker {broker_id}: {e}", error_details.CORRUPT_DATA)
    # a write to a replicated internal log (committed offsets, queue progress): as a produce's
    if isinstance(e, NotLeaderForPartition):
        return RpcAbort(grpc.StatusCode.UNAVAILABLE, f"{e}; nothing acknowledged, retry")
    if isinstance(e, NotEnoughReplicas):
        return RpcAbort(grpc.StatusCode.UNAVAILABLE, f"broker {broker_id}: {e}", error_details.NOT_ENOUGH_REPLICAS)
    if isinstance(e, LogClosedError):
        return RpcAbort(grpc.StatusCode.UNAVAILABLE, f"broker {broker_id} is shutting down: {e}; retry")
    if isinstance(e, StorageUnavailableError | OSError):
        what = str(e)
        if isinstance(e, OSError) and e.errno:
            what = f"{errno.errorcode.get(e.errno, e.errno)} ({e.strerror})"
        return RpcAbort(
            grpc.StatusCode.UNAVAILABLE,
            f"broker {broker_id}: storage temporarily unavailable: {what}",
            error_details.STORAGE_UNAVAILABLE,
        )
    return None


def translate_storage(broker_id: int, e: BaseException) -> RpcAbort | None:
    """`storage_status`, logged; None for anything else (a bug: the caller answers INTERNAL)."""
    status = storage_status(e, broker_id)
    if status is not None:
        log.warning("storage error", code=status.code.name, error=str(e))
    return status
