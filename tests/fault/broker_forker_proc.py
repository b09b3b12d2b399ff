"""A fork server for broker restarts: imports the broker once, then forks a fresh `dmq broker`
(run_broker_only, as the command runs it) for every "start PORT" line on stdin. Restarting by
fork takes milliseconds instead of a second of imports, so a test can SIGKILL and restart a broker
process many times (the test kills the broker, never this process's own work).

Protocol: stdin "start PORT\\n" (0: any free port) -> stdout "pid PID\\n" at once, then
"ready HOST:PORT\\n" from the broker once it has started. The brokers' logs go to LOG.
Usage: broker_forker_proc.py COORDINATOR DATA_DIR LOG
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import sys

from dmq.client.cli.runner import run_broker_only


def _broker(coordinator: str, data_dir: pathlib.Path, log: str, port: int, out: int) -> None:
    out = os.dup(out)  # the pipe, kept: fd 1 becomes the log
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    asyncio.run(run_broker_only(data_dir, "127.0.0.1", port, 0, coordinator,
                                lambda address: os.write(out, f"ready {address}\n".encode())))


def main() -> None:
    coordinator, data_dir, log = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # killed brokers are reaped by the kernel
    for line in sys.stdin:
        command, port = line.split()
        assert command == "start", line
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            try:
                _broker(coordinator, data_dir, log, int(port), sys.stdout.fileno())
            finally:
                os._exit(0)
        print(f"pid {pid}", flush=True)


if __name__ == "__main__":
    main()
