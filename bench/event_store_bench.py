"""Event-store mode (issue 17): appends, conditional appends, tag reads and claim/ack cycles.

    .venv/bin/python bench/event_store_bench.py [--n 1000000] [--cond-n 4000] [--clients 16] [--cycles 3000]
                                               [--claim-prefetch 100] [--only-claims]
                                               [--peer [--peer-python P] [--peer-script S]]

The same workload as the PostgreSQL DCB peer (/work/shared/peers/bench_dcb.py), against the
embedded server (coordinator + one broker, flush policy fsync: every append acknowledged after
its fsync, group commit) in a SUBPROCESS with data in a temporary directory, clients in this
process (and, for the concurrent conditional appends, in --clients processes):

  (b) unconditional appends of 100 events each (100-byte payloads, tags `course:<id>` and
      `student:<id>`), 1 client; this fills the store to --n events, 1% tagged `course:hot`;
      with the server's CPU per append (its /proc times: what one append costs it, which a busy
      machine moves far less than the rate);
  (c) the tag query `course:hot` (N/100 matches): one read() (the client pages through the
      broker's 10,000-event answers), --reads times, median; and the same paged 1,000 at a time;
  (a) conditional appends of 1 event each on that store from 1 client and from --clients client
      processes: fail if an event tagged with the new event's course or student exists after the
      last position this client has seen; each client first checks that a stale position fails;
  (e) claim_next + ack cycles of one worker over --cycles partitions of one pending event each
      (attribute `task`), the ack riding on the next claim_next (one round trip per cycle; the
      answer waits until the ack is durable); then --claim-workers threads over as many
      partitions, whose acks share the offsets log's group-commit fsyncs; then one worker with
      claim_next(..., prefetch=--claim-prefetch): one round trip claims that many partitions and
      carries the acks recorded locally since the last one (durable when it is answered; the
      final commit() is timed).

Figures vary run to run on a shared machine: compare within one run (and with the peer run in
the same sitting). `--peer` runs the PostgreSQL DCB peer (one run of bench_dcb.py with the same
--n, --cond-n, --clients and --reads, in its own virtualenv: /work/shared/peers/README.md) right
after DMQ's workloads and prints DMQ / PostgreSQL for each; the peer's packages never enter DMQ's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _server import embedded_server  # noqa: E402  (the bench helpers, shared)

PAYLOAD = 100
BATCH = 100
HOT_TAG = "course:hot"
HOT_EVERY = 100
PAGE = 1000
WARMUP = 10


def create_topic(bootstrap: str, topic: str) -> None:
    from dmq.client import AdminClient

    with AdminClient(bootstrap) as admin:
        admin.create_topic(topic, 1, config={"kind": "event-store"})


def fill(bootstrap: str, topic: str, n: int, seed: int) -> float:
    """(b): appends of BATCH events until the store holds n; seconds."""
    from dmq.client.events import Event, EventStore

    rng = random.Random(seed)
    payloads = [os.urandom(PAYLOAD) for _ in range(1024)]
    batches = []
    j = 0
    for _ in range(n // BATCH):
        batch = []
        for _ in range(BATCH):
            course = HOT_TAG if j % HOT_EVERY == 0 else f"course:{rng.randrange(1, 1000)}"
            batch.append(Event("StudentJoinedCourse", (course, f"student:{rng.randrange(100_000)}"), payloads[j & 1023]))
            j += 1
        batches.append(batch)
    with EventStore(bootstrap, topic) as store:
        t0 = time.perf_counter()
        head = 0
        for batch in batches:
            head = store.append(batch)
        seconds = time.perf_counter() - t0
    assert head == n, (head, n)
    return seconds


def tag_reads(bootstrap: str, topic: str, reads: int, expected: int) -> tuple[list[float], list[float]]:
    from dmq.client.events import EventStore, QueryItem

    query = [QueryItem(tags=(HOT_TAG,))]
    whole, paged = [], []
    with EventStore(bootstrap, topic) as store:
        for _ in range(reads):
            t0 = time.perf_counter()
            result = store.read(query)
            size = sum(len(e.payload) for e in result)
            whole.append(time.perf_counter() - t0)
            assert len(result) == expected and size == expected * PAYLOAD, (len(result), expected)
        for _ in range(reads):
            t0 = time.perf_counter()
            after, count = 0, 0
            for _ in range(expected // PAGE + 2):
                page = store.read(query, after=after, limit=PAGE).events
                count += len(page)
                if page:
                    after = page[-1].position
                if len(page) < PAGE:
                    break
            paged.append(time.perf_counter() - t0)
            assert count == expected, (count, expected)
    return whole, paged


def cond_client(bootstrap: str, topic: str, k: int, n: int, barrier: Any, out_q: Any) -> None:
    """(a): WARMUP + n conditional single-event appends of client k."""
    from dmq.client.errors import AppendConditionError
    from dmq.client.events import AppendCondition, Event, EventStore, QueryItem

    payloads = [os.urandom(PAYLOAD) for _ in range(64)]
    with EventStore(bootstrap, topic) as store:
        after = store.read([QueryItem(tags=(f"course:w{k}-0",))], limit=1).head

        def append(i: int, after: int) -> int:
            course, student = f"course:w{k}-{i % 10}", f"student:w{k}-{i}"
            cond = AppendCondition([QueryItem(tags=(course,)), QueryItem(tags=(student,))], after)
            return store.append(Event("StudentJoinedCourse", (course, student), payloads[i & 63]), cond)

        for i in range(WARMUP):
            after = append(i, after)
        try:  # the condition does bite
            append(0, 0)
            raise AssertionError("append condition did not fail")
        except AppendConditionError:
            pass
        barrier.wait(timeout=120)
        lat, conflicts = [], 0
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(WARMUP, WARMUP + n):
            t = time.perf_counter()
            try:
                after = append(i, after)
            except AppendConditionError:
                conflicts += 1
            lat.append(time.perf_counter() - t)
        t1, c1 = time.perf_counter(), time.process_time()
    out_q.put({"start": t0, "end": t1, "n": n, "conflicts": conflicts, "lat": lat, "cpu_s": c1 - c0})


def run_cond(bootstrap: str, topic: str, clients: int, total: int) -> dict[str, Any]:
    per = max(1, total // clients)
    ctx = mp.get_context("spawn")
    barrier, out_q = ctx.Barrier(clients + 1), ctx.Queue()
    workers = [ctx.Process(target=cond_client, args=(bootstrap, topic, k, per, barrier, out_q)) for k in range(clients)]
    for w in workers:
        w.start()
    try:
        barrier.wait(timeout=300)
        res = [out_q.get(timeout=900) for _ in range(clients)]
    finally:
        for w in workers:
            w.join(timeout=60)
    wall = max(r["end"] for r in res) - min(r["start"] for r in res)
    lat = sorted(x for r in res for x in r["lat"])
    return {"clients": clients, "n": per * clients, "rate": per * clients / wall,
            "conflicts": sum(r["conflicts"] for r in res),
            "client_cpu_ms": sum(r["cpu_s"] for r in res) / (per * clients) * 1e3,
            "p50_ms": lat[len(lat) // 2] * 1e3, "p99_ms": lat[int(len(lat) * 0.99)] * 1e3}


def claim_cycles(bootstrap: str, topic: str, partitions: int, workers: int = 1, prefetch: int = 0) -> tuple[int, float]:
    """(e): `workers` threads (one channel each) claim, handle and ack every partition between
    them; (cycles, seconds). With `prefetch`, one round trip claims up to that many partitions
    and carries the acks recorded since the last one; the time includes the final commit()
    that makes the last acks durable."""
    from dmq.client.events import EventStore, EventType

    task = EventType("task.created", ["task"])

    def work(worker: int) -> int:
        with EventStore(bootstrap, topic) as store:
            cycles = 0
            claim = store.claim_next("workers", ["task"], [task], f"w{worker}", prefetch=prefetch)
            while claim is not None:
                cycles += 1
                claim = store.claim_next("workers", ["task"], [task], f"w{worker}", ack=(claim, claim.last_position),
                                         prefetch=prefetch)
            store.commit()  # the acks recorded locally (prefetch) are durable once this returns
            return cycles

    with EventStore(bootstrap, topic) as store:
        for start in range(0, partitions, 1000):
            store.append([task.new(b"x" * PAYLOAD, task=str(i)) for i in range(start, min(start + 1000, partitions))])
        store.register_group("workers")
        first = store.claim_next("workers", ["task"], [task], "w0")  # partitions discovered, untimed
        assert first is not None
        store.release(first)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            cycles = sum(pool.map(work, range(workers)))
        seconds = time.perf_counter() - t0
        assert cycles == partitions, (cycles, partitions)
        assert all(p.pending == 0 for p in store.describe_group("workers").partitions)
    return cycles, seconds


def run_claims(bootstrap: str, partitions: int, workers: int, prefetch: int) -> None:
    runs = [(n, 0) for n in sorted({1, workers})] + ([(1, prefetch)] if prefetch > 1 else [])
    for n, pre in runs:
        topic = f"tasks-{n}-{pre}"
        create_topic(bootstrap, topic)
        cycles, seconds = claim_cycles(bootstrap, topic, partitions, n, pre)
        how = f", prefetch {pre} (acks ride on the next round trip)" if pre else ""
        print(f"(e) claim_next + ack (ack riding on the next claim), {n} worker thread(s){how}, {cycles:,} partitions: "
              f"{cycles / seconds:,.0f} cycles/s")


def run_appends(server: Any, bootstrap: str, clients: int, total: int) -> dict[int, dict[str, Any]]:
    """(a) from 1 and from `clients` processes, with the CPU each append costs the server and a client
    (the server's includes the clients' warm-up appends, a few per cent)."""
    out = {}
    for k in (1, clients):
        cpu0 = server.cpu_s()
        r = run_cond(bootstrap, "store", k, total)
        server_ms = (server.cpu_s() - cpu0) / (r["n"] + k * WARMUP) * 1e3
        out[k] = {**r, "server_cpu_ms": server_ms}
        print(f"(a) conditional append, 1 event, {k} client process(es): {r['rate']:,.0f} appends/s "
              f"(p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, conflicts {r['conflicts']}); CPU per append: "
              f"server {server_ms:.2f} ms, client {r['client_cpu_ms']:.2f} ms; load average {os.getloadavg()[0]:.1f}")
    return out


PEER_PYTHON = "/tmp/peers-venv/bin/python"
PEER_SCRIPT = "/work/shared/peers/bench_dcb.py"


def run_peer(args: argparse.Namespace) -> dict[str, Any]:
    """One run of the PostgreSQL DCB peer with this run's sizes; its figures (the results file it writes)."""
    cmd = [args.peer_python, args.peer_script, "--runs", "1", "--n", str(args.n), "--cond-n", str(args.cond_n),
           "--clients", str(args.clients), "--reads", str(args.reads), "--tag", "dmq_event_store_bench"]
    print(f"peer: {' '.join(cmd)}", flush=True)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True,
                          cwd=os.path.dirname(os.path.abspath(args.peer_script)))
    lines = done.stdout.splitlines()
    for line in lines:
        if line.startswith("run 0 "):
            print(f"peer {line[6:]}", flush=True)
    path = next(line.split("results: ", 1)[1] for line in lines if line.startswith("results: "))
    with open(path) as f:
        raw = json.load(f)["raw"][0]
    cond = raw["cond"]
    return {"fill_rate": args.n / raw["fill"]["s"],
            "read_rate": raw["read"]["matches"] / statistics.median(raw["read"]["one_read_s"]),
            "cond": {int(k): {"rate": v["n"] / v["wall_s"], "p50_ms": v["p50_ms"]} for k, v in cond.items()}}


def print_ratios(dmq: dict[str, Any], peer: dict[str, Any], clients: int) -> None:
    """DMQ / PostgreSQL per workload, beside the issue's targets (issue 30)."""
    print("DMQ / PostgreSQL DCB peer, this run:")
    rows = [("(b) unconditional append x100", dmq["fill_rate"], peer["fill_rate"], 5.0,
             f"; server CPU per 100-event append {dmq['fill_cpu_ms']:.2f} ms"),
            ("(a) conditional append, 1 client", dmq["cond"][1]["rate"], peer["cond"][1]["rate"], 1.5,
             f"; p50 {dmq['cond'][1]['p50_ms']:.2f} ms vs {peer['cond'][1]['p50_ms']:.2f} ms; "
             f"server CPU per append {dmq['cond'][1]['server_cpu_ms']:.3f} ms (target <= 0.2)"),
            (f"(a) conditional append, {clients} client processes", dmq["cond"][clients]["rate"],
             peer["cond"][clients]["rate"], 2.0, ""),
            ("(c) 1% tag read, one read", dmq["read_rate"], peer["read_rate"], 10.0, "")]
    for what, mine, theirs, target, note in rows:
        ratio = mine / theirs
        print(f"  {what}: {mine:,.0f} vs {theirs:,.0f} /s = {ratio:.2f}x (target >= {target}x: "
              f"{'met' if ratio >= target else 'missed'}){note}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="events in the store (fill)")
    ap.add_argument("--cond-n", type=int, default=4_000, help="conditional appends per measurement")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--reads", type=int, default=5)
    ap.add_argument("--cycles", type=int, default=3_000, help="partitions claimed and acked in (e)")
    ap.add_argument("--claim-prefetch", type=int, default=100,
                    help="(e) once more from 1 worker claiming this many partitions per round trip (0: skip)")
    ap.add_argument("--claim-workers", type=int, default=4,
                    help="(e) is also run with this many worker threads (their acks share fsyncs)")
    ap.add_argument("--only-claims", action="store_true", help="run (e) only")
    ap.add_argument("--only-reads", action="store_true", help="run (b) and (c) only")
    ap.add_argument("--only-appends", action="store_true", help="run (b) and (a) only")
    ap.add_argument("--peer", action="store_true",
                    help="then run the PostgreSQL DCB peer (one run, same sizes) and print the ratios")
    ap.add_argument("--peer-python", default=PEER_PYTHON, help="the peer's virtualenv python")
    ap.add_argument("--peer-script", default=PEER_SCRIPT)
    args = ap.parse_args()
    print(f"event store bench: n={args.n:,} cond-n={args.cond_n:,} clients={args.clients} cycles={args.cycles:,} "
          f"load average {os.getloadavg()[0]:.1f}")
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="dmq-events-bench-") as tmp:
        server = embedded_server(pathlib.Path(tmp) / "data")
        try:
            b = server.bootstrap
            if args.only_claims:
                run_claims(b, args.cycles, args.claim_workers, args.claim_prefetch)
                return
            create_topic(b, "store")
            cpu0 = server.cpu_s()
            s = fill(b, "store", args.n, seed=1)
            fill_cpu_ms = (server.cpu_s() - cpu0) / (args.n // BATCH) * 1e3
            print(f"(b) unconditional append x{BATCH}, store 0 -> {args.n:,}: {args.n / s:,.0f} events/s ({s:.1f} s); "
                  f"server CPU per {BATCH}-event append {fill_cpu_ms:.2f} ms ({fill_cpu_ms * 1e3 / BATCH:.1f} us per event)")
            figures["fill_rate"] = args.n / s
            figures["fill_cpu_ms"] = fill_cpu_ms
            expected = args.n // HOT_EVERY
            if args.only_appends:
                run_appends(server, b, args.clients, args.cond_n)
                return
            whole, paged = tag_reads(b, "store", args.reads, expected)
            print(f"(c) tag query {HOT_TAG}: {expected:,} of {args.n:,} events, one read: "
                  f"{expected / statistics.median(whole):,.0f} events/s (median of {args.reads}: "
                  f"{statistics.median(whole) * 1e3:.0f} ms); pages of {PAGE}: {expected / statistics.median(paged):,.0f} events/s")
            figures["read_rate"] = expected / statistics.median(whole)
            if args.only_reads:
                print(f"server CPU {server.cpu_s():.1f} s; load average {os.getloadavg()[0]:.1f}")
                return
            figures["cond"] = run_appends(server, b, args.clients, args.cond_n)
            run_claims(b, args.cycles, args.claim_workers, args.claim_prefetch)
            print(f"server CPU {server.cpu_s():.1f} s; load average {os.getloadavg()[0]:.1f}")
        finally:
            server.stop()
    if args.peer and figures.get("cond"):
        # after DMQ's server has stopped, so the two never share the machine
        print_ratios(figures, run_peer(args), args.clients)


if __name__ == "__main__":
    main()
