"""Replicated event-store topics (issue 15 item 6, issue 17): three real brokers on loopback, the
test as controller (tests/integration/_replication_cluster.py), the event-store client over gRPC.

After a leader change, the new leader serves reads by tag with every acknowledged event, decides
conditional appends against them, and its consumer groups resume after their acknowledged
positions (the progress is in the replicated offsets log). A deposed leader's unacknowledged tail
leaves its index when its log is cut to the new leader's history (KIP-101)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from dmq.client.errors import AppendConditionError, DMQError
from dmq.client.events import AppendCondition, EventStore, EventType, QueryItem
from dmq.proto import dmq_pb2 as pb
from dmq.proto import error_details
from dmq.proto.event_headers import KIND_EVENT_STORE
from tests.integration._replication_cluster import ReplicationCluster, until

pytestmark = pytest.mark.timeout(60)

CourseCreated = EventType("course.created", ["course_name"])
UserJoined = EventType("user.joined_course", ["course_name", "user_id"])
ALGEBRA = [QueryItem(tags=["course_name:Algebra"])]


@pytest.fixture
async def rc(tmp_path, request) -> AsyncIterator[ReplicationCluster]:
    c = ReplicationCluster(tmp_path, ack_timeout_ms=getattr(request, "param", 5_000))
    await c.start()
    await c.create("es", [1, 2, 3], pb.TopicConfig(kind=KIND_EVENT_STORE))
    yield c
    await c.close()


def _retried(fn, what: str):  # noqa: ANN001, ANN202 - one client call
    """One call, retried while it fails retriable (leadership moving: the client re-reads the
    metadata after UNAVAILABLE but never retries an append itself). A call refused that way
    stored nothing here: the new leader is asked only once the old one is gone."""
    for _ in range(100):
        try:
            return fn()
        except DMQError as e:
            if not e.retriable:
                raise
            time.sleep(0.05)
    raise AssertionError(f"{what}: still failing after 100 attempts")


@pytest.mark.slow
async def test_a_new_leader_serves_acknowledged_events_conditions_and_group_progress(rc: ReplicationCluster):
    store = EventStore(rc.controller_address, "es")
    try:
        def before() -> tuple[int, int]:
            store.append(CourseCreated.new(b"c", course_name="Algebra"))
            head = store.read(ALGEBRA).head
            # a clean conditional append (nothing about Algebra after `head`) passes
            store.append(UserJoined.new(b"j1", course_name="Algebra", user_id="joe"),
                         AppendCondition(ALGEBRA, after=head))
            store.append(CourseCreated.new(b"h", course_name="History"))
            store.register_group("g")
            claim = store.claim_next("g", ["course_name"], [CourseCreated, UserJoined], "w1")
            assert claim is not None and claim.partition_key == "course_name:Algebra"
            assert [e.position for e in claim.events] == [1, 2]
            store.ack(claim)  # Algebra acknowledged up to 2; History (3) is still pending
            return head, store.append(UserJoined.new(b"j2", course_name="Algebra", user_id="ann"))

        first_head, last = await asyncio.to_thread(before)
        assert (first_head, last) == (1, 4)
        # every acknowledged event (and commit) is on the followers: their logs equal the leader's
        for topic in ("es", "__offsets+es"):
            leader_bytes = rc.log_bytes(1, topic)
            await until(lambda t=topic, b=leader_bytes: rc.log_bytes(2, t) == b and rc.log_bytes(3, t) == b,
                        what=f"followers have {topic}")

        # broker 1 stops; the controller elects broker 2 from the in-sync set at epoch 1
        await rc.stop_broker(1)
        await rc.push(rc.state("es", 0, 2, 1, [1, 2, 3], [2, 3], 1), [2, 3])

        def after() -> None:
            # the new leader's high watermark reaches event 4 once its follower has fetched it
            deadline = time.monotonic() + 10
            while _retried(store.head, "head") < 4:
                assert time.monotonic() < deadline, "the new leader's high watermark never reached event 4"
                time.sleep(0.02)
            assert [e.position for e in store.read(ALGEBRA)] == [1, 2, 4]
            assert [e.payload for e in store.read([QueryItem(tags=["course_name:History"])])] == [b"h"]
            # conflicts with event 2, acknowledged before the failover: refused, nothing stored
            with pytest.raises(AppendConditionError) as refused:
                store.append(CourseCreated.new(b"x", course_name="Algebra"), AppendCondition(ALGEBRA, after=1))
            assert refused.value.position == 2
            assert store.head() == 4
            # a clean one passes and lands after the acknowledged events
            assert store.append(CourseCreated.new(b"y", course_name="Geometry"),
                                AppendCondition([QueryItem(tags=["course_name:Geometry"])], after=4)) == 5
            # the group resumes after its acknowledged positions: History from 3, Algebra from 4
            assert store.group_active("g")
            history = store.claim_next("g", ["course_name"], [CourseCreated, UserJoined], "w2")
            assert history is not None and history.partition_key == "course_name:History"
            assert [e.position for e in history.events] == [3]
            algebra = store.claim_next("g", ["course_name"], [CourseCreated, UserJoined], "w2")
            assert algebra is not None and algebra.partition_key == "course_name:Algebra"
            assert [e.position for e in algebra.events] == [4]
            store.ack(algebra)

        await asyncio.to_thread(after)
        description = await asyncio.to_thread(store.describe_group, "g")
        acked = {p.partition_key: p.acked_position for p in description.partitions}
        assert acked["course_name:Algebra"] == 4 and acked["course_name:History"] == 0
    finally:
        await asyncio.to_thread(store.close)


# The deposed leader's append is refused after 2 s. The ack timeout also bounds the first append's
# replication: at 0.3 s a full run under load (load average 18) failed that append with
# NOT_ENOUGH_REPLICAS before anything was deposed.
@pytest.mark.slow
@pytest.mark.parametrize("rc", [2_000], indirect=True)
async def test_a_deposed_leaders_unacknowledged_events_leave_its_index(rc: ReplicationCluster):
    store = EventStore(rc.controller_address, "es")
    b1 = rc.brokers[1].stub
    try:
        await asyncio.to_thread(store.append, CourseCreated.new(b"a", course_name="Algebra"))
        await until(lambda: rc.log_end(2, "es") == 1 and rc.log_end(3, "es") == 1, what="followers have event 1")
        # broker 2 is elected at epoch 1 while broker 1, cut off, does not hear of it
        await rc.push(rc.state("es", 0, 2, 1, [1, 2, 3], [2, 3], 1), [2, 3])
        lost = pb.EventAppendRequest(topic="es", events=[pb.Event(type="course.created", tags=["course_name:Lost"])])
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await b1.EventAppend(lost, timeout=10)  # stored on broker 1 alone: never acknowledged
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert rc.log_end(1, "es") == 2
        appended = await asyncio.to_thread(_retried, lambda: store.append(CourseCreated.new(b"b", course_name="Biology")),
                                           "append at broker 2")
        assert appended == 2
        # broker 1 learns it follows broker 2: its index is cut with its log, then both copy event 2
        await rc.push(rc.state("es", 0, 2, 1, [1, 2, 3], [2, 3], 2), [1, 2, 3])
        await until(lambda: rc.log_bytes(1, "es") == rc.log_bytes(2, "es"), what="broker 1 has broker 2's history")
        with pytest.raises(grpc.aio.AioRpcError) as e:  # a follower serves no reads
            await b1.EventRead(pb.EventReadRequest(topic="es"), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE and "does not lead" in e.value.details()
        # broker 1 leads again (epoch 2): its reads and conditions see broker 2's event 2, never Lost
        await until(lambda: 1 in rc.controller.states[("es", 0)].isr, what="broker 1 back in the ISR")
        isr = list(rc.controller.states[("es", 0)].isr)
        await rc.push(rc.state("es", 0, 1, 2, [1, 2, 3], isr, 10), [1, 2, 3])

        def at_broker_1() -> None:
            assert [e.payload for e in _retried(store.read, "read at broker 1")] == [b"a", b"b"]
            assert store.read([QueryItem(tags=["course_name:Lost"])]).events == []
            assert store.append(CourseCreated.new(b"c", course_name="Lost"),
                                AppendCondition([QueryItem(tags=["course_name:Lost"])], after=0)) == 3

        await asyncio.to_thread(at_broker_1)
    finally:
        await asyncio.to_thread(store.close)


async def test_below_min_insync_replicas_an_append_is_refused_and_nothing_is_stored(rc: ReplicationCluster):
    b1 = rc.brokers[1].stub
    event = pb.Event(type="course.created", tags=["course_name:Algebra"])
    answer = await b1.EventAppend(pb.EventAppendRequest(topic="es", events=[event]), timeout=10)
    assert answer.last_position == 1
    # the controller shrank the in-sync set to the leader alone (min_insync_replicas is 2 with RF 3)
    await rc.push(rc.state("es", 0, 1, 0, [1, 2, 3], [1], 1), [1])
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await b1.EventAppend(pb.EventAppendRequest(topic="es", events=[event]), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_details.reason_of(e.value.trailing_metadata()) == error_details.NOT_ENOUGH_REPLICAS
    assert "min_insync_replicas is 2" in e.value.details()
    assert rc.log_end(1, "es") == 1  # nothing appended


@pytest.mark.slow
def test_with_the_coordinator_as_controller_a_stopped_leaders_store_moves_with_its_groups(tmp_path) -> None:
    from dmq.client import AdminClient
    from dmq.client.cli.runner import ClusterOptions, ClusterThread

    with ClusterThread(ClusterOptions(data_dir=tmp_path, brokers=3, replication_factor=None)) as c:
        with AdminClient(c.bootstrap) as admin:
            admin.create_topic("es", 1, config={"kind": "event-store"})  # replicated by default
            (partition,) = admin.describe_topic("es").partitions
        assert len(partition.replicas) == 3
        with EventStore(c.bootstrap, "es") as store:
            store.append([CourseCreated.new(b"", course_name="Algebra"), CourseCreated.new(b"", course_name="Art")])
            store.register_group("g")
            claim = store.claim_next("g", ["course_name"], [CourseCreated], "w")
            assert claim is not None and claim.partition_key == "course_name:Algebra"
            store.ack(claim)
            # a clean stop hands the leadership over to an in-sync replica at once
            index = next(i for i, b in enumerate(c.cluster.brokers) if b.broker_id == partition.leader_id)
            c.call(c.cluster.stop_broker(index))
            with pytest.raises(AppendConditionError):
                _retried(lambda: store.append(CourseCreated.new(b"", course_name="Algebra"),
                                              AppendCondition(ALGEBRA, after=0)), "conditional append")
            art = _retried(lambda: store.claim_next("g", ["course_name"], [CourseCreated], "w"), "claim")
            assert art is not None and art.partition_key == "course_name:Art"
            assert _retried(lambda: store.claim_next("g", ["course_name"], [CourseCreated], "w2"), "claim") is None
            assert [e.payload for e in store.read()] == [b"", b""]
