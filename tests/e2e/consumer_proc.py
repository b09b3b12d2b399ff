"""A DMQConsumer in its own process, driven by the e2e tests.

    python consumer_proc.py --bootstrap HOST:PORT --topic T --group G
                            [--commit auto|sync] [--config JSON]

stdout: one JSON object per line, flushed at once, so the test sees events as they happen:
    {"ev": "ready"}                               subscribed (joined the group)
    {"ev": "assigned" | "revoked" | "lost", "partitions": [...], "t": epoch_s}
    {"ev": "records", "items": [[partition, offset, value], ...], "t": epoch_s, "m": monotonic_s}
    {"ev": "commit", "offsets": {partition: offset}, "m": monotonic_s}   --commit sync, after each commit_sync()
(m: time.monotonic(), the clock every process of this host shares, so that events of several
processes can be ordered)
    {"ev": "commit_failed", "error": str, "type": class name}
    {"ev": "closed"}
stdin: one command per line:
    stall SECONDS   stop calling poll() for that long, then commit_sync() (reports the outcome)
    close           close the consumer (commits with auto-commit) and exit
"""

from __future__ import annotations

import argparse
import json
import logging
import queue
import sys
import threading
import time

import structlog

from dmq.client.consumer import ConsumerConfig, ConsumerRebalanceListener, DMQConsumer
from dmq.client.errors import CommitFailedError, DMQError

_out_lock = threading.Lock()


def emit(**event: object) -> None:
    line = json.dumps(event, separators=(",", ":"))
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Reporter(ConsumerRebalanceListener):
    def on_partitions_assigned(self, assigned):  # type: ignore[no-untyped-def]
        emit(ev="assigned", partitions=sorted(tp.partition for tp in assigned), t=time.time())

    def on_partitions_revoked(self, revoked):  # type: ignore[no-untyped-def]
        emit(ev="revoked", partitions=sorted(tp.partition for tp in revoked), t=time.time())

    def on_partitions_lost(self, lost):  # type: ignore[no-untyped-def]
        emit(ev="lost", partitions=sorted(tp.partition for tp in lost), t=time.time())


def read_commands(q: queue.Queue[str]) -> None:
    for line in sys.stdin:
        q.put(line.strip())
    q.put("close")  # the test went away


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--commit", choices=["auto", "sync"], default="auto")
    p.add_argument("--config", default="{}", help="extra ConsumerConfig settings as JSON")
    args = p.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr))

    settings = {"enable_auto_commit": args.commit == "auto", **json.loads(args.config)}
    config = ConsumerConfig(metadata_service_url=args.bootstrap, group_id=args.group, **settings)
    commands: queue.Queue[str] = queue.Queue()
    threading.Thread(target=read_commands, args=(commands,), daemon=True).start()
    consumer = DMQConsumer(config)
    consumer.subscribe(args.topic, listener=Reporter())
    emit(ev="ready")
    while True:
        try:
            command = commands.get_nowait()
        except queue.Empty:
            command = ""
        if command == "close":
            consumer.close()
            emit(ev="closed")
            return
        if command.startswith("stall"):
            time.sleep(float(command.split()[1]))
            try:
                consumer.commit_sync()
                emit(ev="commit_ok")
            except CommitFailedError as e:
                emit(ev="commit_failed", error=str(e), type=type(e).__name__)
            continue
        records = consumer.poll(200)
        if not records:
            continue
        emit(ev="records", items=[[r.partition, r.offset, r.value.decode()] for r in records], t=time.time(),
             m=time.monotonic())
        if args.commit == "sync":
            positions = {tp.partition: consumer.position(tp) for tp in records.partitions()}
            try:
                consumer.commit_sync({tp: positions[tp.partition] for tp in records.partitions()})
                emit(ev="commit", offsets=positions, m=time.monotonic())
            except DMQError as e:  # fenced, or a broker failing over: the next poll's commit covers it
                emit(ev="commit_failed", error=str(e), type=type(e).__name__)


if __name__ == "__main__":
    main()
