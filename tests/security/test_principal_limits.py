"""Topics and partitions one principal may create (deliverable 4 of issue 18): the coordinator
records each topic's creator, counts against it, and refuses past the limits with
RESOURCE_EXHAUSTED naming the principal, the limit and the count."""

from __future__ import annotations

import asyncio
import pathlib
import sqlite3

import grpc
import pytest

from dmq.client.cli.runner import ClusterOptions, ClusterThread
from dmq.coordinator.principal_limits import PrincipalLimits
from dmq.coordinator.store import CoordinatorStore
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.grpc_options import channel_options
from dmq.proto.security.settings import sync_channel
from tests.security.conftest import server_security, tls_client, token_for

pytestmark = pytest.mark.timeout(60)
LIMITS = PrincipalLimits(max_topics=2, max_partitions=3)


def _metadata_stubs(bootstrap: str, certs: pathlib.Path, who: tuple[str, ...]):
    channels = {w: sync_channel(bootstrap, tls_client(certs, token=token_for(w)), channel_options()) for w in who}
    return channels, {w: pb_grpc.MetadataStub(ch) for w, ch in channels.items()}


def _refusal(call, *args) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(*args, timeout=5)
    return info.value


def test_a_principal_is_refused_past_its_topic_and_partition_limits(secure_cluster, certs):
    c = secure_cluster("tokens", principal_limits=LIMITS)
    channels, meta = _metadata_stubs(c.bootstrap, certs, ("admin", "alice", "bob"))
    try:
        for who in ("alice", "bob"):
            meta["admin"].AddAcls(pb.AddAclsRequest(acls=[
                pb.AclEntry(principal=who, resource_type="topic", resource_name="*", operation=op)
                for op in ("create", "alter")]), timeout=5)
        create = lambda who, name, n: meta[who].CreateTopic(pb.CreateTopicRequest(name=name, partitions=n), timeout=5)  # noqa: E731
        create("alice", "a1", 1)
        create("alice", "a2", 1)
        e = _refusal(meta["alice"].CreateTopic, pb.CreateTopicRequest(name="a3", partitions=1))
        assert e.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "'alice'" in e.details() and "2 topics" in e.details() and "max_topics_per_principal" in e.details()

        meta["alice"].AddPartitions(pb.AddPartitionsRequest(name="a1", partitions=2), timeout=5)  # 3 of 3
        e = _refusal(meta["alice"].AddPartitions, pb.AddPartitionsRequest(name="a2", partitions=2))
        assert e.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "'alice'" in e.details() and "holds 3 partitions" in e.details() and "of 3" in e.details()
        # bob growing alice's topic counts against alice, its creator: no way around her limit
        e = _refusal(meta["bob"].AddPartitions, pb.AddPartitionsRequest(name="a2", partitions=2))
        assert e.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and "'alice'" in e.details()
        # nothing changed by the refusals; bob has limits of his own, untouched by alice's
        topics = {t.name: t for t in meta["admin"].ListTopics(pb.ListTopicsRequest(), timeout=5).topics}
        assert sorted(topics) == ["a1", "a2"] and len(topics["a2"].partitions) == 1
        e = _refusal(meta["bob"].CreateTopic, pb.CreateTopicRequest(name="b1", partitions=4))
        assert "'bob'" in e.details() and "holds 0 partitions" in e.details()
        create("bob", "b1", 3)
        # a super-user is exempt, also when growing a limited principal's topic
        for i in range(3):
            create("admin", f"admin-{i}", 2)
        meta["admin"].AddPartitions(pb.AddPartitionsRequest(name="b1", partitions=4), timeout=5)
        # deleting frees the count
        meta["admin"].DeleteTopic(pb.DeleteTopicRequest(name="a1"), timeout=5)
        create("alice", "a3", 1)
    finally:
        for ch in channels.values():
            ch.close()


def test_creators_survive_a_restart_and_security_off_has_no_limits(tmp_path, certs):
    options = ClusterOptions(data_dir=tmp_path / "c", security=server_security(certs, "tokens"), principal_limits=LIMITS)
    thread = ClusterThread(options)
    thread.start()
    try:
        channels, meta = _metadata_stubs(thread.bootstrap, certs, ("admin", "alice"))
        meta["admin"].AddAcls(pb.AddAclsRequest(acls=[
            pb.AclEntry(principal="alice", resource_type="topic", resource_name="*", operation="create")]), timeout=5)
        meta["alice"].CreateTopic(pb.CreateTopicRequest(name="a1", partitions=2), timeout=5)
        for ch in channels.values():
            ch.close()
    finally:
        thread.stop()
    rows = sqlite3.connect(tmp_path / "c" / "coordinator" / "coordinator.sqlite").execute(
        "SELECT name, creator FROM topics").fetchall()
    assert rows == [("a1", "alice")]
    thread = ClusterThread(options)  # the same data: alice's two partitions still count
    thread.start()
    try:
        channels, meta = _metadata_stubs(thread.bootstrap, certs, ("alice",))
        e = _refusal(meta["alice"].CreateTopic, pb.CreateTopicRequest(name="a2", partitions=2))
        assert e.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and "holds 2 partitions" in e.details()
        channels["alice"].close()
    finally:
        thread.stop()
    # security off: no call has a principal, so no limit applies
    plain = ClusterThread(ClusterOptions(data_dir=tmp_path / "plain", principal_limits=LIMITS))
    plain.start()
    try:
        channel = grpc.insecure_channel(plain.bootstrap, options=channel_options())
        stub = pb_grpc.MetadataStub(channel)
        for i in range(3):
            stub.CreateTopic(pb.CreateTopicRequest(name=f"t{i}", partitions=2), timeout=5)
        channel.close()
    finally:
        plain.stop()


def test_an_older_store_gets_the_creator_column(tmp_path):
    path = tmp_path / "coordinator.sqlite"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE topics (name TEXT PRIMARY KEY, partition_count INTEGER NOT NULL,
                             config_json TEXT NOT NULL, created_ms INTEGER NOT NULL);
        CREATE TABLE partitions (topic TEXT NOT NULL, partition INTEGER NOT NULL, broker_id INTEGER NOT NULL,
                                 PRIMARY KEY (topic, partition));
        INSERT INTO topics VALUES ('old', 1, '{}', 5);
        INSERT INTO partitions VALUES ('old', 0, 0);
        PRAGMA user_version = 1;
    """)
    db.close()

    async def load():
        store = CoordinatorStore(path)
        await store.open()
        try:
            return await store.load_topics()
        finally:
            await store.close()

    topics = asyncio.run(load())
    assert [(t.name, t.partition_count, t.created_ms, t.creator) for t in topics] == [("old", 1, 5, None)]
    assert "creator" in [r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(topics)")]
    assert asyncio.run(load())[0].creator is None  # opening again: nothing to add, nothing fails


def test_limits_must_not_be_negative():
    with pytest.raises(ValueError, match="max_topics"):
        PrincipalLimits(max_topics=-1)
