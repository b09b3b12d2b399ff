"""`dmq server --brokers 3 --coordinators 3 --port 0` (issue 28 item 7), through the real CLI: an
etcd it starts itself, three coordinator processes electing one active, three brokers given all of
them. Produce and consume; SIGKILL the active coordinator's process (found through `dmq
coordinators list`); a standby takes over and produce / consume continue; SIGTERM stops every
child, etcd included.

--lease-ttl-s 2 (etcd's minimum) keeps the takeover, and so the test, short.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import time

from tests.cli.conftest import COMMAND_TIMEOUT_S, SERVER_START_TIMEOUT_S, dmq_executable, run_dmq, wait_for

_RUNNING = re.compile(r'bootstrap="(\S+)"')
STOP_TIMEOUT_S = 60.0  # three coordinators, three brokers and etcd stopping on a loaded machine


def _children(pid: int) -> dict[int, str]:
    """pid -> command line of each live child of `pid` (from /proc)."""
    out = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):  # a process that ended meanwhile
            continue
    return out


def _alive(pid: int) -> bool:
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _coordinators(bootstrap: str) -> list[dict]:
    # Exit 1 while one is unreachable (the killed one, until restarted) or none is active: the
    # listing is printed all the same.
    r = run_dmq("coordinators", "list", "-o", "json", bootstrap=bootstrap)
    try:
        return json.loads(r.stdout)["coordinators"]
    except ValueError:
        return []


def _active(bootstrap: str) -> tuple[str, int] | None:
    """(address, controller epoch) of the one active coordinator, None while there is not one."""
    active = [(c["address"], c["controller_epoch"]) for c in _coordinators(bootstrap) if c["state"] == "active"]
    return active[0] if len(active) == 1 else None


def _consume(bootstrap: str, count: int) -> list[str]:
    r = run_dmq("consume", "orders", "--group", "billing", "--max-messages", str(count), "--format", "json",
                "--timeout-ms", "30000", bootstrap=bootstrap)
    assert r.returncode == 0, r
    return [json.loads(line)["value"] for line in r.stdout.splitlines()]


def _produce(bootstrap: str, values: list[str]) -> None:
    r = run_dmq("produce", "orders", input="".join(f"{v}\n" for v in values), bootstrap=bootstrap)
    assert r.returncode == 0, r


def test_a_local_ha_cluster_survives_a_sigkill_of_its_active_coordinator(tmp_path: pathlib.Path) -> None:
    data_dir = tmp_path / "data"
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [dmq_executable(), "server", "--brokers", "3", "--coordinators", "3", "--port", "0", "--lease-ttl-s", "2",
             "--data-dir", str(data_dir), "--log-level", "warning"],
            stdout=log, stderr=subprocess.STDOUT,
        )
    try:
        def started() -> re.Match[str] | None:
            text = log_path.read_text(errors="replace")
            assert server.poll() is None, f"dmq server exited with {server.returncode}: {text[-3000:]}"
            return _RUNNING.search(text)

        found = wait_for(started, "the bootstrap list", SERVER_START_TIMEOUT_S)
        bootstrap = found.group(1)
        addresses = bootstrap.split(",")
        assert len(addresses) == 3, bootstrap
        for i, address in enumerate(addresses):
            assert (data_dir / f"coordinator-{i}.address").read_text() == address
        etcd = [pid for pid, cmd in _children(server.pid).items() if "etcd" in cmd.split()[0]]
        assert len(etcd) == 1, _children(server.pid)
        assert (data_dir / "etcd" / "m0").is_dir()  # etcd's data in the server's data directory
        def all_registered() -> object:
            r = run_dmq("health", "-o", "json", bootstrap=bootstrap)  # exit 0 once one broker is up
            brokers = [c for c in r.json()["components"] if c["component"] == "broker"] if r.stdout else []
            return r.returncode == 0 and len(brokers) == 3 and r

        health = wait_for(all_registered, "every broker registered", SERVER_START_TIMEOUT_S)
        components = health.json()["components"]
        assert sorted(c["component"] for c in components) == ["broker"] * 3 + ["coordinator"] * 3 + ["etcd"], components
        assert all(c["status"] == "up" for c in components), components
        r = run_dmq("topics", "create", "orders", "--partitions", "3", bootstrap=bootstrap)
        assert r.returncode == 0, r
        _produce(bootstrap, ["before-0", "before-1", "before-2"])
        assert sorted(_consume(bootstrap, 3)) == ["before-0", "before-1", "before-2"]

        first, epoch = wait_for(lambda: _active(bootstrap), "an active coordinator")
        index = addresses.index(first)
        (pid,) = [p for p, cmd in _children(server.pid).items() if f"coordinator-{index} " in cmd]
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        # A takeover: an active coordinator of a later controller epoch (a standby, as a rule; the
        # killed one, restarted by `dmq server`, could win the election too).
        second, _epoch = wait_for(lambda: (a := _active(bootstrap)) is not None and a[1] > epoch and a,
                                  "a takeover")
        print(f"{second} active {time.monotonic() - killed:.2f}s after the SIGKILL of {first} "
              "(with `dmq coordinators list` subprocesses polling)")

        _produce(bootstrap, ["after-0", "after-1", "after-2"])
        assert sorted(_consume(bootstrap, 3)) == ["after-0", "after-1", "after-2"]  # from the group's commit
        # The killed coordinator came back (restarted by `dmq server`), standing by.
        wait_for(lambda: sorted(c["state"] for c in _coordinators(bootstrap)) == ["active", "standby", "standby"],
                 "the killed coordinator back as a standby")

        children = _children(server.pid)
        assert len(children) == 7, children  # etcd, 3 coordinators, 3 brokers
        assert any("etcd" in cmd.split()[0] for cmd in children.values()), children
        server.send_signal(signal.SIGTERM)
        assert server.wait(STOP_TIMEOUT_S) == 0, log_path.read_text(errors="replace")[-3000:]
        assert [p for p in children if _alive(p)] == []
    finally:
        leftover = _children(server.pid) if server.poll() is None else {}  # none unless the test failed
        if server.poll() is None:
            server.kill()
            server.wait(COMMAND_TIMEOUT_S)
        for pid in leftover:
            os.kill(pid, signal.SIGKILL)


def test_ha_options_are_checked_before_anything_starts(tmp_path: pathlib.Path) -> None:
    data_dir = tmp_path / "data"
    cases = {
        ("--lease-ttl-s", "2"): "Invalid value for --lease-ttl-s: only with --coordinators M",
        ("--coordinators", "1"): "Invalid value for '--coordinators': 1 is not in the range 2<=x<=9.",
        ("--coordinators", "3", "--port", "65534"): "Invalid value for --port: 3 coordinators take ports 65534..65536",
    }
    for args, error in cases.items():
        r = run_dmq("server", "--data-dir", str(data_dir), "--log-level", "warning", *args)
        assert r.returncode == 2, r
        assert error in r.stderr, r
        assert not (data_dir / "etcd").exists()  # no etcd started
