"""`dmq bench produce | consume`: throughput and latency, in the manner of Kafka's perf-test tools.

produce sends --num-records records of --record-size random bytes with the client library's
Producer (optionally rate-limited by --throughput), and measures each sampled record's latency
from send() to its acknowledgement. consume reads a topic from its log start (or as a consumer
group) and measures fetch latency. Both show progress while running (a bar in a terminal, a line
every --report-interval-ms otherwise) and end with a summary; -o json prints the summary as:

  produce  {"records", "record_size", "bytes", "errors", "elapsed_s", "msgs_per_s", "mb_per_s",
            "latency_ms": {"samples", "avg", "p50", "p95", "p99", "p999", "max"}}
  consume  {"records", "bytes", "elapsed_s", "msgs_per_s", "mb_per_s", "fetches",
            "fetch_latency_ms": {"samples", "avg", "p50", "p95", "p99", "p999", "max"}}

MB is 2^20 bytes, as in Kafka's tools. Figures measure this client process too: one Python
process is often the bottleneck, so run several to load a cluster.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

from dmq.client.cli._errors import admin, bootstrap, session
from dmq.client.cli._output import err_console, print_json, show, table
from dmq.client.cli._session import CLIError
from dmq.proto.offset_markers import LATEST

MB = 1024 * 1024
_ACKS: dict[str, str | int] = {"all": "all", "1": 1, "0": 0}  # the --acks choices as the Producer takes them
# Latency samples kept per run: enough for a stable p99.9, bounded memory for huge runs.
MAX_LATENCY_SAMPLES = 200_000


def percentiles(samples_ms: Sequence[float]) -> dict[str, float | int | None]:
    """Nearest-rank percentiles of latency samples (milliseconds)."""
    if not samples_ms:
        return {"samples": 0, "avg": None, "p50": None, "p95": None, "p99": None, "p999": None, "max": None}
    s = sorted(samples_ms)

    def rank(q: float) -> float:
        return round(s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))], 3)

    return {"samples": len(s), "avg": round(sum(s) / len(s), 3), "p50": rank(0.50), "p95": rank(0.95),
            "p99": rank(0.99), "p999": rank(0.999), "max": round(s[-1], 3)}


class Reporter:
    """Progress on stderr: a rich bar in a terminal; a line per interval otherwise (like Kafka's)."""

    def __init__(self, what: str, total: int | None, interval_s: float, enabled: bool) -> None:
        self.what = what
        self.total = total
        self.interval_s = interval_s
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self._progress: Any = None
        self._task: Any = None
        self._last_report = time.monotonic()
        self._last_count = 0
        self._started = time.monotonic()

    def __enter__(self) -> Reporter:
        if self.enabled and self.tty:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn(self.what), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                                      console=err_console(), transient=True)
            self._task = self._progress.add_task(self.what, total=self.total, rate="")
            self._progress.start()
        return self

    def update(self, count: int, nbytes: int, extra: str = "", *, final: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not final and now - self._last_report < (0.2 if self._progress is not None else self.interval_s):
            return
        # The last report shows the run's average; the others the rate since the previous one.
        since = self._started if final else self._last_report
        window = now - since
        rate = (count - (0 if final else self._last_count)) / window if window > 0 else 0.0
        mb_rate = nbytes / MB / max(1e-9, now - self._started)
        if self._progress is not None:
            self._progress.update(self._task, completed=count, rate=f"{rate:,.0f} msgs/s {mb_rate:.1f} MB/s {extra}")
        else:
            click.echo(f"{count} records {self.what}, {rate:,.1f} records/s ({mb_rate:.2f} MB/s){extra and ', ' + extra}",
                       err=True)
        self._last_report = now
        self._last_count = count

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()


def _summary_table(rows: list[tuple[str, str]]) -> Any:
    return table(["measure", "value"], [list(r) for r in rows], show_header=False)


def _report(output: str, summary: dict[str, Any], elapsed: float, rows: list[tuple[str, str]]) -> None:
    """The run's summary: JSON (`-o json`), or a table of `rows` after its first (what was moved),
    with the elapsed time and the throughput, which every bench command reports."""
    if output == "json":
        print_json(summary)
        return
    show(_summary_table([
        rows[0],
        ("elapsed", f"{elapsed:.2f} s"),
        ("throughput", f"{summary['msgs_per_s']:,.0f} msgs/s  {summary['mb_per_s']:.2f} MB/s"),
        *rows[1:],
    ]))


def _fmt_ms(v: float | int | None) -> str:
    return "-" if v is None else f"{v:.2f} ms"


F = TypeVar("F", bound=Callable[..., Any])


def _reporting_options(command: F) -> F:
    """The options every bench command shares: how it shows progress and its summary."""
    command = click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table",
                           show_default=True, help="Summary as a table or as JSON.")(command)
    command = click.option("--progress/--no-progress", default=True, show_default=True,
                           help="Show progress while running.")(command)
    return click.option("--report-interval-ms", type=click.IntRange(100), default=5000, show_default=True,
                        help="Progress line period when stderr is not a terminal.")(command)


@click.group("bench")
def bench() -> None:
    """Measure produce and consume throughput and latency against a running cluster."""


@bench.command("produce")
@click.option("-t", "--topic", required=True, help="Topic to write to (created if missing, see --partitions).")
@click.option("-n", "--num-records", type=click.IntRange(1), default=100_000, show_default=True,
              help="Records to send.")
@click.option("-s", "--record-size", type=click.IntRange(0, 8 * MB), default=100, show_default=True,
              help="Bytes per record value (random, incompressible).")
@click.option("--throughput", type=click.IntRange(-1), default=-1, show_default=True,
              help="Limit to this many records/s; -1 = as fast as possible.")
@click.option("--partitions", type=click.IntRange(1, 10_000), default=3, show_default=True,
              help="Partitions when the topic has to be created.")
@click.option("--acks", type=click.Choice(["all", "1", "0"]), default="all", show_default=True,
              help="all: durable before the answer; 1: written by the leader; 0: no wait.")
@click.option("--compression", type=click.Choice(["none", "zstd", "lz4"]), default="none", show_default=True,
              help="Batch compression.")
@click.option("--batch-size", type=click.IntRange(1024, 8 * MB), default=1024 * 1024, show_default=True,
              help="Producer batch size in bytes.")
@click.option("--linger-ms", type=click.FloatRange(0), default=5, show_default=True,
              help="Producer linger: how long a batch may wait to fill.")
@_reporting_options
@click.pass_context
def bench_produce(ctx: click.Context, topic: str, num_records: int, record_size: int, throughput: int,
                  partitions: int, acks: str, compression: str, batch_size: int, linger_ms: float,
                  report_interval_ms: int, progress: bool, output: str) -> None:
    """Send NUM_RECORDS records of RECORD_SIZE bytes; report msgs/s, MB/s and latency percentiles.

    \b
    Example (like kafka-producer-perf-test):
      dmq bench produce --topic perf --num-records 1000000 --record-size 100 --throughput -1
    """
    from dmq.client.cli.messages import quiet_client_logs
    from dmq.client.errors import TopicNotFoundError

    client = admin(ctx)
    try:
        client.describe_topic(topic)
    except TopicNotFoundError:
        client.create_topic(topic, partitions)
        click.echo(f"created topic {topic} with {partitions} partitions", err=True)
    quiet_client_logs()
    from dmq.client.producer import Producer

    payload = os.urandom(record_size)
    sample_every = max(1, num_records // MAX_LATENCY_SAMPLES)
    latencies_ms: list[float] = []
    errors: list[BaseException] = []
    # Only sampled records get a callback (a callback per record would slow the producer being
    # measured). A failed batch holds thousands of records, so a sample sees its error.
    perf = time.perf_counter

    def sampled(sent_at: float) -> Any:
        def cb(meta: Any, err: BaseException | None) -> None:
            if err is not None:
                errors.append(err)
            else:
                latencies_ms.append((perf() - sent_at) * 1000)
        return cb

    producer = Producer(bootstrap(ctx), acks=_ACKS[acks],
                        compression=None if compression == "none" else compression, batch_size=batch_size,
                        linger_ms=linger_ms, client_id="dmq-bench-produce",
                        # --record-size goes up to the producer's largest max_record_bytes
                        max_record_bytes=max(1 * MB, record_size))
    started = perf()
    try:
        with Reporter("sent", num_records, report_interval_ms / 1000, progress) as reporter:
            for i in range(num_records):
                if throughput > 0 and i % 16 == 0:
                    ahead_s = started + i / throughput - perf()
                    if ahead_s > 0:
                        time.sleep(ahead_s)
                if i % sample_every == 0:
                    producer.send(topic, payload, callback=sampled(perf()))
                else:
                    producer.send(topic, payload)
                if i % 4096 == 0:
                    reporter.update(i, i * record_size, f"p50 {_fmt_ms(_quick_median(latencies_ms))}")
                    if errors or producer.metrics()["records_failed"]:
                        break
            producer.flush()
            reporter.update(num_records, num_records * record_size, final=True)
    finally:
        producer.close(timeout=30)
    elapsed = perf() - started
    failed = producer.metrics()["records_failed"]  # every record, not only the sampled ones
    if failed or errors:
        first = f"; first error: {errors[0]}" if errors else ""
        raise CLIError(f"{max(failed, len(errors))} of {num_records} records were not stored{first}")
    total_bytes = num_records * record_size
    lat = percentiles(latencies_ms)
    summary = {
        "records": num_records, "record_size": record_size, "bytes": total_bytes, "errors": len(errors),
        "elapsed_s": round(elapsed, 3), "msgs_per_s": round(num_records / elapsed, 1),
        "mb_per_s": round(total_bytes / MB / elapsed, 3), "latency_ms": lat,
    }
    _report(output, summary, elapsed, [
        ("records", f"{num_records:,} x {record_size} B"),
        ("latency avg", _fmt_ms(lat["avg"])), ("latency p50", _fmt_ms(lat["p50"])),
        ("latency p95", _fmt_ms(lat["p95"])), ("latency p99", _fmt_ms(lat["p99"])),
        ("latency p99.9", _fmt_ms(lat["p999"])), ("latency max", _fmt_ms(lat["max"])),
    ])


def _quick_median(samples: list[float]) -> float | None:
    if not samples:
        return None
    tail = samples[-512:]  # recent samples: what the latency is now
    return sorted(tail)[len(tail) // 2]


@bench.command("consume")
@click.option("-t", "--topic", required=True, help="Topic to read.")
@click.option("-n", "--messages", type=click.IntRange(1), default=None,
              help="Stop after this many records. Default: every record in the topic when the run starts.")
@click.option("-g", "--group", "app", default=None, metavar="APP",
              help="Read as consumer group G_<topic>_<APP> (DMQConsumer). Default: no group, from each log start.")
@click.option("--fetch-max-bytes", type=click.IntRange(1024, 60 * MB), default=4 * MB, show_default=True,
              help="Bytes per partition per fetch.")
@click.option("--timeout-ms", "idle_timeout_ms", type=click.IntRange(1), default=10_000, show_default=True,
              help="Give up when no record arrives for this long.")
@_reporting_options
@click.pass_context
def bench_consume(ctx: click.Context, topic: str, messages: int | None, app: str | None, fetch_max_bytes: int,
                  idle_timeout_ms: int, report_interval_ms: int, progress: bool, output: str) -> None:
    """Read a topic as fast as possible; report msgs/s, MB/s and fetch latency percentiles.

    \b
    Example (like kafka-consumer-perf-test):
      dmq bench consume --topic perf --messages 1000000
    """
    from dmq.client.cli.messages import quiet_client_logs

    sess = session(ctx)
    info = sess.admin.describe_topic(topic)
    answers = sess.admin.list_partition_offsets({(topic, p.partition): LATEST for p in info.partitions})
    ends = {a.partition: a for a in answers.values()}
    available = sum(a.log_end_offset - a.log_start_offset for a in ends.values())
    target = messages if messages is not None else available
    if target == 0:
        raise CLIError(f"topic {topic!r} is empty; fill it first, e.g. dmq bench produce --topic {topic}")
    quiet_client_logs()
    perf = time.perf_counter
    count = 0
    nbytes = 0
    latencies_ms: list[float] = []
    idle_s = idle_timeout_ms / 1000
    started = perf()
    with Reporter("read", target, report_interval_ms / 1000, progress) as reporter:
        if app is None:
            from dmq.client._cluster import Cluster
            from dmq.client._tail import TopicTail

            cluster = Cluster(sess.bootstrap, request_timeout_ms=int(sess.timeout_s * 1000))
            reader = TopicTail(cluster, topic, {p: a.log_start_offset for p, a in ends.items()},
                               partition_max_bytes=fetch_max_bytes, max_wait_ms=100)
            try:
                last_data = perf()
                while count < target:
                    t0 = perf()
                    records = reader.poll()
                    latencies_ms.append((perf() - t0) * 1000)
                    if records:
                        last_data = perf()
                        records = records[: target - count]
                        count += len(records)
                        nbytes += sum(len(r.value) + (len(r.key) if r.key else 0) for r in records)
                        reporter.update(count, nbytes)
                    elif perf() - last_data > idle_s:
                        break
            finally:
                reader.close()
                cluster.close()
        else:
            from dmq.client.consumer import DMQConsumer

            consumer = DMQConsumer(metadata_service_url=bootstrap(ctx), group_id=app, client_id="dmq-bench-consume",
                                   max_partition_fetch_bytes=fetch_max_bytes,
                                   fetch_max_bytes=max(fetch_max_bytes, 50 * MB), subscription_mode="all")
            try:
                consumer.subscribe(topic)
                last_data = perf()
                while count < target:
                    t0 = perf()
                    batch = consumer.poll(500)
                    latencies_ms.append((perf() - t0) * 1000)
                    if batch:
                        last_data = perf()
                        for r in batch:
                            count += 1
                            nbytes += len(r.value) + (len(r.key) if r.key else 0)
                            if count >= target:
                                break
                        reporter.update(count, nbytes)
                    elif perf() - last_data > idle_s:
                        break
            finally:
                consumer.close()
    elapsed = perf() - started
    if count == 0:
        raise CLIError(f"no records read from {topic!r} within {idle_timeout_ms} ms")
    lat = percentiles(latencies_ms)
    summary = {
        "records": count, "bytes": nbytes, "elapsed_s": round(elapsed, 3),
        "msgs_per_s": round(count / elapsed, 1), "mb_per_s": round(nbytes / MB / elapsed, 3),
        "fetches": len(latencies_ms), "fetch_latency_ms": lat,
    }
    _report(output, summary, elapsed, [
        ("records", f"{count:,} ({nbytes / MB:.2f} MB)"),
        ("fetches", str(summary["fetches"])),
        ("fetch p50", _fmt_ms(lat["p50"])), ("fetch p95", _fmt_ms(lat["p95"])),
        ("fetch p99", _fmt_ms(lat["p99"])), ("fetch max", _fmt_ms(lat["max"])),
    ])
