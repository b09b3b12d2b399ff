"""Regression tests for issue 26 item 7: AddAcls refuses entries that can never match.

A principal or a resource name an ACL can never meet (a principal with a newline, which no token
or certificate can name; a topic name no topic can have) was stored and listed as if it granted
something. AddAcls over a real server now answers INVALID_ARGUMENT naming the entry and the field,
and stores nothing; the names follow the rules of dmq.proto.names and check_principal.
"""

from __future__ import annotations

import grpc
import pytest

from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.grpc_options import channel_options
from dmq.proto.security.settings import sync_channel
from tests.security.conftest import tls_client, token_for

pytestmark = pytest.mark.timeout(60)


def _entry(principal: str = "alice", resource_type: str = "topic", name: str = "jobs",
           pattern_type: str = "literal") -> pb.AclEntry:
    return pb.AclEntry(principal=principal, resource_type=resource_type, resource_name=name, operation="read",
                       permission="allow", pattern_type=pattern_type)


def _show(entry: pb.AclEntry) -> str:
    return f"{entry.principal!r} {entry.pattern_type} {entry.resource_type} {entry.resource_name[:20]!r}"


# (entry, the field the refusal must name)
NEVER_MATCHING = [
    (_entry(principal="q\n"), "principal"),  # the issue's: no token or certificate names it
    (_entry(principal="al ice"), "principal"),
    (_entry(name="\u202e"), "resource_name"),  # the topic names: no topic can have them
    (_entry(name="%s%n"), "resource_name"),
    (_entry(name="\ufffd"), "resource_name"),
    (_entry(name="orders/eu"), "resource_name"),
    (_entry(name="."), "resource_name"),
    (_entry(name="t" * 250), "resource_name"),  # topic names are at most 249 bytes
    (_entry(name="\u202e", pattern_type="prefixed"), "resource_name"),  # nor start any
    (_entry(resource_type="group", name="g\nx"), "resource_name"),  # group ids: no control characters
    (_entry(resource_type="group", name="g" * 513), "resource_name"),
]


def test_add_acls_refuses_entries_that_can_never_match(secure_cluster, certs):
    c = secure_cluster("tokens")
    channel = sync_channel(c.bootstrap, tls_client(certs, token=token_for("admin")), channel_options())
    metadata = pb_grpc.MetadataStub(channel)
    try:
        before = metadata.ListAcls(pb.ListAclsRequest(), timeout=10)
        failures = []
        for entry, field in NEVER_MATCHING:
            # after a good entry: the whole request is refused, the good one with it
            request = pb.AddAclsRequest(acls=[_entry(name="fine"), entry])
            try:
                metadata.AddAcls(request, timeout=10)
            except grpc.RpcError as e:
                if e.code() is not grpc.StatusCode.INVALID_ARGUMENT or f"acls[1]: {field}" not in (e.details() or ""):
                    failures.append(f"{_show(entry)}: {e.code().name} {e.details()!r}")
                continue
            failures.append(f"{_show(entry)} was accepted")
        assert not failures, "\n".join(failures)
        assert metadata.ListAcls(pb.ListAclsRequest(), timeout=10) == before
        # Names as the rules allow them still go in: wildcards, prefixes, group ids with spaces.
        good = [_entry(principal="*", name="*"), _entry(name="orders.", pattern_type="prefixed"),
                _entry(resource_type="group", name="G_jobs_billing app"), _entry(resource_type="group", name="*")]
        assert metadata.AddAcls(pb.AddAclsRequest(acls=good), timeout=10).changed == len(good)
    finally:
        channel.close()


def test_a_stored_entry_that_can_never_match_does_not_stop_the_coordinator(certs, tmp_path):
    """Entries stored before the names were checked are left out at load (logged), not fatal."""
    import sqlite3

    from dmq.client.cli.runner import ClusterOptions, ClusterThread
    from dmq.coordinator.node import SQLITE_FILE
    from tests.security.conftest import server_security

    options = ClusterOptions(data_dir=tmp_path / "c", security=server_security(certs, "tokens"))

    def listing(bootstrap: str) -> list[str]:
        channel = sync_channel(bootstrap, tls_client(certs, token=token_for("admin")), channel_options())
        try:
            acls = pb_grpc.MetadataStub(channel).ListAcls(pb.ListAclsRequest(), timeout=10).acls
            return [a.resource_name for a in acls]
        finally:
            channel.close()

    with ClusterThread(options) as c:
        channel = sync_channel(c.bootstrap, tls_client(certs, token=token_for("admin")), channel_options())
        try:
            pb_grpc.MetadataStub(channel).AddAcls(pb.AddAclsRequest(acls=[_entry(name="fine")]), timeout=10)
        finally:
            channel.close()
    (db,) = (tmp_path / "c").rglob(SQLITE_FILE)
    with sqlite3.connect(db) as conn:  # as an older coordinator let it in
        conn.execute("INSERT INTO acls (principal, resource_type, pattern_type, resource_name, operation, permission)"
                     " VALUES ('alice', 'topic', 'literal', '%s%n', 'read', 'allow')")
    conn.close()
    with ClusterThread(options) as c:
        assert listing(c.bootstrap) == ["fine"]
