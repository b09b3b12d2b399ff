"""A TLS / plaintext mismatch through the real CLI and real `dmq server` processes: the error says
it is a TLS handshake failure (not "is `dmq server` running?"), and no gRPC C-core line
("I1127 ... ssl_transport_security.cc:2563] Handshake failed ...", "... chttp2_transport.cc ... Got
goaway") reaches the CLI's stderr or a server's log."""

from __future__ import annotations

import pathlib
import re
import signal
import subprocess
from collections.abc import Iterator

import pytest

from tests.cli.conftest import SERVER_STOP_TIMEOUT_S, dmq_executable, run_dmq, wait_for

# glog / absl's prefix: severity, MMDD, time, thread id, file.cc:line]
C_CORE_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+\.cc:\d+\]", re.M)
ADDRESS_LINE = re.compile(r"DMQ is running: coordinator and broker on (\S+:\d+),")


class Server:
    """`dmq server --port 0` (the port is the one it bound, read from its first line)."""

    def __init__(self, root: pathlib.Path, *extra: str) -> None:
        self.log_path = root / "server.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [dmq_executable(), "server", "--port", "0", "--data-dir", str(root / "data"), "--log-level", "info", *extra],
            stdout=self._log, stderr=subprocess.STDOUT,
        )
        found = wait_for(lambda: self.proc.poll() is not None or ADDRESS_LINE.search(self.log()), "the server's address")
        assert found is not True, self.log()
        self.bootstrap = found.group(1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(SERVER_STOP_TIMEOUT_S)
        self._log.close()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("certs")
    made = run_dmq("certs", "create", str(directory))
    assert made.returncode == 0, made
    return directory


@pytest.fixture
def tls_server(tmp_path: pathlib.Path, certs: pathlib.Path) -> Iterator[Server]:
    srv = Server(tmp_path, "--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"),
                 "--tls-ca", str(certs / "ca.pem"))
    try:
        wait_for(lambda: run_dmq("--ca-file", str(certs / "ca.pem"), "health", bootstrap=srv.bootstrap).returncode == 0,
                 "the TLS server to be healthy")
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def plain_server(tmp_path: pathlib.Path) -> Iterator[Server]:
    srv = Server(tmp_path)
    try:
        wait_for(lambda: run_dmq("health", bootstrap=srv.bootstrap).returncode == 0, "the server to be healthy")
        yield srv
    finally:
        srv.stop()


def test_a_plaintext_client_at_a_tls_port_is_told_it_is_a_tls_handshake_failure(tls_server: Server) -> None:
    result = run_dmq("--timeout", "5", "topics", "list", bootstrap=tls_server.bootstrap)
    assert result.returncode == 1, result
    assert f"the coordinator at {tls_server.bootstrap} serves TLS" in result.stderr, result
    assert "TLS handshake failed" in result.stderr and "--ca-file" in result.stderr, result
    assert "is `dmq server` running" not in result.stderr, result
    assert not C_CORE_LINE.search(result.stderr), result
    tls_server.stop()  # the log is complete once the server has ended
    assert "Handshake" not in tls_server.log() and not C_CORE_LINE.search(tls_server.log()), tls_server.log()[-3000:]


def test_a_tls_client_at_a_plaintext_port_is_told_it_is_a_tls_handshake_failure(
    plain_server: Server, certs: pathlib.Path
) -> None:
    result = run_dmq("--timeout", "5", "--ca-file", str(certs / "ca.pem"), "topics", "list",
                     bootstrap=plain_server.bootstrap)
    assert result.returncode == 1, result
    assert f"the TLS handshake with the coordinator at {plain_server.bootstrap} failed" in result.stderr, result
    assert "is `dmq server` running" not in result.stderr, result
    assert not C_CORE_LINE.search(result.stderr), result
