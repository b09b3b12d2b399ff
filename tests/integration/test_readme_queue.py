"""The README's "Queue mode" example, run as written against a real server.

The ```python blocks of the section are joined into one script (the README's address replaced by
this test's server) and run in a child process; it must exit 0, print exactly what the comments
promise and nothing on stderr, and leave the state the text describes (one dead letter).
"""

from __future__ import annotations

from dmq.client import SimpleConsumer
from dmq.client.cli.runner import ClusterThread
from tests.readme_examples import run_section, section_script


def test_readme_queue_example_runs(cluster: ClusterThread) -> None:
    assert "QueueConsumer(" in section_script("Queue mode")
    lines = run_section("Queue mode", cluster.bootstrap)
    assert lines == ["5 records leased", "15 records acked"]
    with SimpleConsumer(cluster.bootstrap) as c:
        [dead] = c.consume("jobs.dlq", 0, 0)
    assert dict(dead.headers)["dmq.dlq.reason"] == b"rejected"
