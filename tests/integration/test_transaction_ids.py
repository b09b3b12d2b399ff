"""Transaction ids over real gRPC: a transaction sent again is stored once, across producer and
broker restarts, within the topic's dedup_window_ms; mixed batches; too-long ids refused with the
field named (client and broker)."""

from __future__ import annotations

import time

import grpc
import pytest

from dmq.client import AdminClient, Producer, SimpleConsumer
from dmq.client.cli.runner import ClusterOptions, ClusterThread
from dmq.client.errors import InvalidArgumentError
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import records
from dmq.proto.grpc_options import channel_options
from tests.wall_clock import wait_wall_clock_past, wall_ms

WAIT_S = 10.0


def stored_txns(bootstrap: str, topic: str) -> list[tuple[int, int, str | None]]:
    """(partition, offset, transaction id) of every record of the topic."""
    out = []
    with AdminClient(bootstrap) as admin:
        partitions = admin.describe_topic(topic).partition_count
    with SimpleConsumer(bootstrap, max_wait_ms=0) as c:
        for p in range(partitions):
            end = c.offsets(topic, p)[1]
            for b in c.consume_batches(topic, p, 0, end_offset=end) if end else []:
                for r in b:
                    txn = dict(r.headers).get(records.TXN_HEADER)
                    out.append((p, r.offset, None if txn is None else txn.decode()))
    return out


def test_a_transaction_sent_again_by_a_restarted_producer_is_stored_once(cluster) -> None:  # type: ignore[no-untyped-def]
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("orders", 4)
    with Producer(cluster.bootstrap) as first:
        original = first.send("orders", b"pay 10", transaction_id="ORDER-2024-001234").get(WAIT_S)
        first.send("orders", b"other", transaction_id="ORDER-2024-001235").get(WAIT_S)
    with Producer(cluster.bootstrap) as second:  # a new producer id: only the transaction id matches
        again = second.send("orders", b"pay 10", transaction_id="ORDER-2024-001234").get(WAIT_S)
    assert (again.partition, again.offset) == (original.partition, original.offset)
    txns = [t for _, _, t in stored_txns(cluster.bootstrap, "orders")]
    assert sorted(txns) == ["ORDER-2024-001234", "ORDER-2024-001235"]


def test_a_transaction_sent_again_after_a_broker_restart_is_stored_once(cluster_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    data_dir = tmp_path / "restart"
    with ClusterThread(ClusterOptions(data_dir=data_dir)) as first:
        with AdminClient(first.bootstrap) as admin:
            admin.create_topic("orders", 2)
        with Producer(first.bootstrap) as p:
            original = p.send("orders", b"pay", transaction_id="T-1").get(WAIT_S)
            for i in range(20):
                p.send("orders", b"noise", key=str(i).encode())
    second = cluster_factory(data_dir=data_dir)
    with Producer(second.bootstrap) as p:
        again = p.send("orders", b"pay", transaction_id="T-1").get(WAIT_S)
        fresh = p.send("orders", b"pay", transaction_id="T-2").get(WAIT_S)
    assert (again.partition, again.offset) == (original.partition, original.offset)
    txns = [t for _, _, t in stored_txns(second.bootstrap, "orders") if t is not None]
    assert sorted(txns) == ["T-1", "T-2"]
    assert fresh.offset >= 0


def test_the_window_is_a_topic_setting_and_outside_it_the_id_is_stored_again(cluster) -> None:  # type: ignore[no-untyped-def]
    with AdminClient(cluster.bootstrap) as admin:
        short = admin.create_topic("short", 1, config={"dedup_window_ms": 1_000})
        off = admin.create_topic("off", 1, config={"dedup_window_ms": 0})
        default = admin.create_topic("default", 1)
        assert short.config["dedup_window_ms"] == 1_000 and off.config["dedup_window_ms"] == 0
        assert default.config.get("dedup_window_ms") is None  # the brokers' default: 2 minutes
        with pytest.raises(InvalidArgumentError, match="config.dedup_window_ms.*86400000"):
            admin.create_topic("bad", 1, config={"dedup_window_ms": 86_400_001})
    with Producer(cluster.bootstrap) as p:
        a = p.send("short", b"1", transaction_id="X").get(WAIT_S)
        # within the window (a 300 ms one was not always: two sends on a loaded machine)
        b = p.send("short", b"2", transaction_id="X").get(WAIT_S)
        wait_wall_clock_past(wall_ms() + 1_000)  # past the window, as the broker's clock reads it
        c = p.send("short", b"3", transaction_id="X").get(WAIT_S)
        assert (a.offset, b.offset, c.offset) == (0, 0, 1)
        assert [p.send("off", b"x", transaction_id="X").get(WAIT_S).offset for _ in range(2)] == [0, 1]
        d1 = p.send("default", b"x", transaction_id="X").get(WAIT_S)
        time.sleep(0.5)
        assert p.send("default", b"x", transaction_id="X").get(WAIT_S).offset == d1.offset
    assert len(stored_txns(cluster.bootstrap, "short")) == 2


def test_a_mixed_batch_gives_each_record_its_offset_and_later_batches_go_on(cluster) -> None:  # type: ignore[no-untyped-def]
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("mixed", 1)
    with Producer(cluster.bootstrap, linger_ms=200) as p:
        b0 = p.send("mixed", b"b", transaction_id="B").get(WAIT_S)
        # one batch (linger 200 ms): new, duplicate of the log, no id, duplicate inside the batch, new
        futures = [p.send("mixed", b"x", transaction_id=t) for t in ("A", "B", None, "A", "C")]
        offsets = [f.get(WAIT_S).offset for f in futures]
        # the idempotent producer's next batches are accepted in order (no sequence error)
        later = [p.send("mixed", b"y").get(WAIT_S).offset for _ in range(3)]
        all_dup = [p.send("mixed", b"x", transaction_id=t) for t in ("A", "C")]
        after = p.send("mixed", b"z").get(WAIT_S).offset
    assert b0.offset == 0
    assert offsets == [1, 0, 2, 1, 3]
    assert later == [4, 5, 6]
    assert [f.get(WAIT_S).offset for f in all_dup] == [1, 3]
    assert after == 7
    assert [(o, t) for _, o, t in stored_txns(cluster.bootstrap, "mixed")] == [
        (0, "B"), (1, "A"), (2, None), (3, "C"), (4, None), (5, None), (6, None), (7, None)
    ]


def test_records_with_a_transaction_id_and_no_key_go_to_the_partition_of_the_id(cluster) -> None:  # type: ignore[no-untyped-def]
    from dmq.client._partitioner import crc32_partition

    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("spread", 8)
    with Producer(cluster.bootstrap) as p:
        for i in range(16):
            txn = f"ORDER-{i}"
            assert p.send("spread", b"x", transaction_id=txn).get(WAIT_S).partition == crc32_partition(txn.encode(), 8)


def test_too_long_ids_are_refused_naming_the_field_at_the_client_and_at_the_broker(cluster) -> None:  # type: ignore[no-untyped-def]
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("ids", 1)
        with pytest.raises(InvalidArgumentError, match="trace_id is 256 characters; it must be 1 to 255"):
            admin.find_trace("t" * 256)
    with Producer(cluster.bootstrap) as p:
        with pytest.raises(ValueError, match="transaction_id is 256 characters; it must be 1 to 255"):
            p.send("ids", b"x", transaction_id="x" * 256)
        with pytest.raises(ValueError, match="trace_id must be a W3C trace id: 32 hex digits"):
            p.send("ids", b"x", trace_id="")
        assert p.send("ids", b"x", transaction_id="x" * 255, trace_id="f" * 32).get(WAIT_S).offset == 0
    # A batch built by another client: the broker runs the same rule.
    too_long = records.encode([b"a", b"b"], headers=[[], [(records.TXN_HEADER, b"y" * 300)]])
    with grpc.insecure_channel(cluster.bootstrap, options=channel_options()) as channel:
        broker = pb_grpc.BrokerStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            broker.Produce(pb.ProduceRequest(topic="ids", partition=0, batch=too_long), timeout=WAIT_S)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "record 1: transaction_id is 300 characters; it must be 1 to 255" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            broker.FindTrace(pb.FindTraceRequest(trace_id="t" * 256), timeout=WAIT_S)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "trace_id is 256 characters" in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            broker.FindTrace(pb.FindTraceRequest(trace_id="t", max_records=10_001), timeout=WAIT_S)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "max_records must be within 0..10000" in e.value.details()
    assert len(stored_txns(cluster.bootstrap, "ids")) == 1  # nothing of the refused batch


def test_a_bad_id_given_as_a_reserved_header_is_refused_before_it_joins_a_batch(cluster) -> None:  # type: ignore[no-untyped-def]
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("hdr", 1)
    with Producer(cluster.bootstrap, linger_ms=50) as p:
        good = p.send("hdr", b"ok", headers={"dmq.txn": b"H-1"})
        with pytest.raises(ValueError, match="header 'dmq.trace' is 300 characters; it must be 1 to 255"):
            p.send("hdr", b"bad", headers={"dmq.trace": b"t" * 300})
        assert good.get(WAIT_S).offset == 0  # its batch was not poisoned
        assert p.send("hdr", b"again", headers={"dmq.txn": b"H-1"}).get(WAIT_S).offset == 0  # de-duplicated
