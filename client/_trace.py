"""AdminClient.find_trace: every record carrying a trace id, across all topics, in time order.

A mixin so that the AdminClient (whose module other work reshapes) takes it with one line. Each
live broker answers FindTrace for the partitions it leads, from its segments' trace indexes
(broker/log/trace_index.py), never by scanning logs; the answers are merged here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc

from dmq.client.errors import InvalidArgumentError, from_rpc_error
from dmq.client.records import ConsumerRecord
from dmq.proto import dmq_pb2 as pb
from dmq.proto import records
from dmq.proto.tracecontext import is_trace_id, parse_traceparent

if TYPE_CHECKING:  # pragma: no cover
    from dmq.client._cluster import Cluster

__all__ = ["TraceMixin", "TraceResult", "TRACE_RECORDS_MAX", "lookup_id"]

TRACE_RECORDS_MAX = 10_000  # a broker's limit per answer (broker.service)


class TraceResult(list[ConsumerRecord]):
    """The records found, in time order; ``truncated`` when some broker had more than max_records."""

    truncated: bool = False


def lookup_id(trace_id: object) -> str:
    """The id the brokers' trace indexes hold for what a person typed (see find_trace)."""
    if isinstance(trace_id, str):
        if len(trace_id) == 32 and is_trace_id(trace_id.lower()):
            return trace_id.lower()  # W3C ids are lowercase on the wire; typed, either case
        ctx = parse_traceparent(trace_id)
        if ctx is not None:
            return ctx.trace_id
    try:
        return records.check_record_id(trace_id, "trace_id")
    except records.InvalidRecordIdError as e:
        raise InvalidArgumentError(str(e)) from None


class TraceMixin:
    _cluster: Cluster

    def find_trace(self, trace_id: str, max_records: int = 1000) -> TraceResult:
        """Every record of the trace `trace_id`, across all topics, in time order (record
        timestamp, then topic, partition, offset). At most max_records per broker (1..10,000).

        `trace_id`: a W3C trace id (32 hex digits, either case: the records whose ``traceparent``
        carries it), or a whole traceparent value (its trace id is used); any other string of 1
        to 255 characters is looked up as it is, for records written with the older ``dmq.trace``
        header. Raises InvalidArgumentError for an empty or too long one."""
        trace_id = lookup_id(trace_id)
        if isinstance(max_records, bool) or not isinstance(max_records, int) or not 1 <= max_records <= TRACE_RECORDS_MAX:
            raise InvalidArgumentError(f"max_records must be within 1..{TRACE_RECORDS_MAX}, got {max_records!r}")
        cluster = self._cluster
        out = TraceResult()
        request = pb.FindTraceRequest(trace_id=trace_id, max_records=max_records)
        for broker in cluster.brokers(refresh=True):
            if not broker.alive:
                continue
            try:
                answer = cluster.broker_stub(broker.address).FindTrace(request, timeout=cluster.timeout_s)
            except grpc.RpcError as e:
                raise from_rpc_error(e, context=f"FindTrace on broker {broker.address}") from e
            out.truncated = out.truncated or answer.truncated
            for part in answer.partitions:
                wanted = set(part.offsets)
                for batch in records.decode_batches(part.records):
                    out.extend(
                        ConsumerRecord(part.topic, part.partition, r.offset, r.key, r.value, r.timestamp, r.headers)
                        for r in batch
                        if r.offset in wanted
                    )
        out.sort(key=lambda r: (r.timestamp, r.topic, r.partition, r.offset))
        return out
