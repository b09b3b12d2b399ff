"""The asyncio client's throughput next to the sync client's, in one run against one server.

    .venv/bin/python bench/aio_bench.py [--records 500000] [--partitions 6] [--runs 3] [--consume-only]

The embedded server runs in a subprocess (bench/_server.py: its own interpreter and GIL, like a
deployment). Same sizes for both clients (100-byte values, acks=all, default batching), and the
sync and asyncio phases alternate run by run, so drift on a shared machine hits both alike:

  1. produce: --records values through Producer.send() vs ``await AsyncProducer.send()``, timed
     from the first send to the end of flush() (every record acknowledged);
  2. consume: --records records (produced once, untimed, spread evenly over the partitions) read by a fresh group with
     DMQConsumer.poll() vs AsyncConsumer.getmany(), each record touched, timed from the first
     record to the last (join excluded); also ``async for record in consumer``.

Printed: msgs/s per run, the medians of msgs/s and of msgs per client CPU-second (all threads of
this process; less sensitive to other load on the machine), and the asyncio / sync ratios of the
medians (target: asyncio >= 80% of sync), plus ``async for`` / getmany(): what the step per record
of ``async for`` costs, everything else (fetching, decoding) being the same code. Figures vary from
run to run on a shared machine: compare within a run. --consume-only skips the producers, for more
consumer runs in the same time.
"""

from __future__ import annotations

import asyncio
import pathlib
import statistics
import sys
import time
import uuid

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _common import bench_parser, quiet_logs  # noqa: E402  (the bench helpers, shared)
from _server import running_embedded_server  # noqa: E402
from produce_consume import make_values  # noqa: E402


class Clock:
    """Wall and client CPU time (every thread of this process) from start() to stop()."""

    def start(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def rates(self, n: int) -> tuple[float, float]:
        """(msgs/s, msgs per client CPU-second)."""
        return n / (time.perf_counter() - self.wall), n / (time.process_time() - self.cpu)


def sync_produce(bootstrap: str, topic: str, values: list[bytes]) -> tuple[float, float]:
    from dmq.client import Producer

    with Producer(bootstrap, acks="all") as producer:
        producer.send(topic, values[0]).get(30)  # metadata + connection outside the clock
        send = producer.send
        clock = Clock()
        clock.start()
        for v in values:
            send(topic, v)
        producer.flush(300)
        return clock.rates(len(values))


async def aio_produce(bootstrap: str, topic: str, values: list[bytes]) -> tuple[float, float]:
    from dmq.client.aio import AsyncProducer

    async with AsyncProducer(bootstrap, acks="all") as producer:
        await producer.send_and_wait(topic, values[0])
        send = producer.send
        clock = Clock()
        clock.start()
        for v in values:
            await send(topic, v)
        await producer.flush(300)
        return clock.rates(len(values))


def group() -> str:
    return f"bench-{uuid.uuid4().hex[:8]}"


def sync_consume(bootstrap: str, topic: str, n: int) -> tuple[float, float]:
    from dmq.client.consumer import ConsumerConfig, DMQConsumer

    config = ConsumerConfig(metadata_service_url=bootstrap, group_id=group(), subscription_mode="all")
    with DMQConsumer(config) as consumer:
        consumer.subscribe(topic)
        seen = touched = 0
        clock = Clock()
        started = False
        while seen < n:
            records = consumer.poll(1000)
            if not started and records:
                clock.start()
                started = True
            for r in records:
                touched += len(r.value)
                seen += 1
        rate = clock.rates(seen)
    assert touched == 100 * seen
    return rate


async def aio_consume(bootstrap: str, topic: str, n: int, iterate: bool = False) -> tuple[float, float]:
    """getmany() batches, or with `iterate` ``async for`` record by record."""
    from dmq.client.aio import AsyncConsumer

    async with AsyncConsumer(topic, bootstrap_servers=bootstrap, group_id=group(), subscription_mode="all") as consumer:
        seen = touched = 0
        clock = Clock()
        if iterate:
            # The first record (join and first fetch) outside the clock, as for the batches,
            # and no check in the loop that the batch loops do not pay per record.
            touched, seen = len((await anext(consumer)).value), 1
            clock.start()
            async for r in consumer:
                touched += len(r.value)
                seen += 1
                if seen == n:
                    break
        else:
            while seen < n:
                batch = await consumer.getmany(timeout_ms=1000)
                if batch and not seen:
                    clock.start()
                for records in batch.values():
                    for r in records:
                        touched += len(r.value)
                        seen += 1
        rate = clock.rates(seen)
    assert touched == 100 * seen
    return rate


def line(name: str, rates: list[tuple[float, float]]) -> tuple[float, float]:
    median = statistics.median(r[0] for r in rates)
    per_cpu = statistics.median(r[1] for r in rates)
    runs = " ".join(f"{r[0]:>10,.0f}" for r in rates)
    print(f"  {name:<46} median {median:>10,.0f} msgs/s {per_cpu:>10,.0f} per CPU-s   runs: {runs}")
    return median, per_cpu


def main() -> None:
    p = bench_parser(__doc__, records=500_000, partitions=6, runs=3)
    p.add_argument("--consume-only", action="store_true", help="skip the produce phases")
    args = p.parse_args()
    quiet_logs()
    from dmq.client import AdminClient, Producer

    values = make_values(args.records, 100)
    with running_embedded_server("dmq-aio-bench-") as server:
        with AdminClient(server.bootstrap) as admin:
            admin.create_topic("produce", args.partitions)
            admin.create_topic("consume", args.partitions)
        per = args.records // args.partitions  # spread evenly, as bench/consumer_bench.py does
        with Producer(server.bootstrap, acks="all") as producer:
            for part in range(args.partitions):
                chunk = values[part * per : (part + 1) * per if part < args.partitions - 1 else None]
                for i in range(0, len(chunk), 10_000):
                    producer.send_many("consume", chunk[i : i + 10_000], partition=part)
            producer.flush(300)
        rates: dict[str, list[tuple[float, float]]] = {k: [] for k in ("sp", "ap", "sc", "ac", "ai")}
        for _ in range(args.runs):
            if not args.consume_only:
                rates["sp"].append(sync_produce(server.bootstrap, "produce", values))
                rates["ap"].append(asyncio.run(aio_produce(server.bootstrap, "produce", values)))
            rates["sc"].append(sync_consume(server.bootstrap, "consume", args.records))
            rates["ac"].append(asyncio.run(aio_consume(server.bootstrap, "consume", args.records)))
            rates["ai"].append(asyncio.run(aio_consume(server.bootstrap, "consume", args.records, iterate=True)))
    print(f"{args.records:,} x 100-byte values, {args.partitions} partitions, acks=all, server in a subprocess, "
          f"{args.runs} alternating runs:")
    if not args.consume_only:
        sp = line("Producer.send() + flush()", rates["sp"])
        ap = line("await AsyncProducer.send() + flush()", rates["ap"])
    sc = line("DMQConsumer.poll(), every record touched", rates["sc"])
    ac = line("AsyncConsumer.getmany(), every record touched", rates["ac"])
    ai = line("async for record in AsyncConsumer", rates["ai"])
    for i, what in ((0, "msgs/s"), (1, "msgs per client CPU-second")):
        produce = "" if args.consume_only else f"produce {ap[i] / sp[i]:.0%}, "
        print(f"asyncio / sync, medians of {what}: {produce}consume getmany {ac[i] / sc[i]:.0%}, "
              f"consume async for {ai[i] / sc[i]:.0%}  (target >= 80%); async for / getmany {ai[i] / ac[i]:.0%}")


if __name__ == "__main__":
    main()
