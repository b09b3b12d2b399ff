"""An event store's server SIGKILLed at every step of a conditional append (event_crash_server.py):
after a restart the index equals one rebuilt from the log, reads equal a brute-force filter of
every event, and a condition fails exactly when the event in flight at the kill reached the log.

A SIGKILL keeps what was written to the page cache, so the event in flight is in the log from the
moment it was appended (not yet fsynced) on: steps before-index onward find it after the restart.
"""

from __future__ import annotations

import os
import pathlib
import selectors
import signal
import subprocess
import sys
import time

import pytest

from dmq.broker.events.index import EventIndex
from dmq.broker.log import LogConfig, PartitionLog
from dmq.client import AdminClient
from dmq.client.cli.runner import ClusterOptions, ClusterThread
from dmq.client.errors import AppendConditionError
from dmq.client.events import AppendCondition, Event, EventStore, QueryItem
from tests.fault.event_crash_server import CRASH

CHILD = pathlib.Path(__file__).with_name("event_crash_server.py")
START_TIMEOUT_S = 60.0
K = [QueryItem(tags=["k:1"])]


def start(data: pathlib.Path, step: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, str(CHILD), str(data), step], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and sel.select(deadline - time.monotonic()):
            line = proc.stdout.readline()
            if line.startswith("READY"):
                return proc, line.split()[1]
            if not line:
                break
    proc.kill()
    proc.wait(timeout=30)
    raise AssertionError(f"the crash server did not start (rc {proc.returncode})")


@pytest.mark.parametrize("step, in_log", [("before-log", False), ("before-index", True), ("before-fsync", True),
                                          ("before-answer", True), ("none", True)])
def test_a_kill_at_each_step_of_an_append_leaves_a_correct_index(tmp_path: pathlib.Path, step: str, in_log: bool) -> None:
    data = tmp_path / "data"
    proc, bootstrap = start(data, step)
    try:
        with AdminClient(bootstrap) as admin:
            admin.create_topic("es", 1, config={"kind": "event-store"})
        with EventStore(bootstrap, "es", request_timeout_ms=20_000) as s:
            seen = s.append([Event("a", ["k:1", "n:1"], b"one"), Event("b", ["k:2"], b"two")])
            assert seen == 2
            try:
                s.append(Event("a", ["k:1", "n:2"], CRASH), AppendCondition(K, seen))
                answered = True
            except Exception:  # the server died before answering (UNAVAILABLE or the deadline)
                answered = False
        assert answered == (step == "none")
        if step == "none":
            os.kill(proc.pid, signal.SIGKILL)  # answered; the index file not yet fsynced
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()

    with ClusterThread(ClusterOptions(data_dir=data)) as c, EventStore(c.bootstrap, "es") as s:
        everything = s.read()
        assert [e.payload for e in everything] == [b"one", b"two"] + ([CRASH] if in_log else [])
        assert [e.position for e in s.read(K)] == [e.position for e in everything if "k:1" in e.tags]
        # the client saw position 2: the condition fails exactly when the event in flight is stored
        try:
            s.append(Event("a", ["k:1"], b"after"), AppendCondition(K, seen))
            failed = False
        except AppendConditionError:
            failed = True
        assert failed == in_log
        head = s.read(K, limit=1).head
        assert s.append(Event("a", ["k:1"], b"last"), AppendCondition(K, head)) == head + 1
        final = [(e.position, e.type, tuple(e.tags), e.payload) for e in s.read()]

    # the index the server left equals one rebuilt from the log alone
    directory = next(data.rglob("events.index")).parent
    plog = PartitionLog(directory, "es", 0, LogConfig())
    try:
        left = EventIndex(str(directory))
        assert left.catch_up(plog) == 0
        rebuilt_dir = tmp_path / "rebuilt"
        rebuilt_dir.mkdir()
        rebuilt = EventIndex(str(rebuilt_dir))
        rebuilt.catch_up(plog)
        end = plog.log_end_offset
        assert left.end == rebuilt.end == end
        assert left.read((), 0, end, 100) == rebuilt.read((), 0, end, 100)
        assert [(p, t, tuple(j.split("\n")), pl) for p, t, j, pl, _, _ in zip(*left.read((), 0, end, 100), strict=True)] \
            == final
        left.close()
        rebuilt.close()
    finally:
        plog.close()
