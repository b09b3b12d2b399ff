"""Issue 13: `dmq server --default-subscription-mode timestamp --default-subscription-from TIME`
end to end: a consumer group that names no mode starts at TIME. (Before, the timestamp default
was accepted without a time and every such consumer failed in FindOrCreateGroup.)"""

from __future__ import annotations

import datetime as dt
import pathlib
import subprocess
import time

from tests.cli.conftest import Dmq, ServerProcess


def test_a_group_naming_no_mode_starts_at_the_server_default_time(tmp_path: pathlib.Path) -> None:
    """Records are written around T first; the server then restarts with the default (a default
    fixed before the records were written would race with them)."""
    srv = ServerProcess(tmp_path / "data", tmp_path / "server-1.log")
    try:
        srv.wait_ready()
        dmq = Dmq(srv.bootstrap)
        dmq.ok("topics", "create", "ts-default")
        dmq.ok("produce", "ts-default", input="before\n")
        from_ms = time.time_ns() // 1_000_000 + 20
        while time.time_ns() // 1_000_000 <= from_ms + 5:  # the broker stamps append times
            time.sleep(0.01)
        dmq.ok("produce", "ts-default", input="after\n")
    finally:
        srv.stop()
    iso = dt.datetime.fromtimestamp(from_ms / 1000, dt.timezone.utc).isoformat(timespec="milliseconds")
    srv = ServerProcess(tmp_path / "data", tmp_path / "server-2.log",
                        ("--default-subscription-mode", "timestamp", "--default-subscription-from", iso))
    try:
        srv.wait_ready()
        dmq = Dmq(srv.bootstrap)
        consumed = dmq.ok("consume", "ts-default", "--group", "nomode", "--max-messages", "1", "--timeout-ms", "10000")
        assert consumed.stdout == "after\n", consumed
    finally:
        srv.stop()


def assert_refuses_timestamp_default_without_a_time(dmq_exe: str, *command: str) -> None:
    """`dmq <command> --default-subscription-mode timestamp` (no --default-subscription-from)
    exits at once with a usage error naming the missing option."""
    argv = [dmq_exe, *command, "--default-subscription-mode", "timestamp"]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"`dmq {' '.join(command)}` started instead of refusing the setting") from e
    assert result.returncode == 2, result
    assert "--default-subscription-from" in result.stderr


def test_dmq_coordinator_refuses_a_timestamp_default_without_a_time(tmp_path: pathlib.Path, dmq_exe: str) -> None:
    assert_refuses_timestamp_default_without_a_time(
        dmq_exe, "coordinator", "--port", "0", "--data-dir", str(tmp_path / "c"))


def test_dmq_server_with_brokers_refuses_a_timestamp_default_without_a_time(tmp_path: pathlib.Path,
                                                                             dmq_exe: str) -> None:
    """Refused before any child process starts, so the coordinator child never fails later."""
    assert_refuses_timestamp_default_without_a_time(
        dmq_exe, "server", "--brokers", "2", "--port", "0", "--data-dir", str(tmp_path / "d"))
    assert not (tmp_path / "d").exists()
