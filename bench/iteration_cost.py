"""CPU cost per record of the group consumer's record APIs, over an in-memory feed (no server).

    .venv/bin/python bench/iteration_cost.py [--records 2000000] [--batch 500] [--rounds 5]

DMQConsumer's poll() is replaced by one that hands out ready ConsumerRecords (RecordSequences over
decoded 100-byte batches, --batch records per poll, as the fetcher's are), so what is measured is
the per-record work of the record paths themselves: ``for record in consumer`` against a poll()
loop iterating each ConsumerRecords, each touching every value (len(record.value)). CPU time
(process_time) per record, best and median of --rounds alternated rounds: on a shared machine
CPU time is far steadier than wall time, and alternating the paths spreads any drift over both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from dmq.client.consumer import DMQConsumer
from dmq.client.consumer._config import ConsumerConfig
from dmq.client.consumer._records import ConsumerRecords, TopicPartition
from dmq.client.records import RecordSequence
from dmq.proto.records import decode, encode


def make_feed(batch: int, partitions: int) -> list[ConsumerRecords]:
    """The polls one round of the feed cycles through: one partition's batch each."""
    values = [os.urandom(100) for _ in range(batch)]
    out = []
    for p in range(partitions):
        rb = decode(encode(values, base_offset=p * batch))
        seq = RecordSequence("t", p, [rb], p * batch, p * batch + batch)
        out.append(ConsumerRecords({TopicPartition("t", p): seq}))
    return out


def fake_consumer(feed: list[ConsumerRecords], total: int) -> DMQConsumer:
    """A DMQConsumer with no cluster behind it whose poll() returns the feed's polls in turn,
    `total` records in all, then nothing (so iteration ends at consumer_timeout_ms=0)."""
    consumer = DMQConsumer.__new__(DMQConsumer)
    consumer.config = ConsumerConfig(metadata_service_url="unused:1", group_id="g", consumer_timeout_ms=0)
    consumer._closed = False
    consumer._reset_iteration()
    state = {"left": total, "i": 0}

    def poll(timeout_ms: float = 0, max_records: int | None = None) -> ConsumerRecords:
        if state["left"] <= 0:
            return ConsumerRecords()
        records = feed[state["i"] % len(feed)]
        state["i"] += 1
        state["left"] -= len(records)
        return records

    consumer.poll = poll  # type: ignore[method-assign]
    return consumer


def run_iteration(feed: list[ConsumerRecords], total: int) -> tuple[int, float]:
    consumer = fake_consumer(feed, total)
    seen = touched = 0
    t0 = time.process_time()
    for r in consumer:
        touched += len(r.value)
        seen += 1
    return seen, time.process_time() - t0


def run_poll_loop(feed: list[ConsumerRecords], total: int) -> tuple[int, float]:
    consumer = fake_consumer(feed, total)
    seen = touched = 0
    t0 = time.process_time()
    while True:
        records = consumer.poll(0)
        if not records:
            break
        for r in records:
            touched += len(r.value)
            seen += 1
    return seen, time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--batch", type=int, default=500, help="records per poll (max_poll_records default: 500)")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    feed = make_feed(args.batch, args.partitions)
    paths: dict[str, Callable[[list[ConsumerRecords], int], tuple[int, float]]] = {
        "for record in consumer": run_iteration,
        "poll() loop": run_poll_loop,
    }
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.rounds):
        for name, path in paths.items():
            seen, secs = path(feed, args.records)
            assert seen == args.records, (name, seen)
            times[name].append(secs / seen * 1e9)
    print(f"{args.records:,} records of 100 B, {args.batch} per poll, {args.rounds} rounds alternated: "
          "CPU ns/record, best / median")
    for name, ns in times.items():
        print(f"  {name:24s} {min(ns):7.1f} / {statistics.median(ns):7.1f}")


if __name__ == "__main__":
    main()
