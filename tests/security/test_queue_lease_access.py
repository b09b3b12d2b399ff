"""Regression tests for issue 26 item 5: queue leases are not open to anyone with a token.

Seen: a principal with DESCRIBE on `jobs` read the admin's lease ids from QueueDescribe; one with
no ACL at all renewed them for 600 s, rejected offset 0 into `jobs.dlq` (which it may not write)
and acked them, moving group `workers` past records nobody processed. Now a lease id is shown
only to those who may read the group and the topic (as QueuePop needs), every lease RPC needs
that same READ on the lease's topic and group (the ack riding on a pop too), and a reject also
WRITE on the dead-letter topic. Real servers with tokens, raw stubs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import records
from dmq.proto.grpc_options import channel_options
from dmq.proto.security.settings import sync_channel
from tests.security.conftest import tls_client, token_for

pytestmark = pytest.mark.timeout(120)


class As:
    """Raw stubs with one principal's token."""

    def __init__(self, address: str, certs: Any, principal: str) -> None:
        self.channel = sync_channel(address, tls_client(certs, token=token_for(principal)), channel_options())
        self.metadata = pb_grpc.MetadataStub(self.channel)
        self.broker = pb_grpc.BrokerStub(self.channel)


def _grant(admin: As, principal: str, *grants: tuple[str, str, str]) -> None:
    admin.metadata.AddAcls(pb.AddAclsRequest(acls=[
        pb.AclEntry(principal=principal, resource_type=rt, resource_name=name, operation=op, permission="allow")
        for rt, name, op in grants]), timeout=10)


def _code(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    try:
        call()
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


@pytest.fixture
def jobs(secure_cluster, certs) -> Iterator[tuple[Callable[[str], As], As, str]]:
    """A cluster with topic `jobs` holding 2 records, and the admin's live lease on both for
    group `workers`: (connect(principal), admin, lease id)."""
    c = secure_cluster("tokens")
    opened: list[As] = []

    def connect(principal: str) -> As:
        opened.append(As(c.bootstrap, certs, principal))
        return opened[-1]

    admin = connect("admin")
    admin.metadata.CreateTopic(pb.CreateTopicRequest(name="jobs", partitions=1), timeout=10)
    admin.broker.Produce(pb.ProduceRequest(topic="jobs", partition=0, batch=records.encode([b"a", b"b"])), timeout=10)
    popped = admin.broker.QueuePop(pb.QueuePopRequest(topic="jobs", group="workers", max_records=2, timeout_ms=5000,
                                                      lease_ms=120_000), timeout=10)
    assert popped.lease_id and popped.end_offset == 2
    yield connect, admin, popped.lease_id
    for caller in opened:
        caller.channel.close()


def _workers(caller: As) -> pb.QueueGroupPartition:
    (row,) = [r for r in caller.broker.QueueDescribe(pb.QueueDescribeRequest(topic="jobs"), timeout=10).groups
              if r.group == "workers"]
    return row


def test_describe_shows_lease_ids_only_to_the_groups_readers(jobs):
    connect, admin, lease_id = jobs
    _grant(admin, "dana", ("topic", "jobs", "describe"))
    _grant(admin, "alice", ("topic", "jobs", "read"), ("group", "workers", "read"))
    seen = _workers(connect("dana"))
    assert seen.lease_id == ""  # the secret of the worker that popped
    assert seen.lease_records == 2 and seen.lease_expiry_ms > 0  # the lease itself is no secret
    assert _workers(connect("alice")).lease_id == lease_id  # a reader could pop it anyway
    assert _workers(admin).lease_id == lease_id


def test_lease_rpcs_need_read_on_the_leases_topic_and_group(jobs):
    connect, admin, lease_id = jobs
    before = _workers(admin)
    # eve: no ACL on jobs at all, but may use a queue of her own (so the riding ack is checked
    # against the lease, not against the pop's topic and group); dana: describe only.
    admin.metadata.CreateTopic(pb.CreateTopicRequest(name="mine", partitions=1), timeout=10)
    _grant(admin, "eve", ("topic", "mine", "read"), ("group", "eves", "read"))
    _grant(admin, "dana", ("topic", "jobs", "describe"), ("group", "workers", "describe"))
    failures = []
    for who in ("eve", "dana"):
        b = connect(who).broker
        hostile = {
            "renew for 600 s": lambda b=b: b.QueueRenew(pb.QueueRenewRequest(lease_id=lease_id, lease_ms=600_000), timeout=10),
            "reject offset 0": lambda b=b: b.QueueReject(pb.QueueRejectRequest(lease_id=lease_id, offset=0, error="x"), timeout=10),
            "nack": lambda b=b: b.QueueNack(pb.QueueNackRequest(lease_id=lease_id, error="x"), timeout=10),
            "ack": lambda b=b: b.QueueAck(pb.QueueAckRequest(lease_id=lease_id), timeout=10),
            "ack riding on a pop": lambda b=b: b.QueuePop(pb.QueuePopRequest(
                topic="mine", group="eves", max_records=1, timeout_ms=0, ack_lease_id=lease_id), timeout=10),
        }
        for what, call in hostile.items():
            code, details = _code(call)
            if code is not grpc.StatusCode.PERMISSION_DENIED or who not in details:
                failures.append(f"{who} {what}: {code.name} {details!r}")
    assert not failures, "\n".join(failures)
    after = _workers(admin)  # nothing moved: same progress, same lease, same expiry
    assert (after.acked_offset, after.lease_id, after.lease_expiry_ms, after.delivery_count) == \
        (before.acked_offset, before.lease_id, before.lease_expiry_ms, before.delivery_count) == (0, lease_id, before.lease_expiry_ms, 0)
    topics = [t.name for t in admin.metadata.ListTopics(pb.ListTopicsRequest(), timeout=10).topics]
    assert "jobs.dlq" not in topics
    # the lease is still the admin's to finish
    assert admin.broker.QueueAck(pb.QueueAckRequest(lease_id=lease_id), timeout=10).acked_offset == 2


def test_a_reject_also_needs_write_on_the_dead_letter_topic(jobs):
    connect, admin, lease_id = jobs
    _grant(admin, "alice", ("topic", "jobs", "read"), ("group", "workers", "read"))
    alice = connect("alice").broker
    reject = pb.QueueRejectRequest(lease_id=lease_id, offset=0, error="poison")
    code, details = _code(lambda: alice.QueueReject(reject, timeout=10))
    assert code is grpc.StatusCode.PERMISSION_DENIED and "jobs.dlq" in details, (code, details)
    assert _workers(admin).acked_offset == 0
    # a reader may renew, nack and ack (what a worker does); with write on the DLQ, reject too
    assert alice.QueueRenew(pb.QueueRenewRequest(lease_id=lease_id, lease_ms=60_000), timeout=10).expiry_ms > 0
    _grant(admin, "alice", ("topic", "jobs.dlq", "write"))
    answer = alice.QueueReject(reject, timeout=10)
    assert (answer.acked_offset, answer.dlq_topic) == (1, "jobs.dlq")
    assert alice.QueueAck(pb.QueueAckRequest(lease_id=lease_id), timeout=10).acked_offset == 2
