"""`dmq console` as a process over a real `dmq server`, checked at the HTML level (no browser):
user bytes are escaped, the console is read-only unless --allow-writes, bad input gets 400.
The module's console is started with the README's command line ("Web console"), the address
and port swapped for the test server's and 0. The browser tests are in
test_console_browser.py; permissions in tests/security."""

from __future__ import annotations

import html
import pathlib
import re
import shlex
from collections.abc import Iterator

import grpc
import pytest

from dmq.client import AdminClient, EventStore, EventType, Producer, QueueConsumer
from dmq.client.consumer import DMQConsumer, TopicPartition
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from tests.cli._console import ConsoleProcess, make_group
from tests.cli.conftest import Dmq, ServerProcess, wait_for


def _committed(dmq: Dmq, group: str) -> list[int | None]:
    with AdminClient(dmq.bootstrap) as admin:
        return [p.committed_offset for p in admin.describe_group(group).partitions]


README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def readme_command() -> list[str]:
    """The arguments after `dmq` of the README's example console command."""
    section = re.search(r"^## Web console$(.*?)(?=^## )", README.read_text(), re.M | re.S)
    assert section, "README.md has no '## Web console' section"
    line = re.search(r"^dmq ([^#\n]*\bconsole\b[^#\n]*?)\s*(?:#.*)?$", section.group(1), re.M)
    assert line, "the Web console section has no `dmq ... console` example"
    return shlex.split(line.group(1))


@pytest.fixture(scope="module")
def console(server: ServerProcess) -> Iterator[ConsoleProcess]:
    argv = [{"127.0.0.1:9091": server.bootstrap, "9480": "0"}.get(a, a) for a in readme_command()]
    assert argv != readme_command() and "0" in argv, argv  # both the address and the port were swapped
    proc = ConsoleProcess(server.bootstrap, argv=argv)
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.stderr


def _topic_with_records(bootstrap: str, topic: str, partitions: int, n: int, value_prefix: bytes = b"v",
                        config: dict[str, int] | None = None) -> None:
    """topic created, then n records value_prefix + b"0", b"1"... round-robin over its partitions, each
    acknowledged before the next."""
    with AdminClient(bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions, config=config)
    with Producer(bootstrap) as p:
        for i in range(n):
            p.send(topic, value_prefix + b"%d" % i, partition=i % partitions).get(30)


def test_user_bytes_are_escaped_or_shown_as_hex(dmq: Dmq, console: ConsoleProcess) -> None:
    with AdminClient(dmq.bootstrap) as admin:
        admin.create_topic("escapes", partitions=1)
    with Producer(dmq.bootstrap) as p:
        p.send("escapes", b"<script>alert('v')</script>", key=b"\xff\xfe<k>",
               headers=[("<h>\"x", b"<img src=x onerror=alert(1)>")], partition=0).get(30)
    status, body = console.get("/topics/escapes/messages?from=latest&limit=10")
    assert status == 200, body
    assert "<script>alert" not in body and "<img src=x" not in body and '<h>"x' not in body
    assert "&lt;script&gt;alert(&#x27;v&#x27;)&lt;/script&gt;" in body
    assert "&lt;img src=x onerror=alert(1)&gt;" in body and "&lt;h&gt;&quot;x" in body
    assert "hex:fffe3c6b3e" in body  # not UTF-8: shown as hex, never decoded into markup
    # Behind the escaping, the browser is told to run no script at all.
    headers = console.headers("/topics/escapes/messages")
    assert "default-src 'none'" in headers["Content-Security-Policy"] and "script-src" not in headers["Content-Security-Policy"]
    assert headers["X-Content-Type-Options"] == "nosniff"


def test_read_only_by_default_refuses_writes(dmq: Dmq, console: ConsoleProcess) -> None:
    _topic_with_records(dmq.bootstrap, "ro", 1, 5)
    group = make_group(dmq.bootstrap, "ro", "roapp", "all", {0: 3})
    status, page = console.get(f"/groups/{group}")
    assert status == 200 and "read-only" in page and 'id="reset"' not in page
    status, body = console.post(f"/groups/{group}/reset", {"to": "earliest", "execute": "yes"})
    assert status == 403 and "--allow-writes" in body
    assert _committed(dmq, group) == [3]


def test_writes_when_enabled_preview_first_and_need_the_form_token(server: ServerProcess, dmq: Dmq) -> None:
    _topic_with_records(dmq.bootstrap, "rw", 2, 6)
    group = make_group(dmq.bootstrap, "rw", "rwapp", "all", {0: 3, 1: 3})
    writer = ConsoleProcess(server.bootstrap, "--allow-writes")
    try:
        status, page = writer.get(f"/groups/{group}")
        assert status == 200 and 'id="reset"' in page
        token = re.search(r'name="form_token" value="([^"]+)"', page)
        assert token is not None
        status, body = writer.post(f"/groups/{group}/reset", {"to": "earliest", "execute": "yes"})
        assert status == 403 and "form_token" in body  # a form not made by this console
        status, body = writer.post(f"/groups/{group}/reset", {"to": "earliest", "form_token": token.group(1)})
        assert status == 200 and "Dry run" in body and 'id="plan"' in body
        assert _committed(dmq, group) == [3, 3]
        status, body = writer.post(f"/groups/{group}/reset", {"to": "offset", "value": "1", "partitions": "1",
                                                              "execute": "yes", "form_token": token.group(1)})
        assert status == 200 and "Done" in body, body
        assert _committed(dmq, group) == [3, 1]
        status, body = writer.post(f"/groups/{group}/reset", {"to": "offset", "value": "-1",
                                                              "form_token": token.group(1)})
        assert status == 400 and "value" in body
        status, body = writer.post(f"/groups/{group}/reset", {"to": "timestamp", "value": "9" * 20,
                                                              "form_token": token.group(1)})
        assert status == 400 and "value" in body
        # A group with a live member is refused by the coordinator: a 409 that says why.
        with grpc.insecure_channel(dmq.bootstrap) as channel:
            pb_grpc.GroupCoordinatorStub(channel).JoinGroup(pb.JoinGroupRequest(group_id=group, client_id="live"),
                                                            timeout=30)
        status, body = writer.post(f"/groups/{group}/reset", {"to": "earliest", "execute": "yes",
                                                              "form_token": token.group(1)})
        assert status == 409 and "member" in body, body
        assert _committed(dmq, group) == [3, 1]
    finally:
        assert writer.stop() == 0, writer.stderr


@pytest.mark.parametrize("query, field", [
    ("limit=100000", "limit"), ("limit=x", "limit"), ("partition=7", "partition"), ("from=sideways", "from"),
    ("from=offset", "partition"), ("from=time&time=yesterday-ish", "time"),
    ("from=time&time=99999999999999999999", "time"), ("from=offset&partition=0&offset=-1", "offset"),
])
def test_bad_browser_input_is_400_naming_the_field(dmq: Dmq, console: ConsoleProcess, query: str, field: str) -> None:
    with AdminClient(dmq.bootstrap) as admin:
        if "bad-input" not in {t.name for t in admin.list_topics()}:
            admin.create_topic("bad-input", partitions=2)
    status, body = console.get(f"/topics/bad-input/messages?{query}")
    assert status == 400 and field in body, body


def test_unknown_topic_and_group_are_404(console: ConsoleProcess) -> None:
    assert console.get("/topics/no-such-topic")[0] == 404
    assert console.get("/groups/G_no-such_group")[0] == 404
    assert console.get("/queues/no-such-topic")[0] == 404
    assert console.get("/events/no-such-topic")[0] == 404
    status, body = console.get("/topics/" + "x" * 300)
    assert status == 400 and "249" in body  # the topic name limit


def test_overview_shows_the_coordinator_and_brokers(server: ServerProcess, console: ConsoleProcess) -> None:
    status, body = console.get("/")
    assert status == 200 and "healthy" in body
    coordinator = re.search(r'<table id="coordinator">.*?</table>', body, re.S)
    brokers = re.search(r'<table id="brokers">.*?</table>', body, re.S)
    assert coordinator is not None and server.bootstrap in coordinator.group(0)
    assert brokers is not None and f"<td>0</td><td>{server.bootstrap}</td>" in brokers.group(0)


def test_message_trace_ids_link_to_the_trace_view(dmq: Dmq, console: ConsoleProcess) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    with AdminClient(dmq.bootstrap) as admin:
        admin.create_topic("traced-a", partitions=1)
        admin.create_topic("traced-b", partitions=1)
    with Producer(dmq.bootstrap) as p:
        p.send("traced-a", b"first hop", trace_id=trace_id).get(30)
        p.send("traced-b", b"second hop", trace_id=trace_id).get(30)
    status, body = console.get("/topics/traced-a/messages")
    assert status == 200 and f'href="/trace?id={trace_id}"' in body
    status, body = console.get(f"/trace?id={trace_id}")
    trace = re.search(r'<table id="trace">.*?</table>', body, re.S)
    assert status == 200 and trace is not None
    assert "traced-a" in trace.group(0) and "traced-b" in trace.group(0)
    assert "first hop" in body and "second hop" in body
    assert console.get("/trace?id=" + "x" * 300)[0] == 400


def test_queue_page_shows_live_leases_and_why_each_dead_letter_failed(dmq: Dmq, console: ConsoleProcess) -> None:
    _topic_with_records(dmq.bootstrap, "jobs", 2, 6, b"job-", config={"max_queue_size": 100})
    with QueueConsumer(dmq.bootstrap, "jobs", "workers", max_records=3, lease_ms=60_000) as queue:
        lease = queue.pop(timeout=10)
        assert lease is not None
        queue.reject(lease, lease.start_offset, "bad <input>")
        status, listing = console.get("/queues")
        assert status == 200 and 'href="/queues/jobs"' in listing
        status, body = console.get("/queues/jobs")
        assert status == 200, body
        leases = re.search(r'<table id="leases">.*?</table>', body, re.S)
        assert leases is not None
        seconds = [float(s) for s in re.findall(r"<td>(\d+\.\d)</td>", leases.group(0))]
        assert seconds and all(0 < s <= 60 for s in seconds), leases.group(0)  # the live lease, seconds left
        assert "bad &lt;input&gt;" in body and "rejected" in body  # why it failed, escaped
        assert "job-" in body  # the dead letter's own value
        described = dmq.json("queues", "describe", "jobs")
    # The listing's and the card's figures are `dmq queues describe`'s (issue 29: depth, limit,
    # utilisation, live leases, dead letters); the lease's seconds left move, so not compared.
    assert (described["depth"], described["max_queue_size"], described["dead_letters"]) == (5, 100, 1)
    assert _rows(listing, "queues") == [["jobs", str(described["depth"]), "100", str(described["remaining"]),
                                         f"{described['utilisation_pct']:.1f}%", str(len(described["leases"])),
                                         str(described["dead_letters"])]]
    card = re.search(r'<dl class="card" id="queue">.*?</dl>', body, re.S)
    assert card is not None
    assert (f"<dt>Depth</dt><dd>{described['depth']}</dd>" in card.group(0)
            and "<dt>Limit</dt><dd>100</dd>" in card.group(0)
            and f"<dt>Dead letters</dt><dd>{described['dead_letters']}</dd>" in card.group(0)), card.group(0)


def test_event_store_page_shows_types_tags_and_a_groups_claims(dmq: Dmq, console: ConsoleProcess) -> None:
    with AdminClient(dmq.bootstrap) as admin:
        admin.create_topic("courses", kind="event-store")
        admin.create_topic("not-events", partitions=1)
    created = EventType("course.created", ["course_name"])
    joined = EventType("student.joined", ["course_name", "user_id"])
    with EventStore(dmq.bootstrap, "courses") as store:
        store.append(created.new(b'{"seats": 1}', course_name="Algebra"))
        store.append(joined.new(b"", course_name="Algebra", user_id="joe"))
        store.register_group("mailer")
        claim = store.claim_next("mailer", ["course_name"], [created, joined], worker_id="w<1>")
        assert claim is not None
        status, listing = console.get("/events")
        assert status == 200 and 'href="/events/courses"' in listing
        status, body = console.get("/events/courses?group=mailer")
    assert status == 200, body
    types = re.search(r'<table id="types">.*?</table>', body, re.S)
    tags = re.search(r'<table id="tags">.*?</table>', body, re.S)
    claims = re.search(r'<table id="claims">.*?</table>', body, re.S)
    assert types is not None and "course.created" in types.group(0) and "student.joined" in types.group(0)
    assert tags is not None and "course_name:Algebra" in tags.group(0) and "user_id:joe" in tags.group(0)
    assert claims is not None and "course_name=Algebra" in claims.group(0) and "w&lt;1&gt;" in claims.group(0)
    status, body = console.get("/events/not-events")  # an ordinary log
    assert status == 400 and "not an event store" in body


def test_message_browser_from_an_offset_and_from_a_time(dmq: Dmq, console: ConsoleProcess) -> None:
    _topic_with_records(dmq.bootstrap, "browse-from", 2, 8, b"rec-")

    def values(query: str) -> list[str]:
        status, body = console.get(f"/topics/browse-from/messages?{query}")
        assert status == 200, body
        return re.findall(r'<span class="value">(rec-\d)</span>', body)

    # Partition 0 holds rec-0, rec-2, rec-4, rec-6 at offsets 0..3.
    assert values("from=offset&partition=0&offset=2&limit=10") == ["rec-4", "rec-6"]
    assert values("from=offset&partition=0&offset=1&limit=1") == ["rec-2"]
    # Times far before and after any append (no clock is compared with a record's timestamp).
    assert sorted(values("from=time&time=2000-01-01T00:00:00Z&limit=100")) == [f"rec-{i}" for i in range(8)]
    assert values("from=time&time=9999-01-01T00:00:00Z") == []
    assert sorted(values("from=latest&partition=1&limit=2")) == ["rec-5", "rec-7"]


def _rows(body: str, table_id: str) -> list[list[str]]:
    """A table's body rows as the text of their cells (markup stripped, entities decoded)."""
    found = re.search(rf'<table id="{table_id}">.*?<tbody>(.*?)</tbody>', body, re.S)
    assert found is not None, f"no table {table_id!r}"
    return [[html.unescape(re.sub(r"<[^>]+>", "", cell)) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", found.group(1), re.S)]


def test_topic_page_shows_what_dmq_topics_describe_prints(dmq: Dmq, console: ConsoleProcess) -> None:
    with AdminClient(dmq.bootstrap) as admin:  # set up in process: each `dmq` run costs a second or more
        admin.create_topic("described", partitions=2, config={"retention_ms": 3_600_000})
    with Producer(dmq.bootstrap) as p:
        for value, part in ((b"a", 0), (b"b", 0), (b"c", 0), (b"d", 1)):
            p.send("described", value, partition=part).get(30)
    status, body = console.get("/topics/described")
    described = dmq.json("topics", "describe", "described")
    assert status == 200, body
    assert _rows(body, "partitions") == [
        [str(p["partition"]), str(p["leader_id"]), ",".join(map(str, p["replicas"])), ",".join(map(str, p["isr"])),
         str(p["leader_epoch"]), str(p["log_start_offset"]), str(p["log_end_offset"]), str(p["size_bytes"]),
         str(p["segment_count"])] for p in described["partitions"]]
    assert [p["log_end_offset"] for p in described["partitions"]] == [3, 1]  # the setup did what it says
    assert ["retention_ms", "3600000"] in _rows(body, "settings")


def test_group_page_shows_members_their_partitions_and_the_cli_lag(dmq: Dmq, console: ConsoleProcess) -> None:
    with AdminClient(dmq.bootstrap) as admin:
        admin.create_topic("paged", partitions=2)
    with Producer(dmq.bootstrap) as p:
        for part, count in ((0, 5), (1, 6)):
            for i in range(count):
                p.send("paged", b"v%d" % i, partition=part).get(30)
    consumer = DMQConsumer(bootstrap_servers=dmq.bootstrap, group_id="pagers", client_id="pager-1",
                           enable_auto_commit=False)
    try:
        consumer.subscribe("paged")
        wait_for(lambda: consumer.poll(200) is not None and len(consumer.assignment()) == 2, "the assignment")
        consumer.commit_sync({TopicPartition("paged", 0): 2, TopicPartition("paged", 1): 5})
        status, body = console.get("/groups/G_paged_pagers")
        described = dmq.json("groups", "describe", "G_paged_pagers")
    finally:
        consumer.close()
    assert status == 200, body
    [member] = described["members"]
    assert _rows(body, "members") == [[member["member_id"], "pager-1", member["host"] or "-", "0,1", "0,1"]]
    card = re.search(r'<dl class="card" id="group">.*?</dl>', body, re.S)
    assert card is not None and f"<dd>{described['generation']}</dd>" in card.group(0)
    assert [[p["partition"], p["committed_offset"], p["log_end_offset"], p["lag"]] for p in described["partitions"]] \
        == [[0, 2, 5, 3], [1, 5, 6, 1]]  # the setup did what it says
    assert _rows(body, "partitions") == [
        [str(p["partition"]), str(p["committed_offset"]), str(p["log_end_offset"]), str(p["lag"]), "pager-1"]
        for p in described["partitions"]]
