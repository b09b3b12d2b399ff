"""Issue 13: topic admin on a full disk, the coordinator's or a broker's.

Before the fix the coordinator's SQLite on a full disk answered INTERNAL, and a broker refusing
CreatePartitions (RESOURCE_EXHAUSTED "disk full on broker N") was logged and swallowed: the topic
was reported created, listed, and had no partitions on the broker. Now both answer
RESOURCE_EXHAUSTED with the disk-full reason, nothing is half-created, and a retry once space is
freed succeeds. The coordinator here is real (in process, real SQLite on a small tmpfs); the
brokers are the recording FakeBrokers of test_metadata.py, one of them refusing like a full broker.
"""

from __future__ import annotations

import asyncio
import pathlib
import socket
import sys
from collections.abc import Callable

import grpc
import pytest
from test_metadata import FakeBroker, Harness, leaders
from test_metadata import harness as harness  # noqa: F401 - the fixture

from dmq.client import AdminClient
from dmq.client import errors as client_errors
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import error_details

pytestmark = [pytest.mark.processes, pytest.mark.timeout(60)]


class FullBroker(FakeBroker):
    """Answers CreatePartitions as a broker whose disk is full does, while `full` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.full = True

    async def CreatePartitions(self, request, context):  # noqa: N802
        if self.full:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "disk full on broker 2: t[1]: create failed: ENOSPC; retry once space is freed",
                trailing_metadata=((error_details.REASON_KEY, error_details.DISK_FULL),),
            )
        return await super().CreatePartitions(request, context)


async def add_full_broker(h: Harness, broker_id: int) -> FullBroker:
    broker = FullBroker()
    await broker.start()
    h.brokers[broker_id] = broker
    await h.register(broker_id)
    return broker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reason(e: grpc.aio.AioRpcError) -> str | None:
    return error_details.reason_of(e.trailing_metadata())


async def rpc_error(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    return info.value


async def topic_names(h: Harness) -> list[str]:
    return [t.name for t in (await h.stub.ListTopics(pb.ListTopicsRequest(), timeout=5)).topics]


async def test_broker_disk_full_on_create_is_passed_on_and_leaves_no_topic(harness: Harness) -> None:
    healthy = await harness.add_broker(1)
    full = await add_full_broker(harness, 2)
    # RF 1: the partitions split over the two brokers (with RF 2 each would be on both)
    err = await rpc_error(harness.create("t", 4, replication_factor=1))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
    assert reason(err) == error_details.DISK_FULL
    assert "disk full on broker 2" in err.details() and "'t'" in err.details()
    # nothing half-created: not listed, not on disk, and the healthy broker's partitions removed again
    assert await topic_names(harness) == []
    assert healthy.created_partitions("t") and [list(r.partitions) for r in healthy.deleted] == [
        healthy.created_partitions("t")
    ]
    await harness.restart_coordinator()
    assert await topic_names(harness) == []
    # space freed: the same request succeeds
    await harness.register(1)
    await harness.register(2)
    full.full = False
    info = await harness.create("t", 4, replication_factor=1)
    assert sorted(set(leaders(info))) == [1, 2]
    assert full.created_partitions("t") == sorted(p for p, b in enumerate(leaders(info)) if b == 2)


async def test_broker_disk_full_on_add_partitions_keeps_the_old_count(harness: Harness) -> None:
    await harness.add_broker(1)
    full = await add_full_broker(harness, 2)
    full.full = False
    await harness.create("t", 1)
    full.full = True
    err = await rpc_error(harness.stub.AddPartitions(pb.AddPartitionsRequest(name="t", partitions=3), timeout=5))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and reason(err) == error_details.DISK_FULL
    assert (await harness.describe("t")).partition_count == 1
    await harness.restart_coordinator()
    assert (await harness.describe("t")).partition_count == 1
    await harness.register(1)
    await harness.register(2)
    full.full = False
    assert (await harness.stub.AddPartitions(pb.AddPartitionsRequest(name="t", partitions=3), timeout=5)).partition_count == 3



async def test_a_refusal_the_store_cannot_undo_says_how_it_completes(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both disks full (the broker refuses, and the coordinator cannot delete the row again): the
    topic stands, the answer says so and how it completes; the broker's next registration does it."""
    from dmq.coordinator.store import StoreFullError

    healthy = await harness.add_broker(1)
    full = await add_full_broker(harness, 2)

    async def store_full(name: str) -> None:
        raise StoreFullError("disk full on the coordinator (coordinator.sqlite: database or disk is full)")

    monkeypatch.setattr(harness.node.store, "delete_topic", store_full)
    err = await rpc_error(harness.create("t", 2, replication_factor=1))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and reason(err) == error_details.DISK_FULL
    assert "disk full on broker 2" in err.details() and "restart broker 2" in err.details(), err.details()
    assert await topic_names(harness) == ["t"]
    assert healthy.deleted == []  # its partition stays: the topic does
    on_2 = [p for p, b in enumerate(leaders(await harness.describe("t"))) if b == 2]
    full.full = False
    response = await harness.register(2)
    assert [(r.topic, list(r.partitions)) for r in response.partitions] == [("t", on_2)]

# -- the coordinator's own disk ------------------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmpfs):  # type: ignore[no-untyped-def]
    return tmpfs("2m")


async def cli(bootstrap: str, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dmq.client.cli", "--bootstrap", bootstrap, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode or 0, out.decode(errors="replace")


async def test_coordinator_disk_full_is_resource_exhausted_and_retriable(
    small_tmpfs: pathlib.Path, fill_disk: Callable[..., None]
) -> None:
    h = Harness(small_tmpfs / "coordinator")
    await h.start_coordinator()
    filler = small_tmpfs / "filler"
    try:
        await h.add_broker(1)
        await h.create("kept", 1)
        groups = pb_grpc.GroupCoordinatorStub(h.channel)
        fill_disk(filler)
        for call in (
            h.create("t", 2),
            h.stub.AddPartitions(pb.AddPartitionsRequest(name="kept", partitions=2), timeout=5),
            groups.FindOrCreateGroup(
                pb.FindOrCreateGroupRequest(topic="kept", app_id="app", subscription_mode=pb.SUBSCRIPTION_MODE_ALL),
                timeout=5,
            ),
        ):
            err = await rpc_error(call)
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
            assert reason(err) == error_details.DISK_FULL
            assert "disk full on the coordinator" in err.details()
        # nothing changed
        assert await topic_names(h) == ["kept"]
        assert (await h.describe("kept")).partition_count == 1
        # the client library and the CLI: a DiskFullError / one line with the reason, exit 1
        bootstrap = h.node.advertised_address
        admin = AdminClient(bootstrap, request_timeout_ms=5_000)
        try:
            with pytest.raises(client_errors.DiskFullError, match="disk full on the coordinator"):
                await asyncio.to_thread(admin.create_topic, "t", 2)
        finally:
            admin.close()
        code, out = await cli(bootstrap, "topics", "create", "t", "-p", "2")
        assert code == 1, out
        lines = [line for line in out.splitlines() if line.strip()]
        assert len(lines) == 1 and "disk full on the coordinator" in lines[0], out
        # space freed: the same requests succeed, and survive a restart
        filler.unlink()
        await h.create("t", 2)
        await h.stub.AddPartitions(pb.AddPartitionsRequest(name="kept", partitions=2), timeout=5)
        await h.restart_coordinator()
        assert await topic_names(h) == ["kept", "t"]
        assert (await h.describe("kept")).partition_count == 2
    finally:
        await h.close()


async def test_a_broker_registering_while_the_coordinators_disk_is_full_waits_and_then_registers(
    small_tmpfs: pathlib.Path, fill_disk: Callable[..., None],
) -> None:
    """A broker's first registration is a write: with the coordinator's disk full it is refused,
    and the broker keeps retrying (before, the refusal ended `dmq broker`, and `--brokers N` with it)."""
    from dmq.broker.node import BrokerNode

    h = Harness(small_tmpfs / "coordinator")
    await h.start_coordinator()
    filler = small_tmpfs / "filler"
    broker = BrokerNode(small_tmpfs.parent / "broker-5", broker_id=5, coordinator_address=h.node.advertised_address,
                        advertised_host="127.0.0.1", advertised_port=free_port())
    try:
        fill_disk(filler)
        start = asyncio.create_task(broker.start())
        await asyncio.sleep(1.5)
        assert not start.done(), start.exception() if start.done() else None
        assert [b.broker_id for b in (await h.stub.ListBrokers(pb.ListBrokersRequest(), timeout=5)).brokers] == []
        filler.unlink()
        await asyncio.wait_for(start, 10)
        assert broker.ready
        alive = {b.broker_id: b.alive for b in (await h.stub.ListBrokers(pb.ListBrokersRequest(), timeout=5)).brokers}
        assert alive == {5: True}
    finally:
        await broker.stop()
        await h.close()
