"""Event-store mode (DESIGN.md "Event-store mode"): typed, tagged events in a one-partition topic,
an index of types and tags beside the log, conditional appends, and consumer groups over
attribute partitions. Modules: query (pure matching), index (SQLite), store (one store's threads
and append path), groups + progress (consumer groups), registry (a broker's stores), service (RPCs).
"""
