"""The coordinator's SQLite store (dmq.coordinator.store) on real files in tmp_path."""

from __future__ import annotations

import asyncio
import pathlib
import sqlite3
from collections.abc import AsyncIterator

import pytest

from dmq.coordinator.store import (
    SCHEMA_VERSION,
    BrokerRecord,
    CoordinatorStore,
    GroupRecord,
    StoreError,
    TopicExists,
    TopicRecord,
)
from dmq.proto.topic_settings import TopicSettings


@pytest.fixture
async def store(tmp_path: pathlib.Path) -> AsyncIterator[CoordinatorStore]:
    s = CoordinatorStore(tmp_path / "coordinator.sqlite")
    await s.open()
    try:
        yield s
    finally:
        await s.close()


async def reopened(store: CoordinatorStore) -> CoordinatorStore:
    await store.close()
    again = CoordinatorStore(store.path)
    await again.open()
    return again


def topic(name: str, placement: dict[int, int], **config: int) -> TopicRecord:
    return TopicRecord(name, len(placement), placement, TopicSettings(**config), created_ms=123)


async def test_topics_and_placement_survive_reopen(store: CoordinatorStore) -> None:
    await store.create_topic(topic("b", {0: 1, 1: 2, 2: 3}, retention_ms=1000))
    await store.create_topic(topic("a", {0: 2}))
    store = await reopened(store)
    try:
        loaded = await store.load_topics()
        assert [t.name for t in loaded] == ["a", "b"]
        b = loaded[1]
        assert (b.partition_count, dict(b.placement), b.config, b.created_ms) == (
            3,
            {0: 1, 1: 2, 2: 3},
            TopicSettings(retention_ms=1000),
            123,
        )
        assert b.partitions_on(2) == [1]
    finally:
        await store.close()


async def test_create_existing_topic_fails_and_writes_nothing(store: CoordinatorStore) -> None:
    await store.create_topic(topic("t", {0: 1}))
    with pytest.raises(TopicExists):
        await store.create_topic(topic("t", {0: 2, 1: 2}))
    (loaded,) = await store.load_topics()
    assert dict(loaded.placement) == {0: 1}  # the failed transaction rolled back as a whole


async def test_add_partitions_and_delete(store: CoordinatorStore) -> None:
    await store.create_topic(topic("t", {0: 1}))
    await store.create_topic(topic("u", {0: 1}))
    await store.add_partitions("t", 3, {1: 2, 2: 1})
    loaded = {t.name: t for t in await store.load_topics()}
    assert (loaded["t"].partition_count, dict(loaded["t"].placement)) == (3, {0: 1, 1: 2, 2: 1})
    await store.delete_topic("t")
    store = await reopened(store)
    try:
        assert [t.name for t in await store.load_topics()] == ["u"]
        # Recreating a deleted topic starts from scratch: no placement is left behind.
        await store.create_topic(topic("t", {0: 5}))
        loaded = {t.name: t for t in await store.load_topics()}
        assert dict(loaded["t"].placement) == {0: 5}
    finally:
        await store.close()


async def test_brokers_upsert(store: CoordinatorStore) -> None:
    await store.upsert_broker(BrokerRecord(2, "h2", 9002, 10))
    await store.upsert_broker(BrokerRecord(1, "h1", 9001, 11))
    await store.upsert_broker(BrokerRecord(2, "h2b", 9102, 12))
    store = await reopened(store)
    try:
        brokers = await store.load_brokers()
        assert brokers == [BrokerRecord(1, "h1", 9001, 11), BrokerRecord(2, "h2b", 9102, 12)]
        assert brokers[1].address == "h2b:9102"
    finally:
        await store.close()


async def test_groups_save_load_delete(store: CoordinatorStore) -> None:
    g1 = GroupRecord("G_t_app", "t", "app", "new", None, 500, {0: 7, 1: 0})
    g2 = GroupRecord("G_t_other", "t", "other", "timestamp", 1_000, 600)
    await store.save_group(g1)
    await store.save_group(g2)
    await store.save_group(GroupRecord("G_t_app", "t", "app", "new", None, 500, {0: 7, 1: 0, 2: 3}))
    store = await reopened(store)
    try:
        loaded = await store.load_groups()
        assert [g.group_id for g in loaded] == ["G_t_app", "G_t_other"]
        assert dict(loaded[0].start_offsets) == {0: 7, 1: 0, 2: 3}
        assert loaded[0].subscription_from_ms is None
        assert loaded[1] == g2
        assert await store.delete_group("G_t_app") is True
        assert await store.delete_group("G_t_app") is False
        assert [g.group_id for g in await store.load_groups()] == ["G_t_other"]
    finally:
        await store.close()


async def test_concurrent_writes_do_not_interleave(store: CoordinatorStore) -> None:
    # Each create is two statements or more; interleaved on one connection they would fail or mix.
    await asyncio.gather(*(store.create_topic(topic(f"t{i}", {0: i, 1: i})) for i in range(30)))
    loaded = await store.load_topics()
    assert len(loaded) == 30
    assert all(dict(t.placement) == {0: int(t.name[1:]), 1: int(t.name[1:])} for t in loaded)


async def test_durability_settings(store: CoordinatorStore) -> None:
    with sqlite3.connect(store.path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


async def test_newer_schema_is_refused(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "coordinator.sqlite"
    with sqlite3.connect(path) as raw:
        raw.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    store = CoordinatorStore(path)
    with pytest.raises(StoreError, match="upgrade dmq"):
        await store.open()


async def test_closed_store_says_so(tmp_path: pathlib.Path) -> None:
    store = CoordinatorStore(tmp_path / "x.sqlite")
    with pytest.raises(StoreError, match="not open"):
        await store.load_topics()


def test_topic_record_is_an_immutable_snapshot() -> None:
    placement = {0: 1}
    record = topic("t", placement)
    placement[1] = 2
    assert dict(record.placement) == {0: 1}
    with pytest.raises(TypeError):
        record.placement[0] = 5  # type: ignore[index]
    assert record.leader(0) == 1 and record.leader(9) is None
