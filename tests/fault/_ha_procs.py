"""Real processes for the control-plane HA fault test (test_coordinator_ha.py): N `dmq coordinator`s
on one etcd (one active, the others standing by) and M `dmq broker`s given every coordinator.

A coordinator's first start binds a free port (port 0) and says which; a restart reuses that port,
since the brokers and clients were given the list of addresses. Each start writes its own log
file (`c0-1.log`, `c0-2.log`, ...), so "coordinator active (controller epoch N)" in the current log
is about the current process. Every process is killed (after SIGCONT, in case it was stopped) when
the cluster closes.
"""

from __future__ import annotations

import contextlib
import pathlib
import re
import signal
import subprocess
import sys
import time

START_TIMEOUT_S = 30.0  # a child importing grpc on a loaded 2-core machine
_ACTIVE = re.compile(r"coordinator active \(controller epoch (\d+)\)")


class ServerProc:
    """One `python -m dmq.client.cli ...` server process; `address` once its log says it listens."""

    def __init__(self, root: pathlib.Path, name: str) -> None:
        self.root = root
        self.name = name
        self.starts = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = root / f"{name}.log"
        self.address = ""

    def __repr__(self) -> str:
        rc = None if self.proc is None else self.proc.poll()
        return f"<{type(self).__name__} {self.name} {self.address} starts={self.starts} rc={rc}>"

    def _spawn(self, args: list[str], ready: str) -> None:
        self.starts += 1
        self.log_path = self.root / f"{self.name}-{self.starts}.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "dmq.client.cli", *args], stdout=log, stderr=log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for line in self.log().splitlines():
                if ready in line:
                    self.address = line.rsplit(" ", 1)[-1].strip()
                    return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)  # polling a condition (the ready line) under a deadline
        self.kill()
        raise AssertionError(f"{self.name} did not start: {self.log()[-2000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)  # a stopped process must be able to die
                self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


class CoordinatorProc(ServerProc):
    def __init__(self, root: pathlib.Path, name: str, etcd_url: str, args: list[str]) -> None:
        super().__init__(root, name)
        self.etcd_url = etcd_url
        self.args = args
        self.port = 0

    def start(self) -> None:
        assert not self.running(), self
        self._spawn(
            ["coordinator", "--port", str(self.port), "--data-dir", str(self.root / self.name),
             "--metadata-store", self.etcd_url, "--log-level", "warning", *self.args],
            "coordinator listening on",
        )
        self.port = int(self.address.rsplit(":", 1)[1])

    def epoch(self) -> int | None:
        """The controller epoch this process claimed when it became active; None: it never did."""
        found = _ACTIVE.findall(self.log())
        return int(found[-1]) if found else None


class BrokerProc(ServerProc):
    def __init__(self, root: pathlib.Path, broker_id: int, coordinators: str, args: list[str]) -> None:
        super().__init__(root, f"broker{broker_id}")
        self.broker_id = broker_id
        self.coordinators = coordinators
        self.args = args

    def start(self) -> None:
        assert not self.running(), self
        self._spawn(
            ["broker", "--coordinator", self.coordinators, "--broker-id", str(self.broker_id),
             "--data-dir", str(self.root / f"b{self.broker_id}"), "--log-level", "warning", *self.args],
            f"broker {self.broker_id} listening on",
        )


class HaCluster:
    """`coordinators` coordinators on `etcd_url` and `brokers` brokers, started in that order."""

    def __init__(self, root: pathlib.Path, etcd_url: str, *, coordinators: int, brokers: int,
                 coordinator_args: list[str], broker_args: list[str]) -> None:
        self.coordinators = [CoordinatorProc(root, f"c{i}", etcd_url, coordinator_args) for i in range(coordinators)]
        self.brokers: list[BrokerProc] = []
        try:
            for c in self.coordinators:
                c.start()
            self.bootstrap = ",".join(c.address for c in self.coordinators)
            self.brokers = [BrokerProc(root, i, self.bootstrap, broker_args) for i in range(brokers)]
            for b in self.brokers:
                b.start()
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"<HaCluster {self.coordinators} {self.brokers}>"

    def active(self) -> CoordinatorProc | None:
        """The running coordinator that claimed the highest controller epoch (a deposed one that
        still runs claimed a lower one)."""
        claimed = [(c.epoch(), c) for c in self.coordinators if c.running()]
        best = max((e for e, _ in claimed if e is not None), default=None)
        return next((c for e, c in claimed if e == best), None) if best is not None else None

    def close(self) -> None:
        for p in [*self.coordinators, *self.brokers]:
            p.kill()

    def __enter__(self) -> HaCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
