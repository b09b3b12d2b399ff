"""Client calls keep their deadlines when nothing listens at the coordinator's address any more
(it was there when the consumer was made: a wrong address from the start fails the constructor,
see test_wrong_address.py): subscribe() and poll(timeout) return in time, and metadata look-ups
fail fast with an error naming the address they tried."""

from __future__ import annotations

import pathlib
import socket
import time

import pytest

from dmq.client._cluster import Cluster
from dmq.client.cli.runner import ClusterOptions, ClusterThread
from dmq.client.consumer import DMQConsumer
from dmq.client.errors import CoordinatorUnavailableError

POLL_SLACK_S = 0.1


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gone_coordinator_consumer(data_dir: pathlib.Path) -> DMQConsumer:
    """A consumer made while its coordinator ran, which then stopped (its port now refuses)."""
    with ClusterThread(ClusterOptions(data_dir=data_dir)) as cluster:
        return DMQConsumer(metadata_service_url=cluster.bootstrap, group_id="g")


def test_poll_keeps_its_timeout_with_a_wrong_coordinator_port(tmp_path: pathlib.Path) -> None:
    consumer = gone_coordinator_consumer(tmp_path)
    try:
        started = time.monotonic()
        consumer.subscribe("t")
        subscribe_s = time.monotonic() - started
        started = time.monotonic()
        records = consumer.poll(2000)
        poll_s = time.monotonic() - started
    finally:
        started = time.monotonic()
        consumer.close(timeout=2.0)
        close_s = time.monotonic() - started
    assert subscribe_s <= 2.0 + POLL_SLACK_S, f"subscribe() took {subscribe_s:.1f}s"
    assert not records
    assert 2.0 <= poll_s <= 2.0 + POLL_SLACK_S, f"poll(2.0) took {poll_s:.2f}s"
    assert close_s <= 2.5, f"close(timeout=2.0) took {close_s:.2f}s"


def test_poll_zero_returns_at_once_with_a_wrong_coordinator_port(tmp_path: pathlib.Path) -> None:
    consumer = gone_coordinator_consumer(tmp_path)
    try:
        consumer.subscribe("t")
        for _ in range(5):
            started = time.monotonic()
            consumer.poll(0)
            assert time.monotonic() - started <= POLL_SLACK_S
    finally:
        consumer.close(timeout=1.0)


def test_metadata_lookup_fails_fast_naming_the_address() -> None:
    address = f"127.0.0.1:{closed_port()}"
    with Cluster(address) as cluster:
        started = time.monotonic()
        with pytest.raises(CoordinatorUnavailableError, match=address.replace(".", r"\.")):
            cluster.refresh(["t"])
        assert time.monotonic() - started <= 2.0
        # A second look-up while the first one's failure is fresh is as fast.
        started = time.monotonic()
        with pytest.raises(CoordinatorUnavailableError, match="coordinator at"):
            cluster.topic_metadata("t")
        assert time.monotonic() - started <= 2.0


def test_metadata_lookup_waits_no_longer_than_asked() -> None:
    # A listening socket that never answers (no gRPC server accepts the HTTP/2 handshake).
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        with Cluster(address) as cluster:
            started = time.monotonic()
            with pytest.raises(Exception, match=address.replace(".", r"\.")):
                cluster.refresh(["t"], timeout_s=0.5)
            assert time.monotonic() - started <= 0.5 + POLL_SLACK_S
