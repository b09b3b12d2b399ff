"""`dmq trace TRACE_ID`: every record of the trace, across all topics, in time order. TRACE_ID is a
W3C trace id (32 hex digits: the records whose ``traceparent`` header carries it), a whole
traceparent value, or an id written in the older ``dmq.trace`` header. Each broker looks the id
up in its segments' trace indexes (no log scan); see AdminClient.find_trace.

Exit codes: 0 records found, 1 none (after printing the empty listing), so a script can tell.

JSON schema: {"trace_id", "truncated", "records": [{"topic", "partition", "offset", "timestamp",
              "key", "value", "headers": [{"name", "value"}]}]}  (records as `dmq consume -o json`)
"""

from __future__ import annotations

import click

from dmq.client.cli._output import human_time_ms, note, output_option, print_json, show, table


@click.command("trace")
@click.argument("trace_id")
@click.option("-n", "--max-records", type=click.IntRange(1, 10_000), default=1000, show_default=True,
              help="At most this many records from each broker.")
@output_option
@click.pass_context
def trace(ctx: click.Context, trace_id: str, max_records: int, output: str) -> None:
    """Every record of the trace TRACE_ID, across all topics, oldest first.

    TRACE_ID: a W3C trace id (32 hex digits), a traceparent value, or an id of the older dmq.trace
    header.

    \b
      dmq trace 4bf92f3577b34da6a3ce929d0e0e4736
      dmq trace 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 -o json
    """
    from dmq.client._trace import lookup_id
    from dmq.client.admin import AdminClient
    from dmq.client.cli.messages import record_doc

    obj = ctx.find_root().obj or {}
    timeout_ms = max(1, int(obj.get("timeout_s", 15.0) * 1000))
    with AdminClient(obj.get("bootstrap", "127.0.0.1:9091"), request_timeout_ms=timeout_ms) as admin:
        found = admin.find_trace(trace_id, max_records=max_records)
    docs = [record_doc(r) for r in found]
    if output == "json":
        print_json({"trace_id": lookup_id(trace_id), "truncated": found.truncated, "records": docs})
    elif docs:
        rows = [
            [human_time_ms(d["timestamp"]), d["topic"], str(d["partition"]), str(d["offset"]),
             "" if d["key"] is None else str(d["key"]), str(d["value"])[:80]]
            for d in docs
        ]
        show(table(["TIME", "TOPIC", "PARTITION", "OFFSET", "KEY", "VALUE"], rows, right=("PARTITION", "OFFSET")))
        if found.truncated:
            note(f"[yellow]More records carry this trace id:[/] raise --max-records (now {max_records}).")
    if not docs:
        if output != "json":
            note(f"No record carries trace id {trace_id!r}.")
        raise click.exceptions.Exit(1)
