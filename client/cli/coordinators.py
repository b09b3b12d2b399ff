"""`dmq coordinators list` (issue 28 item 7): each coordinator address of --bootstrap, asked directly.

Exit codes: 0 one coordinator is active and every address answered, 1 otherwise (no active one, or
an address unreachable; the listing is printed first), as `dmq brokers list` does for brokers.
The controller epoch is the one each coordinator claimed when it last took control: the active
one's is the cluster's; a standby that never took control shows 0 (it does not track the epoch).

JSON schema: {"coordinators": [{"address", "state" ("active" | "standby" | "unreachable"),
                                "controller_epoch" (null when unreachable),
                                "active_address" (the active one as this one last read it; null: unknown),
                                "error" (why unreachable; else null)}],
              "controller_epoch" (the active coordinator's; null when none is active)}
"""

from __future__ import annotations

from typing import Any

import click

from dmq.client.cli._errors import admin
from dmq.client.cli._output import output_option, print_json, show, table

_STYLE = {"active": "[green]active[/]", "standby": "standby", "unreachable": "[red]unreachable[/]"}


@click.group("coordinators")
def coordinators() -> None:
    """Coordinators named by --bootstrap: which is active."""


@coordinators.command("list")
@output_option
@click.pass_context
def list_(ctx: click.Context, output: str) -> None:
    """Each coordinator of --bootstrap h1:p,h2:p,...: active, standby or unreachable, its controller
    epoch, and the active one it names."""
    docs: list[dict[str, Any]] = [
        {"address": c.address, "state": c.state, "controller_epoch": c.controller_epoch,
         "active_address": c.active_address, "error": c.error}
        for c in admin(ctx).describe_coordinators()
    ]
    active = [d for d in docs if d["state"] == "active"]
    epoch = max((d["controller_epoch"] for d in active), default=None)
    if output == "json":
        print_json({"coordinators": docs, "controller_epoch": epoch})
    else:
        rows = [[d["address"], _STYLE[d["state"]],
                 "-" if d["controller_epoch"] is None else str(d["controller_epoch"]),
                 d["active_address"] or "-"]
                for d in docs]
        show(table(["ADDRESS", "STATE", "CONTROLLER EPOCH", "ACTIVE (AS IT SEES IT)"], rows,
                   right=("CONTROLLER EPOCH",)))
    unreachable = [d["address"] for d in docs if d["state"] == "unreachable"]
    if not active:
        raise click.ClickException("no coordinator is active" + (
            f" (unreachable: {', '.join(unreachable)})" if unreachable else ""))
    if unreachable:
        raise click.ClickException(f"coordinator(s) unreachable: {', '.join(unreachable)}")
