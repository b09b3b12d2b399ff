"""`dmq console` as a process over a real `dmq server`, checked at the HTML level (no browser):
user bytes are escaped, the console is read-only unless --allow-writes, bad input gets 400.
The browser tests are in test_console_browser.py; permissions in tests/security."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from dmq.client import AdminClient, Producer
from tests.cli._console import ConsoleProcess, make_group
from tests.cli.conftest import Dmq, ServerProcess


def _committed(dmq: Dmq, group: str) -> list[int | None]:
    with AdminClient(dmq.bootstrap) as admin:
        return [p.committed_offset for p in admin.describe_group(group).partitions]


@pytest.fixture(scope="module")
def console(server: ServerProcess) -> Iterator[ConsoleProcess]:
    proc = ConsoleProcess(server.bootstrap)
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.stderr


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


def test_read_only_by_default_refuses_writes(dmq: Dmq, console: ConsoleProcess) -> None:
    with AdminClient(dmq.bootstrap) as admin:
        admin.create_topic("ro", partitions=1)
    with Producer(dmq.bootstrap) as p:
        for i in range(5):
            p.send("ro", b"v%d" % i, partition=0).get(30)
    group = make_group(dmq.bootstrap, "ro", "roapp", "all", {0: 3})
    status, page = console.get(f"/groups/{group}")
    assert status == 200 and "read-only" in page and 'id="reset"' not in page
    status, body = console.post(f"/groups/{group}/reset", {"to": "earliest", "execute": "yes"})
    assert status == 403 and "--allow-writes" in body
    assert _committed(dmq, group) == [3]


def test_writes_when_enabled_preview_first_and_need_the_form_token(server: ServerProcess, dmq: Dmq) -> None:
    with AdminClient(dmq.bootstrap) as admin:
        admin.create_topic("rw", partitions=2)
    with Producer(dmq.bootstrap) as p:
        for i in range(6):
            p.send("rw", b"v%d" % i, partition=i % 2).get(30)
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
    finally:
        assert writer.stop() == 0, writer.stderr


@pytest.mark.parametrize("query, field", [
    ("limit=100000", "limit"), ("limit=x", "limit"), ("partition=7", "partition"), ("from=sideways", "from"),
    ("from=offset", "partition"), ("from=time&time=yesterday-ish", "time"),
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
