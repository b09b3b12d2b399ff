"""`dmq certs`, `dmq tokens`, `dmq acls`: the credentials and permissions of a secured cluster.

See README "Securing a cluster" for the whole walk-through.
"""

from __future__ import annotations

import os
import pathlib

import click


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
