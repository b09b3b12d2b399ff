"""Property tests over real gRPC: on random logs and queries, `read` and the consumer groups'
conditional-AND fetch return exactly what a brute-force filter over all events returns, as does a
claim's guard (CCC's, and the exact one); and many clients appending with conditions over
overlapping tags never violate a condition."""

from __future__ import annotations

import itertools
import pathlib
import random
import threading
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmq.client import AdminClient
from dmq.client.cli.runner import ClusterOptions, ClusterThread
from dmq.client.errors import AppendConditionError
from dmq.client.events import AppendCondition, Event, EventStore, EventType, QueryItem, SequencedEvent, _query_proto
from dmq.proto import dmq_pb2 as pb

TYPES = ["a", "b", "c"]
ATTRS = {"x": ["1", "2", "3"], "y": ["1", "2"]}
PLAIN = ["p", "q"]
_topics = itertools.count()


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data: pathlib.Path = tmp_path_factory.mktemp("events-props")
    with ClusterThread(ClusterOptions(data_dir=data)) as c:
        yield c.bootstrap


def new_store(bootstrap: str) -> EventStore:
    topic = f"props-{next(_topics)}"
    with AdminClient(bootstrap) as admin:
        admin.create_topic(topic, 1, config={"kind": "event-store"})
    return EventStore(bootstrap, topic)


@st.composite
def events(draw: st.DrawFn) -> Event:
    tags = []
    for name, values in ATTRS.items():
        if draw(st.booleans()):
            tags.append(f"{name}:{draw(st.sampled_from(values))}")
    tags += draw(st.lists(st.sampled_from(PLAIN), unique=True, max_size=2))
    return Event(draw(st.sampled_from(TYPES)), tuple(draw(st.permutations(tags))), draw(st.binary(max_size=8)),
                 draw(st.binary(max_size=3)))


all_tags = [f"{n}:{v}" for n, vs in ATTRS.items() for v in vs] + PLAIN
items = st.builds(
    QueryItem,
    types=st.lists(st.sampled_from(TYPES), unique=True, max_size=2).map(tuple),
    tags=st.lists(st.sampled_from(all_tags), unique=True, max_size=2).map(tuple),
)
queries = st.lists(items, max_size=3)
logs = st.lists(st.lists(events(), min_size=1, max_size=8), min_size=1, max_size=6)  # batches of appends


def brute_matches(query: Sequence[QueryItem], e: Event) -> bool:
    if not query:
        return True
    return any((not i.types or e.type in i.types) and all(t in e.tags for t in i.tags) for i in query)


def attrs(e: Event) -> dict[str, str]:
    return dict(t.split(":", 1) for t in e.tags if ":" in t)


def brute_belongs(partition: dict[str, str], e: Event) -> bool:
    a = attrs(e)
    carried = [n for n in partition if n in a]
    return bool(carried) and all(a[n] == partition[n] for n in carried)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(log=logs, query_list=st.lists(st.tuples(queries, st.integers(0, 50), st.one_of(st.none(), st.integers(1, 10))),
                                      min_size=1, max_size=4))
def test_read_equals_a_brute_force_filter(bootstrap: str, log: list[list[Event]],
                                          query_list: list[tuple[list[QueryItem], int, int | None]]) -> None:
    with new_store(bootstrap) as store:
        stored: list[Event] = []
        for batch in log:
            store.append(batch)
            stored += batch
        for query, after, limit in query_list:
            expected = [(p, e) for p, e in enumerate(stored, 1) if p > after and brute_matches(query, e)]
            if limit is not None:
                expected = expected[:limit]
            got = store.read(query, after=after, limit=limit)  # columnar answers
            assert [(e.position, e.event.type, tuple(e.tags), e.payload, e.metadata) for e in got] == [
                (p, e.type, tuple(e.tags), e.payload, e.metadata) for p, e in expected
            ], (query, after, limit)
            assert got.head == len(stored)
            # the row-shaped answer (older clients, subscriptions) holds the same events
            rows = store._call("EventRead", pb.EventReadRequest(topic=store.topic, query=_query_proto(query),
                                                                after=after, limit=limit or 0))
            assert [SequencedEvent.from_proto(e) for e in rows.events] == got.events


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(log=logs, partition_by=st.sampled_from([["x"], ["y"], ["x", "y"]]),
       handled=st.lists(st.sampled_from(TYPES), unique=True, min_size=1, max_size=3))
def test_conditional_and_fetch_equals_a_brute_force_filter(bootstrap: str, log: list[list[Event]],
                                                           partition_by: list[str], handled: list[str]) -> None:
    with new_store(bootstrap) as store:
        stored: list[Event] = []
        for batch in log:
            store.append(batch)
            stored += batch
        numbered = list(enumerate(stored, 1))
        partitions = {tuple(attrs(e)[n] for n in partition_by) for e in stored if all(n in attrs(e) for n in partition_by)}
        expected = {}
        for values in partitions:
            p = dict(zip(partition_by, values))
            pending = [pos for pos, e in numbered if e.type in handled and brute_belongs(p, e)]
            if pending:
                expected["\n".join(f"{n}:{p[n]}" for n in sorted(p))] = pending
        store.register_group("g")
        types = [EventType(t, partition_by) for t in handled]
        got: dict[str, list[int]] = {}
        first_positions = []
        for worker in range(len(partitions) + 1):
            claim = store.claim_next("g", partition_by, types, f"w{worker}")
            if claim is None:
                break
            got[claim.partition_key] = [e.position for e in claim.events]
            first_positions.append(claim.events[0].position)
        assert got == expected
        assert first_positions == sorted(first_positions)  # earliest pending first


def touches(guarded: dict[str, str], declared: dict[str, list[str]], e: Event, exact: bool) -> bool:
    """Whether a claim's guard over the values `guarded` matches `e` (brute force): CCC's guard
    matches an event of a handled type that carries any one of the values its type declares;
    the exact guard one that carries all of them."""
    if e.type not in declared:
        return False
    wanted = {f"{n}:{guarded[n]}" for n in declared[e.type] if n in guarded}
    return bool(wanted) and (wanted <= set(e.tags) if exact else bool(wanted & set(e.tags)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(log=logs, partition_by=st.sampled_from([["x"], ["y"], ["x", "y"]]),
       declared=st.fixed_dictionaries({t: st.lists(st.sampled_from(sorted(ATTRS)), unique=True) for t in TYPES}),
       handled=st.lists(st.sampled_from(TYPES), unique=True, min_size=1, max_size=3),
       concurrent=st.lists(events(), max_size=2), exact=st.booleans())
def test_a_claims_guard_fails_exactly_when_a_later_event_touches_its_values(
    bootstrap: str, log: list[list[Event]], partition_by: list[str], declared: dict[str, list[str]],
    handled: list[str], concurrent: list[Event], exact: bool,
) -> None:
    with new_store(bootstrap) as store:
        stored: list[Event] = []
        for batch in log:
            store.append(batch)
            stored += batch
        store.register_group("g")
        types = [EventType(t, declared[t]) for t in handled]
        claim = store.claim_next("g", partition_by, types, "w", exact_guard=exact)
        if claim is None:  # nothing pending for these types: no guard to check in this example
            return
        if concurrent:
            store.append(concurrent)
        # every event after the claim's last position counts: also those of other partitions that
        # share a value (they do not belong to the claim, yet they touch its decision)
        later = (stored + concurrent)[claim.last_position:]
        handled_declared = {t: declared[t] for t in handled}
        guarded = dict(claim.values)
        # no handled type declares a claimed attribute: the guard has no items, and an empty query
        # matches every event (DCB), so any later event fails it
        empty = not any(n in guarded for t in handled for n in declared[t])
        expected = next((p for p, e in enumerate(later, claim.last_position + 1)
                         if empty or touches(guarded, handled_declared, e, exact)), None)
        try:
            store.append(Event("decided", ()), claim.guard)
            conflict = None
        except AppendConditionError as e:
            conflict = e.position
        assert conflict == expected, (dict(claim.values), claim.guard, later)


def test_racing_conditional_appends_never_violate_a_condition(bootstrap: str) -> None:
    """Each client reads the events of a random pair of overlapping tags, then appends one event
    with both tags under the condition "nothing with either tag since what I read". In the final
    log no event may have a matching event between its client's read position and itself."""
    tags = [f"k:{i}" for i in range(4)]
    with new_store(bootstrap) as store:
        attempts: list[tuple[int, int, tuple[str, str]]] = []  # (read head, stored position, tags)
        lock = threading.Lock()

        def client(seed: int) -> None:
            rnd = random.Random(seed)
            for _ in range(25):
                pair = tuple(rnd.sample(tags, 2))
                query = [QueryItem(tags=(t,)) for t in pair]
                head = store.read(query).head
                try:
                    position = store.append(Event("decided", pair, str(head).encode()), AppendCondition(query, head))
                except AppendConditionError as e:
                    assert e.position is not None and e.position > head
                    continue
                with lock:
                    attempts.append((head, position, pair))  # type: ignore[arg-type]

        threads = [threading.Thread(target=client, args=(seed,)) for seed in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert attempts, "no append succeeded"
        final = store.read().events
        for head, position, pair in attempts:
            between = [e for e in final if head < e.position < position and set(e.tags) & set(pair)]
            assert between == [], (head, position, pair, between)
        assert len(final) == len(attempts)
