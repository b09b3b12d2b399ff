"""The README's "Python client" examples, run as written against a real server.

The ```python blocks of the section are joined into one script (the README's address replaced by
this test's server) and run in a child process with no logging configured; it must exit 0 and
print exactly what the comments after the prints promise, and nothing on stderr. If the README
changes, this test runs the new text.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from dmq.client.cli.runner import ClusterThread

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
README_ADDRESS = "127.0.0.1:9091"


def python_blocks(text: str) -> list[str]:
    match = re.search(r"^## Python client$(.*?)(?=^## )", text, re.M | re.S)
    assert match, "README.md has no '## Python client' section"
    return re.findall(r"^```python\n(.*?)^```", match.group(1), re.M | re.S)


def test_readme_python_examples_run(cluster: ClusterThread) -> None:
    blocks = python_blocks(README.read_text())
    assert len(blocks) >= 2
    script = "\n".join(blocks)
    assert "Producer(" in script and "DMQConsumer(" in script and README_ADDRESS in script
    done = subprocess.run(
        [sys.executable, "-c", script.replace(README_ADDRESS, cluster.bootstrap)],
        capture_output=True, text=True, timeout=90, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    lines = done.stdout.splitlines()
    assert len(lines) == 8, lines  # every print of the README's examples, and nothing else
    assert re.fullmatch(r"RecordMetadata\(topic='payments', partition=\d, offset=\d+.*\)", lines[0]), lines
    assert lines[1] == "total 450"
    assert lines[2] == "3 acknowledged"
    assert re.fullmatch(r"OffsetAndMetadata\(offset=\d+, metadata=''\)", lines[3]), lines
    assert re.fullmatch(r"\{TopicPartition\(topic='payments', partition=0\): \d+\}", lines[4]), lines
    assert lines[5] == "3 new records"
    assert lines[6:8] == ["0 members", "[0, 0, 0]"], lines
