"""`dmq groups` and `dmq consume --group` against a live `dmq server`: lag, resets, deletes, refusals."""

from __future__ import annotations

import datetime as dt
import signal
import subprocess

from tests.cli.conftest import WAIT_S, Dmq, wait_for


def _produce_spread(dmq: Dmq, topic: str, n: int) -> None:
    # Keys spread over 2 partitions by crc32 % 2.
    dmq.ok("produce", topic, "--key-separator", ":", input="".join(f"k{i}:v{i}\n" for i in range(n)))


def test_group_lag_describe_list_reset_delete(dmq: Dmq) -> None:
    dmq.ok("topics", "create", "g-orders", "-p", "2")
    _produce_spread(dmq, "g-orders", 10)
    consumed = dmq.ok("consume", "g-orders", "--group", "app1", "--max-messages", "4")
    assert len(consumed.stdout.splitlines()) == 4
    group = "G_g-orders_app1"

    d = dmq.json("groups", "describe", group)
    assert d["group_id"] == group and d["topic"] == "g-orders"
    assert d["members"] == [] and d["state"] == "EMPTY"
    assert isinstance(d["generation"], int)
    assert d["subscription"]["mode"] == "all" and d["subscription"]["created_ms"] > 0
    assert [p["partition"] for p in d["partitions"]] == [0, 1]
    assert sum(p["log_end_offset"] for p in d["partitions"]) == 10
    assert d["total_lag"] == 6 == sum(p["lag"] for p in d["partitions"])
    assert sum(p["committed_offset"] or 0 for p in d["partitions"]) == 4

    human = dmq.ok("groups", "describe", group)
    assert f"Group {group}" in human.stdout and "topic g-orders" in human.stdout
    assert "Total lag: 6" in human.stdout and "Members: none" in human.stdout
    assert "Subscription: all, since" in human.stdout

    listed = dmq.json("groups", "list")
    [row] = [g for g in listed["groups"] if g["group_id"] == group]
    assert row == {"group_id": group, "topic": "g-orders", "state": "EMPTY", "generation": d["generation"],
                   "member_count": 0, "total_lag": 6}
    assert any(line.split()[:3] == [group, "g-orders", "EMPTY"] and line.split()[-1] == "6"
               for line in dmq.ok("groups", "list").stdout.splitlines())
    assert dmq.json("groups", "list", "--topic", "nothing-here")["groups"] == []

    # A dry run shows the plan and changes nothing.
    dry = dmq.ok("groups", "reset-offsets", group, "--to-earliest")
    assert "Dry run: nothing changed. Add --execute to apply." in dry.stdout
    assert dmq.json("groups", "describe", group)["total_lag"] == 6

    done = dmq.ok("groups", "reset-offsets", group, "--to-earliest", "--execute")
    assert "Done:" in done.stdout
    assert dmq.json("groups", "describe", group)["total_lag"] == 10

    ends = {p["partition"]: p["log_end_offset"] for p in d["partitions"]}
    dmq.ok("groups", "reset-offsets", group, "--to-latest", "--partitions", "1", "--execute")
    after = {p["partition"]: p for p in dmq.json("groups", "describe", group)["partitions"]}
    assert after[1]["committed_offset"] == ends[1] and after[0]["committed_offset"] == 0

    shifted = dmq.json("groups", "reset-offsets", group, "--shift-by", "-1", "--partitions", "1", "--execute")
    assert shifted["partitions"][0]["new_offset"] == ends[1] - 1
    clamped = dmq.json("groups", "reset-offsets", group, "--to-offset", "1000", "--execute")
    assert [(p["new_offset"], p["clamped"]) for p in clamped["partitions"]] == [(ends[0], True), (ends[1], True)]
    assert dmq.json("groups", "describe", group)["total_lag"] == 0

    future = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).isoformat()
    assert [p["new_offset"] for p in dmq.json("groups", "reset-offsets", group, "--to-datetime", future)["partitions"]] \
        == [ends[0], ends[1]]  # a dry run (JSON: "executed": false); nothing was appended after tomorrow
    dmq.ok("groups", "reset-offsets", group, "--to-datetime", "2000-01-01T00:00:00Z", "--execute")
    assert dmq.json("groups", "describe", group)["total_lag"] == 10

    # The group re-reads everything after the rewind.
    again = dmq.ok("consume", "g-orders", "--group", group, "--max-messages", "10", "--timeout-ms", "20000")
    assert sorted(again.stdout.split()) == sorted(f"v{i}" for i in range(10))
    assert dmq.json("groups", "describe", group)["total_lag"] == 0

    assert dmq.json("groups", "delete", group) == {"deleted": group}
    gone = dmq("groups", "describe", group)
    assert gone.returncode == 1 and "not found" in gone.stderr
    assert dmq.ok("groups", "delete", group, "--if-exists").returncode == 0


def test_reset_and_delete_refused_while_the_group_has_members(dmq: Dmq, dmq_exe: str) -> None:
    dmq.ok("topics", "create", "g-busy", "-p", "2")
    _produce_spread(dmq, "g-busy", 4)
    group = "G_g-busy_live"
    consumer = subprocess.Popen([dmq_exe, "--bootstrap", dmq.bootstrap, "consume", "g-busy", "--group", "live"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        d = wait_for(lambda: (lambda g: g if g["members"] and g["state"] == "STABLE" else None)(
            dmq.json("groups", "describe", group) if dmq("groups", "describe", group).returncode == 0 else
            {"members": [], "state": ""}), "the consumer to join")
        [member] = d["members"]
        assert member["client_id"] == "dmq-cli-consume"
        assert sorted(member["partitions"]) == [0, 1]
        assert all(p["owner_member_id"] == member["member_id"] for p in d["partitions"])
        human = dmq.ok("groups", "describe", group).stdout
        assert "Members (1)" in human and "dmq-cli-consume" in human

        for args in (("groups", "reset-offsets", group, "--to-earliest"),
                     ("groups", "reset-offsets", group, "--to-earliest", "--execute")):
            refused = dmq(*args)
            assert refused.returncode == 1, refused
            assert refused.stderr.strip() == (
                f"Error: group {group} has 1 active member(s) (dmq-cli-consume); offsets can only be reset while it "
                "is empty: stop its consumers (or wait for their session timeout) and retry")
        busy_delete = dmq("groups", "delete", group)
        assert busy_delete.returncode == 1 and len(busy_delete.stderr.strip().splitlines()) == 1
        # The running consumer commits what it printed about once a second.
        wait_for(lambda: dmq.json("groups", "describe", group)["total_lag"] == 0, "the consumer to commit")
    finally:
        consumer.send_signal(signal.SIGINT)  # commits what it printed and leaves the group
        try:
            out, err = consumer.communicate(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            # Killed and reaped here: a process left running (and its pipes unclosed) would fail a
            # later test with a ResourceWarning instead of this one.
            consumer.kill()
            consumer.communicate()
            raise
    assert consumer.returncode == 0, err
    assert sorted(out.split()) == ["v0", "v1", "v2", "v3"]
    wait_for(lambda: dmq.json("groups", "describe", group)["members"] == [], "the member to leave")
    assert dmq.json("groups", "describe", group)["total_lag"] == 0
    dmq.ok("groups", "reset-offsets", group, "--to-earliest", "--execute")
    assert dmq.json("groups", "describe", group)["total_lag"] == 4


def test_group_error_paths(dmq: Dmq) -> None:
    unknown = dmq("groups", "describe", "G_nothing_here")
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert "not found" in unknown.stderr and "dmq groups list" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1
    assert dmq("groups", "reset-offsets", "G_nothing_here", "--to-earliest").returncode == 1

    dmq.ok("topics", "create", "g-errs")
    dmq.ok("produce", "g-errs", input="x\n")
    dmq.ok("consume", "g-errs", "--group", "e", "--max-messages", "1")
    bad_partition = dmq("groups", "reset-offsets", "G_g-errs_e", "--to-earliest", "--partitions", "3")
    assert bad_partition.returncode == 1 and "no partition 3" in bad_partition.stderr

    for args in (("groups", "reset-offsets", "G_g-errs_e"),                                  # no strategy
                 ("groups", "reset-offsets", "G_g-errs_e", "--to-earliest", "--to-latest"),
                 ("groups", "reset-offsets", "G_g-errs_e", "--to-offset", "1", "--shift-by", "2"),
                 ("groups", "reset-offsets", "G_g-errs_e", "--to-datetime", "last tuesday"),
                 ("groups", "reset-offsets", "G_g-errs_e", "--to-offset", "-4"),
                 ("groups", "reset-offsets", "G_g-errs_e", "--to-earliest", "--partitions", "x"),
                 ("groups", "describe"),
                 ("groups", "list", "-o", "csv")):
        result = dmq(*args)
        assert result.returncode == 2, result
        assert result.stdout == ""


def test_group_json_schemas_are_stable(dmq: Dmq) -> None:
    """Scripts depend on these keys: renaming or removing one must fail here (adding is fine: extend)."""
    dmq.ok("topics", "create", "g-schema")
    dmq.ok("produce", "g-schema", input="a\nb\n")
    dmq.ok("consume", "g-schema", "--group", "s", "--max-messages", "1")
    group = "G_g-schema_s"
    listed = dmq.json("groups", "list")
    assert set(listed) == {"groups"}
    assert all(set(g) == {"group_id", "topic", "state", "generation", "member_count", "total_lag"}
               for g in listed["groups"])
    d = dmq.json("groups", "describe", group)
    assert set(d) == {"group_id", "topic", "state", "generation", "subscription", "members", "partitions", "total_lag"}
    assert set(d["subscription"]) == {"mode", "from_ms", "created_ms"}
    assert all(set(p) == {"partition", "committed_offset", "log_end_offset", "lag", "owner_member_id",
                          "owner_client_id"} for p in d["partitions"])
    plan = dmq.json("groups", "reset-offsets", group, "--to-latest")
    assert plan["executed"] is False and plan["strategy"] == "to-latest"
    assert set(plan) == {"group_id", "topic", "executed", "strategy", "partitions"}
    assert all(set(p) == {"partition", "current_offset", "new_offset", "log_start_offset", "log_end_offset",
                          "lag_after", "clamped"} for p in plan["partitions"])
    assert dmq.json("groups", "delete", group) == {"deleted": group}


def test_describe_takes_the_app_name_that_consume_takes(dmq: Dmq) -> None:
    for topic in ("g-app-a", "g-app-b"):
        dmq.ok("topics", "create", topic)
        dmq.ok("produce", topic, input="x\n")
        dmq.ok("consume", topic, "--group", "billing2", "--max-messages", "1")
    by_app = dmq.json("groups", "describe", "billing2")
    assert by_app["app_id"] == "billing2"
    assert [g["group_id"] for g in by_app["groups"]] == ["G_g-app-a_billing2", "G_g-app-b_billing2"]
    assert by_app["groups"][0] == dmq.json("groups", "describe", "G_g-app-a_billing2")
    human = dmq.ok("groups", "describe", "billing2")
    assert "Group G_g-app-a_billing2" in human.stdout and "Group G_g-app-b_billing2" in human.stdout

    # neither a group nor an application: a sentence for people, no internal RPC names
    for args in (("groups", "describe", "nobody-here"), ("groups", "delete", "G_nothing_here"),
                 ("groups", "reset-offsets", "G_nothing_here", "--to-earliest")):
        missing = dmq(*args)
        assert missing.returncode == 1 and "not found" in missing.stderr, missing
        assert "FindOrCreateGroup" not in missing.stderr and "dmq groups list" in missing.stderr, missing


def test_all_groups_for_list_and_describe(dmq: Dmq) -> None:
    dmq.ok("topics", "create", "g-all")
    dmq.ok("produce", "g-all", input="x\n")
    dmq.ok("consume", "g-all", "--group", "every", "--max-messages", "1")
    listed = dmq.json("groups", "list", "--all-groups")
    assert listed == dmq.json("groups", "list")
    described = dmq.json("groups", "describe", "--all-groups")
    assert [g["group_id"] for g in described["groups"]] == [g["group_id"] for g in listed["groups"]]
    assert "G_g-all_every" in [g["group_id"] for g in described["groups"]]
    assert "Group G_g-all_every" in dmq.ok("groups", "describe", "--all-groups").stdout
    both = dmq("groups", "describe", "G_g-all_every", "--all-groups")
    assert both.returncode == 2 and "GROUP or --all-groups" in both.stderr
