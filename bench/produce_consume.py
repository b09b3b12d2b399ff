"""End-to-end produce / consume throughput and produce latency against a real server.

    .venv/bin/python bench/produce_consume.py [--records 1000000] [--partitions 8]

Starts the embedded server (coordinator + one broker, fsync flush policy) in a SUBPROCESS on port
0 with data in a temporary directory, so the server has its own interpreter (and GIL) like a
real deployment, then in this process measures:

  1. one Producer, acks=all, --records 100-byte values through send(), then flush (msgs/s, MB/s);
  2. the same through send_many() in chunks of --chunk values;
  3. one SimpleConsumer reading all of them back with consume_batches() and iterating every
     record (msgs/s, MB/s), and consume() building ConsumerRecords (the list API), then one
     DMQConsumer (a fresh group) reading them with a poll() loop and with `for record in
     consumer`; every consume path touches every value (len(record.value));
  4. 1-2 again with 1 KB values (--records-1k of them);
  5. latency from send() to its callback at a steady --rate msgs/s for --latency-seconds
     (p50 / p99 / max), with the default linger_ms=5 and with linger_ms=0.

Values are distinct random bytes generated before the clock starts. MB/s counts value bytes.
Figures vary run to run on a shared machine: compare within one run. `--runs N` repeats the
100 B produce / consume paths N times and prints each run and the median; `--redis-json` names
the results file of the Redis peer run in the same sitting
(`/work/shared/peers/bench_redis.py --parser hiredis` writes results/redis_aof-no_hiredis.json)
and prints DMQ's medians as ratios to its medians. `--only throughput` skips 1 KB and latency.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

import structlog

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _common import paced, percentile  # noqa: E402  (the bench helpers, shared)
from _server import embedded_server  # noqa: E402


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


def bench_consume(bootstrap: str, topic: str, partitions: int, max_records: int = 100_000) -> tuple[int, float]:
    """The list API: consume() calls, each record's value touched."""
    from dmq.client import SimpleConsumer

    with SimpleConsumer(bootstrap, max_wait_ms=0) as consumer:
        ends = [consumer.offsets(topic, p)[1] for p in range(partitions)]
        n = touched = 0
        t0 = time.perf_counter()
        for p in range(partitions):
            offset = 0
            while offset < ends[p]:
                recs = consumer.consume(topic, p, offset, max_records=max_records)
                for r in recs:
                    touched += len(r.value)
                n += len(recs)
                offset = recs[-1].offset + 1
        secs = time.perf_counter() - t0
    assert touched > 0 and n == sum(ends), "every record read"
    return n, secs


def bench_group(bootstrap: str, topic: str, n: int, iterate: bool) -> tuple[int, float]:
    """A DMQConsumer of a fresh group reads n records with a poll() loop or by iteration, each
    value touched; the clock starts at the first record (join and first assignment excluded)."""
    import uuid

    from dmq.client.consumer import ConsumerConfig, DMQConsumer

    config = ConsumerConfig(
        metadata_service_url=bootstrap, group_id=f"bench-{uuid.uuid4().hex[:8]}", subscription_mode="all",
        consumer_timeout_ms=30_000,
    )
    seen = touched = 0
    with DMQConsumer(config) as consumer:
        consumer.subscribe(topic)
        if iterate:
            it = iter(consumer)
            touched += len(next(it).value)
            seen = 1
            t0 = time.perf_counter()
            for r in it:
                touched += len(r.value)
                seen += 1
                if seen >= n:
                    break
        else:
            first = consumer.poll(30_000)
            seen = len(first)
            t0 = time.perf_counter()
            while seen < n:
                for r in consumer.poll(1000):
                    touched += len(r.value)
                    seen += 1
        secs = time.perf_counter() - t0
    assert seen >= n, (seen, n)  # send() topics hold one more: the warm-up record
    return seen, secs


def redis_medians(path: str) -> dict[str, float]:
    """The Redis peer's medians (msgs/s) of 100 B produce and group consume from its results file."""
    import json
    import statistics

    rows = json.loads(pathlib.Path(path).read_text())["rows"]
    out = {}
    for row in rows:
        if row["unit"] == "msgs/s" and "x 100B" in row["what"]:
            kind = "produce" if "XADD" in row["what"] else "consume"
            out[kind] = row.get("median") or statistics.median(row["values"])
    return out


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
        for sent in paced(rate, total, per_tick):
            if sent < warmup:
                for _ in range(per_tick):
                    producer.send(topic, value)
            else:
                for _ in range(per_tick):
                    t = time.perf_counter()
                    producer.send(topic, value, callback=lambda m, e, t=t: latencies.append(time.perf_counter() - t))
        producer.flush(60)
    return latencies


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
    ap.add_argument("--runs", type=int, default=1, help="runs of the 100 B produce / consume paths (median shown)")
    ap.add_argument("--only", choices=["throughput"], help="100 B throughput only (no 1 KB, no latency)")
    ap.add_argument("--redis-json", help="the Redis peer's results file: print ratios to its medians")
    args = ap.parse_args()
    if args.only:
        args.skip_1k = True

    import logging

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    from dmq.client import AdminClient

    with tempfile.TemporaryDirectory(prefix="dmq-bench-") as tmp:
        server = embedded_server(pathlib.Path(tmp))
        try:
            print(f"server {server.bootstrap} (subprocess), {args.partitions} partitions, acks=all, fsync flush")
            admin = AdminClient(server.bootstrap)
            medians: dict[str, float] = {}
            for size, n, label in ((100, args.records, "100 B"), (1024, args.records_1k, "1 KB")):
                if size == 1024 and args.skip_1k:
                    continue
                values = make_values(n, size)
                print(f"{label} values, {n:,} records")
                rates: dict[str, list[float]] = {}
                for run in range(args.runs if size == 100 else 1):
                    t_send = f"send-{size}-{run}"
                    admin.create_topic(t_send, args.partitions)
                    total_s, loop_s = bench_send(server.bootstrap, t_send, values)
                    report("produce send()", n, size, total_s)
                    rates.setdefault("produce send()", []).append(n / total_s)
                    print(f"    (time inside the send() loop: {loop_s / n * 1e6:.2f} us per call, incl. the sender thread and any wait for buffer_memory)")
                    t_many = f"send-many-{size}-{run}"
                    admin.create_topic(t_many, args.partitions)
                    report(f"produce send_many() x{args.chunk}", n, size,
                           bench_send_many(server.bootstrap, t_many, values, args.chunk))
                    for name, (got, secs) in (
                        ("consume_batches() + iterate", bench_consume_batches(server.bootstrap, t_send, args.partitions)),
                        ("consume() lists (max_records 100000)", bench_consume(server.bootstrap, t_many, args.partitions)),
                        ("consume() lists (max_records 500)", bench_consume(server.bootstrap, t_send, args.partitions, 500)),
                        ("group poll() loop", bench_group(server.bootstrap, t_send, n, iterate=False)),
                        ("group iteration", bench_group(server.bootstrap, t_many, n, iterate=True)),
                    ):
                        report(name, got, size, secs)
                        rates.setdefault(name, []).append(got / secs)
                if size == 100:
                    medians = {name: statistics.median(xs) for name, xs in rates.items()}
                    if args.runs > 1:
                        print(f"  medians of {args.runs} runs:")
                        for name, rate in medians.items():
                            print(f"    {name:<38} {rate:>12,.0f} msgs/s")
                del values
            if args.redis_json:
                peer = redis_medians(args.redis_json)
                print(f"ratios to Redis Streams ({args.redis_json}: produce {peer['produce']:,.0f}, "
                      f"group consume {peer['consume']:,.0f} msgs/s, medians):")
                for name, rate in medians.items():
                    kind = "produce" if name.startswith("produce") else "consume"
                    print(f"    {name:<38} {rate / peer[kind]:>6.2f}x")
            if args.only:
                admin.close()
                return
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
