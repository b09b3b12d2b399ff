"""W3C trace context for records, and OpenTelemetry spans around consuming them.

A record's trace context is its ``traceparent`` header (dmq.proto.tracecontext). A consumer that
processes a record and produces to the next topic continues the trace::

    for record in consumer.poll(1000):
        producer.send("next", transform(record.value), trace_context=record.trace_context)

The record sent carries the same trace id and a new span id, so ``AdminClient.find_trace`` /
``dmq trace`` follow it from topic to topic. With OpenTelemetry (``pip install 'dmq-queue[otel]'``)
wrap the processing in ``process_span(record)`` and give the producer ``opentelemetry=True``:
the producer's span is then a child of the consumer's, and both are exported to whatever
tracing system the application's tracer provider sends spans to.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from dmq.proto.tracecontext import TRACEPARENT_HEADER, TraceContext, parse_traceparent

if TYPE_CHECKING:  # pragma: no cover
    from dmq.client.records import ConsumerRecord

__all__ = ["TRACEPARENT_HEADER", "TraceContext", "parse_traceparent", "process_span", "OTEL_EXTRA_HINT"]

OTEL_EXTRA_HINT = "install the OpenTelemetry API: pip install 'dmq-queue[otel]'"


def process_span(record: ConsumerRecord, group_id: str | None = None) -> AbstractContextManager[Any]:
    """A context manager: an OpenTelemetry CONSUMER span ``process <topic>`` while the block runs
    (the current span, so spans started inside are its children), whose parent is the context in
    the record's headers. Raises ModuleNotFoundError naming the extra when opentelemetry-api is
    not installed."""
    try:
        from dmq.client import _otel
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(f"process_span needs OpenTelemetry: {OTEL_EXTRA_HINT}") from e
    return _otel.process_span(record, group_id)
