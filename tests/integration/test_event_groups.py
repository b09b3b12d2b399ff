"""Event-store consumer groups partitioned by attributes, over real gRPC (issue 17, deliverable 5):
group lifecycle, claim_next on single-attribute and composite partitions, ack / release, and the
reaping of a crashed worker's claim (never a renewing one's)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator

import pytest

from dmq.client import AdminClient
from dmq.client.cli.runner import ClusterThread
from dmq.client.errors import AppendConditionError, ClaimNotHeldError, FailedPreconditionError, GroupNotFoundError
from dmq.client.events import Claim, EventStore, EventType
from tests.wall_clock import wait_wall_clock_past, wall_ms

CourseCreated = EventType("course.created", ["course_name"])
UserRegistered = EventType("user.registered", ["user_id"])
UserJoined = EventType("user.joined_course", ["course_name", "user_id"])
CourseRenamed = EventType("course.renamed", ["course_name"])
ALL = [CourseCreated, UserRegistered, UserJoined]


@pytest.fixture
def store(cluster: ClusterThread) -> Iterator[EventStore]:
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("courses", 1, config={"kind": "event-store"})
    with EventStore(cluster.bootstrap, "courses") as s:
        s.register_group("g")
        yield s


def positions(claim: Claim | None) -> list[int]:
    assert claim is not None
    return [e.position for e in claim.events]


def by_course(store: EventStore, worker: str = "w1", types: list[EventType] | None = None) -> Claim | None:
    return store.claim_next("g", ["course_name"], types or [CourseCreated, CourseRenamed, UserJoined], worker)


# -- group lifecycle -------------------------------------------------------------------------------


def test_register_is_idempotent(store: EventStore) -> None:
    store.append(CourseCreated.new(course_name="Algebra"))
    store.ack(by_course(store))  # type: ignore[arg-type]
    store.register_group("g")  # again: progress kept
    assert by_course(store) is None
    assert store.group_active("g")


def test_group_active_stopped_unknown(store: EventStore) -> None:
    assert store.group_state("g") == "active" and store.group_active("g")
    store.stop_group("g")
    assert store.group_state("g") == "stopped" and not store.group_active("g")
    assert store.group_state("nobody") == "unknown" and not store.group_active("nobody")
    with pytest.raises(GroupNotFoundError):
        store.claim_next("nobody", ["course_name"], ALL, "w1")


def test_stop_and_start(store: EventStore) -> None:
    store.append(CourseCreated.new(course_name="Algebra"))
    store.stop_group("g")
    assert by_course(store) is None
    store.start_group("g")
    assert positions(by_course(store)) == [1]


def test_reset_forgets_offsets(store: EventStore) -> None:
    store.append([CourseCreated.new(course_name="Algebra"), CourseCreated.new(course_name="History")])
    for _ in range(2):
        store.ack(by_course(store))  # type: ignore[arg-type]
    assert by_course(store) is None
    store.reset_group("g")
    assert positions(by_course(store)) == [1]
    assert positions(by_course(store, "w2")) == [2]


# -- claim_next, one attribute ---------------------------------------------------------------------


def test_claim_next_bootstraps_partitions(store: EventStore) -> None:
    store.append([CourseCreated.new(course_name="Algebra"), CourseCreated.new(course_name="History")])
    claim = by_course(store)
    assert claim is not None and claim.partition_key == "course_name:Algebra"
    assert [p.partition_key for p in store.describe_group("g").partitions] == ["course_name:Algebra", "course_name:History"]


def test_nothing_pending_returns_none(store: EventStore) -> None:
    assert by_course(store) is None
    store.append(UserRegistered.new(user_id="joe"))  # no course_name: no partition
    assert by_course(store) is None


def test_claim_has_the_correct_shape_with_guard(store: EventStore) -> None:
    store.append([CourseCreated.new(b"c", course_name="Algebra"), UserRegistered.new(user_id="joe")])
    claim = store.claim_next("g", ["course_name"], [CourseCreated, UserJoined], "w1")
    assert claim is not None
    assert claim.group == "g" and claim.worker_id == "w1"
    assert claim.partition_key == "course_name:Algebra" and dict(claim.values) == {"course_name": "Algebra"}
    assert [(e.position, e.type, e.payload) for e in claim.events] == [(1, "course.created", b"c")]
    assert claim.last_position == 1 and claim.head == 2
    assert claim.guard.after == 1
    assert [(list(i.types), list(i.tags)) for i in claim.guard.fail_if_events_match] == [
        (["course.created"], ["course_name:Algebra"]),
        (["user.joined_course"], ["course_name:Algebra"]),
    ]


def test_several_pending_events(store: EventStore) -> None:
    store.append([CourseCreated.new(course_name="Algebra")] + [UserJoined.new(course_name="Algebra", user_id=f"u{i}")
                                                               for i in range(5)])
    assert positions(by_course(store)) == [1, 2, 3, 4, 5, 6]


def test_second_worker_gets_a_different_partition(store: EventStore) -> None:
    store.append([CourseCreated.new(course_name="Algebra"), CourseCreated.new(course_name="History")])
    a, b = by_course(store, "w1"), by_course(store, "w2")
    assert a is not None and b is not None and a.partition_key != b.partition_key


def test_all_claimed_returns_none(store: EventStore) -> None:
    store.append([CourseCreated.new(course_name="Algebra"), CourseCreated.new(course_name="History")])
    assert by_course(store, "w1") and by_course(store, "w2")
    assert by_course(store, "w3") is None


def test_handled_types_respected(store: EventStore) -> None:
    store.append([CourseCreated.new(course_name="Algebra"), UserJoined.new(course_name="Algebra", user_id="joe"),
                  CourseRenamed.new(course_name="Algebra")])
    claim = store.claim_next("g", ["course_name"], [UserJoined], "w1")
    assert [e.type for e in claim.events] == ["user.joined_course"]  # type: ignore[union-attr]
    store.release(claim)  # type: ignore[arg-type]
    store.append(CourseCreated.new(course_name="History"))  # a partition with no handled event
    claim = store.claim_next("g", ["course_name"], [UserJoined], "w1")
    assert claim is not None and claim.partition_key == "course_name:Algebra"
    assert store.claim_next("g", ["course_name"], [UserJoined], "w2") is None


def test_only_events_after_the_acknowledged_position(store: EventStore) -> None:
    store.append([CourseCreated.new(course_name="Algebra"), CourseRenamed.new(course_name="Algebra")])
    claim = by_course(store)
    store.ack(claim, 1)  # type: ignore[arg-type]
    store.append(CourseRenamed.new(course_name="Algebra"))
    assert positions(by_course(store)) == [2, 3]


def test_stopped_group_returns_none(store: EventStore) -> None:
    store.append(CourseCreated.new(course_name="Algebra"))
    store.stop_group("g")
    assert by_course(store) is None


def test_earliest_pending_first(store: EventStore) -> None:
    store.append([CourseCreated.new(course_name="Zoology"), CourseCreated.new(course_name="Algebra"),
                  CourseRenamed.new(course_name="Zoology")])
    first = by_course(store, "w1")
    assert first is not None and first.partition_key == "course_name:Zoology"  # position 1, not the smaller key
    store.ack(first)
    store.append(CourseRenamed.new(course_name="Zoology"))
    nxt = by_course(store, "w1")
    assert nxt is not None and nxt.partition_key == "course_name:Algebra"  # pending since 2, Zoology since 4


def test_new_partitions_appear_later(store: EventStore) -> None:
    store.append(CourseCreated.new(course_name="Algebra"))
    store.ack(by_course(store))  # type: ignore[arg-type]
    assert by_course(store) is None
    store.append(CourseCreated.new(course_name="History"))
    claim = by_course(store)
    assert claim is not None and claim.partition_key == "course_name:History" and positions(claim) == [2]


def test_guard_conditions_only_for_attributes_each_type_has(store: EventStore) -> None:
    store.append(UserJoined.new(course_name="Algebra", user_id="joe"))
    claim = store.claim_next("g", ["course_name", "user_id"], ALL, "w1")
    assert claim is not None
    assert [(list(i.types), list(i.tags)) for i in claim.guard.fail_if_events_match] == [
        (["course.created"], ["course_name:Algebra"]),
        (["user.registered"], ["user_id:joe"]),
        (["user.joined_course"], ["course_name:Algebra"]),  # one item per attribute: alternatives
        (["user.joined_course"], ["user_id:joe"]),
    ]
    assert CourseCreated.to_conditions(user_id="joe") == CourseCreated.to_exact_conditions(user_id="joe") == []


def test_the_guard_lets_a_clean_append_through_and_stops_a_conflicting_one(store: EventStore) -> None:
    store.append(CourseCreated.new(course_name="Algebra"))
    claim = by_course(store)
    assert claim is not None
    store.append(CourseCreated.new(course_name="History"))  # another partition: no conflict
    assert store.append(CourseRenamed.new(course_name="Algebra"), claim.guard) == 3
    stale = claim.guard  # its `after` is 1: the rename just appended conflicts
    with pytest.raises(AppendConditionError) as info:
        store.append(CourseRenamed.new(course_name="Algebra"), stale)
    assert info.value.position == 3


# -- composite partitions --------------------------------------------------------------------------


def composite(store: EventStore, worker: str = "w1") -> Claim | None:
    return store.claim_next("g", ["course_name", "user_id"], ALL, worker)


def test_only_events_with_all_attributes_create_partitions(store: EventStore) -> None:
    store.append([CourseCreated.new(course_name="Algebra"), UserRegistered.new(user_id="joe")])
    assert composite(store) is None
    store.append(UserJoined.new(course_name="Algebra", user_id="joe"))
    assert [p.partition_key for p in store.describe_group("g").partitions] == ["course_name:Algebra\nuser_id:joe"]


def test_single_attribute_events_are_fetched(store: EventStore) -> None:
    store.append([CourseCreated.new(course_name="Algebra"), UserRegistered.new(user_id="joe"),
                  UserJoined.new(course_name="Algebra", user_id="joe")])
    claim = composite(store)
    assert claim is not None and dict(claim.values) == {"course_name": "Algebra", "user_id": "joe"}
    assert [e.type for e in claim.events] == ["course.created", "user.registered", "user.joined_course"]


def test_two_partitions_claimed_in_parallel(store: EventStore) -> None:
    store.append([UserJoined.new(course_name="Algebra", user_id="joe"),
                  UserJoined.new(course_name="Algebra", user_id="jake")])
    claims: list[Claim | None] = []
    threads = [threading.Thread(target=lambda w=w: claims.append(composite(store, w))) for w in ("w1", "w2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    keys = sorted(c.partition_key for c in claims if c is not None)
    assert keys == ["course_name:Algebra\nuser_id:jake", "course_name:Algebra\nuser_id:joe"]


def test_the_four_conditional_and_cases(store: EventStore) -> None:
    store.append([
        CourseCreated.new(b"belongs", course_name="Algebra"),
        UserRegistered.new(b"belongs", user_id="joe"),
        UserJoined.new(b"belongs", course_name="Algebra", user_id="joe"),
        UserJoined.new(b"other user", course_name="Algebra", user_id="jake"),
        UserJoined.new(b"other course", course_name="History", user_id="joe"),
    ])
    claims = [c for c in (composite(store, w) for w in ("w1", "w2", "w3")) if c is not None]
    joe = next(c for c in claims if dict(c.values) == {"course_name": "Algebra", "user_id": "joe"})
    assert [e.payload for e in joe.events] == [b"belongs"] * 3
    assert positions(joe) == [1, 2, 3]


def test_no_duplicates(store: EventStore) -> None:
    # an event carrying both attributes matches both attribute tags: fetched once
    store.append([UserJoined.new(course_name="Algebra", user_id="joe")] * 3)
    claim = composite(store)
    assert positions(claim) == [1, 2, 3]


# -- ack and release -------------------------------------------------------------------------------


def test_ack_advances_and_releases(store: EventStore) -> None:
    store.append([CourseCreated.new(course_name="Algebra"), CourseRenamed.new(course_name="Algebra")])
    claim = by_course(store, "w1")
    store.ack(claim)  # type: ignore[arg-type]
    state = store.describe_group("g").partitions[0]
    assert state.acked_position == 2 and state.claimed_by is None and state.pending == 0
    store.append(CourseRenamed.new(course_name="Algebra"))
    assert positions(by_course(store, "w2")) == [3]  # released: another worker may claim it


def test_release_gives_the_same_events_back(store: EventStore) -> None:
    store.append([CourseCreated.new(course_name="Algebra"), CourseRenamed.new(course_name="Algebra")])
    claim = by_course(store, "w1")
    assert store.describe_group("g").partitions[0].claimed_by == "w1"
    store.release(claim)  # type: ignore[arg-type]
    assert positions(by_course(store, "w2")) == positions(claim) == [1, 2]


def test_an_ack_rides_on_the_next_claim(store: EventStore) -> None:
    store.append([CourseCreated.new(course_name="Algebra"), CourseCreated.new(course_name="History")])
    first = by_course(store)
    assert first is not None
    second = store.claim_next("g", ["course_name"], [CourseCreated], "w1", ack=(first, first.last_position))
    assert second is not None and second.partition_key == "course_name:History"
    assert {p.partition_key: p.acked_position for p in store.describe_group("g").partitions}["course_name:Algebra"] == 1


def test_only_the_claiming_worker_acks(store: EventStore) -> None:
    store.append(CourseCreated.new(course_name="Algebra"))
    claim = by_course(store, "w1")
    assert claim is not None
    forged = dataclasses.replace(claim, worker_id="w2")
    with pytest.raises(ClaimNotHeldError, match="held by worker 'w1'"):
        store.ack(forged)
    with pytest.raises(FailedPreconditionError):
        store.release(forged)
    store.ack(claim)
    with pytest.raises(ClaimNotHeldError, match="not claimed"):
        store.ack(claim)


# -- claims expire without renewal -------------------------------------------------------------------


def test_a_crashed_workers_claim_is_reaped(store: EventStore) -> None:
    store.append(CourseCreated.new(course_name="Algebra"))
    # 1 s, not 300 ms: w2's first claim must come while the crash's claim is held, and on a
    # loaded machine 300 ms did not always cover the call
    crashed = store.claim_next("g", ["course_name"], [CourseCreated], "crashed", claim_timeout_ms=1_000)
    held_until_ms = wall_ms() + 1_000  # the claim's expiry is at or before this (the broker's clock)
    assert crashed is not None
    assert store.claim_next("g", ["course_name"], [CourseCreated], "w2") is None
    wait_wall_clock_past(held_until_ms)  # the crashed worker never renews
    taken = store.claim_next("g", ["course_name"], [CourseCreated], "w2")
    assert taken is not None and positions(taken) == [1]
    with pytest.raises(ClaimNotHeldError):
        store.ack(crashed)


@pytest.mark.slow
def test_a_renewing_workers_claim_is_never_reaped(store: EventStore) -> None:
    store.append(CourseCreated.new(course_name="Algebra"))
    # Renewed every ~0.2 s (plus two calls) within a 1 s timeout: with 300 ms, two slow calls
    # between renewals let a loaded machine's claim lapse.
    claim = store.claim_next("g", ["course_name"], [CourseCreated], "w1", claim_timeout_ms=1_000)
    assert claim is not None
    deadline = time.monotonic() + 3.0  # three timeouts
    while time.monotonic() < deadline:
        store.renew(claim)
        assert store.claim_next("g", ["course_name"], [CourseCreated], "w2") is None
        time.sleep(0.2)
    assert store.describe_group("g").partitions[0].claimed_by == "w1"
    store.ack(claim)


# -- claims over two or more attributes (issue 26 item 3) --------------------------------------------

StockReceived = EventType("stock.received", ["sku", "warehouse"])
StockShipped = EventType("stock.shipped", ["sku", "warehouse"])
SkuListed = EventType("sku.listed", ["sku"])
STOCK = [StockReceived, StockShipped, SkuListed]


def by_stock(store: EventStore, worker: str = "w1", **kwargs: object) -> Claim | None:
    return store.claim_next("g", ["sku", "warehouse"], STOCK, worker, **kwargs)  # type: ignore[arg-type]


def test_a_composite_claim_is_acked_released_and_renewed(store: EventStore) -> None:
    """Its key joins the attributes with a newline; every call naming it is accepted (was refused:
    "partition key ... contains the control character '\\n'")."""
    store.append([StockReceived.new(sku="SKU-7", warehouse="Berlin"), StockReceived.new(sku="SKU-9", warehouse="Paris")])
    claim = by_stock(store)
    assert claim is not None and claim.partition_key == "sku:SKU-7\nwarehouse:Berlin"
    store.renew(claim)
    store.release(claim)
    again = by_stock(store, "w2")
    assert again is not None and again.partition_key == claim.partition_key and positions(again) == [1]
    store.ack(again)
    acked = {p.partition_key: p.acked_position for p in store.describe_group("g").partitions}
    assert acked == {"sku:SKU-7\nwarehouse:Berlin": 1, "sku:SKU-9\nwarehouse:Paris": 0}


def test_a_composite_claim_is_acked_riding_on_the_next_claim(store: EventStore) -> None:
    store.append([StockReceived.new(sku="SKU-7", warehouse="Berlin"), StockReceived.new(sku="SKU-9", warehouse="Paris"),
                  StockShipped.new(sku="SKU-1", warehouse="Rome")])
    first = by_stock(store)
    assert first is not None
    second = by_stock(store, ack=(first, first.last_position))
    assert second is not None and second.partition_key == "sku:SKU-9\nwarehouse:Paris"
    # prefetched: acks and the release of what was not handed out go as more_acks / releases
    third = by_stock(store, ack=(second, second.last_position), prefetch=2)
    assert third is not None and third.partition_key == "sku:SKU-1\nwarehouse:Rome"
    store.commit("g", release_prefetched=True)
    acked = {p.partition_key: p.acked_position for p in store.describe_group("g").partitions}
    assert acked == {"sku:SKU-1\nwarehouse:Rome": 0, "sku:SKU-7\nwarehouse:Berlin": 1, "sku:SKU-9\nwarehouse:Paris": 2}
    store.ack(third)
    assert by_stock(store) is None


# -- the guard follows CCC's to_conditions (issue 26 item 4) -----------------------------------------


def test_the_guard_has_one_condition_per_type_and_declared_attribute(store: EventStore) -> None:
    store.append(StockReceived.new(sku="SKU-7", warehouse="Berlin"))
    claim = by_stock(store)
    assert claim is not None
    assert [(list(i.types), list(i.tags)) for i in claim.guard.fail_if_events_match] == [
        (["stock.received"], ["sku:SKU-7"]),
        (["stock.received"], ["warehouse:Berlin"]),
        (["stock.shipped"], ["sku:SKU-7"]),
        (["stock.shipped"], ["warehouse:Berlin"]),
        (["sku.listed"], ["sku:SKU-7"]),  # sku.listed declares no warehouse
    ]
    assert claim.guard.after == 1


def test_the_guard_conflicts_with_an_event_sharing_any_one_attribute(store: EventStore) -> None:
    """(Berlin, SKU-9) shares the warehouse with the claim (Berlin, SKU-7): its guard fails, as
    CCC's does (the conditions are alternatives, not one item that needs both tags)."""
    store.append(StockReceived.new(sku="SKU-7", warehouse="Berlin"))
    claim = by_stock(store)
    assert claim is not None
    store.append(StockReceived.new(sku="SKU-9", warehouse="Berlin"))
    with pytest.raises(AppendConditionError) as info:
        store.append(StockShipped.new(sku="SKU-7", warehouse="Berlin"), claim.guard)
    assert info.value.position == 2


@pytest.mark.parametrize(("concurrent", "conflicts"), [
    (StockReceived.new(sku="SKU-7", warehouse="Paris"), True),  # same sku
    (SkuListed.new(sku="SKU-7"), True),  # a type that declares only one of the attributes
    (StockReceived.new(sku="SKU-9", warehouse="Paris"), False),  # neither attribute
    (SkuListed.new(sku="SKU-9"), False),
    (CourseCreated.new(course_name="Berlin"), False),  # not a handled type
    (EventType("stock.counted", ["sku", "warehouse"]).new(sku="SKU-7", warehouse="Berlin"), False),  # not handled
])
def test_the_guard_conflicts_exactly_when_a_handled_type_shares_a_declared_attribute(
    store: EventStore, concurrent: object, conflicts: bool
) -> None:
    store.append(StockReceived.new(sku="SKU-7", warehouse="Berlin"))
    claim = by_stock(store)
    assert claim is not None
    store.append(concurrent)  # type: ignore[arg-type]
    decision = StockShipped.new(sku="SKU-7", warehouse="Berlin")
    if conflicts:
        with pytest.raises(AppendConditionError):
            store.append(decision, claim.guard)
    else:
        assert store.append(decision, claim.guard) == 3


def test_an_exact_guard_is_an_option(store: EventStore) -> None:
    """exact_guard=True: one item per type over all its declared attributes (all must match)."""
    store.append(StockReceived.new(sku="SKU-7", warehouse="Berlin"))
    claim = by_stock(store, exact_guard=True)
    assert claim is not None
    assert [(list(i.types), list(i.tags)) for i in claim.guard.fail_if_events_match] == [
        (["stock.received"], ["sku:SKU-7", "warehouse:Berlin"]),
        (["stock.shipped"], ["sku:SKU-7", "warehouse:Berlin"]),
        (["sku.listed"], ["sku:SKU-7"]),
    ]
    store.append(StockReceived.new(sku="SKU-9", warehouse="Berlin"))
    assert store.append(StockShipped.new(sku="SKU-7", warehouse="Berlin"), claim.guard) == 3
    with pytest.raises(AppendConditionError):
        store.append(StockShipped.new(sku="SKU-7", warehouse="Berlin"), claim.guard)
