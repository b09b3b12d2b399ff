"""OpenTelemetry spans over real servers (issue 29 item 4): with the API installed and asked for,
produce makes PRODUCER spans and consume (process_span) CONSUMER spans with the messaging
conventions' attributes, linked through the records' traceparent headers; without the API,
nothing is imported and the producer says which extra to install."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from dmq.client import AdminClient, Producer, SimpleConsumer
from dmq.client.cli.runner import ClusterThread
from dmq.client.errors import UnknownPartitionError
from dmq.client.tracing import process_span
from dmq.proto.tracecontext import TraceContext

pytestmark = pytest.mark.processes  # left out of `make check`

WAIT_S = 30.0


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Spans ended during the test. The global tracer provider can be set once per process, so
    the first test sets an SDK one and each test adds its own exporter to it."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()  # later spans are no longer kept


def _hex(span: ReadableSpan) -> tuple[str, str]:
    ctx = span.get_span_context()
    assert ctx is not None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


def test_produce_and_consume_spans_are_linked_through_traceparent(cluster: ClusterThread, spans: InMemorySpanExporter) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("a", 2)
        admin.create_topic("b", 1)
    tracer = trace.get_tracer("test")
    with Producer(cluster.bootstrap, opentelemetry=True) as p, SimpleConsumer(cluster.bootstrap) as c:
        with tracer.start_as_current_span("checkout") as app:  # the application's own span
            sent = p.send("a", b"order", key=b"k").get(WAIT_S)
        (received,) = c.consume("a", sent.partition, sent.offset, max_records=1)
        with process_span(received, group_id="billing"):  # the next hop, inside the consumer span
            onward = p.send("b", b"bill").get(WAIT_S)
        (forwarded,) = c.consume("b", 0, onward.offset, max_records=1)
        p.flush()

    trace_id = f"{app.get_span_context().trace_id:032x}"
    ours = {s.name: s for s in spans.get_finished_spans() if _hex(s)[0] == trace_id}
    assert set(ours) == {"checkout", "send a", "process a", "send b"}, list(ours)
    send_a, process_a, send_b = ours["send a"], ours["process a"], ours["send b"]
    assert (send_a.kind, process_a.kind, send_b.kind) == (SpanKind.PRODUCER, SpanKind.CONSUMER, SpanKind.PRODUCER)
    # parent links: checkout -> send a -(record a's traceparent)-> process a -> send b
    assert send_a.parent is not None and send_a.parent.span_id == app.get_span_context().span_id
    assert process_a.parent is not None and process_a.parent.span_id == send_a.get_span_context().span_id  # type: ignore[union-attr]
    assert process_a.parent.is_remote
    assert send_b.parent is not None and send_b.parent.span_id == process_a.get_span_context().span_id  # type: ignore[union-attr]
    # each record's traceparent is the context of the span that sent it
    for record, span in ((received, send_a), (forwarded, send_b)):
        ctx = record.trace_context
        assert ctx is not None and (ctx.trace_id, ctx.span_id) == _hex(span) and ctx.sampled
    assert dict(send_a.attributes or {}) == {
        "messaging.system": "dmq",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "a",
        "messaging.destination.partition.id": str(sent.partition),
        "messaging.kafka.offset": sent.offset,
    }
    attrs = dict(process_a.attributes or {})
    assert attrs["messaging.system"] == "dmq" and attrs["messaging.operation.type"] == "process"
    assert attrs["messaging.destination.name"] == "a"
    assert attrs["messaging.destination.partition.id"] == str(sent.partition)
    assert attrs["messaging.kafka.offset"] == sent.offset
    assert attrs["messaging.consumer.group.name"] == "billing"
    with AdminClient(cluster.bootstrap) as admin:  # and the broker's index follows the same trace
        assert [r.topic for r in admin.find_trace(trace_id)] == ["a", "b"]

    # A producer not asked for spans writes no context, an active span or not (opt-in: no cost).
    with Producer(cluster.bootstrap) as plain, tracer.start_as_current_span("other"):
        quiet = plain.send("b", b"untraced").get(WAIT_S)
    with SimpleConsumer(cluster.bootstrap) as c:
        (record,) = c.consume("b", 0, quiet.offset, max_records=1)
    assert record.headers == () and record.trace_context is None


def test_a_given_context_is_the_parent_of_the_send_span_and_a_failed_send_ends_it_with_the_error(
    cluster: ClusterThread, spans: InMemorySpanExporter
) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("c", 1)
    upstream = TraceContext.new()
    with Producer(cluster.bootstrap, opentelemetry=True) as p:
        meta = p.send("c", b"x", trace_context=upstream).get(WAIT_S)
        with pytest.raises(UnknownPartitionError, match="partition 5 does not exist"):
            p.send("c", b"y", partition=5)  # no such partition: refused in send()
    (span,) = [s for s in spans.get_finished_spans() if _hex(s)[0] == upstream.trace_id]
    assert span.parent is not None and f"{span.parent.span_id:016x}" == upstream.span_id
    assert span.attributes is not None and span.attributes["messaging.kafka.offset"] == meta.offset
    (failed,) = [s for s in spans.get_finished_spans() if s.name == "send c" and not s.status.is_ok]
    assert failed.attributes is not None and failed.attributes["error.type"] == "UnknownPartitionError"


def test_without_the_api_nothing_is_imported_and_asking_for_spans_names_the_extra(cluster: ClusterThread) -> None:
    # A child process where opentelemetry cannot be imported (None in sys.modules blocks it).
    trace_id = TraceContext.new().trace_id
    code = f"""
import sys
sys.modules["opentelemetry"] = None
from dmq.client import AdminClient, Producer
from dmq.client.errors import InvalidConfigError
with AdminClient({cluster.bootstrap!r}) as admin:
    admin.create_topic("plain", 1)
with Producer({cluster.bootstrap!r}, trace_ids=True) as p:
    p.send("plain", b"x", trace_id="{trace_id}").get(30)
    p.send("plain", b"y").get(30)  # trace_ids=True: a trace of its own
with AdminClient({cluster.bootstrap!r}) as admin:
    assert [r.value for r in admin.find_trace("{trace_id}")] == [b"x"]
try:
    Producer({cluster.bootstrap!r}, opentelemetry=True)
except InvalidConfigError as e:
    print(e)
from dmq.client.tracing import process_span
try:
    process_span(None)
except ModuleNotFoundError as e:
    print(e)
print(sorted(m for m in sys.modules if m.startswith("opentelemetry") and sys.modules[m] is not None))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "opentelemetry=True: install the OpenTelemetry API: pip install 'dmq-queue[otel]'",
        "process_span needs OpenTelemetry: install the OpenTelemetry API: pip install 'dmq-queue[otel]'",
        "[]",
    ]


def test_with_the_api_but_no_sdk_a_continued_trace_still_gets_a_new_span_id(cluster: ClusterThread) -> None:
    # A child process: the API installed, no tracer provider set (the API's tracer makes no spans).
    upstream = TraceContext.new()
    code = f"""
from dmq.client import AdminClient, Producer, SimpleConsumer
with AdminClient({cluster.bootstrap!r}) as admin:
    admin.create_topic("noop", 1)
with Producer({cluster.bootstrap!r}, opentelemetry=True) as p:
    first = p.send("noop", b"x", trace_context={upstream.traceparent!r}).get(30)
    second = p.send("noop", b"y").get(30)  # no context at all: nothing to carry
with SimpleConsumer({cluster.bootstrap!r}) as c:
    for r in c.consume("noop", 0, 0, max_wait_ms=0):
        print(r.trace_context)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first.startswith(f"TraceContext(trace_id='{upstream.trace_id}', span_id=")
    assert f"span_id='{upstream.span_id}'" not in first
    assert second == "None"

