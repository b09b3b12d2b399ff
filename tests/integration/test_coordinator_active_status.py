"""The active coordinator as operators see it (issue 29's active gauge and controller epoch, issue
28 item 7's `dmq coordinators list`): two real `dmq coordinator` processes on one real etcd, each
with a /metrics endpoint on a free port; the active one shows dmq_coordinator_active 1, the
standby 0; SIGKILL the active one and the standby's gauge goes to 1 with a higher epoch. The real
CLI lists both before (active / standby) and after (unreachable / active)."""

from __future__ import annotations

import json
import pathlib
import re
import signal
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.test_coordinator_election import WAIT_S, _Coordinator, _one_active, _wait
from tests.integration.test_coordinator_election import coordinators as coordinators  # noqa: F401 - the fixture

pytestmark = pytest.mark.processes  # left out of `make check`


def _metrics_url(c: _Coordinator) -> str:
    _wait(lambda: "coordinator metrics at " in c.log(), WAIT_S, f"{c.name}'s metrics URL")
    m = re.search(r"coordinator metrics at (http://\S+)", c.log())
    assert m is not None
    return m.group(1)


def _gauges(url: str) -> tuple[float, float]:
    """(dmq_coordinator_active, dmq_coordinator_controller_epoch) as the endpoint serves them."""
    with urllib.request.urlopen(url, timeout=WAIT_S) as answer:
        text = answer.read().decode()
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return samples["dmq_coordinator_active"], samples["dmq_coordinator_controller_epoch"]


def _list(bootstrap: str) -> tuple[int, dict[str, object], str]:
    """`dmq --bootstrap … coordinators list -o json` and its table: (exit code, JSON, table)."""
    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "dmq.client.cli", "--bootstrap", bootstrap,
                               "coordinators", "list", *extra], capture_output=True, text=True, timeout=2 * WAIT_S)
    as_json, as_table = run("-o", "json"), run()
    assert as_json.returncode == as_table.returncode, (as_json.stderr, as_table.stderr)
    return as_json.returncode, json.loads(as_json.stdout), as_table.stdout


def test_active_gauge_epoch_and_coordinators_list_follow_a_sigkill_takeover(
    tmp_path: pathlib.Path, etcd_url: str, coordinators: list[_Coordinator]  # noqa: F811
) -> None:
    coordinators += [_Coordinator(tmp_path, f"c{i}", etcd_url, args=("--metrics-port", "auto")) for i in range(2)]
    first = _one_active(coordinators, WAIT_S)
    standby = next(c for c in coordinators if c is not first)
    first_url, standby_url = _metrics_url(first), _metrics_url(standby)
    _wait(lambda: _gauges(first_url)[0] == 1, WAIT_S, "the active one's gauge at 1")
    active_epoch = _gauges(first_url)[1]
    assert active_epoch >= 1
    assert _gauges(standby_url) == (0, 0)  # a standby that never took control

    bootstrap = f"{standby.address},{first.address}"
    code, listed, shown = _list(bootstrap)
    assert code == 0, listed
    assert listed == {"controller_epoch": active_epoch, "coordinators": [
        {"address": standby.address, "state": "standby", "controller_epoch": 0, "active_address": first.address,
         "error": None},
        {"address": first.address, "state": "active", "controller_epoch": active_epoch,
         "active_address": first.address, "error": None},
    ]}
    rows = {ln.split()[0]: ln.split()[1:3] for ln in shown.splitlines() if ln.split()[:1] in ([first.address], [standby.address])}
    assert rows == {first.address: ["active", str(int(active_epoch))], standby.address: ["standby", "0"]}, shown

    first.proc.send_signal(signal.SIGKILL)
    first.proc.wait(10)
    _wait(lambda: _gauges(standby_url)[0] == 1, WAIT_S, "the standby's gauge at 1")
    assert _gauges(standby_url)[1] > active_epoch

    code, listed, shown = _list(bootstrap)
    assert code == 1  # one address is unreachable (the listing still printed)
    states = {c["address"]: (c["state"], c["controller_epoch"]) for c in listed["coordinators"]}  # type: ignore[attr-defined]
    assert states == {standby.address: ("active", _gauges(standby_url)[1]), first.address: ("unreachable", None)}
    assert listed["controller_epoch"] == _gauges(standby_url)[1]
    assert "unreachable" in shown and "active" in shown
