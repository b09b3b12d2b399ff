"""`dmq topics create | list | describe | alter | delete | verify | reassign`.

JSON schemas (`-o json`; fields may be added, never renamed or removed):
  list      {"topics": [{"name", "partition_count", "created_ms", "kind" ("log" | "event-store"), "messages", "size_bytes",
                         "config": {retention_ms, retention_bytes, segment_bytes, segment_ms,
                                    max_message_bytes, dedup_window_ms, ..., replication_factor,
                                    min_insync_replicas, unclean_leader_election
                                    (null = the broker's default)}}]}
  describe  {"name", "partition_count", "created_ms", "kind", "messages", "size_bytes", "config": {...},
             "partitions": [{"partition", "leader_id", "leader_address", "leader_alive",
                             "log_start_offset", "log_end_offset", "messages", "size_bytes",
                             "segment_count", "error", "status", "status_detail",
                             "replicas": [int], "isr": [int], "leader_epoch", "under_replicated"}]}
                                                   (offsets/sizes null when unknown; status "ok" |
                                                   "corrupt": appends refused, damage never served)
  create / alter   the same document as describe, without log figures for new partitions
  delete    {"deleted": NAME}
  verify    {"name", "ok", "partitions": [{"partition", "leader_id", "ok", "batches_checked",
                                           "problems": [str], "indexes_rebuilt": [str], "error"}]}
  reassign  {"name", "partition", "leader_id", "replicas": [int], "isr": [int], "leader_epoch", "completed"}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import click

from dmq.client.cli._errors import admin, explain
from dmq.client.cli._output import (
    human_bytes,
    human_duration_ms,
    human_time_ms,
    if_exists_option,
    note,
    output_option,
    print_json,
    show,
    show_deletion,
    table,
)
from dmq.client.cli._parse import CONFIG_KEYS, parse_topic_config
from dmq.client.cli._session import CLIError
from dmq.client.errors import TopicAlreadyExistsError, TopicNotFoundError
from dmq.proto import limits

if TYPE_CHECKING:
    from dmq.client.admin import AdminClient, LogDescription, TopicDescription

CONFIG_HELP = (
    "Topic setting KEY=VALUE, repeatable. Keys: " + ", ".join(CONFIG_KEYS) +
    " (Kafka's dotted spelling such as retention.ms also works). Durations take ms/s/m/h/d "
    "(7d), sizes take KiB/MiB/GiB or KB/MB/GB (64MiB); -1 = unlimited retention. Unset keys "
    "use the server's defaults."
)


@click.group("topics")
def topics() -> None:
    """Create, list, describe, alter and delete topics."""


def _sum(values: list[int | None]) -> int | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def describe_logs(client: AdminClient, topics: Iterable[TopicDescription]) -> tuple[
        dict[tuple[str, int], LogDescription], list[str]]:
    """The logs of `topics` by (topic, partition), and a warning per broker that could not be
    asked: a broker that is down does not fail the command, its partitions show '-'."""
    warnings: list[str] = []
    topics = list(topics)
    if not topics:
        return {}, warnings
    logs = client.describe_logs(topics, on_broker_error=lambda _address, e: warnings.append(
        explain(e, client.cluster.bootstrap)))
    return {(d.topic, d.partition): d for d in logs}, warnings


def topic_document(info: TopicDescription, views: dict[tuple[str, int], LogDescription] | None = None) -> dict[str, Any]:
    partitions: list[dict[str, Any]] = []
    for p in info.partitions:
        v = (views or {}).get((info.name, p.partition))
        known = v is not None and v.error is None
        start = v.log_start_offset if v is not None and known else None
        end = v.log_end_offset if v is not None and known else None
        partitions.append({
            "partition": p.partition,
            "leader_id": p.leader_id,
            "leader_address": p.leader_address or None,
            "leader_alive": p.leader_alive,
            "log_start_offset": start,
            "log_end_offset": end,
            "messages": (end - start) if start is not None and end is not None else None,
            "size_bytes": v.size_bytes if v is not None and known else None,
            "segment_count": v.segment_count if v is not None and known else None,
            "error": v.error if v is not None and v.error != "no leader" else None,
            "status": v.status if v is not None else None,
            "status_detail": v.status_detail if v is not None else None,
            "replicas": list(p.replicas),
            "isr": list(p.isr),
            "leader_epoch": p.leader_epoch,
            "under_replicated": p.under_replicated,
        })
    return {
        "name": info.name,
        "partition_count": info.partition_count,
        "created_ms": info.created_ms,
        "kind": info.kind,
        "messages": _sum([p["messages"] for p in partitions]) if views is not None else None,
        "size_bytes": _sum([p["size_bytes"] for p in partitions]) if views is not None else None,
        "config": {k: info.config.get(k) for k in (*CONFIG_KEYS, "unclean_leader_election")},
        "partitions": partitions,
    }


def _config_value(key: str, value: int | None) -> str:
    if value is None:
        return "(server default)"
    if key in _PLAIN_KEYS:
        return str(value).lower()
    if key.endswith("_ms"):
        return f"{value}  ({human_duration_ms(value)})"
    if key == "retention_bytes" and value < 0:
        return f"{value}  (no limit)"
    return f"{value}  ({human_bytes(value)})"


_PLAIN_KEYS = frozenset({"replication_factor", "min_insync_replicas", "unclean_leader_election",
                         "max_delivery_attempts"})


def _ids(ids: list[int]) -> str:
    return ",".join(str(b) for b in ids) or "-"


def _render_topic(doc: dict[str, Any], *, with_logs: bool) -> None:
    from rich.text import Text

    head = Text.assemble(
        ("Topic ", "bold"), (doc["name"], "bold cyan"),
        f"   partitions {doc['partition_count']}   created {human_time_ms(doc['created_ms'])}",
    )
    if with_logs:
        msgs = doc["messages"]
        head.append(f"   messages {msgs if msgs is not None else '-'}   size {human_bytes(doc['size_bytes'])}")
    show(head)
    rows = []
    for p in doc["partitions"]:
        alive = "[green]alive[/]" if p["leader_alive"] else "[red]down[/]"
        leader = f"{p['leader_id']} ({p['leader_address']})" if p["leader_address"] else "[red]none[/]"
        isr = _ids(p["isr"]) + (" [yellow](under-replicated)[/]" if p["under_replicated"] else "")
        row = [str(p["partition"]), leader, alive]
        replication = [_ids(p["replicas"]), isr, str(p["leader_epoch"])]
        if with_logs:
            def num(v: int | None) -> str:
                return "-" if v is None else str(v)

            note_text = p["error"] or ""
            if p.get("status") == "corrupt":
                note_text = f"[red]CORRUPT[/] {p['status_detail'] or ''}".strip()
            row += [num(p["log_start_offset"]), num(p["log_end_offset"]), num(p["messages"]),
                    human_bytes(p["size_bytes"]), *replication, note_text]
        else:
            row += replication
        rows.append(row)
    cols = ["PARTITION", "LEADER", "STATUS"]
    if with_logs:
        cols += ["LOG START", "LOG END", "MESSAGES", "SIZE", "REPLICAS", "IN SYNC", "EPOCH", "NOTE"]
    else:
        cols += ["REPLICAS", "IN SYNC", "EPOCH"]
    show(table(cols, rows, right=("PARTITION", "EPOCH", "LOG START", "LOG END", "MESSAGES", "SIZE")))
    show(table(["CONFIG", "VALUE"], [[k, _config_value(k, v)] for k, v in doc["config"].items()]))


@topics.command("create")
@click.argument("name")
@click.option("-p", "--partitions", type=click.IntRange(1, 10_000), default=1, show_default=True,
              help="Number of partitions (1..10000); more partitions, more parallel consumers.")
@click.option("-c", "--config", "config", multiple=True, metavar="KEY=VALUE", help=CONFIG_HELP)
@click.option("--kind", type=click.Choice(["log", "event-store"]), default="log", show_default=True,
              help="log: a partitioned log; event-store: one partition of typed, tagged events "
                   "(`dmq events append / read`), kept forever.")
@click.option("-r", "--replication-factor", type=click.IntRange(1, limits.REPLICATION_FACTOR_MAX), default=None,
              show_default="min(3, live brokers); 1 for the embedded server",
              help="Copies of each partition, each on its own broker.")
@click.option("--min-insync-replicas", type=click.IntRange(1, limits.REPLICATION_FACTOR_MAX), default=None,
              show_default="2 with 3 or more replicas, else 1",
              help="acks=all is refused while fewer replicas are in sync.")
@click.option("--unclean-leader-election", is_flag=True,
              help="Let a replica outside the in-sync set lead when none of it is alive (may lose acknowledged "
                   "records).")
@click.option("--if-not-exists", is_flag=True, help="Succeed quietly when the topic already exists.")
@output_option
@click.pass_context
def create(ctx: click.Context, name: str, partitions: int, config: tuple[str, ...], kind: str,
           replication_factor: int | None, min_insync_replicas: int | None, unclean_leader_election: bool,
           if_not_exists: bool, output: str) -> None:
    """Create topic NAME with --partitions partitions.

    \b
    Example:
      dmq topics create orders --partitions 3 --config retention_ms=7d
      dmq topics create payments --partitions 6 --replication-factor 3 --min-insync-replicas 2
      dmq topics create courses --kind event-store
    """
    settings: dict[str, int] = dict(parse_topic_config(config))
    for key, value in (("replication_factor", replication_factor), ("min_insync_replicas", min_insync_replicas)):
        if value is not None:
            settings[key] = value
    if unclean_leader_election:
        settings["unclean_leader_election"] = True
    client = admin(ctx)
    try:
        info = client.create_topic(name, partitions, config=settings, kind=kind)
        created = True
    except TopicAlreadyExistsError:
        if not if_not_exists:
            raise
        info = client.describe_topic(name)
        created = False
    doc = topic_document(info)
    if output == "json":
        print_json(doc | {"created": created})
        return
    if created:
        show(f"Created topic [bold cyan]{info.name}[/] with {info.partition_count} partition"
             f"{'s' if info.partition_count != 1 else ''}.")
    else:
        show(f"Topic [bold cyan]{info.name}[/] already exists ({info.partition_count} partitions); nothing to do.")


@topics.command("list")
@click.option("--no-logs", is_flag=True, help="Skip asking the brokers for message counts and sizes (faster).")
@output_option
@click.pass_context
def list_(ctx: click.Context, no_logs: bool, output: str) -> None:
    """List topics with their partition count, message count and size."""
    client = admin(ctx)
    infos = client.list_topics()
    views, warnings = (None, []) if no_logs else describe_logs(client, infos)
    docs = [topic_document(t, views) for t in infos]
    if output == "json":
        print_json({"topics": [{k: v for k, v in d.items() if k != "partitions"} for d in docs]})
        return
    for w in warnings:
        note(f"[yellow]warning:[/] {w}")
    if not docs:
        note("No topics yet. Create one with: dmq topics create NAME --partitions N")
        return
    rows = []
    for d in docs:
        rows.append([d["name"], str(d["partition_count"]),
                     "-" if d["messages"] is None else str(d["messages"]), human_bytes(d["size_bytes"]),
                     human_duration_ms(d["config"]["retention_ms"]) if d["config"]["retention_ms"] is not None else "default",
                     human_time_ms(d["created_ms"])])
    show(table(["TOPIC", "PARTITIONS", "MESSAGES", "SIZE", "RETENTION", "CREATED"], rows,
               right=("PARTITIONS", "MESSAGES", "SIZE")))


@topics.command("describe")
@click.argument("name")
@output_option
@click.pass_context
def describe(ctx: click.Context, name: str, output: str) -> None:
    """Partitions (leader broker, log start/end offsets, size on disk) and settings of topic NAME."""
    client = admin(ctx)
    info = client.describe_topic(name)
    views, warnings = describe_logs(client, [info])
    doc = topic_document(info, views)
    if output == "json":
        print_json(doc)
        return
    for w in warnings:
        note(f"[yellow]warning:[/] {w}")
    _render_topic(doc, with_logs=True)


@topics.command("alter")
@click.argument("name")
@click.option("-p", "--partitions", type=click.IntRange(1, 10_000), required=True,
              help="The new total number of partitions; it must be larger than the current one.")
@output_option
@click.pass_context
def alter(ctx: click.Context, name: str, partitions: int, output: str) -> None:
    """Add partitions to topic NAME (partitions can be added, never removed).

    Keys are spread by hash over the partitions, so adding partitions changes where new records
    with a given key land.
    """
    client = admin(ctx)
    current = client.describe_topic(name)
    if partitions < current.partition_count:
        raise CLIError(
            f"topic {name!r} has {current.partition_count} partitions and partitions can only be added: "
            f"ask for more than {current.partition_count}"
        )
    if partitions == current.partition_count:
        raise CLIError(f"topic {name!r} already has {partitions} partitions; ask for more to add some")
    info = client.add_partitions(name, partitions)
    if output == "json":
        print_json(topic_document(info))
        return
    show(f"Topic [bold cyan]{name}[/]: {current.partition_count} -> {info.partition_count} partitions.")


@topics.command("delete")
@click.argument("name")
@if_exists_option("topic")
@output_option
@click.pass_context
def delete(ctx: click.Context, name: str, if_exists: bool, output: str) -> None:
    """Delete topic NAME and all its data (no undo)."""
    show_deletion(lambda: admin(ctx).delete_topic(name), TopicNotFoundError, if_exists, name, output,
                  f"Deleted topic [bold cyan]{name}[/].", f"Topic {name} does not exist; nothing to do.")


@topics.command("verify")
@click.argument("name")
@output_option
@click.pass_context
def verify(ctx: click.Context, name: str, output: str) -> None:
    """Check the files of topic NAME on its brokers: every segment, the CRC of every batch, and
    that the indexes agree with the logs (an inconsistent index is rebuilt). Reports per
    partition; exits non-zero if any partition is damaged or cannot be checked. It reads every
    byte of the topic: raise --timeout for large topics."""
    client = admin(ctx)
    failures: dict[str, str] = {}
    info = client.describe_topic(name)
    logs = client.describe_logs([info], verify=True, on_broker_error=lambda address, e: failures.__setitem__(
        address, explain(e, client.cluster.bootstrap)))
    leaders = {p.partition: p.leader_id for p in info.partitions}
    results: dict[int, dict[str, Any]] = {}
    for d in logs:
        error = None
        if d.error is not None:
            error = failures.get(d.broker_address) or d.status_detail or d.error
        results[d.partition] = {
            "partition": d.partition, "leader_id": leaders.get(d.partition, -1), "ok": error is None and not d.problems,
            "batches_checked": d.batches_checked, "problems": list(d.problems),
            "indexes_rebuilt": list(d.indexes_rebuilt), "error": error,
        }
    rows = [results[n] for n in sorted(results)]
    all_ok = all(r["ok"] for r in rows)
    if output == "json":
        print_json({"name": name, "ok": all_ok, "partitions": rows})
    else:
        table_rows = []
        for r in rows:
            if r["error"]:
                verdict, detail = "[yellow]NOT CHECKED[/]", r["error"]
            elif r["problems"]:
                verdict, detail = "[red]CORRUPT[/]", "; ".join(r["problems"])
            else:
                verdict, detail = "[green]ok[/]", "; ".join(f"rebuilt {x}" for x in r["indexes_rebuilt"])
            checked = "-" if r["batches_checked"] is None else str(r["batches_checked"])
            table_rows.append([str(r["partition"]), str(r["leader_id"]), checked, verdict, detail])
        show(table(["PARTITION", "BROKER", "BATCHES", "RESULT", "DETAIL"], table_rows, right=("PARTITION", "BATCHES")))
    if not all_ok:
        ctx.exit(1)


def _broker_ids(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of broker ids (e.g. 1,2,3)") from None
    if not ids:
        raise click.BadParameter("name at least one broker id (e.g. 1,2,3)")
    return ids


@topics.command("reassign")
@click.argument("name")
@click.option("--partition", type=click.IntRange(0, limits.PARTITIONS_PER_TOPIC_MAX - 1), required=True,
              help="The partition to move.")
@click.option("--replicas", required=True, callback=_broker_ids, metavar="IDS",
              help="The broker ids to hold it, comma-separated; the first leads once it is in sync.")
@click.option("--timeout", "wait_s", type=click.FloatRange(0.1), default=60.0, show_default=True, metavar="SECONDS",
              help="How long to wait for the new replicas to catch up and the old ones to be dropped.")
@output_option
@click.pass_context
def reassign(ctx: click.Context, name: str, partition: int, replicas: tuple[int, ...], wait_s: float,
             output: str) -> None:
    """Move partition --partition of topic NAME to the brokers --replicas. The new replicas copy the
    partition from its leader and join the in-sync set before the old ones are dropped, so it stays
    readable and writable throughout; waits for that (--timeout) and prints the result.

    \b
    Example:
      dmq topics reassign orders --partition 0 --replicas 1,2,3
    """
    p = admin(ctx).reassign_partition(name, partition, replicas, wait_s=wait_s)
    doc: dict[str, Any] = {"name": name, "partition": partition, "leader_id": p.leader_id, "replicas": list(p.replicas),
           "isr": list(p.isr), "leader_epoch": p.leader_epoch, "completed": p.replicas == replicas}
    if output == "json":
        print_json(doc)
        return
    show(f"Topic [bold cyan]{name}[/] partition {partition}: replicas {_ids(doc['replicas'])}, in sync "
         f"{_ids(doc['isr'])}, leader {p.leader_id} (epoch {p.leader_epoch}).")
