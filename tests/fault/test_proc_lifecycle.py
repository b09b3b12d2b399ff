"""Server processes as an operator runs them: data-directory locks, signals in every state, a log
pipe that closes under the server, `dmq server --brokers N` and its children, a busy port.

Real `dmq` processes on loopback; every wait is bounded. The promise under test: SIGTERM / SIGINT
stop a server cleanly within STOP_LIMIT_S whatever state it is in, and a server refuses to start
on a data directory or port it cannot have with one line saying why.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator

import grpc
import pytest

from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from tests.cli.conftest import dmq_executable, free_port, run_dmq

STOP_LIMIT_S = 10.0
EMBEDDED_READY = "DMQ is running: coordinator and broker on "  # then the address it bound
COORDINATOR_READY = "coordinator listening on "
CLUSTER_READY = "DMQ cluster: coordinator on "  # `dmq server --brokers N`, then the address it bound
START_TIMEOUT_S = 30.0
REFUSAL_TIMEOUT_S = 15.0  # a refused start must end by itself well within this


class Server:
    """A `dmq` server subprocess with its output in a file (or a pipe the test controls)."""

    def __init__(self, args: list[str], log: pathlib.Path | None, *, pipe: bool = False) -> None:
        self.args = args
        self.log = log
        out: int | object
        if pipe:
            out = subprocess.PIPE
        else:
            assert log is not None
            self._file = open(log, "wb")  # noqa: SIM115 - closed in stop()
            out = self._file
        self.proc = subprocess.Popen([dmq_executable(), *args], stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def __repr__(self) -> str:
        return f"<Server {' '.join(self.args[:1])} pid={self.proc.pid} rc={self.proc.poll()}>"

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log is not None else ""

    def wait_for_text(self, text: str, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in self.text():
                return
            assert self.proc.poll() is None, f"exited with {self.proc.returncode}: {self.text()[-2000:]}"
            time.sleep(0.05)
        pytest.fail(f"{text!r} not printed in {timeout_s}s: {self.text()[-2000:]}")

    def bound_address(self, ready: str) -> str:
        """The address printed after `ready` once the server listens: servers here are started
        with --port 0 where they can be (a port picked by the test is bound by the child only
        after its imports, and another process can take it meanwhile)."""
        self.wait_for_text(ready)
        found = re.search(re.escape(ready) + r"([0-9.]+:[0-9]+)", self.text())
        assert found is not None, self.text()[-2000:]
        return found.group(1)

    def signal_and_wait(self, sig: signal.Signals = signal.SIGTERM, limit_s: float = STOP_LIMIT_S) -> tuple[int, float]:
        """Send sig to the server alone; (exit code, seconds taken). Fails past limit_s."""
        started = time.monotonic()
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(limit_s)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"{self.args[0]} did not stop within {limit_s}s of {sig.name}: {self.text()[-2000:]}")
        return rc, time.monotonic() - started

    def kill(self) -> None:
        """SIGKILL the whole session (children of `--brokers N` included)."""
        if self.proc.poll() is None or _session_alive(self.proc.pid):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)

    def stop(self) -> None:
        self.kill()
        if getattr(self, "_file", None) is not None:
            self._file.close()


def _session_alive(sid: int) -> bool:
    try:
        os.killpg(sid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    try:
        yield started
    finally:
        for s in started:
            s.stop()


def wait_brokers(bootstrap: str, count: int, timeout_s: float = START_TIMEOUT_S) -> list[pb.BrokerInfo]:
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(bootstrap) as channel:
        stub = pb_grpc.MetadataStub(channel)
        while time.monotonic() < deadline:
            try:
                brokers = [b for b in stub.ListBrokers(pb.ListBrokersRequest(), timeout=1.0).brokers if b.alive]
                if len(brokers) >= count:
                    return brokers
            except grpc.RpcError:
                pass
            time.sleep(0.05)
    pytest.fail(f"{count} broker(s) not registered at {bootstrap} in {timeout_s}s")


def one_line_refusal(argv: list[str]) -> str:
    """Run a server command that must refuse to start: exit 1 by itself, exactly one line on stderr."""
    try:
        done = subprocess.run([dmq_executable(), *argv], capture_output=True, text=True, timeout=REFUSAL_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"`dmq {' '.join(argv)}` started instead of refusing (still running after "
                    f"{REFUSAL_TIMEOUT_S}s); output: {(e.stderr or b'')[-1500:]!r}")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert len(lines) == 1, done.stderr[-3000:]
    return lines[0]


# -- data-directory locks ------------------------------------------------------------------------

def test_second_server_on_a_locked_data_dir_fails_at_once_naming_the_holder(tmp_path, servers):
    data = tmp_path / "data"
    first = Server(["server", "--port", "0", "--data-dir", str(data)], tmp_path / "first.log")
    servers.append(first)
    bootstrap = first.bound_address(EMBEDDED_READY)
    assert run_dmq("topics", "create", "locked", "-p", "1", bootstrap=bootstrap).returncode == 0
    assert run_dmq("produce", "locked", bootstrap=bootstrap, input="a\nb\nc\n").returncode == 0

    attempts = [
        ["server", "--port", "0", "--data-dir", str(data)],
        ["server", "--brokers", "2", "--port", "0", "--data-dir", str(data)],
        ["coordinator", "--port", "0", "--data-dir", str(data / "coordinator")],
        ["broker", "--coordinator", bootstrap, "--broker-id", "7", "--data-dir", str(data / "broker-0")],
    ]
    for argv in attempts:
        line = one_line_refusal(argv)
        assert line.startswith("Error: data directory "), line
        assert f"in use by pid {first.proc.pid}" in line and "dmq server" in line, line

    # The first server was not disturbed: its data is all there.
    consumed = run_dmq("consume", "locked", "--from-beginning", "--max-messages", "3", bootstrap=bootstrap)
    assert consumed.returncode == 0 and consumed.stdout.split() == ["a", "b", "c"], consumed
    rc, _ = first.signal_and_wait(signal.SIGTERM)
    assert rc == 0, first.text()[-2000:]
    # Released on exit: the directory can be used again at once.
    again = Server(["server", "--port", "0", "--data-dir", str(data)], tmp_path / "again.log")
    servers.append(again)
    again.wait_for_text("DMQ is running")


def _connections_accepted_while_running(argv: list[str], port: int) -> tuple[int, subprocess.CompletedProcess[str]]:
    """Run a server command that must refuse to start, trying to connect to `port` the whole time
    it runs: (connections accepted, its outcome)."""
    proc = subprocess.Popen([dmq_executable(), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    accepted = 0
    deadline = time.monotonic() + REFUSAL_TIMEOUT_S
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"`dmq {' '.join(argv)}` started instead of refusing")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                accepted += 1
    out, err = proc.communicate(timeout=REFUSAL_TIMEOUT_S)
    return accepted, subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.mark.parametrize("command", ["server", "coordinator", "broker"])
def test_a_server_refused_its_data_dir_never_listens(tmp_path, servers, command):
    """Issue 26 item 2: the directory is locked before the port is bound. The second server
    accepted connections for 35-70 ms, then exited 1 with the right message."""
    data = tmp_path / "data"
    first = Server(["server", "--port", "0", "--data-dir", str(data)], tmp_path / "first.log")
    servers.append(first)
    bootstrap = first.bound_address(EMBEDDED_READY)
    second_port = free_port()  # picked: the test watches it while the second server runs
    argv = {"server": ["server", "--data-dir", str(data)],
            "coordinator": ["coordinator", "--data-dir", str(data / "coordinator")],
            "broker": ["broker", "--coordinator", bootstrap, "--broker-id", "7",
                       "--data-dir", str(data / "broker-0")]}[command] + ["--port", str(second_port)]
    accepted, done = _connections_accepted_while_running(argv, second_port)
    assert done.returncode == 1 and "is in use by pid" in done.stderr, done
    assert accepted == 0, f"{accepted} connection(s) accepted on {second_port} before refusing: {done.stderr[-1000:]}"


# -- signals in every state ----------------------------------------------------------------------

def test_sigterm_stops_server_and_broker_normally(tmp_path, servers):
    coordinator = Server(["coordinator", "--port", "0", "--data-dir", str(tmp_path / "c")], tmp_path / "c.log")
    servers.append(coordinator)
    bootstrap = coordinator.bound_address(COORDINATOR_READY)
    broker = Server(["broker", "--coordinator", bootstrap, "--broker-id", "0", "--data-dir", str(tmp_path / "b")],
                    tmp_path / "b.log")
    servers.append(broker)
    wait_brokers(bootstrap, 1)
    rc, _ = broker.signal_and_wait(signal.SIGTERM)
    assert rc == 0 and "broker stopped" in broker.text(), broker.text()[-2000:]
    rc, _ = coordinator.signal_and_wait(signal.SIGTERM)
    assert rc == 0 and "coordinator stopped" in coordinator.text(), coordinator.text()[-2000:]

    server = Server(["server", "--port", "0", "--data-dir", str(tmp_path / "s")], tmp_path / "s.log")
    servers.append(server)
    server.wait_for_text("DMQ is running")
    rc, _ = server.signal_and_wait(signal.SIGTERM)
    assert rc == 0 and "broker stopped" in server.text(), server.text()[-2000:]


@pytest.fixture
def nowhere() -> Iterator[str]:
    """A coordinator address that refuses connections for the whole test: its port is bound (no
    other process, such as another suite's server, can take it) but not listened on."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{held.getsockname()[1]}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_broker_stops_on_signal_while_its_coordinator_is_unreachable(tmp_path, servers, sig, nowhere):
    broker = Server(["broker", "--coordinator", nowhere, "--broker-id", "0", "--data-dir", str(tmp_path / "b")],
                    tmp_path / "b.log")
    servers.append(broker)
    broker.wait_for_text("coordinator cannot register this broker yet")
    rc, took_s = broker.signal_and_wait(sig)
    assert rc == 0, broker.text()[-2000:]
    assert "broker stopped" in broker.text(), broker.text()[-2000:]
    print(f"stopped {took_s:.2f}s after {sig.name}")
    # The lock went with it.
    assert (tmp_path / "b" / "dmq.lock").read_text() == ""


@pytest.mark.parametrize("when", ["before registering", "after registering"])
def test_broker_stops_on_sigterm_while_its_coordinator_is_frozen(tmp_path, servers, when):
    """A SIGSTOPped coordinator accepts connections and never answers: every RPC hangs to its deadline."""
    coordinator = Server(["coordinator", "--port", "0", "--data-dir", str(tmp_path / "c")], tmp_path / "c.log")
    servers.append(coordinator)
    bootstrap = coordinator.bound_address(COORDINATOR_READY)
    if when == "before registering":
        coordinator.proc.send_signal(signal.SIGSTOP)
    broker = Server(["broker", "--coordinator", bootstrap, "--broker-id", "0", "--data-dir", str(tmp_path / "b")],
                    tmp_path / "b.log")
    servers.append(broker)
    if when == "after registering":
        wait_brokers(bootstrap, 1)
        coordinator.proc.send_signal(signal.SIGSTOP)
        time.sleep(1.5)  # a heartbeat is now in flight to the frozen coordinator
    else:
        broker.wait_for_text("logs found")
        time.sleep(1.0)  # the registration call is in flight
    try:
        rc, took_s = broker.signal_and_wait(signal.SIGTERM)
    finally:
        coordinator.proc.send_signal(signal.SIGCONT)
    assert rc == 0 and "broker stopped" in broker.text(), broker.text()[-2000:]
    print(f"stopped {took_s:.2f}s after SIGTERM, coordinator frozen {when}")


def test_server_stops_cleanly_when_its_log_pipe_is_closed(tmp_path, servers):
    """`dmq server 2>&1 | tee log`, Ctrl-C: tee exits first, the server's shutdown logs meet EPIPE."""
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    data = tmp_path / "data"
    server = Server(["server", "--port", str(port), "--data-dir", str(data), "--log-level", "info"], None, pipe=True)
    servers.append(server)
    wait_brokers(bootstrap, 1)
    assert run_dmq("topics", "create", "piped", "-p", "2", bootstrap=bootstrap).returncode == 0
    assert run_dmq("produce", "piped", bootstrap=bootstrap, input="x\ny\n").returncode == 0
    assert server.proc.stdout is not None
    server.proc.stdout.close()  # the reader (tee) is gone: every later write gets EPIPE
    rc, _ = server.signal_and_wait(signal.SIGINT)
    assert rc == 0, rc

    # The logs were closed cleanly: the next start opens every partition without a scan.
    again = Server(["server", "--port", str(port), "--data-dir", str(data), "--log-level", "info"], tmp_path / "again.log")
    servers.append(again)
    again.wait_for_text("DMQ is running")
    rc, _ = again.signal_and_wait(signal.SIGTERM)
    assert rc == 0
    events = [json.loads(line) for line in again.text().splitlines() if line.startswith("{")]
    opened = [e for e in events if e.get("event") == "log opened"]
    # two partitions, each with its internal offsets log (dmq.broker.offsets)
    assert len(opened) == 4 and all(e["clean"] is True for e in opened), opened
    assert sorted(e["topic"] for e in opened) == ["__offsets+piped"] * 2 + ["piped"] * 2


def test_broker_with_a_closed_log_pipe_keeps_running_and_stops_on_sigterm(tmp_path, servers, nowhere):
    """Its log lines ("coordinator cannot register this broker yet") go to a closed pipe from the first retry on."""
    broker = Server(["broker", "--coordinator", nowhere, "--broker-id", "0", "--data-dir", str(tmp_path / "b")],
                    None, pipe=True)
    servers.append(broker)
    assert broker.proc.stdout is not None
    broker.proc.stdout.readline()  # it has started logging
    broker.proc.stdout.close()
    time.sleep(1.5)  # several retries, each logged into the closed pipe
    assert broker.proc.poll() is None, f"the broker died of its closed log pipe (exit code {broker.proc.returncode})"
    rc, _ = broker.signal_and_wait(signal.SIGTERM)
    assert rc == 0


def test_server_stuck_writing_to_a_full_log_pipe_still_exits_within_the_limit(tmp_path, servers):
    """`dmq server | less` with less paused: the pipe fills and every log write blocks the loop.
    The stop cannot be clean then, but the process must still end: the watchdog armed by the
    signal exits it (code 1) before STOP_LIMIT_S."""
    read_end, write_end = os.pipe()
    port = free_port()
    try:
        proc = subprocess.Popen([dmq_executable(), "server", "--port", str(port), "--data-dir", str(tmp_path / "d"),
                                 "--log-level", "info"], stdout=write_end, stderr=write_end, start_new_session=True)
        server = Server.__new__(Server)
        server.args, server.log, server.proc = ["server"], None, proc
        servers.append(server)
        wait_brokers(f"127.0.0.1:{port}", 1)
        # A description of our own for the same pipe, so non-blocking applies to our writes only.
        filler = os.open(f"/proc/self/fd/{write_end}", os.O_WRONLY | os.O_NONBLOCK)
        try:
            for chunk in (b"x" * 4096, b"x"):  # fill the pipe to the last byte: the server's next write blocks
                try:
                    while True:
                        os.write(filler, chunk)
                except BlockingIOError:
                    pass
        finally:
            os.close(filler)
        rc, took_s = server.signal_and_wait(signal.SIGTERM)
        assert rc == 1, rc
        print(f"forced exit after {took_s:.2f}s")
    finally:
        os.close(read_end)
        os.close(write_end)


# -- dmq server --brokers N ----------------------------------------------------------------------

def _children(pid: int) -> list[int]:
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> list[str]:
    return [p.decode() for p in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if p]


STORAGE = {"--flush": "interval", "--flush-interval-ms": "250", "--segment-bytes": "4096",
           "--retention-ms": "86400000", "--retention-bytes": "10000000"}


def test_brokers_n_passes_every_storage_setting_to_its_brokers(tmp_path, servers):
    argv = ["server", "--brokers", "2", "--port", "0", "--data-dir", str(tmp_path / "data"), "--log-level", "warning"]
    for option, value in STORAGE.items():
        argv += [option, value]
    cluster = Server(argv, tmp_path / "cluster.log")
    servers.append(cluster)
    bootstrap = cluster.bound_address(CLUSTER_READY)
    wait_brokers(bootstrap, 2)

    # Every broker child got every setting...
    brokers = [pid for pid in _children(cluster.proc.pid) if "broker" in _cmdline(pid)]
    assert len(brokers) == 2, [_cmdline(p) for p in _children(cluster.proc.pid)]
    for pid in brokers:
        cmd = _cmdline(pid)
        got = {cmd[i]: cmd[i + 1] for i in range(len(cmd) - 1) if cmd[i] in STORAGE}
        assert got == STORAGE, cmd
    # ...and acts on them: 4 KiB segments roll many times under ~60 KB per partition.
    assert run_dmq("topics", "create", "rolled", "-p", "2", bootstrap=bootstrap).returncode == 0
    lines = "".join(f"{i:06d}-{'v' * 100}\n" for i in range(600))
    for partition in ("0", "1"):
        produced = run_dmq("produce", "rolled", "-p", partition, "--batch-size", "1024", bootstrap=bootstrap, input=lines)
        assert produced.returncode == 0, produced
    described = run_dmq("topics", "describe", "rolled", "-o", "json", bootstrap=bootstrap)
    assert described.returncode == 0, described
    partitions = described.json()["partitions"]
    assert {p["leader_id"] for p in partitions} == {0, 1}, partitions
    assert all(p["segment_count"] > 3 for p in partitions), partitions
    rc, _ = cluster.signal_and_wait(signal.SIGTERM, limit_s=STOP_LIMIT_S + 2)
    assert rc == 0, cluster.text()[-2000:]


def _live_children(pid: int) -> dict[int, str]:
    """pid -> role ("coordinator" / "broker") of the live (not zombie) children of `pid`."""
    out = {}
    for child in _children(pid):
        try:
            state = pathlib.Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
            role = _cmdline(child)[3]
        except (OSError, IndexError):
            continue  # exited meanwhile
        if state != "Z":
            out[child] = role
    return out


def _wait(predicate, what: str, timeout_s: float = START_TIMEOUT_S):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(0.1)


@pytest.mark.parametrize("victim", ["coordinator", "broker"])
def test_brokers_n_restarts_a_killed_member_and_keeps_serving(tmp_path, servers, victim):
    """Issue 26 item 9: one dead member stopped the whole cluster (the README's failover demo
    ended the demo). Now it is restarted, logged, and the rest keep running."""
    # A short broker session: a restarted broker registers its new address under its id once
    # the old session is over. Port 0: a restarted coordinator binds the port it got at first.
    cluster = Server(["server", "--brokers", "3", "--port", "0", "--data-dir", str(tmp_path / "data"),
                      "--log-level", "warning", "--broker-session-timeout-ms", "2000"], tmp_path / "cluster.log")
    servers.append(cluster)
    bootstrap = cluster.bound_address(CLUSTER_READY)
    wait_brokers(bootstrap, 3)
    assert run_dmq("topics", "create", "demo", "-p", "1", bootstrap=bootstrap).returncode == 0
    assert run_dmq("produce", "demo", bootstrap=bootstrap, input="a\nb\n").returncode == 0
    children = _live_children(cluster.proc.pid)
    assert sorted(children.values()) == ["broker"] * 3 + ["coordinator"], children
    target = next(pid for pid, role in children.items() if role == victim)
    os.kill(target, signal.SIGKILL)

    cluster.wait_for_text(f"(pid {target}) exited with signal SIGKILL; restarting it")
    again = _wait(lambda: (c := _live_children(cluster.proc.pid)) and len(c) == 4 and target not in c and c,
                  f"the {victim} restarted")
    assert sorted(again.values()) == sorted(children.values()), again
    assert set(children) - {target} <= set(again), "the other members were restarted too"
    wait_brokers(bootstrap, 3)
    produced = run_dmq("produce", "demo", bootstrap=bootstrap, input="c\n")
    assert produced.returncode == 0, produced
    consumed = run_dmq("consume", "demo", "--from-beginning", "--max-messages", "3", bootstrap=bootstrap)
    assert consumed.returncode == 0 and consumed.stdout.split() == ["a", "b", "c"], consumed
    assert cluster.proc.poll() is None, cluster.text()[-2000:]
    # Ctrl-C still stops everything.
    rc, _ = cluster.signal_and_wait(signal.SIGINT, limit_s=STOP_LIMIT_S + 2)
    assert rc == 0, cluster.text()[-2000:]
    assert not _session_alive(cluster.proc.pid), "children left running"


# -- a busy port ----------------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["server", "server --brokers 2", "coordinator", "broker"])
def test_busy_port_is_one_line(tmp_path, command):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        argv = command.split() + ["--port", str(port)]
        if command == "broker":
            argv += ["--coordinator", f"127.0.0.1:{free_port()}", "--broker-id", "0", "--data-dir", str(tmp_path / "b")]
        else:
            argv += ["--data-dir", str(tmp_path / "d")]
        line = one_line_refusal(argv)
    assert line == f"Error: cannot listen on 127.0.0.1:{port}: the port is in use by another process (choose another with --port)"
