"""Servers in child processes for the bench scripts.

A child has its own interpreter and GIL, as in a deployment, so the client side measured in the
bench process does not share a GIL with the server. The child prints `READY <host:port>` once it
serves; SIGTERM stops it cleanly.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import signal
import subprocess
import sys
import textwrap

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
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def embedded_server(data_dir: pathlib.Path) -> ChildServer:
    """`dmq server`'s shape (coordinator + one broker on one port), data in data_dir."""
    return ChildServer(EMBEDDED_SCRIPT, str(data_dir))
