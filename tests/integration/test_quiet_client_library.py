"""The client library prints nothing unless the application asks (issue 14 item 5).

A child process that configures no logging imports and uses the library (produce, consume in a
group, commit, admin calls, and error paths that log warnings) against a real server run by this
test process; its stdout and stderr must be empty. The same script with
``logging.basicConfig(level=DEBUG)`` must show the library's lines, under the ``dmq`` logger.
The script uses the original setting names, so it runs against the code before the change too.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from dmq.client import AdminClient
from dmq.client.cli.runner import ClusterThread

pytestmark = pytest.mark.processes  # left out of `make check`

SCRIPT = textwrap.dedent(
    """
    import sys, time
    if sys.argv[2] == "debug":
        import logging
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    from dmq.client import AdminClient, DMQConsumer, Producer, SimpleConsumer, TopicPartition
    from dmq.client import errors

    bootstrap = sys.argv[1]
    admin = AdminClient(bootstrap)
    admin.create_topic("quiet", 2)
    try:
        admin.create_topic("quiet", 2)
    except errors.TopicAlreadyExistsError:
        pass
    admin.list_topics()
    admin.describe_topic("quiet")

    with Producer(bootstrap, linger_ms=0) as p:
        for i in range(20):
            p.send("quiet", b"v%d" % i, key=b"k%d" % i)
        p.flush(10)
    try:
        p.send("quiet", b"late")
    except errors.ClientClosedError:
        pass

    # A coordinator that is not there: the constructor (before: send(), after max_block_ms) gives up.
    try:
        dead = Producer("127.0.0.1:9", max_block_ms=200, request_timeout_ms=300, delivery_timeout_ms=400, linger_ms=0)
        dead.send("quiet", b"x")
        dead.close(0.5)
    except errors.DMQError:
        pass

    with DMQConsumer(metadata_service_url=bootstrap, group_id="app", heartbeat_interval_ms=200,
                     session_timeout_ms=3000, auto_commit_interval_ms=100) as c:
        c.subscribe("quiet")
        got = 0
        deadline = time.monotonic() + 15
        while got < 20 and time.monotonic() < deadline:
            got += len(c.poll(200))
        assert got == 20, got
        c.commit_sync()
        c.committed(TopicPartition("quiet", 0))
        try:
            c.subscribe("no-such-topic")
        except errors.DMQError:
            pass
    with SimpleConsumer(bootstrap) as sc:
        sc.consume("quiet", 0, 0)
    admin.delete_topic("quiet")
    try:
        admin.delete_topic("quiet")
    except errors.DMQError:
        pass
    admin.close()
    """
)


def _run(bootstrap: str, mode: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, bootstrap, mode], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def server(cluster: ClusterThread) -> ClusterThread:
    return cluster


def test_using_the_library_without_logging_configured_prints_nothing(server: ClusterThread) -> None:
    done = _run(server.bootstrap, "quiet")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert done.stderr == ""


def test_debug_lines_appear_when_the_application_asks(server: ClusterThread) -> None:
    done = _run(server.bootstrap, "debug")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert any(line.startswith("dmq.client.producer DEBUG producer started") for line in lines), done.stderr[-2000:]
    assert any(line.startswith("dmq.client.consumer._consumer INFO joined group consumer=") and
               "group='G_quiet_app'" in line for line in lines), done.stderr[-2000:]
    with AdminClient(server.bootstrap) as admin:
        assert "quiet" not in [t.name for t in admin.list_topics()]
