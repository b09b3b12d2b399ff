"""The timestamps of the records offsets_for_times() finds, for its OffsetAndTimestamp.

ListOffsets by time answers an offset only: the broker's time index holds append times, not the
records' own timestamps, and the wire answer has no field for one. A Fetch of the one record at
that offset gives it (one small call per partition found; offsets_for_times() is a look-up, not
a hot path). The request and the parse are pure and shared by DMQConsumer (a blocking call) and
AsyncConsumer (an awaited one).
"""

from __future__ import annotations

import grpc

from dmq.client._cluster import Cluster, fetch_results
from dmq.client._reader import partition_error
from dmq.client.consumer._records import TopicPartition
from dmq.client.errors import CorruptRecordError, from_rpc_error
from dmq.client.records import consumer_records
from dmq.proto import dmq_pb2 as pb
from dmq.proto import records

__all__ = ["record_timestamps", "timestamp_of", "timestamp_request"]

# Enough for the batch holding the record (a batch larger than this still comes whole: the
# broker never cuts a batch, it returns at least the first one).
_MAX_BYTES = 64 * 1024


def timestamp_request(tp: TopicPartition, offset: int) -> pb.FetchRequest:
    return pb.FetchRequest(
        partitions=[pb.FetchPartition(topic=tp.topic, partition=tp.partition, offset=offset, max_bytes=_MAX_BYTES)],
        max_wait_ms=0, min_bytes=0, max_bytes=_MAX_BYTES,
    )


def timestamp_of(answer: bytes, tp: TopicPartition, offset: int, address: str) -> int:
    """The timestamp of the record at `offset` in a Fetch answer for it."""
    context = f"Fetch of {tp} offset {offset} from broker {address}"
    for view in fetch_results(answer, context):
        if (view.topic, view.partition) != tuple(tp):
            continue
        if view.error != pb.NONE:
            raise partition_error(view)
        try:
            batches = records.decode_batches(view.records, verify_crc=True)
        except records.RecordsError as e:
            raise CorruptRecordError(f"{context}: {e}") from e
        for batch in batches:
            for record in consumer_records(tp.topic, tp.partition, batch, start_offset=offset, max_records=1):
                return record.timestamp
    raise CorruptRecordError(f"{context}: the answer holds no record at that offset")


def record_timestamps(cluster: Cluster, offsets: dict[TopicPartition, int], timeout_s: float) -> dict[TopicPartition, int]:
    """{partition: timestamp of the record at its offset}, one blocking Fetch per partition."""
    out: dict[TopicPartition, int] = {}
    for tp, offset in offsets.items():
        address = cluster.leader_for(tp.topic, tp.partition, timeout_s=timeout_s)
        try:
            answer = cluster.raw_fetch(address)(timestamp_request(tp, offset), timeout=max(0.001, timeout_s))
        except grpc.RpcError as e:
            raise from_rpc_error(e, context=f"Fetch of {tp} offset {offset} from broker {address}") from e
        out[tp] = timestamp_of(answer, tp, offset, address)
    return out

