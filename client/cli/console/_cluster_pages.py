"""Overview, topics, one topic with its message browser, and the trace view."""

from __future__ import annotations

from dmq.client.admin import TopicDescription
from dmq.client.cli.console._app import BadRequest, Console, Request
from dmq.client.cli.console._browse import LIMIT_MAX, parse_browse, read_records, records_table
from dmq.client.cli.console._html import Html, definition, join, link, page, table, tag, url, when_ms
from dmq.client.errors import AuthorizationError, NotFoundError

__all__ = ["overview", "topics", "topic", "messages", "trace", "visible_topics", "LISTED_MAX"]

# A listing shows at most this many entries (and says so): every page stays bounded.
LISTED_MAX = 500
TRACE_RECORDS_SHOWN = 500


def _yes(ok: bool, yes: str = "yes", no: str = "no") -> Html:
    return tag("span", yes if ok else no, class_="ok" if ok else "bad")


def overview(c: Console, req: Request) -> Html:
    health = c.admin.check_health(timeout_s=min(5.0, c.timeout_s))
    coordinator = [h for h in health if h.component == "coordinator"]
    down = [h for h in health if not h.up]
    summary = tag("p", _yes(not down, "healthy", f"{len(down)} server(s) down"), class_="health")
    rows = []
    try:
        brokers = c.admin.list_brokers()
    except AuthorizationError as e:
        c.raise_if_signed_out(e)
        brokers = []
        summary = join([summary, tag("p", "This principal may not list brokers (needs DESCRIBE on the cluster).",
                                     class_="notice")])
    up = {h.broker_id: h for h in health if h.broker_id is not None}
    for b in brokers:
        h = up.get(b.broker_id)
        rows.append([b.broker_id, b.address, _yes(b.alive), b.rack or "-", b.partitions_led, b.partitions_followed,
                     b.partitions_under_replicated, h.detail if h is not None else "-"])
    coord = [[h.address, _yes(h.up, "up", "down"), h.detail] for h in coordinator]
    body = join([
        summary,
        tag("h2", "Coordinator"),
        table(["ACTIVE COORDINATOR", "STATUS", "HEALTH"], coord, id="coordinator"),
        tag("h2", f"Brokers ({len(brokers)})"),
        table(["ID", "ADDRESS", "ALIVE", "RACK", "PARTITIONS LED", "FOLLOWED", "UNDER-REPLICATED", "HEALTH"], rows,
              id="brokers"),
    ])
    return page("Overview", body, writes=c.settings.allow_writes)


def visible_topics(c: Console) -> tuple[list[TopicDescription], bool]:
    """The topics the console's principal may describe (list_topics, then each one's own
    DescribeTopic: listing needs DESCRIBE on the cluster, which does not grant it on every
    topic), at most LISTED_MAX; and whether the list was cut."""
    listed = sorted(c.admin.list_topics(), key=lambda t: t.name)
    out = []
    for t in listed[:LISTED_MAX]:
        try:
            out.append(c.admin.describe_topic(t.name))
        except (AuthorizationError, NotFoundError) as e:
            c.raise_if_signed_out(e)
            continue  # not this principal's to see, or deleted meanwhile
    return out, len(listed) > LISTED_MAX


def _listing_refused(c: Console, what: str) -> Html:
    return page(what.capitalize(), tag("p", f"This principal may not list {what} (needs DESCRIBE on the cluster).",
                                       class_="notice"), writes=c.settings.allow_writes)


def topics(c: Console, req: Request) -> Html:
    try:
        shown, cut = visible_topics(c)
    except AuthorizationError as e:
        c.raise_if_signed_out(e)
        return _listing_refused(c, "topics")
    sizes: dict[str, int] = {}
    for log in c.admin.describe_logs(shown) if shown else []:
        if log.size_bytes >= 0:
            sizes[log.topic] = sizes.get(log.topic, 0) + log.size_bytes
    rows = []
    for t in shown:
        rf = max((len(p.replicas) for p in t.partitions), default=0)
        under = sum(1 for p in t.partitions if p.under_replicated)
        offline = sum(1 for p in t.partitions if p.leader_id < 0 or not p.leader_alive)
        rows.append([link(url("/topics", t.name), t.name), t.kind, t.partition_count, rf, under, offline,
                     sizes.get(t.name, "-"), when_ms(t.created_ms)])
    body = join([
        table(["TOPIC", "KIND", "PARTITIONS", "REPLICATION", "UNDER-REPLICATED", "OFFLINE", "SIZE BYTES", "CREATED"],
              rows, id="topics"),
        tag("p", f"Only the first {LISTED_MAX} topics are shown.", class_="notice") if cut else "",
        tag("p", "No topics yet." if not rows else "", class_="muted"),
    ])
    return page("Topics", body, writes=c.settings.allow_writes)


def _browser_form(topic: str, partition_count: int, query: dict[str, str] | None = None) -> Html:
    q = query or {}
    how = q.get("from", "latest")
    options = [tag("option", "all", value="all", selected=q.get("partition", "all") in ("", "all"))]
    options += [tag("option", str(p), value=str(p), selected=q.get("partition") == str(p)) for p in range(partition_count)]
    return tag(
        "form",
        tag("label", "From", tag("select", *(tag("option", label, value=v, selected=how == v)
                                            for v, label in (("latest", "latest N"), ("offset", "an offset"),
                                                             ("time", "a time"))), name="from")),
        tag("label", "Partition", tag("select", *options, name="partition")),
        tag("label", "Offset", tag("input", type="number", name="offset", min="0", value=q.get("offset", ""))),
        tag("label", "Time (ISO 8601 or epoch ms)", tag("input", type="text", name="time", value=q.get("time", ""))),
        tag("label", f"N (1..{LIMIT_MAX})", tag("input", type="number", name="limit", min="1", max=str(LIMIT_MAX),
                                               value=q.get("limit", "50"))),
        tag("button", "Show messages", type="submit"),
        action=url("/topics", topic, "messages"), method="get", class_="inline", id="browser",
    )


def topic(c: Console, req: Request) -> Html:
    name = req.path["topic"]
    t = c.admin.describe_topic(name)
    logs = {log.partition: log for log in c.admin.describe_logs(name)}
    rows = []
    for p in t.partitions:
        log = logs.get(p.partition)
        known = log is not None and log.error is None
        rows.append([p.partition, p.leader_id if p.leader_id >= 0 else "none", ",".join(map(str, p.replicas)) or "-",
                     ",".join(map(str, p.isr)) or "-", p.leader_epoch,
                     log.log_start_offset if known and log else "-", log.log_end_offset if known and log else "-",
                     log.size_bytes if known and log else "-", log.segment_count if known and log else "-"])
    settings = t.config or {}
    body = join([
        definition({"kind": t.kind, "partitions": t.partition_count, "created": when_ms(t.created_ms)}, class_="card"),
        tag("h2", "Partitions"),
        table(["PARTITION", "LEADER", "REPLICAS", "ISR", "LEADER EPOCH", "LOG START", "LOG END", "SIZE BYTES",
               "SEGMENTS"], rows, id="partitions"),
        tag("h2", "Settings"),
        table(["SETTING", "VALUE"], sorted(settings.items()), id="settings") if settings
        else tag("p", "All settings at the cluster's defaults.", class_="muted"),
        tag("h2", "Messages"),
        _browser_form(name, t.partition_count),
    ])
    return page(f"Topic {name}", body, writes=c.settings.allow_writes)


def messages(c: Console, req: Request) -> Html:
    name = req.path["topic"]
    t = c.admin.describe_topic(name)
    b = parse_browse(req.query, t.partition_count)
    found = read_records(c.admin, name, t.partition_count, b)
    where = {"latest": f"the latest {b.limit}", "offset": f"{b.limit} from offset {b.offset}",
             "time": f"{b.limit} from {when_ms(b.time_ms)}"}[b.how]
    part = "every partition" if b.partition is None else f"partition {b.partition}"
    body = join([
        tag("p", link(url("/topics", name), f"← topic {name}")),
        _browser_form(name, t.partition_count, dict(req.query)),
        tag("p", f"{len(found)} record(s): {where}, {part}.", id="summary"),
        records_table(found),
    ])
    return page(f"Messages of {name}", body, writes=c.settings.allow_writes)


def trace(c: Console, req: Request) -> Html:
    trace_id = req.query.get("id", "").strip()
    form = tag("form", tag("label", "Trace id (32 hex digits, a traceparent, or a dmq.trace id)",
                           tag("input", type="text", name="id", value=trace_id, size="40")),
               tag("button", "Find", type="submit"), action="/trace", method="get", class_="inline")
    if not trace_id:
        return page("Trace", form, writes=c.settings.allow_writes)
    if len(trace_id) > 255:
        raise BadRequest(f"id must be at most 255 characters, got {len(trace_id)}")
    found = c.admin.find_trace(trace_id, max_records=TRACE_RECORDS_SHOWN)
    rows = [[link(url("/topics", r.topic), r.topic), r.partition, r.offset, when_ms(r.timestamp)] for r in found]
    body = join([
        form,
        tag("p", f"{len(found)} record(s) of trace {trace_id}, in time order."
            + (" More exist: the list is cut." if found.truncated else ""), id="summary"),
        table(["TOPIC", "PARTITION", "OFFSET", "TIMESTAMP"], rows, id="trace"),
        records_table(list(found)),
    ])
    return page("Trace", body, writes=c.settings.allow_writes)
