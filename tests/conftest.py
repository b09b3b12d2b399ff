"""Shared fixtures: real coordinator and broker servers on loopback port 0, fresh data per test.

The servers run on their own event loop in a background thread (ClusterThread), so the
synchronous client library can be used from the test's thread, and async tests can also talk
to them over gRPC without sharing a loop.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterator

import pytest

from dmq.client.cli.runner import ClusterOptions, ClusterThread


@pytest.fixture
def cluster_factory(tmp_path: pathlib.Path) -> Iterator[Callable[..., ClusterThread]]:
    """Start clusters with custom options; every one started is stopped after the test."""
    started: list[ClusterThread] = []

    def make(**kwargs: object) -> ClusterThread:
        data_dir = kwargs.pop("data_dir", None) or tmp_path / f"cluster-{len(started)}"
        thread = ClusterThread(ClusterOptions(data_dir=data_dir, **kwargs))  # type: ignore[arg-type]
        thread.start()
        started.append(thread)
        return thread

    yield make
    for thread in reversed(started):
        thread.stop()


@pytest.fixture
def cluster(cluster_factory: Callable[..., ClusterThread]) -> ClusterThread:
    """The embedded shape: a coordinator and one broker sharing one port."""
    return cluster_factory()


@pytest.fixture
def cluster3(cluster_factory: Callable[..., ClusterThread]) -> ClusterThread:
    """A coordinator and three brokers, each on its own port."""
    return cluster_factory(brokers=3, shared_port=False)
