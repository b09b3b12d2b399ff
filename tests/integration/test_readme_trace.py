"""The README's "Transaction ids and trace ids" examples, run as written against a real server:
a transaction stored once, and a W3C trace carried by a consumer from one topic to the next and
found by its trace id. If the README changes, this test runs the new text."""

from __future__ import annotations

from dmq.client.cli.runner import ClusterThread
from tests.readme_examples import run_section, section_script

SECTION = "Transaction ids and trace ids"


def test_readme_trace_examples_run(cluster: ClusterThread) -> None:
    script = section_script(SECTION)
    assert "trace_context=record.trace_context" in script and "find_trace(" in script
    lines = run_section(SECTION, cluster.bootstrap)
    assert lines == [  # what the README's comments after the print promise
        "orders 1 4bf92f3577b34da6a3ce929d0e0e4736",
        "payments 1 4bf92f3577b34da6a3ce929d0e0e4736",
    ]
