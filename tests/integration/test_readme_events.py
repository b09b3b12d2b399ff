"""The README's "Event store" example, run as written against a real server: the ```python
blocks of the section joined into one script (the README's address replaced by this test's
server), run in a child process; it must exit 0 and print exactly what its comments promise."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from dmq.client.cli.runner import ClusterThread

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
README_ADDRESS = "127.0.0.1:9091"


def test_readme_event_store_example_runs(cluster: ClusterThread) -> None:
    match = re.search(r"^## Event store$(.*?)(?=^## )", README.read_text(), re.M | re.S)
    assert match, "README.md has no '## Event store' section"
    script = "\n".join(re.findall(r"^```python\n(.*?)^```", match.group(1), re.M | re.S))
    assert "EventStore(" in script and README_ADDRESS in script
    done = subprocess.run(
        [sys.executable, "-c", script.replace(README_ADDRESS, cluster.bootstrap)],
        capture_output=True, text=True, timeout=90, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.splitlines() == [
        "2",
        "conflict at position 2",
        "{'course_name': 'Algebra'} ['course.created', 'student.joined']",
        "None",
    ]
