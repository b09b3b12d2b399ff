"""The Spark source reads a secured cluster with the credentials of its options, which override
the DMQ_* environment (issue 18, deliverable 2). The driver's planning and an executor's read are
called directly: the code Spark would run, without a Spark session."""

from __future__ import annotations

import pytest

from dmq.client import AdminClient, Producer
from dmq.client.errors import DMQError
from dmq.proto.security.acls import Acl
from tests.security.conftest import token_for

pytest.importorskip("pyspark")
from dmq.client.spark.options import parse_source_options  # noqa: E402
from dmq.client.spark.reader import DMQBatchReader, read_range  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def test_a_batch_read_uses_the_option_credentials_over_the_environment(secure_cluster, certs, monkeypatch):
    c = secure_cluster("tokens")
    ca = str(certs / "ca.pem")
    with AdminClient(c.bootstrap, ssl_cafile=ca, token=token_for("admin")) as admin:
        admin.create_topic("secured", partitions=2)
        admin.add_acls([Acl.parse("alice", "topic", "secured", "read")])
    with Producer(c.bootstrap, ssl_cafile=ca, token=token_for("admin")) as producer:
        for i in range(20):
            producer.send("secured", f"v{i}".encode(), partition=i % 2)
        producer.flush(10)
    # The environment names bob, who may not read the topic; the options name alice, who may.
    monkeypatch.setenv("DMQ_SSL_CAFILE", ca)
    monkeypatch.setenv("DMQ_TOKEN", token_for("bob"))
    base = {"bootstrap": c.bootstrap, "subscribe": "secured"}
    reader = DMQBatchReader(parse_source_options({**base, "token": token_for("alice")}, streaming=False))
    ranges = reader.plan()  # the driver: metadata and ListOffsets as alice
    values = sorted(v.as_py() for r in ranges for batch in read_range(reader.settings, r)  # an executor's fetches
                    for v in batch.column("value"))
    assert values == sorted(f"v{i}".encode() for i in range(20))
    with pytest.raises(DMQError, match="bob"):  # no token option: the environment's (bob's) is used
        DMQBatchReader(parse_source_options(base, streaming=False)).plan()
