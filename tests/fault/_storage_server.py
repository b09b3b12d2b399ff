"""A real `dmq server` child for the storage fault tests, plus raw Produce / Fetch helpers.

Raw gRPC calls (not the Producer) so a test sees every status, its message and its trailing
metadata exactly as a client receives them.
"""

from __future__ import annotations

import os
import pathlib
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

import grpc

from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import error_details, records
from tests.processes import stop_process, wait_until_a_broker_is_alive

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


# What the embedded `dmq server` prints once it listens (client/cli/servers.py).
_RUNNING = re.compile(r"coordinator and broker on (\S+),")


def dmq_executable() -> list[str]:
    exe = shutil.which("dmq", path=str(pathlib.Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "dmq.client.cli"]


class Server:
    """`dmq server` in a child process; `nofile` caps its descriptors (RLIMIT_NOFILE)."""

    def __init__(self, data_dir: pathlib.Path, log_path: pathlib.Path, *, nofile: int | None = None,
                 extra: tuple[str, ...] = ()) -> None:
        # Port 0: the server binds a free port and prints it (wait_ready reads it). A port picked
        # here could be taken by another process before the child, still importing, binds it.
        self.bootstrap = ""
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._log_start = self._log.tell()  # a restart may append to an earlier server's log
        self.channel: grpc.Channel | None = None

        def limit() -> None:
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(
            [*dmq_executable(), "server", "--port", "0", "--data-dir", str(data_dir), *extra],
            stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=limit,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )

    def wait_ready(self) -> None:
        """Learn the address the server bound, then wait until its broker has registered."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.bootstrap:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dmq server exited with {self.proc.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"dmq server did not say its address: {self.log_tail()}")
            found = _RUNNING.search(self.log_path.read_bytes()[self._log_start:].decode(errors="replace"))
            if found:
                self.bootstrap = found.group(1)
                self.port = int(self.bootstrap.rsplit(":", 1)[1])
                self.channel = grpc.insecure_channel(self.bootstrap)
                self.broker = pb_grpc.BrokerStub(self.channel)
                self.metadata = pb_grpc.MetadataStub(self.channel)
            else:
                time.sleep(0.05)
        if wait_until_a_broker_is_alive(self.metadata, self.proc, deadline, self.log_tail):
            return
        raise TimeoutError(f"dmq server not ready: {self.log_tail()}")

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def log_tail(self, chars: int = 4000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.channel is not None:
            self.channel.close()
        stop_process(self.proc, STOP_TIMEOUT_S, sig)
        self._log.close()


def create_topic(srv: Server, name: str, partitions: int = 1, **config: int) -> None:
    srv.metadata.CreateTopic(
        pb.CreateTopicRequest(name=name, partitions=partitions, config=pb.TopicConfig(**config)), timeout=10
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the broker creates the logs right after the topic
        answer = srv.broker.DescribeLogs(pb.DescribeLogsRequest(
            partitions=[pb.TopicPartition(topic=name, partition=p) for p in range(partitions)]), timeout=5)
        if all(info.error == pb.NONE for info in answer.logs):
            return
        time.sleep(0.05)
    raise TimeoutError(f"topic {name} not on the broker")


def produce(srv: Server, topic: str, values: list[bytes], partition: int = 0) -> tuple[int | None, Any]:
    """(base offset, None) when acknowledged (acks=all), else (None, the grpc.RpcError)."""
    batch = records.encode(values)
    try:
        answer = srv.broker.Produce(
            pb.ProduceRequest(topic=topic, partition=partition, batch=batch, acks=pb.ACKS_ALL), timeout=10
        )
    except grpc.RpcError as e:
        return None, e
    return answer.base_offset, None


def reason(e: Any) -> str | None:
    return error_details.reason_of(e.trailing_metadata())


def fetch_all(srv: Server, topic: str, partition: int = 0, start: int = 0) -> tuple[list[tuple[int, bytes]], Any]:
    """Every record from `start` until the log end or an error: ([(offset, value)], last result)."""
    out: list[tuple[int, bytes]] = []
    offset = start
    while True:
        answer = srv.broker.Fetch(pb.FetchRequest(
            partitions=[pb.FetchPartition(topic=topic, partition=partition, offset=offset)], max_wait_ms=0
        ), timeout=10)
        (result,) = answer.partitions
        if result.error or not result.records:
            return out, result
        for b in records.decode_batches(result.records):
            for r in b:
                out.append((r.offset, r.value))
            offset = b.header.last_offset + 1
