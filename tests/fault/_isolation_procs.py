"""Real `dmq coordinator` and `dmq broker` processes for the broker-failure tests, and a raw
producer that writes to each partition on its own (so one dead broker cannot slow the others:
the test measures the consumer, not the producer).

Every process is killed (after SIGCONT, in case it was stopped) when the ProcCluster closes.
"""

from __future__ import annotations

import contextlib
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict

import grpc

from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import records

START_TIMEOUT_S = 30.0  # a child importing grpc on a loaded 2-core machine


class ProcCluster:
    """A coordinator and N brokers, each its own `python -m dmq.client.cli` process."""

    def __init__(
        self,
        root: pathlib.Path,
        brokers: int,
        *,
        coordinator_port: int | None = None,
        broker_session_timeout_ms: int | None = None,
        broker_args: list[str] | None = None,
        coordinator_args: list[str] | None = None,
    ) -> None:
        self.root = root
        self.broker_session_timeout_ms = broker_session_timeout_ms
        self.broker_args = broker_args or []
        self.coordinator_args = coordinator_args or []
        # 0: the coordinator binds a free port and says which (a port picked here could be taken
        # by another process before the child binds it); restarts reuse the port it got.
        self.port = coordinator_port or 0
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.coordinator: subprocess.Popen[bytes] | None = None
        self.brokers: dict[int, subprocess.Popen[bytes]] = {}
        self.broker_addresses: dict[int, str] = {}
        self._logs: list[object] = []
        try:
            self.start_coordinator()
            for i in range(brokers):
                self.start_broker(i)
        except BaseException:
            self.close()
            raise

    def __repr__(self) -> str:
        return f"<ProcCluster {self.bootstrap} brokers={sorted(self.brokers)}>"

    def _spawn(self, name: str, args: list[str], ready: str) -> tuple[subprocess.Popen[bytes], str]:
        log_path = self.root / f"{name}.log"
        log = open(log_path, "ab")  # noqa: SIM115 - closed in close()
        self._logs.append(log)
        offset = log_path.stat().st_size
        proc = subprocess.Popen([sys.executable, "-m", "dmq.client.cli", *args], stdout=log, stderr=log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            text = log_path.read_bytes()[offset:].decode(errors="replace")
            for line in text.splitlines():
                if ready in line:
                    return proc, line.rsplit(" ", 1)[-1].strip()
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        proc.kill()
        raise AssertionError(f"{name} did not start: {log_path.read_bytes()[offset:].decode(errors='replace')[-2000:]}")

    def start_coordinator(self) -> None:
        self.coordinator, address = self._spawn(
            "coordinator",
            ["coordinator", "--port", str(self.port), "--data-dir", str(self.root / "coordinator"), "--log-level", "warning",
             *(["--broker-session-timeout-ms", str(self.broker_session_timeout_ms)]
               if self.broker_session_timeout_ms else []), *self.coordinator_args],
            "coordinator listening on",
        )
        self.bootstrap = address
        self.port = int(address.rsplit(":", 1)[1])

    def start_broker(self, i: int) -> None:
        old = self.brokers.get(i)
        if old is not None:  # a restart: reap the previous process (killed or stopped by the test)
            if old.poll() is None:
                old.kill()
            old.wait(10)
        proc, address = self._spawn(
            f"broker{i}",
            ["broker", "--coordinator", self.bootstrap, "--broker-id", str(i), "--data-dir", str(self.root / f"b{i}"),
             "--log-level", "warning", *self.broker_args],
            f"broker {i} listening on",
        )
        self.brokers[i] = proc
        self.broker_addresses[i] = address

    def signal_broker(self, i: int, sig: signal.Signals) -> None:
        self.brokers[i].send_signal(sig)

    def kill_coordinator(self) -> None:
        assert self.coordinator is not None
        self.coordinator.kill()
        self.coordinator.wait(10)

    def close(self) -> None:
        procs = [p for p in [self.coordinator, *self.brokers.values()] if p is not None]
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGCONT)
                    p.kill()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        for log in self._logs:
            log.close()  # type: ignore[attr-defined]

    def __enter__(self) -> ProcCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CliReader:
    """`dmq consume TOPIC [--group APP] --print-offset` in its own process; arrival times of the
    printed records per partition."""

    def __init__(self, bootstrap: str, topic: str, app: str | None) -> None:
        self.arrivals: dict[int, list[float]] = defaultdict(list)
        group = ["--group", app] if app else []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dmq.client.cli", "--bootstrap", bootstrap, "consume", topic, *group,
             "--from-beginning", "--print-offset"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self._thread = threading.Thread(target=self._read, name="cli-reader", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.arrivals[int(line.split(":", 1)[0])].append(time.monotonic())

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        self._thread.join(5)
        return err


class PartitionWriter:
    """One thread per partition producing a small record every `interval_s` straight to the
    partition's broker with a short deadline; failures (a dead broker) are counted, not retried."""

    def __init__(self, topic: str, leaders: dict[int, str], interval_s: float = 0.05) -> None:
        self.topic = topic
        self.interval_s = interval_s
        self.sent = dict.fromkeys(leaders, 0)
        self.failed = dict.fromkeys(leaders, 0)
        self._stop = threading.Event()
        self._channels = {p: grpc.insecure_channel(a) for p, a in leaders.items()}
        self._threads = [
            threading.Thread(target=self._run, args=(p,), name=f"writer-{p}", daemon=True) for p in leaders
        ]
        for t in self._threads:
            t.start()

    def _run(self, partition: int) -> None:
        stub = pb_grpc.BrokerStub(self._channels[partition])
        n = 0
        while not self._stop.is_set():
            batch = records.encode([f"{partition}-{n}".encode()])
            try:
                stub.Produce(pb.ProduceRequest(topic=self.topic, partition=partition, batch=batch,
                                               acks=pb.ACKS_LEADER), timeout=1.0)
                self.sent[partition] += 1
                n += 1
            except grpc.RpcError:
                self.failed[partition] += 1
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)
        for ch in self._channels.values():
            ch.close()
