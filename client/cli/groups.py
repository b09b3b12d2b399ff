"""`dmq groups list | describe | reset-offsets | delete`.

A group id is `G_<topic>_<app_id>`: the consumers of application `app_id` reading `topic`
(`DMQConsumer(group_id=app_id)` subscribing to `topic`, or `dmq consume TOPIC --group app_id`).

JSON schemas (`-o json`; fields may be added, never renamed or removed):
  list      {"groups": [{"group_id", "topic", "state", "generation", "member_count", "total_lag"}]}
            (total_lag null with --no-lag)
  describe  {"group_id", "topic", "state", "generation",
             "subscription": {"mode", "from_ms", "created_ms"},
             "members": [{"member_id", "client_id", "host", "partitions", "target_partitions"}],
             "partitions": [{"partition", "committed_offset" (null = none), "log_end_offset", "lag",
                             "owner_member_id" (null = unowned), "owner_client_id"}],
             "total_lag"}
            an application name (`dmq groups describe billing`): {"app_id", "groups": [describe, ...]};
            --all-groups: {"groups": [describe, ...]}
  reset-offsets  {"group_id", "topic", "executed", "strategy",
                  "partitions": [{"partition", "current_offset", "new_offset", "log_start_offset",
                                  "log_end_offset", "lag_after", "clamped"}]}
  delete    {"deleted": GROUP}

States: EMPTY (no members; offsets kept), PREPARING_REBALANCE, REBALANCING, STABLE.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import click

from dmq.client.cli._errors import admin
from dmq.client.cli._output import human_time_ms, if_exists_option, note, output_option, print_json, show, show_deletion, table
from dmq.client.cli._parse import parse_datetime_ms, parse_partitions
from dmq.client.cli._session import CLIError
from dmq.client.errors import DMQError, GroupNotFoundError
from dmq.proto.names import group_id_for

if TYPE_CHECKING:
    from dmq.client.admin import AdminClient, GroupDescription, OffsetReset


@click.group("groups")
def groups() -> None:
    """Consumer groups: members, committed offsets, lag; reset and delete.

    A group id is G_<topic>_<app_id>, e.g. G_orders_billing for application `billing`
    consuming topic `orders`.
    """


def _check_group(group_id: str) -> None:
    if not group_id:
        raise click.BadParameter("must not be empty", param_hint="GROUP")


def group_document(d: GroupDescription) -> dict[str, Any]:
    clients = {m.member_id: m.client_id for m in d.members}
    return {
        "group_id": d.group_id,
        "topic": d.topic,
        "state": d.state,
        "generation": d.generation,
        "subscription": asdict(d.subscription),
        "members": [
            {
                "member_id": m.member_id,
                "client_id": m.client_id,
                "host": m.host,
                "partitions": list(m.partitions),
                "target_partitions": list(m.target_partitions),
            }
            for m in d.members
        ],
        "partitions": [
            {
                "partition": p.partition,
                "committed_offset": p.committed_offset,
                # -1: the partition's broker did not answer (the schema predates null here)
                "log_end_offset": -1 if p.log_end_offset is None else p.log_end_offset,
                "lag": -1 if p.lag is None else p.lag,
                "owner_member_id": p.owner_member_id,
                "owner_client_id": clients.get(p.owner_member_id) if p.owner_member_id else None,
            }
            for p in d.partitions
        ],
        "total_lag": d.total_lag,
    }


def _lag_style(lag: int) -> str:
    return "green" if lag == 0 else "yellow"


@groups.command("list")
@click.option("--topic", default=None, help="Only the groups reading this topic.")
@click.option("--all-groups", is_flag=True, help="Every group (the default; as Kafka's tools spell it).")
@click.option("--no-lag", is_flag=True, help="Skip the per-group lag (one DescribeGroup per group).")
@output_option
@click.pass_context
def list_(ctx: click.Context, topic: str | None, all_groups: bool, no_lag: bool, output: str) -> None:
    """Every consumer group with its state, members and total lag."""
    client = admin(ctx)
    summaries = [g for g in client.list_groups() if topic is None or g.topic == topic]
    docs = []
    for g in summaries:
        lag = None
        if not no_lag:
            try:
                lag = client.describe_group(g.group_id).total_lag
            except DMQError:
                lag = None  # deleted meanwhile, or its brokers are down: show '-'
        docs.append(asdict(g) | {"total_lag": lag})
    if output == "json":
        print_json({"groups": docs})
        return
    if not docs:
        note("No consumer groups yet. They appear when a consumer subscribes, e.g. dmq consume TOPIC --group APP")
        return
    rows = [[d["group_id"], d["topic"], d["state"], str(d["generation"]), str(d["member_count"]),
             "-" if d["total_lag"] is None else f"[{_lag_style(d['total_lag'])}]{d['total_lag']}[/]"]
            for d in docs]
    show(table(["GROUP", "TOPIC", "STATE", "GENERATION", "MEMBERS", "LAG"], rows,
               right=("GENERATION", "MEMBERS", "LAG")))


@groups.command("describe")
@click.argument("group", required=False)
@click.option("--all-groups", is_flag=True, help="Describe every group (instead of GROUP).")
@click.option("--event-store", "event_store", metavar="TOPIC",
              help="GROUP is an event-store consumer group on TOPIC (see `dmq events group describe`).")
@output_option
@click.pass_context
def describe(ctx: click.Context, group: str | None, all_groups: bool, event_store: str | None, output: str) -> None:
    """State, subscription, members and per-partition lag of GROUP.

    GROUP is a group id (G_orders_billing) or an application's name, as given to
    `dmq consume --group billing` or DMQConsumer(group_id="billing"): then every group of that
    application (one per topic it reads) is described.
    """
    if all_groups == (group is not None):
        raise click.UsageError("give GROUP or --all-groups (one of them)")
    if event_store is not None:
        if group is None:
            raise click.UsageError("--event-store describes one GROUP: --all-groups does not apply")
        from dmq.client.cli.events import describe_event_group

        describe_event_group(ctx, event_store, group, output)
        return
    client = admin(ctx)
    if group is None:
        docs = [group_document(d) for d in _describe_each(client, [g.group_id for g in client.list_groups()])]
        _show_many({"groups": docs}, output, "No consumer groups yet.")
        return
    _check_group(group)
    try:
        doc = group_document(client.describe_group(group))
    except GroupNotFoundError:
        # Not a group id: the application's groups, G_<topic>_<group> for each topic it reads.
        ids = [g.group_id for g in client.list_groups() if g.group_id == group_id_for(g.topic, group)]
        if not ids:
            raise CLIError(f"group {group!r} not found, and no application named {group!r} has groups: a group "
                           f"appears when a consumer subscribes, e.g. `dmq consume TOPIC --group {group}` "
                           "(see `dmq groups list`)") from None
        _show_many({"app_id": group, "groups": [group_document(d) for d in _describe_each(client, ids)]}, output, "")
        return
    if output == "json":
        print_json(doc)
        return
    _show_group(doc)


def _describe_each(client: AdminClient, group_ids: list[str]) -> list[GroupDescription]:
    out = []
    for group_id in group_ids:
        try:
            out.append(client.describe_group(group_id))
        except GroupNotFoundError:
            continue  # deleted since it was listed
    return out


def _show_many(doc: dict[str, Any], output: str, none: str) -> None:
    if output == "json":
        print_json(doc)
        return
    if not doc["groups"]:
        note(none)
    for i, one in enumerate(doc["groups"]):
        if i:
            show("")
        _show_group(one)


def _show_group(doc: dict[str, Any]) -> None:
    from rich.text import Text

    sub = doc["subscription"]
    mode = sub["mode"] + (f" from {human_time_ms(sub['from_ms'])}" if sub["mode"] == "timestamp" else "")
    show(Text.assemble(("Group ", "bold"), (doc["group_id"], "bold cyan"), "   topic ", (doc["topic"], "bold"),
                       f"   state {doc['state']}   generation {doc['generation']}"))
    show(f"Subscription: {mode}, since {human_time_ms(sub['created_ms'])}")
    if doc["members"]:
        rows = [[m["member_id"], m["client_id"] or "-", m["host"] or "-",
                 ",".join(map(str, m["partitions"])) or "-",
                 ",".join(map(str, m["target_partitions"])) or "-"] for m in doc["members"]]
        show(table(["MEMBER", "CLIENT ID", "HOST", "PARTITIONS", "ASSIGNED"], rows,
                   title=f"Members ({len(doc['members'])})"))
    else:
        show("Members: none (the group is empty; its committed offsets are kept)")
    rows = []
    for p in doc["partitions"]:
        owner = p["owner_client_id"] or p["owner_member_id"] or "-"
        rows.append([str(p["partition"]), "-" if p["committed_offset"] is None else str(p["committed_offset"]),
                     str(p["log_end_offset"]), f"[{_lag_style(p['lag'])}]{p['lag']}[/]", owner])
    show(table(["PARTITION", "COMMITTED", "LOG END", "LAG", "OWNER"], rows, title="Partitions",
               right=("PARTITION", "COMMITTED", "LOG END", "LAG")))
    show(f"[bold]Total lag:[/] [{_lag_style(doc['total_lag'])}]{doc['total_lag']}[/]")


# -- reset-offsets --------------------------------------------------------------------------------


def reset_document(r: OffsetReset) -> dict[str, Any]:
    doc = asdict(r) | {"lag_after": r.lag_after}
    del doc["topic"]  # the document names it once, at the top
    return doc


@groups.command("reset-offsets")
@click.argument("group")
@click.option("--to-earliest", is_flag=True, help="To each partition's log start.")
@click.option("--to-latest", is_flag=True, help="To each partition's log end (skip everything).")
@click.option("--to-datetime", "to_datetime", metavar="T",
              help="To the first offset appended at or after T: ISO 8601 (2024-05-01T12:00:00, local time unless "
                   "Z or +hh:mm) or epoch milliseconds.")
@click.option("--to-offset", "to_offset", type=click.IntRange(0), metavar="N",
              help="To offset N (clamped to each partition's log start..end).")
@click.option("--shift-by", "shift_by", type=int, metavar="N",
              help="Move each committed offset by N (negative = back, to re-read).")
@click.option("--partitions", "partitions", multiple=True, metavar="LIST",
              help="Only these partitions: 0,2,5-7 (repeatable). Default: all.")
@click.option("--execute", is_flag=True, help="Apply the change. Without it this is a dry run that only shows the plan.")
@output_option
@click.pass_context
def reset_offsets(ctx: click.Context, group: str, to_earliest: bool, to_latest: bool, to_datetime: str | None,
                  to_offset: int | None, shift_by: int | None, partitions: tuple[str, ...], execute: bool,
                  output: str) -> None:
    """Move GROUP's committed offsets. A dry run unless --execute.

    Pick exactly one of --to-earliest, --to-latest, --to-datetime, --to-offset, --shift-by.
    Refused while the group has members: stop its consumers first (or wait for their session
    timeout), so that no running consumer overwrites the new offsets.

    \b
    Examples:
      dmq groups reset-offsets G_orders_billing --to-earliest            # show the plan
      dmq groups reset-offsets G_orders_billing --shift-by -100 --execute
      dmq groups reset-offsets G_orders_billing --to-datetime 2024-05-01T09:00:00 --partitions 0,1 --execute
    """
    chosen = [name for name, given in (
        ("--to-earliest", to_earliest), ("--to-latest", to_latest),
        ("--to-datetime", to_datetime is not None), ("--to-offset", to_offset is not None),
        ("--shift-by", shift_by is not None)) if given]
    if len(chosen) != 1:
        raise click.UsageError(
            "choose exactly one of --to-earliest, --to-latest, --to-datetime, --to-offset, --shift-by"
            + (f" (got {', '.join(chosen)})" if chosen else "")
        )
    value: int | None = None
    to = "earliest" if to_earliest else "latest"
    if to_datetime is not None:
        to, value = "timestamp", parse_datetime_ms(to_datetime)
    elif to_offset is not None:
        to, value = "offset", to_offset
    elif shift_by is not None:
        to, value = "shift", shift_by
    selected = parse_partitions(partitions)
    _check_group(group)
    plan = admin(ctx).reset_offsets(group, to=to, value=value, partitions=selected, dry_run=not execute)
    topic = plan[0].topic if plan else ""

    strategy_doc = {"earliest": "to-earliest", "latest": "to-latest", "offset": f"to-offset {value}",
                    "shift": f"shift-by {value}", "timestamp": f"to-datetime {to_datetime}"}[to]
    if output == "json":
        print_json({"group_id": group, "topic": topic, "executed": execute, "strategy": strategy_doc,
                    "partitions": [reset_document(r) for r in plan]})
        return

    def num(v: int | None) -> str:
        return "-" if v is None else str(v)

    rows = [[str(r.partition), num(r.current_offset), f"[bold]{r.new_offset}[/]" + (" *" if r.clamped else ""),
             str(r.log_start_offset), str(r.log_end_offset), str(r.lag_after)] for r in plan]
    show(table(["PARTITION", "CURRENT", "NEW", "LOG START", "LOG END", "LAG AFTER"], rows,
               title=f"Group {group}, topic {topic}: reset {strategy_doc}",
               right=("PARTITION", "CURRENT", "NEW", "LOG START", "LOG END", "LAG AFTER")))
    if any(r.clamped for r in plan):
        show("* clamped to the partition's log start..end")
    if execute:
        show(f"[green]Done:[/] committed new offsets for {len(plan)} partition(s). Consumers of {group} start there.")
    else:
        show("[yellow]Dry run:[/] nothing changed. Add --execute to apply.")


@groups.command("delete")
@click.argument("group")
@if_exists_option("group")
@output_option
@click.pass_context
def delete(ctx: click.Context, group: str, if_exists: bool, output: str) -> None:
    """Delete GROUP with its committed offsets and subscription (it must have no members)."""
    _check_group(group)
    show_deletion(lambda: admin(ctx).delete_group(group), GroupNotFoundError, if_exists, group, output,
                  f"Deleted group [bold cyan]{group}[/] and its committed offsets.",
                  f"Group {group} does not exist; nothing to do.")
