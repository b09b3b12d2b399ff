"""`dmq topics create --replication-factor`, `topics describe` (replicas, in-sync set, epoch),
`brokers list` (followed / under-replicated) and `topics reassign`, run as the real `dmq` command
against an in-process cluster of a coordinator and three brokers."""

from __future__ import annotations

import pathlib
import re
from collections.abc import Callable
from typing import Any

import pytest

from dmq.client.cli.runner import ClusterThread
from tests.cli.conftest import Result, ServerProcess, run_dmq, wait_for


@pytest.fixture
def dmq3(cluster_factory: Callable[..., ClusterThread]) -> Callable[..., Result]:
    cluster = cluster_factory(brokers=3, shared_port=False, replication_factor=None)

    def run(*args: str) -> Result:
        return run_dmq(*args, bootstrap=cluster.bootstrap)

    return run


def test_replicated_topic_describe_brokers_and_reassign(dmq3: Callable[..., Result]) -> None:
    created = dmq3("topics", "create", "rep", "-p", "2", "--replication-factor", "3", "--min-insync-replicas", "2",
                   "-o", "json")
    assert created.returncode == 0, created
    doc = created.json()
    assert (doc["config"]["replication_factor"], doc["config"]["min_insync_replicas"]) == (3, 2)
    assert doc["config"]["unclean_leader_election"] is False
    for p in doc["partitions"]:
        assert sorted(p["replicas"]) == [0, 1, 2] and p["isr"] == p["replicas"] and p["leader_epoch"] == 0
        assert p["leader_id"] == p["replicas"][0] and p["under_replicated"] is False

    human = dmq3("topics", "describe", "rep")
    assert human.returncode == 0, human
    assert re.search(r"REPLICAS\s+IN SYNC\s+EPOCH", human.stdout), human
    assert re.search(r"^\s*0\s+\d \(127\.0\.0\.1:\d+\).*\b\d,\d,\d\s+\d,\d,\d\s+0\b", human.stdout, re.M), human
    assert re.search(r"replication_factor\s+3\b", human.stdout), human

    brokers = dmq3("brokers", "list", "-o", "json").json()["brokers"]
    assert [(b["partitions_led"] + b["partitions_followed"]) for b in brokers] == [2, 2, 2]
    assert all(b["partitions_under_replicated"] == 0 and b["rack"] is None for b in brokers)

    moved = dmq3("topics", "reassign", "rep", "--partition", "0", "--replicas", "1,2", "--timeout", "20", "-o", "json")
    assert moved.returncode == 0, moved
    result = moved.json()
    assert result["replicas"] == [1, 2] and result["completed"] is True and result["leader_id"] in (1, 2)
    after = dmq3("topics", "describe", "rep", "-o", "json").json()["partitions"][0]
    assert after["replicas"] == [1, 2] and 0 not in after["isr"]
    human = dmq3("topics", "reassign", "rep", "--partition", "0", "--replicas", "1,2")
    assert human.returncode == 0 and "replicas 1,2" in human.stdout, human


REFUSALS = [
    (("topics", "create", "big", "--replication-factor", "4"), 1, "4 replicas need 4 live brokers, there are 3"),
    (("topics", "create", "odd", "--replication-factor", "2", "--min-insync-replicas", "3"), 1,
     "min_insync_replicas: must be at most replication_factor (2)"),
    (("topics", "reassign", "r", "--partition", "0", "--replicas", "0,0"), 1, "brokers [0] are named twice"),
    (("topics", "reassign", "r", "--partition", "0", "--replicas", "0,9"), 1, "brokers [9] are not live brokers"),
    (("topics", "reassign", "r", "--partition", "0", "--replicas", "a,b"), 2, "comma-separated list of broker ids"),
    (("topics", "reassign", "r", "--partition", "5", "--replicas", "0"), 1, "partition"),
]


def test_refusals_are_one_clear_line(dmq3: Callable[..., Result]) -> None:
    assert dmq3("topics", "create", "r", "-p", "1").returncode == 0
    for args, code, fragment in REFUSALS:
        result = dmq3(*args)
        assert result.returncode == code, result
        assert fragment in result.stderr, result


def test_dmq_server_with_three_brokers_replicates_by_default(tmp_path: pathlib.Path) -> None:
    srv = ServerProcess(tmp_path / "data", tmp_path / "server.log", ("--brokers", "3"))
    try:
        srv.wait_ready()
        # created as soon as the command can (it retries while the brokers are still registering)
        created = run_dmq("topics", "create", "by-default", "-p", "2", "-o", "json", bootstrap=srv.bootstrap)
        assert created.returncode == 0, (created, srv.log_tail())
        doc = created.json()
        assert (doc["config"]["replication_factor"], doc["config"]["min_insync_replicas"]) == (3, 2)
        assert all(sorted(p["replicas"]) == [0, 1, 2] for p in doc["partitions"])
    finally:
        srv.stop()


def test_reassign_elects_the_first_listed_replica(cluster_factory: Callable[..., ClusterThread]) -> None:
    # The periodic preferred-leader check (every 5 s by default) would move the leader on its own;
    # an hour keeps it out of the way, so what is seen here is the reassignment's own election.
    cluster = cluster_factory(brokers=3, shared_port=False, replication_factor=None,
                              coordinator_kwargs={"preferred_leader_check_interval_ms": 3_600_000})

    def dmq(*args: str, input: str | None = None) -> Result:
        return run_dmq(*args, bootstrap=cluster.bootstrap, input=input)

    def partition0() -> dict[str, Any]:
        described = dmq("topics", "describe", "payments", "-o", "json")
        assert described.returncode == 0, described
        return described.json()["partitions"][0]  # type: ignore[no-any-return]

    created = dmq("topics", "create", "payments", "-p", "1", "--replication-factor", "3", "-o", "json")
    assert created.returncode == 0, created
    before = created.json()["partitions"][0]
    assert (before["replicas"], before["leader_id"]) == ([0, 1, 2], 0), before
    first = [f"before-{i}" for i in range(20)]
    produced = dmq("produce", "payments", input="\n".join(first) + "\n")
    assert produced.returncode == 0, produced

    moved = dmq("topics", "reassign", "payments", "--partition", "0", "--replicas", "1,2,0", "--timeout", "20",
                "-o", "json")
    assert moved.returncode == 0, moved
    assert moved.json()["replicas"] == [1, 2, 0] and moved.json()["completed"] is True, moved
    # every replica was in sync, so broker 1 (the first listed) leads, at the next leader epoch: the
    # command's answer says so, and describe shows it (pushed to the brokers as any election)
    assert moved.json()["leader_id"] == 1, moved
    after = wait_for(lambda: (p := partition0())["leader_id"] == 1 and p, "broker 1 to lead payments-0")
    assert after["replicas"] == [1, 2, 0] and after["leader_epoch"] == before["leader_epoch"] + 1, after
    human = dmq("topics", "describe", "payments")
    assert re.search(r"^\s*0\s+1 \(127\.0\.0\.1:\d+\)", human.stdout, re.M), human

    then = [f"after-{i}" for i in range(10)]
    produced = dmq("produce", "payments", input="\n".join(then) + "\n")
    assert produced.returncode == 0, produced
    consumed = dmq("consume", "payments", "--from-beginning", "-n", str(len(first) + len(then)), "--timeout-ms", "20000")
    assert consumed.returncode == 0, consumed
    assert consumed.stdout.splitlines() == first + then, consumed
