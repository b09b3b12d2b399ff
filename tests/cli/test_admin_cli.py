"""`dmq topics` and `dmq brokers` against a live `dmq server`: human and JSON output, error paths."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.cli.conftest import Dmq, ServerProcess


def test_topics_create_list_describe_human_and_json(dmq: Dmq) -> None:
    created = dmq.ok("topics", "create", "cli-orders", "--partitions", "3", "--config", "retention.ms=7d",
                     "-c", "segment_bytes=64MiB")
    assert "Created topic cli-orders with 3 partitions." in created.stdout

    listing = dmq.ok("topics", "list")
    row = next(line for line in listing.stdout.splitlines() if line.startswith("cli-orders "))
    assert row.split()[:3] == ["cli-orders", "3", "0"]  # name, partitions, messages
    assert "7d" in row

    doc = dmq.json("topics", "list")
    entry = next(t for t in doc["topics"] if t["name"] == "cli-orders")
    assert entry["partition_count"] == 3
    assert entry["messages"] == 0
    assert entry["config"]["retention_ms"] == 7 * 24 * 3600 * 1000
    assert entry["config"]["segment_bytes"] == 64 * 1024 * 1024
    assert entry["config"]["max_message_bytes"] is None
    assert set(entry) >= {"name", "partition_count", "created_ms", "messages", "size_bytes", "config"}

    described = dmq.ok("topics", "describe", "cli-orders")
    assert "Topic cli-orders" in described.stdout
    assert re.search(r"^\s*2\s+0 \(127\.0\.0\.1:\d+\)\s+alive\s+0\s+0\s+0\s+0 B", described.stdout, re.M), described
    assert "retention_ms" in described.stdout and "(7d)" in described.stdout

    d = dmq.json("topics", "describe", "cli-orders")
    assert d["name"] == "cli-orders" and d["partition_count"] == 3
    assert [p["partition"] for p in d["partitions"]] == [0, 1, 2]
    for p in d["partitions"]:
        assert p["leader_id"] == 0 and p["leader_alive"] is True
        assert (p["log_start_offset"], p["log_end_offset"], p["messages"], p["size_bytes"]) == (0, 0, 0, 0)
        assert p["leader_address"] == dmq.bootstrap


def test_topics_create_twice_and_if_not_exists(dmq: Dmq) -> None:
    dmq.ok("topics", "create", "cli-twice")
    again = dmq("topics", "create", "cli-twice")
    assert again.returncode == 1
    assert again.stderr.strip() == (
        "Error: topic 'cli-twice' already exists (add --if-not-exists to accept an existing one)"
    )
    quiet = dmq.ok("topics", "create", "cli-twice", "--if-not-exists", "-o", "json")
    assert quiet.json()["created"] is False


def test_topics_alter_increases_and_refuses_decrease(dmq: Dmq) -> None:
    dmq.ok("topics", "create", "cli-grow", "-p", "2")
    grown = dmq.ok("topics", "alter", "cli-grow", "--partitions", "4")
    assert "2 -> 4 partitions" in grown.stdout
    assert dmq.json("topics", "describe", "cli-grow")["partition_count"] == 4

    shrink = dmq("topics", "alter", "cli-grow", "--partitions", "3")
    assert shrink.returncode == 1
    assert shrink.stdout == ""
    lines = shrink.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "has 4 partitions and partitions can only be added: ask for more than 4" in lines[0]

    same = dmq("topics", "alter", "cli-grow", "--partitions", "4")
    assert same.returncode == 1 and "already has 4 partitions" in same.stderr


def test_topics_delete(dmq: Dmq) -> None:
    dmq.ok("topics", "create", "cli-doomed")
    assert dmq.json("topics", "delete", "cli-doomed") == {"deleted": "cli-doomed"}
    assert "cli-doomed" not in [t["name"] for t in dmq.json("topics", "list")["topics"]]
    gone = dmq("topics", "delete", "cli-doomed")
    assert gone.returncode == 1 and "not found" in gone.stderr
    assert dmq.ok("topics", "delete", "cli-doomed", "--if-exists").returncode == 0


def test_unknown_topic_is_one_line_exit_1(dmq: Dmq) -> None:
    for args in (("topics", "describe", "no-such-topic"), ("topics", "alter", "no-such-topic", "-p", "9")):
        result = dmq(*args)
        assert result.returncode == 1, result
        assert result.stdout == ""
        assert result.stderr.strip() == "Error: topic 'no-such-topic' not found (see `dmq topics list`)"


def test_invalid_topic_name_is_refused_before_sending(dmq: Dmq) -> None:
    for bad in ("has space", "a/b", "x" * 250, ".."):
        result = dmq("topics", "create", bad)
        assert result.returncode == 1, result
        assert result.stderr.startswith("Error: invalid topic name: "), result
        assert len(result.stderr.strip().splitlines()) == 1


def test_usage_errors_exit_2(dmq: Dmq, dmq_bare: Any) -> None:
    cases = [
        ("topics", "create"),                                   # missing NAME
        ("topics", "create", "t", "--partitions", "0"),         # out of range
        ("topics", "create", "t", "--partitions", "many"),
        ("topics", "create", "t", "--config", "retention_ms"),  # not key=value
        ("topics", "create", "t", "--config", "colour=blue"),   # unknown key
        ("topics", "create", "t", "--config", "retention_ms=7 fortnights"),
        ("topics", "list", "-o", "yaml"),
        ("topics", "frobnicate"),
        ("no-such-command",),
    ]
    for args in cases:
        result = dmq(*args)
        assert result.returncode == 2, result
        assert result.stdout == ""
    bad_bootstrap = dmq_bare("--bootstrap", "nowhere", "topics", "list")
    assert bad_bootstrap.returncode == 2 and "HOST:PORT" in bad_bootstrap.stderr


def test_brokers_list(dmq: Dmq, server: ServerProcess) -> None:
    dmq.ok("topics", "create", "cli-brokers", "-p", "2")
    doc = dmq.json("brokers", "list")
    [broker] = doc["brokers"]
    assert broker["broker_id"] == 0
    assert broker["address"] == server.bootstrap
    assert broker["alive"] is True
    assert broker["partitions_led"] >= 2
    assert broker["last_heartbeat_ms"] > 0
    human = dmq.ok("brokers", "list")
    assert re.search(rf"^\s*0\s+{re.escape(server.bootstrap)}\s+alive\s+", human.stdout, re.M), human


def test_server_down_is_one_line_naming_the_address(dmq_bare: Any, unused_address: str) -> None:
    address = unused_address
    expected = (f"Error: cannot reach the coordinator at {address} — is `dmq server` running? "
                "(point elsewhere with --bootstrap HOST:PORT or DMQ_BOOTSTRAP)")
    # One command of each family (they share the Session / describe-first code paths).
    for args in (("topics", "create", "x"), ("brokers", "list"), ("groups", "reset-offsets", "G_x_y", "--to-earliest"),
                 ("topics", "describe", "x", "-o", "json"), ("produce", "x"), ("consume", "x", "--group", "app"),
                 ("bench", "produce", "-t", "x")):
        result = dmq_bare(*args, bootstrap=address, timeout_s=20)
        assert result.returncode == 1, result
        assert result.stdout == ""
        assert result.stderr.strip() == expected, result
    via_env = dmq_bare("topics", "list", env={"DMQ_BOOTSTRAP": address})
    assert via_env.returncode == 1 and address in via_env.stderr


def test_help_explains_every_flag_with_its_default(dmq_bare: Any) -> None:
    for command in ("server", "coordinator", "broker"):
        import click

        from dmq.client.cli import cli

        cmd = cli.get_command(click.Context(cli), command)
        assert cmd is not None
        for param in cmd.params:
            if not isinstance(param, click.Option) or param.name == "help":
                continue
            assert param.help, f"dmq {command} {param.opts[0]} has no help text"
            assert param.required or param.is_flag or param.show_default, f"{command} {param.opts[0]} hides its default"
        result = dmq_bare(command, "--help")
        assert result.returncode == 0 and "[default:" in result.stdout


TOPIC_KEYS = {"name", "partition_count", "created_ms", "kind", "messages", "size_bytes", "config"}
PARTITION_KEYS = {"partition", "leader_id", "leader_address", "leader_alive", "log_start_offset", "log_end_offset",
                  "messages", "size_bytes", "segment_count", "error", "status", "status_detail",
                  "replicas", "isr", "leader_epoch", "under_replicated"}
CONFIG_KEYS = {"retention_ms", "retention_bytes", "segment_bytes", "segment_ms", "max_message_bytes",
               "dedup_window_ms", "delay_ms", "max_wait_ms", "window_buffer_ms", "lease_ms", "max_delivery_attempts",
               "max_queue_size", "replication_factor", "min_insync_replicas", "unclean_leader_election"}
BROKER_KEYS = {"broker_id", "address", "host", "port", "alive", "last_heartbeat_ms", "partitions_led",
               "rack", "partitions_followed", "partitions_under_replicated"}


def test_json_schemas_are_stable(dmq: Dmq) -> None:
    """Scripts depend on these keys: renaming or removing one must fail here (adding is fine: extend)."""
    dmq.ok("topics", "create", "cli-schema", "-p", "2")
    listed = dmq.json("topics", "list")
    assert set(listed) == {"topics"}
    for t in listed["topics"]:
        assert set(t) == TOPIC_KEYS and set(t["config"]) == CONFIG_KEYS
    described = dmq.json("topics", "describe", "cli-schema")
    assert set(described) == TOPIC_KEYS | {"partitions"}
    assert all(set(p) == PARTITION_KEYS for p in described["partitions"])
    assert set(dmq.json("topics", "alter", "cli-schema", "-p", "3")) == TOPIC_KEYS | {"partitions"}
    assert set(dmq.json("topics", "create", "cli-schema", "--if-not-exists")) == TOPIC_KEYS | {"partitions", "created"}
    brokers = dmq.json("brokers", "list")
    assert set(brokers) == {"brokers"} and all(set(b) == BROKER_KEYS for b in brokers["brokers"])
