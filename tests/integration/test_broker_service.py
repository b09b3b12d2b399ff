"""The Broker service over real gRPC on loopback, driven through the raw stubs."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmq.client.cli.runner import ClusterThread
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import records
from dmq.proto.grpc_options import MAX_FETCH_RESPONSE_BYTES, channel_options
from tests import member_secrets
from tests.wall_clock import ms_after_acknowledged


@pytest.fixture
def stubs(cluster: ClusterThread):
    channel = member_secrets.sync_channel(cluster.bootstrap, options=channel_options())
    meta = pb_grpc.MetadataStub(channel)
    meta.CreateTopic(pb.CreateTopicRequest(name="t", partitions=4), timeout=10)
    yield meta, pb_grpc.BrokerStub(channel)
    channel.close()


def _batch(values: list[bytes], **kw) -> bytes:
    return records.encode(values, **kw)


def _fetch_records(broker, topic: str, partition: int, offset: int) -> list[records.Record]:
    resp = broker.Fetch(
        pb.FetchRequest(partitions=[pb.FetchPartition(topic=topic, partition=partition, offset=offset)]), timeout=10
    )
    (result,) = resp.partitions
    assert result.error == pb.NONE, result.error_message
    return [r for b in records.decode_batches(result.records) for r in b]


def test_produce_assigns_consecutive_offsets_and_fetch_returns_them(stubs) -> None:
    _, broker = stubs
    first = broker.Produce(pb.ProduceRequest(topic="t", partition=1, batch=_batch([b"a", b"b", b"c"])), timeout=10)
    second = broker.Produce(pb.ProduceRequest(topic="t", partition=1, batch=_batch([b"d"])), timeout=10)
    assert (first.base_offset, second.base_offset) == (0, 3)
    got = _fetch_records(broker, "t", 1, 0)
    assert [(r.offset, r.value) for r in got] == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]


@pytest.mark.parametrize("acks", [pb.ACKS_ALL, pb.ACKS_LEADER, pb.ACKS_NONE])
def test_every_acks_mode_stores_the_batch(stubs, acks: int) -> None:
    _, broker = stubs
    broker.Produce(pb.ProduceRequest(topic="t", partition=0, batch=_batch([b"x"]), acks=acks), timeout=10)
    assert [r.value for r in _fetch_records(broker, "t", 0, 0)] == [b"x"]


def test_one_fetch_serves_many_partitions(stubs) -> None:
    _, broker = stubs
    for p in range(4):
        broker.Produce(pb.ProduceRequest(topic="t", partition=p, batch=_batch([f"p{p}".encode()])), timeout=10)
    resp = broker.Fetch(
        pb.FetchRequest(partitions=[pb.FetchPartition(topic="t", partition=p, offset=0) for p in range(4)]), timeout=10
    )
    assert [(r.partition, r.high_watermark) for r in resp.partitions] == [(p, 1) for p in range(4)]
    for r in resp.partitions:
        (rec,) = list(records.decode(r.records))
        assert rec.value == f"p{r.partition}".encode()


def test_long_poll_fetch_returns_soon_after_a_produce(stubs) -> None:
    _, broker = stubs
    acked_at: list[float] = []

    def produce_later() -> None:
        time.sleep(0.3)
        broker.Produce(pb.ProduceRequest(topic="t", partition=2, batch=_batch([b"late"])), timeout=10)
        acked_at.append(time.monotonic())

    thread = threading.Thread(target=produce_later)
    thread.start()
    started = time.monotonic()
    resp = broker.Fetch(
        pb.FetchRequest(partitions=[pb.FetchPartition(topic="t", partition=2, offset=0)], max_wait_ms=10_000, min_bytes=1),
        timeout=15,
    )
    returned_at = time.monotonic()
    thread.join(5)
    assert resp.partitions[0].records, "the long poll returned without the produced batch"
    assert returned_at - started >= 0.25, "the fetch did not wait for the produce"
    # The append wakes the parked fetch; it answers within 50 ms of the produce being acknowledged
    # (it may even answer first: the ack waits for the fsync, the wake-up does not).
    assert returned_at - acked_at[0] < 0.05, f"long poll answered {returned_at - acked_at[0]:.3f}s after the ack"


def test_long_poll_without_data_waits_max_wait(stubs) -> None:
    _, broker = stubs
    started = time.monotonic()
    resp = broker.Fetch(
        pb.FetchRequest(partitions=[pb.FetchPartition(topic="t", partition=3, offset=0)], max_wait_ms=300, min_bytes=1),
        timeout=10,
    )
    elapsed = time.monotonic() - started
    assert resp.partitions[0].records == b""
    assert 0.25 <= elapsed < 3


def test_list_offsets_earliest_latest_and_by_timestamp(stubs) -> None:
    _, broker = stubs
    broker.Produce(pb.ProduceRequest(topic="t", partition=0, batch=_batch([b"a", b"b"])), timeout=10)
    between_ms = ms_after_acknowledged()  # after a and b's append ms, at or before c's
    broker.Produce(pb.ProduceRequest(topic="t", partition=0, batch=_batch([b"c"])), timeout=10)
    resp = broker.ListOffsets(
        pb.ListOffsetsRequest(
            queries=[
                pb.OffsetQuery(topic="t", partition=0, timestamp_ms=-2),
                pb.OffsetQuery(topic="t", partition=0, timestamp_ms=-1),
                pb.OffsetQuery(topic="t", partition=0, timestamp_ms=between_ms),
                pb.OffsetQuery(topic="t", partition=0, timestamp_ms=0),
                pb.OffsetQuery(topic="t", partition=0, timestamp_ms=between_ms + 3_600_000),
            ]
        ),
        timeout=10,
    )
    assert [a.offset for a in resp.answers] == [0, 3, 2, 0, 3]


def test_same_idempotent_batch_twice_is_stored_once(stubs) -> None:
    _, broker = stubs
    batch = _batch([b"once", b"only"], producer_id=77, producer_epoch=0, base_sequence=0)
    first = broker.Produce(pb.ProduceRequest(topic="t", partition=0, batch=batch), timeout=10)
    retry = broker.Produce(pb.ProduceRequest(topic="t", partition=0, batch=batch), timeout=10)
    assert (first.base_offset, first.duplicate) == (0, False)
    assert (retry.base_offset, retry.duplicate) == (0, True)
    assert [r.value for r in _fetch_records(broker, "t", 0, 0)] == [b"once", b"only"]


# -- bad input ----------------------------------------------------------------------------------


def _status(call, request):
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=10)
    return info.value.code(), info.value.details()


@pytest.mark.parametrize(
    ("request_", "code", "field"),
    [
        (pb.ProduceRequest(topic="nope", partition=0, batch=b"x" * 100), grpc.StatusCode.NOT_FOUND, "nope"),
        (pb.ProduceRequest(topic="t", partition=-1, batch=b"x"), grpc.StatusCode.INVALID_ARGUMENT, "partition"),
        (pb.ProduceRequest(topic="t", partition=99, batch=b"x"), grpc.StatusCode.NOT_FOUND, "t[99]"),
        (pb.ProduceRequest(topic="", partition=0, batch=b"x"), grpc.StatusCode.INVALID_ARGUMENT, "topic"),
        (pb.ProduceRequest(topic="t" * 300, partition=0, batch=b"x"), grpc.StatusCode.INVALID_ARGUMENT, "topic"),
        (pb.ProduceRequest(topic="t", partition=0, batch=b""), grpc.StatusCode.INVALID_ARGUMENT, "batch"),
        (pb.ProduceRequest(topic="t", partition=0, batch=b"\x00" * 200), grpc.StatusCode.INVALID_ARGUMENT, "batch"),
    ],
)
def test_produce_rejects_bad_requests(stubs, request_, code, field) -> None:
    _, broker = stubs
    got_code, details = _status(broker.Produce, request_)
    assert got_code == code, details
    assert field in details


def test_produce_rejects_corrupt_crc_and_oversize(stubs) -> None:
    _, broker = stubs
    batch = bytearray(_batch([b"hello"]))
    batch[-1] ^= 0xFF
    code, details = _status(broker.Produce, pb.ProduceRequest(topic="t", partition=0, batch=bytes(batch)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "crc" in details.lower()
    big = _batch([b"v" * (1 << 20)] * 17, max_batch_bytes=64 << 20, max_record_bytes=2 << 20)
    code, details = _status(broker.Produce, pb.ProduceRequest(topic="t", partition=0, batch=big))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_batch_bytes" in details
    # Nothing of the refused batches was stored; the next append starts at offset 0.
    ok = broker.Produce(pb.ProduceRequest(topic="t", partition=0, batch=_batch([b"fine"])), timeout=10)
    assert ok.base_offset == 0


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.FetchRequest(), "partitions"),
        (pb.FetchRequest(partitions=[pb.FetchPartition(topic="t", partition=0, offset=-5)]), "partitions[0].offset"),
        (pb.FetchRequest(partitions=[pb.FetchPartition(topic="t", partition=-1)]), "partitions[0].partition"),
        (pb.FetchRequest(partitions=[pb.FetchPartition(topic="t")], max_wait_ms=-1), "max_wait_ms"),
        (pb.FetchRequest(partitions=[pb.FetchPartition(topic="t")], max_wait_ms=10**9), "max_wait_ms"),
        (pb.FetchRequest(partitions=[pb.FetchPartition(topic="t")], max_bytes=2**31 - 1), "max_bytes"),
        (pb.FetchRequest(partitions=[pb.FetchPartition(topic="t", max_bytes=-3)]), "partitions[0].max_bytes"),
        (pb.FetchRequest(partitions=[pb.FetchPartition(topic="t")], min_bytes=-1), "min_bytes"),
    ],
)
def test_fetch_rejects_bad_requests(stubs, request_, field) -> None:
    _, broker = stubs
    code, details = _status(broker.Fetch, request_)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert field in details


def test_fetch_reports_per_partition_errors(stubs) -> None:
    _, broker = stubs
    broker.Produce(pb.ProduceRequest(topic="t", partition=0, batch=_batch([b"a"])), timeout=10)
    resp = broker.Fetch(
        pb.FetchRequest(
            partitions=[
                pb.FetchPartition(topic="t", partition=0, offset=5),
                pb.FetchPartition(topic="missing", partition=0, offset=0),
            ]
        ),
        timeout=10,
    )
    out_of_range, unknown = resp.partitions
    assert out_of_range.error == pb.OFFSET_OUT_OF_RANGE and "log end 1" in out_of_range.error_message
    assert unknown.error == pb.UNKNOWN_TOPIC_OR_PARTITION and "missing" in unknown.error_message


def test_list_offsets_and_commits_reject_bad_fields(stubs) -> None:
    _, broker = stubs
    code, details = _status(
        broker.ListOffsets, pb.ListOffsetsRequest(queries=[pb.OffsetQuery(topic="t", partition=0, timestamp_ms=-7)])
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "queries[0].timestamp_ms" in details
    code, details = _status(broker.CommitOffsets, pb.CommitOffsetsRequest(group_id="", offsets=[]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "group_id" in details
    code, details = _status(
        broker.CommitOffsets,
        pb.CommitOffsetsRequest(group_id="g", offsets=[pb.PartitionOffset(topic="t", partition=0, offset=99)]),
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "offsets[0].offset" in details


def test_transport_limit_refuses_oversize_messages(stubs) -> None:
    _, broker = stubs
    code, _ = _status(broker.Produce, pb.ProduceRequest(topic="t", partition=0, batch=b"x" * (MAX_FETCH_RESPONSE_BYTES + (8 << 20))))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    topic=st.text(max_size=300),
    partition=st.integers(-(2**31), 2**31 - 1),
    offset=st.integers(-(2**63), 2**63 - 1),
    batch=st.binary(max_size=512),
    max_bytes=st.integers(-(2**31), 2**31 - 1),
    max_wait_ms=st.integers(-(2**31), 200),
)
def test_fuzzed_requests_get_statuses_and_the_server_keeps_serving(
    stubs, topic, partition, offset, batch, max_bytes, max_wait_ms
) -> None:
    _, broker = stubs
    allowed = {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.OUT_OF_RANGE,
    }
    calls = [
        (broker.Produce, pb.ProduceRequest(topic=topic, partition=partition, batch=batch)),
        (broker.Produce, pb.ProduceRequest(topic="t", partition=partition % 4, batch=batch)),
        (
            broker.Fetch,
            pb.FetchRequest(
                partitions=[pb.FetchPartition(topic=topic, partition=partition, offset=offset, max_bytes=max_bytes)],
                max_wait_ms=max_wait_ms,
            ),
        ),
        (broker.ListOffsets, pb.ListOffsetsRequest(queries=[pb.OffsetQuery(topic=topic, partition=partition, timestamp_ms=offset)])),
    ]
    for call, request in calls:
        try:
            call(request, timeout=10)
        except grpc.RpcError as e:
            assert e.code() in allowed, (e.code(), e.details())
            assert e.details()
    # The log stays valid and the server keeps answering.
    resp = broker.Fetch(pb.FetchRequest(partitions=[pb.FetchPartition(topic="t", partition=0, offset=0)]), timeout=10)
    records.decode_batches(resp.partitions[0].records)
