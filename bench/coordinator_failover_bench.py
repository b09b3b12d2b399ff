"""Coordinator failover (issue 28's acceptance): takeover time and the group's recovery, and
metadata operations per second on SQLite vs etcd.

Failover, once per lease TTL given (--ttls, default 2 s and the documented default 5 s):
  a real etcd (tests/etcd_server.py, fsync on), 3 `dmq coordinator --metadata-store etcd://…
  --lease-ttl-s TTL` processes, 3 `dmq broker` processes given every coordinator address, an RF-3
  topic of 6 partitions, an acks=all producer (~200 records/s) and a 2-member consumer group
  (poll, commit_sync) running throughout. Each of --takeovers rounds SIGKILLs the active
  coordinator and restarts it on its port as a standby once a new one is active. Measured from
  the SIGKILL (monotonic, in this process):
    new active     a coordinator's status RPC (DescribeCoordinator, polled every 20 ms) says active
    reload         the new active one's own claim + load + start (its "coordinator active" log
                   line's took_ms): the rest of "new active" is the wait for the lease to lapse
    consuming      both members have a commit_sync sent after the SIGKILL succeed (a commit needs the
                   coordinator: the broker checks ownership with it)
  The metadata is sized by --extra-topics (6 partitions each, RF 3) so the reload has work to do.

Metadata operations per second, at the RPC level through the real servers (the store level,
without gRPC or brokers, is bench/metadata_store_bench.py, run here on the same etcd):
    topic create   AdminClient.create_topic, 1 partition, RF 3 (the brokers' work included)
    group join     JoinGroup of a new member (its membership written to the store before the answer)
    commit         commit_sync of one partition's offset (the broker asks the coordinator)
  on a SQLite coordinator (the embedded default store) and on the active etcd one, each with 3 brokers.

    .venv/bin/python bench/coordinator_failover_bench.py [--takeovers 20] [--ttls 2,5] [--ops 50]

Figures are printed (p50 / p99 over the rounds); bench/RESULTS.md records them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

import grpc

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # tests.etcd_server
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # metadata_store_bench

import metadata_store_bench  # noqa: E402

from dmq.client import AdminClient, DMQConsumer, Producer, TopicPartition  # noqa: E402
from dmq.coordinator.metastore.config import make_metadata_store  # noqa: E402
from dmq.proto import dmq_pb2 as pb  # noqa: E402
from dmq.proto import dmq_pb2_grpc as pb_grpc  # noqa: E402
from tests.etcd_server import running_etcd  # noqa: E402

START_TIMEOUT_S = 60.0
WAIT_S = 60.0
TOPIC = "failover"
SESSION_TIMEOUT_MS = 6000
PRODUCE_PER_S = 200


def _wait(predicate: Callable[[], object], timeout_s: float, what: str) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise SystemExit(f"no {what} within {timeout_s:.0f}s")
        time.sleep(0.02)
    return time.monotonic() - started


class _Server:
    """One `python -m dmq.client.cli …` server process; `address` once it listens."""

    def __init__(self, log_path: pathlib.Path, args: list[str], listening: str) -> None:
        self.log_path = log_path
        self.args = args
        self.listening = listening
        self.address = ""
        self.start()

    def start(self) -> None:
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "dmq.client.cli", *self.args], stdout=out, stderr=out)
        _wait(lambda: self.listening in self.log() or self.proc.poll() is not None, START_TIMEOUT_S, "server start")
        lines = [ln for ln in self.log().splitlines() if self.listening in ln]
        if self.proc.poll() is not None or not lines:
            raise SystemExit(f"{self.args[0]} did not start: {self.log()[-2000:]}")
        self.address = lines[-1].rsplit(" ", 1)[-1].strip()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()


def _coordinator(root: pathlib.Path, name: str, store_args: list[str]) -> _Server:
    return _Server(root / f"{name}.log", ["coordinator", "--port", "0", "--data-dir", str(root / name),
                                          "--log-level", "info", "--metrics-port", "0", *store_args],
                   "coordinator listening on")


def _brokers(root: pathlib.Path, bootstrap: str) -> list[_Server]:
    return [_Server(root / f"b{i}.log", ["broker", "--coordinator", bootstrap, "--broker-id", str(i), "--port", "0",
                                        "--data-dir", str(root / f"b{i}"), "--log-level", "warning", "--metrics-port", "0"],
                    f"broker {i} listening on") for i in range(3)]


# One channel per coordinator address, kept (it reconnects to a restarted coordinator on its port):
# a new channel per poll is a new TCP connection every 20 ms, and servers count a connection as in
# use for 30 s after its last call (dmq.proto.server.connections), so polling that way took all 1,000 of
# 127.0.0.1's connections to the active coordinator and locked the brokers and clients out.
_STATUS_CHANNELS: dict[str, grpc.Channel] = {}


def _active(address: str) -> bool:
    channel = _STATUS_CHANNELS.get(address)
    if channel is None:
        channel = _STATUS_CHANNELS[address] = grpc.insecure_channel(address)
    try:
        status = pb_grpc.CoordinatorStatusStub(channel).DescribeCoordinator(pb.DescribeCoordinatorRequest(), timeout=0.5)
        return bool(status.active)
    except grpc.RpcError:
        return False


def _took_ms(c: _Server) -> float | None:
    """took_ms of the coordinator's last "coordinator active" log line (claim + load + start)."""
    took = None
    for line in c.log().splitlines():
        if '"coordinator active"' in line:
            took = float(json.loads(line)["took_ms"])
    return took


class _Load:
    """An acks=all producer and a 2-member group, each in its own thread, until stop()."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        # Per member, each successful commit: (sent, answered), monotonic.
        self.commits: list[list[tuple[float, float]]] = [[], []]
        self.consumed = [0, 0]
        self.produced = 0
        self.errors = {"produce": 0, "commit": 0}
        self.last_error: dict[str, str] = {}
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._produce, daemon=True)]
        self._threads += [threading.Thread(target=self._consume, args=(i,), daemon=True) for i in range(2)]
        for t in self._threads:
            t.start()

    def _produce(self) -> None:
        with Producer(bootstrap_servers=self.bootstrap, acks="all") as producer:
            i = 0
            next_s = time.monotonic()
            while not self._stop.is_set():
                try:
                    producer.send(TOPIC, f"r{i}".encode(), partition=i % 6)
                    self.produced += 1
                except Exception as e:  # noqa: BLE001 - counted, and the load goes on
                    self.errors["produce"] += 1
                    self.last_error["produce"] = repr(e)
                i += 1
                next_s += 1 / PRODUCE_PER_S
                self._stop.wait(max(0.0, next_s - time.monotonic()))

    def _consume(self, member: int) -> None:
        with DMQConsumer(bootstrap_servers=self.bootstrap, group_id="bench", auto_offset_reset="earliest",
                         enable_auto_commit=False, session_timeout_ms=SESSION_TIMEOUT_MS,
                         heartbeat_interval_ms=1000) as consumer:
            consumer.subscribe(TOPIC)
            while not self._stop.is_set():
                try:
                    records = consumer.poll(timeout_ms=200)
                    self.consumed[member] += len(records)
                    if records:
                        sent = time.monotonic()
                        consumer.commit_sync(timeout=2)
                        self.commits[member].append((sent, time.monotonic()))
                except Exception as e:  # noqa: BLE001 - counted, and the load goes on
                    self.errors["commit"] += 1
                    self.last_error[f"member {member}"] = repr(e)

    def committed_after(self, t: float) -> float | None:
        """When both members had a commit sent after t succeed (the later answer of the two), or
        None. Sent after t: a commit already in flight at a SIGKILL may still be answered."""
        firsts = [next((answered for sent, answered in commits if sent > t), None) for commits in self.commits]
        return None if None in firsts else max(f for f in firsts if f is not None)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _takeover(coordinators: list[_Server], load: _Load) -> tuple[float, float, float]:
    """SIGKILL the active coordinator, restart it (a standby) once another is active; (new active,
    its reload, group consuming again) in seconds from the SIGKILL. Returns once the group is steady."""
    found: list[_Server] = []
    _wait(lambda: found.extend(c for c in coordinators if _active(c.address)) or found, WAIT_S, "an active coordinator")
    active = found[0]
    killed = time.monotonic()
    print(f"  {time.strftime('%H:%M:%S', time.gmtime())} UTC: SIGKILL {active.log_path.stem} ({active.address})", flush=True)
    active.kill()
    rest = [c for c in coordinators if c is not active]
    seen: list[_Server] = []  # the first seen active (a later status call may time out under load)
    new_active_s = _wait(lambda: seen.extend(c for c in rest if _active(c.address)) or seen, WAIT_S, "takeover")
    new = seen[0]
    active.args[active.args.index("--port") + 1] = active.address.rsplit(":", 1)[1]  # the same address
    active.start()
    _wait(lambda: load.committed_after(killed) is not None, WAIT_S,
          f"the group consuming again (last errors: {load.last_error})")
    consuming_s = (load.committed_after(killed) or killed) - killed
    # Steady before the next round: both members commit again after the restart.
    settled = time.monotonic()
    _wait(lambda: load.committed_after(settled) is not None, WAIT_S, "the group steady")
    return new_active_s, (_took_ms(new) or 0) / 1000, consuming_s


def _failover(root: pathlib.Path, url: str, ttl_s: int, takeovers: int, extra_topics: int) -> dict[str, list[float]]:
    store_args = ["--metadata-store", url, "--lease-ttl-s", str(ttl_s)]
    coordinators = [_coordinator(root, f"c{i}", store_args) for i in range(3)]
    bootstrap = ",".join(c.address for c in coordinators)
    brokers: list[_Server] = []
    load: _Load | None = None
    figures: dict[str, list[float]] = {"new active": [], "reload": [], "lease wait": [], "consuming": []}
    try:
        _wait(lambda: any(_active(c.address) for c in coordinators), WAIT_S, "active coordinator")
        brokers = _brokers(root, bootstrap)
        with AdminClient(bootstrap_servers=bootstrap) as admin:
            _wait(lambda: sum(b.alive for b in admin.list_brokers()) == 3, WAIT_S, "3 brokers registered")
            admin.create_topic(TOPIC, partitions=6)
            for i in range(extra_topics):
                admin.create_topic(f"extra-{i}", partitions=6)
        load = _Load(bootstrap)
        _wait(lambda: load.committed_after(time.monotonic() - 1) is not None, WAIT_S, "the group consuming")
        for n in range(takeovers):
            new_active_s, reload_s, consuming_s = _takeover(coordinators, load)
            figures["new active"].append(new_active_s)
            figures["reload"].append(reload_s)
            figures["lease wait"].append(new_active_s - reload_s)
            figures["consuming"].append(consuming_s)
            print(f"  ttl {ttl_s}s takeover {n + 1:2d}: new active {new_active_s:5.2f}s (reload {reload_s:5.3f}s), "
                  f"group consuming {consuming_s:5.2f}s", flush=True)
        step_downs = sum(c.log().count("stepping down") for c in coordinators)  # lease renewals missed
        print(f"  ttl {ttl_s}s: step-downs without a SIGKILL {step_downs}, produced {load.produced}, "
              f"consumed {sum(load.consumed)}, "
              f"produce errors {load.errors['produce']}, failed polls/commits {load.errors['commit']}", flush=True)
    finally:
        if load is not None:
            load.stop()
        for s in brokers + coordinators:
            s.stop()
    return figures


def _rpc_ops(bootstrap: str, coordinator: str, ops: int) -> dict[str, float]:
    """Topic create, group join, commit: operations per second, one at a time."""
    rates = {}
    with AdminClient(bootstrap_servers=bootstrap) as admin:
        _wait(lambda: sum(b.alive for b in admin.list_brokers()) == 3, WAIT_S, "3 brokers registered")
        admin.create_topic("ops-warm-up", partitions=1)  # channels open, brokers' first partition made
        start = time.perf_counter()
        for i in range(ops):
            admin.create_topic(f"ops-{i}", partitions=1)
        rates["topic create"] = ops / (time.perf_counter() - start)
    with grpc.insecure_channel(coordinator) as channel:
        stub = pb_grpc.GroupCoordinatorStub(channel)
        group_id = stub.FindOrCreateGroup(pb.FindOrCreateGroupRequest(topic="ops-0", app_id="joins"), timeout=WAIT_S).group_id
        start = time.perf_counter()
        for i in range(ops):
            stub.JoinGroup(pb.JoinGroupRequest(group_id=group_id, consumer_id=f"m{i}", client_id="bench",
                                               session_timeout_ms=300_000, max_poll_interval_ms=300_000), timeout=WAIT_S)
        rates["group join"] = ops / (time.perf_counter() - start)
    with DMQConsumer(bootstrap_servers=bootstrap, group_id="commits", enable_auto_commit=False) as consumer:
        consumer.subscribe("ops-1")
        _wait(lambda: consumer.poll(timeout_ms=100) is not None and consumer.assignment(), WAIT_S, "an assignment")
        tp = TopicPartition("ops-1", 0)
        consumer.commit_sync({tp: 0})  # warm-up: the partition leader's channel and ownership check
        start = time.perf_counter()
        for _ in range(ops):
            consumer.commit_sync({tp: 0})
        rates["commit"] = ops / (time.perf_counter() - start)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--takeovers", type=int, default=20, help="SIGKILLs of the active coordinator per TTL")
    parser.add_argument("--ttls", default="2,5", help="lease TTLs in seconds (5 is the documented default)")
    parser.add_argument("--extra-topics", type=int, default=50, help="topics (6 partitions, RF 3) the reload loads")
    parser.add_argument("--ops", type=int, default=50, help="RPC-level metadata operations of each kind")
    parser.add_argument("--store-ops", type=int, default=300, help="store-level operations (metadata_store_bench)")
    parser.add_argument("--keep", type=pathlib.Path, default=None, help="a new directory for the servers' data and "
                        "logs, kept afterwards (default: a temporary one)")
    args = parser.parse_args()
    results: dict[int, dict[str, list[float]]] = {}
    with contextlib.ExitStack() as stack:
        if args.keep is None:
            root = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory()))
        else:
            args.keep.mkdir(parents=True)
            root = args.keep
        etcd = stack.enter_context(running_etcd(root / "etcd", fsync=True))
        for ttl_s in (int(t) for t in args.ttls.split(",")):
            run_root = root / f"ttl{ttl_s}"
            run_root.mkdir()
            results[ttl_s] = _failover(run_root, etcd.url(f"failover-ttl{ttl_s}"), ttl_s, args.takeovers, args.extra_topics)
        rpc: dict[str, dict[str, float]] = {}
        for backend in ("sqlite", "etcd"):
            ops_root = root / f"ops-{backend}"
            ops_root.mkdir()
            store_args = ["--metadata-store", etcd.url("ops")] if backend == "etcd" else []
            coordinator = _coordinator(ops_root, "c", store_args)
            brokers = _brokers(ops_root, coordinator.address)
            try:
                rpc[backend] = _rpc_ops(coordinator.address, coordinator.address, args.ops)
            finally:
                for s in [*brokers, coordinator]:
                    s.stop()
        store = {
            "sqlite": asyncio.run(metadata_store_bench._run(make_metadata_store(None, root / "store-sqlite"), args.store_ops)),
            "etcd": asyncio.run(metadata_store_bench._run(make_metadata_store(etcd.url("store"), root), args.store_ops)),
        }
    for channel in _STATUS_CHANNELS.values():
        channel.close()
    print()
    print(f"takeovers: {args.takeovers} per TTL; group session timeout {SESSION_TIMEOUT_MS} ms; "
          f"{args.extra_topics + 1} topics of 6 partitions (RF 3)")
    print(f"{'lease TTL':<10} {'figure':<26} {'p50 s':>7} {'p99 s':>7} {'max s':>7}")
    for ttl_s, figures in results.items():
        for name, label in (("new active", "new active coordinator"), ("lease wait", "  lease expiry + detection"),
                            ("reload", "  claim + reload + start"), ("consuming", "group consuming again")):
            values = figures[name]
            print(f"{ttl_s:<10} {label:<26} {_pct(values, 0.5):>7.2f} {_pct(values, 0.99):>7.2f} {max(values):>7.2f}")
        share = statistics.mean(figures["reload"]) / statistics.mean(figures["new active"])
        print(f"{ttl_s:<10} {'reload share of takeover':<26} {share:>7.1%}")
    print()
    print(f"{'operation (RPC level)':<22} {'sqlite ops/s':>13} {'etcd ops/s':>11}")
    for op in rpc["sqlite"]:
        print(f"{op:<22} {rpc['sqlite'][op]:>13.0f} {rpc['etcd'][op]:>11.0f}")
    print(f"{'operation (store level)':<22} {'sqlite ops/s':>13} {'etcd ops/s':>11}")
    for op in store["sqlite"]:
        print(f"{op:<22} {store['sqlite'][op]:>13.0f} {store['etcd'][op]:>11.0f}")


if __name__ == "__main__":
    main()
