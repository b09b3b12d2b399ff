"""ACLs (slice 3 of issue 18): the decision, their storage by the coordinator, brokers' copies, the CLI."""

from __future__ import annotations

import time

import grpc
import pytest
from click.testing import CliRunner

from dmq.client import AdminClient, Producer
from dmq.client.cli import cli
from dmq.client.errors import DMQError
from dmq.proto.security.acls import Acl, AclSet, Operation, ResourceType
from dmq.proto.server.security.rpc_table import RULES, rule_for
from tests.security.conftest import tls_client, token_for

pytestmark = pytest.mark.timeout(60)
T, G = ResourceType.TOPIC, ResourceType.GROUP


def test_prefix_matches_only_that_prefix():
    acls = AclSet([Acl.parse("alice", "topic", "orders.", "read", pattern_type="prefixed")])
    assert acls.allows("alice", T, "orders.eu", Operation.READ)
    assert acls.allows("alice", T, "orders.", Operation.READ)
    assert not acls.allows("alice", T, "orders", Operation.READ)
    assert not acls.allows("alice", T, "x.orders.eu", Operation.READ)
    assert not acls.allows("alice", G, "orders.eu", Operation.READ)  # another resource type
    assert not acls.allows("bob", T, "orders.eu", Operation.READ)


def test_deny_beats_allow_and_wildcards():
    acls = AclSet([
        Acl.parse("*", "topic", "*", "read"),
        Acl.parse("alice", "topic", "secret.", "read", "deny", "prefixed"),
        Acl.parse("alice", "topic", "secret.plans", "read"),
    ])
    assert acls.allows("alice", T, "public", Operation.READ)
    assert not acls.allows("alice", T, "secret.plans", Operation.READ)  # deny wins over both allows
    assert acls.allows("bob", T, "secret.plans", Operation.READ)
    assert not acls.allows("bob", T, "public", Operation.WRITE)  # no entry, no access


def test_read_write_delete_alter_imply_describe_but_not_each_other():
    acls = AclSet([Acl.parse("alice", "topic", "t", "write")])
    assert acls.allows("alice", T, "t", Operation.DESCRIBE)
    assert not acls.allows("alice", T, "t", Operation.READ)
    assert not AclSet([Acl.parse("alice", "topic", "t", "create")]).allows("alice", T, "t", Operation.DESCRIBE)


@pytest.mark.parametrize("bad", [
    dict(principal="", resource_type="topic", resource_name="t", operation="read"),
    dict(principal="alice", resource_type="queue", resource_name="t", operation="read"),
    dict(principal="alice", resource_type="topic", resource_name="", operation="read"),
    dict(principal="alice", resource_type="topic", resource_name="t", operation="fly"),
    dict(principal="alice", resource_type="cluster", resource_name="other", operation="alter"),
    dict(principal="alice", resource_type="topic", resource_name="*", operation="read", pattern_type="prefixed"),
])
def test_bad_entries_name_the_field(bad):
    with pytest.raises(ValueError):
        Acl.parse(**bad)


def test_every_rpc_of_every_service_is_in_the_table():
    from grpc_health.v1 import health_pb2

    from dmq.proto import dmq_pb2 as pb

    methods = {f"/{s.full_name}/{m.name}" for s in pb.DESCRIPTOR.services_by_name.values() for m in s.methods}
    methods |= {f"/{s.full_name}/{m.name}" for s in health_pb2.DESCRIPTOR.services_by_name.values() for m in s.methods}
    assert methods == set(RULES)
    assert rule_for("/dmq.v1.Broker/NoSuchThing") is None


def _admin(c, certs):
    return AdminClient(c.bootstrap, ssl_cafile=str(certs / "ca.pem"), token=token_for("admin"))


@pytest.mark.slow
def test_acls_cli_and_brokers_follow_changes(secure_cluster, certs, monkeypatch):
    c = secure_cluster("tokens", brokers=2, shared_port=False)
    with _admin(c, certs) as admin:
        admin.create_topic("orders.eu", partitions=2)
    runner = CliRunner()
    monkeypatch.setenv("DMQ_SSL_CAFILE", str(certs / "ca.pem"))
    monkeypatch.setenv("DMQ_TOKEN", token_for("admin"))
    base = ["--bootstrap", c.bootstrap]
    added = runner.invoke(cli, [*base, "acls", "add", "--principal", "alice", "--topic", "orders.", "--prefix",
                                "--operation", "write", "--operation", "describe"])
    assert added.exit_code == 0, added.output
    listed = runner.invoke(cli, [*base, "acls", "list", "-o", "json"])
    assert listed.exit_code == 0 and '"resource_name": "orders."' in listed.output

    # Brokers on their own ports decide with their copy, refreshed from heartbeats (~1 s here).
    def produce_as_alice() -> bool:
        try:
            with Producer(c.bootstrap, ssl_cafile=str(certs / "ca.pem"), token=token_for("alice"),
                          delivery_timeout_ms=3_000, request_timeout_ms=2_000, max_block_ms=2_000) as p:
                p.send("orders.eu", b"x", partition=0).get(5)
                p.send("orders.eu", b"x", partition=1).get(5)
            return True
        except DMQError:
            return False

    deadline = time.monotonic() + 10
    while not produce_as_alice():
        assert time.monotonic() < deadline, "the brokers never took the new ACL"
        time.sleep(0.3)
    removed = runner.invoke(cli, [*base, "acls", "remove", "--principal", "alice", "--topic", "orders.", "--prefix",
                                  "--operation", "write"])
    assert removed.exit_code == 0 and "removed 1" in removed.output
    deadline = time.monotonic() + 10
    while produce_as_alice():
        assert time.monotonic() < deadline, "the brokers never dropped the removed ACL"
        time.sleep(0.3)
    denied = runner.invoke(cli, [*base, "--token", token_for("alice"), "acls", "list"])
    assert denied.exit_code == 1 and "alice" in denied.output and "describe" in denied.output


def test_acls_survive_a_coordinator_restart(certs, tmp_path):
    from dmq.client.cli.runner import ClusterOptions, ClusterThread
    from dmq.proto import dmq_pb2 as pb
    from dmq.proto import dmq_pb2_grpc as pb_grpc
    from dmq.proto.grpc_options import channel_options
    from dmq.proto.security.settings import sync_channel
    from tests.security.conftest import server_security

    def call(bootstrap: str, method: str, request):
        channel = sync_channel(bootstrap, tls_client(certs, token=token_for("admin")), channel_options())
        try:
            return getattr(pb_grpc.MetadataStub(channel), method)(request, timeout=5)
        finally:
            channel.close()

    options = ClusterOptions(data_dir=tmp_path / "c", security=server_security(certs, "tokens"))
    with ClusterThread(options) as c:
        entry = pb.AclEntry(principal="bob", resource_type="group", resource_name="G_", pattern_type="prefixed",
                            operation="read", permission="allow")
        assert call(c.bootstrap, "AddAcls", pb.AddAclsRequest(acls=[entry])).version == 1
        with pytest.raises(grpc.RpcError) as info:
            call(c.bootstrap, "AddAcls", pb.AddAclsRequest(acls=[pb.AclEntry(
                principal="bob", resource_type="topic", resource_name="t", operation="eat")]))
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "acls[0]: operation" in info.value.details()
    with ClusterThread(options) as c:
        listing = call(c.bootstrap, "ListAcls", pb.ListAclsRequest())
        assert listing.version == 1 and [a.principal for a in listing.acls] == ["bob"]
