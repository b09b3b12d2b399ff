"""Quotas (token buckets per principal, throttling by delay) and audit events (slice 5 of issue 18)."""

from __future__ import annotations

import statistics
import threading
import time

import grpc
import pytest
import structlog

from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import records
from dmq.proto.grpc_options import channel_options
from dmq.proto.security.quotas import Quotas, QuotaSettings, Rates
from dmq.proto.security.settings import sync_channel
from tests.security.conftest import tls_client, token_for

pytestmark = pytest.mark.timeout(60)
RATE = 256 * 1024  # alice's produce quota, bytes/s


def test_bucket_delays_by_the_debt_and_caps_the_delay():
    now = [0.0]
    q = Quotas(QuotaSettings(principals={"alice": Rates(produce_bytes_per_s=1000)}, max_delay_ms=2_000),
               clock=lambda: now[0])
    assert q.delay_s("alice", "produce", 1000) == 0.0  # the one-second burst
    assert q.delay_s("alice", "produce", 500) == pytest.approx(0.5)
    now[0] += 0.5  # paid back
    assert q.delay_s("alice", "produce", 100) == pytest.approx(0.1)
    assert q.delay_s("alice", "produce", 10_000) == 2.0  # capped at max_delay_ms
    assert q.delay_s("bob", "produce", 10**9) == 0.0  # no quota for bob: never delayed
    with pytest.raises(ValueError, match="produce_bytes_per_s"):
        Rates(produce_bytes_per_s=-1)


def _produce(stub, topic: str, size: int) -> float:
    started = time.perf_counter()
    stub.Produce(pb.ProduceRequest(topic=topic, partition=0, batch=records.encode([b"x" * size])), timeout=20)
    return time.perf_counter() - started


def test_a_greedy_producer_is_slowed_to_its_rate_and_others_are_not(secure_cluster, certs):
    c = secure_cluster("tokens", quotas=QuotaSettings(principals={"alice": Rates(produce_bytes_per_s=RATE)}))
    channels = {who: sync_channel(c.bootstrap, tls_client(certs, token=token_for(who)), channel_options())
                for who in ("admin", "alice")}
    try:
        stubs = {who: pb_grpc.BrokerStub(ch) for who, ch in channels.items()}
        meta = pb_grpc.MetadataStub(channels["admin"])
        meta.CreateTopic(pb.CreateTopicRequest(name="greedy", partitions=1), timeout=5)
        meta.CreateTopic(pb.CreateTopicRequest(name="small", partitions=1), timeout=5)
        meta.AddAcls(pb.AddAclsRequest(acls=[pb.AclEntry(principal="alice", resource_type="topic",
                                                          resource_name="greedy", operation="write")]), timeout=5)
        unloaded = [_produce(stubs["admin"], "small", 100) for _ in range(15)]

        sent = [0]
        stop = threading.Event()

        def flood() -> None:
            while not stop.is_set():
                _produce(stubs["alice"], "greedy", 64 * 1024)
                sent[0] += 64 * 1024

        flooder = threading.Thread(target=flood)
        started = time.monotonic()
        flooder.start()
        time.sleep(0.5)
        loaded = [_produce(stubs["admin"], "small", 100) for _ in range(15)]
        time.sleep(max(0.0, 3.0 - (time.monotonic() - started)))
        stop.set()
        flooder.join(15)
        elapsed = time.monotonic() - started
    finally:
        for ch in channels.values():
            ch.close()
    # alice: her burst (one second of rate) plus the rate over the run, plus the batch in flight
    assert sent[0] <= RATE * (elapsed + 1) + 64 * 1024, (sent[0], elapsed)
    assert sent[0] >= RATE * 0.5 * elapsed  # slowed, not stopped
    print(f"greedy {sent[0] / elapsed / 1024:.0f} KiB/s (quota {RATE / 1024:.0f}); other producer "
          f"p50 {statistics.median(unloaded) * 1000:.1f} ms unloaded, {statistics.median(loaded) * 1000:.1f} ms loaded")
    # The other principal is not throttled: its median latency within 2x of unloaded (+2 ms of noise).
    assert statistics.median(loaded) <= 2 * statistics.median(unloaded) + 0.002


def test_admin_operations_are_audited_with_principal_and_outcome(secure_cluster, certs):
    c = secure_cluster("tokens")
    with structlog.testing.capture_logs() as logs:
        for who in ("admin", "alice"):
            channel = sync_channel(c.bootstrap, tls_client(certs, token=token_for(who)), channel_options())
            try:
                pb_grpc.MetadataStub(channel).CreateTopic(pb.CreateTopicRequest(name="audited", partitions=1), timeout=5)
            except grpc.RpcError as e:
                assert e.code() is grpc.StatusCode.PERMISSION_DENIED
            finally:
                channel.close()
    audits = [(e["principal"], e["method"], e["outcome"]) for e in logs if e.get("event") == "audit"]
    assert ("admin", "CreateTopic", "OK") in audits
    assert ("alice", "CreateTopic", "PERMISSION_DENIED") in audits
    assert all(token_for("admin")[:20] not in str(e) for e in logs)
