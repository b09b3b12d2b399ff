"""Queue mode with real worker processes (issue 16's process test).

8 worker processes on a 16-partition topic; one worker is SIGKILLed while it holds a lease, one
fails every third record once (nack; the record comes back). At the end every record was
acknowledged exactly once or dead-lettered, per partition the acknowledgements came in offset
order, and no two workers ever held records of the same partition at the same time.

The issue's 100,000 records by default (about 35 s on two cores, most of it the workers' work);
DMQ_QUEUE_E2E_RECORDS sets another count.
"""

from __future__ import annotations

import os
import time

from dmq.client import AdminClient, Producer, SimpleConsumer
from dmq.client.cli.runner import ClusterThread
from tests.e2e._procs import Event, Proc

PARTITIONS = 16
WORKERS = 8
RECORDS = int(os.environ.get("DMQ_QUEUE_E2E_RECORDS", "100000"))
LEASE_MS = 2000
WAIT_S = 120.0


def _worker(i: int, bootstrap: str, mode: str) -> Proc:
    return Proc(f"worker-{i}", "queue_worker_proc.py", [
        "--bootstrap", bootstrap, "--topic", "work", "--group", "workers", "--mode", mode,
        "--lease-ms", str(LEASE_MS), "--max-records", "100", "--idle-s", "6",
    ])


def _dead_letters(bootstrap: str) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    with AdminClient(bootstrap) as admin:
        if "work.dlq" not in [t.name for t in admin.list_topics()]:
            return out
    with SimpleConsumer(bootstrap, max_wait_ms=0) as c:
        end = c.offsets("work.dlq", 0)[1]
        for r in c.consume("work.dlq", 0, 0, max_records=end):
            h = dict(r.headers)
            out.setdefault(int(h["dmq.dlq.partition"] or b"-1"), set()).add(int(h["dmq.dlq.offset"] or b"-1"))
    return out


def test_eight_workers_one_killed_one_failing_every_record_acked_once_in_order(cluster: ClusterThread) -> None:
    started = time.monotonic()
    with AdminClient(cluster.bootstrap) as admin:
        admin.create_topic("work", PARTITIONS)
    per_partition = RECORDS // PARTITIONS
    with Producer(cluster.bootstrap, linger_ms=5) as p:
        futures = [
            p.send_many("work", [b"%d:%d" % (part, i) for i in range(per_partition)], partition=part)
            for part in range(PARTITIONS)
        ]
        p.flush(WAIT_S)
        for f in futures:
            f.get(WAIT_S)
    modes = ["victim", "fail-thirds"] + ["normal"] * (WORKERS - 2)
    workers = [_worker(i, cluster.bootstrap, mode) for i, mode in enumerate(modes)]
    try:
        victim = workers[0]
        victim.wait_for(lambda e: e.get("ev") == "hold", WAIT_S, "a held lease")
        victim.kill()
        for w in workers[1:]:
            w.wait_for(lambda e: e.get("ev") == "exit", WAIT_S, "exit")
    finally:
        for w in workers:
            w.kill()
    elapsed = time.monotonic() - started

    events: list[tuple[str, Event]] = [(w.name, e) for w in workers for e in w.events]
    assert not [e for _, e in events if e.get("ev") == "junk"]
    dead = _dead_letters(cluster.bootstrap)

    # every record acknowledged exactly once or dead-lettered
    for part in range(PARTITIONS):
        counts = [0] * per_partition
        for _, e in events:
            if e.get("ev") == "acked" and e["p"] == part:
                for o in range(e["s"], e["e"]):
                    counts[o] += 1
        for o in dead.get(part, ()):
            counts[o] += 1
        wrong = [(o, c) for o, c in enumerate(counts) if c != 1]
        assert not wrong, f"partition {part}: offsets acked/dead-lettered other than once: {wrong[:10]}"

    # per partition, acknowledgements in offset order, ordered by when each was sent (the worker's
    # "done"; the broker's answer may come later: an ack riding on a pop returns with the pop)
    for part in range(PARTITIONS):
        acks = []
        for w in workers:
            sent_at: dict[int, float] = {}
            for e in w.events:
                if e.get("p") != part:
                    continue
                if e["ev"] == "done":
                    sent_at[e["s"]] = e["t"]
                elif e["ev"] == "acked":
                    acks.append((sent_at[e["s"]], e["s"], e["e"]))
        acks.sort()
        for (_, _s1, e1), (_, s2, _e2) in zip(acks, acks[1:]):
            assert s2 >= e1, f"partition {part}: ack of [{s2}, ...) sent after the ack up to {e1}"

    # no two workers held the same partition at once: a lease lasts from its grant to the
    # worker's done (ack / nack sent), or to its expiry when the worker died holding it
    for part in range(PARTITIONS):
        spans = []
        for name, w_events in ((w.name, w.events) for w in workers):
            open_lease: Event | None = None
            for e in w_events:
                if e.get("p") != part:
                    continue
                if e["ev"] == "lease":
                    open_lease = e
                elif e["ev"] == "done" and open_lease is not None:
                    spans.append((open_lease["t"], e["t"], name))
                    open_lease = None
            if open_lease is not None:
                spans.append((open_lease["t"], open_lease["exp"], name))
        spans.sort()
        for a, b in zip(spans, spans[1:]):
            assert b[0] >= a[1], f"partition {part}: {a[2]} held it until {a[1]:.3f}, {b[2]} got it at {b[0]:.3f}"

    nacks = sum(1 for _, e in events if e.get("ev") == "nacked")
    assert nacks > 0, "the failing worker never failed a record"
    held = workers[0].of("hold")[0]
    redelivered = [e for w in workers[1:] for e in w.of("lease") if e["p"] == held["p"] and e["s"] == held["s"]]
    assert redelivered, "the killed worker's lease was never handed to another worker"
    print(f"{RECORDS} records, {WORKERS} workers: {elapsed:.1f}s, {nacks} nacks, "
          f"{sum(len(v) for v in dead.values())} dead letters")
