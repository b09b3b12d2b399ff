"""The README's "Event store" example, run as written against a real server: the ```python
blocks of the section joined into one script (the README's address replaced by this test's
server), run in a child process; it must exit 0 and print exactly what its comments promise."""

from __future__ import annotations

from dmq.client.cli.runner import ClusterThread
from tests.readme_examples import run_section, section_script


def test_readme_event_store_example_runs(cluster: ClusterThread) -> None:
    assert "EventStore(" in section_script("Event store")
    lines = run_section("Event store", cluster.bootstrap)
    assert lines == [
        "2",
        "conflict at position 2",
        "{'course_name': 'Algebra'} ['course.created', 'student.joined']",
        "None",
    ]
