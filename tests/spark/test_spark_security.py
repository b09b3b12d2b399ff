"""The source and sink in a real Spark session against a TLS + token cluster, with the Kafka names
of the security options (issue 32 item 2: "security options work on executors"). The reads and
writes run in Spark's Python workers, processes of their own as executors are: the CA file and the
token reach them through the options, not through this process's environment."""

from __future__ import annotations

import pytest
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException

from dmq.client import AdminClient, Producer, SimpleConsumer
from dmq.proto.security.acls import Acl
from tests.security.conftest import certs, secure_cluster, token_for  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]


def test_kafka_security_options_reach_the_workers_for_reads_and_writes(spark, secure_cluster, certs, monkeypatch):  # noqa: F811
    c = secure_cluster("tokens")
    ca = str(certs / "ca.pem")
    admin_token = token_for("admin")
    with AdminClient(c.bootstrap, ssl_cafile=ca, token=admin_token) as admin:
        admin.create_topic("spark-secured", partitions=2)
        admin.create_topic("spark-secured-copy", partitions=2)
        admin.add_acls([Acl.parse("alice", "topic", "spark-secured", "read")])
    values = [f"v{i}".encode() for i in range(40)]
    with Producer(c.bootstrap, ssl_cafile=ca, token=admin_token) as producer:
        for i, v in enumerate(values):
            producer.send("spark-secured", v, partition=i % 2)
        producer.flush(30)
    for name in ("DMQ_SSL_CAFILE", "DMQ_TOKEN", "DMQ_SSL_CERTFILE", "DMQ_SSL_KEYFILE"):
        monkeypatch.delenv(name, raising=False)
    secured = {"kafka.bootstrap.servers": c.bootstrap, "kafka.security.protocol": "SSL",
               "kafka.ssl.ca.location": ca}

    def read(token: str | None) -> list[bytes]:
        options = {**secured, "subscribe": "spark-secured"}
        if token is not None:
            options["kafka.sasl.mechanism"] = "OAUTHBEARER"
            options["kafka.sasl.oauthbearer.token"] = token
        df = spark.read.format("dmq").options(**options).load()
        return sorted(bytes(r.value) for r in df.select("value").collect())

    assert read(token_for("alice")) == sorted(values)  # alice may read it
    with pytest.raises((PySparkException, Py4JJavaError), match="bob"):  # bob may not: refused, by name
        read(token_for("bob"))
    with pytest.raises((PySparkException, Py4JJavaError), match="(?i)token|unauthenticated"):
        read(None)  # TLS but no token: the cluster wants one

    # The sink: the workers produce with the options' credentials (admin may write anywhere).
    rows = spark.createDataFrame([(v,) for v in values], "value binary").repartition(2)
    rows.write.format("dmq").options(**secured, **{"topic": "spark-secured-copy",
                                                   "kafka.sasl.oauthbearer.token": admin_token}).mode("append").save()
    with SimpleConsumer(c.bootstrap, ssl_cafile=ca, token=admin_token, max_wait_ms=0) as consumer:
        copied = [r.value for p in (0, 1) for r in consumer.consume("spark-secured-copy", p, 0, max_records=1000)]
    assert sorted(copied) == sorted(values)
