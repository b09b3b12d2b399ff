"""A queue-mode worker in its own process, driven by tests/e2e/test_queue_workers_e2e.py.

    python queue_worker_proc.py --bootstrap HOST:PORT --topic T --group G
                                [--mode normal|fail-thirds|victim] [--max-records N] [--lease-ms MS]
                                [--idle-s S]

It pops leases and works their records in order, acking on the next pop (the ack rides on it).
stdout: one JSON object per line, flushed at once (times are wall-clock seconds, comparable across
the worker processes of one machine):
    {"ev": "lease", "p", "s", "e", "t", "exp"}   a lease of records [s, e) granted; exp = its expiry
    {"ev": "done", "p", "s", "e", "t"}           finished with it, just before the ack / nack is sent
    {"ev": "acked", "p", "s", "e"}               records [s, e) acknowledged (the broker answered)
    {"ev": "nacked", "p", "f"}                   record f failed once (records before it: "acked")
    {"ev": "hold", "p", "s", "e"}                victim: now stuck in its handler, holding the lease
    {"ev": "exit", "leases": n}                  idle for --idle-s seconds: done
Modes: fail-thirds fails each record whose value index is a multiple of 3 on its first delivery
(the lease's delivery count says whether the head already failed); victim hangs in its handler
on its 5th lease until the test SIGKILLs it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from dmq.client import QueueConsumer
from dmq.client.queue import QueueLease


def emit(**event: object) -> None:
    sys.stdout.write(json.dumps(event, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def first_failure(lease: QueueLease) -> int | None:
    """fail-thirds: the offset of the first record to fail in this lease, if any."""
    for i, r in enumerate(lease.records):
        index = int(r.value.split(b":")[1])
        if index % 3 == 0 and not (i == 0 and lease.delivery_count > 0):
            return r.offset
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--mode", default="normal", choices=["normal", "fail-thirds", "victim"])
    ap.add_argument("--max-records", type=int, default=500)
    ap.add_argument("--lease-ms", type=int, default=2000)
    ap.add_argument("--idle-s", type=float, default=5.0)
    args = ap.parse_args()
    leases = 0
    pending: QueueLease | None = None
    idle_since = time.monotonic()
    with QueueConsumer(args.bootstrap, args.topic, args.group, max_records=args.max_records, lease_ms=args.lease_ms) as q:
        while time.monotonic() - idle_since < args.idle_s:
            lease = q.pop(timeout=0.5, ack=pending)
            if pending is not None:
                emit(ev="acked", p=pending.partition, s=pending.start_offset, e=pending.end_offset)
                pending = None
            if lease is None:
                continue
            idle_since = time.monotonic()
            leases += 1
            emit(ev="lease", p=lease.partition, s=lease.start_offset, e=lease.end_offset, t=time.time(),
                 exp=lease.expiry_ms / 1000)
            if args.mode == "victim" and leases == 5:
                emit(ev="hold", p=lease.partition, s=lease.start_offset, e=lease.end_offset)
                time.sleep(600)  # SIGKILLed here, mid-lease
            failed = first_failure(lease) if args.mode == "fail-thirds" else None
            if failed is None:
                emit(ev="done", p=lease.partition, s=lease.start_offset, e=lease.end_offset, t=time.time())
                pending = lease
                continue
            emit(ev="done", p=lease.partition, s=lease.start_offset, e=failed, t=time.time())
            result = q.nack(lease, f"ValueError: record {failed} fails once", failed)
            if failed > lease.start_offset:
                emit(ev="acked", p=lease.partition, s=lease.start_offset, e=failed)
            emit(ev="nacked", p=lease.partition, f=failed, dead=result.dead_lettered)
        if pending is not None:
            q.ack(pending)
            emit(ev="acked", p=pending.partition, s=pending.start_offset, e=pending.end_offset)
    emit(ev="exit", leases=leases)


if __name__ == "__main__":
    main()
