"""Consumer groups: the list with subscription badges and lag, one group, and offset resets.

Lag is what `dmq groups describe` shows: AdminClient.describe_group()'s total_lag and
per-partition lag, computed by the coordinator from committed offsets and log ends. Nothing
here recomputes it. A group the console's principal may not describe is left out of the list.
"""

from __future__ import annotations

import time

from dmq.client.admin import RESET_TARGETS, GroupDescription
from dmq.client.cli.console._app import BadRequest, Console, Request
from dmq.client.cli.console._browse import OFFSET_MAX, time_ms_field
from dmq.client.cli.console._cluster_pages import LISTED_MAX
from dmq.client.cli.console._html import Html, ago_ms, badge, definition, join, link, page, table, tag, url, when_ms
from dmq.client.errors import AuthorizationError, DMQError, GroupNotFoundError

__all__ = ["groups", "group", "reset"]


def _lag(value: int | None) -> Html:
    if value is None:
        return tag("span", "-", class_="muted")
    return tag("span", value, class_="ok" if value == 0 else "bad", data_lag=value)


def groups(c: Console, req: Request) -> Html:
    try:
        summaries = sorted(c.admin.list_groups(), key=lambda g: g.group_id)
    except AuthorizationError as e:
        c.raise_if_signed_out(e)
        return page("Consumer groups", tag("p", "This principal may not list groups (needs DESCRIBE on the cluster).",
                                          class_="notice"), writes=c.settings.allow_writes)
    rows = []
    for g in summaries[:LISTED_MAX]:
        try:
            d = c.admin.describe_group(g.group_id)
        except (AuthorizationError, GroupNotFoundError) as e:
            c.raise_if_signed_out(e)
            continue  # not this principal's to see, or deleted since it was listed
        except DMQError:
            d = None  # its brokers are down: listed without lag, as `dmq groups list` does
        mode = d.subscription.mode if d is not None else "default"
        rows.append(tag(
            "tr",
            tag("td", link(url("/groups", g.group_id), g.group_id)),
            tag("td", link(url("/topics", g.topic), g.topic)),
            tag("td", badge(mode)),
            tag("td", g.state),
            tag("td", g.generation, class_="num"),
            tag("td", g.member_count, class_="num"),
            tag("td", _lag(d.total_lag if d is not None else None), class_="num lag"),
            data_group=g.group_id,
        ))
    head = tag("thead", tag("tr", *(tag("th", h) for h in
                                    ("GROUP", "TOPIC", "SUBSCRIPTION", "STATE", "GENERATION", "MEMBERS", "TOTAL LAG"))))
    body = join([
        tag("table", head, tag("tbody", *rows), id="groups"),
        tag("p", f"Only the first {LISTED_MAX} groups are shown.", class_="notice") if len(summaries) > LISTED_MAX else "",
        tag("p", "No consumer groups yet. They appear when a consumer subscribes." if not rows else "", class_="muted"),
    ])
    return page("Consumer groups", body, writes=c.settings.allow_writes)


def _subscription_card(d: GroupDescription, now_ms: int) -> Html:
    s = d.subscription
    items: dict[str, object] = {"Mode": badge(s.mode)}
    if s.mode == "timestamp":
        items["From"] = when_ms(s.from_ms)
    items["Subscribed at"] = when_ms(s.created_ms)
    items["Since subscription"] = ago_ms(s.created_ms, now_ms)
    return tag("div", tag("h2", "Subscription"), definition(items), class_="card", id="subscription")


def _reset_form(c: Console, group_id: str) -> Html:
    if not c.settings.allow_writes:
        return tag("p", "Offset resets are off: the console is read-only (start it with --allow-writes).",
                   class_="muted")
    return tag(
        "form",
        tag("input", type="hidden", name="form_token", value=c.form_token),
        tag("label", "Reset to", tag("select", *(tag("option", t, value=t) for t in RESET_TARGETS), name="to")),
        tag("label", "Value (offset, time, or shift)", tag("input", type="text", name="value")),
        tag("label", "Partitions (e.g. 0,2; empty = all)", tag("input", type="text", name="partitions")),
        tag("label", tag("span", "Execute (unticked: a dry-run preview)"), tag("input", type="checkbox", name="execute",
                                                                             value="yes")),
        tag("button", "Preview / reset", type="submit"),
        action=url("/groups", group_id, "reset"), method="post", class_="inline", id="reset",
    )


def group(c: Console, req: Request) -> Html:
    group_id = req.path["group"]
    d = c.admin.describe_group(group_id)
    owners = {m.member_id: m.client_id or m.member_id for m in d.members}
    members = [[m.member_id, m.client_id or "-", m.host or "-", ",".join(map(str, m.partitions)) or "-",
                ",".join(map(str, m.target_partitions)) or "-"] for m in d.members]
    parts = [[p.partition, "-" if p.committed_offset is None else p.committed_offset,
              "-" if p.log_end_offset is None else p.log_end_offset, _lag(p.lag),
              owners.get(p.owner_member_id or "", p.owner_member_id or "-")] for p in d.partitions]
    body = join([
        definition({"Topic": link(url("/topics", d.topic), d.topic), "State": d.state, "Generation": d.generation,
                    "Total lag": _lag(d.total_lag)}, class_="card", id="group"),
        _subscription_card(d, int(time.time() * 1000)),
        tag("h2", f"Members ({len(d.members)})"),
        table(["MEMBER", "CLIENT ID", "HOST", "PARTITIONS", "ASSIGNED"], members, id="members") if members
        else tag("p", "None: the group is empty (its committed offsets are kept).", class_="muted"),
        tag("h2", "Partitions"),
        table(["PARTITION", "COMMITTED", "LOG END", "LAG", "OWNER"], parts, id="partitions"),
        tag("h2", "Reset offsets"),
        _reset_form(c, group_id),
    ])
    return page(f"Group {group_id}", body, writes=c.settings.allow_writes)


def _reset_value(to: str, raw: str) -> int | None:
    raw = raw.strip()
    if to in ("earliest", "latest"):
        return None
    if not raw:
        raise BadRequest(f"value is needed with to={to}")
    if to == "timestamp":
        return time_ms_field(raw, "value")
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(f"value must be a whole number for to={to}, got {raw!r}") from None
    low = 0 if to == "offset" else -OFFSET_MAX
    if not low <= value <= OFFSET_MAX:
        raise BadRequest(f"value for to={to} must be within {low}..{OFFSET_MAX}, got {value}")
    return value


def _partitions(raw: str) -> list[int] | None:
    raw = raw.strip()
    if not raw:
        return None
    out = []
    for item in raw.split(","):
        try:
            p = int(item)
        except ValueError:
            raise BadRequest(f"partitions must be numbers separated by commas, got {raw!r}") from None
        if p < 0:
            raise BadRequest(f"partitions must be >= 0, got {p}")
        out.append(p)
    if len(out) > 10_000:
        raise BadRequest(f"partitions: at most 10000, got {len(out)}")
    return out


def reset(c: Console, req: Request) -> Html:
    c.check_write(req.form)
    group_id = req.path["group"]
    to = req.form.get("to", "")
    if to not in RESET_TARGETS:
        raise BadRequest(f"to must be one of {', '.join(RESET_TARGETS)}, got {to!r}")
    value = _reset_value(to, req.form.get("value", ""))
    execute = req.form.get("execute") == "yes"
    plan = c.admin.reset_offsets(group_id, to=to, value=value, partitions=_partitions(req.form.get("partitions", "")),
                                 dry_run=not execute)
    rows = [[r.partition, "-" if r.current_offset is None else r.current_offset,
             f"{r.new_offset}{' (clamped)' if r.clamped else ''}", r.log_start_offset, r.log_end_offset, r.lag_after]
            for r in plan]
    outcome = (tag("p", f"Done: committed new offsets for {len(plan)} partition(s).", class_="ok") if execute
               else tag("p", "Dry run: nothing changed. Tick Execute to apply.", class_="notice"))
    body = join([
        tag("p", link(url("/groups", group_id), f"← group {group_id}")),
        outcome,
        table(["PARTITION", "CURRENT", "NEW", "LOG START", "LOG END", "LAG AFTER"], rows, id="plan"),
    ])
    return page(f"Reset offsets of {group_id}", body, writes=c.settings.allow_writes)
