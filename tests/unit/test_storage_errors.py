"""Issue 13: storage failures get statuses a client can act on, and the producer retries the
retriable ones. Before the fix a full disk answered INTERNAL (produce, commit, create topic) and
the producer gave up at once."""

from __future__ import annotations

import errno
import sqlite3

import grpc
import pytest
from test_producer_unit import WAIT_S, FakeBroker, FakeRpcError, make_producer

from dmq.broker.log import CorruptLogError, StorageUnavailableError
from dmq.broker.storage_status import storage_status as _storage_status
from dmq.client import errors
from dmq.proto import dmq_pb2 as pb
from dmq.proto import error_details


def disk_full() -> FakeRpcError:
    return FakeRpcError(
        grpc.StatusCode.RESOURCE_EXHAUSTED, "disk full on broker 0: t[0]: write failed: ENOSPC", error_details.DISK_FULL
    )


def test_producer_retries_a_full_disk_until_space_is_back() -> None:
    broker = FakeBroker(script=[disk_full()] * 3)
    with make_producer(broker, retry_backoff_ms=1, retry_backoff_max_ms=5) as p:
        assert p.send("t", b"x").get(WAIT_S).offset == 0
    assert len(broker.calls) == 4
    assert len({c.request.batch for c in broker.calls}) == 1  # the same batch, same sequence


def test_producer_retries_transient_storage_errors() -> None:
    broker = FakeBroker(script=[FakeRpcError(grpc.StatusCode.UNAVAILABLE, "broker 0: storage temporarily unavailable: "
                                             "EMFILE", error_details.STORAGE_UNAVAILABLE)] * 2)
    with make_producer(broker, retry_backoff_ms=1) as p:
        assert p.send("t", b"x").get(WAIT_S).offset == 0
        cluster = p.cluster
    assert len(broker.calls) == 3
    assert cluster.invalidated == []  # type: ignore[attr-defined]  # the leader did not move


def test_producer_retries_a_busy_broker() -> None:
    """The broker's in-flight byte budget refuses with RESOURCE_EXHAUSTED and the busy reason: a
    wait, not a batch to drop (before, every RESOURCE_EXHAUSTED was RecordTooLargeError)."""
    broker = FakeBroker(script=[FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "no room in max_in_flight_bytes before "
                                             "the deadline", error_details.BUSY)] * 2)
    with make_producer(broker, retry_backoff_ms=1, retry_backoff_max_ms=5) as p:
        assert p.send("t", b"x").get(WAIT_S).offset == 0
    assert len(broker.calls) == 3


def test_a_batch_too_large_is_not_retried() -> None:
    broker = FakeBroker(script=[FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "batch is 2000000 bytes; the limit is "
                                             "1048576", None)])
    with make_producer(broker, retry_backoff_ms=1) as p:
        h = p.send("t", b"x")
        p.flush(WAIT_S)
        with pytest.raises(errors.RecordTooLargeError):
            h.get(0)
    assert len(broker.calls) == 1


def test_a_full_disk_past_the_delivery_timeout_says_so() -> None:
    broker = FakeBroker(script=[disk_full()] * 1000)
    with make_producer(broker, retry_backoff_ms=5, retry_backoff_max_ms=5, delivery_timeout_ms=100, request_timeout_ms=50) as p:
        with pytest.raises(errors.DMQTimeoutError, match="disk full on broker 0"):
            p.send("t", b"a").get(WAIT_S)


@pytest.mark.parametrize(
    ("reason", "code", "cls", "retriable"),
    [
        (error_details.DISK_FULL, grpc.StatusCode.RESOURCE_EXHAUSTED, errors.DiskFullError, True),
        (error_details.STORAGE_UNAVAILABLE, grpc.StatusCode.UNAVAILABLE, errors.StorageUnavailableError, True),
        (error_details.CORRUPT_DATA, grpc.StatusCode.DATA_LOSS, errors.CorruptRecordError, False),
        (None, grpc.StatusCode.RESOURCE_EXHAUSTED, errors.ResourceExhaustedError, False),
    ],
)
def test_reason_in_the_trailing_metadata_picks_the_class(reason, code, cls, retriable) -> None:  # type: ignore[no-untyped-def]
    err = errors.from_rpc_error(FakeRpcError(code, "m", reason), overrides={code: errors.RecordTooLargeError}
                                if reason else None)
    assert type(err) is cls and err.retriable is retriable


def test_per_partition_storage_errors_map_to_their_classes() -> None:
    corrupt = errors.from_partition_error(pb.CORRUPT_DATA, "t[0]: corrupt data at offsets 8..9", "t", 0)
    assert isinstance(corrupt, errors.CorruptRecordError) and "8..9" in str(corrupt)
    transient = errors.from_partition_error(pb.STORAGE_ERROR, "EIO", "t", 0)
    assert isinstance(transient, errors.StorageUnavailableError) and transient.retriable


@pytest.mark.parametrize(
    ("exc", "code", "text", "reason"),
    [
        (StorageUnavailableError("t[0]: write failed: ENOSPC", errno_=errno.ENOSPC), grpc.StatusCode.RESOURCE_EXHAUSTED,
         "disk full on broker 3", error_details.DISK_FULL),
        (OSError(errno.ENOSPC, "No space left on device"), grpc.StatusCode.RESOURCE_EXHAUSTED,
         "disk full on broker 3", error_details.DISK_FULL),
        (sqlite3.OperationalError("database or disk is full"), grpc.StatusCode.RESOURCE_EXHAUSTED,
         "disk full on broker 3", error_details.DISK_FULL),
        (StorageUnavailableError("t[0]: flush failed: EMFILE", errno_=errno.EMFILE), grpc.StatusCode.UNAVAILABLE,
         "storage temporarily unavailable", error_details.STORAGE_UNAVAILABLE),
        (OSError(errno.EMFILE, "Too many open files"), grpc.StatusCode.UNAVAILABLE, "EMFILE",
         error_details.STORAGE_UNAVAILABLE),
        (CorruptLogError("t[0]: corrupt data at offsets 8..9", topic="t", partition=0, offset=8),
         grpc.StatusCode.DATA_LOSS, "offsets 8..9", error_details.CORRUPT_DATA),
    ],
)
def test_storage_failures_become_statuses_naming_the_broker(exc, code, text, reason) -> None:  # type: ignore[no-untyped-def]
    status = _storage_status(exc, 3)
    assert status is not None
    assert status.code == code and text in status.message and status.reason == reason
    assert "broker 3" in status.message


def test_other_errors_are_not_storage_errors() -> None:
    assert _storage_status(ValueError("x"), 0) is None
    assert _storage_status(sqlite3.OperationalError("database is locked"), 0) is None
