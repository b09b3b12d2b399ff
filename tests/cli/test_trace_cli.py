"""A trace followed through three topics on three brokers by its W3C trace id (traceparent headers;
tests/cli/test_trace_context.py has consumers carry it hop to hop): AdminClient.find_trace and `dmq trace`
(human and -o json); `dmq topics create --config dedup_window_ms=...`."""

from __future__ import annotations

import uuid

from dmq.client import AdminClient, Producer
from dmq.proto.tracecontext import TraceContext, is_trace_id, parse_traceparent
from tests.cli.conftest import Dmq

TOPICS = ("orders", "payments", "shipping")
T = TraceContext.new().trace_id  # W3C trace ids (32 hex digits), each test's own
R = TraceContext.new().trace_id


def test_a_trace_is_followed_through_three_topics(cluster3) -> None:  # type: ignore[no-untyped-def]
    with AdminClient(cluster3.bootstrap) as admin:
        for t in TOPICS:
            admin.create_topic(t, 3)  # 9 partitions over the 3 brokers
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    with Producer(cluster3.bootstrap, trace_ids=True) as p:
        expected = []
        for step, topic in enumerate(TOPICS):
            for i in range(20):  # other traces around it, generated (trace_ids=True)
                p.send(topic, b"noise", key=f"{step}-{i}".encode())
            meta = p.send(topic, f"step {step}".encode(), trace_id=trace, key=b"order-42").get(10)
            expected.append((topic, meta.partition, meta.offset))
            p.flush()
    with AdminClient(cluster3.bootstrap) as admin:
        found = admin.find_trace(trace)
        assert [(r.topic, r.partition, r.offset) for r in found] == expected  # in time order
        assert [r.value for r in found] == [b"step 0", b"step 1", b"step 2"]
        assert not found.truncated
        assert all(r.trace_context is not None and r.trace_context.trace_id == trace for r in found)

    dmq = Dmq(cluster3.bootstrap)
    doc = dmq.json("trace", trace)
    assert doc["trace_id"] == trace and doc["truncated"] is False
    assert [(r["topic"], r["partition"], r["offset"], r["value"]) for r in doc["records"]] == [
        (t, p, o, f"step {i}") for i, (t, p, o) in enumerate(expected)
    ]
    assert [h["value"].split("-")[1] for h in doc["records"][0]["headers"] if h["name"] == "traceparent"] == [trace]
    human = dmq.ok("trace", trace).stdout
    assert all(t in human for t in TOPICS) and "step 2" in human
    missing = dmq("trace", str(uuid.uuid4()))
    assert missing.returncode == 1 and "No record carries trace id" in missing.stdout + missing.stderr
    bad = dmq("trace", "t" * 256)
    assert bad.returncode == 1 and "trace_id is 256 characters; it must be 1 to 255" in bad.stderr


def test_generated_trace_ids_are_w3c_and_findable(cluster) -> None:  # type: ignore[no-untyped-def]
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("gen", 1)
    with Producer(cluster.bootstrap, trace_ids=True) as p:
        p.send("gen", b"a").get(10)
    with AdminClient(cluster.bootstrap) as admin:
        from dmq.client import SimpleConsumer

        with SimpleConsumer(cluster.bootstrap) as c:
            (rec,) = [r for b in c.consume_batches("gen", 0, 0, end_offset=1) for r in b]
        ctx = parse_traceparent(dict(rec.headers)["traceparent"])
        assert ctx is not None and is_trace_id(ctx.trace_id)
        trace = ctx.trace_id
        assert [r.offset for r in admin.find_trace(trace)] == [0]


def test_topics_create_takes_the_dedup_window(cluster) -> None:  # type: ignore[no-untyped-def]
    dmq = Dmq(cluster.bootstrap)
    dmq.ok("topics", "create", "win", "--config", "dedup_window_ms=5s")
    assert dmq.json("topics", "describe", "win")["config"]["dedup_window_ms"] == 5000
    bad = dmq("topics", "create", "win2", "--config", "dedup_window_ms=2d")
    assert bad.returncode == 1 and "dedup_window_ms" in bad.stderr and "86400000" in bad.stderr


def test_find_trace_stops_at_max_records_and_says_so(cluster) -> None:  # type: ignore[no-untyped-def]
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("many", 1)
        with Producer(cluster.bootstrap) as p:
            offsets = [p.send("many", b"x", trace_id=T).get(10).offset for _ in range(5)]
        found = admin.find_trace(T, max_records=3)
        assert [r.offset for r in found] == offsets[:3] and found.truncated
        everything = admin.find_trace(T)
        assert [r.offset for r in everything] == offsets and not everything.truncated


def test_traces_are_found_after_a_restart_and_after_their_index_files_are_deleted(cluster_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from dmq.client.cli.runner import ClusterOptions, ClusterThread

    data_dir = tmp_path / "restart"
    with ClusterThread(ClusterOptions(data_dir=data_dir)) as first:
        with AdminClient(first.bootstrap) as admin:
            admin.create_topic("a", 2, config={"segment_bytes": 1024})  # several segments
        with Producer(first.bootstrap) as p:
            want = []
            for i in range(30):
                p.send("a", b"n" * 50, key=str(i).encode())
                if i % 7 == 0:
                    m = p.send("a", b"t", trace_id=R, key=str(i).encode()).get(10)
                    want.append((m.partition, m.offset))
    files = list(data_dir.rglob("*.traceindex"))
    assert len(files) > 2
    with ClusterThread(ClusterOptions(data_dir=data_dir)) as second, AdminClient(second.bootstrap) as admin:
        assert sorted((r.partition, r.offset) for r in admin.find_trace(R)) == sorted(want)
    for f in files:
        f.unlink()
    third = cluster_factory(data_dir=data_dir)
    with AdminClient(third.bootstrap) as admin:
        assert sorted((r.partition, r.offset) for r in admin.find_trace(R)) == sorted(want)
    assert len(list(data_dir.rglob("*.traceindex"))) >= len(files)  # rebuilt from the logs
