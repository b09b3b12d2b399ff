"""What one Spark read task pays for an offset range of the `dmq` source, by the range's size.

    .venv/bin/python bench/spark_small_ranges.py [--rows 1000000] [--value-bytes 100] [--runs 7]

A streaming micro-batch, a `minPartitions` piece or a query with endingOffsets reads a range that
ends inside the log. The reader sizes each Fetch to the rows left (`FetchSizer`) instead of asking
for fetchMaxBytes (16 MiB) every time, which made the broker read and ship up to 16 MiB that the
reader then dropped. This bench runs `read_range` (the code a Spark task runs, without Spark
around it) on ranges of 1 to 500,000 rows in the middle of a partition, both ways, interleaved
in one run: `sized` is the reader as shipped, `fixed` asks for fetchMaxBytes every time.
It prints the median time per range, the number of Fetch calls and the bytes fetched.
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any

from _common import bench_parser, quiet_logs
from _server import embedded_server
from spark_bench import PARTITIONS, TOPIC, produce

from dmq.client.spark import reader as spark_reader
from dmq.client.spark.reader import FetchSizer, OffsetRange, ReadSettings, read_range

SIZES = (1, 100, 10_000, 100_000, 250_000)


class FixedSizer(FetchSizer):
    """The reader before sizing: fetchMaxBytes on every request."""

    def next_bytes(self, remaining_records: int) -> int:
        return self.limit_bytes


class CountingFetcher(spark_reader.PartitionFetcher):
    calls = 0
    fetched_bytes = 0

    def result(self, future: Any, offset: int, max_bytes: int) -> Any:
        answer = super().result(future, offset, max_bytes)
        CountingFetcher.calls += 1
        CountingFetcher.fetched_bytes += len(answer.records)
        return answer


def main() -> None:
    parser = bench_parser(__doc__, value_bytes=100, runs=7)
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    quiet_logs()
    per_partition = args.rows // PARTITIONS
    sizes = [s for s in SIZES if s <= per_partition // 2] or [1]

    server = embedded_server(pathlib.Path(tempfile.mkdtemp(prefix="dmq-small-ranges-")) / "data")
    try:
        produce(server.bootstrap, args.rows, args.value_bytes)
        settings = ReadSettings(server.bootstrap, False, True, 16 * 1024 * 1024, 30_000)
        spark_reader.PartitionFetcher = CountingFetcher  # type: ignore[misc]
        sizers = {"sized": FetchSizer, "fixed": FixedSizer}
        times: dict[tuple[str, int], list[float]] = {}
        traffic: dict[tuple[str, int], tuple[int, int]] = {}
        for run in range(args.runs + 1):  # the first round warms up
            for size in sizes:
                for way, sizer in sizers.items():
                    spark_reader.FetchSizer = sizer  # type: ignore[misc]
                    start = per_partition // 2 - size // 2
                    CountingFetcher.calls = CountingFetcher.fetched_bytes = 0
                    began = time.perf_counter()
                    rows = sum(b.num_rows for b in read_range(settings, OffsetRange(TOPIC, 0, start, start + size)))
                    seconds = time.perf_counter() - began
                    if rows != size:
                        raise SystemExit(f"{way} read {rows} rows of a {size}-row range")
                    if run:
                        times.setdefault((way, size), []).append(seconds)
                        traffic[(way, size)] = (CountingFetcher.calls, CountingFetcher.fetched_bytes)
        spark_reader.FetchSizer = FetchSizer  # type: ignore[misc]
        print(
            f"\nread_range of a range in the middle of a {per_partition:,}-row partition ({args.value_bytes} B values), "
            f"fetchMaxBytes 16 MiB, median of {args.runs}"
        )
        print(f"{'rows':>9}{'sized ms':>10}{'fetches':>9}{'MB':>8}{'fixed ms':>10}{'fetches':>9}{'MB':>8}{'fixed/sized':>13}")
        for size in sizes:
            cells = []
            for way in sizers:
                calls, nbytes = traffic[(way, size)]
                cells.append(f"{statistics.median(times[(way, size)]) * 1000:>10.1f}{calls:>9}{nbytes / 1e6:>8.1f}")
            ratio = statistics.median(times[("fixed", size)]) / statistics.median(times[("sized", size)])
            print(f"{size:>9,}{''.join(cells)}{ratio:>12.1f}x")
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
