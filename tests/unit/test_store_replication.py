"""The store's replication state (dmq.coordinator.store): partition states survive a reopen, a
file written before replication loads as unreplicated partitions, broker racks are kept."""

from __future__ import annotations

import pathlib
import sqlite3

from dmq.coordinator.store import BrokerRecord, CoordinatorStore, PartitionRecord, TopicRecord
from dmq.proto.topic_settings import TopicSettings


async def test_states_and_racks_survive_reopen(tmp_path: pathlib.Path) -> None:
    store = CoordinatorStore(tmp_path / "c.sqlite")
    await store.open()
    states = {0: PartitionRecord((1, 2, 3), (1, 2, 3), 1), 1: PartitionRecord((2, 3, 1), (2, 3, 1), 2)}
    await store.create_topic(TopicRecord("t", 2, {}, TopicSettings(replication_factor=3), states=states))
    await store.upsert_broker(BrokerRecord(1, "h", 1, 5, rack="r1"))
    await store.update_partitions({("t", 0): PartitionRecord((1, 2, 3), (2, 3), 2, 1, 1), ("gone", 0): states[0]})
    await store.add_partitions("t", 3, {2: PartitionRecord((3, 1, 2), (3, 1, 2), 3)})
    await store.close()
    again = CoordinatorStore(tmp_path / "c.sqlite")
    await again.open()
    try:
        (t,) = await again.load_topics()
        assert dict(t.states) == {
            0: PartitionRecord((1, 2, 3), (2, 3), 2, 1, 1),
            1: states[1],
            2: PartitionRecord((3, 1, 2), (3, 1, 2), 3),
        }
        assert dict(t.placement) == {0: 2, 1: 2, 2: 3}
        assert t.replicas_on(1) == [0, 1, 2] and t.partitions_on(2) == [0, 1]
        assert [b.rack for b in await again.load_brokers()] == ["r1"]
    finally:
        await again.close()


async def test_a_file_from_before_replication_loads_unreplicated(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as db:  # the schema as released before replication
        db.executescript(
            """
            CREATE TABLE brokers (broker_id INTEGER PRIMARY KEY, host TEXT NOT NULL, port INTEGER NOT NULL,
                                  registered_ms INTEGER NOT NULL);
            CREATE TABLE topics (name TEXT PRIMARY KEY, partition_count INTEGER NOT NULL, config_json TEXT NOT NULL,
                                 created_ms INTEGER NOT NULL);
            CREATE TABLE partitions (topic TEXT NOT NULL, partition INTEGER NOT NULL, broker_id INTEGER NOT NULL,
                                     PRIMARY KEY (topic, partition));
            INSERT INTO brokers VALUES (4, 'h', 9, 1);
            INSERT INTO topics VALUES ('old', 2, '{}', 1);
            INSERT INTO partitions VALUES ('old', 0, 4), ('old', 1, 5);
            PRAGMA user_version = 1;
            """
        )
    store = CoordinatorStore(path)
    await store.open()
    try:
        (t,) = await store.load_topics()
        assert dict(t.states) == {0: PartitionRecord((4,), (4,), 4, 0, 0), 1: PartitionRecord((5,), (5,), 5, 0, 0)}
        assert t.config.replication_factor is None  # read as 1 by the controller
        (b,) = await store.load_brokers()
        assert b.rack == ""
        await store.update_partitions({("old", 0): PartitionRecord((4, 5), (4,), 4, 0, 1)})
        (t,) = await store.load_topics()
        assert t.states[0] == PartitionRecord((4, 5), (4,), 4, 0, 1)
    finally:
        await store.close()
