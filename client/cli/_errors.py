"""Failures into one line and an exit code, and the per-invocation Session.

Whatever a command raises ends here: click's own usage errors keep exit code 2; CLIError and the
client library's DMQError family print `Error: <what happened and what to do>` and exit 1; Ctrl-C
exits 130 without a traceback. The wording is chosen by the error's class (never by searching the
server's message), plus the address the library names in its context ("(coordinator at H:P)",
"(broker at H:P)"). A stray grpc.RpcError (a bug: the library translates everything) is still
reported as one line rather than a traceback.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from dmq.client.cli._output import one_line
from dmq.client.cli._session import CLIError, Session, coordinator_unreachable
from dmq.client.errors import is_connect_failure

if TYPE_CHECKING:
    from dmq.client.admin import AdminClient

_WHERE = re.compile(r"\((coordinator|broker) at (\S+:\d+)\)")


def session(ctx: click.Context) -> Session:
    root = ctx.find_root()
    obj = root.obj if isinstance(root.obj, dict) else {}
    s = obj.get("session")
    if s is None:
        s = Session(obj.get("bootstrap", "127.0.0.1:9091"), obj.get("timeout_s", 15.0))
        obj["session"] = s
        root.call_on_close(s.close)
    return s


def admin(ctx: click.Context) -> AdminClient:
    """The invocation's AdminClient (closed when the command ends)."""
    return session(ctx).admin


def bootstrap(ctx: click.Context) -> str:
    root = ctx.find_root()
    return str((root.obj or {}).get("bootstrap", "127.0.0.1:9091"))


def timeout_s(ctx: click.Context) -> float:
    root = ctx.find_root()
    return float((root.obj or {}).get("timeout_s", 15.0))


def explain(e: BaseException, bootstrap_address: str, timeout: float | None = None) -> str:
    """A client-library error as one actionable sentence. gRPC's connection details ("failed to
    connect to all addresses; last error: UNKNOWN: ipv4:...") become which server is unreachable;
    a server's refusal is its own message, with the command that helps where there is one."""
    from dmq.client import errors

    text = one_line(str(e)) or type(e).__name__
    if is_connect_failure(text):
        return _unreachable(text, bootstrap_address)
    if not isinstance(e, errors.DMQError) or e.code is None:
        return text  # raised by the library itself: its message already says what to do
    details = one_line(e.details or "")
    where = _WHERE.search(text)
    role, address = (where.group(1), where.group(2)) if where else ("coordinator", bootstrap_address)
    if e.code == "DEADLINE_EXCEEDED":
        within = f" within {timeout:g}s" if timeout is not None else ""
        return (f"no answer from the {role} at {address}{within} — is it running and reachable? "
                "(raise --timeout for slow clusters)")
    if not details:
        return text
    if isinstance(e, errors.UnsupportedError):
        return f"the {role} at {address} does not serve this request ({details}); is it a DMQ server of this version?"
    if e.code == "INTERNAL":
        return f"the {role} at {address} failed: {details} (see its log)"
    if isinstance(e, errors.TopicNotFoundError):
        return f"{details} (see `dmq topics list`)"
    if isinstance(e, errors.GroupNotFoundError):
        return f"{details} (see `dmq groups list`)"
    if isinstance(e, errors.AlreadyExistsError):
        return f"{details} (add --if-not-exists to accept an existing one)"
    if e.code == "UNAVAILABLE" and not isinstance(e, errors.StorageUnavailableError):
        return f"the {role} at {address} is unavailable: {details}"
    # An admin call's refusal is the server's own sentence; other errors (a producer's, say)
    # keep the library's message, which says what was being done.
    return details if where else text


def _unreachable(text: str, bootstrap_address: str) -> str:
    where = _WHERE.search(text)
    mismatch = _tls_mismatch(text, where.group(1) if where else "coordinator",
                             where.group(2) if where else bootstrap_address)
    if mismatch is not None:
        return mismatch
    if where is not None and where.group(1) == "coordinator":
        return coordinator_unreachable(where.group(2)).message
    addresses = re.findall(r"\bat (\S+:\d+)", text)
    address = where.group(2) if where is not None else addresses[-1] if addresses else None
    if where is None and (address is None or address == bootstrap_address and "broker" not in text.lower()):
        return coordinator_unreachable(bootstrap_address).message
    what = re.match(r"^(?:[^:]*: )?(\w+ to \S+|\w+ \S+\[\d+\])", text)
    doing = f" ({what.group(1)})" if what else ""
    return f"cannot reach the broker at {address}{doing} — is it running? (see `dmq brokers list`)"


def _tls_mismatch(text: str, role: str, address: str) -> str | None:
    """The sentence for a connection that failed in the TLS handshake, else None. Two cases:
    1. this client speaks TLS (--ca-file) and the server does not, or its certificate is not
       trusted: gRPC says "Tls handshake failed" / "Ssl handshake failed";
    2. this client speaks plaintext to a TLS port: the server closes the connection and gRPC says
       only "Socket closed", as it would for a server dying mid-connect, so the address is asked
       for a TLS handshake to tell which."""
    low = text.lower()
    if "handshake failed" in low:
        return (f"the TLS handshake with the {role} at {address} failed: it serves plaintext, or its certificate is "
                "not signed by the CA of --ca-file / DMQ_SSL_CAFILE (drop them for a plaintext server)")
    if "socket closed" in low and not os.environ.get("DMQ_SSL_CAFILE") and _serves_tls(address):
        return (f"the {role} at {address} serves TLS and this client connected in plaintext, so the TLS handshake "
                "failed: give the cluster's CA with --ca-file or DMQ_SSL_CAFILE")
    return None


def _serves_tls(address: str, timeout_s: float = 2.0) -> bool:
    """Whether a TLS handshake (certificate unchecked: only the protocol is in question) gets a
    server's answer at `address`."""
    import socket
    import ssl

    host, _, port = address.rpartition(":")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as raw, \
                context.wrap_socket(raw, server_hostname=host.strip("[]") or None):
            return True
    except ssl.SSLError as e:
        # An alert from the server (a client certificate required, say) is TLS too; a reply that
        # is no TLS record is not.
        return "alert" in str(e).lower()
    except (OSError, ValueError):
        return False


def client_error(e: BaseException, address: str, timeout: float | None = None) -> CLIError:
    """A dmq.client error (or anything else from the client library) as a CLIError."""
    return CLIError(explain(e, address, timeout), code=getattr(e, "code", None))


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
            raise client_error(e, bootstrap(ctx), timeout_s(ctx)) from None
        import grpc

        if isinstance(e, grpc.RpcError):
            from dmq.client.errors import from_rpc_error

            raise client_error(from_rpc_error(e), bootstrap(ctx), timeout_s(ctx)) from None
        raise


def _is_client_error(e: BaseException) -> bool:
    try:
        from dmq.client.errors import DMQError
    except ImportError:
        return False
    return isinstance(e, DMQError)
