"""`dmq queues describe` / `dmq queues list` against a real `dmq server`, with real queue state:
a leased partition, a pending record with a failure, dead letters, a max_queue_size."""

from __future__ import annotations

from dmq.client import Producer, QueueConsumer
from tests.cli.conftest import Dmq

WAIT_S = 10.0


def test_describe_and_list_show_depth_limit_leases_and_dead_letters(dmq: Dmq) -> None:
    dmq.ok("topics", "create", "cli-queue", "-p", "2", "--config", "max_queue_size=100",
           "--config", "max_delivery_attempts=1")
    with Producer(dmq.bootstrap, linger_ms=0) as p:
        for i in range(6):
            p.send("cli-queue", b"job-%d" % i, partition=i % 2)
        p.flush(WAIT_S)
    with QueueConsumer(dmq.bootstrap, "cli-queue", "workers", max_records=1, lease_ms=60_000) as q:
        poisoned = q.pop(timeout=WAIT_S)
        assert poisoned is not None
        assert q.nack(poisoned, "KeyError: 'sku'").dead_lettered  # max_delivery_attempts=1
        held = q.pop(timeout=WAIT_S)
        assert held is not None

        d = dmq.json("queues", "describe", "cli-queue", "-o", "json")
        assert d["topic"] == "cli-queue" and d["partition_count"] == 2
        assert d["depth"] == 5 and d["max_queue_size"] == 100 and d["remaining"] == 95
        assert d["partitions_leased"] == 1 and d["utilisation_pct"] == 50.0
        assert d["dead_letters"] == 1 and d["dead_letter_topic"] == "cli-queue.dlq"
        [lease] = d["leases"]
        assert lease["group"] == "workers" and lease["partition"] == held.partition and lease["records"] == 1
        assert 50 < lease["seconds_left"] <= 60 and d["expiring_soon"] == []
        assert {g["group"] for g in d["groups"]} == {"workers"}

        assert dmq.json("queues", "describe", "cli-queue", "--group", "nobody", "-o", "json")["groups"] == []
        listed = dmq.json("queues", "list", "-o", "json")
        assert "cli-queue" in [x["topic"] for x in listed["queues"]]

        text = dmq.ok("queues", "describe", "cli-queue").stdout
        assert "depth 5" in text and "leased 1/2" in text and "workers" in text
        assert "cli-queue" in dmq.ok("queues", "list").stdout
        q.ack(held)

    dead = dmq.ok("consume", "cli-queue.dlq", "--from-beginning", "--max-messages", "1", "--format", "json").stdout
    assert "KeyError" in dead


def test_describe_of_a_missing_topic_is_one_clear_error(dmq: Dmq) -> None:
    result = dmq("queues", "describe", "no-such-queue")
    assert result.returncode == 1 and "no-such-queue" in result.stderr
