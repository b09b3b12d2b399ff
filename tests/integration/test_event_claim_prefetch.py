"""A prefetching event-group worker, over real gRPC (issue 17: claim_next + ack ≥ 1,000 cycles/s
from one worker): `claim_next(..., prefetch=N)` claims up to N partitions in one round trip, hands
them out one per call, records their riding acks locally and sends them with the next call that
reaches the broker, `commit()` or `close()`."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Iterator

import grpc
import pytest

from dmq.client import AdminClient
from dmq.client.cli.runner import ClusterOptions, ClusterThread
from dmq.client.errors import ClaimNotHeldError
from dmq.client.events import Claim, EventStore, EventType
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc

Task = EventType("task.created", ["task"])
TASKS = 10


@pytest.fixture
def store(cluster: ClusterThread) -> Iterator[EventStore]:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("tasks", 1, config={"kind": "event-store"})
    with EventStore(cluster.bootstrap, "tasks") as s:
        s.append([Task.new(b"x", task=str(i)) for i in range(TASKS)])
        s.register_group("g")
        yield s


def claim(store: EventStore, worker: str = "w1", ack: Claim | None = None, prefetch: int = 4,
          timeout_ms: int | None = None) -> Claim | None:
    return store.claim_next("g", ["task"], [Task], worker, prefetch=prefetch, claim_timeout_ms=timeout_ms,
                            ack=None if ack is None else (ack, ack.last_position))


def pending(store: EventStore) -> dict[str, int]:
    return {p.partition_key: p.pending for p in store.describe_group("g").partitions}


def test_every_partition_is_handed_out_once_and_acked_after_commit(store: EventStore) -> None:
    seen: list[str] = []
    c = claim(store)
    while c is not None:
        seen.append(c.values["task"])
        assert [e.position for e in c.events] == [int(c.values["task"]) + 1]
        c = claim(store, ack=c)
    assert sorted(seen, key=int) == [str(i) for i in range(TASKS)]
    assert len(set(seen)) == TASKS
    store.commit()
    assert set(pending(store).values()) == {0}


def test_local_acks_ride_on_the_next_round_trip(store: EventStore) -> None:
    first = claim(store)  # claims 4 partitions at once
    assert first is not None
    held = [first] + [claim(store) for _ in range(3)]
    assert all(h is not None for h in held)
    # A second worker gets none of the four while they are held
    other = {c.values["task"] for c in iter(lambda: claim(store, "w2", prefetch=0), None)}
    assert other.isdisjoint({h.values["task"] for h in held if h is not None})
    # Acks of the four are local until the next call that reaches the broker
    c = None
    for h in held:
        c = claim(store, ack=h)
    assert c is None  # the round trip carried the four acks (nothing left for w1: w2 holds the rest)
    states = pending(store)
    assert all(states[h.partition_key] == 0 for h in held if h is not None)


@pytest.mark.slow
def test_acks_only_recorded_locally_are_lost_with_a_crashed_worker(store: EventStore, cluster: ClusterThread) -> None:
    crashed = EventStore(cluster.bootstrap, "tasks")
    # 3 s: c2 is handed out from the prefetched claims (fresh for 1 s) even on a loaded machine,
    # so c1's ack stays local; a stale buffer would send it with a round trip
    c1 = claim(crashed, "crashed", timeout_ms=3000)
    assert c1 is not None
    c2 = claim(crashed, "crashed", ack=c1, timeout_ms=3000)  # c1's ack recorded locally only
    assert c2 is not None
    crashed._cluster.close()  # the process dies: no commit, no close
    time.sleep(3.3)  # the claims time out
    again = {c.values["task"] for c in iter(lambda: claim(store, "w2", prefetch=0), None)}
    assert c1.values["task"] in again and c2.values["task"] in again


def test_close_commits_and_gives_back_the_prefetched_claims(store: EventStore, cluster: ClusterThread) -> None:
    with EventStore(cluster.bootstrap, "tasks") as worker:
        c1 = claim(worker, prefetch=5)
        assert c1 is not None
        c2 = claim(worker, ack=c1, prefetch=5)
        assert c2 is not None  # handed out, not acked: its claim times out as any claim's
    states = pending(store)
    assert states[c1.partition_key] == 0
    # the three never handed out were given back: another worker claims them at once
    rest = {c.partition_key for c in iter(lambda: claim(store, "w2", prefetch=0), None)}
    assert c1.partition_key not in rest and c2.partition_key not in rest
    assert len(rest) == TASKS - 2


def test_a_stale_prefetched_claim_is_not_handed_out(store: EventStore) -> None:
    # 3 s: past a third of it (1 s) the three prefetched are stale while `first` is still held
    # for 2 s more (of 600 ms, the 300 ms left could pass before a loaded machine's ack arrived)
    first = claim(store, timeout_ms=3000)
    assert first is not None
    time.sleep(1.1)  # past a third of the timeout (measured on the same monotonic clock)
    fresh = claim(store, ack=first, timeout_ms=3000)
    assert fresh is not None
    # the stale ones were given back with that round trip and claimed again, fresh
    assert store.describe_group("g").partitions  # sanity: the group exists
    store.renew(fresh)  # held by w1, freshly claimed
    store.ack(fresh)
    assert pending(store)[first.partition_key] == 0


def test_a_refused_ack_in_the_batch_stores_the_ones_before_it_and_claims_nothing(
    tmp_path: pathlib.Path,
) -> None:
    with ClusterThread(ClusterOptions(data_dir=tmp_path / "data")) as cluster:
        refuse_one_of_two_acks(cluster)
    # a's ack (applied before the refusal) was stored durably: a restarted broker has it
    with ClusterThread(ClusterOptions(data_dir=tmp_path / "data")) as restarted, \
            EventStore(restarted.bootstrap, "tasks") as store:
        states = pending(store)
        assert states["task:0"] == 0 and states["task:1"] == 1


def refuse_one_of_two_acks(cluster: ClusterThread) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("tasks", 1, config={"kind": "event-store"})
    with EventStore(cluster.bootstrap, "tasks") as store:
        store.append([Task.new(b"x", task=str(i)) for i in range(TASKS)])
        store.register_group("g")
        a = store.claim_next("g", ["task"], [Task], "w1")
        b = store.claim_next("g", ["task"], [Task], "w1")
        assert a is not None and b is not None
        assert (a.partition_key, b.partition_key) == ("task:0", "task:1")  # earliest pending first
        store.release(b)  # b's claim is gone: its ack will be refused
        request = pb.EventClaimRequest(
            topic="tasks", group="g", partition_by=["task"], handled_types=[Task.name], worker_id="w1", max_claims=3,
            more_acks=[store._ref(a, a.last_position), store._ref(b, b.last_position)],
        )
        with grpc.insecure_channel(cluster.bootstrap) as channel, pytest.raises(grpc.RpcError) as e:
            pb_grpc.BrokerStub(channel).EventClaimNext(request, timeout=10)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert all(p.claimed_by is None for p in store.describe_group("g").partitions)  # nothing claimed
        with pytest.raises(ClaimNotHeldError):
            store.ack(b)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"max_claims": 1001}, "max_claims"),
        ({"max_claims": -1}, "max_claims"),
        ({"releases": [pb.EventClaimRef(topic="tasks", group="other", partition_key="task:1", worker_id="w1")]},
         "releases[0]"),
        ({"more_acks": [pb.EventClaimRef(topic="tasks", group="g", partition_key="task:1", worker_id="w1", position=-1)]},
         "more_acks[0].position"),
    ],
)
def test_bad_prefetch_fields_are_refused_naming_them(store: EventStore, cluster: ClusterThread,
                                                      change: dict[str, object], field: str) -> None:
    request = pb.EventClaimRequest(topic="tasks", group="g", partition_by=["task"], handled_types=[Task.name],
                                   worker_id="w1", **change)  # type: ignore[arg-type]
    with grpc.insecure_channel(cluster.bootstrap) as channel, pytest.raises(grpc.RpcError) as e:
        pb_grpc.BrokerStub(channel).EventClaimNext(request, timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (e.value.details() or "")
    # nothing changed: no partition was claimed or acknowledged
    first = store.claim_next("g", ["task"], [Task], "w1")
    assert first is not None and [e.position for e in first.events] == [1]


def test_prefetch_is_bounded(store: EventStore) -> None:
    from dmq.client.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="prefetch"):
        claim(store, prefetch=1001)
