"""`make run` starts a server that `dmq` talks to; SIGTERM shuts it down cleanly, so the next start
recovers nothing (the logs' clean-shutdown markers are there)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import time

import pytest

from tests.cli.conftest import run_dmq

ROOT = pathlib.Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 60.0


def _start(argv: list[str], log: pathlib.Path, cwd: pathlib.Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")}
    with open(log, "wb") as out:
        return subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _wait_for(log: pathlib.Path, text: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        assert proc.poll() is None, f"exited with {proc.returncode}: {log.read_text(errors='replace')[-2000:]}"
        time.sleep(0.05)
    pytest.fail(f"{text!r} not printed in {START_TIMEOUT_S}s: {log.read_text(errors='replace')[-2000:]}")


def _banner_bootstrap(log: pathlib.Path, proc: subprocess.Popen[bytes]) -> str:
    """The address the banner tells users to connect to: the servers here start on port 0 (a
    port picked by the test could be taken by another process before the server binds it)."""
    _wait_for(log, "stop with Ctrl-C", proc)  # the banner's last line: the address is all there
    found = re.search(r'bootstrap="([0-9.]+:[0-9]+)"', log.read_text(errors="replace"))
    assert found is not None, f"the banner does not say how to connect: {log.read_text(errors='replace')[-2000:]}"
    return found.group(1)


def _stop(proc: subprocess.Popen[bytes], sig: signal.Signals = signal.SIGTERM) -> int:
    os.killpg(proc.pid, sig)
    try:
        return proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        pytest.fail("the server did not stop within 20 s of SIGTERM")


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_run_serves_dmq_and_restarts_without_recovery(tmp_path: pathlib.Path) -> None:
    data = tmp_path / "data"
    log = tmp_path / "make-run.log"
    proc = _start(["make", "--no-print-directory", "run", "DMQ_PORT=0", f"DMQ_DATA_DIR={data}"], log, ROOT)
    try:
        _wait_for(log, "DMQ is running", proc)
        bootstrap = _banner_bootstrap(log, proc)
        created = run_dmq("topics", "create", "events", "--partitions", "2", bootstrap=bootstrap)
        assert created.returncode == 0, created
        produced = run_dmq("produce", "events", bootstrap=bootstrap, input="one\ntwo\n")
        assert produced.returncode == 0, produced
        listed = run_dmq("topics", "list", "-o", "json", bootstrap=bootstrap)
        assert [t["name"] for t in json.loads(listed.stdout)["topics"]] == ["events"]
    finally:
        # Ctrl-C as a user would: the signal reaches make and the server (one process group). make
        # itself dies of the signal; the server must finish its clean shutdown regardless.
        _stop(proc, signal.SIGINT)
    assert "broker stopped" in log.read_text(errors="replace"), log.read_text(errors="replace")[-2000:]

    # The same data directory again: every partition log opens clean, none is scanned.
    log2 = tmp_path / "restart.log"
    proc = _start(
        [str(ROOT / ".venv" / "bin" / "dmq"), "server", "--port", "0", "--data-dir", str(data),
         "--log-level", "info"],
        log2,
        tmp_path,
    )
    try:
        _wait_for(log2, "DMQ is running", proc)
        bootstrap = _banner_bootstrap(log2, proc)
        consumed = run_dmq("consume", "events", "--from-beginning", "--max-messages", "2", bootstrap=bootstrap)
        assert consumed.returncode == 0, consumed
        assert sorted(consumed.stdout.split()) == ["one", "two"]
    finally:
        assert _stop(proc) == 0, log2.read_text(errors="replace")[-2000:]
    lines = [json.loads(line) for line in log2.read_text().splitlines() if line.startswith("{")]
    found = [e for e in lines if e.get("event") == "logs found"]
    assert found and found[0]["recovered"] == 0, found
    opened = [e for e in lines if e.get("event") == "log opened"]
    assert opened and all(e["clean"] is True and e["segments_scanned"] == 0 for e in opened), opened
