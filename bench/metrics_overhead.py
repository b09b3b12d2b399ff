"""The cost of Prometheus metrics on produce and consume throughput (issue 29: at most 3%).

    .venv/bin/python bench/metrics_overhead.py [--records 300000] [--partitions 8] [--rounds 3]

Each round starts two embedded servers (coordinator + one broker, fsync flush policy), each in its
own subprocess as in bench/produce_consume.py: one without a metrics endpoint, one with it, scraped
by this process every --scrape-interval seconds meanwhile (far more often than Prometheus' usual
15 s, to be pessimistic). Against each: one Producer, acks=all, --records 100-byte values through
send() then flush; then a SimpleConsumer reading them all back (consume_batches, every record
iterated). Rounds alternate which server goes first; the figures printed are the medians over
rounds, and the ratio on / off. Compare within one run: the machine is shared.
"""

from __future__ import annotations

import os
import pathlib
import statistics
import sys
import tempfile
import textwrap
import threading
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _common import bench_parser, quiet_logs  # noqa: E402  (the bench helpers, shared)
from _server import ChildServer  # noqa: E402
from produce_consume import bench_consume_batches, bench_send, make_values  # noqa: E402

SCRIPT = textwrap.dedent(
    """
    import asyncio, logging, pathlib, sys
    import structlog
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    from dmq.client.cli.runner import ClusterOptions, run_embedded

    metrics = sys.argv[2] == "on"

    def ready(cluster):
        url = cluster.metrics_endpoints[0].url if metrics else "-"
        print("READY", cluster.bootstrap, url, flush=True)

    asyncio.run(run_embedded(ClusterOptions(data_dir=pathlib.Path(sys.argv[1]),
                                            metrics_port=0 if metrics else None), ready))
    """
)


class Scraper:
    """GETs the endpoint every interval until stopped; counts the scrapes and their bytes."""

    def __init__(self, url: str, interval_s: float) -> None:
        self.url = url
        self.interval_s = interval_s
        self.scrapes = 0
        self.bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with urllib.request.urlopen(self.url, timeout=10) as answer:
                self.bytes += len(answer.read())
            self.scrapes += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


def one(mode: str, values: list[bytes], partitions: int, interval_s: float) -> tuple[float, float, int, float]:
    """(produce msgs/s, consume msgs/s, scrapes, the server's CPU seconds for both) against a fresh
    server with metrics `mode`. CPU time is steadier than throughput on a shared machine."""
    from dmq.client import AdminClient

    with tempfile.TemporaryDirectory(prefix=f"dmq-bench-metrics-{mode}-") as tmp:
        server = ChildServer(SCRIPT, tmp, mode)
        try:
            scraper = None
            metrics_url = server.ready_fields[-1]  # READY <bootstrap> <metrics URL or ->
            if metrics_url != "-":
                scraper = Scraper(metrics_url, interval_s)
            with AdminClient(server.bootstrap) as admin:
                admin.create_topic("perf", partitions)
            cpu0 = server.cpu_s()
            produce_s, _loop = bench_send(server.bootstrap, "perf", values)
            got, consume_s = bench_consume_batches(server.bootstrap, "perf", partitions)
            assert got == len(values) + 1, (got, len(values))  # bench_send sends one first, off the clock
            cpu = server.cpu_s() - cpu0
            scrapes = 0
            if scraper is not None:
                scraper.stop()
                scrapes = scraper.scrapes
            return len(values) / produce_s, got / consume_s, scrapes, cpu
        finally:
            server.stop()


def main() -> None:
    ap = bench_parser(__doc__, records=300_000, partitions=8, rounds=3)
    ap.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between scrapes (metrics on)")
    args = ap.parse_args()
    quiet_logs()
    values = make_values(args.records, 100)
    results: dict[str, list[tuple[float, float, int, float]]] = {"off": [], "on": []}
    print(f"{args.records:,} records of 100 B, {args.partitions} partitions, acks=all, fsync flush, "
          f"{args.rounds} rounds, scrapes every {args.scrape_interval:g} s with metrics on")
    for r in range(args.rounds):
        for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
            produce, consume, scrapes, cpu = one(mode, values, args.partitions, args.scrape_interval)
            results[mode].append((produce, consume, scrapes, cpu))
            print(f"  round {r + 1} metrics {mode:<3}: produce {produce:>10,.0f} msgs/s   consume {consume:>10,.0f} msgs/s"
                  f"   server CPU {cpu:6.2f} s" + (f"   ({scrapes} scrapes)" if mode == "on" else ""))
            os.sync()  # the next server starts without the last one's dirty pages to write back
    med = {m: [statistics.median(row[i] for row in rs) for i in (0, 1, 3)] for m, rs in results.items()}
    for m in ("off", "on"):
        print(f"median  {m:<3}: produce {med[m][0]:>10,.0f} msgs/s   consume {med[m][1]:>10,.0f} msgs/s"
              f"   server CPU {med[m][2]:6.2f} s")
    print(f"on / off   : produce {med['on'][0] / med['off'][0]:.3f}          consume {med['on'][1] / med['off'][1]:.3f}"
          f"          server CPU {med['on'][2] / med['off'][2]:.3f}")
    # The two arms of one round run back to back, so their ratio shares that moment's load; the
    # median of the per-round ratios is steadier than the ratio of medians on a shared machine.
    paired = [[on[i] / off[i] for off, on in zip(results["off"], results["on"])] for i in (0, 1, 3)]
    print(f"median of per-round on/off: produce {statistics.median(paired[0]):.3f}   consume "
          f"{statistics.median(paired[1]):.3f}   server CPU {statistics.median(paired[2]):.3f}"
          f"   (load average now {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
