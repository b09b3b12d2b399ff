"""The README's "Queue mode" example, run as written against a real server.

The ```python blocks of the section are joined into one script (the README's address replaced by
this test's server) and run in a child process; it must exit 0, print exactly what the comments
promise and nothing on stderr, and leave the state the text describes (one dead letter).
"""

from __future__ import annotations

import json
import re
import shlex

import pytest

from dmq.client import SimpleConsumer
from dmq.client.cli.runner import ClusterThread
from tests.cli.conftest import run_dmq
from tests.readme_examples import README, run_section, section_script


@pytest.mark.slow
def test_readme_queue_example_runs(cluster: ClusterThread) -> None:
    assert "QueueConsumer(" in section_script("Queue mode")
    lines = run_section("Queue mode", cluster.bootstrap)
    assert lines == ["5 records leased", "15 records acked"]
    with SimpleConsumer(cluster.bootstrap) as c:
        [dead] = c.consume("jobs.dlq", 0, 0)
    assert dict(dead.headers)["dmq.dlq.reason"] == b"rejected"

    # the section's command that shows why each dead letter failed, as written
    [command] = re.findall(r"`(dmq consume jobs\.dlq[^`]*)`", README.read_text())
    shown = run_dmq(*shlex.split(command)[1:], bootstrap=cluster.bootstrap, timeout_s=30)
    assert shown.returncode == 0, shown
    [letter] = [json.loads(line) for line in shown.stdout.splitlines()]
    headers = {h["name"]: h["value"] for h in letter["headers"]}
    assert letter["value"].startswith("job-") and headers["dmq.dlq.error"] == "bad input", shown
