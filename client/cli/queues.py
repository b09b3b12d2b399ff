"""`dmq queues describe TOPIC [--group G]` and `dmq queues list`: queue mode for operators.

The command parses and prints; the calls are the client library's (AdminClient.describe_queue,
AdminClient.list_queues in dmq.client.queue_admin).

JSON schema (describe; list prints {"queues": [the same per topic]}):
  {"topic", "partition_count", "depth", "max_queue_size" (0 = unlimited), "remaining" (null when
   unlimited), "partitions_leased", "utilisation_pct", "dead_letters", "dead_letter_topic",
   "groups": [{"group", "partition", "acked_offset", "pending", "delivery_count", "last_error",
               "lease": null | {"partition", "group", "lease_id", "records", "seconds_left"}}],
   "leases": [lease...], "expiring_soon": [lease...]}
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from dmq.client.cli._errors import bootstrap, timeout_s
from dmq.client.cli._output import note, output_option, print_json, show, table

if TYPE_CHECKING:
    from dmq.client.admin import AdminClient
    from dmq.client.queue_admin import QueueDescription


@click.group("queues")
def queues() -> None:
    """Queue mode: depth, limits, leases and dead letters (QueueConsumer workers)."""


def _admin(ctx: click.Context) -> AdminClient:
    from dmq.client.admin import AdminClient

    admin = AdminClient(bootstrap(ctx), request_timeout_ms=int(timeout_s(ctx) * 1000))
    ctx.call_on_close(admin.close)
    return admin


@queues.command("describe")
@click.argument("topic")
@click.option("--group", "-g", default=None, help="Only this queue group.")
@output_option
@click.pass_context
def describe(ctx: click.Context, topic: str, group: str | None, output: str) -> None:
    """Depth, limit and capacity left, partitions leased, each lease, dead letters."""
    d = _admin(ctx).describe_queue(topic, group)
    if output == "json":
        print_json(d.to_dict())
        return
    _print(d)


@queues.command("list")
@output_option
@click.pass_context
def list_(ctx: click.Context, output: str) -> None:
    """Every topic with queue groups or a max_queue_size."""
    found = _admin(ctx).list_queues()
    if output == "json":
        print_json({"queues": [d.to_dict() for d in found]})
        return
    if not found:
        note("No queues yet: a QueueConsumer's first pop creates its group on the topic.")
        return
    rows = [
        [d.topic, str(d.depth), _limit(d), f"{d.partitions_leased}/{d.partition_count}", f"{d.utilisation:.0f}%",
         str(len({g.group for g in d.groups})), str(d.dead_letters)]
        for d in found
    ]
    show(table(["TOPIC", "DEPTH", "LIMIT", "LEASED", "UTIL", "GROUPS", "DEAD LETTERS"], rows,
               right=("DEPTH", "LEASED", "UTIL", "GROUPS", "DEAD LETTERS")))


def _limit(d: QueueDescription) -> str:
    return "unlimited" if not d.max_queue_size else f"{d.max_queue_size} ({d.remaining} left)"


def _print(d: QueueDescription) -> None:
    show(f"queue [bold]{d.topic}[/]: depth {d.depth}, limit {_limit(d)}, "
         f"leased {d.partitions_leased}/{d.partition_count} partitions ({d.utilisation:.0f}%), "
         f"dead letters {d.dead_letters} in {d.topic}.dlq")
    if not d.groups:
        note("No queue groups on this topic yet.")
        return
    rows = [
        [g.group, str(g.partition), str(g.acked_offset), str(g.pending), str(g.delivery_count),
         "-" if g.lease is None else f"{g.lease.records} records, {g.lease.seconds_left:.1f}s left",
         g.last_error[:60]]
        for g in d.groups
    ]
    show(table(["GROUP", "PARTITION", "ACKED", "PENDING", "FAILURES", "LEASE", "LAST ERROR"], rows,
               right=("PARTITION", "ACKED", "PENDING", "FAILURES")))
    if d.expiring_soon:
        note("[yellow]about to expire:[/] " + ", ".join(
            f"{x.group} partition {x.partition} ({x.seconds_left:.1f}s)" for x in d.expiring_soon))
