"""Spark read throughput of the `dmq` source on local[2], against a tuple-yielding reader and Parquet.

    .venv/bin/python bench/spark_bench.py [--rows 1000000] [--value-bytes 100] [--runs 5]
                                          [--warmup 4] [--bootstrap host:port] [--conf KEY=VALUE]
                                          [--standalone | --master spark://host:port]

Starts an embedded DMQ server (coordinator + broker) in a child process, as `make run` would,
unless --bootstrap is given; produces the rows (two partitions), then times four readers of the
same rows, each into `count()` and into `sum(length(value))`:

  dmq       the source: Arrow batches built from the record-batch arrays (dmq.client.spark)
  tuples    the naive Python data source: one tuple per record, built from the decoded records
  parquet   a Parquet copy of the same rows (Spark's native, columnar reader)
  ceiling   a Python data source re-yielding one ready Arrow batch per range: what Spark's Python
            data source path itself costs (Arrow -> rows on the JVM), with no I/O or decoding

Each figure is the best of --runs interleaved rounds (dmq, tuples, parquet, ceiling, dmq, ...) after
--warmup rounds of every reader and query, so a busy machine penalises no reader alone; the ratios
of the medians follow, to show the spread. Warm-up matters here: the JVM's JIT compiler threads
used 4.5, 1.7, 1.3, 0.9, 0.8 s of CPU in the first five rounds, then 0.6-0.9 s per round from
there on (/proc, one run): CPU that every measured query competes with on 2 cores. Four rounds
reach that floor.
--standalone starts a real standalone Spark cluster (a master and two one-core workers, each its own
process, from pyspark's own launcher: tests/spark/standalone.py) and runs the same rounds on it, the
executors fetching the records; --master submits to a cluster already running. On one 2-core machine
the cluster's figures show what the executor path costs (executor JVMs and Python workers beside the
broker), not what a cluster of machines reaches.
Targets: dmq >= 1,000,000 rows/s and >= 5x the tuple reader. dmq/ceiling shows how much of what
Spark's Python data source path allows the source gets; ceiling/tuples bounds any source's ratio.
"""

from __future__ import annotations

import datetime as dt
import os
import pathlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

# Spark's Python workers must run this interpreter (it has dmq and pyarrow).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from _common import bench_parser, quiet_logs  # noqa: E402  (the bench helpers, shared)
from _server import embedded_server  # noqa: E402

from dmq.client import AdminClient, Producer, SimpleConsumer  # noqa: E402
from dmq.client.spark import local_session, python_worker_conf, register  # noqa: E402
from dmq.client.spark.reader import DMQBatchReader, OffsetRange, read_range  # noqa: E402
from dmq.client.spark.source import DMQDataSource  # noqa: E402

TOPIC = "spark-bench"
PARTITIONS = 2


class TupleReader(DMQBatchReader):
    """The naive way: the same input partitions, one Python tuple per record."""

    def read(self, partition: Any) -> Iterator[tuple[Any, ...]]:
        if not isinstance(partition, OffsetRange):
            return
        utc = dt.timezone.utc
        r = partition
        with SimpleConsumer(self.opts.bootstrap, max_wait_ms=0) as consumer:
            for batch in consumer.consume_batches(r.topic, r.partition, r.start, end_offset=r.until):
                for rec in batch.iter_from(r.start):
                    if rec.offset >= r.until:
                        return
                    ts = dt.datetime.fromtimestamp(rec.timestamp / 1000, tz=utc)
                    yield (rec.key, rec.value, r.topic, r.partition, rec.offset, ts, 0)


class CeilingReader(DMQBatchReader):
    """Spark's own limit for a Python data source: the first real Arrow batch of each range,
    yielded again and again until the range's row count is reached (no further I/O or decoding)."""

    def read(self, partition: Any) -> Iterator[Any]:
        if not isinstance(partition, OffsetRange):
            return
        batches = read_range(self.settings, partition)
        first = next(batches)
        batches.close()
        remaining = partition.size
        while remaining > 0:
            rb = first if remaining >= first.num_rows else first.slice(0, remaining)
            remaining -= rb.num_rows
            yield rb


class CeilingSource(DMQDataSource):
    @classmethod
    def name(cls) -> str:
        return "dmq_ceiling"

    def reader(self, schema: Any) -> CeilingReader:
        return CeilingReader(super().reader(schema).opts)


class TupleSource(DMQDataSource):
    @classmethod
    def name(cls) -> str:
        return "dmq_tuples"

    def reader(self, schema: Any) -> TupleReader:
        base = super().reader(schema)
        return TupleReader(base.opts)


def produce(bootstrap: str, rows: int, value_bytes: int) -> float:
    admin = AdminClient(bootstrap)
    try:
        existing = {t.name for t in admin.list_topics()}
        if TOPIC in existing:
            admin.delete_topic(TOPIC)
        admin.create_topic(TOPIC, PARTITIONS)
    finally:
        admin.close()
    started = time.perf_counter()
    chunk = 50_000
    with Producer(bootstrap, acks=1, linger_ms=20) as producer:
        futures = []
        for first in range(0, rows, chunk):
            n = min(chunk, rows - first)
            values = [(b"%010d" % (first + i)).ljust(value_bytes, b"x") for i in range(n)]
            futures.append(producer.send_many(TOPIC, values, partition=(first // chunk) % PARTITIONS))
        producer.flush(300)
        for f in futures:
            f.wait(300)
    return time.perf_counter() - started


def start_cluster(root: pathlib.Path) -> Any:
    """The tests' standalone cluster (a master and two one-core workers, their own processes)."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # the repository's tests/
    from tests.spark.standalone import StandaloneCluster

    cluster = StandaloneCluster(root)
    cluster.start(workers=2)
    print(f"standalone Spark cluster at {cluster.master_url} (2 workers, 1 core each)")
    return cluster


def cluster_session(master: str, conf: dict[str, str]) -> Any:
    """A driver submitting to a Spark master: the executors (other processes) run the readers."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName("dmq-spark-bench")
    settings = {
        **python_worker_conf(),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.executor.memory": "1g",
        "spark.sql.shuffle.partitions": "2",
        **conf,
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def main() -> None:
    parser = bench_parser(__doc__, value_bytes=100, runs=5)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--warmup", type=int, default=4, help="untimed rounds of every reader and query first")
    parser.add_argument("--bootstrap", help="use this running DMQ server instead of an embedded one")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--standalone", action="store_true", help="start a standalone Spark cluster and run on it")
    where.add_argument("--master", help="a running Spark master (spark://host:port) instead of local[2]")
    args = parser.parse_args()
    quiet_logs()

    workdir = pathlib.Path(tempfile.mkdtemp(prefix="dmq-spark-bench-"))
    server = None
    cluster = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        # its own process, as deployed: the broker does not share the driver's GIL and heap
        server = embedded_server(workdir / "data")
        bootstrap = server.bootstrap
    try:
        produce_s = produce(bootstrap, args.rows, args.value_bytes)
        print(f"produced {args.rows:,} x {args.value_bytes} B records in {produce_s:.1f} s")

        conf = dict(kv.split("=", 1) for kv in args.conf)
        master = args.master or "local[2]"
        if args.standalone:
            cluster = start_cluster(workdir / "spark-cluster")
            master = cluster.master_url
        if master.startswith("local"):
            spark = local_session("dmq-spark-bench", master=master, log_level="ERROR", conf=conf)
        else:
            spark = cluster_session(master, conf)
        spark.dataSource.register(TupleSource)
        spark.dataSource.register(CeilingSource)

        def load(fmt: str) -> Any:
            return spark.read.format(fmt).option("bootstrap", bootstrap).option("subscribe", TOPIC).load()

        parquet_path = str(workdir / "rows.parquet")
        load("dmq").write.mode("overwrite").parquet(parquet_path)
        frames = {
            "dmq": lambda: load("dmq"),
            "tuples": lambda: load("dmq_tuples"),
            "parquet": lambda: spark.read.parquet(parquet_path),
            "ceiling": lambda: load("dmq_ceiling"),
        }
        queries = {
            "count()": lambda df: df.count(),
            "sum(length(value))": lambda df: df.selectExpr("sum(length(value))").collect()[0][0],
        }
        expected = {"count()": args.rows, "sum(length(value))": args.rows * args.value_bytes}
        for _ in range(args.warmup):  # JIT, Python workers, caches
            for frame in frames.values():
                for query in queries.values():
                    query(frame())
        # Interleaved rounds, best of each: on a shared machine every reader gets its quiet moments.
        load_before = os.getloadavg()[0]
        timings: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.runs):
            for reader, frame in frames.items():
                for qname, query in queries.items():
                    started = time.perf_counter()
                    result = query(frame())
                    seconds = time.perf_counter() - started
                    if result != expected[qname]:
                        raise SystemExit(f"{reader} {qname} returned {result}, expected {expected[qname]}")
                    key = (reader, qname)
                    timings.setdefault(key, []).append(seconds)
        rates = {key: args.rows / min(seconds) for key, seconds in timings.items()}
        medians = {key: args.rows / statistics.median(seconds) for key, seconds in timings.items()}
        print(
            f"\nSpark {spark.version} {master}, {args.rows:,} rows of {args.value_bytes} B, best of {args.runs} "
            f"after {args.warmup} warm-up rounds; "
            f"{os.cpu_count()} CPUs, load average {load_before:.1f} -> {os.getloadavg()[0]:.1f}"
            + (f"; extra settings {conf}" if conf else "")
        )
        print(
            f"{'query':<20}{'dmq rows/s':>12}{'tuples rows/s':>15}{'parquet rows/s':>16}{'ceiling rows/s':>16}"
            f"{'dmq/tuples':>12}{'dmq/parquet':>13}{'dmq/ceiling':>13}"
        )
        for qname in queries:
            d, t, p, c = (rates[(r, qname)] for r in ("dmq", "tuples", "parquet", "ceiling"))
            print(
                f"{qname:<20}{d:>12,.0f}{t:>15,.0f}{p:>16,.0f}{c:>16,.0f}"
                f"{d / t:>11.1f}x{d / p:>12.2f}x{d / c:>12.2f}x"
            )
        print(
            "medians instead of bests, dmq/tuples: "
            + ", ".join(f"{q} {medians[('dmq', q)] / medians[('tuples', q)]:.1f}x" for q in queries)
            + "; dmq/ceiling: "
            + ", ".join(f"{q} {medians[('dmq', q)] / medians[('ceiling', q)]:.2f}x" for q in queries)
        )
        bound = min(rates[("ceiling", q)] / rates[("tuples", q)] for q in queries)
        print(f"\nceiling/tuples {bound:.1f}x: the most any Python data source could beat the tuple reader by here")
        worst = min(rates[("dmq", q)] for q in queries)
        worst_ratio = min(rates[("dmq", q)] / rates[("tuples", q)] for q in queries)
        print(
            f"target >= 1,000,000 rows/s: {'met' if worst >= 1_000_000 else 'NOT met'} ({worst:,.0f}); "
            f"target >= 5x tuples: {'met' if worst_ratio >= 5 else 'NOT met'} ({worst_ratio:.1f}x)"
        )
        spark.stop()
    finally:
        if cluster is not None:
            cluster.stop()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
