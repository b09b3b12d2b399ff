"""`dmq topics create --kind event-store`, `dmq events append / read` (JSON lines in and out) and
event-store groups in `dmq groups describe`, against a live `dmq server`."""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.cli.conftest import Dmq


def lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_append_and_read_json_lines(dmq: Dmq) -> None:
    created = dmq.json("topics", "create", "cli-courses", "--kind", "event-store")
    assert created["kind"] == "event-store" and created["partition_count"] == 1
    refused = dmq("topics", "create", "cli-es3", "--kind", "event-store", "-p", "3")
    assert refused.returncode == 1 and "exactly 1 partition" in refused.stderr
    events = [
        {"type": "course.created", "tags": ["course_name:Algebra"], "payload": {"seats": 30}},
        {"type": "user.joined_course", "tags": ["course_name:Algebra", "user_id:joe"], "payload": "hi",
         "metadata": "m"},
        {"type": "blob", "payload_base64": base64.b64encode(b"\xff\x00").decode()},
    ]
    out = dmq.ok("events", "append", "cli-courses", "--batch", "2",
                 input="".join(json.dumps(e) + "\n" for e in events))
    assert lines(out.stdout) == [{"last_position": 2, "events": 2}, {"last_position": 3, "events": 1}]

    everything = lines(dmq.ok("events", "read", "cli-courses").stdout)
    assert [e["position"] for e in everything] == [1, 2, 3]
    assert everything[0]["payload"] == {"seats": 30} and everything[1]["metadata"] == "m"
    assert everything[2]["payload_base64"] == base64.b64encode(b"\xff\x00").decode()
    joined = lines(dmq.ok("events", "read", "cli-courses", "--tag", "user_id:joe").stdout)
    assert [e["type"] for e in joined] == ["user.joined_course"]
    either = lines(dmq.ok("events", "read", "cli-courses", "--type", "blob",
                          "--query", '[{"tags": ["course_name:Algebra"]}]', "--after", "1").stdout)
    assert [e["position"] for e in either] == [2, 3]
    assert [e["position"] for e in lines(dmq.ok("events", "read", "cli-courses", "-n", "1").stdout)] == [1]


def test_a_failed_condition_exits_1_naming_the_position(dmq: Dmq) -> None:
    dmq.ok("topics", "create", "cli-cond", "--kind", "event-store")
    line = json.dumps({"type": "seat.booked", "tags": ["seat:1"]}) + "\n"
    cond = '[{"tags": ["seat:1"]}]'
    assert lines(dmq.ok("events", "append", "cli-cond", "--fail-if-events-match", cond, input=line).stdout) == [
        {"last_position": 1, "events": 1}]
    again = dmq("events", "append", "cli-cond", "--fail-if-events-match", cond, "--after", "0", input=line)
    assert again.returncode == 1 and "position 1" in again.stderr and "nothing appended" in again.stderr
    assert lines(dmq.ok("events", "append", "cli-cond", "--fail-if-events-match", cond, "--after", "1",
                        input=line).stdout)[0]["last_position"] == 2
    bad = dmq("events", "append", "cli-cond", input="not json\n")
    assert bad.returncode == 1 and "line 1" in bad.stderr


def test_event_groups_in_groups_describe(dmq: Dmq) -> None:
    from dmq.client.events import EventStore, EventType

    dmq.ok("topics", "create", "cli-groups", "--kind", "event-store")
    created = EventType("course.created", ["course_name"])
    with EventStore(dmq.bootstrap, "cli-groups") as store:
        store.append([created.new(course_name="Algebra"), created.new(course_name="History")])
        dmq.ok("events", "group", "register", "cli-groups", "billing")
        claim = store.claim_next("billing", ["course_name"], [created], "worker-7")
        assert claim is not None
        doc = dmq.json("groups", "describe", "billing", "--event-store", "cli-groups")
        assert doc["active"] and doc["partition_by"] == ["course_name"] and doc["head"] == 2
        parts = {p["partition_key"]: p for p in doc["partitions"]}
        assert parts["course_name:Algebra"]["claimed_by"] == "worker-7"
        assert parts["course_name:Algebra"]["claimed_since_ms"] > 0
        assert parts["course_name:History"]["claimed_by"] is None and parts["course_name:History"]["pending"] == 1
        table = dmq.ok("groups", "describe", "billing", "--event-store", "cli-groups").stdout
        assert "worker-7" in table and "course_name=History" in table
        dmq.ok("events", "group", "stop", "cli-groups", "billing")
        assert not dmq.json("events", "group", "describe", "cli-groups", "billing")["active"]


def test_a_json_payload_reads_back_as_the_same_json(dmq: Dmq) -> None:
    dmq.ok("topics", "create", "cli-json-payloads", "--kind", "event-store")
    payloads = [{"seats": 30, "tags": ["a"]}, [1, 2], 7, True, None, "hello", '"quoted"', "NaN"]
    dmq.ok("events", "append", "cli-json-payloads",
           input="".join(json.dumps({"type": "t", "payload": p, "metadata": {"by": "cli"}}) + "\n" for p in payloads))
    back = lines(dmq.ok("events", "read", "cli-json-payloads").stdout)
    # null is stored as no payload (empty bytes), read back as the empty string
    assert [e["payload"] for e in back] == [{"seats": 30, "tags": ["a"]}, [1, 2], 7, True, "", "hello", '"quoted"', "NaN"]
    assert {json.dumps(e["metadata"]) for e in back} == {'{"by": "cli"}'}
    as_text = lines(dmq.ok("events", "read", "cli-json-payloads", "--payload-as", "text", "-n", "1").stdout)
    assert as_text[0]["payload"] == '{"seats":30,"tags":["a"]}'
