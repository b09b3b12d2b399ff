"""Helpers of the console tests: a real `dmq console` process, HTTP calls, and groups with a
chosen subscription mode made through the coordinator's own RPC (FindOrCreateGroup records the
mode; an operator's commit then sets offsets, so lag is known exactly without a live member)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import select
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping

import grpc

from dmq.client import AdminClient
from dmq.client.cli._certs import create_dev_certs
from dmq.client.cli.runner import ClusterOptions, ClusterThread
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from tests.cli.conftest import dmq_executable
from tests.processes import stop_process
from tests.security.conftest import server_security

START_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 30.0
_READY = re.compile(r"DMQ console at (http://\S+/)")
MODES = {"all": pb.SUBSCRIPTION_MODE_ALL, "new": pb.SUBSCRIPTION_MODE_NEW, "timestamp": pb.SUBSCRIPTION_MODE_TIMESTAMP}


class ConsoleProcess:
    """`dmq console --port 0` in a subprocess; the bound URL comes from its ready line."""

    def __init__(self, bootstrap: str, *args: str, env: Mapping[str, str] | None = None,
                 argv: list[str] | None = None) -> None:
        """`argv` (the arguments after `dmq`) replaces the default command line."""
        full_env = {k: v for k, v in os.environ.items() if k not in ("DMQ_BOOTSTRAP", "DMQ_TOKEN")}
        full_env.update(env or {})
        if argv is None:
            argv = ["--bootstrap", bootstrap, "--timeout", "10", "console", "--port", "0", "--log-level", "warning",
                    *args]
        self.proc = subprocess.Popen([dmq_executable(), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=full_env)
        self.url = self._wait_ready()

    def __repr__(self) -> str:
        return f"<ConsoleProcess {self.url} pid={self.proc.pid} rc={self.proc.poll()}>"

    def _wait_ready(self) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        seen = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                seen += chunk
                found = _READY.search(seen.decode(errors="replace"))
                if found:
                    return found.group(1)
            elif self.proc.poll() is not None:
                break
        self.proc.kill()
        _out, err = self.proc.communicate(timeout=START_TIMEOUT_S)
        raise AssertionError(f"dmq console gave no ready line (rc={self.proc.returncode}): {seen!r} {err!r}")

    def get(self, path: str) -> tuple[int, str]:
        return self._call(urllib.request.Request(self.url.rstrip("/") + path))

    def headers(self, path: str) -> Mapping[str, str]:
        with urllib.request.urlopen(self.url.rstrip("/") + path, timeout=HTTP_TIMEOUT_S) as answer:
            return dict(answer.headers)

    def post(self, path: str, form: Mapping[str, str]) -> tuple[int, str]:
        data = urllib.parse.urlencode(form).encode()
        return self._call(urllib.request.Request(self.url.rstrip("/") + path, data=data, method="POST"))

    @staticmethod
    def _call(request: urllib.request.Request) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def stop(self) -> int:
        """SIGTERM, then the exit code (the console stops cleanly on it)."""
        stop_process(self.proc, START_TIMEOUT_S)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.proc.stdout.close()
        self.stderr = self.proc.stderr.read().decode(errors="replace")
        self.proc.stderr.close()
        return self.proc.returncode


def make_group(bootstrap: str, topic: str, app_id: str, mode: str, committed: Mapping[int, int],
               from_ms: int = 0) -> str:
    """An empty group of `topic` in subscription `mode`, with `committed` offsets; its id."""
    with grpc.insecure_channel(bootstrap) as channel:
        found = pb_grpc.GroupCoordinatorStub(channel).FindOrCreateGroup(
            pb.FindOrCreateGroupRequest(topic=topic, app_id=app_id, subscription_mode=MODES[mode],
                                        subscription_from_ms=from_ms), timeout=HTTP_TIMEOUT_S)
    if committed:
        with AdminClient(bootstrap) as admin:
            admin.commit_group_offsets(found.group_id, {(topic, p): o for p, o in committed.items()})
    return found.group_id


@contextlib.contextmanager
def secure_cluster(directory: pathlib.Path) -> Iterator[tuple[ClusterThread, str]]:
    """A cluster with security on (TLS and tokens, tests.security's secret; "admin" a super-user),
    its servers in this process on loopback; with the path of its CA, for DMQ_SSL_CAFILE."""
    create_dev_certs(directory / "certs")
    thread = ClusterThread(ClusterOptions(data_dir=directory / "data",
                                          security=server_security(directory / "certs", "tokens")))
    thread.start()
    try:
        yield thread, str(directory / "certs" / "ca.pem")
    finally:
        thread.stop()
