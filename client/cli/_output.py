"""How the `dmq` command talks to people and scripts: tables, JSON, one-line errors, exit codes.

Exit codes (stable, scripts rely on them):
  0  success
  1  the command ran and failed (server down, unknown topic, refused request, ...)
  2  usage error (bad flag, missing argument, conflicting options); click's own code for it
  130 interrupted with Ctrl-C

Human output goes through one rich Console on stdout; notes, progress and errors go to stderr so
that `dmq ... | jq` and `dmq consume ... > file` stay clean. `-o json` prints one JSON document per
listing with a stable schema: keys are only ever added, never renamed or removed, and numbers stay
numbers (sizes in bytes, times in epoch milliseconds).
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

# When stdout is not a terminal, rich would wrap tables at 80 columns; a wide fixed width keeps
# every row on one line so that grep and awk see whole rows.
PIPE_WIDTH = 250

_console: Any = None
_err_console: Any = None


def _new_console(stream: Any, **options: Any) -> Any:
    """A rich Console for stream: its terminal's width, or PIPE_WIDTH when it is not a terminal."""
    from rich.console import Console

    return Console(highlight=False, width=None if stream.isatty() else PIPE_WIDTH, **options)


def console() -> Any:
    global _console
    if _console is None:
        _console = _new_console(sys.stdout, soft_wrap=False)
    return _console


def err_console() -> Any:
    global _err_console
    if _err_console is None:
        _err_console = _new_console(sys.stderr, stderr=True)
    return _err_console


def output_option(f: F) -> F:
    """`-o table|json` for every listing."""
    return click.option(
        "-o",
        "--output",
        "output",
        type=click.Choice(["table", "json"]),
        default="table",
        show_default=True,
        help="table for people; json for scripts (a stable schema: fields are added, never renamed).",
    )(f)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def note(message: str) -> None:
    """A remark for the person at the terminal (stderr, so pipes only carry data)."""
    err_console().print(message, markup=True)


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], *, title: str | None = None,
          right: Iterable[str] = (), show_header: bool = True) -> Any:
    """A borderless, kubectl-like table: easy to read, easy to grep."""
    from rich import box
    from rich.table import Table

    right_set = set(right)
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title=title, title_justify="left",
              title_style="bold", header_style="bold", show_header=show_header)
    for c in columns:
        t.add_column(c, justify="right" if c in right_set else "left", no_wrap=True)
    for row in rows:
        t.add_row(*(cell if not isinstance(cell, (int, float)) else str(cell) for cell in row))
    return t


def show(*renderables: Any) -> None:
    for r in renderables:
        console().print(r)


# -- formatting -----------------------------------------------------------------------------------


def if_exists_option(what: str) -> Callable[[F], F]:
    """`--if-exists` for a `delete` command: a `what` that is not there is no error then."""
    return click.option("--if-exists", is_flag=True, help=f"Succeed quietly when the {what} does not exist.")


def show_deletion(
    delete: Callable[[], object], missing: type[Exception], if_exists: bool, name: str, output: str, done: str,
    absent: str,
) -> None:
    """`dmq ... delete [--if-exists]`: delete(), where `missing` (the thing is not there) is an
    error unless if_exists; then {"deleted": name, or null} with -o json, else `done` or `absent`."""
    try:
        delete()
        deleted = True
    except missing:
        if not if_exists:
            raise
        deleted = False
    if output == "json":
        print_json({"deleted": name if deleted else None})
        return
    show(done if deleted else absent)


def human_bytes(n: int | None) -> str:
    if n is None or n < 0:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # unreachable


def human_time_ms(ms: int | None) -> str:
    """An epoch-ms instant as local time to the second ('2024-05-01 12:00:00'); '-' for unset.
    JSON output carries the exact epoch milliseconds instead."""
    if not ms or ms <= 0:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


def human_ago_ms(ms: int | None, now_ms: int) -> str:
    if ms is None or ms <= 0:
        return "never"
    delta_s = max(0.0, (now_ms - ms) / 1000)
    if delta_s < 1:
        return "just now"
    if delta_s < 120:
        return f"{delta_s:.0f}s ago"
    if delta_s < 7200:
        return f"{delta_s / 60:.0f}m ago"
    if delta_s < 172800:
        return f"{delta_s / 3600:.0f}h ago"
    return f"{delta_s / 86400:.0f}d ago"


def human_duration_ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    if ms < 0:
        return "forever"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def one_line(text: str) -> str:
    return " ".join(str(text).split())
