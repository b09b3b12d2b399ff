"""`dmq brokers list`.

JSON schema: {"brokers": [{"broker_id", "address", "host", "port", "alive", "last_heartbeat_ms",
                           "partitions_led"}]}
"""

from __future__ import annotations

import time

import click

from dmq.client.cli._errors import session
from dmq.client.cli._output import human_ago_ms, note, output_option, print_json, show, table


@click.group("brokers")
def brokers() -> None:
    """Brokers known to the coordinator."""


@brokers.command("list")
@output_option
@click.pass_context
def list_(ctx: click.Context, output: str) -> None:
    """Every registered broker: id, address, liveness (heartbeats), partitions it leads."""
    from dmq.proto import dmq_pb2 as pb

    answer = session(ctx).metadata("ListBrokers", pb.ListBrokersRequest())
    docs = [
        {
            "broker_id": b.broker_id,
            "address": f"{b.host}:{b.port}",
            "host": b.host,
            "port": b.port,
            "alive": b.alive,
            "last_heartbeat_ms": b.last_heartbeat_ms,
            "partitions_led": b.partitions_led,
        }
        for b in sorted(answer.brokers, key=lambda b: b.broker_id)
    ]
    if output == "json":
        print_json({"brokers": docs})
        return
    if not docs:
        note("No brokers have registered. `dmq server` starts one; `dmq broker --coordinator HOST:PORT` adds more.")
        return
    now_ms = int(time.time() * 1000)
    rows = [
        [str(d["broker_id"]), d["address"], "[green]alive[/]" if d["alive"] else "[red]down[/]",
         human_ago_ms(d["last_heartbeat_ms"], now_ms), str(d["partitions_led"])]
        for d in docs
    ]
    show(table(["ID", "ADDRESS", "STATUS", "LAST HEARTBEAT", "PARTITIONS LED"], rows, right=("ID", "PARTITIONS LED")))
    down = [d for d in docs if not d["alive"]]
    if down:
        note(f"[yellow]{len(down)} broker(s) down:[/] their partitions cannot be read or written until they return.")
