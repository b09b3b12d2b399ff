"""Event-store topics over real gRPC: the topic kind, append / read / conditional append (DCB),
subscribe, the index surviving a restart and being rebuilt from the log, and bad requests."""

from __future__ import annotations

import os
import pathlib
import threading
from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmq.client import AdminClient
from dmq.client.cli.runner import ClusterOptions, ClusterThread
from dmq.client.errors import (
    AppendConditionError,
    FailedPreconditionError,
    InvalidArgumentError,
    InvalidConfigError,
    ResourceExhaustedError,
)
from dmq.client.events import AppendCondition, Event, EventStore, QueryItem
from dmq.client.producer import Producer
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc


def make_store(cluster: ClusterThread, topic: str = "es") -> EventStore:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic(topic, 1, config={"kind": "event-store"})
    return EventStore(cluster.bootstrap, topic)


@pytest.fixture
def store(cluster: ClusterThread) -> Iterator[EventStore]:
    s = make_store(cluster)
    yield s
    s.close()


def test_event_store_topic_is_one_partition_kept_forever(cluster: ClusterThread) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        with pytest.raises(InvalidArgumentError, match="exactly 1 partition"):
            admin.create_topic("es3", 3, config={"kind": "event-store"})
        with pytest.raises(InvalidArgumentError, match="retention_ms"):
            admin.create_topic("es-ret", 1, config={"kind": "event-store", "retention_ms": 1000})
        with pytest.raises((InvalidArgumentError, InvalidConfigError), match="kind"):
            admin.create_topic("es-bad", 1, config={"kind": "queue-ish"})
        admin.create_topic("es", 1, config={"kind": "event-store"})
        info = admin.describe_topic("es")
        assert info.partition_count == 1
        with pytest.raises(InvalidArgumentError, match="exactly 1 partition"):
            admin.add_partitions("es", 2)
        admin.create_topic("plain", 1)
    with EventStore(cluster.bootstrap, "plain") as plain:
        with pytest.raises(FailedPreconditionError, match="not an event store"):
            plain.append(Event("x"))
    # Records enter an event store only as events (conditions checked, index kept).
    with Producer(bootstrap_servers=cluster.bootstrap, retries=0) as producer:
        with pytest.raises(FailedPreconditionError, match="is an event store"):
            producer.send("es", b"raw").get(timeout=10)


def test_positions_start_at_one_without_gaps_and_reads_follow_the_query(store: EventStore) -> None:
    assert store.read().head == 0
    assert store.append([Event("course.created", ["course_name:Algebra"], b"c1")]) == 1
    last = store.append([
        Event("user.registered", ["user_id:joe"], b"u1"),
        Event("user.joined", ["course_name:Algebra", "user_id:joe"], b"j1", metadata=b"m"),
        Event("user.joined", ["course_name:History", "user_id:joe"], b"j2"),
    ])
    assert last == 4
    everything = store.read()
    assert [e.position for e in everything] == [1, 2, 3, 4] and everything.head == 4
    assert everything.events[2].event == Event("user.joined", ("course_name:Algebra", "user_id:joe"), b"j1", b"m")
    # tags are AND'ed within an item, items OR'ed, types restrict
    assert [e.position for e in store.read([QueryItem(tags=["course_name:Algebra", "user_id:joe"])])] == [3]
    assert [e.position for e in store.read([QueryItem(tags=["user_id:joe"])])] == [2, 3, 4]
    assert [e.position for e in store.read([QueryItem(types=["user.joined"], tags=["user_id:joe"])])] == [3, 4]
    assert [e.position for e in store.read([QueryItem(types=["course.created"]),
                                           QueryItem(tags=["course_name:History"])])] == [1, 4]
    assert [e.position for e in store.read([QueryItem(tags=["user_id:joe"])], after=2, limit=1)] == [3]
    assert store.read([QueryItem(tags=["nobody"])]).events == []


def test_both_answer_shapes_carry_the_same_events_head_and_read_to(cluster: ClusterThread, store: EventStore) -> None:
    """The columnar answer is the stored per-event encodings joined, sent as they are (the handler
    answers bytes); the row-shaped one, for clients from before columns, is built message by message."""
    store.append([Event("a", ["k:1", "x"], b"p1", b"m1"), Event("b", [], b""), Event("a", ["k:1"], b"p3")])
    with grpc.insecure_channel(cluster.bootstrap) as ch:
        stub = pb_grpc.BrokerStub(ch)
        query = pb.EventQuery(items=[pb.EventQueryItem(tags=["k:1"])])
        columns = stub.EventRead(pb.EventReadRequest(topic="es", query=query, columnar=True), timeout=10)
        rows = stub.EventRead(pb.EventReadRequest(topic="es", query=query), timeout=10)
        limited = stub.EventRead(pb.EventReadRequest(topic="es", query=query, columnar=True, limit=1), timeout=10)
    assert columns.head == rows.head == 3 and columns.read_to == 3 and not columns.events
    assert list(columns.positions) == [e.position for e in rows.events] == [1, 3]
    assert list(zip(columns.types, columns.tags, columns.payloads, columns.metadata, columns.append_times_ms)) == [
        (e.event.type, "\n".join(e.event.tags), e.event.payload, e.event.metadata, e.append_time_ms) for e in rows.events]
    assert list(limited.positions) == [1] and limited.read_to == 1 and limited.head == 3


def test_a_failed_condition_stores_nothing_and_names_the_first_conflict(store: EventStore) -> None:
    store.append([Event("a", ["k:1"]), Event("b", ["k:2"]), Event("a", ["k:1"])])
    cond = AppendCondition([QueryItem(types=["a"], tags=["k:1"])], after=1)
    with pytest.raises(AppendConditionError) as info:
        store.append([Event("a", ["k:1"], b"late")], cond)
    assert info.value.position == 3
    assert "position 3" in str(info.value)
    assert store.read().head == 3  # nothing stored
    # after the conflicting position it passes; an empty query means "any event"
    assert store.append([Event("a", ["k:1"])], AppendCondition([QueryItem(types=["a"], tags=["k:1"])], after=3)) == 4
    with pytest.raises(AppendConditionError) as info:
        store.append([Event("z")], AppendCondition([], after=2))
    assert info.value.position == 3
    assert store.append([Event("z")], AppendCondition([], after=4)) == 5


def test_racing_appends_with_one_condition_exactly_one_succeeds(store: EventStore) -> None:
    head = store.read().head
    cond = AppendCondition([QueryItem(tags=["seat:1"])], after=head)
    results: list[object] = []
    barrier = threading.Barrier(8)

    def attempt(i: int) -> None:
        barrier.wait(timeout=10)
        try:
            results.append(store.append(Event("seat.booked", ["seat:1"], str(i).encode()), cond))
        except AppendConditionError as e:
            results.append(e)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    wins = [r for r in results if isinstance(r, int)]
    assert len(results) == 8 and len(wins) == 1
    assert len(store.read([QueryItem(tags=["seat:1"])]).events) == 1


def test_subscribe_delivers_past_then_new_matching_events(store: EventStore) -> None:
    store.append([Event("a", ["t:1"]), Event("b", ["t:2"])])
    got: list[int] = []
    with store.subscribe([QueryItem(tags=["t:1"])]) as sub:
        it = iter(sub)
        got.append(next(it).position)
        store.append([Event("b", ["t:2"]), Event("a", ["t:1"], b"new")])
        event = next(it)
        got.append(event.position)
        assert event.payload == b"new"
    assert got == [1, 4]


def test_the_index_survives_a_restart_and_is_rebuilt_from_the_log(tmp_path: pathlib.Path) -> None:
    data = tmp_path / "data"
    with ClusterThread(ClusterOptions(data_dir=data)) as c, make_store(c) as s:
        s.append([Event("a", [f"n:{i % 3}"], str(i).encode()) for i in range(30)])
        before = [(e.position, e.payload) for e in s.read([QueryItem(tags=["n:1"])])]
    index = next(data.rglob("events.index"))
    index.unlink()  # the index is lost: the log is the truth
    with ClusterThread(ClusterOptions(data_dir=data)) as c, EventStore(c.bootstrap, "es") as s:
        after = [(e.position, e.payload) for e in s.read([QueryItem(tags=["n:1"])])]
        assert after == before and len(after) == 10
        assert s.append(Event("a", ["n:1"])) == 31
    index.write_bytes(b"this is not an event index" * 100)  # damaged: rebuilt too
    with ClusterThread(ClusterOptions(data_dir=data)) as c, EventStore(c.bootstrap, "es") as s:
        assert [e.position for e in s.read([QueryItem(tags=["n:1"])])][-1] == 31
        assert len(s.read().events) == 31


def test_bad_requests_get_invalid_argument_naming_the_field(cluster: ClusterThread, store: EventStore) -> None:
    address = cluster.bootstrap
    with grpc.insecure_channel(address) as ch:
        stub = pb_grpc.BrokerStub(ch)
        cases = [
            (stub.EventAppend, pb.EventAppendRequest(topic="es"), "events must hold"),
            (stub.EventAppend, pb.EventAppendRequest(topic="es", events=[pb.Event(type="")]), "events[0].type"),
            (stub.EventAppend, pb.EventAppendRequest(topic="es", events=[pb.Event(type="a", tags=["x"] * 65)]),
             "events[0].tags"),
            (stub.EventAppend, pb.EventAppendRequest(topic="es", events=[pb.Event(type="a")],
                                                     condition=pb.AppendCondition(after=-1)), "condition.after"),
            (stub.EventRead, pb.EventReadRequest(topic="es", limit=10**9), "limit"),
            (stub.EventRead, pb.EventReadRequest(topic="es", after=-5), "after"),
            (stub.EventRead, pb.EventReadRequest(topic="es", query=pb.EventQuery(
                items=[pb.EventQueryItem(tags=["a\nb"])])), "query.items[0].tags[0]"),
            (stub.EventRead, pb.EventReadRequest(topic="bad/name"), "topic"),
            (stub.EventClaimNext, pb.EventClaimRequest(topic="es", group="g", worker_id="w", handled_types=["a"]),
             "partition_by"),
            (stub.EventClaimNext, pb.EventClaimRequest(topic="es", group="g", worker_id="w", partition_by=["a"],
                                                       handled_types=["a"], claim_timeout_ms=5), "claim_timeout_ms"),
        ]
        # a composite partition key: each attribute checked, the newline only between attributes
        def ref(key: str) -> pb.EventClaimRef:
            return pb.EventClaimRef(topic="es", group="g", partition_key=key, worker_id="w")

        for key, message in [("", "partition key must not be empty"),
                             ("a:1\n", "attribute 1 of the partition key must not be empty"),
                             ("a:1\nb:\t2", "attribute 1 of the partition key 'b:\\t2' contains the control character"),
                             ("a:1\nplain", "attribute 1 of the partition key is 'plain', not an attribute"),
                             ("b:1\na:2", "attribute 1 of the partition key is 'a', after 'b'"),
                             ("a:1\na:2", "attribute 1 of the partition key is 'a', after 'a'"),
                             ("\n".join(f"a{i:02}:1" for i in range(17)), "partition key has 17 attributes; the limit is 16"),
                             ("a:1\nb:" + "x" * 600, "attribute 1 of the partition key is 602 bytes long, the limit is 512")]:
            for call in (stub.EventAck, stub.EventRelease, stub.EventRenewClaim):
                cases.append((call, ref(key), f"partition_key: {message}"))
            cases.append((stub.EventClaimNext, pb.EventClaimRequest(topic="es", group="g", worker_id="w", max_claims=0,
                                                                    releases=[ref(key)]),
                          "releases[0].partition_key: "))
        for call, request, field in cases:
            with pytest.raises(grpc.RpcError) as info:
                call(request, timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (field, info.value)
            assert field in (info.value.details() or ""), (field, info.value.details())
        with pytest.raises(grpc.RpcError) as info:
            stub.EventRead(pb.EventReadRequest(topic="missing"), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_an_event_larger_than_the_batch_limit_is_refused(cluster: ClusterThread) -> None:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("small", 1, config={"kind": "event-store", "max_message_bytes": 1024})
    with EventStore(cluster.bootstrap, "small") as s:
        with pytest.raises(ResourceExhaustedError):
            s.append(Event("a", [], os.urandom(4096)))
        assert s.append(Event("a", [], b"ok")) == 1


_text = st.sampled_from(["", "a", "k:1", "x" * 600, "a\nb", "é:ü", "course_name:Algebra"])
_queries = st.builds(lambda items: pb.EventQuery(items=items), st.lists(
    st.builds(lambda types, tags: pb.EventQueryItem(types=types, tags=tags), st.lists(_text, max_size=3),
              st.lists(_text, max_size=3)), max_size=3))
_ints = st.one_of(st.integers(-3, 12), st.integers(-(2**31), 2**31 - 1))
_requests = st.one_of(
    st.builds(lambda events, q, after, cond: ("EventAppend", pb.EventAppendRequest(
        topic="es", events=events, **({"condition": pb.AppendCondition(fail_if_events_match=q, after=after)} if cond else {}))),
        st.lists(st.builds(lambda t, tags, p: pb.Event(type=t, tags=tags, payload=p), _text, st.lists(_text, max_size=3),
                           st.binary(max_size=16)), max_size=3), _queries, _ints, st.booleans()),
    st.builds(lambda q, after, limit, columnar: ("EventRead", pb.EventReadRequest(
        topic="es", query=q, after=after, limit=limit, columnar=columnar)), _queries, _ints, _ints, st.booleans()),
    st.builds(lambda g, by, types, w, t, limit: ("EventClaimNext", pb.EventClaimRequest(
        topic="es", group=g, partition_by=by, handled_types=types, worker_id=w, claim_timeout_ms=t, limit=limit)),
        _text, st.lists(_text, max_size=3), st.lists(_text, max_size=3), _text, _ints, _ints),
    # a prefetching worker's: several claims, acks and releases in one call
    st.builds(lambda g, by, w, m, acks, releases: ("EventClaimNext", pb.EventClaimRequest(
        topic="es", group=g, partition_by=by, handled_types=["course.created"], worker_id=w, max_claims=m,
        more_acks=acks, releases=releases)),
        st.sampled_from(["a", "", "b"]), st.sampled_from([["course_name"], []]), _text, _ints,
        st.lists(st.builds(lambda g, key, pos: pb.EventClaimRef(topic="es", group=g, partition_key=key, worker_id="w",
                                                                position=pos),
                           st.sampled_from(["a", "b"]), st.sampled_from(["course_name:Algebra", "x", "course_name:Algebra\nuser_id:joe"]), _ints),
                           max_size=3),
        st.lists(st.builds(lambda key: pb.EventClaimRef(topic="es", group="a", partition_key=key, worker_id="w"),
                           st.sampled_from(["course_name:Algebra", "", "x" * 600])), max_size=2)),
    st.builds(lambda g, key, w, pos, m: (m, pb.EventClaimRef(topic="es", group=g, partition_key=key, worker_id=w, position=pos)),
              _text, _text, _text, _ints, st.sampled_from(["EventAck", "EventRelease", "EventRenewClaim"])),
    st.builds(lambda g, a: ("EventGroupControl", pb.EventGroupControlRequest(topic="es", group=g, action=a)),
              _text, st.integers(0, 7)),
    st.builds(lambda g: ("EventGroupDescribe", pb.EventGroupDescribeRequest(topic="es", group=g)), _text),
    st.builds(lambda t, limit: ("EventStoreDescribe", pb.EventStoreDescribeRequest(topic=t, limit=limit)),
              st.sampled_from(["es", "", "no-such", "bad/name"]), _ints),
)


def test_fuzzed_event_rpcs_on_a_real_store_never_answer_internal(cluster: ClusterThread, store: EventStore) -> None:
    store.append(Event("course.created", ["course_name:Algebra"]))
    with grpc.insecure_channel(cluster.bootstrap) as ch:
        stub = pb_grpc.BrokerStub(ch)
        stub.EventGroupControl(pb.EventGroupControlRequest(topic="es", group="a", action=pb.EVENT_GROUP_REGISTER))

        @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(call=_requests)
        def check(call: tuple[str, object]) -> None:
            method, request = call
            try:
                getattr(stub, method)(request, timeout=10)
            except grpc.RpcError as e:
                assert e.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                                    grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED), (
                    method, request, e.code(), e.details())

        check()


def test_group_progress_kept_in_sqlite_by_an_older_broker_is_imported_once(tmp_path: pathlib.Path) -> None:
    from dmq.broker.events.progress import PROGRESS_FILE, GroupRecord, SqliteProgressStore

    data = tmp_path / "data"
    with ClusterThread(ClusterOptions(data_dir=data)) as c, make_store(c) as s:
        s.append([Event("a", ["k:1"]), Event("a", ["k:2"]), Event("a", ["k:1"])])
    partition_dir = next(p.parent for p in data.rglob("events.index"))
    legacy = SqliteProgressStore(str(partition_dir))  # as an older broker left it: k:1 acknowledged up to 1
    group = GroupRecord("old", True, ("k",), ("a",), 3)
    legacy.put_group(group)
    legacy.put_partitions(group, {"k:1": {"k": "1"}, "k:2": {"k": "2"}}, 3)
    legacy.put_ack("old", "k:1", {"k": "1"}, 1)
    legacy.close()
    for _ in range(2):  # imported at the first open, then read from the offsets log
        with ClusterThread(ClusterOptions(data_dir=data)) as c, EventStore(c.bootstrap, "es") as s:
            described = {p.partition_key: p.acked_position for p in s.describe_group("old").partitions}
            assert described == {"k:1": 1, "k:2": 0}
            assert s.group_active("old")
        assert not (partition_dir / PROGRESS_FILE).exists()
        assert (partition_dir / (PROGRESS_FILE + ".migrated")).exists()


def test_describe_counts_every_type_and_tag_lists_groups_and_bounds_each_list(cluster: ClusterThread,
                                                                               store: EventStore) -> None:
    # 7 types with 1..7 events each (28 in all), each event tagged by its type and by its parity
    store.append([Event(f"t{n}", b"", [f"n:{n}", f"odd:{n % 2}"]) for n in range(1, 8) for _ in range(n)])
    for group in ("g-b", "g-a", "g-c"):
        store.register_group(group)
    claim = store.claim_next("g-a", ["n"], ["t7"], worker_id="w1")
    assert claim is not None and claim.values == {"n": "7"}

    full = store.describe()
    assert full.head == 28
    assert full.types == {f"t{n}": n for n in range(7, 0, -1)} and full.type_count == 7
    assert list(full.types) == [f"t{n}" for n in range(7, 0, -1)]  # the most frequent first
    assert full.tags == {"odd:0": 12, "odd:1": 16} | {f"n:{n}": n for n in range(1, 8)} and full.tag_count == 9
    assert [g.group for g in full.groups] == ["g-a", "g-b", "g-c"] and full.group_count == 3
    claimed = {p.partition_key: p for p in full.groups[0].partitions if p.claimed_by}
    assert [(p.values, p.claimed_by, p.pending) for p in claimed.values()] == [({"n": "7"}, "w1", 7)]

    cut = store.describe(limit=2)
    assert cut.types == {"t7": 7, "t6": 6} and cut.type_count == 7
    assert cut.tags == {"odd:1": 16, "odd:0": 12} and cut.tag_count == 9
    assert [g.group for g in cut.groups] == ["g-a", "g-b"] and cut.group_count == 3
    with AdminClient(cluster.bootstrap) as admin:
        assert admin.describe_event_store("es", limit=2) == cut

    with grpc.insecure_channel(cluster.bootstrap) as ch:
        stub = pb_grpc.BrokerStub(ch)
        for limit in (-1, 1001):
            with pytest.raises(grpc.RpcError) as e:
                stub.EventStoreDescribe(pb.EventStoreDescribeRequest(topic="es", limit=limit), timeout=10)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "limit must be within 0..1000" in str(
                e.value.details())
        with pytest.raises(grpc.RpcError) as e:
            stub.EventStoreDescribe(pb.EventStoreDescribeRequest(topic="no-such-store"), timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
