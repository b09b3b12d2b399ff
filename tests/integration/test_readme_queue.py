"""The README's "Queue mode" example, run as written against a real server.

The ```python blocks of the section are joined into one script (the README's address replaced by
this test's server) and run in a child process; it must exit 0, print exactly what the comments
promise and nothing on stderr, and leave the state the text describes (one dead letter).
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from dmq.client import SimpleConsumer
from dmq.client.cli.runner import ClusterThread

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
README_ADDRESS = "127.0.0.1:9091"


def test_readme_queue_example_runs(cluster: ClusterThread) -> None:
    match = re.search(r"^## Queue mode$(.*?)(?=^## )", README.read_text(), re.M | re.S)
    assert match, "README.md has no '## Queue mode' section"
    script = "\n".join(re.findall(r"^```python\n(.*?)^```", match.group(1), re.M | re.S))
    assert "QueueConsumer(" in script and README_ADDRESS in script
    done = subprocess.run(
        [sys.executable, "-c", script.replace(README_ADDRESS, cluster.bootstrap)],
        capture_output=True, text=True, timeout=90, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.splitlines() == ["5 records leased", "15 records acked"]
    with SimpleConsumer(cluster.bootstrap) as c:
        [dead] = c.consume("jobs.dlq", 0, 0)
    assert dict(dead.headers)["dmq.dlq.reason"] == b"rejected"
