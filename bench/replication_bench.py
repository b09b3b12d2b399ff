"""Replication: what RF 3 costs, how fast leadership moves, and end-to-end latency (issue 15).

    .venv/bin/python bench/replication_bench.py [--records 200000] [--trials 20]
                                                [--session-timeout-ms 1000] [--latency-seconds 10]

Starts a real 3-broker cluster (`dmq coordinator` and three `dmq broker` processes, fsync flush
policy, data in a temporary directory) and, in one run, prints:

  1. produce msgs/s with RF 1 and RF 3 (acks=all, min_insync_replicas 2), one partition each, and
     the CPU seconds per million records of the client, the leader and each follower: on this
     machine the client and the three brokers share 2 cores, so the CPU figures show what
     replication itself costs where the throughput ratio mostly shows the contention.
     Target: RF 3 keeps >= 60% of RF 1.
  2. failover: --trials times, SIGKILL the leader of an RF 3 partition and time until a produce to
     that partition succeeds again (a fresh acks=all send, the producer's own retries and
     metadata refreshes), then restart the killed broker with its data and wait until the
     partition is fully in sync again. p50 / p99 / max. Target: p99 <= session timeout + 1 s, and
     <= 2 s with --session-timeout-ms 1000.
  3. end-to-end latency (send -> a consumer receives it) at --rate msgs/s for --latency-seconds on
     an RF 3 partition (producer acks=all, linger_ms=0: a latency test's setting, not the default
     linger of 5 ms; the default durability), p50 / p99, and where it goes: the brokers run with DMQ_STAGE_TRACE (see
     dmq.broker.replication.stage_trace), so each record's path is timed stage by stage (producer
     linger and send, leader append and fsync, each follower's fetch wake-up, append + fsync and
     report back, the high watermark's advance, the consumer's long-poll wake-up, the answer's
     transit and decoding), p50 / p99 per stage.

With --profile it runs only the RF 3 throughput with each broker under cProfile and prints, for the
leader and a follower, the functions that take the most time of their own (the event loop's thread).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import contextlib
import io
import os
import pathlib
import pstats
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

import grpc

from dmq.broker.replication.stage_trace import TRACE_ENV
from dmq.client import Producer, SimpleConsumer
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _common import paced, percentile  # noqa: E402  (the bench helpers, shared)

START_TIMEOUT_S = 60.0
# --max-in-flight: the producers' max_in_flight_requests_per_connection (None: the default, 5)
IN_FLIGHT: list[int | None] = [None]
SYNC_TIMEOUT_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far (Linux /proc)."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Cluster:
    """A coordinator and three brokers, each its own `python -m dmq.client.cli` process."""

    def __init__(self, root: pathlib.Path, session_timeout_ms: int, brokers: int = 3, profile: bool = False) -> None:
        self.root = root
        self.profile = profile
        self.port = _free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.session_timeout_ms = session_timeout_ms
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.coordinator = self._spawn(
            "coordinator",
            ["coordinator", "--port", str(self.port), "--data-dir", str(root / "coordinator"),
             "--broker-session-timeout-ms", str(session_timeout_ms), "--log-level", "warning"],
            "coordinator listening on",
        )
        self.brokers: dict[int, subprocess.Popen[bytes]] = {}
        for i in range(brokers):
            self.start_broker(i)
        self.channel = grpc.insecure_channel(self.bootstrap)
        self.metadata = pb_grpc.MetadataStub(self.channel)

    def _spawn(self, name: str, args: list[str], ready: str) -> subprocess.Popen[bytes]:
        log_path = self.root / f"{name}.log"
        offset = log_path.stat().st_size if log_path.exists() else 0
        env = {**os.environ, TRACE_ENV: str(self.root / f"{name}.trace")}
        with open(log_path, "ab") as log:
            python = [sys.executable]
            if self.profile and name.startswith("broker"):
                python += ["-m", "cProfile", "-o", str(self.root / f"{name}.prof")]
            proc = subprocess.Popen([*python, "-m", "dmq.client.cli", *args], stdout=log, stderr=log, env=env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if ready in log_path.read_bytes()[offset:].decode(errors="replace"):
                self.procs[name] = proc
                return proc
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        proc.kill()
        raise SystemExit(f"{name} did not start: {log_path.read_bytes()[offset:].decode(errors='replace')[-2000:]}")

    def start_broker(self, i: int) -> None:
        self.brokers[i] = self._spawn(
            f"broker{i}",
            ["broker", "--coordinator", self.bootstrap, "--broker-id", str(i), "--data-dir", str(self.root / f"b{i}"),
             "--log-level", "warning"],
            f"broker {i} listening on",
        )

    def kill_broker(self, i: int) -> None:
        proc = self.brokers.pop(i)
        proc.kill()
        proc.wait(30)

    def create_topic(self, name: str, replication_factor: int, min_insync: int) -> None:
        config = pb.TopicConfig(replication_factor=replication_factor, min_insync_replicas=min_insync)
        self.metadata.CreateTopic(pb.CreateTopicRequest(name=name, partitions=1, config=config), timeout=30)
        self.wait_in_sync(name, replication_factor)

    def partition(self, topic: str) -> pb.PartitionInfo:
        answer = self.metadata.GetMetadata(pb.GetMetadataRequest(topics=[topic]), timeout=10)
        return answer.topics[0].partitions[0]

    def wait_in_sync(self, topic: str, replicas: int) -> pb.PartitionInfo:
        deadline = time.monotonic() + SYNC_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(grpc.RpcError):
                info = self.partition(topic)
                if len(info.isr) == replicas and info.leader_id >= 0 and info.leader_alive:
                    return info
            time.sleep(0.1)
        raise SystemExit(f"{topic}: not {replicas} replicas in sync within {SYNC_TIMEOUT_S} s: {self.partition(topic)}")

    def close(self) -> None:
        self.channel.close()
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
                    proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


def throughput(cluster: Cluster, topic: str, records: int, value: bytes) -> tuple[float, dict[str, float]]:
    """msgs/s of acks=all sends to one partition, and CPU seconds per million records by role."""
    info = cluster.partition(topic)
    roles = {"leader": info.leader_id, **{f"follower {b}": b for b in info.replicas if b != info.leader_id}}
    before = {role: _cpu_s(cluster.brokers[b].pid) for role, b in roles.items()}
    client_before = time.process_time()
    with Producer(cluster.bootstrap, acks="all", linger_ms=5, max_in_flight_requests_per_connection=IN_FLIGHT[0]) as producer:
        start = time.perf_counter()
        for _ in range(records):
            producer.send(topic, value)
        producer.flush()
        elapsed = time.perf_counter() - start
    cpu = {"client": time.process_time() - client_before}
    cpu.update({role: _cpu_s(cluster.brokers[b].pid) - before[role] for role, b in roles.items()})
    return records / elapsed, {role: seconds * 1_000_000 / records for role, seconds in cpu.items()}


def failover(cluster: Cluster, topic: str, trials: int) -> list[float]:
    """Seconds from a leader's SIGKILL until a produce to its partition succeeds, per trial."""
    times = []
    with Producer(cluster.bootstrap, acks="all", linger_ms=0, request_timeout_ms=2_000) as producer:
        producer.send(topic, b"warm-up").get(30)
        for trial in range(trials):
            leader = cluster.partition(topic).leader_id
            killed_at = time.monotonic()
            cluster.kill_broker(leader)
            producer.send(topic, f"after kill {trial}".encode()).get(60)
            times.append(time.monotonic() - killed_at)
            cluster.start_broker(leader)
            cluster.wait_in_sync(topic, 3)
            print(f"  trial {trial + 1:2}: broker {leader} killed, produce ok after {times[-1] * 1000:7.0f} ms",
                  flush=True)
    return times


def end_to_end(cluster: Cluster, topic: str, rate: int, seconds: float) -> list[tuple[int, float, float]]:
    """(offset, send time, receipt time) per record sent at `rate` msgs/s; the value carries the
    send time (wall clock, as the brokers' stage trace)."""
    latencies: list[tuple[int, float, float]] = []
    stop = threading.Event()
    total = int(rate * seconds)

    def consume() -> None:
        with SimpleConsumer(cluster.bootstrap) as consumer:
            _, end = consumer.offsets(topic, 0)
            for batch in consumer.consume_batches(topic, 0, end, max_wait_ms=100):
                received = time.time()
                for i, value in enumerate(batch.values()):
                    latencies.append((batch.base_offset + i, struct.unpack("<d", value[:8])[0], received))
                if len(latencies) >= total or stop.is_set():
                    return

    reader = threading.Thread(target=consume, name="e2e-consumer", daemon=True)
    reader.start()
    time.sleep(1.0)  # the consumer is positioned at the log end before the first send
    padding = b"x" * 92
    with Producer(cluster.bootstrap, acks="all", linger_ms=0, max_in_flight_requests_per_connection=IN_FLIGHT[0]) as producer:
        for _ in paced(rate, total):
            producer.send(topic, struct.pack("<d", time.time()) + padding)
        producer.flush()
    reader.join(seconds + 30)
    stop.set()
    return latencies


def _read_trace(path: pathlib.Path, topic: str) -> dict[str, tuple[list[int], list[float]]]:
    """stage -> (offsets, wall times in s), in the order written (time order within a process)."""
    stages: dict[str, tuple[list[int], list[float]]] = collections.defaultdict(lambda: ([], []))
    if not path.exists():
        return stages
    with open(path) as f:
        for line in f:
            ns, stage, t, _, offset = line.split()
            if t == topic:
                offsets, times = stages[stage]
                offsets.append(int(offset))
                times.append(int(ns) / 1e9)
    return stages


def _first_past(stage: tuple[list[int], list[float]], offset: int) -> float | None:
    """When the stage first reached past `offset` (its offsets made monotonic by breakdown())."""
    offsets, times = stage
    i = bisect.bisect_right(offsets, offset)
    return times[i] if i < len(offsets) else None


def breakdown(root: pathlib.Path, topic: str, leader: int, followers: list[int],
              records: list[tuple[int, float, float]]) -> list[tuple[str, list[float]]]:
    """Per stage of the replicated path, its duration (s) for each record."""
    lead = _read_trace(root / f"broker{leader}.trace", topic)
    follow = {b: _read_trace(root / f"broker{b}.trace", topic) for b in followers}
    for stages in (lead, *follow.values()):
        for offsets, _ in stages.values():
            for i in range(1, len(offsets)):  # two tasks' lines may interleave: a running maximum
                offsets[i] = max(offsets[i], offsets[i - 1])
    received_offsets, received_times = lead["produce_received"]
    rows: dict[str, list[float]] = collections.defaultdict(list)
    for offset, sent, got in records:
        appended = _first_past(lead["leader_appended"], offset)
        if appended is None:
            continue
        # the last Produce that arrived at a log end at or below the record's offset, before it
        # was appended: the one that carried it
        i = bisect.bisect_right(received_offsets, offset) - 1
        arrived = min(received_times[i], appended) if i >= 0 else appended
        marks = {
            "1 producer: send() -> Produce at the leader (linger, batching, transit)": (sent, arrived),
            "2 leader: Produce -> appended": (arrived, appended),
            "3 leader: appended -> fsynced (group commit)": (appended, _first_past(lead["leader_durable"], offset)),
        }
        reported = []
        for b, stages in follow.items():
            fetched = _first_past(stages["follower_received"], offset)
            durable = _first_past(stages["follower_durable"], offset)
            back = _first_past(lead[f"replica_fetch.{b}"], offset)
            reported.append(back)
            marks[f"4 follower {b}: appended on leader -> fetch answer taken (wake-up, transit)"] = (appended, fetched)
            marks[f"5 follower {b}: taken -> appended + fsynced"] = (fetched, durable)
            marks[f"6 follower {b}: fsynced -> next fetch seen by the leader"] = (durable, back)
        hw = _first_past(lead["high_watermark"], offset)
        last_report = max((t for t in reported if t is not None), default=None)
        answered = _first_past(lead["consumer_answer"], offset)
        marks["7 leader: last follower's fetch -> high watermark past it"] = (last_report, hw)
        marks["8 leader: high watermark -> consumer fetch answered (long-poll wake-up, read)"] = (hw, answered)
        marks["9 consumer: answered -> record in the application (transit, decode)"] = (answered, got)
        marks["  producer: send() -> acks=all acknowledged at the leader"] = (
            sent, _first_past(lead["produce_acked"], offset))
        marks["  end to end: send() -> record in the application"] = (sent, got)
        for name, (start, end) in marks.items():
            if start is not None and end is not None:
                rows[name].append(end - start)
    return sorted(rows.items())


def print_profile(path: pathlib.Path, title: str, top: int = 25) -> None:
    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    stats.sort_stats("tottime").print_stats(top)
    lines = out.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    total = next((line.strip() for line in lines if "function calls" in line), "")
    print(f"{title}: {total}", flush=True)
    for line in lines[start:]:
        if line.strip():
            print(f"  {line}", flush=True)


def profile(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="dmq-repl-bench-") as tmp:
        root = pathlib.Path(tmp)
        cluster = Cluster(root, args.session_timeout_ms, profile=True)
        try:
            cluster.create_topic("rf3", 3, 2)
            info = cluster.partition("rf3")
            rate, cpu = throughput(cluster, "rf3", args.records, b"v" * args.value_bytes)
            shares = ", ".join(f"{role} {s:.1f}" for role, s in cpu.items())
            print(f"produce rf3 acks=all under cProfile: {rate:10,.0f} msgs/s   CPU s per 1M records: {shares}",
                  flush=True)
        finally:
            cluster.close()  # the brokers write their profiles as they exit
        follower = next(b for b in info.replicas if b != info.leader_id)
        print_profile(root / f"broker{info.leader_id}.prof", f"leader (broker {info.leader_id})")
        print_profile(root / f"broker{follower}.prof", f"follower (broker {follower})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--session-timeout-ms", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--max-in-flight", type=int, default=None,
                        help="the producers' max_in_flight_requests_per_connection (default: the producer's, 5)")
    parser.add_argument("--profile", action="store_true", help="profile the RF 3 brokers instead (see above)")
    parser.add_argument("--only", choices=("throughput", "failover", "latency"),
                        help="run one of the three parts (default: all)")
    args = parser.parse_args()
    IN_FLIGHT[0] = args.max_in_flight
    if args.profile:
        profile(args)
        return

    print(f"replication_bench: {os.cpu_count()} cpus, {time.strftime('%Y-%m-%d %H:%M:%S')}, "
          f"{args.records} records of {args.value_bytes} B, session timeout {args.session_timeout_ms} ms", flush=True)
    with tempfile.TemporaryDirectory(prefix="dmq-repl-bench-") as tmp:
        cluster = Cluster(pathlib.Path(tmp), args.session_timeout_ms)
        try:
            value = b"v" * args.value_bytes
            if args.only in (None, "throughput"):
                cluster.create_topic("rf1", 1, 1)
                cluster.create_topic("rf3", 3, 2)
                rates = {}
                for topic in ("rf1", "rf3"):
                    rates[topic], cpu = throughput(cluster, topic, args.records, value)
                    shares = ", ".join(f"{role} {s:.1f}" for role, s in cpu.items())
                    print(f"produce {topic} acks=all: {rates[topic]:10,.0f} msgs/s   CPU s per 1M records: {shares}",
                          flush=True)
                print(f"RF 3 / RF 1 throughput: {rates['rf3'] / rates['rf1']:.0%} (target >= 60%)", flush=True)

            if args.only in (None, "failover"):
                cluster.create_topic("failover", 3, 2)
                times = failover(cluster, "failover", args.trials)
                print(f"failover over {len(times)} trials: p50 {statistics.median(times) * 1000:.0f} ms, "
                      f"p99 {percentile(times, 0.99) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms "
                      f"(target p99 <= {args.session_timeout_ms + 1000} ms)", flush=True)

            latencies: list[float] = []
            if args.only not in (None, "latency"):
                return
            cluster.create_topic("latency", 3, 2)
            info = cluster.partition("latency")
            print("end-to-end: producer acks=all, linger_ms=0 (the default durability: fsync before the ack on every "
                  f"in-sync replica; max_in_flight_requests_per_connection {IN_FLIGHT[0] or 'default (5)'}), consumer "
                  "SimpleConsumer.consume_batches(max_wait_ms=100) in a thread of the same process", flush=True)
            records = end_to_end(cluster, "latency", args.rate, args.latency_seconds)
            latencies = [got - sent for _, sent, got in records]
            if latencies:
                print(f"end-to-end at {args.rate:,} msgs/s RF 3: {len(latencies)} records, "
                      f"p50 {statistics.median(latencies) * 1000:.1f} ms, p99 {percentile(latencies, 0.99) * 1000:.1f} ms",
                      flush=True)
            else:
                print("end-to-end: no record received", flush=True)
        finally:
            cluster.close()  # the brokers write out their stage traces as they stop
        if latencies:
            followers = [b for b in info.replicas if b != info.leader_id]
            print(f"where it goes (leader broker {info.leader_id}; ms per record, p50 / p99; stages overlap: "
                  "the leader's fsync runs beside the followers' fetches):", flush=True)
            for name, values in breakdown(pathlib.Path(tmp), "latency", info.leader_id, followers, records):
                print(f"  {name:<80} {statistics.median(values) * 1000:6.2f} / "
                      f"{percentile(values, 0.99) * 1000:6.2f}", flush=True)


if __name__ == "__main__":
    main()
