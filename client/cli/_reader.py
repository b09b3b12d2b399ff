"""Reading every partition of a topic from chosen offsets, without a group (`dmq consume` without
--group, `dmq bench consume --no-group`).

SimpleConsumer reads one partition per Fetch; a console tail wants all partitions at once with one
long-poll per broker. So each round sends one Fetch per leader naming all of its partitions (in
parallel, as futures), waits for all of them, decodes and advances the positions. Per-partition
errors: NOT_LEADER / UNKNOWN_TOPIC_OR_PARTITION re-read the topic's placement and retry next
round; OFFSET_OUT_OF_RANGE below the log start (retention deleted the data) jumps to the log
start with a warning, like Kafka's auto.offset.reset=earliest.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from dmq.client.cli._cluster_info import describe_topic
from dmq.client.cli._session import CLIError, Session, broker_unreachable, is_connect_failure

DEFAULT_MAX_WAIT_MS = 500
DEFAULT_PARTITION_MAX_BYTES = 1024 * 1024
MAX_METADATA_RETRIES = 20


class TopicReader:
    """Positions per partition of one topic, fetched round by round. Not thread-safe."""

    def __init__(self, sess: Session, topic: str, positions: dict[int, int], *,
                 max_wait_ms: int = DEFAULT_MAX_WAIT_MS, partition_max_bytes: int = DEFAULT_PARTITION_MAX_BYTES,
                 warn: Callable[[str], None] | None = None) -> None:
        self.sess = sess
        self.topic = topic
        self.positions = dict(positions)
        self.max_wait_ms = max_wait_ms
        self.partition_max_bytes = partition_max_bytes
        self.warn = warn or (lambda _msg: None)
        self.info = describe_topic(sess, topic)
        self._stale_rounds = 0
        self.fetches = 0
        self.fetch_latencies_s: list[float] = []

    def __repr__(self) -> str:
        return f"<TopicReader {self.topic} positions={self.positions}>"

    def _leaders(self) -> dict[tuple[str, int], list[int]]:
        by_leader: dict[tuple[str, int], list[int]] = defaultdict(list)
        leaders = {p.partition: p for p in self.info.partitions}
        for part in sorted(self.positions):
            p = leaders.get(part)
            if p is None or not p.leader_address:
                raise CLIError(f"partition {self.topic}[{part}] has no leader (see `dmq topics describe {self.topic}`)")
            by_leader[(p.leader_address, p.leader_id)].append(part)
        return by_leader

    def poll(self) -> list[Any]:
        """One round: ConsumerRecords in offset order per partition (possibly none after max_wait_ms)."""
        import grpc

        from dmq.client.records import consumer_records
        from dmq.proto import dmq_pb2 as pb
        from dmq.proto import records

        calls = []
        started = time.monotonic()
        for (address, broker_id), parts in sorted(self._leaders().items()):
            request = pb.FetchRequest(
                partitions=[pb.FetchPartition(topic=self.topic, partition=p, offset=self.positions[p],
                                              max_bytes=self.partition_max_bytes) for p in parts],
                max_wait_ms=self.max_wait_ms, min_bytes=1,
            )
            stub = self.sess.broker_stub(address)
            calls.append((address, broker_id, stub.Fetch.future(request, timeout=self.max_wait_ms / 1000 + self.sess.timeout_s)))
        out: list[Any] = []
        stale = False
        for address, broker_id, future in calls:
            try:
                response = future.result()
            except grpc.RpcError as e:
                details = e.details() or ""
                if e.code() == grpc.StatusCode.UNAVAILABLE and is_connect_failure(details):
                    raise broker_unreachable(address, broker_id) from None
                if e.code() == grpc.StatusCode.UNAVAILABLE:
                    stale = True
                    continue
                raise CLIError(f"fetch from broker {broker_id} at {address}: {details or e.code().name}") from None
            for r in response.partitions:
                if r.error == pb.NONE:
                    if not r.records:
                        continue
                    position = self.positions[r.partition]
                    for batch in records.decode_batches(r.records):
                        out.extend(consumer_records(self.topic, r.partition, batch, position))
                    if out and out[-1].partition == r.partition:
                        self.positions[r.partition] = out[-1].offset + 1
                elif r.error == pb.OFFSET_OUT_OF_RANGE and self.positions[r.partition] < r.log_start_offset:
                    self.warn(f"{self.topic}[{r.partition}]: offset {self.positions[r.partition]} was deleted by "
                              f"retention; continuing from the log start {r.log_start_offset}")
                    self.positions[r.partition] = r.log_start_offset
                elif r.error in (pb.NOT_LEADER, pb.UNKNOWN_TOPIC_OR_PARTITION):
                    stale = True
                else:
                    raise CLIError(f"{self.topic}[{r.partition}]: {r.error_message or pb.ErrorCode.Name(r.error)}")
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
