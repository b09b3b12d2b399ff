"""The README's "Python client" examples, run as written against a real server.

The ```python blocks of the section are joined into one script (the README's address replaced by
this test's server) and run in a child process with no logging configured; it must exit 0 and
print exactly what the comments after the prints promise, and nothing on stderr. If the README
changes, this test runs the new text.
"""

from __future__ import annotations

import re

import pytest

from dmq.client.cli.runner import ClusterThread
from tests.readme_examples import run_section, section_blocks, section_script


@pytest.mark.slow
def test_readme_python_examples_run(cluster: ClusterThread) -> None:
    assert len(section_blocks("Python client")) >= 2
    script = section_script("Python client")
    assert "Producer(" in script and "DMQConsumer(" in script
    lines = run_section("Python client", cluster.bootstrap)
    assert len(lines) == 15, lines  # every print of the README's examples, and nothing else
    assert re.fullmatch(r"RecordMetadata\(topic='payments', partition=\d, offset=\d+.*\)", lines[0]), lines
    assert lines[1] == "total 450"
    assert lines[2] == "3 acknowledged"
    assert re.fullmatch(r"OffsetAndMetadata\(offset=\d+, metadata=''\)", lines[3]), lines
    assert re.fullmatch(r"\{TopicPartition\(topic='payments', partition=0\): \d+\}", lines[4]), lines
    assert lines[5] == "3 new records"
    assert lines[6:8] == ["0 members", "[0, 0, 0]"], lines
    # kafka-python's habits, then aiokafka's (issue 26 item 11)
    assert lines[8:12] == ["[0, 1, 2]", "True", "13 records", "0"], lines
    assert lines[12:15] == ["payments True", "[0, 1, 2]", "0"], lines
