"""`dmq -v` / `-vv` show the client library's log (stdlib `logging`, bridged to structlog) on
stderr; without them the command prints only its own output."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.cli.conftest import Dmq


def test_vv_shows_the_client_library_log_on_stderr_only(dmq: Dmq) -> None:
    dmq.ok("topics", "create", "logged", "-p", "1")
    quiet = dmq.ok("produce", "logged", input="a\nb\n")
    assert "producer started" not in quiet.stderr and "producer started" not in quiet.stdout
    loud = dmq.ok("-vv", "produce", "logged", input="c\n")
    assert "producer started" in loud.stderr
    assert "producer started" not in loud.stdout
    consumed = dmq.ok("-vv", "consume", "logged", "--from-beginning", "--max-messages", "3")
    assert consumed.stdout.split() == ["a", "b", "c"]
