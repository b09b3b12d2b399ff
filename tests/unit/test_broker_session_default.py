"""A dead broker is declared dead within 6 s by default: the coordinator's broker session, the
heartbeat interval it gives brokers and its liveness monitor all follow from one setting.
(tests/fault/test_broker_isolation.py measures it with a SIGKILLed broker process.)"""

from __future__ import annotations

import pathlib

import pytest

from dmq.client.cli.runner import ClusterOptions
from dmq.coordinator.node import CoordinatorNode


def test_defaults_declare_a_broker_dead_within_six_seconds(tmp_path: pathlib.Path) -> None:
    node = CoordinatorNode(tmp_path, advertised_address="127.0.0.1:1")
    session_ms = node.metadata.membership.broker_session_timeout_ms
    assert session_ms <= 6_000
    assert ClusterOptions(data_dir=tmp_path).broker_session_timeout_ms == session_ms
    # Several heartbeats fit in a session, so one lost heartbeat never expires a live broker.
    assert node.metadata.membership.heartbeat_interval_ms * 3 <= session_ms
    # The monitor logs an expiry within a tenth of a session of it, and within 100 ms.
    assert node.liveness_check_interval_ms <= min(session_ms // 10, 100)


@pytest.mark.parametrize("session_ms", [1_000, 3_000, 20_000])
def test_the_session_is_configurable_and_everything_follows_it(tmp_path: pathlib.Path, session_ms: int) -> None:
    node = CoordinatorNode(tmp_path, advertised_address="127.0.0.1:1", broker_session_timeout_ms=session_ms)
    assert node.metadata.membership.broker_session_timeout_ms == session_ms
    assert node.metadata.membership.heartbeat_interval_ms == session_ms // 4
    # within a tenth of the session, and at most 100 ms (a new leader is elected that soon after)
    assert node.liveness_check_interval_ms == min(session_ms // 10, 100)


def test_dmq_coordinator_takes_the_session_and_defaults_to_the_servers_default() -> None:
    from dmq.client.cli.servers import coordinator_cmd
    from dmq.coordinator.controller.sessions import DEFAULT_BROKER_SESSION_TIMEOUT_MS

    option = next(p for p in coordinator_cmd.params if p.name == "broker_session_timeout_ms")
    assert option.default == DEFAULT_BROKER_SESSION_TIMEOUT_MS
