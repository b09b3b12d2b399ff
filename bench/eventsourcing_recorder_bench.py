"""What the eventsourcing recorder (dmq.client.events.eventsourcing) costs over DMQ's own client.

    .venv/bin/python bench/eventsourcing_recorder_bench.py [--n 100000] [--cond-n 2000] [--reads 5]

The embedded server (coordinator + one broker, fsync per append, group commit) in a subprocess,
data in a temporary directory; one client in this process. The same workloads, on two topics,
through DMQDCBRecorder (DCBEvent / DCBQuery / DCBAppendCondition, IntegrityError) and through
EventStore (Event / Query / AppendCondition), interleaved per workload:

  (b) unconditional appends of 100 events each (100-byte data, tags `course:<id>`, `student:<id>`),
      filling each topic to --n events, 1% tagged `course:hot`;
  (c) the tag query `course:hot` read whole, --reads times, median;
  (a) conditional appends of 1 event each: fail if an event tagged with its course or student
      exists after the position the client last saw; p50 latency.

Figures vary run to run on a shared machine: compare the two columns of one run.
"""

from __future__ import annotations

import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _common import bench_parser  # noqa: E402  (the bench helpers, shared)
from _server import running_embedded_server  # noqa: E402
from eventsourcing.dcb.api import DCBAppendCondition, DCBEvent, DCBQuery, DCBQueryItem  # noqa: E402

from dmq.client import AdminClient, AppendCondition, Event, EventStore, Query, QueryItem  # noqa: E402
from dmq.client.events.eventsourcing import DMQDCBFactory, DMQDCBRecorder  # noqa: E402

DATA = 100
BATCH = 100
HOT_TAG = "course:hot"
HOT_EVERY = 100


def tags_of(i: int) -> list[str]:
    return [HOT_TAG if i % HOT_EVERY == 0 else f"course:{i % 5000}", f"student:{i}"]


class Direct:
    """The workloads through EventStore."""

    def __init__(self, store: EventStore) -> None:
        self.store = store

    def append_batch(self, first: int, data: bytes) -> None:
        self.store.append([Event("StudentJoinedCourse", data, tags_of(i)) for i in range(first, first + BATCH)])

    def read_hot(self) -> int:
        return sum(len(e.data) for e in self.store.read(Query([QueryItem(tags=[HOT_TAG])])))

    def head(self) -> int:
        return self.store.read(Query([QueryItem(tags=["nothing:here"])])).head

    def conditional(self, course: str, student: str, data: bytes, after: int) -> int:
        condition = AppendCondition(Query([QueryItem(tags=[course]), QueryItem(tags=[student])]), after)
        return self.store.append(Event("StudentJoinedCourse", data, [course, student]), condition)


class Recorder:
    """The same through the eventsourcing recorder."""

    def __init__(self, recorder: DMQDCBRecorder) -> None:
        self.recorder = recorder

    def append_batch(self, first: int, data: bytes) -> None:
        self.recorder.append([DCBEvent("StudentJoinedCourse", data, tags_of(i)) for i in range(first, first + BATCH)])

    def read_hot(self) -> int:
        return sum(len(e.event.data) for e in self.recorder.read(DCBQuery([DCBQueryItem(tags=[HOT_TAG])])))

    def head(self) -> int:
        return self.recorder.read(DCBQuery([DCBQueryItem(tags=["nothing:here"])])).head or 0

    def conditional(self, course: str, student: str, data: bytes, after: int) -> int:
        condition = DCBAppendCondition(DCBQuery([DCBQueryItem(tags=[course]), DCBQueryItem(tags=[student])]), after)
        return self.recorder.append([DCBEvent("StudentJoinedCourse", data, [course, student])], condition)


def timed(work: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    work()
    return time.perf_counter() - t0


def run(clients: Sequence[tuple[str, Direct | Recorder]], n: int, cond_n: int, reads: int) -> None:
    data = os.urandom(DATA)
    fill = {name: 0.0 for name, _ in clients}
    for first in range(0, n, BATCH):  # (b), interleaved batch by batch
        for name, c in clients:
            fill[name] += timed(lambda c=c, first=first: c.append_batch(first, data))
    for name, _ in clients:
        print(f"(b) unconditional, {BATCH} per append  {name:9} {n / fill[name]:>10,.0f} events/s")
    for name, c in clients:  # (c)
        expected = n // HOT_EVERY * DATA
        times = []
        for _ in range(reads):
            t0 = time.perf_counter()
            assert c.read_hot() == expected
            times.append(time.perf_counter() - t0)
        print(f"(c) tag read, {n // HOT_EVERY} of {n} events      {name:9} {n // HOT_EVERY / statistics.median(times):>10,.0f} "
              f"events/s (median of {reads})")
    for name, c in clients:  # (a)
        after = c.head()
        lat = []
        for i in range(cond_n):
            t0 = time.perf_counter()
            after = c.conditional(f"course:c{i % 10}", f"student:s{i}", data, after)
            lat.append(time.perf_counter() - t0)
        print(f"(a) conditional, 1 per append       {name:9} {cond_n / sum(lat):>10,.0f} appends/s, "
              f"p50 {statistics.median(lat) * 1e3:.2f} ms")


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--cond-n", type=int, default=2_000)
    parser.add_argument("--reads", type=int, default=5)
    args = parser.parse_args()
    with running_embedded_server("dmq-recorder-bench-") as server:
        with AdminClient(server.bootstrap) as admin:
            admin.create_topic("direct", kind="event-store")
        factory = DMQDCBFactory({"DMQ_BOOTSTRAP_SERVERS": server.bootstrap, "DMQ_EVENT_STORE_TOPIC": "recorder"})
        with EventStore(server.bootstrap, "direct") as store:
            try:
                run([("EventStore", Direct(store)), ("recorder", Recorder(factory.dcb_recorder()))],
                    args.n, args.cond_n, args.reads)
            finally:
                factory.close()
        print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
