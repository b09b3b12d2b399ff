"""AdminClient's group operations over real servers: list, describe with lag, delete, reset offsets
(every target, dry runs, refusals), operator commits, ListOffsets for many partitions, health."""

from __future__ import annotations

import functools
import socket
import time
from collections.abc import Iterator

import pytest

from dmq.client import AdminClient, Producer
from dmq.client.admin import OffsetReset
from dmq.client.cli.runner import ClusterThread
from dmq.client.consumer import DMQConsumer, TopicPartition
from dmq.client.errors import (
    GroupNotEmptyError,
    GroupNotFoundError,
    InvalidArgumentError,
    UnknownPartitionError,
)
from tests import polling
from tests.wall_clock import ms_after_acknowledged

TOPIC = "ledger"
GROUP = f"G_{TOPIC}_billing"
WAIT_S = 15.0
FAST = {"heartbeat_interval_ms": 200, "session_timeout_ms": 3000, "retry_backoff_ms": 50}


_wait_for = functools.partial(polling.wait_for, timeout_s=WAIT_S, poll_s=0.05)


def _produce(bootstrap: str, per_partition: int, partitions: int = 2, topic: str = TOPIC) -> None:
    with Producer(bootstrap, linger_ms=0) as p:
        for i in range(per_partition):
            for part in range(partitions):
                p.send(topic, b"v%d" % i, partition=part)
        p.flush(WAIT_S)


@pytest.fixture
def admin(cluster: ClusterThread) -> Iterator[AdminClient]:
    with AdminClient(cluster.bootstrap) as a:
        a.create_topic(TOPIC, 2)
        yield a


def _member_commits(bootstrap: str, offsets: dict[int, int]) -> DMQConsumer:
    """A member of GROUP that owns both partitions and has committed `offsets` (still running)."""
    consumer = DMQConsumer(bootstrap_servers=bootstrap, group_id="billing", enable_auto_commit=False, **FAST)
    consumer.subscribe(TOPIC)
    _wait_for(lambda: consumer.poll(200) is not None and len(consumer.assignment()) == 2, "the assignment")
    consumer.commit_sync({TopicPartition(TOPIC, p): o for p, o in offsets.items()})
    return consumer


def _committed(admin: AdminClient) -> list[int | None]:
    return [p.committed_offset for p in admin.describe_group(GROUP).partitions]


def test_list_describe_with_lag_and_refusals_while_members_are_active(cluster: ClusterThread,
                                                                       admin: AdminClient) -> None:
    _produce(cluster.bootstrap, 5)
    consumer = _member_commits(cluster.bootstrap, {0: 3, 1: 5})
    try:
        d = admin.describe_group(GROUP)
        assert (d.group_id, d.topic, d.state) == (GROUP, TOPIC, "STABLE")
        [member] = d.members
        assert member.partitions == (0, 1) == member.target_partitions
        assert [(p.partition, p.committed_offset, p.log_end_offset, p.lag, p.owner_member_id) for p in d.partitions] \
            == [(0, 3, 5, 2, member.member_id), (1, 5, 5, 0, member.member_id)]
        assert d.total_lag == 2
        assert d.subscription.mode == "all" and d.subscription.created_ms

        [summary] = [g for g in admin.list_groups() if g.group_id == GROUP]
        assert (summary.topic, summary.state, summary.member_count, summary.generation) == (TOPIC, "STABLE", 1,
                                                                                            d.generation)

        with pytest.raises(GroupNotEmptyError, match="1 active member"):
            admin.reset_offsets(GROUP, to="earliest", dry_run=True)
        with pytest.raises(GroupNotEmptyError, match="active member"):
            admin.delete_group(GROUP)
        with pytest.raises(GroupNotEmptyError):  # the coordinator's own rule, not only ours
            admin.commit_group_offsets(GROUP, {(TOPIC, 0): 0})
        assert _committed(admin) == [3, 5]
    finally:
        consumer.close()
    d = _wait_for(lambda: (lambda g: g if not g.members else None)(admin.describe_group(GROUP)), "the member to leave")
    assert d.state == "EMPTY" and d.total_lag == 2 and [p.owner_member_id for p in d.partitions] == [None, None]


def test_reset_offsets_to_each_target_and_dry_runs_change_nothing(cluster: ClusterThread, admin: AdminClient) -> None:
    _produce(cluster.bootstrap, 3)
    middle_ms = ms_after_acknowledged()  # later than the first three records' append ms
    _produce(cluster.bootstrap, 2)  # each partition: offsets 0..4, 3 and 4 appended after middle_ms
    _member_commits(cluster.bootstrap, {0: 2, 1: 4}).close()
    _wait_for(lambda: not admin.describe_group(GROUP).members, "the member to leave")

    dry = admin.reset_offsets(GROUP, to="earliest", dry_run=True)
    assert dry == [OffsetReset(TOPIC, 0, 2, 0, 0, 5, False), OffsetReset(TOPIC, 1, 4, 0, 0, 5, False)]
    assert [r.lag_after for r in dry] == [5, 5]
    assert _committed(admin) == [2, 4]  # a dry run commits nothing

    admin.reset_offsets(GROUP, to="earliest")
    assert _committed(admin) == [0, 0]
    assert admin.describe_group(GROUP).total_lag == 10

    admin.reset_offsets(GROUP, TOPIC, to="latest", partitions=[1])
    assert _committed(admin) == [0, 5]

    plan = admin.reset_offsets(GROUP, to="offset", value=3)
    assert [(r.new_offset, r.clamped) for r in plan] == [(3, False), (3, False)]
    assert _committed(admin) == [3, 3]
    assert [(r.new_offset, r.clamped) for r in admin.reset_offsets(GROUP, to="offset", value=99)] == [(5, True)] * 2

    shifted = admin.reset_offsets(GROUP, to="shift", value=-2, partitions=[0])
    assert [(r.partition, r.current_offset, r.new_offset) for r in shifted] == [(0, 5, 3)]
    assert _committed(admin) == [3, 5]
    assert [r.new_offset for r in admin.reset_offsets(GROUP, to="shift", value=-50, dry_run=True)] == [0, 0]

    assert [r.new_offset for r in admin.reset_offsets(GROUP, to="timestamp", value=middle_ms)] == [3, 3]
    assert _committed(admin) == [3, 3]
    assert [r.new_offset for r in admin.reset_offsets(GROUP, to="timestamp", value=0, dry_run=True)] == [0, 0]
    future_ms = int(time.time() * 1000) + 86_400_000
    assert [r.new_offset for r in admin.reset_offsets(GROUP, to="timestamp", value=future_ms, dry_run=True)] == [5, 5]
    assert _committed(admin) == [3, 3]

    # A consumer of the group starts where the reset put it.
    with DMQConsumer(bootstrap_servers=cluster.bootstrap, group_id="billing", enable_auto_commit=False,
                     **FAST) as consumer:
        consumer.subscribe(TOPIC)
        got: list[tuple[int, int]] = []
        _wait_for(lambda: got.extend((r.partition, r.offset) for r in consumer.poll(200)) or len(got) >= 4,
                  "the records after the reset")
        assert sorted(got) == [(0, 3), (0, 4), (1, 3), (1, 4)]


def test_reset_offsets_refuses_bad_requests(cluster: ClusterThread, admin: AdminClient) -> None:
    _produce(cluster.bootstrap, 1)
    _member_commits(cluster.bootstrap, {0: 1, 1: 1}).close()
    _wait_for(lambda: not admin.describe_group(GROUP).members, "the member to leave")
    with pytest.raises(InvalidArgumentError, match="to must be one of"):
        admin.reset_offsets(GROUP, to="yesterday")
    with pytest.raises(InvalidArgumentError, match="needs value"):
        admin.reset_offsets(GROUP, to="shift")
    with pytest.raises(InvalidArgumentError, match="must be >= 0"):
        admin.reset_offsets(GROUP, to="offset", value=-1)
    with pytest.raises(InvalidArgumentError, match="not used"):
        admin.reset_offsets(GROUP, to="latest", value=3)
    with pytest.raises(InvalidArgumentError, match="reads topic 'ledger', not 'other'"):
        admin.reset_offsets(GROUP, "other", to="earliest")
    with pytest.raises(UnknownPartitionError, match="no partition 2"):
        admin.reset_offsets(GROUP, to="earliest", partitions=[0, 2])
    with pytest.raises(GroupNotFoundError):
        admin.reset_offsets("G_ledger_nobody", to="earliest")
    assert _committed(admin) == [1, 1]


def test_delete_group(cluster: ClusterThread, admin: AdminClient) -> None:
    with pytest.raises(GroupNotFoundError, match="not found"):
        admin.delete_group("G_ledger_nobody")
    with pytest.raises(InvalidArgumentError, match="group_id"):
        admin.describe_group("")
    _produce(cluster.bootstrap, 2)
    _member_commits(cluster.bootstrap, {0: 2, 1: 1}).close()
    _wait_for(lambda: not admin.describe_group(GROUP).members, "the member to leave")
    admin.delete_group(GROUP)
    assert GROUP not in [g.group_id for g in admin.list_groups()]
    with pytest.raises(GroupNotFoundError):
        admin.describe_group(GROUP)
    # Its offsets went with it: the group found again starts from scratch.
    assert admin.group_id_for(TOPIC, "billing") == GROUP
    assert _committed(admin) == [None, None]


def test_operator_commits_and_offsets_of_many_partitions_over_three_brokers(cluster3: ClusterThread) -> None:
    with AdminClient(cluster3.bootstrap) as admin:
        admin.create_topic("spread", 6)
        leaders = {p.leader_id for p in admin.describe_topic("spread").partitions}
        assert len(leaders) == 3  # the partitions of one request span every broker
        with Producer(cluster3.bootstrap, linger_ms=0) as p:
            for part in range(6):
                for _ in range(part):
                    p.send("spread", b"x", partition=part)
            p.flush(WAIT_S)
        latest = admin.list_partition_offsets({("spread", part): "latest" for part in range(6)})
        assert {k: v.offset for k, v in latest.items()} == {("spread", part): part for part in range(6)}
        earliest = admin.list_partition_offsets({TopicPartition("spread", part): -2 for part in range(6)})
        assert {v.offset for v in earliest.values()} == {0}
        with pytest.raises(UnknownPartitionError):
            admin.list_partition_offsets({("spread", 0): "latest", ("spread", 9): "latest"})

        group = admin.group_id_for("spread", "etl")
        assert group == "G_spread_etl"
        admin.commit_group_offsets(group, {("spread", part): part for part in range(6)}, metadata="etl run 7")
        d = admin.describe_group(group)
        assert [p.committed_offset for p in d.partitions] == list(range(6)) and d.total_lag == 0


def test_check_health_reports_every_server_and_never_raises(cluster: ClusterThread) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        assert [(h.name, h.address, h.up, h.detail) for h in admin.check_health()] == [
            ("coordinator", cluster.bootstrap, True, "SERVING"), ("broker 0", cluster.bootstrap, True, "SERVING")]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = f"127.0.0.1:{s.getsockname()[1]}"
    with AdminClient(nobody) as admin:
        [down] = admin.check_health(timeout_s=2.0)
    assert (down.component, down.up, down.detail) == ("coordinator", False, "unreachable (nothing answers at this address)")
