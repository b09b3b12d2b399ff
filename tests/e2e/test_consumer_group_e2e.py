"""Consumer groups end to end: real consumer and producer PROCESSES against a real server.

The server runs in this process (`cluster_factory`, short rebalance debounce); every consumer is
`consumer_proc.py` in its own interpreter, reporting what it consumed, committed and was assigned
as JSON lines (see `_procs.py`). The producer (`producer_proc.py`) sends value i to partition
i % 6, so each record's value tells where it must be: offset i // 6 of partition i % 6.

Settings are shortened so the whole module runs in well under two minutes:
session_timeout_ms 3000, heartbeat 300 ms, debounce 200 ms.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from _procs import ConsumerProc, ProducerProc

from dmq.client.cli.runner import ClusterThread
from dmq.client.consumer import DMQConsumer, TopicPartition

pytestmark = pytest.mark.slow

TOPIC = "events"
PARTITIONS = 6
SESSION_TIMEOUT_MS = 3000
SETTINGS = {"session_timeout_ms": SESSION_TIMEOUT_MS, "heartbeat_interval_ms": 300, "fetch_max_wait_ms": 200,
            "retry_backoff_ms": 50, "auto_commit_interval_ms": 200}
START_S = 30.0  # a child process importing grpc on a loaded 2-core machine
RUN_S = 60.0


@pytest.fixture
def server(cluster_factory: Callable[..., ClusterThread]) -> ClusterThread:
    return cluster_factory(rebalance_debounce_ms=200, topics={TOPIC: PARTITIONS})


@pytest.fixture
def procs() -> Iterator[list]:
    started: list = []
    yield started
    for p in started:
        p.kill()


def spawn(procs: list, server: ClusterThread, name: str, group: str = "app", commit: str = "auto",
          **settings: object) -> ConsumerProc:
    c = ConsumerProc(name, server.bootstrap, TOPIC, group, commit=commit, config={**SETTINGS, **settings})
    procs.append(c)
    return c


def produce(procs: list, server: ClusterThread, count: int, rate: float, start: int = 0) -> ProducerProc:
    p = ProducerProc(server.bootstrap, TOPIC, PARTITIONS, count, rate, start)
    procs.append(p)
    return p


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


def check_values(records: list[tuple[int, int, str]]) -> None:
    for partition, offset, value in records:
        assert int(value) == offset * PARTITIONS + partition, (partition, offset, value)


def committed(server: ClusterThread, group: str = "app") -> dict[int, int | None]:
    with DMQConsumer(metadata_service_url=server.bootstrap, group_id=group) as c:
        found = c.committed([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
    assert isinstance(found, dict)
    return {tp.partition: (None if o is None else o.offset) for tp, o in found.items()}


def balanced(consumers: list[ConsumerProc]) -> bool:
    owned = [c.owned() for c in consumers]
    return all(len(o) == PARTITIONS // len(consumers) for o in owned) and len(set().union(*owned)) == PARTITIONS


def test_killed_member_is_replaced_within_the_session_timeout_and_nothing_is_lost(
    server: ClusterThread, procs: list
) -> None:
    total = 6000
    consumers = [spawn(procs, server, f"c{i}", commit="sync") for i in range(3)]
    for c in consumers:
        c.wait_for(lambda e: e["ev"] == "ready", START_S, "ready")
    wait_until(lambda: balanced(consumers), RUN_S, "three members with two partitions each")
    producer = produce(procs, server, total, rate=2000)
    victim, survivors = consumers[0], consumers[1:]
    victim.wait_for(lambda e: e["ev"] == "commit", RUN_S, "a first commit by the victim")
    victim_partitions = victim.owned()
    pause_watch = server.cluster.coordinator.groups.pause_watch
    pauses_before = pause_watch.pauses
    victim.kill()  # SIGKILL: no leave, no final commit
    killed_at = time.time()

    def taken_over() -> bool:
        return victim_partitions <= set().union(*(c.owned() for c in survivors))

    wait_until(taken_over, SESSION_TIMEOUT_MS / 1000 + 10, "the survivors to own the victim's partitions")
    reowned_at = max(
        e["t"] for c in survivors for e in c.of("assigned") if set(e["partitions"]) & victim_partitions
    )
    # The coordinator runs in this process: when its event loop stalls past its pause watch's
    # threshold, the sessions that could have expired meanwhile restart, by design (issue 28: time
    # it did not run is not counted against members), so each pause seen adds one session to the
    # bound (a full run under xdist load: "coordinator was not running ... paused_ms=2437" 2.2 s
    # after the kill, re-owned after 6.10 s).
    pauses = pause_watch.pauses - pauses_before
    print(f"victim's partitions {sorted(victim_partitions)} re-owned {reowned_at - killed_at:.2f}s after SIGKILL"
          f" ({pauses} coordinator pauses)")
    bound_s = (1 + pauses) * SESSION_TIMEOUT_MS / 1000 + 1.0
    assert reowned_at - killed_at <= bound_s, f"re-owned after {reowned_at - killed_at:.2f}s, {pauses} pauses"

    producer.wait_for(lambda e: e["ev"] == "done", RUN_S, "the producer to finish")

    def everything() -> set[int]:
        return {int(v) for c in consumers for _, _, v in c.consumed()}

    wait_until(lambda: len(everything()) == total, RUN_S, "every message consumed")
    for c in survivors:
        c.stop()
    assert everything() == set(range(total)), "nothing lost"
    for c in consumers:
        check_values(c.consumed())

    # The survivors started each of the victim's partitions at its last commit: never before
    # what it committed (no regression), never after what it had consumed (no gap).
    last_commit = {p: 0 for p in victim_partitions}
    for e in victim.of("commit"):
        for p, o in e["offsets"].items():
            last_commit[int(p)] = o
    consumed_by_victim = Counter(p for p, _, _ in victim.consumed())
    for p in victim_partitions:
        victim_max = max((o for q, o, _ in victim.consumed() if q == p), default=-1)
        first = min(o for c in survivors for q, o, _ in c.consumed() if q == p)
        assert last_commit[p] <= first <= victim_max + 1, (p, last_commit[p], first, victim_max)
    # Duplicates are only the victim's uncommitted tail; elsewhere every record came once.
    seen = Counter((p, o) for c in consumers for p, o, _ in c.consumed())
    for (p, o), n in seen.items():
        if n > 1:
            assert p in victim_partitions and o >= last_commit[p], (p, o, n)
    assert consumed_by_victim, "the victim consumed before it died"
    assert committed(server) == {p: total // PARTITIONS for p in range(PARTITIONS)}, "everything committed"


def test_joins_closes_and_restarts_deliver_each_record_once(server: ClusterThread, procs: list) -> None:
    first_run = 6000
    c1, c2 = spawn(procs, server, "c1"), spawn(procs, server, "c2")
    for c in (c1, c2):
        c.wait_for(lambda e: e["ev"] == "ready", START_S, "ready")
    wait_until(lambda: balanced([c1, c2]), RUN_S, "two balanced members")
    producer = produce(procs, server, first_run, rate=1500)
    c1.wait_for(lambda e: e["ev"] == "records", RUN_S, "c1 consuming")

    c3 = spawn(procs, server, "c3")  # a member joins while records flow
    # Its share, not records: on a loaded machine the 4 s of producing may be over, and c1 and c2
    # done with c3's partitions, by the time a new process has joined (a full run under load
    # failed 'no c3 consuming within 60 s' after c3 was assigned [0, 1]).
    c3.wait_for(lambda e: e["ev"] == "assigned" and bool(e["partitions"]), RUN_S, "c3 assigned partitions")
    c1.send("close")  # a member leaves while records flow
    c1.wait_for(lambda e: e["ev"] == "closed", RUN_S, "c1 closed")
    assert c1.popen.wait(10) == 0
    wait_until(lambda: balanced([c2, c3]), RUN_S, "c2 and c3 sharing the partitions")
    producer.wait_for(lambda e: e["ev"] == "done", RUN_S, "the producer to finish")
    group = [c1, c2, c3]

    def consumed() -> list[tuple[int, int]]:
        return [(p, o) for c in group for p, o, _ in c.consumed()]

    wait_until(lambda: len(set(consumed())) == first_run, RUN_S, "every message consumed")
    for c in (c2, c3):
        c.stop()
    assert len(consumed()) == first_run, f"duplicates: {[k for k, n in Counter(consumed()).items() if n > 1][:10]}"
    assert committed(server) == {p: first_run // PARTITIONS for p in range(PARTITIONS)}

    # Restart the whole group; alongside, two brand-new groups show the subscription modes.
    restarted = [spawn(procs, server, f"r{i}") for i in range(3)]
    fresh_new = spawn(procs, server, "fresh-new", group="fresh-new", subscription_mode="new")
    fresh_all = spawn(procs, server, "fresh-all", group="fresh-all", subscription_mode="all")
    for c in [*restarted, fresh_new, fresh_all]:
        c.wait_for(lambda e: e["ev"] == "ready", START_S, "ready")
    second_run = 600
    produce(procs, server, second_run, rate=3000, start=first_run).wait_for(
        lambda e: e["ev"] == "done", RUN_S, "the second producer to finish")
    later = set(range(first_run, first_run + second_run))
    wait_until(lambda: {int(v) for c in restarted for _, _, v in c.consumed()} >= later, RUN_S, "the new records")
    wait_until(lambda: len(fresh_all.consumed()) >= first_run + second_run, RUN_S, "fresh-all reading everything")
    wait_until(lambda: len(fresh_new.consumed()) >= second_run, RUN_S, "fresh-new reading the new records")
    time.sleep(0.5)  # anything extra (a replay) would arrive now
    for c in [*restarted, fresh_new, fresh_all]:
        c.stop()
    resumed = [int(v) for c in restarted for _, _, v in c.consumed()]
    assert sorted(resumed) == sorted(later), "the restarted group resumed exactly at its commits"
    assert sorted(int(v) for _, _, v in fresh_new.consumed()) == sorted(later), "mode new: only what came after"
    assert sorted(int(v) for _, _, v in fresh_all.consumed()) == list(range(first_run + second_run)), "mode all"


def test_a_member_that_stops_polling_loses_its_partitions_then_fails_to_commit(
    server: ClusterThread, procs: list
) -> None:
    max_poll_interval_ms = 2000
    slow = spawn(procs, server, "slow", commit="sync", max_poll_interval_ms=max_poll_interval_ms)
    busy = spawn(procs, server, "busy", commit="sync")
    for c in (slow, busy):
        c.wait_for(lambda e: e["ev"] == "ready", START_S, "ready")
    wait_until(lambda: balanced([slow, busy]), RUN_S, "two balanced members")
    produce(procs, server, 600, rate=3000).wait_for(lambda e: e["ev"] == "done", RUN_S, "producer")
    slow.wait_for(lambda e: e["ev"] == "commit", RUN_S, "slow committing")
    slow.send("stall 4")
    stalled_at = time.time()
    busy.wait_for(lambda e: e["ev"] == "assigned" and e["t"] > stalled_at, RUN_S, "busy taking over")
    wait_until(lambda: len(busy.owned()) == PARTITIONS, RUN_S, "busy owning everything")
    took_s = max(e["t"] for e in busy.of("assigned")) - stalled_at
    print(f"partitions of the stalled member moved {took_s:.2f}s after its last poll()")
    assert took_s <= max_poll_interval_ms / 1000 + 1.5, f"partitions moved after {took_s:.2f}s"
    failed = slow.wait_for(lambda e: e["ev"] in ("commit_failed", "commit_ok"), RUN_S, "the stalled commit")
    assert failed["ev"] == "commit_failed" and failed["type"] == "CommitFailedError"
    assert "max_poll_interval_ms" in failed["error"] and "max_poll_records" in failed["error"]
    slow.wait_for(lambda e: e["ev"] == "lost", RUN_S, "the partitions reported lost")
    wait_until(lambda: balanced([slow, busy]), RUN_S, "the slow member back in the group")
    for c in (slow, busy):
        c.stop()
