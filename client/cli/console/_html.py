"""Safe HTML by construction: every value is escaped unless it is already `Html`.

Pages are built from `tag()` calls, never by formatting strings into markup: a topic name, a
header or a record's bytes reach the page only through `esc()`, so a value such as
``<script>`` shows as text. Record bytes are decoded as UTF-8 when they are valid UTF-8 and
shown as hex otherwise (`show_bytes`), cut to SHOW_BYTES_MAX with the full size noted.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import quote, urlencode

__all__ = ["Html", "esc", "tag", "join", "link", "table", "page", "badge", "show_bytes", "when_ms", "ago_ms",
           "url", "signed_in", "BADGE_COLOURS"]

# A value longer than this is cut on the page (the full size is shown beside it).
SHOW_BYTES_MAX = 2048

# Subscription-mode badges as in Queen's dashboard: NEW green, ALL blue, TIMESTAMP yellow.
BADGE_COLOURS = {"new": "#2da44e", "all": "#0969da", "timestamp": "#d4a72c", "default": "#6e7781"}


class Html(str):
    """Markup that is safe as it is (built by tag() / esc())."""

    __slots__ = ()


def esc(value: object) -> Html:
    if isinstance(value, Html):
        return value
    return Html(html.escape("" if value is None else str(value), quote=True))


def join(parts: Iterable[object], sep: str = "") -> Html:
    return Html(esc(sep).join(esc(p) for p in parts))


def tag(element: str, /, *children: object, **attrs: object) -> Html:
    """<name attrs>children</name>; `class_` for class, `data_x` for data-x; None/False attrs left out."""
    rendered = []
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        attr = key.rstrip("_").replace("_", "-")
        rendered.append(f" {attr}" if value is True else f' {attr}="{esc(value)}"')
    head = f"<{element}{''.join(rendered)}>"
    if element in ("input", "br", "meta", "hr"):
        return Html(head)
    return Html(head + join(children) + f"</{element}>")


def url(path: str, *segments: str, **query: object) -> str:
    """A path with each segment percent-encoded (a topic name may hold '/' or '?'), and a query."""
    out = path.rstrip("/") + "".join("/" + quote(s, safe="") for s in segments)
    pairs = {k: v for k, v in query.items() if v is not None and v != ""}
    return out + ("?" + urlencode(pairs) if pairs else "")


def link(href: str, *children: object, **attrs: object) -> Html:
    return tag("a", *children, href=href, **attrs)


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], **attrs: object) -> Html:
    head = tag("thead", tag("tr", *(tag("th", h) for h in headers)))
    body = tag("tbody", *(tag("tr", *(tag("td", c) for c in row)) for row in rows))
    return tag("table", head, body, **attrs)


def badge(mode: str) -> Html:
    known = mode if mode in BADGE_COLOURS else "default"
    return tag("span", mode.upper(), class_=f"badge badge-{known}", data_mode=mode)


def show_bytes(value: bytes | None) -> Html:
    """UTF-8 text when the bytes are valid UTF-8, else hex; cut to SHOW_BYTES_MAX."""
    if value is None:
        return tag("span", "null", class_="muted")
    cut = value[:SHOW_BYTES_MAX]
    more = tag("span", f" … ({len(value)} bytes)", class_="muted") if len(value) > SHOW_BYTES_MAX else Html("")
    try:
        text = cut.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start >= len(cut) - 3 and len(value) > SHOW_BYTES_MAX:
            text = cut[: e.start].decode("utf-8")  # a character split by the cut
        else:
            return join([tag("code", "hex:" + cut.hex(), class_="hex"), more])
    return join([tag("span", text, class_="value"), more])


def when_ms(ms: int | None) -> str:
    """An epoch-ms instant in UTC to the second; '-' for unset."""
    if not ms or ms <= 0:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago_ms(ms: int | None, now_ms: int) -> str:
    if not ms or ms <= 0:
        return "-"
    s = max(0, (now_ms - ms) // 1000)
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    parts = [f"{days}d"] if days else []
    if days or hours:
        parts.append(f"{hours}h")
    if days or hours or minutes:
        parts.append(f"{minutes}m")
    parts.append(f"{s}s")
    return " ".join(parts) + " ago"


NAV = (("/", "Overview"), ("/topics", "Topics"), ("/groups", "Consumer groups"), ("/queues", "Queues"),
       ("/events", "Event stores"), ("/trace", "Trace"))

CSS = """
body{font-family:system-ui,sans-serif;margin:0;color:#1f2328;background:#f6f8fa}
header{background:#24292f;color:#fff;padding:.6em 1.2em;display:flex;gap:1.2em;align-items:center}
header a{color:#d0d7de;text-decoration:none}header a:hover{color:#fff}
header .brand{font-weight:700;color:#fff;margin-right:1em}
header .mode{margin-left:auto;font-size:.85em;color:#8c959f}
header .viewer{font-size:.85em;color:#d0d7de;display:flex;gap:.6em;align-items:center}
header .viewer form{margin:0}
main{padding:1em 1.5em}
table{border-collapse:collapse;background:#fff;margin:.5em 0 1.2em;font-size:.92em}
th,td{border:1px solid #d0d7de;padding:.3em .6em;text-align:left;vertical-align:top}
th{background:#eaeef2}
td.num{text-align:right}
.badge{display:inline-block;padding:.1em .55em;border-radius:1em;font-size:.78em;font-weight:700;color:#fff}
""" + "".join(f".badge-{mode}{{background-color:{colour}}}" for mode, colour in BADGE_COLOURS.items()) + """
.badge-timestamp{color:#1f2328}
.card{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:.7em 1em;margin:.5em 0 1em;max-width:40em}
.card dt{font-weight:600;float:left;clear:left;width:10em}.card dd{margin-left:10.5em}
.ok{color:#1a7f37;font-weight:600}.bad{color:#cf222e;font-weight:600}.muted{color:#6e7781}
.notice{background:#fff8c5;border:1px solid #d4a72c;padding:.5em 1em;border-radius:6px;max-width:60em}
.error{background:#ffebe9;border:1px solid #cf222e;padding:.5em 1em;border-radius:6px;max-width:60em}
.value{white-space:pre-wrap;word-break:break-all}
code.hex{word-break:break-all;font-size:.85em}
form.inline{display:flex;gap:.6em;align-items:end;flex-wrap:wrap;margin:.5em 0 1em}
form.inline label{display:flex;flex-direction:column;font-size:.85em}
"""


def page(title: str, body: Html, *, writes: bool = False) -> Html:
    nav = [link(href, name) for href, name in NAV]
    mode = "writes enabled" if writes else "read-only"
    return Html("<!doctype html>" + tag(
        "html",
        tag("head", tag("meta", charset="utf-8"), tag("title", f"{title} - DMQ console"), tag("style", Html(CSS))),
        tag("body",
            tag("header", tag("span", "DMQ console", class_="brand"), *nav, tag("span", mode, class_="mode")),
            tag("main", tag("h1", title), body)),
        lang="en",
    ))


def signed_in(doc: Html, principal: str, form_token: str) -> Html:
    """`doc` (a page()) with who is signed in and a sign-out button at the end of its header.
    The first "</header>" of a page is page()'s own: every value before it is escaped, so none
    can hold a "<"."""
    bar = tag("span", "signed in as ", tag("b", principal, id="principal"),
              tag("form", tag("input", type="hidden", name="form_token", value=form_token),
                  tag("button", "Sign out", type="submit"), action="/signout", method="post"),
              class_="viewer")
    head, sep, rest = doc.partition("</header>")
    return Html(head + bar + sep + rest) if sep else doc


def definition(items: Mapping[str, object], **attrs: object) -> Html:
    return tag("dl", *(join([tag("dt", k), tag("dd", v)]) for k, v in items.items()), **attrs)
