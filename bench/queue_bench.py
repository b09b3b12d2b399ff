"""Queue mode throughput (issue 16), beside Redis Streams as a work queue.

    .venv/bin/python bench/queue_bench.py [--records 1000000] [--records-1 5000] [--workers 4]
                                          [--partitions 8] [--produce-records 300000] [--no-redis]
                                          [--prefetch 1000] [--records-prefetch 20000]
                                          [--prefetch-1000 10000]

The embedded server runs in a subprocess (bench/_server.py). Workloads, 100-byte values:

  1. pop + ack, batches of 1,000, one worker: --records are produced (not timed), then one
     QueueConsumer drains them: pop(max_records=1000, ack=previous lease) — the ack rides on the
     next pop, so a cycle is one round trip — touching every value. msgs/s = records / drain time
     (first pop to the last lease's ack, durable: once all records are in, the last lease is acked
     on its own, as the Redis peer stops at its first empty reply; until 2026-11-27 the loop ended
     with a pop that waited 0.5 s for nothing, and that wait was in the time). Rows 2-2c likewise.
  2. the same with batches of 1 (--records-1 records). Each pop's lease and each ack are durable
     (fsynced) before they are answered; an ack riding on a pop that takes the same partition
     again is stored with the next lease in one write, so such a cycle costs one fsync.
  2b. batches of 1 with prefetch (--records-prefetch records, QueueConsumer(prefetch_records=
     --prefetch)): the same loop, pop(max_records=1, ack=previous), but a pop that goes to the
     broker leases up to --prefetch records and the consumer hands them out one at a time; the
     ack of each is recorded locally and rides on the next pop that goes to the broker (the one
     that finds the prefetched records used up), as Kafka's share consumer does (KIP-932). So a
     cycle is a local hand-out plus, per --prefetch records, one round trip and one durable write
     (the acks and the next lease). The time includes a final commit() (the last acks durable).
     A record whose ack was only local is redelivered if the worker dies (at least once).
  2c. batches of 1,000 with QueueConsumer(prefetch_records=--prefetch-1000): the loop of 1, but
     a pop that goes to the broker leases up to that many records and they are handed out 1,000
     at a time, the acks riding as in 2b (--records records).
  3. batches of 1,000 from --workers worker processes started together (a fresh topic). A worker
     does not know its share, so each stops at a pop that found nothing for 0.5 s (in the time).
  4. produce msgs/s (send_many, acks=all) into a topic without and with max_queue_size (set high
     enough never to refuse, so only the check's cost shows). Transaction ids are issue 16's other
     part (another change) and not measured here.

Then, unless --no-redis, the peer `bench_redis_queue.py` (XREADGROUP COUNT 1000 / COUNT 1 + XACK,
1 and 4 workers; /work/shared/peers) runs once and its table is printed beside ours.
Figures vary with the machine's load (printed): compare within one run.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import structlog

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _server import embedded_server  # noqa: E402  (the bench helpers, shared)

SIZE = 100
PEERS = pathlib.Path(os.environ.get("DMQ_PEERS_DIR", "/work/shared/peers"))
PEERS_PYTHON = os.environ.get("DMQ_PEERS_PYTHON", "/tmp/peers-venv/bin/python")


def _quiet() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def load(bootstrap: str, topic: str, partitions: int, n: int, **config: int) -> None:
    from dmq.client import AdminClient, Producer

    with AdminClient(bootstrap) as admin:
        admin.create_topic(topic, partitions, config=config or None)
    value = os.urandom(SIZE)
    per = n // partitions
    chunk = min(per, 1000)  # one batch per 1,000 records, as a bulk producer sends them
    with Producer(bootstrap, linger_ms=5) as p:
        futures = [
            p.send_many(topic, [value] * min(chunk, per - k), partition=i)
            for i in range(partitions)
            for k in range(0, per, chunk)
        ]
        p.flush(300)
        for f in futures:
            f.get(300)


def drain(bootstrap: str, topic: str, batch: int, prefetch: int = 0, expected: int | None = None) -> tuple[int, float, float]:
    """(records, first pop time, last ack time) of one worker draining the topic.

    `expected` (the topic's record count, known when one worker drains it): the last lease is
    acked on its own (durable when ack() returns) once all are in, as the Redis peer stops at its
    first empty reply. Without it (several workers share the topic) the worker stops at a pop that
    found nothing for 0.5 s, and that wait is in its time."""
    from dmq.client import QueueConsumer

    got = touched = 0
    with QueueConsumer(bootstrap, topic, "bench", max_records=batch, prefetch_records=prefetch) as q:
        lease = q.pop(timeout=5)
        start = time.perf_counter()
        while lease is not None:
            for r in lease.records:
                touched += len(r.value)
            got += len(lease.records)
            if expected is not None and got >= expected:
                q.ack(lease)
                break
            lease = q.pop(timeout=5 if expected is not None else 0.5, ack=lease)
        q.commit()  # with prefetch: acks still only local are made durable (none are without)
        end = time.perf_counter()
    assert touched == got * SIZE
    return got, start, end


def _worker(bootstrap: str, topic: str, batch: int, barrier: object, out: object) -> None:
    _quiet()
    barrier.wait(120)  # type: ignore[attr-defined]
    out.put(drain(bootstrap, topic, batch))  # type: ignore[attr-defined]


def drain_processes(bootstrap: str, topic: str, batch: int, workers: int) -> tuple[int, float]:
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(bootstrap, topic, batch, barrier, out)) for _ in range(workers)]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=600) for _ in procs]
    finally:
        for p in procs:
            p.join(60)
    # perf_counter is CLOCK_MONOTONIC on Linux: comparable across the processes
    return sum(r[0] for r in results), max(r[2] for r in results) - min(r[1] for r in results)


def produce_rate(bootstrap: str, topic: str, n: int, **config: int) -> float:
    from dmq.client import AdminClient, Producer

    with AdminClient(bootstrap) as admin:
        admin.create_topic(topic, 4, config=config or None)
    value = os.urandom(SIZE)
    chunk = 1000
    with Producer(bootstrap, linger_ms=5) as p:
        start = time.perf_counter()
        futures = [p.send_many(topic, [value] * chunk) for _ in range(n // chunk)]
        p.flush(300)
        for f in futures:
            f.get(300)
        return n / (time.perf_counter() - start)


def redis_peer() -> list[str]:
    script = PEERS / "bench_redis_queue.py"
    if not script.exists() or not pathlib.Path(PEERS_PYTHON).exists():
        return [f"(Redis peer not run: {script} or {PEERS_PYTHON} missing)"]
    done = subprocess.run([PEERS_PYTHON, str(script), "--runs", "1"], cwd=PEERS, capture_output=True, text=True,
                          timeout=1800, check=False)
    if done.returncode != 0:
        return [f"(Redis peer failed: {done.stderr.strip()[-500:]})"]
    return [line for line in done.stdout.splitlines() if line.startswith(("|", "Redis", "median"))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--records-1", type=int, default=5_000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--produce-records", type=int, default=300_000)
    ap.add_argument("--no-redis", action="store_true")
    ap.add_argument("--prefetch", type=int, default=1000, help="prefetch_records of the prefetching batches-of-1 row")
    ap.add_argument("--records-prefetch", type=int, default=20_000)
    ap.add_argument("--prefetch-1000", type=int, default=10_000,
                    help="prefetch_records of the prefetching batches-of-1,000 row (0: skip it)")
    args = ap.parse_args()
    _quiet()
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    rows: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = embedded_server(pathlib.Path(tmp))
        try:
            b = server.bootstrap
            load(b, "q1000", args.partitions, args.records)
            n, start, end = drain(b, "q1000", 1000, expected=args.records)
            assert n == args.records, n
            rows.append((f"pop+ack batches of 1,000, 1 worker, {n:,} msgs", n / (end - start)))
            load(b, "q1", args.partitions, args.records_1)
            n, start, end = drain(b, "q1", 1, expected=args.records_1)
            assert n == args.records_1, n
            rows.append((f"pop+ack batches of 1, 1 worker, {n:,} msgs", n / (end - start)))
            load(b, "q1p", args.partitions, args.records_prefetch)
            n, start, end = drain(b, "q1p", 1, args.prefetch, expected=args.records_prefetch)
            assert n == args.records_prefetch, n
            rows.append((f"pop+ack batches of 1, 1 worker, prefetch {args.prefetch:,}, {n:,} msgs", n / (end - start)))
            if args.prefetch_1000:
                load(b, "q1000p", args.partitions, args.records)
                n, start, end = drain(b, "q1000p", 1000, args.prefetch_1000, expected=args.records)
                assert n == args.records, n
                rows.append((f"pop+ack batches of 1,000, 1 worker, prefetch {args.prefetch_1000:,}, {n:,} msgs",
                             n / (end - start)))
            load(b, "qw", args.partitions, args.records)
            n, wall = drain_processes(b, "qw", 1000, args.workers)
            assert n == args.records, n
            rows.append((f"pop+ack batches of 1,000, {args.workers} worker processes, {n:,} msgs", n / wall))
            off = produce_rate(b, "p-off", args.produce_records)
            on = produce_rate(b, "p-on", args.produce_records, max_queue_size=10**12)
            rows.append((f"produce, max_queue_size off, {args.produce_records:,} msgs", off))
            rows.append((f"produce, max_queue_size on, {args.produce_records:,} msgs ({(1 - on / off) * 100:+.1f}% cost)", on))
        finally:
            server.stop()
    w = max(len(r[0]) for r in rows)
    print(f"\nDMQ queue mode, {SIZE}-byte values, embedded server in a subprocess, leases and acks fsynced")
    print(f"| {'workload':<{w}} | {'msgs/s':>10} |")
    print(f"|{'-' * (w + 2)}|{'-' * 12}|")
    for what, rate in rows:
        print(f"| {what:<{w}} | {rate:>10,.0f} |")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    if not args.no_redis:
        print("\nPeer (same machine, same run):")
        for line in redis_peer():
            print(line)


if __name__ == "__main__":
    main()
