"""Issue 13: `dmq produce` stores every line it can and says what became of each one.

Before the fix: with batch_size 1 MiB and a topic limited to 1 MiB most lines of a file were not
stored (batches encoded a little above 1 MiB); a line too large for the topic stopped the command
and took the lines batched with it; Ctrl-C printed nothing about what was stored; the progress bar
counted bytes read, not records stored.
"""

from __future__ import annotations

import pathlib
import signal
import subprocess
import time
from typing import TYPE_CHECKING

from dmq.client import SimpleConsumer

if TYPE_CHECKING:
    from tests.cli.conftest import Dmq, ServerProcess

WAIT_S = 15.0


def _end_offset(bootstrap: str, topic: str) -> int:
    with SimpleConsumer(bootstrap) as c:
        return c.offsets(topic, 0)[1]


def test_a_file_of_small_lines_is_stored_whole_with_batch_size_equal_to_the_topic_limit(
    dmq: Dmq, tmp_path: pathlib.Path
) -> None:
    """The issue's case: 200,000 lines, default --batch-size 1 MiB, max_message_bytes 1 MiB."""
    dmq.ok("topics", "create", "lines-1mib", "--config", "max_message_bytes=1MiB")
    path = tmp_path / "lines.txt"
    path.write_text("".join(f"line-{i:06d}\n" for i in range(200_000)))
    # batches fill to batch_size (rather than being shipped younger by linger_ms), as with a fast reader
    result = dmq("produce", "lines-1mib", "--file", str(path), "--linger-ms", "1000", "-o", "json")
    summary = result.json()
    assert (summary["messages"], summary["failed"]) == (200_000, 0), result.stderr[-2000:]
    assert summary["not_sent"] == 0 and result.returncode == 0, result.stderr[-2000:]
    assert dmq.json("topics", "describe", "lines-1mib")["messages"] == 200_000


def test_a_line_too_large_is_reported_and_skipped_and_the_rest_is_stored(dmq: Dmq, tmp_path: pathlib.Path) -> None:
    dmq.ok("topics", "create", "lines-4k", "--config", "max_message_bytes=4096")
    lines = [f"line-{i}" for i in range(1_000)]
    lines[500] = "x" * 5_000
    path = tmp_path / "with-a-big-one.txt"
    path.write_text("".join(line + "\n" for line in lines))
    result = dmq("produce", "lines-4k", "--file", str(path), "--batch-size", "2048", "--progress")
    assert result.returncode == 1, result
    assert "line 501 skipped" in result.stderr and "max_message_bytes 4096" in result.stderr, result.stderr
    assert "999 stored, 1 failed, 0 not sent, of 1000 lines read" in result.stderr, result.stderr
    # the progress bar counts records stored, against the lines of the file
    assert "999/1000" in result.stderr, result.stderr
    stored = dmq.ok("consume", "lines-4k", "--from-beginning", "--timeout-ms", "500").stdout.splitlines()
    assert stored == lines[:500] + lines[501:]


def test_ctrl_c_stores_what_was_read_and_says_how_much(server: ServerProcess, dmq: Dmq, dmq_exe: str) -> None:
    """Full batches go out at once; the last one lingers (60 s) until Ctrl-C flushes it."""
    dmq.ok("topics", "create", "lines-int")
    proc = subprocess.Popen(
        [dmq_exe, "--bootstrap", server.bootstrap, "produce", "lines-int", "--batch-size", "1024",
         "--linger-ms", "60000"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"".join(b"value-%014d\n" % i for i in range(200)))  # 20 bytes each
        proc.stdin.flush()
        # Wait until the full batches are stored and nothing more arrives: the rest lingers.
        deadline = time.monotonic() + WAIT_S
        stored, stable_since = 0, time.monotonic()
        while time.monotonic() < deadline:
            now = _end_offset(server.bootstrap, "lines-int")
            if now != stored:
                stored, stable_since = now, time.monotonic()
            elif stored and time.monotonic() - stable_since > 0.5:
                break
            time.sleep(0.05)
        assert 0 < stored < 200, stored
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=WAIT_S)
    text = err.decode()
    assert proc.returncode == 130, text
    assert "Interrupted: 200 stored, 0 failed, 0 not sent, of 200 lines read; reading stopped after line 200" in text
    assert _end_offset(server.bootstrap, "lines-int") == 200


def test_bench_produce_honours_a_record_size_above_one_mib(dmq: Dmq) -> None:
    """--record-size accepted up to 16 MB, but the producer refused every record above 1 MiB."""
    result = dmq.json("bench", "produce", "-t", "bench-big", "-n", "3", "-s", str(2 * 1024 * 1024), "--no-progress")
    assert result["records"] == 3 and result["errors"] == 0
    assert dmq.json("topics", "describe", "bench-big")["messages"] == 3
