"""W3C trace context over real servers (issue 29 item 4): a trace followed through three topics by
its W3C trace id, each hop a consumer that produces the next record carrying the context
(AdminClient.find_trace and `dmq trace`); bad traceparent values refused by the producer and
ignored by the broker's index and by consumers, as the spec says; records written with the older
dmq.trace header still found."""

from __future__ import annotations

import time

import grpc
import pytest

from dmq.client import AdminClient, DMQConsumer, Producer, SimpleConsumer
from dmq.client.records import ConsumerRecord
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import records
from dmq.proto.grpc_options import channel_options
from dmq.proto.tracecontext import TraceContext, parse_traceparent
from tests.cli.conftest import Dmq

WAIT_S = 30.0  # a bound on each wait, not a timed assertion
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TOPICS = ("orders", "payments", "shipping")


def _poll_until(consumer: DMQConsumer, wanted: bytes) -> ConsumerRecord:
    """The first record polled whose value is `wanted` (the others are noise); fails after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for record in consumer.poll(timeout_ms=500):
            if record.value == wanted:
                return record
    raise AssertionError(f"no record {wanted!r} polled in {WAIT_S}s")


def test_a_w3c_trace_is_followed_through_three_topics_by_consumers_that_produce(cluster3) -> None:  # type: ignore[no-untyped-def]
    with AdminClient(cluster3.bootstrap) as admin:
        for t in TOPICS:
            admin.create_topic(t, 3)  # 9 partitions over the 3 brokers
    with Producer(cluster3.bootstrap, trace_ids=True) as p:
        for t in TOPICS:  # other traces around it (trace_ids=True: a new trace each)
            for i in range(10):
                p.send(t, b"noise", key=f"{t}-{i}".encode())
        p.flush()  # so no record of the trace joins a batch made (and timestamped) before it
        first = p.send("orders", b"order 42", key=b"order-42", trace_id=TRACE.upper()).get(WAIT_S)  # either case
        # Two hops: a consumer of one topic produces what it processed to the next, carrying the
        # record's context (same trace id, a new span id).
        for src, dst in zip(TOPICS, TOPICS[1:]):
            with DMQConsumer(bootstrap_servers=cluster3.bootstrap, group_id=f"to-{dst}", auto_offset_reset="earliest") as c:
                c.subscribe(src)
                wanted = b"order 42" if src == "orders" else f"{src} of order 42".encode()
                record = _poll_until(c, wanted)
                assert record.trace_context is not None and record.trace_context.trace_id == TRACE
                p.send(dst, f"{dst} of order 42".encode(), key=b"order-42", trace_context=record.trace_context).get(WAIT_S)

    with AdminClient(cluster3.bootstrap) as admin:
        found = admin.find_trace(TRACE)
        assert [r.topic for r in found] == list(TOPICS)  # in time order
        assert [r.value for r in found] == [b"order 42", b"payments of order 42", b"shipping of order 42"]
        assert (found[0].partition, found[0].offset) == (first.partition, first.offset)
        contexts = [r.trace_context for r in found]
        assert all(c is not None and c.trace_id == TRACE and c.sampled for c in contexts)
        assert len({c.span_id for c in contexts if c is not None}) == 3  # each hop its own span
        assert all(records.TRACE_HEADER not in dict(r.headers) for r in found)  # traceparent only
        # the same trace by a whole traceparent value, and by the id in capitals
        assert admin.find_trace(contexts[1].traceparent) == found  # type: ignore[union-attr]
        assert admin.find_trace(TRACE.upper()) == found

    dmq = Dmq(cluster3.bootstrap)
    doc = dmq.json("trace", TRACE)
    assert doc["trace_id"] == TRACE and doc["truncated"] is False
    assert [(d["topic"], d["partition"], d["offset"], d["value"]) for d in doc["records"]] == [
        (r.topic, r.partition, r.offset, r.value.decode()) for r in found
    ]
    assert all(parse_traceparent(h["value"]) is not None for d in doc["records"] for h in d["headers"] if h["name"] == "traceparent")
    assert dmq.json("trace", contexts[2].traceparent)["trace_id"] == TRACE  # type: ignore[union-attr]
    human = dmq.ok("trace", TRACE).stdout
    assert all(t in human for t in TOPICS) and "shipping of order 42" in human
    missing = dmq("trace", TraceContext.new().trace_id)
    assert missing.returncode == 1 and "No record carries trace id" in missing.stdout + missing.stderr


# Values the W3C spec says a receiver must ignore, each for its own rule.
BAD_TRACEPARENTS = {
    "uppercase hex": "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
    "version ff": "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "all-zero trace-id": "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    "all-zero parent-id": "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
    "version 00 with more": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
    "short trace-id": "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
    "later version not continued by '-'": "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
    "not hex": "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
    "empty": "",
}


def test_bad_traceparents_are_refused_by_the_producer_and_ignored_by_broker_and_consumer(cluster) -> None:  # type: ignore[no-untyped-def]
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("tp", 1)
    with Producer(cluster.bootstrap) as p:
        for value in BAD_TRACEPARENTS.values():
            with pytest.raises(ValueError, match="header 'traceparent' is not a W3C traceparent"):
                p.send("tp", b"x", headers={"traceparent": value.encode()})
            with pytest.raises(ValueError, match="trace_context is not a W3C traceparent"):
                p.send("tp", b"x", trace_context=value)
        for bad_id in ("T", "0" * 32, TRACE[:-1], TRACE + "0", "g" * 32):
            with pytest.raises(ValueError, match="trace_id must be a W3C trace id: 32 hex digits, not all zero"):
                p.send("tp", b"x", trace_id=bad_id)
        with pytest.raises(ValueError, match="give trace_id or trace_context, not both"):
            p.send("tp", b"x", trace_id=TRACE, trace_context=TraceContext.new())
        with pytest.raises(ValueError, match="the headers hold a 'traceparent' already"):
            p.send("tp", b"x", headers={"traceparent": TraceContext.new().traceparent.encode()}, trace_id=TRACE)
        with pytest.raises(ValueError, match="trace_context is not a W3C traceparent"):
            p.send("tp", b"x", trace_context=TraceContext(TRACE, "0" * 16))  # built by hand, checked too
        assert p.send("tp", b"ok", trace_id=TRACE).get(WAIT_S).offset == 0

    # Another client's batch: every bad value stored (a foreign header never costs a record), none
    # indexed; a later version continued by '-' is read as version 00, as the spec says.
    later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next"
    values = [*BAD_TRACEPARENTS.values(), later]
    batch = records.encode([b"v"] * len(values), headers=[[("traceparent", v.encode())] for v in values])
    with grpc.insecure_channel(cluster.bootstrap, options=channel_options()) as channel:
        answer = pb_grpc.BrokerStub(channel).Produce(pb.ProduceRequest(topic="tp", partition=0, batch=batch), timeout=WAIT_S)
    assert answer.base_offset == 1
    with AdminClient(cluster.bootstrap) as admin:
        assert [r.offset for r in admin.find_trace(TRACE)] == [0, 1 + len(BAD_TRACEPARENTS)]
        assert admin.find_trace("0" * 32) == []  # the all-zero id was not indexed either
    with SimpleConsumer(cluster.bootstrap) as c:
        stored = c.consume("tp", 0, 1, max_wait_ms=0)
    assert len(stored) == len(values)
    assert [r.trace_context for r in stored[:-1]] == [None] * len(BAD_TRACEPARENTS)
    assert stored[-1].trace_context == TraceContext(TRACE, "00f067aa0ba902b7", 1)


def test_records_with_the_older_dmq_trace_header_are_still_found(cluster) -> None:  # type: ignore[no-untyped-def]
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("old", 2)
    with Producer(cluster.bootstrap) as p:  # as a client before traceparent wrote them
        a = p.send("old", b"a", key=b"1", headers={"dmq.trace": b"ORDER-42-trace"}).get(WAIT_S)
        b = p.send("old", b"b", key=b"2", headers={"dmq.trace": b"ORDER-42-trace"}).get(WAIT_S)
        p.send("old", b"c", key=b"3", trace_id=TRACE).get(WAIT_S)
    with AdminClient(cluster.bootstrap) as admin:
        found = admin.find_trace("ORDER-42-trace")
        assert sorted((r.partition, r.offset) for r in found) == sorted([(a.partition, a.offset), (b.partition, b.offset)])
        assert all(r.trace_context is None for r in found)
        assert [r.value for r in admin.find_trace(TRACE)] == [b"c"]
    doc = Dmq(cluster.bootstrap).json("trace", "ORDER-42-trace")
    assert sorted(d["value"] for d in doc["records"]) == ["a", "b"]


def test_dmq_produce_refuses_a_bad_traceparent_header_naming_the_option(cluster) -> None:  # type: ignore[no-untyped-def]
    dmq = Dmq(cluster.bootstrap)
    dmq.ok("topics", "create", "cli-tp")
    bad = dmq("produce", "cli-tp", "--header", "traceparent=00-bad", input="hello\n")
    assert bad.returncode == 2, bad  # a usage error, not a traceback
    assert "--header" in bad.stderr and "is not a W3C traceparent ('00-bad')" in bad.stderr
    assert "Traceback" not in bad.stderr
    good = TraceContext.new()
    dmq.ok("produce", "cli-tp", "--header", f"traceparent={good.traceparent}", input="hello\n")
    assert [d["value"] for d in dmq.json("trace", good.trace_id)["records"]] == ["hello"]
