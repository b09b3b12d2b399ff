"""Reading every partition of a topic from chosen offsets, without a group (`dmq consume` without
--group, `dmq bench consume --no-group`).

SimpleConsumer reads one partition per Fetch; a console tail wants all partitions at once with one
long-poll per broker. So each broker has one Fetch in flight naming all of its partitions (in
parallel, as futures); a round returns the answers that have arrived, decodes them and advances
those positions, so a dead or stopped broker never holds up the others. Per-partition
errors: NOT_LEADER / UNKNOWN_TOPIC_OR_PARTITION re-read the topic's placement and retry next
round; OFFSET_OUT_OF_RANGE below the log start (retention deleted the data) jumps to the log
start with a warning, like Kafka's auto.offset.reset=earliest.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from dmq.client.cli._cluster_info import describe_topic
from dmq.client.cli._session import CLIError, Session, broker_unreachable, is_connect_failure

DEFAULT_MAX_WAIT_MS = 500
DEFAULT_PARTITION_MAX_BYTES = 1024 * 1024
MAX_METADATA_RETRIES = 20
UNREACHABLE_RETRY_S = 1.0
WAIT_MARGIN_S = 0.1


class TopicReader:
    """Positions per partition of one topic, fetched round by round. Not thread-safe.

    `resets` names partitions whose start is still to be looked up (ListOffsets timestamp: -2
    log start, -1 log end); each is looked up from its broker when that broker answers, so a
    tail started while a broker is down reads the other partitions at once."""

    def __init__(self, sess: Session, topic: str, positions: dict[int, int], *,
                 resets: dict[int, int] | None = None,
                 max_wait_ms: int = DEFAULT_MAX_WAIT_MS, partition_max_bytes: int = DEFAULT_PARTITION_MAX_BYTES,
                 warn: Callable[[str], None] | None = None) -> None:
        self.sess = sess
        self.topic = topic
        self.positions = dict(positions)
        self.resets = dict(resets or {})
        self.max_wait_ms = max_wait_ms
        self.partition_max_bytes = partition_max_bytes
        self.warn = warn or (lambda _msg: None)
        self.info = describe_topic(sess, topic)
        self._stale_rounds = 0
        # per-broker sessions: (kind "fetch" | "list", address) -> (broker id, the call in flight)
        self._inflight: dict[tuple[str, str], tuple[int, Any]] = {}
        self._answered = threading.Event()  # set by any call in flight completing
        self._retry_at: dict[str, float] = {}
        self._down: set[str] = set()  # brokers warned about as unreachable
        self.fetches = 0
        self.fetch_latencies_s: list[float] = []

    def __repr__(self) -> str:
        return f"<TopicReader {self.topic} positions={self.positions} resets={self.resets}>"

    def _leaders(self, parts: Any = None) -> dict[tuple[str, int], list[int]]:
        by_leader: dict[tuple[str, int], list[int]] = defaultdict(list)
        leaders = {p.partition: p for p in self.info.partitions}
        for part in sorted(self.positions if parts is None else parts):
            p = leaders.get(part)
            if p is None or not p.leader_address:
                raise CLIError(f"partition {self.topic}[{part}] has no leader (see `dmq topics describe {self.topic}`)")
            by_leader[(p.leader_address, p.leader_id)].append(part)
        return by_leader

    def poll(self) -> list[Any]:
        """One round: ConsumerRecords in offset order per partition (possibly none after max_wait_ms).

        Per-broker sessions: each broker has at most one Fetch (and one ListOffsets for
        partitions whose start is not known yet) in flight, kept across rounds, and a round
        returns what the brokers that answered gave, so a dead or stopped broker holds up only
        its own partitions. A broker that cannot be reached is warned about once and retried
        every second while others are readable; only when no broker of the topic can be
        reached is it an error."""
        import grpc

        from dmq.proto import dmq_pb2 as pb

        started = time.monotonic()
        now = started
        for (address, broker_id), parts in sorted(self._leaders(self.resets).items()):
            if ("list", address) in self._inflight or self._retry_at.get(address, 0.0) > now:
                continue
            list_request = pb.ListOffsetsRequest(queries=[
                pb.OffsetQuery(topic=self.topic, partition=p, timestamp_ms=self.resets[p]) for p in parts])
            self._send("list", address, broker_id, self.sess.broker_stub(address).ListOffsets.future(
                list_request, timeout=self.sess.timeout_s))
        for (address, broker_id), parts in sorted(self._leaders().items()):
            if ("fetch", address) in self._inflight or self._retry_at.get(address, 0.0) > now:
                continue
            request = pb.FetchRequest(
                partitions=[pb.FetchPartition(topic=self.topic, partition=p, offset=self.positions[p],
                                              max_bytes=self.partition_max_bytes) for p in parts],
                max_wait_ms=self.max_wait_ms, min_bytes=1,
            )
            self._send("fetch", address, broker_id, self.sess.broker_stub(address).Fetch.future(
                request, timeout=self.max_wait_ms / 1000 + self.sess.timeout_s))
        # Wait for the first answer, at most a long-poll's time (plus a margin for the call).
        wait_s = self.max_wait_ms / 1000 + WAIT_MARGIN_S
        if self._inflight and not any(f.done() for _, f in self._inflight.values()):
            self._answered.wait(wait_s)
        elif not self._inflight and self._retry_at:
            # Every broker is backing off: wait for the first to be due, not in a busy loop.
            time.sleep(max(0.0, min(wait_s, min(self._retry_at.values()) - time.monotonic())))
        self._answered.clear()
        out: list[Any] = []
        stale = False
        for key, (broker_id, future) in list(self._inflight.items()):
            if not future.done():
                continue
            del self._inflight[key]
            kind, address = key
            try:
                response = future.result()
            except grpc.RpcError as e:
                details = e.details() or ""
                if e.code() == grpc.StatusCode.UNAVAILABLE and is_connect_failure(details):
                    self._unreachable(address, broker_id)
                    continue
                if e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    stale = stale or e.code() == grpc.StatusCode.UNAVAILABLE
                    self._retry_at[address] = time.monotonic() + UNREACHABLE_RETRY_S
                    continue
                what = "fetch from" if kind == "fetch" else "list offsets of"
                raise CLIError(f"{what} broker {broker_id} at {address}: {details or e.code().name}") from None
            if address in self._down:
                self._down.discard(address)
                self.warn(f"broker {broker_id} at {address} answers again")
            if kind == "list":
                self._take_offsets(response, broker_id, address)
            else:
                stale = self._take(response, out) or stale
        self.fetches += 1
        self.fetch_latencies_s.append(time.monotonic() - started)
        if stale:
            self._stale_rounds += 1
            if self._stale_rounds > MAX_METADATA_RETRIES:
                raise CLIError(f"the leaders of {self.topic} stay unavailable; check `dmq brokers list`")
            time.sleep(min(1.0, 0.05 * self._stale_rounds))
            self.info = describe_topic(self.sess, self.topic)
        else:
            self._stale_rounds = 0
        return out

    def _send(self, kind: str, address: str, broker_id: int, future: Any) -> None:
        future.add_done_callback(lambda _f: self._answered.set())
        self._inflight[(kind, address)] = (broker_id, future)

    def _unreachable(self, address: str, broker_id: int) -> None:
        leaders = self._leaders([*self.positions, *self.resets])
        if all(a in self._down or a == address for a, _ in leaders):
            raise broker_unreachable(address, broker_id)
        self._retry_at[address] = time.monotonic() + UNREACHABLE_RETRY_S
        if address not in self._down:
            self._down.add(address)
            parts = leaders.get((address, broker_id), [])
            self.warn(f"cannot reach broker {broker_id} at {address}; reading the other partitions, "
                      f"{self.topic}{parts} resume when it is back")

    def _take_offsets(self, response: Any, broker_id: int, address: str) -> None:
        from dmq.proto import dmq_pb2 as pb

        for a in response.answers:
            if a.error != pb.NONE:
                raise CLIError(f"{a.topic}[{a.partition}]: {a.error_message or pb.ErrorCode.Name(a.error).lower()} "
                               f"(broker {broker_id} at {address})")
            if self.resets.pop(a.partition, None) is not None:
                self.positions[a.partition] = a.offset

    def _take(self, response: Any, out: list[Any]) -> bool:
        """Decode one Fetch answer into out, advancing the positions; True when the topic's
        placement must be read again."""
        from dmq.client.records import consumer_records
        from dmq.proto import dmq_pb2 as pb
        from dmq.proto import records

        stale = False
        for r in response.partitions:
            if r.error == pb.NONE:
                if not r.records:
                    continue
                position = self.positions[r.partition]
                got: list[Any] = []
                for batch in records.decode_batches(r.records):
                    got.extend(consumer_records(self.topic, r.partition, batch, position))
                if got:
                    out.extend(got)
                    self.positions[r.partition] = got[-1].offset + 1
            elif r.error == pb.OFFSET_OUT_OF_RANGE and self.positions[r.partition] < r.log_start_offset:
                self.warn(f"{self.topic}[{r.partition}]: offset {self.positions[r.partition]} was deleted by "
                          f"retention; continuing from the log start {r.log_start_offset}")
                self.positions[r.partition] = r.log_start_offset
            elif r.error in (pb.NOT_LEADER, pb.UNKNOWN_TOPIC_OR_PARTITION):
                stale = True
            else:
                raise CLIError(f"{self.topic}[{r.partition}]: {r.error_message or pb.ErrorCode.Name(r.error)}")
        return stale

    def close(self) -> None:
        """Cancel the fetches still in flight."""
        for _, future in self._inflight.values():
            future.cancel()
        self._inflight.clear()
