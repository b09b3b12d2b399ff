"""One conformance suite for the metadata store interface (dmq.coordinator.metastore.base), run on
both backends: SQLite on a real file in tmp_path, and a real etcd (tests/etcd_server.py) under a
fresh key prefix per test. Every record kind's CRUD, persistence across reopen, compare-and-swap
conflicts between two writers, controller-epoch fencing, and (etcd) prefix isolation."""

from __future__ import annotations

import asyncio
import pathlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from dmq.coordinator.metastore.base import (
    BrokerRecord,
    GroupRecord,
    MetadataStore,
    PartitionRecord,
    PrincipalLimitsRecord,
    StoreConflict,
    StoreError,
    TopicExists,
    TopicRecord,
)
from dmq.coordinator.metastore.config import make_metadata_store
from dmq.coordinator.metastore.etcd import EtcdUrlError, parse_etcd_url
from dmq.proto.topic_settings import TopicSettings

pytestmark = pytest.mark.processes  # left out of `make check`

Opener = Callable[[], Awaitable[MetadataStore]]


@pytest.fixture(params=["sqlite", "etcd"])
async def open_store(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> AsyncIterator[Opener]:
    """Opens another store on the same data (the same file, or the same etcd prefix): a reopen, or
    a second coordinator. Every store opened is closed at teardown."""
    url = None if request.param == "sqlite" else request.getfixturevalue("etcd_url")
    opened: list[MetadataStore] = []

    async def make() -> MetadataStore:
        store = make_metadata_store(url, tmp_path)
        await store.open()
        opened.append(store)
        return store

    try:
        yield make
    finally:
        for store in opened:
            await store.close()


def replicated(name: str, partitions: int, rf: int = 3, **config: int) -> TopicRecord:
    states = {
        p: PartitionRecord(tuple((p + i) % 3 + 1 for i in range(rf)), tuple((p + i) % 3 + 1 for i in range(rf)), p % 3 + 1)
        for p in range(partitions)
    }
    return TopicRecord(name, partitions, {}, TopicSettings(**config), created_ms=1_700_000_000_000, creator="alice", states=states)


async def test_brokers_are_upserted_and_survive_a_reopen(open_store: Opener) -> None:
    store = await open_store()
    assert await store.load_brokers() == []
    await store.upsert_broker(BrokerRecord(2, "h2", 9002, 10, rack="r2"))
    await store.upsert_broker(BrokerRecord(1, "h1", 9001, 11))
    await store.upsert_broker(BrokerRecord(2, "h2b", 9012, 12, rack="r3"))
    await store.close()
    again = await open_store()
    assert await again.load_brokers() == [BrokerRecord(1, "h1", 9001, 11), BrokerRecord(2, "h2b", 9012, 12, rack="r3")]


async def test_topics_and_partition_states_round_trip(open_store: Opener) -> None:
    store = await open_store()
    topic = replicated("orders", 3, retention_ms=60_000)
    await store.create_topic(topic)
    await store.create_topic(replicated("orders.eu", 1))
    with pytest.raises(TopicExists):
        await store.create_topic(replicated("orders", 5))
    changed = PartitionRecord((1, 2, 3), (1, 3), 3, leader_epoch=4, partition_epoch=7)
    await store.update_partitions({("orders", 1): changed, ("gone", 0): changed})  # a deleted topic's: ignored
    await store.close()

    again = await open_store()
    (loaded, other) = await again.load_topics()
    assert (loaded.name, other.name) == ("orders", "orders.eu")
    assert loaded.partition_count == 3
    assert loaded.config == topic.config
    assert (loaded.created_ms, loaded.creator) == (topic.created_ms, "alice")
    assert dict(loaded.states) == {**topic.states, 1: changed}
    assert loaded.leader(1) == 3


async def test_add_remove_and_delete(open_store: Opener) -> None:
    store = await open_store()
    await store.create_topic(replicated("t", 2))
    await store.create_topic(replicated("t.x", 2))  # its keys share "t" as a prefix of the name
    await store.add_partitions("t", 4, {2: PartitionRecord((2,), (2,), 2), 3: 1})
    (t, _tx) = await store.load_topics()
    assert t.partition_count == 4 and t.states[3] == PartitionRecord.unreplicated(1)
    await store.remove_partitions("t", 3)
    (t, _tx) = await store.load_topics()
    assert t.partition_count == 3 and sorted(t.states) == [0, 1, 2]
    await store.delete_topic("t")
    await store.close()
    again = await open_store()
    assert [x.name for x in await again.load_topics()] == ["t.x"]
    assert len((await again.load_topics())[0].states) == 2
    await again.create_topic(replicated("t", 1))  # the name is free again, with no leftover partitions
    assert sorted((await again.load_topics())[0].states) == [0]


async def test_a_topic_of_many_partitions(open_store: Opener) -> None:
    """More partitions than one etcd transaction holds (--max-txn-ops 128): created, updated, loaded."""
    store = await open_store()
    await store.create_topic(replicated("big", 300))
    moved = {("big", p): PartitionRecord((1, 2, 3), (1, 2), 2, leader_epoch=1, partition_epoch=1) for p in range(0, 300, 2)}
    await store.update_partitions(moved)
    await store.close()
    (big,) = await (await open_store()).load_topics()
    assert big.partition_count == 300
    assert all(big.states[p] == moved[("big", p)] for p in range(0, 300, 2))
    assert all(big.states[p].leader_epoch == 0 for p in range(1, 300, 2))


async def test_groups_with_generation(open_store: Opener) -> None:
    store = await open_store()
    g = GroupRecord("G_t_app", "t", "app", "new", None, 5, {0: 10, 1: 0}, generation=3)
    await store.save_group(g)
    await store.save_group(GroupRecord("G_t_b", "t", "b", "timestamp", 1234, 6))
    await store.save_group(GroupRecord("G_t_app", "t", "app", "new", None, 5, {0: 10, 1: 0}, generation=4))
    assert await store.delete_group("G_t_b") is True
    assert await store.delete_group("G_t_b") is False
    await store.close()
    (loaded,) = await (await open_store()).load_groups()
    assert loaded == GroupRecord("G_t_app", "t", "app", "new", None, 5, {0: 10, 1: 0}, generation=4)
    assert dict(loaded.start_offsets) == {0: 10, 1: 0}


async def test_acls_and_their_version(open_store: Opener) -> None:
    store = await open_store()
    assert await store.load_acls() == (0, [])
    a = ("User:alice", "TOPIC", "LITERAL", "orders", "READ", "ALLOW")
    b = ("User:bob", "GROUP", "PREFIXED", "G_", "READ", "DENY")
    assert await store.change_acls([a, b, a], [], 1) == 2
    assert await store.change_acls([a], [b, ("User:x", "TOPIC", "LITERAL", "y", "READ", "ALLOW")], 2) == 1
    await store.close()
    assert await (await open_store()).load_acls() == (2, [a])


async def test_more_acl_rows_than_one_etcd_transaction_holds(open_store: Opener) -> None:
    store = await open_store()
    rows = [(f"User:u{i:03d}", "TOPIC", "LITERAL", "t", "READ", "ALLOW") for i in range(300)]
    assert await store.change_acls(rows, [], 1) == 300
    assert await store.change_acls([], rows[:150], 2) == 150
    await store.close()
    assert await (await open_store()).load_acls() == (2, rows[150:])


async def test_principal_limits(open_store: Opener) -> None:
    store = await open_store()
    assert await store.load_principal_limits() is None
    await store.save_principal_limits(PrincipalLimitsRecord(10, 100, ("User:admin",)))
    await store.close()
    assert await (await open_store()).load_principal_limits() == PrincipalLimitsRecord(10, 100, ("User:admin",))


async def test_controller_epoch_fences_the_deposed_coordinator(open_store: Opener) -> None:
    first, second = await open_store(), await open_store()
    assert await first.load_controller_epoch() == 0
    assert await first.claim_controller_epoch() == 1
    await first.upsert_broker(BrokerRecord(1, "h", 1, 1))
    assert await second.claim_controller_epoch() == 2
    # Every kind of write of the deposed one is refused, and changes nothing.
    with pytest.raises(StoreConflict):
        await first.upsert_broker(BrokerRecord(1, "stale", 1, 2))
    with pytest.raises(StoreConflict):
        await first.create_topic(replicated("t", 1))
    with pytest.raises(StoreConflict):
        await first.save_group(GroupRecord("G_t_a", "t", "a", "all", None, 1))
    await second.upsert_broker(BrokerRecord(2, "h2", 2, 2))
    assert await second.load_brokers() == [BrokerRecord(1, "h", 1, 1), BrokerRecord(2, "h2", 2, 2)]
    assert await second.load_topics() == [] and await second.load_groups() == []
    assert await first.load_controller_epoch() == 2
    # Taking control back bumps the epoch again and fences the other.
    assert await first.claim_controller_epoch() == 3
    with pytest.raises(StoreConflict):
        await second.upsert_broker(BrokerRecord(3, "h3", 3, 3))


async def two_writers_of_topic_t(open_store: Opener, partitions: int) -> tuple[MetadataStore, MetadataStore]:
    """Topic t (replicated, with `partitions`) created, then two more openings of the store, each
    having read it: two coordinators about to write the same state."""
    await (await open_store()).create_topic(replicated("t", partitions))
    a, b = await open_store(), await open_store()
    await a.load_topics()
    await b.load_topics()
    return a, b


async def test_two_writers_of_one_partition_state_one_wins(open_store: Opener) -> None:
    a, b = await two_writers_of_topic_t(open_store, 2)
    by_a = PartitionRecord((1, 2, 3), (1, 2), 1, leader_epoch=1, partition_epoch=1)
    by_b = PartitionRecord((1, 2, 3), (2, 3), 2, leader_epoch=1, partition_epoch=1)
    results = await asyncio.gather(
        a.update_partitions({("t", 0): by_a}), b.update_partitions({("t", 0): by_b}), return_exceptions=True
    )
    winners = [r for r in results if r is None]
    losers = [r for r in results if isinstance(r, StoreConflict)]
    assert (len(winners), len(losers)) == (1, 1), results
    stored = (await (await open_store()).load_topics())[0].states[0]
    assert stored == (by_a if results[0] is None else by_b)
    # The winner's view is current: it writes again; the loser stays refused until it reloads.
    winner, loser = (a, b) if results[0] is None else (b, a)
    await winner.update_partitions({("t", 0): PartitionRecord((1, 2, 3), (1, 2, 3), 1, 2, 2)})
    with pytest.raises(StoreConflict):
        await loser.update_partitions({("t", 0): by_b})
    await loser.load_topics()
    await loser.update_partitions({("t", 0): by_b})


async def test_add_partitions_is_conditioned_on_the_topic_read(open_store: Opener) -> None:
    a, b = await two_writers_of_topic_t(open_store, 1)
    await a.add_partitions("t", 2, {1: 1})
    with pytest.raises(StoreConflict):
        await b.add_partitions("t", 3, {1: 2, 2: 2})
    (t,) = await (await open_store()).load_topics()
    assert t.partition_count == 2 and t.states[1] == PartitionRecord.unreplicated(1)


async def test_etcd_prefixes_isolate_clusters(etcd_server: object, etcd_url: str, tmp_path: pathlib.Path) -> None:
    one = make_metadata_store(etcd_url, tmp_path)
    two = make_metadata_store(etcd_url + "-other", tmp_path)
    await one.open()
    await two.open()
    try:
        await one.create_topic(replicated("t", 2))
        await one.upsert_broker(BrokerRecord(1, "h", 1, 1))
        await one.save_group(GroupRecord("G_t_a", "t", "a", "all", None, 1))
        await one.change_acls([("User:a", "TOPIC", "LITERAL", "t", "READ", "ALLOW")], [], 1)
        assert await one.claim_controller_epoch() == 1
        assert await two.load_topics() == [] and await two.load_brokers() == [] and await two.load_groups() == []
        assert await two.load_acls() == (0, []) and await two.load_controller_epoch() == 0
        assert await two.claim_controller_epoch() == 1
        await one.upsert_broker(BrokerRecord(2, "h", 2, 2))  # not fenced by the other cluster's claim
        await two.delete_topic("t")
        assert [t.name for t in await one.load_topics()] == ["t"]
    finally:
        await one.close()
        await two.close()


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("etcd://", "must be host:port"),
        ("etcd://h:0", "must be host:port"),
        ("etcd://h:1,h", "must be host:port"),
        ("etcd://h:1/a b", "prefix"),
        ("etcd://h:1/a//b", "prefix"),
        ("etcd://h:1/x?y=1", "query"),
        ("http://h:1", "scheme"),
    ],
)
def test_bad_etcd_urls_are_named(url: str, message: str) -> None:
    with pytest.raises(EtcdUrlError, match=message):
        parse_etcd_url(url)


def test_etcd_url_forms() -> None:
    assert parse_etcd_url("etcd://a:1,b:2") == ((("a", 1), ("b", 2)), "default")
    assert parse_etcd_url("etcd://[::1]:2379/prod/eu") == ((("::1", 2379),), "prod/eu")


async def test_an_unreachable_etcd_fails_open_with_the_endpoint_named(tmp_path: pathlib.Path) -> None:
    with socket.socket() as s:  # a port bound and not listening: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        store = make_metadata_store(f"etcd://127.0.0.1:{port}/x", tmp_path)
        with pytest.raises(StoreError, match=f"127.0.0.1:{port}"):
            await store.open()
