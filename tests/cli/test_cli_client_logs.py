"""`dmq -v` / `-vv` show the client library's log (stdlib `logging`, bridged to structlog) on
stderr; without them the command prints only its own output."""

from __future__ import annotations

import pathlib
import subprocess
import sys
from typing import TYPE_CHECKING, Any

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


def test_version_is_looked_up_under_the_dmq_queue_distribution(dmq_bare: Any, tmp_path: pathlib.Path) -> None:
    # What the installed metadata says, seen from a clean sys.path (the console script's: not this
    # test's working directory, where a build may have left a dmq_queue.egg-info).
    code = (
        "from importlib.metadata import PackageNotFoundError, version\n"
        "try:\n    print(version('dmq-queue'))\n"
        "except PackageNotFoundError:\n    print('unknown (the dmq-queue distribution is not installed')"
    )
    expected = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                              timeout=60, check=True).stdout.strip()
    result = dmq_bare("--version")
    assert result.returncode == 0, result
    assert result.stdout.startswith(f"dmq, version {expected}"), result
