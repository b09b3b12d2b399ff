"""One value grammar for the CLI and the Python client (dmq.proto.values), and `dmq produce`
records as large as the topic allows, against a live `dmq server`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from dmq.client import AdminClient
from dmq.client.errors import InvalidArgumentError

if TYPE_CHECKING:
    from tests.cli.conftest import Dmq, ServerProcess

MIB = 1024 * 1024


def test_python_config_takes_the_cli_units(dmq: Dmq, server: ServerProcess) -> None:
    settings = {"lease_ms": "1s", "segment_bytes": "64MiB", "retention.ms": "7d", "max_message_bytes": "2MB"}
    dmq.ok("topics", "create", "vg-cli", *(f"--config={k}={v}" for k, v in settings.items()))
    with AdminClient(server.bootstrap) as admin:
        admin.create_topic("vg-py", config=settings)
        by_cli = admin.describe_topic("vg-cli").config
        by_python = admin.describe_topic("vg-py").config
        with pytest.raises(InvalidArgumentError, match=r"config\.lease_ms: .*'1 fortnight'.*use ms, s, m, h, d or w"):
            admin.create_topic("vg-bad", config={"lease_ms": "1 fortnight"})
    assert by_python == by_cli
    assert {k: by_python[k] for k in ("lease_ms", "segment_bytes", "retention_ms", "max_message_bytes")} == {
        "lease_ms": 1000, "segment_bytes": 64 * MIB, "retention_ms": 7 * 86_400_000, "max_message_bytes": 2_000_000}


def test_produce_sends_a_record_as_large_as_the_topic_allows(dmq: Dmq) -> None:
    dmq.ok("topics", "create", "vg-big", "--config", "max_message_bytes=8MiB")
    big = "x" * (3 * MIB)
    stored = dmq.json("produce", "vg-big", input=big + "\n")
    assert (stored["messages"], stored["failed"]) == (1, 0), stored
    back = dmq.ok("consume", "vg-big", "--from-beginning", "--max-messages", "1", "--format", "json")
    assert len(json.loads(back.stdout.splitlines()[0])["value"]) == len(big)

    # --max-record-bytes bounds a record below the topic's limit (same size grammar as --config)
    capped = dmq("produce", "vg-big", "--max-record-bytes", "1MiB", "-o", "json", input=big + "\n")
    assert capped.returncode == 1 and json.loads(capped.stdout)["failed"] == 1, capped
    assert "max_record_bytes 1048576" in capped.stderr
    # above the topic's own limit the refusal names the topic's setting
    huge = dmq("produce", "vg-big", "-o", "json", input="y" * (9 * MIB) + "\n")
    assert huge.returncode == 1 and "max_message_bytes" in huge.stderr, huge
    bad = dmq("produce", "vg-big", "--max-record-bytes", "lots", input="z\n")
    assert bad.returncode == 2 and "--max-record-bytes" in bad.stderr and "is not a size" in bad.stderr
