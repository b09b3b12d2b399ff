"""One of three brokers dies (SIGKILL) and later another one stops (SIGSTOP): group consumers
keep reading the partitions of the healthy brokers with no gap over 2 s, the coordinator
declares the killed broker dead within its session (6 s), and `dmq consume` started while a
broker is dead (with --group, and without) prints the live partitions' messages.

Real processes: `dmq coordinator` and three `dmq broker`s (see _isolation_procs.py). The
topic has one partition per broker; a writer thread per partition produces every 50 ms
straight to the partition's broker. Three readers follow it: a DMQConsumer polling in a
thread of this process (auto-commit), `dmq consume --group` in its own process (committing
what it printed every second), each in its own group, and `dmq consume` without a group.
"""

from __future__ import annotations

import functools
import pathlib
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict

from _isolation_procs import CliReader, PartitionWriter, ProcCluster

from dmq.client import AdminClient
from dmq.client.consumer import DMQConsumer
from dmq.proto.names import group_id_for
from tests import polling

TOPIC = "iso"
MAX_GAP_S = 2.0
SESSION_BOUND_S = 6.0 + 1.0  # the default broker session, plus slack for the polling ListBrokers calls
READY_TIMEOUT_S = 30.0


class GroupReader:
    """A DMQConsumer polling in a thread; the arrival time of each record per partition."""

    def __init__(self, bootstrap: str) -> None:
        self.arrivals: dict[int, list[float]] = defaultdict(list)
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._consumer = DMQConsumer(metadata_service_url=bootstrap, group_id="iso-app", fetch_max_wait_ms=200,
                                     auto_commit_interval_ms=200)
        self._consumer.subscribe(TOPIC)
        self._thread = threading.Thread(target=self._run, name="group-reader", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                for r in self._consumer.poll(200):
                    self.arrivals[r.partition].append(time.monotonic())
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close(timeout=5)


def max_gap(times: list[float], start: float, end: float) -> float:
    points = [start, *(t for t in times if start <= t <= end), end]
    return max(b - a for a, b in zip(points, points[1:], strict=False))


def committed_everywhere(admin: AdminClient, app: str) -> bool:
    committed = admin.describe_group(group_id_for(TOPIC, app)).committed()
    return len(committed) == 3 and None not in committed.values()


wait_for = functools.partial(polling.seconds_until, poll_s=0.05)  # (predicate, timeout_s, what) -> seconds


def test_group_keeps_reading_healthy_partitions_through_sigkill_and_sigstop(tmp_path: pathlib.Path) -> None:
    with ProcCluster(tmp_path, brokers=3) as cluster:
        with AdminClient(cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, 3, {"replication_factor": 1})  # one partition per broker, unreplicated
            partitions = admin.describe_topic(TOPIC).partitions
        broker_of = {p.partition: p.leader_id for p in partitions}
        assert sorted(broker_of.values()) == [0, 1, 2], broker_of
        part_on = {b: p for p, b in broker_of.items()}
        writer = PartitionWriter(TOPIC, {p.partition: p.leader_address for p in partitions})
        reader = GroupReader(cluster.bootstrap)
        cli_reader = CliReader(cluster.bootstrap, TOPIC, "iso-cli")
        tail_reader = CliReader(cluster.bootstrap, TOPIC, None)
        readers = {"DMQConsumer": reader, "dmq consume --group": cli_reader, "dmq consume (no group)": tail_reader}
        try:
            wait_for(lambda: all(len(r.arrivals) == 3 for r in readers.values()), READY_TIMEOUT_S,
                     "records from every partition")
            # Both groups have committed every partition: the gaps below are measured from here.
            with AdminClient(cluster.bootstrap) as admin:
                wait_for(lambda: all(committed_everywhere(admin, app) for app in ("iso-app", "iso-cli")),
                         READY_TIMEOUT_S, "commits of both groups on every partition")

            # -- SIGKILL broker 1 -----------------------------------------------------------------
            killed_at = time.monotonic()
            cluster.signal_broker(1, signal.SIGKILL)
            cli = subprocess.Popen(
                [sys.executable, "-m", "dmq.client.cli", "--bootstrap", cluster.bootstrap, "consume", TOPIC,
                 "--group", "g2", "--from-beginning", "--max-messages", "30", "--print-offset"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            late_tail = subprocess.Popen(  # without a group, started while broker 1 is dead
                [sys.executable, "-m", "dmq.client.cli", "--bootstrap", cluster.bootstrap, "consume", TOPIC,
                 "--from-beginning", "--max-messages", "30", "--print-offset"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            with AdminClient(cluster.bootstrap) as admin:
                dead_after_s = wait_for(
                    lambda: not next(b for b in admin.list_brokers() if b.broker_id == 1).alive,
                    20.0, "broker 1 declared dead",
                )
            try:
                out, err = cli.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                cli.kill()
                out, err = cli.communicate()
                raise AssertionError(f"`dmq consume --group` printed nothing in 20 s with broker 1 dead: {out!r} {err[-500:]!r}") from None
            printed = [line.split("\t", 1)[0] for line in out.splitlines()]
            assert cli.returncode == 0, err
            assert len(printed) == 30, (out, err)
            assert {int(x.split(":")[0]) for x in printed} <= {part_on[0], part_on[2]}
            try:
                tail_out, late_err = late_tail.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                late_tail.kill()
                tail_out, late_err = late_tail.communicate()
            tail_lines = tail_out.splitlines()
            assert late_tail.returncode == 0 and len(tail_lines) == 30, (late_tail.returncode, tail_out, late_err)
            assert {int(line.split(":")[0]) for line in tail_lines} <= {part_on[0], part_on[2]}
            time.sleep(max(0.0, killed_at + 7.0 - time.monotonic()))

            # -- SIGSTOP broker 2, SIGCONT 5 s later ------------------------------------------------
            stopped_at = time.monotonic()
            cluster.signal_broker(2, signal.SIGSTOP)
            time.sleep(5.0)
            cluster.signal_broker(2, signal.SIGCONT)
            continued_at = time.monotonic()
            wait_for(lambda: all(any(t > continued_at for t in r.arrivals[part_on[2]]) for r in readers.values()),
                     35.0, "records of the stopped broker after SIGCONT")
        finally:
            writer.stop()
            reader.stop()
            cli_err = cli_reader.stop()
            tail_err = tail_reader.stop()
        gaps = {}
        for name, arrivals in ((name, r.arrivals) for name, r in readers.items()):
            gaps[f"{name}: after SIGKILL, broker 0"] = max_gap(arrivals[part_on[0]], killed_at, stopped_at)
            gaps[f"{name}: after SIGKILL, broker 2"] = max_gap(arrivals[part_on[2]], killed_at, stopped_at)
            gaps[f"{name}: during SIGSTOP, broker 0"] = max_gap(arrivals[part_on[0]], stopped_at, continued_at)
        print(f"declared dead after {dead_after_s:.2f}s; gaps", {k: round(v, 2) for k, v in gaps.items()})
        assert reader.error is None, repr(reader.error)
        assert dead_after_s <= SESSION_BOUND_S, f"broker 1 declared dead only {dead_after_s:.1f}s after SIGKILL"
        assert all(g <= MAX_GAP_S for g in gaps.values()), (
            {k: round(v, 2) for k, v in gaps.items()}, cli_err[-1000:], tail_err[-1000:])
        assert "cannot reach broker 1" in tail_err  # a warning: the tail went on
        assert writer.sent[part_on[0]] > 0 and writer.failed[part_on[1]] > 0


def test_commits_and_positions_of_healthy_partitions_do_not_wait_on_a_dead_broker(tmp_path: pathlib.Path) -> None:
    """commit_sync() with one broker dead commits the other brokers' partitions at once and fails
    in time for the dead one; a new member then starts the healthy partitions at those commits."""
    from dmq.client.errors import DMQError

    with ProcCluster(tmp_path, brokers=3) as cluster:
        with AdminClient(cluster.bootstrap) as admin:
            admin.create_topic(TOPIC, 3, {"replication_factor": 1})  # one partition per broker, unreplicated
            partitions = admin.describe_topic(TOPIC).partitions
        part_on = {p.leader_id: p.partition for p in partitions}
        writer = PartitionWriter(TOPIC, {p.partition: p.leader_address for p in partitions})
        settings = {"group_id": "commit-app", "enable_auto_commit": False, "fetch_max_wait_ms": 200}
        first = DMQConsumer(metadata_service_url=cluster.bootstrap, **settings)
        second = None
        try:
            first.subscribe(TOPIC)
            positions: dict = {}
            deadline = time.monotonic() + READY_TIMEOUT_S
            while len(positions) < 3:
                assert time.monotonic() < deadline, f"records only from {sorted(positions)}"
                for r in first.poll(200):
                    positions[(r.topic, r.partition)] = r.offset + 1
            cluster.signal_broker(1, signal.SIGKILL)
            started = time.monotonic()
            try:
                first.commit_sync(positions, timeout=2.0)
            except DMQError as e:
                error: DMQError | None = e
            else:
                error = None
            commit_s = time.monotonic() - started
            assert error is not None and f"{TOPIC}[{part_on[1]}]" in str(error), error
            assert commit_s <= 2.5, f"commit_sync(timeout=2.0) took {commit_s:.2f}s"
            healthy = [(TOPIC, part_on[0]), (TOPIC, part_on[2])]
            started = time.monotonic()
            committed = first.committed(healthy, timeout=2.0)
            assert time.monotonic() - started <= 2.5
            assert {tp: c.offset for tp, c in committed.items()} == {tp: positions[tp] for tp in healthy}
            first.close(timeout=2.0)

            # A new member: positions of the healthy partitions come from their brokers while the
            # dead one's look-up fails; their records start exactly at the commits.
            second = DMQConsumer(metadata_service_url=cluster.bootstrap, **settings)
            second.subscribe(TOPIC)
            firsts: dict = {}
            deadline = time.monotonic() + 15.0
            while len(firsts) < 2:
                assert time.monotonic() < deadline, f"the new member read only {sorted(firsts)} with broker 1 dead"
                for r in second.poll(200):
                    firsts.setdefault((r.topic, r.partition), r.offset)
            assert firsts == {tp: positions[tp] for tp in healthy}
        finally:
            writer.stop()
            first.close(timeout=2.0)
            if second is not None:
                second.close(timeout=2.0)
