"""Produce throughput with transaction ids and trace ids against a real server.

    .venv/bin/python bench/txn_bench.py [--records 200000] [--partitions 8] [--runs 3]

Starts the embedded server (coordinator + one broker, fsync flush policy) in a subprocess, then
measures one Producer (acks=all, default batching, 100-byte values, send() then flush()) in
alternating runs of these cases, each to its own topic:

  plain          send(topic, value): no ids (the fast path of send(), untouched batches)
  keyed          send(topic, value, key=unique): no ids, but the same client path as a record
                 with a transaction id (send()'s general path, a partition per record's hash)
  txn, dedup off send(..., transaction_id=unique): the ids travel, the topic's dedup_window_ms=0
                 (the broker stores the batches as they come: the cost of carrying the ids)
  txn, dedup on  the same with the default window (2 minutes): the broker decodes each batch,
                 checks every id in the partition's map and remembers it
  trace ids      send(..., trace_id=unique): a traceparent per record, which the broker indexes
                 (trace_index.py)

"the check" is dedup on against dedup off: the same bytes on the wire, only the broker's work
differs. "transaction ids on vs off" is dedup on against keyed: what a transaction id costs a
record that would otherwise go the same way (its header, encoded and decoded, and the check). Medians over --runs; the server's CPU seconds per run are printed too (the broker's cost
is clearer there than in msgs/s, which the client's Python bounds on a small machine).
"""

from __future__ import annotations

import os
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _common import bench_parser, quiet_logs  # noqa: E402  (the bench helpers, shared)
from _server import ChildServer, running_embedded_server  # noqa: E402

CASES = ("plain", "keyed", "txn, dedup off", "txn, dedup on", "trace ids")


def run_case(server: ChildServer, case: str, topic: str, values: list[bytes]) -> tuple[float, float]:
    """(msgs/s until every record is acknowledged, server CPU seconds spent)."""
    from dmq.client import Producer

    n = len(values)
    ids = [f"ORDER-{topic}-{i:09d}" for i in range(n)]  # built before the clock starts
    keys = [t.encode() for t in ids]
    traces = [f"{i + 1:032x}" for i in range(n)]  # W3C trace ids (32 hex digits, never all zero)
    with Producer(server.bootstrap, acks="all") as producer:
        send = producer.send
        send(topic, b"warm-up").get(30)
        cpu0 = server.cpu_s()
        t0 = time.perf_counter()
        if case == "plain":
            for v in values:
                send(topic, v)
        elif case == "keyed":
            for v, k in zip(values, keys):
                send(topic, v, key=k)
        elif case.startswith("txn"):
            for v, t in zip(values, ids):
                send(topic, v, transaction_id=t)
        else:
            for v, t in zip(values, traces):
                send(topic, v, trace_id=t)
        producer.flush(600)
        seconds = time.perf_counter() - t0
        return n / seconds, server.cpu_s() - cpu0


def main() -> None:
    args = bench_parser(__doc__, records=200_000, partitions=8, runs=3).parse_args()
    quiet_logs()
    from dmq.client import AdminClient

    blob = os.urandom(args.records * 100)
    values = [blob[i : i + 100] for i in range(0, len(blob), 100)]
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {args.records:,} records x 100 B, "
          f"{args.partitions} partitions, acks=all, {args.runs} alternating runs")
    results: dict[str, list[tuple[float, float]]] = {c: [] for c in CASES}
    with running_embedded_server("dmq-txn-bench-") as server:
        with AdminClient(server.bootstrap) as admin:
            for run in range(args.runs):
                for i, case in enumerate(CASES):
                    topic = f"t{run}-{i}"
                    config = {"dedup_window_ms": 0} if case == "txn, dedup off" else None
                    admin.create_topic(topic, args.partitions, config=config)
                    results[case].append(run_case(server, case, topic, values))
                    print(f"  run {run + 1} {case:<16} {results[case][-1][0]:>10,.0f} msgs/s "
                          f"server CPU {results[case][-1][1]:.2f} s", flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    keyed = statistics.median(r for r, _ in results["keyed"])
    off = statistics.median(r for r, _ in results["txn, dedup off"])
    for case in CASES:
        rate = statistics.median(r for r, _ in results[case])
        cpu = statistics.median(c for _, c in results[case])
        print(f"{case:<16} median {rate:>10,.0f} msgs/s ({rate / keyed:6.1%} of keyed, {rate / off:6.1%} of "
              f"dedup off)  server CPU {cpu:.2f} s = {cpu * 1e6 / args.records:.2f} us/record")


if __name__ == "__main__":
    main()
