"""`dmq produce`, `dmq consume` (without a group) and `dmq bench` against a live `dmq server`."""

from __future__ import annotations

import json
import pathlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.cli.conftest import Dmq


def _records(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines()]


def test_produce_stdin_with_keys_and_headers_then_consume_json(dmq: Dmq) -> None:
    dmq.ok("topics", "create", "cli-kv", "-p", "3")
    produced = dmq.ok("produce", "cli-kv", "--key-separator", ":", "--header", "source=test", "-H", "n=1",
                      input="alice:order-1\nerin:order-2\nmallory:order-3\r\n:no-key-text\n")
    assert "Produced 4 messages" in produced.stderr
    assert produced.stdout == ""

    consumed = dmq.ok("consume", "cli-kv", "--from-beginning", "--max-messages", "4", "--format", "json")
    records = _records(consumed.stdout)
    assert len(records) == 4
    by_key = {r["key"]: r for r in records}
    assert by_key["alice"]["value"] == "order-1"
    assert by_key["mallory"]["value"] == "order-3"  # the \r of a CRLF line ending is not part of it
    assert by_key[""]["value"] == "no-key-text"
    # keys spread by crc32 % 3: alice -> 2, erin -> 0, mallory -> 1
    assert (by_key["alice"]["partition"], by_key["erin"]["partition"], by_key["mallory"]["partition"]) == (2, 0, 1)
    for r in records:
        assert r["topic"] == "cli-kv"
        assert r["headers"] == [{"name": "source", "value": "test"}, {"name": "n", "value": "1"}]
        assert isinstance(r["offset"], int) and r["timestamp"] > 0
    assert "Processed 4 messages." in consumed.stderr

    text = dmq.ok("consume", "cli-kv", "-p", "2", "--offset", "0", "--max-messages", "1", "--print-key",
                  "--print-offset", "--separator", "|")
    assert text.stdout == "2:0|alice|order-1\n"


def test_produce_file_to_one_partition_with_json_summary(dmq: Dmq, tmp_path: pathlib.Path) -> None:
    dmq.ok("topics", "create", "cli-file", "-p", "2")
    path = tmp_path / "lines.txt"
    path.write_text("".join(f"line-{i}\n" for i in range(500)))
    summary = dmq.ok("produce", "cli-file", "--file", str(path), "--partition", "1", "--progress",
                     "--compression", "zstd", "-o", "json").json()
    assert summary["messages"] == 500 and summary["failed"] == 0
    assert summary["partitions"] == {"1": 500}
    assert summary["bytes"] == path.stat().st_size

    values = dmq.ok("consume", "cli-file", "--partition", "1", "--offset", "498", "--timeout-ms", "300")
    assert values.stdout.splitlines() == ["line-498", "line-499"]
    nothing = dmq.ok("consume", "cli-file", "--partition", "0", "--offset", "earliest", "--timeout-ms", "200")
    assert nothing.stdout == "" and "Processed 0 messages." in nothing.stderr
    described = dmq.json("topics", "describe", "cli-file")
    assert [p["log_end_offset"] for p in described["partitions"]] == [0, 500]
    assert described["messages"] == 500 and described["size_bytes"] > 0


def test_consume_without_from_beginning_tails_new_messages_only(dmq: Dmq) -> None:
    dmq.ok("topics", "create", "cli-tail")
    dmq.ok("produce", "cli-tail", input="old\n")
    tail = dmq.ok("consume", "cli-tail", "--timeout-ms", "300")
    assert tail.stdout == ""


def test_produce_and_consume_errors(dmq: Dmq) -> None:
    dmq.ok("topics", "create", "cli-errs", "-p", "2")
    missing_sep = dmq("produce", "cli-errs", "--key-separator", ":", input="a:1\nno separator here\n")
    assert missing_sep.returncode == 1
    assert "not every line was stored: 1 stored, 0 failed, 1 not sent, of 2 lines read" in missing_sep.stderr
    assert "line 2 has no key separator ':'" in missing_sep.stderr

    for args in (("produce", "no-such-topic"), ("consume", "no-such-topic", "--timeout-ms", "100")):
        result = dmq(*args, input="x\n")
        assert result.returncode == 1, result
        assert result.stderr.strip().endswith("Error: topic 'no-such-topic' not found (see `dmq topics list`)")

    bad_partition = dmq("consume", "cli-errs", "--partition", "7", "--offset", "0")
    assert bad_partition.returncode == 1 and "no partition 7" in bad_partition.stderr
    out_of_range = dmq("consume", "cli-errs", "--partition", "0", "--offset", "99")
    assert out_of_range.returncode == 1 and "offset 99 is outside cli-errs[0]'s log 0..0" in out_of_range.stderr

    for args in (("consume", "cli-errs", "--offset", "3"),                      # --offset needs --partition
                 ("consume", "cli-errs", "--group", "g", "--partition", "0"),
                 ("consume", "cli-errs", "-p", "0", "--offset", "0", "--from-beginning"),
                 ("consume", "cli-errs", "-p", "0", "--offset", "-5"),
                 ("consume", "cli-errs", "--format", "xml"),
                 ("produce", "cli-errs", "--header", "novalue"),
                 ("produce", "cli-errs", "--file", "/no/such/file")):
        result = dmq(*args, input="")
        assert result.returncode == 2, result


def test_bench_produce_and_consume(dmq: Dmq) -> None:
    produced = dmq.json("bench", "produce", "--topic", "cli-bench", "--num-records", "3000", "--record-size", "64",
                        "--partitions", "2", "--report-interval-ms", "100")
    assert produced["records"] == 3000 and produced["bytes"] == 3000 * 64 and produced["errors"] == 0
    assert produced["msgs_per_s"] > 0 and produced["mb_per_s"] > 0
    lat = produced["latency_ms"]
    assert lat["samples"] == 3000
    assert 0 <= lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["p999"] <= lat["max"]
    assert dmq.json("topics", "describe", "cli-bench")["messages"] == 3000

    consumed = dmq.json("bench", "consume", "--topic", "cli-bench")
    assert consumed["records"] == 3000 and consumed["bytes"] == 3000 * 64
    assert consumed["fetch_latency_ms"]["samples"] == consumed["fetches"] >= 1

    human = dmq.ok("bench", "produce", "-t", "cli-bench", "-n", "500", "--throughput", "5000")
    assert "msgs/s" in human.stdout and "MB/s" in human.stdout and "latency p99" in human.stdout
    limited = dmq.json("bench", "produce", "-t", "cli-bench", "-n", "400", "--throughput", "2000", "--no-progress")
    assert limited["elapsed_s"] >= 0.15  # 400 records at 2000/s take about 0.2 s
    partial = dmq.json("bench", "consume", "-t", "cli-bench", "-n", "10")
    assert partial["records"] == 10

    empty = dmq("bench", "consume", "-t", "cli-bench-empty-topic")
    assert empty.returncode == 1 and "not found" in empty.stderr
