"""`dmq console` with security on and --no-sign-in: it authenticates with its own token and shows
every viewer only what that principal may describe (the servers decide; the console adds no path
of its own). Per-viewer sign-in, the default with security on: tests/cli/test_console_signin.py."""

from __future__ import annotations

import re

from dmq.client import AdminClient, Producer
from dmq.proto import dmq_pb2 as pb
from dmq.proto.security.acls import CLUSTER_RESOURCE, Acl
from tests.cli._console import ConsoleProcess
from tests.security.conftest import token_for


def test_a_principal_sees_neither_the_topic_nor_the_group_it_may_not_describe(secure_cluster, certs):
    c = secure_cluster("tokens")
    ca = str(certs / "ca.pem")
    with AdminClient(c.bootstrap, ssl_cafile=ca, token=token_for("admin")) as admin:
        for topic in ("open-orders", "hidden-orders"):
            admin.create_topic(topic, partitions=1)
            admin.cluster.group_stub().FindOrCreateGroup(pb.FindOrCreateGroupRequest(topic=topic, app_id="app"),
                                                          timeout=10)
        admin.add_acls([
            Acl.parse("alice", "cluster", CLUSTER_RESOURCE, "describe"),
            Acl.parse("alice", "topic", "open-orders", "describe"),
            Acl.parse("alice", "group", "G_open-orders_app", "describe"),
        ])
        # Both groups exist and the admin sees both: what alice misses is hidden from her only.
        assert {"G_open-orders_app", "G_hidden-orders_app"} <= {g.group_id for g in admin.list_groups()}
    console = ConsoleProcess(c.bootstrap, "--no-sign-in", env={"DMQ_SSL_CAFILE": ca, "DMQ_TOKEN": token_for("alice")})
    try:
        status, topics = console.get("/topics")
        assert status == 200 and "open-orders" in topics and "hidden-orders" not in topics
        status, groups = console.get("/groups")
        assert status == 200 and "G_open-orders_app" in groups and "hidden-orders" not in groups
        status, body = console.get("/topics/hidden-orders")
        assert status == 403 and "may not" in body
        assert console.get("/groups/G_hidden-orders_app")[0] == 403
        assert console.get("/topics/hidden-orders/messages")[0] == 403
        assert console.get("/topics/open-orders")[0] == 200
        assert console.get("/groups/G_open-orders_app")[0] == 200
    finally:
        assert console.stop() == 0, console.stderr


def test_a_console_without_a_token_is_refused_not_broken(secure_cluster, certs):
    c = secure_cluster("tokens")
    console = ConsoleProcess(c.bootstrap, "--no-sign-in", env={"DMQ_SSL_CAFILE": str(certs / "ca.pem")})
    try:
        for path, what in (("/topics", "may not list topics"), ("/groups", "may not list groups")):
            status, body = console.get(path)
            assert status == 200 and what in body, (path, status, body)
        status, body = console.get("/topics/anything")
        assert status == 403 and "requires a token" in body, body
    finally:
        assert console.stop() == 0, console.stderr


def test_resets_only_for_a_principal_allowed_to_and_only_when_enabled(secure_cluster, certs):
    c = secure_cluster("tokens")
    ca = str(certs / "ca.pem")
    admin = AdminClient(c.bootstrap, ssl_cafile=ca, token=token_for("admin"))
    try:
        admin.create_topic("resets", partitions=1)
        with Producer(c.bootstrap, ssl_cafile=ca, token=token_for("admin")) as p:
            for i in range(4):
                p.send("resets", b"v%d" % i, partition=0).get(30)
        group = admin.cluster.group_stub().FindOrCreateGroup(
            pb.FindOrCreateGroupRequest(topic="resets", app_id="app"), timeout=10).group_id
        admin.commit_group_offsets(group, {("resets", 0): 3})
        admin.add_acls([Acl.parse("alice", "topic", "resets", "describe"),
                        Acl.parse("alice", "group", group, "describe")])
        console = ConsoleProcess(c.bootstrap, "--allow-writes", "--no-sign-in",
                                 env={"DMQ_SSL_CAFILE": ca, "DMQ_TOKEN": token_for("alice")})
        try:
            status, page = console.get(f"/groups/{group}")
            token = re.search(r'name="form_token" value="([^"]+)"', page)
            assert status == 200 and token is not None, page
            form = {"to": "earliest", "form_token": token.group(1)}
            status, body = console.post(f"/groups/{group}/reset", form)  # a preview reads only
            assert status == 200 and "Dry run" in body, body
            status, body = console.post(f"/groups/{group}/reset", {**form, "execute": "yes"})
            assert status == 403 and "delete" in body.lower(), body
            assert admin.describe_group(group).committed() == {0: 3}
            # An operator's reset needs DELETE on the group and READ on the topic. One server here
            # (the embedded shape): its interceptor decides with the coordinator's ACLs at once.
            admin.add_acls([Acl.parse("alice", "group", group, "delete"), Acl.parse("alice", "topic", "resets", "read")])
            status, body = console.post(f"/groups/{group}/reset", {**form, "execute": "yes"})
            assert status == 200 and "Done" in body, body
            assert admin.describe_group(group).committed() == {0: 0}
        finally:
            assert console.stop() == 0, console.stderr
    finally:
        admin.close()
