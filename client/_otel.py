"""OpenTelemetry spans for produce and consume (the optional ``otel`` extra: opentelemetry-api).

Imported only by a Producer made with ``opentelemetry=True`` and by dmq.client.tracing's
process_span, so without the extra nothing here is imported and nothing changes.

Spans follow OpenTelemetry's messaging semantic conventions: a PRODUCER span ``send <topic>``
per record sent, a CONSUMER span ``process <topic>`` around the processing of a received record,
with messaging.system = "dmq", messaging.destination.name, and the Kafka-style
messaging.destination.partition.id and messaging.kafka.offset where they are known. The context
crosses the broker in the record headers through the propagator API (``propagate.inject`` /
``extract``: W3C ``traceparent``, plus ``tracestate`` / ``baggage`` when the propagators set them),
so any OpenTelemetry-instrumented consumer links to DMQ's producer spans and back.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from dmq.proto.tracecontext import TraceContext

if TYPE_CHECKING:  # pragma: no cover
    from dmq.client.records import ConsumerRecord, RecordMetadata

__all__ = ["start_send", "end_send", "process_span"]

_SYSTEM = "dmq"
_TRACER_NAME = "dmq.client"
Headers = Sequence[tuple[str, "bytes | None"]]


class _HeaderGetter(Getter[Headers]):
    """Reads a carrier that is a record's headers ((name, bytes or None) pairs)."""

    def get(self, carrier: Headers, key: str) -> list[str] | None:
        found = [v.decode("latin-1") for k, v in carrier if k == key and v is not None]
        return found[-1:] or None  # the last one, as the broker's index reads it

    def keys(self, carrier: Headers) -> list[str]:
        return [k for k, _ in carrier]


_GETTER = _HeaderGetter()


def _tracer() -> trace.Tracer:
    # Looked up per span (cheap: a proxy until a provider is set), so a provider set after the
    # producer was made is used.
    return trace.get_tracer(_TRACER_NAME)


def start_send(topic: str, parent: TraceContext | None) -> tuple[trace.Span, dict[str, str]]:
    """A PRODUCER span for one record to `topic` and the headers carrying its context. Its parent
    is `parent` (a context given to send()) or else the current context. The headers are empty
    when the span has no context of its own to carry (no SDK configured)."""
    ctx = None
    if parent is not None:
        remote = SpanContext(
            int(parent.trace_id, 16), int(parent.span_id, 16), is_remote=True, trace_flags=TraceFlags(parent.flags)
        )
        ctx = trace.set_span_in_context(NonRecordingSpan(remote))
    span = _tracer().start_span(
        f"send {topic}",
        context=ctx,
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": _SYSTEM,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
            "messaging.destination.name": topic,
        },
    )
    carrier: dict[str, str] = {}
    made = span.get_span_context()
    # Without an SDK the API's tracer hands back the parent's own context: carrying it would give
    # the record its sender's span id, so the producer makes the next hop's context itself.
    if made.is_valid and (parent is None or made.span_id != int(parent.span_id, 16)):
        propagate.inject(carrier, context=trace.set_span_in_context(span, ctx))
    return span, carrier


def end_send(span: trace.Span, metadata: RecordMetadata | None, error: BaseException | None) -> None:
    """Ends a send span when its record is acknowledged (where it went) or has failed (why)."""
    if metadata is not None:
        span.set_attribute("messaging.destination.partition.id", str(metadata.partition))
        if metadata.offset >= 0:  # acks=0: nobody learned the offset
            span.set_attribute("messaging.kafka.offset", metadata.offset)
    if error is not None:
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, str(error)))
        span.set_attribute("error.type", type(error).__qualname__)
    span.end()


@contextmanager
def process_span(record: ConsumerRecord, group_id: str | None = None) -> Iterator[trace.Span]:
    """A CONSUMER span ``process <topic>``, the current span while the block runs, whose parent
    is the context the record's headers carry (none: a new trace)."""
    parent = propagate.extract(record.headers, getter=_GETTER)
    attributes: dict[str, str | int] = {
        "messaging.system": _SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": record.topic,
        "messaging.destination.partition.id": str(record.partition),
        "messaging.kafka.offset": record.offset,
        "messaging.message.body.size": len(record.value),
    }
    if group_id is not None:
        attributes["messaging.consumer.group.name"] = group_id
    with _tracer().start_as_current_span(
        f"process {record.topic}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
    ) as span:
        yield span
