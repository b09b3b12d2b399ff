"""The CLI's connection to a cluster: one-shot admin RPCs with deadlines and operator-grade errors.

Admin commands are single request/answer exchanges, so they use the generated stubs directly over
one channel per address (the coordinator at --bootstrap, brokers at the addresses the coordinator
reports). Every gRPC failure is turned here into a `CLIError` whose one-line message says what to
do; gRPC exceptions never reach the user.

Retry policy: a refused connection fails at once (the server is down: waiting would only delay the
message). A server that answers UNAVAILABLE ("coordinator is starting", "no live brokers") is
retried with backoff until the command's --timeout, because right after `dmq server` starts the
broker may not have registered yet.
"""

from __future__ import annotations

import time
from typing import Any

import click

from dmq.client.cli._output import one_line

# Phrases in gRPC's own details when no connection could be made (as opposed to a server that
# answered UNAVAILABLE itself).
_CONNECT_FAILURES = (
    "failed to connect",
    "connection refused",
    "dns resolution failed",
    "name resolution",
    "connection reset",
    "socket closed",
    "connect failed",
    "unavailable: ipv4",
    "no route to host",
    "network is unreachable",
)
_RETRY_BACKOFF_S = (0.1, 0.2, 0.4, 0.8, 1.0)


class CLIError(click.ClickException):
    """A failure to report as one line on stderr, exit code 1."""

    exit_code = 1

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(one_line(message))
        self.code = code  # the server's status code name, when a server refused (never read the message)


def coordinator_unreachable(address: str) -> CLIError:
    return CLIError(
        f"cannot reach the coordinator at {address} — is `dmq server` running? "
        "(point elsewhere with --bootstrap HOST:PORT or DMQ_BOOTSTRAP)"
    )


def broker_unreachable(address: str, broker_id: int | None = None) -> CLIError:
    who = f"broker {broker_id}" if broker_id is not None and broker_id >= 0 else "the broker"
    return CLIError(f"cannot reach {who} at {address} — is it running? (see `dmq brokers list`)")


def is_connect_failure(details: str) -> bool:
    d = details.lower()
    return any(p in d for p in _CONNECT_FAILURES)


class Session:
    """Channels and stubs for one CLI invocation; closed by the click context on exit."""

    def __init__(self, bootstrap: str, timeout_s: float) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self._channels: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"<Session bootstrap={self.bootstrap!r} channels={sorted(self._channels)}>"

    def _channel(self, address: str) -> Any:
        ch = self._channels.get(address)
        if ch is None:
            from dmq.proto.grpc_options import channel_options
            from dmq.proto.security.settings import ClientSecurity, sync_channel

            # TLS and token from --ca-file/--token/... (exported by the root command) or DMQ_* env.
            ch = sync_channel(address, ClientSecurity.from_settings(None), channel_options())
            self._channels[address] = ch
        return ch

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()

    # -- stubs ------------------------------------------------------------------------------------

    def metadata(self, method: str, request: Any) -> Any:
        from dmq.proto import dmq_pb2_grpc as pb_grpc

        stub = pb_grpc.MetadataStub(self._channel(self.bootstrap))
        return self._call(getattr(stub, method), request, self.bootstrap, role="coordinator")

    def groups(self, method: str, request: Any) -> Any:
        from dmq.proto import dmq_pb2_grpc as pb_grpc

        stub = pb_grpc.GroupCoordinatorStub(self._channel(self.bootstrap))
        return self._call(getattr(stub, method), request, self.bootstrap, role="coordinator")

    def broker_stub(self, address: str) -> Any:
        """A raw stub, for callers that need futures (parallel long-polls); they translate errors."""
        from dmq.proto import dmq_pb2_grpc as pb_grpc

        return pb_grpc.BrokerStub(self._channel(address))

    def broker(self, address: str, method: str, request: Any, *, broker_id: int | None = None) -> Any:
        from dmq.proto import dmq_pb2_grpc as pb_grpc

        stub = pb_grpc.BrokerStub(self._channel(address))
        return self._call(getattr(stub, method), request, address, role="broker", broker_id=broker_id)

    # -- the one place gRPC errors become messages -----------------------------------------------------

    def _call(self, fn: Any, request: Any, address: str, *, role: str, broker_id: int | None = None) -> Any:
        import grpc

        deadline = time.monotonic() + self.timeout_s
        attempt = 0
        while True:
            remaining = deadline - time.monotonic()
            try:
                return fn(request, timeout=max(0.05, remaining))
            except grpc.RpcError as e:
                code = e.code() if hasattr(e, "code") else None
                details = (e.details() if hasattr(e, "details") else "") or ""
                if code == grpc.StatusCode.UNAVAILABLE and is_connect_failure(details):
                    raise (coordinator_unreachable(address) if role == "coordinator"
                           else broker_unreachable(address, broker_id)) from None
                if code == grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline - 0.05:
                    time.sleep(min(_RETRY_BACKOFF_S[min(attempt, len(_RETRY_BACKOFF_S) - 1)],
                                   max(0.0, deadline - time.monotonic())))
                    attempt += 1
                    continue
                error = translate(code, details, address, role=role, timeout_s=self.timeout_s)
                error.code = getattr(code, "name", None)
                raise error from None


def translate(code: Any, details: str, address: str, *, role: str, timeout_s: float) -> CLIError:
    import grpc

    details = one_line(details) or (code.name.lower() if code is not None else "unknown error")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return CLIError(
            f"no answer from the {role} at {address} within {timeout_s:g}s — is it running and reachable? "
            "(raise --timeout for slow clusters)"
        )
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return CLIError(f"the {role} at {address} does not serve this request ({details}); is it a DMQ server of this version?")
    if code == grpc.StatusCode.UNAVAILABLE:
        return CLIError(f"the {role} at {address} is unavailable: {details}")
    if code == grpc.StatusCode.INTERNAL:
        return CLIError(f"the {role} at {address} failed: {details} (see its log)")
    low = details.lower()
    if code == grpc.StatusCode.NOT_FOUND and "topic" in low and "`dmq topics list`" not in low:
        return CLIError(f"{details} (see `dmq topics list`)")
    if code == grpc.StatusCode.NOT_FOUND and "group" in low and "`dmq groups list`" not in low:
        return CLIError(f"{details} (see `dmq groups list`)")
    if code == grpc.StatusCode.ALREADY_EXISTS:
        return CLIError(f"{details} (add --if-not-exists to accept an existing one)")
    return CLIError(details)
