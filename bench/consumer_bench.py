"""DMQConsumer throughput and end-to-end latency against a real server.

    .venv/bin/python bench/consumer_bench.py [--records 1000000] [--partitions 6]
                                             [--rate 10000] [--latency-seconds 10]

The embedded server runs in a subprocess (its own interpreter and GIL, like a deployment; the
helpers of bench/_server.py). Then:

  1. throughput: --records 100-byte values are produced (send_many, not timed) over
     --partitions partitions; one DMQConsumer (a fresh group, subscription_mode "all") polls
     them all, touching every record (len(record.value)). Printed: msgs/s from the first poll()
     (join and first assignment included) and from the first record (steady state), for the
     default max_poll_records and a larger one.
  2. latency: a producer PROCESS sends 100-byte values carrying time.time_ns() at a steady
     --rate msgs/s for --latency-seconds; the DMQConsumer in this process records, per record,
     poll() return time minus send() time. Printed: p50 / p99 / p99.9 / max in ms.

Targets (issue): >= 1,200,000 msgs/s touched; p99 <= 10 ms at 10,000 msgs/s. Redis Streams from
Python reaches about 100,000 msgs/s group-consume on this machine (shared/peers/README.md).
Figures vary from run to run on a shared machine: compare within one run.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import subprocess
import sys
import textwrap
import time
import uuid

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _common import bench_parser, percentile, quiet_logs  # noqa: E402  (the bench helpers, shared)
from _server import running_embedded_server  # noqa: E402
from produce_consume import make_values  # noqa: E402

PRODUCER_SCRIPT = textwrap.dedent(
    """
    import struct, sys, time, logging
    import structlog
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    from dmq.client import Producer
    bootstrap, topic, rate, seconds, acks = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
    pad = b"x" * 92
    pack = struct.Struct("<q").pack
    acked = []
    with Producer(bootstrap, acks=acks if acks == "all" else int(acks), linger_ms=0) as p:
        p.send(topic, pack(time.time_ns()) + pad).get(30)
        print("READY", flush=True)
        sys.stdin.readline()
        n = int(rate * seconds)
        start = time.perf_counter()
        for i in range(n):
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0.0005:
                time.sleep(delay)
            t = time.perf_counter()
            p.send(topic, pack(time.time_ns()) + pad,
                   callback=lambda m, e, t=t: acked.append(time.perf_counter() - t))
        p.flush(60)
    acked.sort()
    print("DONE", n, acked[len(acked) // 2] * 1000, acked[int(len(acked) * 0.99)] * 1000, flush=True)
    """
)


def consumer_config(bootstrap: str, **kw: object):  # type: ignore[no-untyped-def]
    from dmq.client.consumer import ConsumerConfig

    return ConsumerConfig(
        metadata_service_url=bootstrap,
        group_id=f"bench-{uuid.uuid4().hex[:8]}",
        subscription_mode="all",
        **kw,  # type: ignore[arg-type]
    )


def bench_throughput(bootstrap: str, topic: str, n: int, max_poll_records: int) -> tuple[float, float, float]:
    """(msgs/s from the first poll, msgs/s from the first record, msgs per client CPU-second)."""
    from dmq.client.consumer import DMQConsumer

    with DMQConsumer(consumer_config(bootstrap, max_poll_records=max_poll_records)) as consumer:
        consumer.subscribe(topic)
        seen = 0
        touched = 0
        t0 = time.perf_counter()
        first = cpu0 = 0.0
        while seen < n:
            records = consumer.poll(1000)
            if not first and records:
                first, cpu0 = time.perf_counter(), time.process_time()
            for r in records:
                touched += len(r.value)
                seen += 1
        t1, cpu1 = time.perf_counter(), time.process_time()
    assert touched == 100 * seen, "every record touched"
    return seen / (t1 - t0), seen / (t1 - first), seen / (cpu1 - cpu0)


def run_throughput(bootstrap: str, args: argparse.Namespace) -> None:
    from dmq.client import Producer

    values = make_values(args.records, 100)
    per = args.records // args.partitions
    with Producer(bootstrap, acks="all") as producer:
        for part in range(args.partitions):
            chunk = values[part * per : (part + 1) * per if part < args.partitions - 1 else None]
            for i in range(0, len(chunk), 10_000):
                producer.send_many("bench", chunk[i : i + 10_000], partition=part)
        producer.flush(300)
    del values
    print(f"DMQConsumer, {args.records:,} x 100-byte records over {args.partitions} partitions, each record "
          f"touched, server in a subprocess ({args.runs} runs; best / median):")
    for mpr in (500, 5000):
        runs = [bench_throughput(bootstrap, "bench", args.records, mpr) for _ in range(args.runs)]
        total, steady, per_cpu = (sorted(r[i] for r in runs) for i in range(3))
        print(f"  max_poll_records={mpr:<5} from first record {steady[-1]:>10,.0f} / {statistics.median(steady):>10,.0f} "
              f"msgs/s | from subscribe (join included) {total[-1]:>10,.0f} / {statistics.median(total):>10,.0f} | "
              f"per client CPU-second {per_cpu[-1]:>10,.0f} / {statistics.median(per_cpu):>10,.0f}")


def bench_latency(
    bootstrap: str, topic: str, rate: float, seconds: float, acks: str = "all"
) -> tuple[list[float], tuple[float, float]]:
    """Per-record send() -> poll() latencies (ms), and the producer's own send() -> ack p50/p99."""
    from dmq.client.consumer import DMQConsumer

    producer = subprocess.Popen(
        [sys.executable, "-c", PRODUCER_SCRIPT, bootstrap, topic, str(rate), str(seconds), acks],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert producer.stdin is not None and producer.stdout is not None
    if producer.stdout.readline().strip() != "READY":
        raise SystemExit("latency producer did not start")
    latencies_ms: list[float] = []
    with DMQConsumer(consumer_config(bootstrap, fetch_max_wait_ms=500)) as consumer:
        consumer.subscribe(topic)
        while not consumer.assignment():  # join outside the measurement
            consumer.poll(100)
        consumer.seek_to_end()
        consumer.poll(0)
        producer.stdin.write("go\n")
        producer.stdin.flush()
        expected = int(rate * seconds)
        deadline = time.monotonic() + seconds + 30
        while len(latencies_ms) < expected and time.monotonic() < deadline:
            records = consumer.poll(500)
            now = time.time_ns()
            for r in records:
                latencies_ms.append((now - int.from_bytes(r.value[:8], "little", signed=True)) / 1e6)
    done = producer.stdout.readline().split()
    producer.wait(60)
    return latencies_ms, (float(done[2]), float(done[3]))


def main() -> None:
    p = bench_parser(__doc__, records=1_000_000, partitions=6)
    p.add_argument("--rate", type=float, default=10_000)
    p.add_argument("--latency-seconds", type=float, default=10.0)
    p.add_argument("--runs", type=int, default=3, help="throughput runs per setting (best and median shown)")
    p.add_argument("--only", choices=["throughput", "latency"], help="run one of the two parts")
    p.add_argument("--acks", choices=["all", "1"], default="all", help="the latency producer's acks")
    args = p.parse_args()
    quiet_logs()
    from dmq.client import AdminClient

    with running_embedded_server("dmq-consumer-bench-") as server:
        with AdminClient(server.bootstrap) as admin:
            admin.create_topic("bench", args.partitions)
            admin.create_topic("latency", args.partitions)
        if args.only != "latency":
            run_throughput(server.bootstrap, args)
        if args.only != "throughput":
            got, (ack50, ack99) = bench_latency(server.bootstrap, "latency", args.rate, args.latency_seconds, args.acks)
            lat = sorted(got)
            print(f"End-to-end latency send() -> poll(), {args.rate:,.0f} msgs/s for {args.latency_seconds:.0f} s "
                  f"({len(lat):,} records; producer acks={args.acks}, linger_ms=0, in another process):")
            print(f"  p50 {percentile(lat, 0.5):.2f} ms  p99 {percentile(lat, 0.99):.2f} ms  "
                  f"p99.9 {percentile(lat, 0.999):.2f} ms  max {lat[-1]:.2f} ms   "
                  f"(the producer's own send() -> ack: p50 {ack50:.2f} ms, p99 {ack99:.2f} ms)")


if __name__ == "__main__":
    main()
