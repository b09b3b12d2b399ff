"""Queues (depth, limit, leases, dead letters) and event stores (types, tags, groups' claims)."""

from __future__ import annotations

import time

from dmq.client.cli.console._app import BadRequest, Console, Request
from dmq.client.cli.console._browse import Browse, read_records, records_table
from dmq.client.cli.console._cluster_pages import visible_topics
from dmq.client.cli.console._html import Html, definition, join, link, page, show_bytes, table, tag, url, when_ms
from dmq.client.errors import AuthorizationError, TopicNotFoundError
from dmq.client.events import EventStore
from dmq.client.queue_admin import DLQ_SUFFIX

__all__ = ["queues", "queue", "event_stores", "event_store"]

DEAD_LETTERS_SHOWN = 50
# Dead-letter headers (dmq.broker.queue.dead_letters) start so: reason, error, attempts, ...
DLQ_HEADER_PREFIX = "dmq.dlq."
EVENTS_SHOWN = 100
# Types, tags and groups listed on an event store's page (EventStore.describe's limit), and each
# group's partitions there.
EVENT_STORE_LIST_MAX = 200
EVENT_GROUP_NAME_MAX = 255


def queues(c: Console, req: Request) -> Html:
    try:
        found = c.admin.list_queues()
    except AuthorizationError as e:
        c.raise_if_signed_out(e)
        return page("Queues", tag("p", "This principal may not list queues.", class_="notice"),
                    writes=c.settings.allow_writes)
    rows = [[link(url("/queues", q.topic), q.topic), q.depth, q.max_queue_size or "unlimited",
             "-" if q.remaining is None else q.remaining, f"{q.utilisation:.1f}%", len(q.leases), q.dead_letters]
            for q in found]
    body = join([
        table(["QUEUE", "DEPTH", "LIMIT", "CAPACITY LEFT", "UTILISATION (PARTITIONS LEASED)", "LIVE LEASES",
               "DEAD LETTERS"], rows, id="queues"),
        tag("p", "No queues yet: a topic becomes one when a queue group pops from it." if not rows else "",
            class_="muted"),
    ])
    return page("Queues", body, writes=c.settings.allow_writes)


def queue(c: Console, req: Request) -> Html:
    topic = req.path["topic"]
    q = c.admin.describe_queue(topic)
    groups = [[g.group, g.partition, g.acked_offset, g.pending, g.delivery_count, g.last_error or "-",
               f"{g.lease.seconds_left:.1f}" if g.lease is not None else "-",
               g.lease.records if g.lease is not None else "-"] for g in q.groups]
    letters: Html = tag("p", "No dead letters.", class_="muted")
    dlq = topic + DLQ_SUFFIX
    if q.dead_letters:
        try:
            count = c.admin.describe_topic(dlq).partition_count
            found = read_records(c.admin, dlq, count, Browse("latest", None, limit=DEAD_LETTERS_SHOWN))
            letters = records_table(found, why_prefix=DLQ_HEADER_PREFIX)
        except TopicNotFoundError:
            pass  # deleted since it was counted
    body = join([
        definition({"Depth": q.depth, "Limit": q.max_queue_size or "unlimited",
                    "Capacity left": "-" if q.remaining is None else q.remaining,
                    "Utilisation": f"{q.utilisation:.1f}% of {q.partition_count} partition(s) leased",
                    "Dead letters": q.dead_letters}, class_="card", id="queue"),
        tag("h2", "Queue groups and live leases"),
        table(["GROUP", "PARTITION", "ACKED", "PENDING", "FAILED DELIVERIES", "LAST ERROR", "LEASE SECONDS LEFT",
               "LEASED RECORDS"], groups, id="leases"),
        tag("h2", f"Dead letters ({dlq}, latest {DEAD_LETTERS_SHOWN})"),
        letters,
    ])
    return page(f"Queue {topic}", body, writes=c.settings.allow_writes)


def event_stores(c: Console, req: Request) -> Html:
    try:
        shown, _cut = visible_topics(c)
    except AuthorizationError as e:
        c.raise_if_signed_out(e)
        return page("Event stores", tag("p", "This principal may not list topics (needs DESCRIBE on the cluster).",
                                       class_="notice"), writes=c.settings.allow_writes)
    rows = [[link(url("/events", t.name), t.name), when_ms(t.created_ms)] for t in shown if t.kind == "event-store"]
    body = join([
        table(["EVENT STORE", "CREATED"], rows, id="stores"),
        tag("p", "No event-store topics yet (dmq topics create NAME --kind event-store)." if not rows else "",
            class_="muted"),
    ])
    return page("Event stores", body, writes=c.settings.allow_writes)


def event_store(c: Console, req: Request) -> Html:
    topic = req.path["topic"]
    group_name = req.query.get("group", "").strip()
    if len(group_name) > EVENT_GROUP_NAME_MAX:
        raise BadRequest(f"group must be at most {EVENT_GROUP_NAME_MAX} characters, got {len(group_name)}")
    if c.admin.describe_topic(topic).kind != "event-store":
        raise BadRequest(f"topic {topic!r} is an ordinary log, not an event store (see its messages under Topics)")
    store = EventStore(topic=topic, cluster=c.admin.cluster)
    try:
        described = store.describe(EVENT_STORE_LIST_MAX)
        head = described.head
        events = list(store.read(after=max(0, head - EVENTS_SHOWN), limit=EVENTS_SHOWN))
        group = store.describe_group(group_name) if group_name else None
    finally:
        store.close()
    rows = [[e.position, when_ms(e.append_time_ms), e.type, ", ".join(e.tags) or "-", show_bytes(e.payload)]
            for e in reversed(events)]
    groups = [[link(url("/events", topic, group=g.group), g.group), "active" if g.active else "stopped",
               ", ".join(g.partition_by) or "-", ", ".join(g.handled_types) or "-", len(g.partitions),
               sum(1 for p in g.partitions if p.claimed_by), sum(p.pending for p in g.partitions)]
              for g in described.groups]
    group_part: Html = Html("")
    if group is not None:
        claims = [[" ".join(f"{k}={v}" for k, v in sorted(p.values.items())) or p.partition_key, p.acked_position,
                   p.pending, p.claimed_by or "-", when_ms(p.claimed_since_ms)] for p in group.partitions]
        group_part = join([
            tag("h2", f"Group {group.group}"),
            definition({"Group": group.group, "State": "active" if group.active else "stopped",
                        "Partitioned by": ", ".join(group.partition_by) or "-",
                        "Handles": ", ".join(group.handled_types) or "-", "Head": group.head},
                       class_="card", id="event-group"),
            table(["PARTITION", "ACKED POSITION", "PENDING", "CLAIMED BY", "CLAIMED SINCE"], claims, id="claims"),
        ])
    body = join([
        definition({"Head position": head, "Now": when_ms(int(time.time() * 1000))}, class_="card"),
        tag("h2", f"Types and tags (all {head} events)"),
        _shown_of("types", len(described.types), described.type_count),
        table(["TYPE", "EVENTS"], described.types.items(), id="types"),
        _shown_of("tags", len(described.tags), described.tag_count),
        table(["TAG", "EVENTS"], described.tags.items(), id="tags"),
        tag("h2", "Consumer groups"),
        _shown_of("groups", len(described.groups), described.group_count),
        table(["GROUP", "STATE", "PARTITIONED BY", "HANDLES", "PARTITIONS", "CLAIMED", "PENDING"], groups,
              id="event-groups"),
        group_part,
        tag("h2", f"Latest events (up to {EVENTS_SHOWN})"),
        table(["POSITION", "APPENDED", "TYPE", "TAGS", "PAYLOAD"], rows, id="events"),
    ])
    return page(f"Event store {topic}", body, writes=c.settings.allow_writes)


def _shown_of(what: str, shown: int, total: int) -> Html:
    """A note when a list was cut at EVENT_STORE_LIST_MAX (the most frequent are shown)."""
    if shown >= total:
        return Html("")
    return tag("p", f"The {shown} most frequent of {total} {what} shown." if what != "groups" else
               f"The first {shown} of {total} groups shown.", class_="muted")
