"""The README's quickstart, executed command by command against a live `dmq server`.

Every line of every ```sh block in the "Quickstart" section is run with bash, in order, with
`dmq` on PATH and DMQ_BOOTSTRAP pointing at this module's server (the README assumes the default
127.0.0.1:9091 of `make run`). Each must exit 0. Then the state the quickstart promises is checked:
the group read everything, lag appeared, and the reset rewound the offsets. If the README changes,
this test runs the new text, so the quickstart cannot go stale.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.cli.conftest import Dmq, ServerProcess

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
COMMAND_TIMEOUT_S = 60


def quickstart_commands(text: str) -> list[str]:
    match = re.search(r"^## Quickstart.*?$(.*?)(?=^## )", text, re.M | re.S)
    assert match, "README.md has no '## Quickstart' section"
    blocks = re.findall(r"^```sh\n(.*?)^```", match.group(1), re.M | re.S)
    commands = []
    for block in blocks:
        for line in block.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def test_readme_starts_with_make_run_and_make_test() -> None:
    text = README.read_text()
    first_block = re.search(r"^```sh\n(.*?)^```", text, re.M | re.S)
    assert first_block
    lines = [ln.split("#")[0].strip() for ln in first_block.group(1).splitlines() if ln.strip()]
    assert lines[:2] == ["make run", "make test"]


def test_quickstart_runs_command_by_command(server: ServerProcess, dmq: Dmq) -> None:
    commands = quickstart_commands(README.read_text())
    assert len(commands) >= 6, commands
    assert any(c.startswith("dmq consume") and "--group" in c for c in commands)
    assert any("reset-offsets" in c and "--execute" in c for c in commands)

    env = dict(os.environ)
    env["PATH"] = str(pathlib.Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["DMQ_BOOTSTRAP"] = server.bootstrap
    env.pop("DMQ_TIMEOUT", None)
    outputs = []
    for command in commands:
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True,
                              env=env, timeout=COMMAND_TIMEOUT_S)
        assert proc.returncode == 0, f"README command failed: {command}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
        outputs.append((command, proc.stdout))

    consumed = next(out for cmd, out in outputs if cmd.startswith("dmq consume"))
    assert sorted(consumed.split()) == ["order-1", "order-2", "order-3"]
    # "produce one more message and watch the lag become 1"
    listed = next(out for cmd, out in outputs if cmd.startswith("dmq groups list"))
    row = next(line.split() for line in listed.splitlines() if line.startswith("G_orders_billing "))
    assert row[:3] == ["G_orders_billing", "orders", "EMPTY"] and row[-1] == "1", listed
    by_app = next(out for cmd, out in outputs if cmd.startswith("dmq groups describe billing"))
    assert "Group G_orders_billing" in by_app, by_app
    # "these three keys land on partitions 2, 0 and 1"
    described = next(out for cmd, out in outputs if cmd.startswith("dmq topics describe"))
    ends = {int(cols[0]): int(cols[5]) for cols in (line.split() for line in described.splitlines())
            if len(cols) > 6 and cols[0].isdigit()}
    assert ends == {0: 1, 1: 1, 2: 1}, described

    # What the prose promises: the group exists for orders, and the reset rewound it to the log
    # start, so its lag is every message produced (three, then one more).
    group = dmq.json("groups", "describe", "G_orders_billing")
    assert group["topic"] == "orders"
    assert group["members"] == []
    assert group["total_lag"] == 4
    assert all(p["committed_offset"] == 0 for p in group["partitions"])
    topic = dmq.json("topics", "describe", "orders")
    assert topic["messages"] == 4
