"""Fixtures for the CLI tests: a real `dmq server` subprocess per module and a runner for `dmq`.

The tests drive the installed `dmq` console script (next to the test's Python in the virtualenv)
exactly as an operator would: a subprocess with arguments, stdin, an exit code, stdout and stderr.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests import polling
from tests.processes import stop_process, wait_until_a_broker_is_alive

# A deadline on readiness, not a wait: `dmq server --brokers 3` starts its brokers once its
# coordinator listens, four processes importing grpc, which took over 30 s under load average 18.
SERVER_START_TIMEOUT_S = 90.0
SERVER_STOP_TIMEOUT_S = 15.0
COMMAND_TIMEOUT_S = 60.0
WAIT_S = 30.0  # a bound on each wait for a state, not a timed assertion


def wait_for(predicate: Any, what: str, timeout_s: float = WAIT_S) -> Any:
    """predicate()'s first truthy value, polled every 0.1 s; AssertionError after timeout_s."""
    return polling.wait_for(predicate, what, timeout_s)


def dmq_executable() -> str:
    beside = pathlib.Path(sys.executable).parent / "dmq"
    if beside.exists():
        return str(beside)
    found = shutil.which("dmq")
    if found is None:
        pytest.fail("the `dmq` console script is not installed: run `pip install -e .` in the virtualenv")
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Result:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)

    def __repr__(self) -> str:
        return f"<Result {' '.join(self.args)!r} rc={self.returncode} stdout={self.stdout!r} stderr={self.stderr!r}>"


def run_dmq(*args: str, bootstrap: str | None = None, input: str | None = None,
            timeout_s: float = COMMAND_TIMEOUT_S, env: dict[str, str] | None = None) -> Result:
    argv = [dmq_executable()]
    if bootstrap is not None:
        argv += ["--bootstrap", bootstrap]
    argv += list(args)
    full_env = {k: v for k, v in os.environ.items() if k not in ("DMQ_BOOTSTRAP", "DMQ_TIMEOUT")}
    full_env.update(env or {})
    proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout_s, env=full_env)
    return Result(argv[1:], proc.returncode, proc.stdout, proc.stderr)


# What `dmq server` prints once it listens, embedded or with --brokers N (client/cli/servers.py).
_RUNNING = re.compile(r'bootstrap="(\S+)"')


class ServerProcess:
    """`dmq server` in a subprocess; the owner calls wait_ready() (which learns the address) and
    stop()."""

    def __init__(self, data_dir: pathlib.Path, log_path: pathlib.Path, extra_args: tuple[str, ...] = ()) -> None:
        # The server binds port 0 and prints the port it got: a port picked here is bound by
        # the child only after a second or more of imports, and any process on the machine can
        # take it meanwhile. (With --brokers N the coordinator process says it to its parent.)
        self.port = 0
        self._bootstrap: str | None = None
        self.data_dir = data_dir
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [dmq_executable(), "server", "--port", str(self.port), "--data-dir", str(data_dir),
             "--log-level", "warning", *extra_args],
            stdout=self._log, stderr=subprocess.STDOUT,
        )

    @property
    def bootstrap(self) -> str:
        if self._bootstrap is None:
            raise RuntimeError("the server's address is known once wait_ready() has returned")
        return self._bootstrap

    def __repr__(self) -> str:
        return f"<ServerProcess {self._bootstrap or 'port 0'} pid={self.proc.pid} rc={self.proc.poll()}>"

    def wait_ready(self, timeout_s: float = SERVER_START_TIMEOUT_S) -> None:
        """Learn the address the server bound, then poll ListBrokers until the broker has
        registered (created topics need a live broker)."""
        import grpc

        from dmq.proto import dmq_pb2_grpc as pb_grpc

        deadline = time.monotonic() + timeout_s
        while self._bootstrap is None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dmq server exited with {self.proc.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"dmq server did not say its address in {timeout_s}s: {self.log_tail()}")
            found = _RUNNING.search(self.log_tail(chars=100_000))
            if found:
                self._bootstrap = found.group(1)
                self.port = int(self._bootstrap.rsplit(":", 1)[1])
            else:
                time.sleep(0.05)
        with grpc.insecure_channel(self.bootstrap) as channel:
            if wait_until_a_broker_is_alive(pb_grpc.MetadataStub(channel), self.proc, deadline, self.log_tail):
                return
        raise TimeoutError(f"dmq server at {self.bootstrap} not ready in {timeout_s}s: {self.log_tail()}")

    def metrics_url(self) -> str:
        """The URL of its /metrics (started with `--metrics-port auto`), once it has printed it."""
        return str(wait_for(lambda: (m := re.search(r"metrics at (http://\S+)", self.log_tail())) and m.group(1),
                            "the metrics URL on stderr"))

    def log_tail(self, chars: int = 3000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        stop_process(self.proc, SERVER_STOP_TIMEOUT_S)
        self._log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One live `dmq server` for the whole test module (starting one costs about a second)."""
    base = tmp_path_factory.mktemp("dmq-server")
    srv = ServerProcess(base / "data", base / "server.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def metered_server(tmp_path: pathlib.Path) -> Iterator[ServerProcess]:
    """A `dmq server` of the test's own serving /metrics (`--metrics-port auto`), ready."""
    srv = ServerProcess(tmp_path / "data", tmp_path / "server.log", ("--metrics-port", "auto"))
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


class Dmq:
    """`dmq` bound to a server: dmq("topics", "list") runs `dmq --bootstrap ADDR topics list`."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def __call__(self, *args: str, input: str | None = None, timeout_s: float = COMMAND_TIMEOUT_S,
                 env: dict[str, str] | None = None) -> Result:
        return run_dmq(*args, bootstrap=self.bootstrap, input=input, timeout_s=timeout_s, env=env)

    def ok(self, *args: str, **kwargs: Any) -> Result:
        result = self(*args, **kwargs)
        assert result.returncode == 0, result
        return result

    def json(self, *args: str, **kwargs: Any) -> Any:
        return self.ok(*args, "-o", "json", **kwargs).json()


@pytest.fixture(scope="module")
def dmq(server: ServerProcess) -> Dmq:
    return Dmq(server.bootstrap)


@pytest.fixture
def dmq_bare() -> Any:
    """`dmq` with no --bootstrap: run_dmq(*args, bootstrap=None, input=None, timeout_s=..., env=None)."""
    return run_dmq


@pytest.fixture
def unused_address() -> str:
    """An address where nothing listens (a port just freed)."""
    return f"127.0.0.1:{free_port()}"


@pytest.fixture
def dmq_exe() -> str:
    """Path of the installed `dmq` console script, for tests that manage the process themselves."""
    return dmq_executable()
