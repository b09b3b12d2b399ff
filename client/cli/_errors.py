"""Failures into one line and an exit code, and the per-invocation Session.

Whatever a command raises ends here: click's own usage errors keep exit code 2; CLIError and the
client library's DMQError family print `Error: <what happened and what to do>` and exit 1; Ctrl-C
exits 130 without a traceback. A stray grpc.RpcError (a bug: everything should be translated
earlier) is still reported as one line rather than a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import click

from dmq.client.cli._output import one_line
from dmq.client.cli._session import CLIError, Session, coordinator_unreachable, is_connect_failure


def session(ctx: click.Context) -> Session:
    root = ctx.find_root()
    obj = root.obj if isinstance(root.obj, dict) else {}
    s = obj.get("session")
    if s is None:
        s = Session(obj.get("bootstrap", "127.0.0.1:9091"), obj.get("timeout_s", 15.0))
        obj["session"] = s
        root.call_on_close(s.close)
    return s


def bootstrap(ctx: click.Context) -> str:
    root = ctx.find_root()
    return str((root.obj or {}).get("bootstrap", "127.0.0.1:9091"))


def timeout_s(ctx: click.Context) -> float:
    root = ctx.find_root()
    return float((root.obj or {}).get("timeout_s", 15.0))


def explain(e: BaseException, bootstrap_address: str) -> str:
    """A client-library error as one actionable sentence. gRPC's connection details ("failed to
    connect to all addresses; last error: UNKNOWN: ipv4:...") become which server is unreachable."""
    text = one_line(str(e)) or type(e).__name__
    if not is_connect_failure(text):
        return text
    addresses = re.findall(r"\bat (\S+:\d+)", text)
    address = addresses[-1] if addresses else None
    if address is None or address == bootstrap_address and "broker" not in text.lower():
        return coordinator_unreachable(bootstrap_address).message
    what = re.match(r"^(?:[^:]*: )?(\w+ to \S+|\w+ \S+\[\d+\])", text)
    doing = f" ({what.group(1)})" if what else ""
    return f"cannot reach the broker at {address}{doing} — is it running? (see `dmq brokers list`)"


def client_error(e: BaseException, address: str) -> CLIError:
    """A dmq.client error (or anything else from the client library) as a CLIError."""
    return CLIError(explain(e, address))


def run_translating_errors(ctx: click.Context, invoke: Callable[[], Any]) -> Any:
    try:
        return invoke()
    except (click.ClickException, click.exceptions.Exit, click.Abort):
        raise
    except KeyboardInterrupt:
        click.echo("", err=True)
        ctx.exit(130)
    except BrokenPipeError:
        raise
    except Exception as e:
        if _is_client_error(e):
            raise client_error(e, bootstrap(ctx)) from None
        if _is_rpc_error(e):
            from dmq.client.cli._session import translate

            details = e.details() if hasattr(e, "details") else str(e)
            code = e.code() if hasattr(e, "code") else None
            if is_connect_failure(details or ""):
                raise coordinator_unreachable(bootstrap(ctx)) from None
            raise translate(code, details or "", bootstrap(ctx), role="server", timeout_s=timeout_s(ctx)) from None
        raise


def _is_client_error(e: BaseException) -> bool:
    try:
        from dmq.client.errors import DMQError
    except ImportError:
        return False
    return isinstance(e, DMQError)


def _is_rpc_error(e: BaseException) -> bool:
    import grpc

    return isinstance(e, grpc.RpcError)
