"""The gRPC health service on every server and `dmq health` / `dmq brokers list` exit codes.

Servers run in this process (ClusterThread, real gRPC on loopback) so a test can stop one broker
and shorten the broker session; `dmq` runs as a subprocess, as an operator would run it.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dmq.client.cli.runner import ClusterOptions, ClusterThread
from tests.cli.conftest import dmq_executable, run_dmq
from tests.processes import stop_process

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SESSION_MS = 1_000


def check(address: str, service: str = "") -> int:
    with grpc.insecure_channel(address) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status


@pytest.fixture
def cluster(tmp_path) -> Iterator[ClusterThread]:
    options = ClusterOptions(data_dir=tmp_path / "data", brokers=2, shared_port=False,
                             broker_session_timeout_ms=SESSION_MS)
    with ClusterThread(options) as c:
        yield c


def test_every_server_answers_the_health_service(tmp_path, cluster):
    assert check(cluster.bootstrap) == SERVING
    assert check(cluster.bootstrap, "dmq.v1.Metadata") == SERVING
    assert check(cluster.bootstrap, "dmq.v1.GroupCoordinator") == SERVING
    for broker in cluster.cluster.brokers:
        assert check(broker.address) == SERVING
        assert check(broker.address, "dmq.v1.Broker") == SERVING
    # The embedded server (one port for both) reports both.
    with ClusterThread(ClusterOptions(data_dir=tmp_path / "embedded")) as embedded:
        for service in ("", "dmq.v1.Metadata", "dmq.v1.Broker"):
            assert check(embedded.bootstrap, service) == SERVING


def test_health_is_not_serving_while_shutting_down(tmp_path):
    thread = ClusterThread(ClusterOptions(data_dir=tmp_path / "data")).start()
    try:
        health = thread.cluster._health[0]
        thread.call(health.shutting_down())  # the first step of stop(): the server still answers
        assert check(thread.bootstrap) == NOT_SERVING
        assert check(thread.bootstrap, "dmq.v1.Broker") == NOT_SERVING
    finally:
        thread.stop()


@pytest.fixture
def refusing_address() -> Iterator[str]:
    """A loopback address that refuses connections for the whole test: its port is bound (so no
    other process can take it) but not listened on."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{held.getsockname()[1]}"


def test_broker_waiting_for_its_coordinator_is_not_serving(tmp_path, refusing_address):
    # Port 0: the broker logs the address it bound before it registers (its `listening on`
    # line comes after the registration, which never happens here).
    log_path = tmp_path / "broker.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([dmq_executable(), "broker", "--coordinator", refusing_address, "--broker-id", "0",
                                 "--port", "0", "--data-dir", str(tmp_path / "b"), "--log-level", "info"],
                                stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 20
        address = None
        while address is None:
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text(errors="replace")[-2000:]
            found = re.search(r'"address": "([0-9.]+:[0-9]+)", "coordinator"', log_path.read_text(errors="replace"))
            if found:
                address = found.group(1)
            else:
                time.sleep(0.05)
        assert check(address, "dmq.v1.Broker") == NOT_SERVING
    finally:
        if not stop_process(proc, 15):
            pytest.fail("the broker did not stop within 15 s of SIGTERM")


def test_dmq_health_passes_then_names_the_broker_that_is_down(cluster):
    healthy = run_dmq("health", bootstrap=cluster.bootstrap)
    assert healthy.returncode == 0, healthy
    assert "coordinator" in healthy.stdout and "broker 1" in healthy.stdout

    victim = cluster.cluster.brokers[1]
    cluster.call(cluster.cluster.stop_broker(1))
    sick = run_dmq("health", bootstrap=cluster.bootstrap)
    assert sick.returncode == 1, sick
    assert f"broker 1 at {victim.address} is down" in sick.stderr, sick
    assert "broker 0" not in sick.stderr, sick
    doc = json.loads(run_dmq("health", "-o", "json", bootstrap=cluster.bootstrap).stdout)
    assert doc["healthy"] is False
    assert {(c["component"], c["broker_id"], c["status"]) for c in doc["components"]} == {
        ("coordinator", None, "up"), ("broker", 0, "up"), ("broker", 1, "down")}


def test_dmq_health_fails_when_the_coordinator_is_down(refusing_address):
    result = run_dmq("health", bootstrap=refusing_address)
    assert result.returncode == 1, result
    assert f"coordinator at {refusing_address} is down" in result.stderr, result


def test_brokers_list_exits_nonzero_once_a_broker_is_down(cluster):
    assert run_dmq("brokers", "list", bootstrap=cluster.bootstrap).returncode == 0
    victim = cluster.cluster.brokers[0]
    cluster.call(cluster.cluster.stop_broker(0))
    deadline = time.monotonic() + 10 * SESSION_MS / 1000
    while True:
        listed = run_dmq("brokers", "list", "-o", "json", bootstrap=cluster.bootstrap)
        if listed.returncode != 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert listed.returncode == 1, listed
    assert [b["alive"] for b in listed.json()["brokers"]] == [False, True]  # the listing is still printed
    assert f"broker 0 at {victim.address}" in listed.stderr, listed
