"""`dmq health` includes etcd when the coordinator keeps its metadata there (issue 28 item 7): a
real etcd of its own (it is paused here), a real coordinator and broker on it (in this process,
real gRPC on loopback), and `dmq health` run as an operator runs it. etcd SIGSTOPped: health names
it down, and exits 1."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from dmq.client.cli.runner import ClusterOptions, ClusterThread
from dmq.coordinator.metastore.config import make_metadata_store
from tests.cli.conftest import run_dmq, wait_for
from tests.etcd_server import EtcdServer, running_etcd


@pytest.fixture
def etcd(tmp_path: pathlib.Path) -> Iterator[EtcdServer]:
    with running_etcd(tmp_path / "etcd") as server:  # its own: this test pauses it
        yield server


def _etcd_rows(result: object) -> list[dict]:
    return [c for c in result.json()["components"] if c["component"] == "etcd"]  # type: ignore[attr-defined]


def test_health_reports_etcd_and_an_etcd_paused_is_down(tmp_path: pathlib.Path, etcd: EtcdServer) -> None:
    store = make_metadata_store(etcd.url("health"), tmp_path / "coordinator")
    with ClusterThread(ClusterOptions(data_dir=tmp_path / "data", coordinator_kwargs={"metadata_store": store})) as cluster:
        ok = run_dmq("health", "-o", "json", bootstrap=cluster.bootstrap)
        assert ok.returncode == 0, ok
        (row,) = _etcd_rows(ok)
        assert row["address"] == etcd.endpoint and row["status"] == "up", row
        assert {c["component"] for c in ok.json()["components"]} == {"coordinator", "broker", "etcd"}

        etcd.pause()
        try:
            down = run_dmq("health", "-o", "json", bootstrap=cluster.bootstrap)
            text = run_dmq("health", bootstrap=cluster.bootstrap)
        finally:
            etcd.resume()
        assert down.returncode == 1, down
        (row,) = _etcd_rows(down)
        assert row["status"] == "down" and "no answer to a read within 1s" in row["detail"], row
        assert down.json()["healthy"] is False
        assert text.returncode == 1, text
        assert f"etcd at {etcd.endpoint} is down (no answer to a read" in text.stderr, text

        # etcd back: healthy again (a condition, waited for: the broker's session is the
        # coordinator's business, and how long the pause lasted depends on the machine's load).
        again = wait_for(lambda: (r := run_dmq("health", "-o", "json", bootstrap=cluster.bootstrap)).returncode == 0 and r,
                         "dmq health passing again after etcd resumed")
        assert _etcd_rows(again)[0]["status"] == "up"


def test_health_of_a_sqlite_coordinator_has_no_etcd(tmp_path: pathlib.Path) -> None:
    with ClusterThread(ClusterOptions(data_dir=tmp_path / "data")) as cluster:
        ok = run_dmq("health", "-o", "json", bootstrap=cluster.bootstrap)
    assert ok.returncode == 0, ok
    assert {c["component"] for c in ok.json()["components"]} == {"coordinator", "broker"}
