"""The `dmq` command: servers, topics, groups, produce/consume, brokers, bench."""

from __future__ import annotations

import click

from dmq.client.cli.servers import broker_cmd, coordinator_cmd, server_cmd


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--bootstrap", envvar="DMQ_BOOTSTRAP", default="127.0.0.1:9091", show_default=True,
              help="Coordinator address HOST:PORT (env DMQ_BOOTSTRAP).")
@click.pass_context
def cli(ctx: click.Context, bootstrap: str) -> None:
    """DMQ: a Kafka-style message queue. Start with `dmq server`, then `dmq topics create`."""
    ctx.ensure_object(dict)
    ctx.obj["bootstrap"] = bootstrap


cli.add_command(server_cmd)
cli.add_command(coordinator_cmd)
cli.add_command(broker_cmd)


def main() -> None:
    cli(obj={})
