"""Issue 13: a server default subscription mode of `timestamp` is either usable or refused at start.

Before the fix `dmq server --default-subscription-mode timestamp` started, and then every consumer
that named no mode failed in FindOrCreateGroup ("subscription_mode timestamp needs
subscription_from_ms > 0"). Now the default comes with its time (`--default-subscription-from`,
CoordinatorNode(default_subscription_from_ms=...)), and without one the server refuses to start.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import time

import pytest

from dmq.client import AdminClient, Producer
from dmq.client.cli.runner import ClusterOptions, ClusterThread
from dmq.client.consumer import DMQConsumer
from dmq.client.errors import InvalidConfigError
from dmq.coordinator.node import CoordinatorNode

pytestmark = pytest.mark.processes  # left out of `make check`

WAIT_S = 15.0


def _poll_values(consumer: DMQConsumer, want: int) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < want and time.monotonic() < deadline:
        got.extend(r.value for r in consumer.poll(200))
    return got


def test_a_timestamp_default_without_a_time_is_refused_when_the_node_is_built(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="default_subscription_from_ms"):
        CoordinatorNode(tmp_path, advertised_address="127.0.0.1:1", default_subscription_mode="timestamp")


def test_a_default_time_with_another_default_mode_is_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="only used with default_subscription_mode 'timestamp'"):
        CoordinatorNode(
            tmp_path, advertised_address="127.0.0.1:1", default_subscription_mode="all",
            default_subscription_from_ms=1_700_000_000_000,
        )


def test_a_consumer_naming_no_mode_starts_at_the_server_default_time(tmp_path: pathlib.Path) -> None:
    """The server default is timestamp T: a consumer naming no mode reads from T; one naming
    `all` (another group) still reads everything. The records are written first, around T, and
    the cluster is then restarted with the default (a default fixed before the records were
    written would race with them)."""
    data_dir = tmp_path / "cluster"
    with ClusterThread(ClusterOptions(data_dir=data_dir)) as thread:
        with AdminClient(thread.bootstrap) as admin:
            admin.create_topic("t", 1)
        with Producer(thread.bootstrap, linger_ms=0) as p:
            p.send("t", b"before").get(WAIT_S)
            from_ms = time.time_ns() // 1_000_000 + 20
            while time.time_ns() // 1_000_000 <= from_ms + 5:  # the broker stamps append times
                time.sleep(0.01)
            p.send("t", b"after").get(WAIT_S)
    options = ClusterOptions(data_dir=data_dir, default_subscription_mode="timestamp",
                             coordinator_kwargs={"default_subscription_from_ms": from_ms})
    with ClusterThread(options) as thread:
        with DMQConsumer(metadata_service_url=thread.bootstrap, group_id="nomode", heartbeat_interval_ms=200) as c:
            c.subscribe("t")
            assert _poll_values(c, 1) == [b"after"]
        with DMQConsumer(metadata_service_url=thread.bootstrap, group_id="everything", subscription_mode="all",
                         heartbeat_interval_ms=200) as c:
            c.subscribe("t")
            assert _poll_values(c, 2) == [b"before", b"after"]


def test_subscription_from_zero_is_refused_by_the_consumer_config() -> None:
    """0 is "no time" on the wire, which the coordinator refuses for mode timestamp: the config
    must not accept what the server will refuse later."""
    with pytest.raises(InvalidConfigError, match="subscription_from"):
        DMQConsumer(metadata_service_url="127.0.0.1:1", group_id="g", subscription_mode="timestamp",
                    subscription_from=0)


def _dmq(tmp_path: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run `dmq server ...`; a server that starts anyway is stopped by the timeout (a failure)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dmq.client.cli", "server", "--port", "0", "--data-dir", str(tmp_path / "d"), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        out, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=10)
        pytest.fail(f"`dmq server {' '.join(args)}` started instead of refusing the setting: {err[-500:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_dmq_server_refuses_a_timestamp_default_without_a_time(tmp_path: pathlib.Path) -> None:
    result = _dmq(tmp_path, "--default-subscription-mode", "timestamp")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert len(lines) == 1 and "--default-subscription-from" in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_dmq_server_refuses_a_time_that_is_not_one(tmp_path: pathlib.Path) -> None:
    result = _dmq(tmp_path, "--default-subscription-mode", "timestamp", "--default-subscription-from", "yesterday")
    assert result.returncode == 2
    assert "--default-subscription-from" in result.stderr and "ISO 8601" in result.stderr, result.stderr
