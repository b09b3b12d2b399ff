"""End-to-end produce / consume throughput and produce latency against a real server.

    .venv/bin/python bench/produce_consume.py [--records 1000000] [--partitions 8]

Starts the embedded server (coordinator + one broker, fsync flush policy) in a SUBPROCESS on port
0 with data in a temporary directory, so the server has its own interpreter (and GIL) like a
real deployment, then in this process measures:

  1. one Producer, acks=all, --records 100-byte values through send(), then flush (msgs/s, MB/s);
  2. the same through send_many() in chunks of --chunk values;
  3. one SimpleConsumer reading all of them back with consume_batches() and iterating every
     record (msgs/s, MB/s), and consume() building ConsumerRecords;
  4. 1-2 again with 1 KB values (--records-1k of them);
  5. latency from send() to its callback at a steady --rate msgs/s for --latency-seconds
     (p50 / p99 / max), with the default linger_ms=5 and with linger_ms=0.

Values are distinct random bytes generated before the clock starts. MB/s counts value bytes.
Figures vary run to run on a shared machine: compare within one run.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

import structlog

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _server import embedded_server  # noqa: E402  (the bench helpers, shared)


def make_values(n: int, size: int) -> list[bytes]:
    blob = os.urandom(n * size)
    return [blob[i : i + size] for i in range(0, n * size, size)]


def report(name: str, n: int, size: int, seconds: float) -> None:
    print(f"  {name:<34} {n / seconds:>12,.0f} msgs/s {n * size / seconds / 1e6:>9.1f} MB/s  ({seconds:.2f} s)")


def bench_send(bootstrap: str, topic: str, values: list[bytes]) -> tuple[float, float]:
    """(seconds until all are acknowledged, seconds spent in the send() loop)."""
    from dmq.client import Producer

    with Producer(bootstrap, acks="all") as producer:
        send = producer.send
        producer.send(topic, values[0]).get(30)  # metadata + connection outside the clock
        t0 = time.perf_counter()
        for v in values:
            send(topic, v)
        t_loop = time.perf_counter() - t0
        producer.flush(300)
        return time.perf_counter() - t0, t_loop


def bench_send_many(bootstrap: str, topic: str, values: list[bytes], chunk: int) -> float:
    from dmq.client import Producer

    with Producer(bootstrap, acks="all") as producer:
        producer.send(topic, values[0]).get(30)
        t0 = time.perf_counter()
        for i in range(0, len(values), chunk):
            producer.send_many(topic, values[i : i + chunk])
        producer.flush(300)
        return time.perf_counter() - t0


def bench_consume_batches(bootstrap: str, topic: str, partitions: int) -> tuple[int, float]:
    from dmq.client import SimpleConsumer

    with SimpleConsumer(bootstrap, max_wait_ms=0) as consumer:
        ends = [consumer.offsets(topic, p)[1] for p in range(partitions)]
        n = 0
        t0 = time.perf_counter()
        for p in range(partitions):
            for batch in consumer.consume_batches(topic, p, 0, end_offset=ends[p]):
                for _record in batch:
                    n += 1
        return n, time.perf_counter() - t0


def bench_consume(bootstrap: str, topic: str, partitions: int) -> tuple[int, float]:
    from dmq.client import SimpleConsumer

    with SimpleConsumer(bootstrap, max_wait_ms=0) as consumer:
        ends = [consumer.offsets(topic, p)[1] for p in range(partitions)]
        n = 0
        t0 = time.perf_counter()
        for p in range(partitions):
            offset = 0
            while offset < ends[p]:
                recs = consumer.consume(topic, p, offset, max_records=100_000)
                n += len(recs)
                offset = recs[-1].offset + 1
        return n, time.perf_counter() - t0


def bench_latency(
    bootstrap: str, topic: str, rate: int, seconds: float, linger_ms: float, warmup_s: float
) -> list[float]:
    """Latency in a steady state: the first warmup_s at the same rate are sent but not counted."""
    from dmq.client import Producer

    latencies: list[float] = []
    value = os.urandom(100)
    with Producer(bootstrap, acks="all", linger_ms=linger_ms) as producer:
        producer.send(topic, value).get(30)
        warmup = int(rate * warmup_s)
        total = warmup + int(rate * seconds)
        per_tick = max(1, rate // 1000)  # send in 1 ms ticks
        start = time.perf_counter()
        sent = 0
        while sent < total:
            due = start + sent / rate
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            if sent < warmup:
                for _ in range(per_tick):
                    producer.send(topic, value)
            else:
                for _ in range(per_tick):
                    t = time.perf_counter()
                    producer.send(topic, value, callback=lambda m, e, t=t: latencies.append(time.perf_counter() - t))
            sent += per_tick
        producer.flush(60)
    return latencies


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--records-1k", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=10_000, help="values per send_many() call")
    ap.add_argument("--rate", type=int, default=10_000, help="latency test: msgs/s")
    ap.add_argument("--latency-warmup-seconds", type=float, default=2.0,
                    help="latency test: seconds sent at --rate before measuring")
    ap.add_argument("--latency-seconds", type=float, default=5.0)
    ap.add_argument("--skip-1k", action="store_true")
    args = ap.parse_args()

    import logging

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    from dmq.client import AdminClient

    with tempfile.TemporaryDirectory(prefix="dmq-bench-") as tmp:
        server = embedded_server(pathlib.Path(tmp))
        try:
            print(f"server {server.bootstrap} (subprocess), {args.partitions} partitions, acks=all, fsync flush")
            admin = AdminClient(server.bootstrap)
            for size, n, label in ((100, args.records, "100 B"), (1024, args.records_1k, "1 KB")):
                if size == 1024 and args.skip_1k:
                    continue
                values = make_values(n, size)
                print(f"{label} values, {n:,} records")
                t_send = f"send-{size}"
                admin.create_topic(t_send, args.partitions)
                total_s, loop_s = bench_send(server.bootstrap, t_send, values)
                report("produce send()", n, size, total_s)
                print(f"    (time inside the send() loop: {loop_s / n * 1e6:.2f} us per call, incl. the sender thread and any wait for buffer_memory)")
                t_many = f"send-many-{size}"
                admin.create_topic(t_many, args.partitions)
                report(f"produce send_many() x{args.chunk}", n, size,
                       bench_send_many(server.bootstrap, t_many, values, args.chunk))
                got, secs = bench_consume_batches(server.bootstrap, t_send, args.partitions)
                report("consume_batches() + iterate", got, size, secs)
                got, secs = bench_consume(server.bootstrap, t_many, args.partitions)
                report("consume() -> ConsumerRecord", got, size, secs)
                del values
            # The throughput runs above leave gigabytes of dirty pages; writing them back makes
            # fsyncs stall for seconds. Latency is measured in a steady state at the given rate:
            # write the backlog out first, then warm up at the rate before counting.
            os.sync()
            for linger_ms in (5, 0):  # the default, then no lingering at all
                t_lat = f"latency-{linger_ms}"
                admin.create_topic(t_lat, args.partitions)
                lat = bench_latency(
                    server.bootstrap, t_lat, args.rate, args.latency_seconds, linger_ms, args.latency_warmup_seconds
                )
                print(
                    f"latency send() -> callback at {args.rate:,} msgs/s after {args.latency_warmup_seconds:g} s "
                    f"of warm-up at that rate, linger_ms={linger_ms}, "
                    f"{len(lat):,} records: p50 {percentile(lat, 0.5) * 1e3:.2f} ms, "
                    f"p99 {percentile(lat, 0.99) * 1e3:.2f} ms, max {max(lat) * 1e3:.2f} ms"
                )
            admin.close()
        finally:
            server.stop()


if __name__ == "__main__":
    main()
