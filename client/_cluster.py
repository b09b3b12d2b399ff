"""Channels and the metadata cache shared by every client object.

A `Cluster` holds one synchronous gRPC channel per "host:port" (the bootstrap address is the
coordinator's; brokers are learned from metadata) and a cache of each topic's partitions and
their leaders, filled by `GetMetadata`.

Cache rules:
  - reads (`leader_for`, `partitions_for`, `topic_metadata`) are lock-free dict lookups of
    immutable `TopicMetadata` values, so the producer's hot path can call them per record;
  - a miss, or an entry marked stale by `invalidate()` (callers do so on UNAVAILABLE / NOT_FOUND,
    errors whose class has ``invalid_metadata``), or one older than ``metadata_max_age_ms``,
    triggers `refresh()`;
  - a refresh is one GetMetadata call in flight, shared: a caller whose topics an in-flight
    refresh covers waits for that one instead of asking again;
  - a caller says how long it may wait (``timeout_s``); the refresh itself goes on with its full
    request timeout and fills the cache for later callers, so a consumer's poll(0) never blocks
    on the coordinator yet still learns new metadata;
  - with ``allow_stale`` (the consumer's fetch and commit paths), a refresh that fails or is still
    under way leaves the last known entry in use: partitions never move between brokers, so a
    coordinator outage must not stop reading from brokers that are up. Failed refreshes back off
    (exponentially, up to MAX_REFRESH_BACKOFF_S) so a dead coordinator is not hammered.

Every error of a metadata look-up names the coordinator address it tried.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from dmq.client._calls import (
    CALL_CANCELLED,
    DEFAULT_RETRY_BACKOFF_MAX_MS,
    DEFAULT_RETRY_BACKOFF_MS,
    PendingCall,
    RetryPolicy,
)
from dmq.client._closing import ClosedOnExit
from dmq.client._coordinators import CoordinatorRouter
from dmq.client._log import get_logger
from dmq.client.errors import (
    ClientClosedError,
    CoordinatorUnavailableError,
    CorruptRecordError,
    DMQError,
    DMQTimeoutError,
    InvalidConfigError,
    NoBrokersAvailableError,
    TopicNotFoundError,
    UnknownPartitionError,
    from_rpc_error,
)
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import wire
from dmq.proto.grpc_options import channel_options
from dmq.proto.security.settings import ClientSecurity, SecurityConfigError, sync_channel
from dmq.proto.wire import FetchPartitionView, WireError, parse_fetch_response

log = get_logger(__name__)

__all__ = ["Cluster", "TopicMetadata", "PartitionMetadata", "BrokerMetadata", "parse_address", "unreachable"]

DEFAULT_REQUEST_TIMEOUT_MS = 30_000
DEFAULT_METADATA_MAX_AGE_MS = 300_000
# After a failed refresh, implicit refreshes (cache misses with allow_stale) wait this long,
# doubling per failure up to the maximum, so a dead coordinator is not asked on every look-up.
MIN_REFRESH_BACKOFF_S = 0.1
MAX_REFRESH_BACKOFF_S = 2.0


def parse_address(address: str) -> str:
    """Validate "host:port" (IPv6 as "[::1]:port") and return it stripped."""
    address = address.strip()
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bootstrap address must be 'host:port' (e.g. '127.0.0.1:9091'), got {address!r}")
    return address


def unreachable(address: str, state: str, timeout_s: float) -> NoBrokersAvailableError:
    """The error of a client that could not connect to its bootstrap address at start-up."""
    why = ("the connection failed (refused, unresolvable, or the TLS handshake failed)"
           if state == "TRANSIENT_FAILURE" else f"no connection within request_timeout_ms ({timeout_s * 1000:.0f} ms)")
    return NoBrokersAvailableError(
        f"no DMQ coordinator reachable at {address}: {why}; is `dmq server` running there, and is "
        f"bootstrap_servers its address?"
    )


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    partition: int
    leader_id: int
    leader_address: str  # "" when the partition has no placement yet
    leader_alive: bool


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    partitions: tuple[PartitionMetadata, ...]  # index = partition number
    available: tuple[int, ...]  # partitions whose leader is alive (all of them when none is)
    fetched_at: float  # time.monotonic()
    # The topic's max_message_bytes (largest batch its brokers accept); None = the brokers' default.
    max_message_bytes: int | None = None

    @property
    def partition_count(self) -> int:
        return len(self.partitions)

    @classmethod
    def from_proto(cls, info: pb.TopicInfo, fetched_at: float) -> TopicMetadata:
        by_number = {p.partition: p for p in info.partitions}
        parts = tuple(
            PartitionMetadata(
                partition=i,
                leader_id=by_number[i].leader_id if i in by_number else -1,
                leader_address=by_number[i].leader_address if i in by_number else "",
                leader_alive=by_number[i].leader_alive if i in by_number else False,
            )
            for i in range(info.partition_count)
        )
        alive = tuple(p.partition for p in parts if p.leader_alive and p.leader_address)
        limit = info.config.max_message_bytes if info.config.HasField("max_message_bytes") else None
        return cls(info.name, parts, alive or tuple(range(len(parts))), fetched_at, limit)


@dataclass(frozen=True, slots=True)
class BrokerMetadata:
    broker_id: int
    address: str
    alive: bool


class Cluster(ClosedOnExit):
    """Channels per address plus the topic metadata cache. Thread-safe; the owner calls close()."""

    def __init__(
        self,
        bootstrap: str,
        *,
        request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
        metadata_max_age_ms: int = DEFAULT_METADATA_MAX_AGE_MS,
        security: ClientSecurity | None = None,
        retry_backoff_ms: int = DEFAULT_RETRY_BACKOFF_MS,
        retry_backoff_max_ms: int = DEFAULT_RETRY_BACKOFF_MAX_MS,
    ) -> None:
        # "h1:p,h2:p": several coordinators, one active; a router follows it (dmq.client._coordinators).
        coordinators = list(dict.fromkeys(parse_address(a) for a in bootstrap.split(",")))
        self._bootstrap = coordinators[0]
        self._router = CoordinatorRouter(coordinators, self.channel) if len(coordinators) > 1 else None
        # TLS and token for every channel (dmq.client._security); none given: the environment's.
        if security is None:
            try:
                security = ClientSecurity.from_settings(None)
            except SecurityConfigError as e:
                raise InvalidConfigError(str(e)) from None
        self.security = security
        self.request_timeout_ms = request_timeout_ms
        # How the client objects sharing this cluster ask again (dmq.client._calls).
        try:
            self.retry = RetryPolicy(retry_backoff_ms, retry_backoff_max_ms, request_timeout_ms)
        except ValueError as e:
            raise InvalidConfigError(str(e)) from None
        self.metadata_max_age_ms = metadata_max_age_ms
        self._lock = threading.Lock()  # channels, stubs, closed flag
        self._refresh_lock = threading.Lock()  # guards _refreshes (bookkeeping only, no I/O)
        # In-flight GetMetadata calls: key = sorted topic names, () = every topic.
        self._refreshes: dict[tuple[str, ...], concurrent.futures.Future[None]] = {}
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[tuple[str, object], Any] = {}  # (address, stub class or method)
        self._topics: dict[str, TopicMetadata] = {}
        self._stale: set[str] = set()
        self._brokers: dict[int, BrokerMetadata] = {}
        self._refresh_backoff_s = 0.0
        self._refresh_retry_at = 0.0  # time.monotonic() before which allow_stale look-ups do not refresh
        self._closed = False

    def __repr__(self) -> str:
        return f"<Cluster bootstrap={self.bootstrap!r} channels={len(self._channels)} topics={len(self._topics)}>"

    @property
    def bootstrap(self) -> str:
        """The coordinator's address (the one believed active, of several)."""
        return self._router.current if self._router is not None else self._bootstrap

    @property
    def coordinator_router(self) -> CoordinatorRouter | None:
        """Which of several coordinators is active, as this client last learned (None: one
        coordinator); the consumer's heartbeat thread follows it too."""
        return self._router

    # -- channels --------------------------------------------------------------------------------

    def channel(self, address: str) -> grpc.Channel:
        ch = self._channels.get(address)
        if ch is not None:
            return ch
        with self._lock:
            if self._closed:
                raise ClientClosedError(f"the client for {self.bootstrap} is closed; create a new one")
            ch = self._channels.get(address)
            if ch is None:
                ch = self._new_channel(address)
                self._channels[address] = ch
            return ch

    def _new_channel(self, address: str) -> grpc.Channel:
        try:
            return sync_channel(address, self.security, channel_options())
        except SecurityConfigError as e:  # a TLS file that cannot be read
            raise InvalidConfigError(str(e)) from None

    def check_reachable(self, timeout_s: float | None = None) -> None:
        """Connect to the bootstrap address, or raise NoBrokersAvailableError naming it (as
        kafka-python's clients do at construction): at once when the connection fails (a closed
        port is refused in microseconds), else after `timeout_s` (default request_timeout_ms).
        No RPC is made, so this needs no permission; the connection made is the one later calls
        use."""
        wait_s = self.timeout_s if timeout_s is None else timeout_s
        settled = threading.Event()
        seen: list[grpc.ChannelConnectivity] = []

        def watch(state: grpc.ChannelConnectivity) -> None:
            # The first state reported is the current one (IDLE before the first connection).
            if state in (grpc.ChannelConnectivity.READY, grpc.ChannelConnectivity.TRANSIENT_FAILURE,
                         grpc.ChannelConnectivity.SHUTDOWN):
                seen.append(state)
                settled.set()

        channel = self.channel(self.bootstrap)
        channel.subscribe(watch, try_to_connect=True)
        try:
            settled.wait(wait_s)
        finally:
            channel.unsubscribe(watch)
        state = seen[0] if seen else None
        if state is grpc.ChannelConnectivity.READY:
            return
        if state is grpc.ChannelConnectivity.SHUTDOWN:
            raise ClientClosedError(f"the client for {self.bootstrap} is closed; create a new one")
        raise unreachable(self.bootstrap, state.name if state is not None else "", wait_s)

    def _stub(self, address: str, cls: type) -> Any:
        stub = self._stubs.get((address, cls))
        if stub is None:
            stub = cls(self.channel(address))
            self._stubs[(address, cls)] = stub
        return stub

    def broker_stub(self, address: str) -> pb_grpc.BrokerStub:
        # _stub is Any: the generated stubs are untyped (and on the AsyncCluster's aio channels)
        stub: pb_grpc.BrokerStub = self._stub(address, pb_grpc.BrokerStub)
        return stub

    def start_unary(self, method: Any, request: Any, timeout: float) -> PendingCall[Any]:
        """Start a unary call of a stub `method` without waiting: a grpc Future here; the
        AsyncCluster makes it a task on the loop. The parts both clients share start their
        calls through this (same signature as an Executor's ``submit(method, request, timeout=)``)."""
        future: grpc.Future[Any] = method.future(request, timeout=timeout)
        return future

    # [Any, Any]: on the AsyncCluster's aio channels calling it gives an awaitable
    def _unary(self, address: str, method: str, serializer: Any, deserializer: Any) -> grpc.UnaryUnaryMultiCallable[Any, Any]:
        key = (address, method)
        call = self._stubs.get(key)
        if call is None:
            call = self.channel(address).unary_unary(
                method, request_serializer=serializer, response_deserializer=deserializer
            )
            self._stubs[key] = call
        return call

    def raw_produce(self, address: str) -> grpc.UnaryUnaryMultiCallable[Any, Any]:
        """Broker.Produce taking an already serialised ProduceRequest (bytes), so the producer can
        frame the request around its batch with one copy (see dmq.proto.wire.frame_produce_request)."""
        return self._unary(address, wire.PRODUCE_METHOD, None, pb.ProduceResponse.FromString)

    def raw_fetch(self, address: str) -> grpc.UnaryUnaryMultiCallable[Any, Any]:
        """Broker.Fetch answering the serialised FetchResponse (bytes): read it with
        fetch_results(), which keeps the records as views into it rather than copies."""
        return self._unary(address, wire.FETCH_METHOD, pb.FetchRequest.SerializeToString, None)

    def _coordinator_stub(self, address: str, cls: type) -> Any:
        """A coordinator's stub; with several coordinators, one at whichever is active (only the
        coordinator services: a broker sharing a coordinator's port, `dmq server`, is called directly)."""
        if self._router is None or address not in self._router.addresses:
            return self._stub(address, cls)
        stub = self._stubs.get(("", cls))
        if stub is None:
            stub = self._stubs[("", cls)] = cls(self._router)
        return stub

    def coordinator_addresses(self) -> list[str]:
        """Every coordinator address bootstrap_servers named (and any active one a standby named since)."""
        return list(self._router.addresses) if self._router is not None else [self._bootstrap]

    def metadata_stub(self) -> pb_grpc.MetadataStub:
        stub: pb_grpc.MetadataStub = self._coordinator_stub(self.bootstrap, pb_grpc.MetadataStub)  # typed here: see broker_stub
        return stub

    def group_stub(self, address: str | None = None) -> pb_grpc.GroupCoordinatorStub:
        # typed here, as in broker_stub
        stub: pb_grpc.GroupCoordinatorStub = self._coordinator_stub(address or self.bootstrap, pb_grpc.GroupCoordinatorStub)
        return stub

    @property
    def timeout_s(self) -> float:
        return self.request_timeout_ms / 1000

    # -- metadata cache ----------------------------------------------------------------------------

    def topic_metadata(self, topic: str, *, timeout_s: float | None = None, allow_stale: bool = False) -> TopicMetadata:
        """The cached metadata of `topic`, refreshed first if missing, stale or too old.

        `timeout_s` bounds the wait for a refresh (default: request_timeout_ms). With
        `allow_stale`, a cached entry is returned when the refresh fails, is backing off after a
        failure, or does not finish within `timeout_s`; only a missing entry raises then.
        """
        meta = self._topics.get(topic)
        if (
            meta is not None
            and topic not in self._stale
            and time.monotonic() - meta.fetched_at <= self.metadata_max_age_ms / 1000
        ):
            return meta
        if allow_stale and meta is not None and time.monotonic() < self._refresh_retry_at:
            return meta
        try:
            self.refresh([topic], timeout_s=timeout_s)
        except TopicNotFoundError:
            raise
        except DMQError as e:
            if allow_stale and meta is not None and e.retriable:
                log.debug("using cached metadata", topic=topic, error=str(e))
                return meta
            raise
        meta = self._topics.get(topic)
        if meta is None:  # pragma: no cover - refresh raises TopicNotFoundError instead
            raise TopicNotFoundError(f"topic {topic!r} not found")
        return meta

    def cached_metadata(self, topic: str) -> TopicMetadata | None:
        """The cached metadata of `topic`, even stale or old (then a refresh is started, not waited
        for); None when nothing is cached. For the producer: what send() needs of it (the partition
        count, the size limits) no coordinator outage changes, and while no coordinator is active a
        refresh cannot succeed (issue 28 item 5: the data path does not need the control plane)."""
        meta = self._topics.get(topic)
        now = time.monotonic()
        if meta is not None and (topic in self._stale or now - meta.fetched_at > self.metadata_max_age_ms / 1000):
            if now >= self._refresh_retry_at:
                self._start_refresh((topic,))
        return meta

    def partitions_for(self, topic: str) -> int:
        meta = self._topics.get(topic)
        if meta is not None and topic not in self._stale:
            return len(meta.partitions)
        return self.topic_metadata(topic).partition_count

    def leader_for(self, topic: str, partition: int, *, timeout_s: float | None = None, allow_stale: bool = False) -> str:
        """The "host:port" of the broker leading topic[partition] (see topic_metadata() for the
        keyword arguments)."""
        meta = self.topic_metadata(topic, timeout_s=timeout_s, allow_stale=allow_stale)
        if not 0 <= partition < len(meta.partitions):
            # The topic may have grown since we looked: ask once more before failing.
            self.refresh([topic], timeout_s=timeout_s)
            meta = self.topic_metadata(topic, timeout_s=timeout_s)
            if not 0 <= partition < len(meta.partitions):
                raise UnknownPartitionError(
                    f"topic {topic!r} has partitions 0..{len(meta.partitions) - 1}; partition {partition} does not exist"
                )
        address = meta.partitions[partition].leader_address
        if not address:
            raise CoordinatorUnavailableError(f"{topic}[{partition}] has no leader yet; retry")
        return address

    def peek_leader(self, topic: str, partition: int, *, max_age_s: float) -> str:
        """The cached live leader of topic[partition] ("" when unknown or not alive), never blocking.

        When the cached entry is stale or older than `max_age_s`, a refresh is started in the
        background (one at a time, and not while refreshes are backing off after a failure): a
        caller polling this while it backs off learns of a new leader within about `max_age_s`.
        """
        meta = self._topics.get(topic)
        now = time.monotonic()
        if (meta is None or topic in self._stale or now - meta.fetched_at > max_age_s) and now >= self._refresh_retry_at:
            self._start_refresh((topic,))
        if meta is None or not 0 <= partition < len(meta.partitions):
            return ""
        p = meta.partitions[partition]
        return p.leader_address if p.leader_alive else ""

    def invalidate(self, topic: str) -> None:
        """Mark a topic's metadata stale: the next lookup asks the coordinator again."""
        self._stale.add(topic)

    def refresh(self, topics: Iterable[str] | None = None, *, timeout_s: float | None = None) -> None:
        """Fetch metadata for `topics` (None = every topic) and update the cache, waiting at most
        `timeout_s` (default request_timeout_ms) for the answer; the call itself goes on and
        fills the cache when it answers later.

        Raises TopicNotFoundError when a named topic does not exist (and drops it from the cache),
        CoordinatorUnavailableError / DMQTimeoutError naming the coordinator's address otherwise.
        """
        names = tuple(sorted(set(topics))) if topics is not None else ()
        future = self._start_refresh(names)
        wait_s = self.timeout_s if timeout_s is None else max(0.0, timeout_s)
        try:
            future.result(timeout=wait_s)
        except concurrent.futures.TimeoutError:
            raise DMQTimeoutError(
                f"GetMetadata from the coordinator at {self.bootstrap} did not answer within {wait_s:.3g} s; "
                "is the coordinator up and is that its address?"
            ) from None

    def _start_refresh(self, names: tuple[str, ...]) -> concurrent.futures.Future[None]:
        """The in-flight refresh covering `names`, started if there is none (never blocks)."""
        with self._refresh_lock:
            for key in ((), names):
                pending = self._refreshes.get(key)
                if pending is not None:
                    return pending
            result: concurrent.futures.Future[None] = concurrent.futures.Future()
            started = time.monotonic()
            request = pb.GetMetadataRequest(topics=list(names))
            try:
                call = self.start_unary(self.metadata_stub().GetMetadata, request, timeout=self.timeout_s)
            except ValueError as e:  # the channel was closed under us
                result.set_exception(ClientClosedError(f"the client for {self.bootstrap} is closed"))
                del e
                return result
            except ClientClosedError as e:
                result.set_exception(e)
                return result
            self._refreshes[names] = result
        call.add_done_callback(lambda f: self._refresh_done(f, names, started, result))
        return result

    def _refresh_done(
        self,
        call: PendingCall[pb.GetMetadataResponse],
        names: tuple[str, ...],
        started: float,
        result: concurrent.futures.Future[None],
    ) -> None:
        with self._refresh_lock:
            self._refreshes.pop(names, None)
        try:
            response = call.result()
        except CALL_CANCELLED:
            result.set_exception(ClientClosedError(f"the client for {self.bootstrap} is closed"))
            return
        except grpc.RpcError as e:
            err = from_rpc_error(
                e,
                context=f"GetMetadata from the coordinator at {self.bootstrap}",
                overrides={
                    grpc.StatusCode.NOT_FOUND: TopicNotFoundError,
                    grpc.StatusCode.UNAVAILABLE: CoordinatorUnavailableError,
                },
            )
            if isinstance(err, TopicNotFoundError):
                for n in names:
                    self._topics.pop(n, None)
            elif err.retriable:
                self._refresh_backoff_s = min(
                    MAX_REFRESH_BACKOFF_S, max(MIN_REFRESH_BACKOFF_S, self._refresh_backoff_s * 2)
                )
                self._refresh_retry_at = time.monotonic() + self._refresh_backoff_s
            result.set_exception(err)
            return
        except Exception as e:  # noqa: BLE001 - a waiter must never hang on a callback that died
            result.set_exception(DMQError(f"GetMetadata from the coordinator at {self.bootstrap}: {e}"))
            return
        self._refresh_backoff_s = 0.0
        self._refresh_retry_at = 0.0
        self._apply(response, list(names) or None, started)
        result.set_result(None)

    def _apply(self, response: pb.GetMetadataResponse, names: list[str] | None, started: float) -> None:
        now = time.monotonic()
        for info in response.topics:
            self._topics[info.name] = TopicMetadata.from_proto(info, now)
            self._stale.discard(info.name)
        if names is None:
            # A full listing is authoritative: forget deleted topics.
            for gone in set(self._topics) - {info.name for info in response.topics}:
                self._topics.pop(gone, None)
                self._stale.discard(gone)
        self._brokers = {
            b.broker_id: BrokerMetadata(b.broker_id, _address(b.host, b.port), b.alive) for b in response.brokers
        }
        log.debug("metadata refreshed", topics=len(response.topics), brokers=len(response.brokers))

    def brokers(self, refresh: bool = False) -> list[BrokerMetadata]:
        if refresh or not self._brokers:
            self.refresh(None)
        return sorted(self._brokers.values(), key=lambda b: b.broker_id)

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            channels = list(self._channels.values())
            self._channels.clear()
            self._stubs.clear()
        for ch in channels:
            ch.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def topic_names(self) -> list[str]:
        """The names of the topics in the cache: every topic after refresh(None) answered."""
        return sorted(self._topics)

    def start_listing(self) -> concurrent.futures.Future[None]:
        """Start (or join) a refresh of every topic's metadata without waiting for it."""
        return self._start_refresh(())


def _address(host: str, port: int) -> str:
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def fetch_results(answer: bytes, context: str) -> list[FetchPartitionView]:
    """The partitions of a raw_fetch() answer. Parsing it here, rather than with the generated
    FetchResponse, saves two copies of the records (see dmq.proto.wire)."""
    try:
        return parse_fetch_response(answer)
    except WireError as e:
        raise CorruptRecordError(f"{context}: malformed Fetch answer ({e})") from e

