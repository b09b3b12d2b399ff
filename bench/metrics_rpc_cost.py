"""Server CPU per RPC and per scrape with metrics on vs off (issue 29), in figures a busy machine moves little.

    .venv/bin/python bench/metrics_rpc_cost.py [--calls 20000] [--rounds 5] [--concurrency 8]
        [--layers-only] [--other NAME=PYTHON]...

Wall-clock throughput on a shared machine varies by more than the 3% that issue 29 bounds the cost
of metrics to. CPU time does not: the server's user + system seconds (/proc/PID/stat) to answer N
calls is what the calls cost, however long other processes kept the server off a core. So each
round starts an embedded server (coordinator + one broker, one port, as `dmq server`) in a child
process, once without metrics and once with them (the /metrics endpoint bound, never scraped:
a scrape's own cost is measured apart), and times in the server's CPU:
  - Produce: --calls one-record batches (100 B value) over the partitions, acks=leader (no fsync:
    the disk's time is not what differs between the arms);
  - Fetch: --calls fetches of one partition from offset 0, max_bytes 4 KiB, max_wait_ms 0;
each with --concurrency calls in flight from one grpc.aio channel, after --warmup calls of each
kind off the clock. Each arm's figure is the median over rounds of the server's CPU microseconds
per call; the arms alternate order round by round.

That figure is the real server's, and it is not as steady as hoped: CPU per call falls as the call
rate rises (a busier loop answers more calls per turn), so on a loaded machine it swings by 10-20%
from round to round, far more than the interceptors' few microseconds. So the script first prints
the figures that do hold under load:
  - the interceptors' CPU per call, off the wire (see `_layer_cost`): a few microseconds, measured
    as thread CPU, the best of 7 repeats per round, in a child process per arm;
  - the server's CPU per scrape of /metrics (idle server, --scrapes per round);
  - how many calls bench/metrics_overhead.py's workload makes (--workload-records, read from the
    server's own dmq_rpc_server_duration_seconds), to turn a per-call cost into a share of it.
Use --layers-only to skip the over-the-wire calls.

--other NAME=PYTHON adds, for each mode, arms run by another installation's interpreter (e.g. a
virtualenv of an earlier commit), so a change is compared with what it replaced in the same run,
on the same load. The printed tables are what RESULTS.md records.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from dataclasses import dataclass

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _server import ChildServer  # noqa: E402  (the bench helpers, shared)

SCRIPT = textwrap.dedent(
    """
    import asyncio, logging, pathlib, sys
    import structlog
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    from dmq.client.cli.runner import ClusterOptions, run_embedded

    metrics = sys.argv[2] == "on"

    def ready(cluster):
        print("READY", cluster.bootstrap, flush=True)

    asyncio.run(run_embedded(ClusterOptions(data_dir=pathlib.Path(sys.argv[1]),
                                            metrics_port=0 if metrics else None), ready))
    """
)

SCRIPT_WITH_URL = SCRIPT.replace('print("READY", cluster.bootstrap, flush=True)',
                                 'print("READY", cluster.bootstrap, cluster.metrics_endpoints[0].url, flush=True)')
TOPIC = "rpc-cost"
FETCH_MAX_BYTES = 4096


@dataclass(frozen=True)
class Arm:
    label: str
    python: str
    mode: str  # "off" | "on"


@dataclass
class Figures:
    produce_us: float  # server CPU microseconds per Produce call
    fetch_us: float
    produce_calls_s: float  # wall-clock rate, for context only (load-dependent)
    fetch_calls_s: float


async def _drive(call: object, requests: list[object], concurrency: int) -> None:
    """Sends every request with at most `concurrency` in flight; each answer must be OK."""
    it = iter(requests)

    async def worker() -> None:
        for request in it:
            await call(request)  # type: ignore[operator]

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _measure(server: ChildServer, partitions: int, calls: int, warmup: int, concurrency: int) -> Figures:
    import grpc

    from dmq.proto import dmq_pb2 as pb
    from dmq.proto import dmq_pb2_grpc as pb_grpc
    from dmq.proto import records

    batch = records.encode([b"x" * 100])
    produce = [pb.ProduceRequest(topic=TOPIC, partition=i % partitions, batch=batch, acks=pb.ACKS_LEADER)
               for i in range(calls + warmup)]
    fetch = [pb.FetchRequest(partitions=[pb.FetchPartition(topic=TOPIC, partition=i % partitions, offset=0)],
                             max_wait_ms=0, max_bytes=FETCH_MAX_BYTES)
             for i in range(calls + warmup)]
    async with grpc.aio.insecure_channel(server.bootstrap) as channel:
        stub = pb_grpc.BrokerStub(channel)
        out: list[float] = []
        for call, reqs in ((stub.Produce, produce), (stub.Fetch, fetch)):
            await _drive(call, reqs[:warmup], concurrency)
            cpu0, t0 = server.cpu_s(), time.perf_counter()
            await _drive(call, reqs[warmup:], concurrency)
            cpu, wall = server.cpu_s() - cpu0, time.perf_counter() - t0
            out += [cpu / calls * 1e6, calls / wall]
    return Figures(out[0], out[2], out[1], out[3])


def one(arm: Arm, partitions: int, calls: int, warmup: int, concurrency: int) -> Figures:
    with tempfile.TemporaryDirectory(prefix=f"dmq-bench-rpc-cost-{arm.mode}-") as tmp:
        server = ChildServer(SCRIPT, tmp, arm.mode, python=arm.python)
        try:
            from dmq.client import AdminClient

            with AdminClient(server.bootstrap) as admin:
                admin.create_topic(TOPIC, partitions)
            return asyncio.run(_measure(server, partitions, calls, warmup, concurrency))
        finally:
            server.stop()


LAYERS_METHOD = "/dmq.v1.Broker/Produce"


class _Context:
    """The parts of a grpc.aio ServicerContext the interceptors read; 8 client connections."""

    def __init__(self) -> None:
        self._n = 0

    def peer(self) -> str:
        self._n += 1
        return f"ipv4:127.0.0.1:{50000 + self._n % 8}"

    def code(self) -> int:
        return 0  # what grpc.aio's context answers before a handler sets a code

    def invocation_metadata(self) -> tuple[()]:
        return ()

    async def abort(self, code: object, details: str = "", trailing_metadata: object = ()) -> None:
        raise AssertionError(f"refused: {code} {details}")


async def _layer_cost(mode: str, calls: int, repeats: int) -> tuple[float, float]:
    """(min, median) CPU microseconds per call that the server's interceptors cost, off the wire.

    The interceptors are the ones `_new_server` gives grpc.aio (caught as it builds the server), run
    by grpc's own `_find_method_handler` (the Cython function grpc.aio calls for every call), then
    the behavior it returns is awaited as grpc.aio awaits it, around a servicer that answers at once.
    Nothing suspends, so no event loop turn is counted: what is left is the per-call Python work of
    the interceptor chain and the wrappers, which metrics on vs off changes."""
    import grpc
    from grpc._cython import cygrpc

    from dmq.client.cli import runner
    from dmq.proto import dmq_pb2 as pb
    from dmq.proto.server.metrics import new_registry

    caught: dict[str, object] = {}
    real_server = grpc.aio.server

    def catch(*args: object, **kwargs: object) -> grpc.aio.Server:
        caught.update(kwargs)
        return real_server(*args, **kwargs)  # type: ignore[arg-type]

    grpc.aio.server = catch  # type: ignore[assignment]
    try:
        server = runner._new_server(None, None, None, new_registry() if mode == "on" else None)
    finally:
        grpc.aio.server = real_server  # type: ignore[assignment]
    interceptors = tuple(caught["interceptors"])  # type: ignore[call-overload]
    answer = pb.ProduceResponse(base_offset=1)

    async def produce(request: object, context: object) -> pb.ProduceResponse:
        return answer

    handler = grpc.unary_unary_rpc_method_handler(produce, pb.ProduceRequest.FromString,
                                                  pb.ProduceResponse.SerializeToString)

    class Resolver:
        """What grpc.aio hands `_find_method_handler` (its _MethodResolver): the method's handler."""

        def resolve_handler(self, details: object) -> object:
            return handler

    generic = Resolver()
    request = pb.ProduceRequest(topic=TOPIC, partition=0, batch=b"x" * 100)
    context = _Context()
    find = cygrpc._find_method_handler

    async def run(n: int) -> None:
        for _ in range(n):
            found = await find(LAYERS_METHOD, (), generic, interceptors)
            await found.unary_unary(request, context)

    await run(1000)  # every wrapping made and cached
    per_call = []
    for _ in range(repeats):
        t0 = time.thread_time()
        await run(calls)
        per_call.append((time.thread_time() - t0) / calls * 1e6)
    await server.stop(0)
    return min(per_call), statistics.median(per_call)


def layer_cost(python: str, mode: str, calls: int, repeats: int) -> tuple[float, float]:
    """`_layer_cost` in a child process of `python` (another installation's, for --other)."""
    out = subprocess.run([python, __file__, "--layers-child", mode, "--calls", str(calls), "--rounds", str(repeats)],
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), float(out[1])


def _commit_of(python: str) -> str:
    """The git commit the interpreter's dmq was installed from (editable), for the printout."""
    where = subprocess.run([python, "-c", "import dmq.proto, pathlib; print(pathlib.Path(dmq.proto.__file__).parents[1])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    head = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", where, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return (head.stdout.strip() or where) + ("+changes" if dirty else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20_000, help="calls of each kind per arm and round")
    ap.add_argument("--warmup", type=int, default=2_000, help="calls of each kind off the clock")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=8, help="calls in flight")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--other", action="append", default=[], metavar="NAME=PYTHON",
                    help="another installation's interpreter to run the same arms, named NAME (repeatable)")
    ap.add_argument("--layers-calls", type=int, default=20_000, help="calls per repeat of the interceptor figure")
    ap.add_argument("--layers-only", action="store_true", help="no calls over the wire (their figure is load-bound)")
    ap.add_argument("--scrapes", type=int, default=100, help="scrapes timed per round for the per-scrape figure")
    ap.add_argument("--workload-records", type=int, default=1_000_000,
                    help="records of metrics_overhead.py's workload whose calls are counted (0: skip)")
    ap.add_argument("--layers-child", choices=("off", "on"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.layers_child:
        low, mid = asyncio.run(_layer_cost(args.layers_child, args.calls, args.rounds))
        print(low, mid)
        return

    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    pythons = [("this", sys.executable)] + [tuple(o.split("=", 1)) for o in args.other]  # type: ignore[misc]
    for name, python in pythons:
        print(f"{name}: {python} (dmq at {_commit_of(python)})")
    print(f"load average {os.getloadavg()[0]:.1f} at start")
    layers(pythons, args.rounds, args.layers_calls)
    scrapes(pythons, args.scrapes, args.rounds)
    if args.workload_records:
        counts = workload(args.workload_records, args.partitions)
        cpu = counts.pop("server CPU s")
        print(f"bench/metrics_overhead.py's workload, {args.workload_records:,} records, {args.partitions} partitions "
              f"(this install, metrics on, no scrapes): {int(sum(counts.values())):,} calls in {cpu:.2f} s of server "
              "CPU: " + ", ".join(f"{m} {int(n):,}" for m, n in sorted(counts.items(), key=lambda kv: -kv[1])))
    if not args.layers_only:
        calls(pythons, args)


def _table(rows: list[tuple[str, str, float, float]], kinds: tuple[str, str]) -> None:
    """rows: (name, mode, figure 1, figure 2), printed with each name's on - off."""
    print(f"| arm | {kinds[0]} | {kinds[1]} | {kinds[0]} on - off | {kinds[1]} on - off |")
    print("| --- | --- | --- | --- | --- |")
    off: dict[str, tuple[float, float]] = {}
    for name, mode, a, b in rows:
        if mode == "off":
            off[name] = (a, b)
            print(f"| {name} off | {a:.2f} | {b:.2f} | | |")
        else:
            a0, b0 = off[name]
            print(f"| {name} on | {a:.2f} | {b:.2f} | {a - a0:+.2f} ({a / a0 - 1:+.1%}) | {b - b0:+.2f} ({b / b0 - 1:+.1%}) |")


def layers(pythons: list[tuple[str, str]], rounds: int, calls: int) -> None:
    """The interceptors' CPU per call, off the wire (see _layer_cost): robust to the machine's load."""
    arms = [(name, python, mode) for name, python in pythons for mode in ("off", "on")]
    got: dict[tuple[str, str], list[tuple[float, float]]] = {(n, m): [] for n, _p, m in arms}
    for r in range(rounds):
        for name, python, mode in (arms if r % 2 == 0 else arms[::-1]):
            got[(name, mode)].append(layer_cost(python, mode, calls, 7))
    print(f"interceptors' CPU per call, us (grpc's _find_method_handler + the wrapped behavior, {calls:,} calls "
          f"x 7 repeats per round; the best repeat of each round, then the median of {rounds} rounds; "
          "second column: the median repeat):")
    _table([(n, m, statistics.median(lo for lo, _ in got[(n, m)]), statistics.median(mid for _, mid in got[(n, m)]))
            for n, _p, m in arms], ("best us/call", "median us/call"))


def _scrape_child(python: str, count: int) -> tuple[float, int]:
    """(server CPU ms per scrape, bytes of one scrape) of an idle embedded server with metrics on,
    with one topic of 8 partitions."""
    with tempfile.TemporaryDirectory(prefix="dmq-bench-rpc-cost-scrape-") as tmp:
        server = ChildServer(SCRIPT_WITH_URL, tmp, "on", python=python)
        try:
            from dmq.client import AdminClient

            with AdminClient(server.bootstrap) as admin:
                admin.create_topic(TOPIC, 8)
            url = server.ready_fields[-1]
            size = len(urllib.request.urlopen(url, timeout=10).read())
            time.sleep(0.5)
            cpu0 = server.cpu_s()
            for _ in range(count):
                with urllib.request.urlopen(url, timeout=10) as answer:
                    answer.read()
            return (server.cpu_s() - cpu0) / count * 1e3, size
        finally:
            server.stop()


def scrapes(pythons: list[tuple[str, str]], count: int, rounds: int) -> None:
    got: dict[str, list[float]] = {name: [] for name, _python in pythons}
    size = 0
    for r in range(rounds):
        for name, python in (pythons if r % 2 == 0 else pythons[::-1]):
            ms, size = _scrape_child(python, count)
            got[name].append(ms)
    print(f"server CPU per scrape of /metrics, ms ({count} scrapes of an idle server with one topic of 8 partitions, "
          f"{size:,} bytes; median of {rounds} rounds): "
          + ", ".join(f"{name} {statistics.median(ms):.2f} ({min(ms):.2f}-{max(ms):.2f})" for name, ms in got.items()))


def workload(records: int, partitions: int) -> dict[str, float]:
    """bench/metrics_overhead.py's workload once (send() then consume_batches() of `records` 100 B
    values, no scrapes) against this install's server with metrics on: the calls it made by method,
    read from /metrics, and the server's CPU seconds for it."""
    from produce_consume import bench_consume_batches, bench_send, make_values
    from prometheus_client.parser import text_string_to_metric_families

    from dmq.client import AdminClient

    values = make_values(records, 100)
    with tempfile.TemporaryDirectory(prefix="dmq-bench-rpc-cost-workload-") as tmp:
        server = ChildServer(SCRIPT_WITH_URL, tmp, "on")
        try:
            with AdminClient(server.bootstrap) as admin:
                admin.create_topic("perf", partitions)
            cpu0 = server.cpu_s()
            bench_send(server.bootstrap, "perf", values)
            bench_consume_batches(server.bootstrap, "perf", partitions)
            cpu = server.cpu_s() - cpu0
            text = urllib.request.urlopen(server.ready_fields[-1], timeout=10).read().decode()
        finally:
            server.stop()
    counts: dict[str, float] = {"server CPU s": cpu}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "dmq_rpc_server_duration_seconds_count":
                method = sample.labels["method"]
                counts[method] = counts.get(method, 0) + sample.value
    return counts


def calls(pythons: list[tuple[str, str]], args: argparse.Namespace) -> None:
    """Server CPU per call over the wire (see the module's docstring)."""
    arms = [Arm(f"{name} {mode}", python, mode) for name, python in pythons for mode in ("off", "on")]
    print(f"{args.calls:,} Produce (1 record of 100 B, acks=leader) and {args.calls:,} Fetch (max_wait 0, "
          f"{FETCH_MAX_BYTES} B) calls per arm, {args.concurrency} in flight, {args.partitions} partitions, "
          f"{args.rounds} rounds; load average {os.getloadavg()[0]:.1f} at start")
    results: dict[str, list[Figures]] = {a.label: [] for a in arms}
    for r in range(args.rounds):
        order = arms if r % 2 == 0 else arms[::-1]
        for arm in order:
            f = one(arm, args.partitions, args.calls, args.warmup, args.concurrency)
            results[arm.label].append(f)
            print(f"  round {r + 1} {arm.label:<10}: Produce {f.produce_us:6.1f} us CPU/call ({f.produce_calls_s:6,.0f}/s)"
                  f"   Fetch {f.fetch_us:6.1f} us CPU/call ({f.fetch_calls_s:6,.0f}/s)", flush=True)
    print(f"server CPU per call over the wire, us, median of {args.rounds} rounds "
          f"(load average {os.getloadavg()[0]:.1f} at end):")
    _table([(name, mode, statistics.median(f.produce_us for f in results[f"{name} {mode}"]),
             statistics.median(f.fetch_us for f in results[f"{name} {mode}"]))
            for name, _python in pythons for mode in ("off", "on")], ("Produce", "Fetch"))
    for name, _python in pythons:
        pairs = list(zip(results[f"{name} off"], results[f"{name} on"]))
        print(f"  {name}: median of per-round on - off: Produce "
              f"{statistics.median(on.produce_us - off.produce_us for off, on in pairs):+.1f} us, Fetch "
              f"{statistics.median(on.fetch_us - off.fetch_us for off, on in pairs):+.1f} us")


if __name__ == "__main__":
    main()
