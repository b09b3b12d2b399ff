"""Settings shared by every client: the address setting and unknown-keyword checks.

The address setting is called ``bootstrap_servers`` everywhere, as in kafka-python, and takes
"host:port", "host:port,host:port" or a list of them; the names the DMQ clients used before
(``bootstrap`` for Producer, SimpleConsumer and AdminClient, ``metadata_service_url`` for the
consumer) stay accepted. Each address is the coordinator's (``dmq server``): DMQ has one
metadata service, so several addresses are alternatives, tried in order when the client starts
(the first that accepts a connection is used; with one address nothing is tried).
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import grpc

from dmq.client._cluster import parse_address
from dmq.client.errors import InvalidConfigError, UnknownSettingError

__all__ = ["BOOTSTRAP_NAMES", "bootstrap_address", "check_flag", "check_positive", "reject_unknown", "split_addresses"]

BOOTSTRAP_NAMES = ("bootstrap_servers", "bootstrap", "metadata_service_url")
# How long start-up waits for each of several bootstrap addresses to accept a connection.
PROBE_TIMEOUT_S = 2.0


def split_addresses(value: Any, setting: str) -> list[str]:
    """Validated "host:port" strings from a comma-separated string or a list of strings."""
    if isinstance(value, str):
        parts = value.split(",")
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        parts = [p for v in value for p in v.split(",")]
    else:
        raise InvalidConfigError(
            f"{setting} must be 'host:port', 'host:port,host:port' or a list of them, got {type(value).__name__} {value!r}"
        )
    out: list[str] = []
    for part in parts:
        address = part.strip()
        if "://" in address:  # dmq://host:port: a URL-looking value is a common slip
            address = address.split("://", 1)[1].rstrip("/")
        if not address:
            continue
        try:
            out.append(parse_address(address))
        except ValueError as e:
            raise InvalidConfigError(f"{setting}: {e}") from None
    if not out:
        raise InvalidConfigError(f"{setting} must name at least one 'host:port' (the coordinator's), got {value!r}")
    return list(dict.fromkeys(out))


def bootstrap_address(given: Mapping[str, Any], owner: str, *, probe: bool = True) -> str:
    """The coordinator address from whichever of BOOTSTRAP_NAMES was given (exactly one); with
    several, "h:p,h:p", the first reachable first."""
    named = {k: v for k, v in given.items() if k in BOOTSTRAP_NAMES and v is not None}
    if not named:
        raise InvalidConfigError(f"{owner} needs bootstrap_servers: the coordinator's 'host:port' (e.g. '127.0.0.1:9091')")
    resolved = {setting: split_addresses(value, setting) for setting, value in named.items()}
    if len({tuple(a) for a in resolved.values()}) > 1:
        raise InvalidConfigError(
            f"{owner}: give the address once, as bootstrap_servers (got {', '.join(sorted(named))})"
        )
    addresses = next(iter(resolved.values()))
    if len(addresses) == 1:
        return addresses[0]
    # Several: every one, the first reachable first; the Cluster follows the active coordinator
    # among them (dmq.client._coordinators).
    first = _first_reachable(addresses) if probe else addresses[0]
    return ",".join([first, *(a for a in addresses if a != first)])


def _first_reachable(addresses: list[str]) -> str:
    """The first address that accepts a connection, else the first one (whose errors then name
    it). Each is given PROBE_TIMEOUT_S; a refused connection moves on at once."""
    for address in addresses:
        channel = grpc.insecure_channel(address)
        outcome: list[grpc.ChannelConnectivity] = []
        settled = threading.Event()

        def watch(state: grpc.ChannelConnectivity, outcome: list[grpc.ChannelConnectivity] = outcome,
                  settled: threading.Event = settled) -> None:
            if state in (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.TRANSIENT_FAILURE):
                outcome.append(state)
                settled.set()

        try:
            channel.subscribe(watch, try_to_connect=True)
            settled.wait(PROBE_TIMEOUT_S)
            if outcome and outcome[0] is grpc.ChannelConnectivity.READY:
                return address
        finally:
            channel.unsubscribe(watch)
            channel.close()
    return addresses[0]


def reject_unknown(owner: str, unknown: Mapping[str, Any], known: Iterable[str]) -> None:
    """Raise UnknownSettingError naming each unknown keyword and the known names close to it."""
    if not unknown:
        return
    known = sorted(set(known))
    parts = []
    for name in sorted(unknown):
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        parts.append(f"{name!r}" + (f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""))
    raise UnknownSettingError(
        f"{owner} got unknown setting{'s' if len(parts) > 1 else ''} {', '.join(parts)}; "
        f"its settings are: {', '.join(known)}"
    )


def check_positive(name: str, value: Any) -> None:
    """An int setting that must be > 0 (timeouts, sizes)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidConfigError(f"{name} must be a positive integer, got {value!r}")


def check_flag(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise InvalidConfigError(f"{name} must be True or False, got {value!r}")
