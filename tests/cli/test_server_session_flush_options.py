"""Issue 13, server settings that must do what they say:

- `dmq server` (one process, and `--brokers N` through its coordinator child) takes
  `--broker-session-timeout-ms` as `dmq coordinator` does. Before, it had no such option.
- `--flush-interval-ms` without `--flush interval` is refused at start with one usage line (`dmq server`,
  `dmq broker`). Before, it was accepted and silently ignored.
"""

from __future__ import annotations

import pathlib
import subprocess
import time

import grpc
import pytest

from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from tests.cli.conftest import ServerProcess, dmq_executable, free_port

SESSION_MS = 1_200


@pytest.mark.parametrize("brokers", [1, 2])
def test_dmq_server_takes_the_broker_session_timeout(tmp_path: pathlib.Path, brokers: int) -> None:
    srv = ServerProcess(tmp_path / "data", tmp_path / "server.log",
                        ("--brokers", str(brokers), "--broker-session-timeout-ms", str(SESSION_MS)))
    try:
        srv.wait_ready()
        with grpc.insecure_channel(srv.bootstrap) as channel:
            stub = pb_grpc.MetadataStub(channel)
            # wait_ready returns once one broker is up; with --brokers 2 the second process may still be
            # importing on a loaded machine, so wait for every broker before timing anybody's session.
            wait_until_alive(stub, list(range(brokers)))
            # A broker that registers and then never heartbeats: told the session's heartbeat period,
            # and declared dead once the session (not the 6 s default) has passed.
            answer = stub.RegisterBroker(pb.RegisterBrokerRequest(broker_id=77, host="127.0.0.1", port=free_port()),
                                         timeout=5)
            assert answer.heartbeat_interval_ms == SESSION_MS // 4
            registered = time.monotonic()
            alive = True
            while alive and time.monotonic() - registered < 4.0:  # below the default session
                brokers_now = stub.ListBrokers(pb.ListBrokersRequest(), timeout=5).brokers
                alive = next(b.alive for b in brokers_now if b.broker_id == 77)
                time.sleep(0.1)
            assert not alive, "broker 77 still alive 4 s after its last heartbeat"
            # the real brokers heartbeat within the short session and stay alive
            live = [b.broker_id for b in stub.ListBrokers(pb.ListBrokersRequest(), timeout=5).brokers if b.alive]
            assert sorted(live) == list(range(brokers))
    finally:
        srv.stop()
    assert srv.proc.returncode == 0, srv.log_tail()


def wait_until_alive(stub: pb_grpc.MetadataStub, broker_ids: list[int], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    live: list[int] = []
    while time.monotonic() < deadline:
        live = sorted(b.broker_id for b in stub.ListBrokers(pb.ListBrokersRequest(), timeout=5).brokers if b.alive)
        if live == broker_ids:
            return
        time.sleep(0.1)
    raise AssertionError(f"brokers alive {live}, expected {broker_ids} within {timeout_s}s")


def run_dmq(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([dmq_executable(), *args], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`dmq {' '.join(args)}` started instead of refusing its options")


@pytest.mark.parametrize("flush", [None, "fsync"])
@pytest.mark.parametrize("command", ["server", "broker"])
def test_flush_interval_without_interval_flushing_is_refused(tmp_path: pathlib.Path, command: str,
                                                             flush: str | None) -> None:
    args = [command, "--port", "0", "--data-dir", str(tmp_path / "data"), "--flush-interval-ms", "50"]  # refused before it binds
    if command == "broker":
        args += ["--broker-id", "0", "--coordinator", f"127.0.0.1:{free_port()}"]
    if flush is not None:
        args += ["--flush", flush]
    proc = run_dmq(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert errors == ["Error: --flush-interval-ms is only used with --flush interval (the flush policy is fsync)"], proc.stderr
    assert not (tmp_path / "data").exists()  # refused before anything started


def test_process_cluster_passes_the_flush_interval_only_to_interval_flushing() -> None:
    from dmq.client.cli.servers import _storage_argv

    assert "--flush-interval-ms" not in _storage_argv("fsync", 1000, 1024**3, -1, -1)
    argv = _storage_argv("interval", 50, 1024**3, -1, -1)
    assert argv[argv.index("--flush-interval-ms") + 1] == "50"
