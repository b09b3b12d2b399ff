"""`dmq certs`, `dmq tokens`, `dmq acls`: the credentials and permissions of a secured cluster.

See README "Securing a cluster" for the whole walk-through.
"""

from __future__ import annotations

import os
import pathlib
from typing import TYPE_CHECKING, Any

import click

from dmq.client.cli._output import F, output_option

if TYPE_CHECKING:  # for the annotation; _entries imports it when it runs, as these commands import lazily
    from dmq.proto.security.acls import Acl


@click.group("certs")
def certs() -> None:
    """Development certificates for TLS."""


@certs.command("create")
@click.argument("directory", type=click.Path(file_okay=False, path_type=pathlib.Path))
@click.option("--client", "clients", multiple=True, default=("admin",), show_default=True,
              help="A client certificate with this common name (the principal); repeat for more.")
@click.option("--host", "hosts", multiple=True, show_default="none",
              help="Another name or address the servers are reached at (127.0.0.1, ::1 and localhost are always in).")
@click.option("--cluster-principal", default="dmq-cluster", show_default=True,
              help="The server certificate's common name: the nodes' principal under mutual TLS.")
def certs_create(directory: pathlib.Path, clients: tuple[str, ...], hosts: tuple[str, ...], cluster_principal: str) -> None:
    """Make a development CA, a server certificate and client certificates in DIRECTORY."""
    from dmq.client.cli._certs import create_dev_certs

    if (directory / "ca.key").exists():
        raise click.ClickException(f"{directory} already holds a CA (ca.key); choose another directory")
    try:
        issued = create_dev_certs(directory, clients=clients, hosts=hosts, cluster_principal=cluster_principal)
    except (ValueError, OSError) as e:
        raise click.ClickException(str(e)) from None
    d = directory
    click.echo(f"wrote {', '.join(sorted(p.certfile.name for p in issued.values()))} and their keys to {d}")
    click.echo(f"  server:  dmq server --tls-cert {d}/server.pem --tls-key {d}/server.key --tls-ca {d}/ca.pem "
               "--require-client-cert")
    first = next((n for n in issued if n not in ("ca", "server")), None)
    if first:
        click.echo(f"  client:  dmq --ca-file {d}/ca.pem --cert-file {d}/{first}.pem --key-file {d}/{first}.key topics list")


@click.group("tokens")
def tokens() -> None:
    """Signed tokens (JWT) naming a principal."""


@tokens.command("create")
@click.option("--principal", required=True, help="The principal the token names (its 'sub').")
@click.option("--ttl", default="30d", show_default=True, help="How long it is valid: 90s, 15m, 12h, 30d, 2w.")
@click.option("--secret-file", type=click.Path(dir_okay=False, exists=True), default=None, show_default="none",
              help="The cluster's HS256 secret (the servers' --token-secret-file; or env DMQ_TOKEN_SECRET).")
@click.option("--private-key", type=click.Path(dir_okay=False, exists=True), default=None, show_default="none",
              help="A PEM private key (RS256 / ES256) whose public key the servers have.")
def tokens_create(principal: str, ttl: str, secret_file: str | None, private_key: str | None) -> None:
    """Print a token for --principal (for development: real deployments issue their own)."""
    from dmq.proto.security.tokens import create_token, parse_duration_s

    try:
        ttl_s = parse_duration_s(ttl)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--ttl") from None
    secret = pathlib.Path(secret_file).read_text(encoding="utf-8").strip() if secret_file else None
    if secret is None and private_key is None:
        secret = os.environ.get("DMQ_TOKEN_SECRET") or None
    if (secret is None) == (private_key is None):
        raise click.UsageError("give --secret-file (or env DMQ_TOKEN_SECRET) or --private-key")
    try:
        token = create_token(principal, ttl_s=ttl_s, secret=secret,
                             private_key_pem=pathlib.Path(private_key).read_bytes() if private_key else None)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    click.echo(token)


@click.group("acls")
def acls() -> None:
    """Access-control lists: who may do what to which topics, groups and the cluster."""


def _entry_options(f: F) -> F:
    opts = [
        click.option("--principal", required=True, help="A principal name, or '*' for every principal."),
        click.option("--topic", "topic", default=None, show_default="none", help="The topic (or prefix) resource."),
        click.option("--group", "group", default=None, show_default="none",
                     help="The group resource: a group id, G_<topic>_<app> (or a prefix)."),
        click.option("--cluster", "cluster", is_flag=True, default=False, show_default=True,
                     help="The cluster resource (listing, ACL changes)."),
        click.option("--prefix", is_flag=True, default=False, show_default=True,
                     help="The name is a prefix: every topic/group starting with it."),
        click.option("--operation", "operations", multiple=True, required=True,
                     type=click.Choice(["read", "write", "create", "delete", "describe", "alter"]),
                     help="Repeat for several."),
        click.option("--deny", is_flag=True, default=False, show_default=True,
                     help="A deny entry (deny wins over any allow)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _entries(principal: str, topic: str | None, group: str | None, cluster: bool, prefix: bool,
             operations: tuple[str, ...], deny: bool) -> list[Acl]:
    from dmq.proto.security.acls import CLUSTER_RESOURCE, Acl

    named = [(t, n) for t, n in (("topic", topic), ("group", group), ("cluster", CLUSTER_RESOURCE if cluster else None)) if n]
    if len(named) != 1:
        raise click.UsageError("name exactly one resource: --topic NAME, --group NAME or --cluster")
    rtype, name = named[0]
    out = []
    for op in operations:
        try:
            acl = Acl.parse(principal, rtype, name, op, "deny" if deny else "allow", "prefixed" if prefix else "literal")
        except ValueError as e:
            raise click.UsageError(str(e)) from None
        out.append(acl)
    return out


@acls.command("add")
@_entry_options
@click.pass_context
def acls_add(ctx: click.Context, /, **entry: Any) -> None:
    """Allow (or --deny) a principal operations on a resource."""
    from dmq.client.cli._errors import admin

    answer = admin(ctx).add_acls(_entries(**entry))
    click.echo(f"added {answer.changed} ACL(s); ACL version {answer.version}")


@acls.command("remove")
@_entry_options
@click.pass_context
def acls_remove(ctx: click.Context, /, **entry: Any) -> None:
    """Remove exactly these entries (as `dmq acls list` shows them)."""
    from dmq.client.cli._errors import admin

    answer = admin(ctx).remove_acls(_entries(**entry))
    click.echo(f"removed {answer.changed} ACL(s); ACL version {answer.version}")


@acls.command("list")
@click.option("--principal", default="", show_default="every principal", help="Only this principal's entries.")
@output_option
@click.pass_context
def acls_list(ctx: click.Context, principal: str, output: str) -> None:
    """Every ACL entry (or one principal's)."""
    from dmq.client.cli._errors import admin
    from dmq.client.cli._output import note, print_json, show, table

    answer = admin(ctx).list_acls(principal)
    docs = [{"principal": a.principal, "permission": a.permission, "operation": a.operation,
             "resource_type": a.resource_type, "pattern_type": a.pattern_type, "resource_name": a.resource_name}
            for a in answer.acls]
    if output == "json":
        print_json({"version": answer.version, "acls": docs})
        return
    if not docs:
        note("No ACLs. Only super-users (--super-users) and the cluster may act; `dmq acls add` grants more.")
        return
    show(table(["PRINCIPAL", "PERMISSION", "OPERATION", "RESOURCE", "PATTERN", "NAME"],
               [[d["principal"], d["permission"], d["operation"], d["resource_type"], d["pattern_type"],
                 d["resource_name"]] for d in docs]))
