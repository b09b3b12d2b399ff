"""An idempotent acks=all Producer in its own process that reports every acknowledgement.

    python acked_producer_proc.py --bootstrap HOST:PORT --topic T --partitions 3 --rate R --name N

Sends values "N-<i>" to partition i % partitions at about R records/s until stdin says "close",
then flushes. stdout, one JSON object per line:
    {"ev": "acked", "p": partition, "o": offset, "v": value, "m": monotonic_s}   the broker acknowledged
                                                                the record (m: when, on the clock all
                                                                processes of this host share)
    {"ev": "failed", "v": value, "error": str}                  it was not (delivery timeout, ...)
    {"ev": "closed", "sent": n}
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time

import structlog

from dmq.client.producer import Producer

_out = threading.Lock()


def emit(**event: object) -> None:
    with _out:
        sys.stdout.write(json.dumps(event, separators=(",", ":")) + "\n")
        sys.stdout.flush()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--partitions", type=int, required=True)
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--name", default="p")
    args = p.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    stop = threading.Event()

    def read_commands() -> None:
        for line in sys.stdin:
            if line.strip() == "close":
                break
        stop.set()

    threading.Thread(target=read_commands, daemon=True).start()

    def reporter(value: str):  # type: ignore[no-untyped-def]
        def done(metadata, error):  # type: ignore[no-untyped-def]
            if error is None:
                emit(ev="acked", p=metadata.partition, o=metadata.offset, v=value, m=time.monotonic())
            else:
                emit(ev="failed", v=value, error=repr(error))
        return done

    sent = 0
    with Producer(args.bootstrap, acks="all", enable_idempotence=True, linger_ms=2,
                  delivery_timeout_ms=120_000) as producer:
        started = time.monotonic()
        while not stop.is_set():
            value = f"{args.name}-{sent}"
            producer.send(args.topic, value.encode(), partition=sent % args.partitions, callback=reporter(value))
            sent += 1
            ahead_s = sent / args.rate - (time.monotonic() - started)
            if ahead_s > 0:
                stop.wait(ahead_s)
        producer.flush(120)
    emit(ev="closed", sent=sent)


if __name__ == "__main__":
    main()
