"""`dmq health`: is the coordinator up, and every broker it knows of (and, with several
coordinators on etcd, each coordinator and etcd)?

Each server answers the standard gRPC health service (grpc.health.v1.Health): SERVING once started,
NOT_SERVING while starting or shutting down. The coordinator is asked for itself ("" = the whole
server) and for the brokers it has registered; each broker is then asked directly, all at once,
for the Broker service. A broker counts as up only when it answers SERVING *and* the coordinator
sees its heartbeats: one without the other is a broker clients cannot use. With several
coordinators (--bootstrap h1:p,h2:p,...), each one is listed: the active one (asked for the
brokers), the standbys, any unreachable one (down). When the coordinators keep their metadata on
etcd, etcd is a component too: down when it did not answer a read within a second (stopped,
paused, without quorum), as the active coordinator (else a standby) checked it just now.

Exit codes: 0 everything up, 1 anything down (each one named with its address on stderr) or no
broker registered at all.

JSON schema: {"healthy": bool, "components": [{"component": "coordinator"|"broker"|"etcd", "broker_id",
              "address", "status": "up"|"down", "detail"}]}   (broker_id is null but for brokers)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from dmq.client.cli._errors import admin, timeout_s
from dmq.client.cli._output import output_option, print_json, show, table

# A health check is one small answer: a server that has not given it in a few seconds is not
# healthy, whatever --timeout allows for slow admin calls.
CHECK_TIMEOUT_CAP_S = 5.0

if TYPE_CHECKING:
    from dmq.client.admin import ServerHealth


@click.command("health")
@output_option
@click.pass_context
def health(ctx: click.Context, output: str) -> None:
    """Check the coordinator and every registered broker; exit 1 if any is down."""
    components = admin(ctx).check_health(min(timeout_s(ctx), CHECK_TIMEOUT_CAP_S))
    down = [c for c in components if not c.up]
    if output == "json":
        print_json({"healthy": not down, "components": [_document(c) for c in components]})
    else:
        rows = [
            [c.name, c.address, "[green]up[/]" if c.up else "[red]down[/]", c.detail]
            for c in components
        ]
        show(table(["COMPONENT", "ADDRESS", "STATUS", "DETAIL"], rows))
    if down:
        raise click.ClickException("unhealthy: " + "; ".join(f"{c.name} at {c.address} is down ({c.detail})" for c in down))
    if not any(c.component == "broker" for c in components):  # a coordinator without brokers can store nothing
        raise click.ClickException(
            f"unhealthy: no broker has registered with the coordinator at {components[0].address} "
            "(`dmq broker --coordinator HOST:PORT` adds one)"
        )


def _document(c: ServerHealth) -> dict[str, Any]:
    return {"component": c.component, "broker_id": c.broker_id, "address": c.address,
            "status": "up" if c.up else "down", "detail": c.detail}
