"""`dmq events append | read | group ...`: event-store topics from the shell, JSON lines in and out.

An event as a JSON line (append reads them, read writes them):
  {"type": "course.created", "tags": ["course_name:Algebra"], "payload": ..., "metadata": ...}
  payload / metadata: a string is stored as its UTF-8 bytes, any other JSON value as its compact
  JSON text; "payload_base64" / "metadata_base64" carry arbitrary bytes. `read` writes a payload
  that is JSON text other than a string (an object, array, number, true, false, null) as that
  JSON value, so what append took as JSON reads back as the same JSON; any other UTF-8 payload as
  a string (all of them with --payload-as text), else as payload_base64; plus "position" and
  "append_time_ms". (A string payload that is itself such JSON text, "42", reads back as 42.)

append sends the lines in appends of --batch events (each one atomic); with a condition
(--fail-if-events-match, a JSON list of {"types": [...], "tags": [...]} items, and --after) all
lines go in one append, which stores nothing if an event after --after matches, exits 1 and names
the first conflicting position. It prints {"last_position", "events"} per append.

`dmq events group describe TOPIC GROUP` (also reachable as `dmq groups describe GROUP
--event-store TOPIC`) shows an event-store consumer group: partitions known, claimed (by which
worker, since when), pending per partition. JSON schema (-o json):
  {"topic", "group", "active", "partition_by", "handled_types", "head",
   "partitions": [{"partition_key", "values", "acked_position", "claimed_by", "claimed_since_ms", "pending"}]}
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

import click

from dmq.client.cli._errors import bootstrap, timeout_s
from dmq.client.cli._output import human_time_ms, output_option, print_json, show, table
from dmq.client.cli._session import CLIError

if TYPE_CHECKING:
    from dmq.client.events import Event, EventStore, QueryItem, SequencedEvent

APPEND_BATCH_DEFAULT = 1_000
APPEND_BATCH_MAX = 10_000  # dmq.proto.event_headers.EVENTS_PER_APPEND_MAX


@click.group("events")
def events() -> None:
    """Event-store topics: append and read typed, tagged events; inspect event groups.

    Create one with `dmq topics create NAME --kind event-store`.
    """


def _store(ctx: click.Context, topic: str) -> EventStore:
    from dmq.client.events import EventStore

    return EventStore(bootstrap(ctx), topic, request_timeout_ms=int(timeout_s(ctx) * 1000))


def _bytes_field(doc: dict[str, Any], name: str, where: str) -> bytes:
    if f"{name}_base64" in doc:
        try:
            return base64.b64decode(doc[f"{name}_base64"], validate=True)
        except (ValueError, TypeError) as e:
            raise CLIError(f"{where}: {name}_base64 is not base64: {e}") from None
    value = doc.get(name)
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, separators=(",", ":")).encode()


def parse_event(line: str, where: str) -> Event:
    from dmq.client.events import Event

    try:
        doc = json.loads(line)
    except json.JSONDecodeError as e:
        raise CLIError(f"{where}: not JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("type"), str):
        raise CLIError(f'{where}: an event is a JSON object with a "type" string, e.g. {{"type": "x", "tags": []}}')
    tags = doc.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise CLIError(f'{where}: "tags" must be a list of strings')
    return Event(doc["type"], tuple(tags), _bytes_field(doc, "payload", where), _bytes_field(doc, "metadata", where))


def parse_query(text: str | None, types: tuple[str, ...], tags: tuple[str, ...], option: str) -> list[QueryItem]:
    """A query from a JSON list of items, or one item from --type / --tag."""
    from dmq.client.events import QueryItem

    items = []
    if text:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise click.BadParameter(f"not JSON: {e}", param_hint=option) from None
        if not isinstance(doc, list):
            raise click.BadParameter('a JSON list of items such as [{"types": ["a"], "tags": ["k:1"]}]', param_hint=option)
        for i, item in enumerate(doc):
            if not isinstance(item, dict) or set(item) - {"types", "tags"}:
                raise click.BadParameter(f'item {i} must be an object with "types" and/or "tags"', param_hint=option)
            items.append(QueryItem(tuple(item.get("types", [])), tuple(item.get("tags", []))))
    if types or tags:
        items.append(QueryItem(types, tags))
    return items


_JSON_STARTS = frozenset(b'{[-0123456789tfn')  # no '"': a JSON string stays text
_NOT_JSON = object()


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: Python's extension, not JSON


def _json_value(text: str) -> Any:
    """The JSON value `text` holds, unless it is none or a string (_NOT_JSON): the inverse of
    append's `_bytes_field` for every value it encodes as JSON."""
    stripped = text.strip()
    if not stripped or ord(stripped[0]) not in _JSON_STARTS:
        return _NOT_JSON  # most text payloads: no parse attempted
    try:
        return json.loads(stripped, parse_constant=_no_constants)
    except ValueError:
        return _NOT_JSON


def event_document(e: SequencedEvent, *, json_values: bool = True) -> dict[str, Any]:
    doc: dict[str, Any] = {"position": e.position, "type": e.type, "tags": list(e.tags)}
    for name, value in (("payload", e.payload), ("metadata", e.event.metadata)):
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            doc[f"{name}_base64"] = base64.b64encode(value).decode()
            continue
        parsed = _json_value(text) if json_values else _NOT_JSON
        doc[name] = text if parsed is _NOT_JSON else parsed
    doc["append_time_ms"] = e.append_time_ms
    return doc


def _lines(source: IO[str]) -> Iterator[tuple[int, str]]:
    for n, line in enumerate(source, 1):
        if line.strip():
            yield n, line


@events.command("append")
@click.argument("topic")
@click.option("-f", "--file", "source", type=click.File("r"), default="-", show_default=True,
              help="JSON lines to read (- is stdin).")
@click.option("--batch", type=click.IntRange(1, APPEND_BATCH_MAX), default=APPEND_BATCH_DEFAULT, show_default=True,
              help="Events per append (each append is atomic).")
@click.option("--fail-if-events-match", "condition", metavar="JSON",
              help='Condition: a JSON list of query items; with it every line goes in one append.')
@click.option("--after", type=click.IntRange(0), default=None, help="The condition's position (default 0: any event).")
@click.pass_context
def append(ctx: click.Context, topic: str, source: IO[str], batch: int, condition: str | None, after: int | None) -> None:
    """Append the events of JSON lines (stdin or --file) to event-store TOPIC.

    \b
    Example:
      echo '{"type": "course.created", "tags": ["course_name:Algebra"], "payload": {"seats": 30}}' \\
        | dmq events append courses --fail-if-events-match '[{"tags": ["course_name:Algebra"]}]'
    """
    from dmq.client.errors import AppendConditionError
    from dmq.client.events import AppendCondition

    cond = None
    if condition is not None:
        cond = AppendCondition(parse_query(condition, (), (), "--fail-if-events-match"), after)
    elif after is not None:
        raise click.BadParameter("--after is the position of a condition: give --fail-if-events-match too",
                                 param_hint="--after")
    with _store(ctx, topic) as store:
        pending: list[Event] = []
        total = 0

        def flush() -> None:
            nonlocal total
            try:
                last = store.append(pending, cond)
            except AppendConditionError as e:
                raise CLIError(f"nothing appended: the event at position {e.position} matches the condition "
                               f"(after {after or 0}); read again and decide anew") from None
            click.echo(json.dumps({"last_position": last, "events": len(pending)}))
            total += len(pending)
            pending.clear()

        for n, line in _lines(source):
            pending.append(parse_event(line, f"line {n}"))
            if cond is None and len(pending) >= batch:
                flush()
            elif len(pending) > APPEND_BATCH_MAX:
                raise CLIError(f"a conditional append holds at most {APPEND_BATCH_MAX} events; line {n} is one more")
        if pending:
            flush()
        if total == 0:
            raise CLIError("no events on the input: one JSON object per line")


@events.command("read")
@click.argument("topic")
@click.option("-t", "--type", "types", multiple=True, help="Match events of this type (repeatable: any of them).")
@click.option("--tag", "tags", multiple=True, help="Match events carrying this tag (repeatable: all of them).")
@click.option("-q", "--query", "query", metavar="JSON", help='A JSON list of query items, OR\'ed with --type/--tag.')
@click.option("--after", type=click.IntRange(0), default=0, show_default=True, help="Start after this position.")
@click.option("-n", "--limit", type=click.IntRange(1), default=None, help="Stop after this many events.")
@click.option("--follow", is_flag=True, help="Keep printing matching events as they are appended (Ctrl-C ends).")
@click.option("--payload-as", "payload_as", type=click.Choice(["json", "text"]), default="json", show_default=True,
              help="json: a payload (or metadata) holding a JSON object, array, number, true, false or null "
                   "is written as that value; text: always as a string.")
@click.pass_context
def read(ctx: click.Context, topic: str, types: tuple[str, ...], tags: tuple[str, ...], query: str | None,
         after: int, limit: int | None, follow: bool, payload_as: str) -> None:
    """Print the matching events of event-store TOPIC as JSON lines, in position order.

    \b
    Example:
      dmq events read courses --tag course_name:Algebra --type user.joined_course
    """
    items = parse_query(query, types, tags, "--query")
    out = sys.stdout
    with _store(ctx, topic) as store:
        if follow:
            count = 0
            with store.subscribe(items, after) as sub:
                for event in sub:
                    out.write(json.dumps(event_document(event, json_values=payload_as == "json")) + "\n")
                    out.flush()
                    count += 1
                    if limit is not None and count >= limit:
                        return
            return
        for event in store.read(items, after, limit):
            out.write(json.dumps(event_document(event, json_values=payload_as == "json")) + "\n")


@events.group("group")
def group() -> None:
    """Event-store consumer groups (partitioned by attributes)."""


def group_document(store: EventStore, group_name: str) -> dict[str, Any]:
    d = store.describe_group(group_name)
    return {
        "topic": store.topic,
        "group": d.group,
        "active": d.active,
        "partition_by": d.partition_by,
        "handled_types": d.handled_types,
        "head": d.head,
        "partitions": [
            {"partition_key": p.partition_key, "values": dict(p.values), "acked_position": p.acked_position,
             "claimed_by": p.claimed_by, "claimed_since_ms": p.claimed_since_ms, "pending": p.pending}
            for p in d.partitions
        ],
    }


def describe_event_group(ctx: click.Context, topic: str, group_name: str, output: str) -> None:
    """The describe shared by `dmq events group describe` and `dmq groups describe --event-store`."""
    with _store(ctx, topic) as store:
        doc = group_document(store, group_name)
    if output == "json":
        print_json(doc)
        return
    state = "active" if doc["active"] else "stopped"
    show(f"[bold]Event group[/] [bold cyan]{doc['group']}[/]   topic [bold]{doc['topic']}[/]   {state}   head {doc['head']}")
    show(f"Partitioned by {', '.join(doc['partition_by']) or '(not yet: no claim so far)'}; "
         f"handles {', '.join(doc['handled_types']) or '-'}")
    rows = [[" ".join(f"{k}={v}" for k, v in sorted(p["values"].items())), str(p["acked_position"]), str(p["pending"]),
             p["claimed_by"] or "-", human_time_ms(p["claimed_since_ms"]) if p["claimed_since_ms"] else "-"]
            for p in doc["partitions"]]
    show(table(["PARTITION", "ACKED", "PENDING", "CLAIMED BY", "SINCE"], rows,
               title=f"Partitions ({len(rows)})", right=("ACKED", "PENDING")))


@group.command("describe")
@click.argument("topic")
@click.argument("group_name", metavar="GROUP")
@output_option
@click.pass_context
def group_describe(ctx: click.Context, topic: str, group_name: str, output: str) -> None:
    """Partitions known, claimed (by which worker, since when) and pending events of GROUP on TOPIC."""
    describe_event_group(ctx, topic, group_name, output)


def _control(action: str) -> click.Command:
    @click.command(action)
    @click.argument("topic")
    @click.argument("group_name", metavar="GROUP")
    @click.pass_context
    def command(ctx: click.Context, topic: str, group_name: str) -> None:
        with _store(ctx, topic) as store:
            getattr(store, f"{action}_group")(group_name)
            state = store.group_state(group_name)
        show(f"Event group [bold cyan]{group_name}[/] on {topic}: {action} done; now {state}.")

    command.help = {
        "register": "Create GROUP on TOPIC (idempotent).",
        "stop": "Stop GROUP: claim_next answers nothing until start.",
        "start": "Start a stopped GROUP.",
        "reset": "Forget every partition's acknowledged position of GROUP (all events pending again).",
    }[action]
    return command


for _action in ("register", "stop", "start", "reset"):
    group.add_command(_control(_action))
