"""A Producer in its own process for the e2e tests.

    python producer_proc.py --bootstrap HOST:PORT --topic T --partitions 6 --count N --rate R [--start S]

Sends values "S".."S+N-1" (as text), value i to partition i % partitions, at about R records/s,
then flushes and prints {"ev": "done", "count": N} on stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import structlog

from dmq.client.producer import Producer


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--partitions", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--start", type=int, default=0)
    args = p.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    tick_s = 0.01
    per_tick = max(1, int(args.rate * tick_s))
    with Producer(args.bootstrap, linger_ms=2) as producer:
        started = time.monotonic()
        for i in range(args.start, args.start + args.count):
            producer.send(args.topic, str(i).encode(), partition=i % args.partitions)
            sent = i - args.start + 1
            if sent % per_tick == 0:
                ahead_s = sent / args.rate - (time.monotonic() - started)
                if ahead_s > 0:
                    time.sleep(ahead_s)
        producer.flush(60)
    print(json.dumps({"ev": "done", "count": args.count}), flush=True)


if __name__ == "__main__":
    main()
