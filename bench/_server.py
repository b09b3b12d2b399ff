"""Servers in child processes for the bench scripts.

A child has its own interpreter and GIL, as in a deployment, so the client side measured in the
bench process does not share a GIL with the server. The child prints `READY <host:port>` once it
serves; SIGTERM stops it cleanly.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator

EMBEDDED_SCRIPT = textwrap.dedent(
    """
    import asyncio, logging, pathlib, sys
    import structlog
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    from dmq.client.cli.runner import ClusterOptions, run_embedded

    def ready(cluster):
        print("READY", cluster.bootstrap, flush=True)

    asyncio.run(run_embedded(ClusterOptions(data_dir=pathlib.Path(sys.argv[1])), ready))
    """
)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the bench process dies, even by SIGKILL or a crash
    that skips stop(). An orphaned server kept the bench's output pipe open, hanging its caller."""
    if sys.platform == "linux":
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def stop_process(proc: subprocess.Popen[str], timeout_s: float = 30) -> None:
    """SIGTERM, and SIGKILL if the process has not exited within timeout_s; reaped either way."""
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


class ChildServer:
    """`python -c script *args` that prints READY host:port; the owner calls stop(). `python`: the
    interpreter (another installation's, to compare an earlier commit in the same run)."""

    def __init__(self, script: str, *args: str, python: str = sys.executable) -> None:
        self.proc = subprocess.Popen(
            [python, "-c", script, *args], stdout=subprocess.PIPE, text=True, preexec_fn=_die_with_parent
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the child prints READY or dies
        if not line.startswith("READY"):
            self.proc.kill()
            raise SystemExit(f"server did not start: {line!r}")
        self.bootstrap = line.split()[1]
        self.ready_fields = line.split()[1:]  # what else the script printed after READY

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the server process has used so far (Linux /proc)."""
        try:
            fields = pathlib.Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return float("nan")
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        stop_process(self.proc)


def embedded_server(data_dir: pathlib.Path) -> ChildServer:
    """`dmq server`'s shape (coordinator + one broker on one port), data in data_dir."""
    return ChildServer(EMBEDDED_SCRIPT, str(data_dir))


@contextlib.contextmanager
def running_embedded_server(prefix: str) -> Iterator[ChildServer]:
    """embedded_server() on a new temporary directory (its name starting with prefix), stopped and
    the directory removed on leaving."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        server = embedded_server(pathlib.Path(tmp))
        try:
            yield server
        finally:
            server.stop()
