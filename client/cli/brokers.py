"""`dmq brokers list`.

Exit codes: 0 every registered broker is alive, 1 any is down (the listing is printed first), as
for `dmq health`, so a script can tell without parsing. Liveness is the coordinator's view
(heartbeats within the broker session timeout); `dmq health` also asks each broker directly.

JSON schema: {"brokers": [{"broker_id", "address", "host", "port", "alive", "last_heartbeat_ms",
                           "partitions_led", "rack" (null = none), "partitions_followed",
                           "partitions_under_replicated"}]}
partitions_under_replicated: partitions the broker leads with fewer in-sync replicas than replicas.
"""

from __future__ import annotations

import time
from typing import Any

import click

from dmq.client.cli._errors import admin
from dmq.client.cli._output import human_ago_ms, note, output_option, print_json, show, table


@click.group("brokers")
def brokers() -> None:
    """Brokers known to the coordinator."""


@brokers.command("list")
@output_option
@click.pass_context
def list_(ctx: click.Context, output: str) -> None:
    """Every registered broker: id, address, rack, liveness (heartbeats), partitions it leads, follows,
    and leads under-replicated."""
    docs: list[dict[str, Any]] = [
        {
            "broker_id": b.broker_id,
            "address": b.address,
            "host": b.host,
            "port": b.port,
            "alive": b.alive,
            "last_heartbeat_ms": b.last_heartbeat_ms,
            "partitions_led": b.partitions_led,
            "rack": b.rack or None,
            "partitions_followed": b.partitions_followed,
            "partitions_under_replicated": b.partitions_under_replicated,
        }
        for b in admin(ctx).list_brokers()
    ]
    down = [d for d in docs if not d["alive"]]
    if output == "json":
        print_json({"brokers": docs})
        _fail_if_down(down)
        return
    if not docs:
        note("No brokers have registered. `dmq server` starts one; `dmq broker --coordinator HOST:PORT` adds more.")
        return
    now_ms = int(time.time() * 1000)
    rows = [
        [str(d["broker_id"]), d["address"], "[green]alive[/]" if d["alive"] else "[red]down[/]",
         human_ago_ms(d["last_heartbeat_ms"], now_ms), str(d["partitions_led"]), str(d["partitions_followed"]),
         f"[yellow]{d['partitions_under_replicated']}[/]" if d["partitions_under_replicated"] else "0",
         d["rack"] or "-"]
        for d in docs
    ]
    counts = ("PARTITIONS LED", "FOLLOWED", "UNDER-REPLICATED")
    show(table(["ID", "ADDRESS", "STATUS", "LAST HEARTBEAT", *counts, "RACK"], rows, right=("ID", *counts)))
    if down:
        note(f"[yellow]{len(down)} broker(s) down:[/] their partitions cannot be read or written until they return.")
    _fail_if_down(down)


def _fail_if_down(down: list[dict[str, object]]) -> None:
    if down:
        raise click.ClickException(
            "broker(s) down: " + ", ".join(f"broker {d['broker_id']} at {d['address']}" for d in down)
        )
