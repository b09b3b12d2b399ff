"""The asyncio client's throughput next to the sync client's, in one run against one server.

    .venv/bin/python bench/aio_bench.py [--records 500000] [--partitions 6] [--runs 3]

The embedded server runs in a subprocess (bench/_server.py: its own interpreter and GIL, like a
deployment). Same sizes for both clients (100-byte values, acks=all, default batching), and the
sync and asyncio phases alternate run by run, so drift on a shared machine hits both alike:

  1. produce: --records values through Producer.send() vs ``await AsyncProducer.send()``, timed
     from the first send to the end of flush() (every record acknowledged);
  2. consume: --records records (produced once, untimed, spread evenly over the partitions) read by a fresh group with
     DMQConsumer.poll() vs AsyncConsumer.getmany(), each record touched, timed from the first
     record to the last (join excluded); also ``async for record in consumer``.

Printed: msgs/s per run and the median, and the asyncio / sync ratio of the medians (target:
asyncio >= 80% of sync). Figures vary from run to run on a shared machine: compare within a run.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import pathlib
import statistics
import sys
import tempfile
import time
import uuid

import structlog

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _server import embedded_server  # noqa: E402  (the bench helpers, shared)
from produce_consume import make_values  # noqa: E402


def sync_produce(bootstrap: str, topic: str, values: list[bytes]) -> float:
    from dmq.client import Producer

    with Producer(bootstrap, acks="all") as producer:
        producer.send(topic, values[0]).get(30)  # metadata + connection outside the clock
        send = producer.send
        t0 = time.perf_counter()
        for v in values:
            send(topic, v)
        producer.flush(300)
        return len(values) / (time.perf_counter() - t0)


async def aio_produce(bootstrap: str, topic: str, values: list[bytes]) -> float:
    from dmq.client.aio import AsyncProducer

    async with AsyncProducer(bootstrap, acks="all") as producer:
        await producer.send_and_wait(topic, values[0])
        send = producer.send
        t0 = time.perf_counter()
        for v in values:
            await send(topic, v)
        await producer.flush(300)
        return len(values) / (time.perf_counter() - t0)


def group() -> str:
    return f"bench-{uuid.uuid4().hex[:8]}"


def sync_consume(bootstrap: str, topic: str, n: int) -> float:
    from dmq.client.consumer import ConsumerConfig, DMQConsumer

    config = ConsumerConfig(metadata_service_url=bootstrap, group_id=group(), subscription_mode="all")
    with DMQConsumer(config) as consumer:
        consumer.subscribe(topic)
        seen = touched = 0
        first = 0.0
        while seen < n:
            records = consumer.poll(1.0)
            if not first and records:
                first = time.perf_counter()
            for r in records:
                touched += len(r.value)
                seen += 1
        rate = seen / (time.perf_counter() - first)
    assert touched == 100 * seen
    return rate


async def aio_consume(bootstrap: str, topic: str, n: int) -> float:
    from dmq.client.aio import AsyncConsumer

    async with AsyncConsumer(topic, bootstrap_servers=bootstrap, group_id=group(), subscription_mode="all") as consumer:
        seen = touched = 0
        first = 0.0
        while seen < n:
            batch = await consumer.getmany(timeout_ms=1000)
            if not first and batch:
                first = time.perf_counter()
            for records in batch.values():
                for r in records:
                    touched += len(r.value)
                    seen += 1
        rate = seen / (time.perf_counter() - first)
    assert touched == 100 * seen
    return rate


async def aio_iterate(bootstrap: str, topic: str, n: int) -> float:
    from dmq.client.aio import AsyncConsumer

    async with AsyncConsumer(topic, bootstrap_servers=bootstrap, group_id=group(), subscription_mode="all") as consumer:
        seen = touched = 0
        first = 0.0
        async for r in consumer:
            if not first:
                first = time.perf_counter()
            touched += len(r.value)
            seen += 1
            if seen == n:
                break
        rate = seen / (time.perf_counter() - first)
    assert touched == 100 * seen
    return rate


def line(name: str, rates: list[float]) -> float:
    median = statistics.median(rates)
    runs = " ".join(f"{r:>11,.0f}" for r in rates)
    print(f"  {name:<44} median {median:>11,.0f} msgs/s   runs: {runs}")
    return median


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=500_000)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    from dmq.client import AdminClient, Producer

    values = make_values(args.records, 100)
    with tempfile.TemporaryDirectory(prefix="dmq-aio-bench-") as tmp:
        server = embedded_server(pathlib.Path(tmp))
        try:
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
            rates: dict[str, list[float]] = {k: [] for k in ("sp", "ap", "sc", "ac", "ai")}
            for _ in range(args.runs):
                rates["sp"].append(sync_produce(server.bootstrap, "produce", values))
                rates["ap"].append(asyncio.run(aio_produce(server.bootstrap, "produce", values)))
                rates["sc"].append(sync_consume(server.bootstrap, "consume", args.records))
                rates["ac"].append(asyncio.run(aio_consume(server.bootstrap, "consume", args.records)))
                rates["ai"].append(asyncio.run(aio_iterate(server.bootstrap, "consume", args.records)))
        finally:
            server.stop()
    print(f"{args.records:,} x 100-byte values, {args.partitions} partitions, acks=all, server in a subprocess, "
          f"{args.runs} alternating runs:")
    sp = line("Producer.send() + flush()", rates["sp"])
    ap = line("await AsyncProducer.send() + flush()", rates["ap"])
    sc = line("DMQConsumer.poll(), every record touched", rates["sc"])
    ac = line("AsyncConsumer.getmany(), every record touched", rates["ac"])
    ai = line("async for record in AsyncConsumer", rates["ai"])
    print(f"asyncio / sync (medians): produce {ap / sp:.0%}, consume getmany {ac / sc:.0%}, "
          f"consume async for {ai / sc:.0%}  (target >= 80%)")


if __name__ == "__main__":
    main()
