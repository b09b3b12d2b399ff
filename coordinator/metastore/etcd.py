"""The etcd metadata store: the coordinator's durable state in etcd (v3 API, via aetcd), so that
several coordinators can share it (issue 28). Implements dmq.coordinator.metastore.base.MetadataStore.

Key layout, under a root of `/dmq/<prefix>/` (the URL's path, default `default`; several clusters
share one etcd by using different prefixes, and nothing of this store reads or writes outside its
root). Values are UTF-8 JSON unless said otherwise:
  controller_epoch                 the controller epoch, a decimal integer
  brokers/<broker_id:010d>         {"host", "port", "registered_ms", "rack"}
  topics/<name>                    {"partition_count", "config" (TopicSettings.to_json()), "created_ms", "creator"}
  partitions/<name>/<p:010d>       {"replicas", "isr", "leader", "leader_epoch", "partition_epoch"}
  groups/<group_id>                {"topic", "app_id", "subscription_mode", "subscription_from_ms",
                                    "created_ms", "start_offsets" {"<p>": offset}, "generation",
                                    "state_json"}
  acls/<JSON list of the six words> empty value: one key per ACL entry
  acl_version                      a decimal integer
  principal_limits                 {"max_topics", "max_partitions", "exempt"}
  leader                           the leading candidate's name, bound to its lease (campaign())
Partition numbers are zero-padded so that "the partitions from N on" is one key range.

Compare-and-swap (base.py): the version of a topic or partition state is its key's mod_revision,
remembered from load_topics() and from every write; writes compare it in an etcd transaction.
The fence after claim_controller_epoch() is a compare of controller_epoch's mod_revision in every
transaction this store sends.

Atomicity. etcd refuses a transaction of more than --max-txn-ops operations (default 128), so a
write of more partitions is several transactions, and the topic key is the commit point:
  - create_topic / add_partitions write the partition keys first (each chunk compares the topic
    key: absent, or at the revision read), then the topic key; partitions at or above a topic's
    partition_count (or of a topic with no topic key) are not part of it, and load_topics ignores
    them. A crash in between leaves only such invisible keys, overwritten by the next attempt.
  - update_partitions of more than TXN_OPS_MAX - 1 partitions (a broker leading that many dies) is
    applied chunk by chunk; a conflict stops it at the chunk that lost, and the chunks before stand
    (each is a valid controller decision; a deposed writer's are refused by the fence anyway).
Every other write is one transaction. Writes are shielded from the caller's cancellation, as the
SQLite store's are.

Connection: the endpoints (members of one etcd cluster) are tried in order at open(); the first that
answers is used, and when it stops answering a call moves to the next (see _call). TLS (a CA,
optionally a client certificate) and user / password authentication are etcd's own.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aetcd
import aetcd.exceptions
import aetcd.rpc
import aetcd.utils
import aetcd.watcher
import grpc
import structlog

# The errors through their module (base.StoreError): both stores implement one interface, and
# importing all of its names one per line here repeated store.py's import line for line.
from dmq.coordinator.metastore import base
from dmq.coordinator.metastore.base import AclRow, BrokerRecord, GroupRecord, PartitionRecord, PrincipalLimitsRecord, TopicRecord
from dmq.proto.topic_settings import TopicSettings

log = structlog.get_logger(__name__)

# etcd's default --max-txn-ops: the most compares, and the most operations, one transaction may hold.
TXN_OPS_MAX = 128
# Each call to etcd is bounded: an unreachable or stalled etcd fails the write instead of hanging it.
DEFAULT_CALL_TIMEOUT_S = 5.0
DEFAULT_PREFIX = "default"
LEASE_TTL_MAX_S = 3600  # a leader that died is replaced within its TTL: an hour is already far too long
_PREFIX_RE = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")
PREFIX_MAX_CHARS = 200
# A load of a large cluster's partitions is one range answer: above gRPC's 4 MiB default.
_MAX_MESSAGE_BYTES = 256 * 1024 * 1024

T = TypeVar("T")

_UNREACHABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# aetcd raises its own exceptions from some calls (those it wraps): their status codes.
_CODES: dict[type[Exception], grpc.StatusCode] = {
    aetcd.exceptions.ConnectionFailedError: grpc.StatusCode.UNAVAILABLE,
    aetcd.exceptions.ConnectionTimeoutError: grpc.StatusCode.DEADLINE_EXCEEDED,
    aetcd.exceptions.UnauthenticatedError: grpc.StatusCode.UNAUTHENTICATED,
}


class EtcdUrlError(ValueError):
    """A --metadata-store etcd://… URL that cannot be used; the message names the part."""


@dataclass(frozen=True, slots=True)
class EtcdSettings:
    endpoints: tuple[tuple[str, int], ...]
    prefix: str = DEFAULT_PREFIX
    username: str | None = None
    password: str | None = None
    ca_file: pathlib.Path | None = None  # TLS: the CA that signed etcd's certificate
    cert_file: pathlib.Path | None = None  # mutual TLS: this coordinator's certificate and key
    key_file: pathlib.Path | None = None
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S

    @property
    def root(self) -> bytes:
        return f"/dmq/{self.prefix}/".encode()

    def __repr__(self) -> str:  # never the password
        hosts = ",".join(f"{h}:{p}" for h, p in self.endpoints)
        return f"<EtcdSettings endpoints={hosts} prefix={self.prefix!r} tls={self.ca_file is not None} user={self.username!r}>"


def parse_etcd_url(url: str) -> tuple[tuple[tuple[str, int], ...], str]:
    """(endpoints, prefix) of `etcd://host:port[,host:port...][/prefix]`."""
    parts = urlsplit(url)
    if parts.scheme != "etcd":
        raise EtcdUrlError(f"metadata store URL {url!r}: the scheme must be etcd://")
    if parts.query or parts.fragment:
        raise EtcdUrlError(f"metadata store URL {url!r}: no ?query or #fragment is allowed")
    endpoints = []
    for hostport in parts.netloc.split(","):
        host, sep, port = hostport.rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise EtcdUrlError(f"metadata store URL {url!r}: endpoint {hostport!r} must be host:port (port 1..65535)")
        endpoints.append((host.strip("[]"), int(port)))
    prefix = parts.path.strip("/") or DEFAULT_PREFIX
    if len(prefix) > PREFIX_MAX_CHARS or not _PREFIX_RE.match(prefix):
        raise EtcdUrlError(
            f"metadata store URL {url!r}: the prefix {prefix!r} must be 1..{PREFIX_MAX_CHARS} characters of "
            "letters, digits, '.', '_', '-', in segments separated by '/'"
        )
    return tuple(endpoints), prefix


class _Client(aetcd.Client):  # type: ignore[misc]  # aetcd ships no type information: Any
    """aetcd's client, which only opens plaintext channels, with TLS: the channel is made here and
    the rest of aetcd's connect() (stubs, authentication, the watcher) is repeated as it does it."""

    def __init__(self, host: str, port: int, *, credentials: grpc.ChannelCredentials | None, **kwargs: Any) -> None:
        super().__init__(host, port, **kwargs)
        self._credentials = credentials

    async def connect(self) -> None:
        if self._credentials is None:
            await super().connect()
            return
        if self._connected.is_set():
            return
        channel = aetcd.rpc.secure_channel(f"{self._host}:{self._port}", self._credentials, options=list(self._options.items()))
        try:
            if self._username is not None:
                response = await aetcd.rpc.AuthStub(channel).Authenticate(
                    aetcd.rpc.AuthenticateRequest(name=self._username, password=self._password), timeout=self._timeout
                )
                self.metadata = (("token", response.token),)
        except BaseException:
            await channel.close()
            raise
        self.channel = channel
        self.kvstub = aetcd.rpc.KVStub(channel)
        self.clusterstub = aetcd.rpc.ClusterStub(channel)
        self.leasestub = aetcd.rpc.LeaseStub(channel)
        self.maintenancestub = aetcd.rpc.MaintenanceStub(channel)
        self._watcher = aetcd.watcher.Watcher(aetcd.rpc.WatchStub(channel), timeout=self._timeout, metadata=self.metadata)
        self._connected.set()


def _credentials(settings: EtcdSettings) -> grpc.ChannelCredentials | None:
    if settings.ca_file is None:
        if settings.cert_file is not None or settings.key_file is not None:
            raise base.StoreError("etcd client certificate given without --etcd-ca-file: TLS needs the CA")
        return None
    if (settings.cert_file is None) != (settings.key_file is None):
        raise base.StoreError("etcd mutual TLS needs both --etcd-cert-file and --etcd-key-file")
    try:
        return grpc.ssl_channel_credentials(
            root_certificates=settings.ca_file.read_bytes(),
            private_key=settings.key_file.read_bytes() if settings.key_file else None,
            certificate_chain=settings.cert_file.read_bytes() if settings.cert_file else None,
        )
    except OSError as e:
        raise base.StoreError(f"cannot read an etcd TLS file: {e}") from e


def _dumps(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def _state_json(state: PartitionRecord) -> bytes:
    return _dumps(
        {
            "replicas": list(state.replicas),
            "isr": list(state.isr),
            "leader": state.leader,
            "leader_epoch": state.leader_epoch,
            "partition_epoch": state.partition_epoch,
        }
    )


def _state_from(raw: bytes) -> PartitionRecord:
    d = json.loads(raw)
    return PartitionRecord(
        tuple(int(b) for b in d["replicas"]),
        tuple(int(b) for b in d["isr"]),
        int(d["leader"]),
        int(d["leader_epoch"]),
        int(d["partition_epoch"]),
    )


def _chunks(items: Sequence[T], size: int) -> Iterable[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class EtcdMetadataStore:
    def __init__(self, settings: EtcdSettings) -> None:
        if not settings.endpoints:
            raise ValueError("EtcdSettings.endpoints must name at least one host:port")
        self.settings = settings
        self._root = settings.root
        self._client: _Client | None = None
        self._endpoint: tuple[str, int] | None = None
        # mod_revisions as last read or written by this store: its compare-and-swap expectations.
        self._partition_revisions: dict[tuple[str, int], int] = {}
        self._topic_revisions: dict[str, int] = {}
        self._fence_revision: int | None = None  # controller_epoch's mod_revision once claimed

    def __repr__(self) -> str:
        return f"<EtcdMetadataStore {self.settings!r} connected={self._endpoint}>"

    # -- keys ---------------------------------------------------------------------------------------

    def _key(self, *parts: str) -> bytes:
        return self._root + "/".join(parts).encode()

    def _partition_key(self, topic: str, partition: int) -> bytes:
        return self._key("partitions", topic, f"{partition:010d}")

    # -- connection ---------------------------------------------------------------------------------

    async def open(self) -> None:
        await self._connect(self.settings.endpoints)

    async def _connect(self, endpoints: Iterable[tuple[str, int]]) -> None:
        """Use the first of `endpoints` that answers; StoreError naming each one's error if none does."""
        credentials = _credentials(self.settings)
        errors = []
        for host, port in endpoints:
            client = _Client(
                host, port, credentials=credentials, username=self.settings.username, password=self.settings.password,
                timeout=self.settings.call_timeout_s,
                options={"grpc.max_receive_message_length": _MAX_MESSAGE_BYTES,
                         "grpc.max_send_message_length": _MAX_MESSAGE_BYTES},
            )
            try:
                await asyncio.wait_for(self._first_call(client), self.settings.call_timeout_s)
            except (aetcd.exceptions.ClientError, grpc.RpcError, OSError, TimeoutError) as e:
                errors.append(f"{host}:{port}: {e or type(e).__name__}")
                await client.close()
                continue
            self._client, self._endpoint = client, (host, port)
            log.info("etcd metadata store connected", endpoint=f"{host}:{port}", prefix=self.settings.prefix)
            return
        raise base.StoreError(f"no etcd endpoint answered ({'; '.join(errors)})")

    async def _fail_over(self) -> None:
        """Close the current endpoint's client and connect to the next that answers (the others in
        the order given, starting after the current one)."""
        endpoints = list(self.settings.endpoints)
        current = endpoints.index(self._endpoint) if self._endpoint in endpoints else -1
        order = endpoints[current + 1 :] + endpoints[: current + 1]
        client, self._client = self._client, None
        if client is not None:
            await client.close()
        await self._connect(order)

    @staticmethod
    async def _first_call(client: _Client) -> None:
        await client.connect()
        await client.get(b"/dmq/")  # any read: proves the endpoint (and the credentials) work

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def _conn(self) -> _Client:
        if self._client is None:
            raise base.StoreError(f"etcd metadata store {self.settings!r} is not open")
        return self._client

    async def _call(self, what: str, call: Callable[[_Client], Awaitable[T]]) -> T:
        """One call to etcd, retried once in two cases; its errors become StoreError naming the endpoint.
          1. etcd refused the auth token: it lapses (--auth-token-ttl while unused, or all at once
             when auth is enabled again) and aetcd never renews it. Connect again (which
             authenticates again) and retry: etcd applied nothing.
          2. The endpoint is unreachable or does not answer in time, and others were given: retry on
             the next that answers (another member of the same cluster). A write whose first try
             was applied after all cannot apply twice: a plain put or delete is idempotent, and a
             compare-and-swap then finds the revision moved and raises StoreConflict."""
        client = self._conn()
        code: grpc.StatusCode | None
        for attempt in range(2):
            try:
                return await call(client)
            except grpc.aio.AioRpcError as e:
                code, error = e.code(), f"{e.code().name} {e.details()}"
            except aetcd.exceptions.ClientError as e:
                code, error = _CODES.get(type(e)), f"{type(e).__name__} {e}"
            if attempt > 0:
                break
            try:
                if code == grpc.StatusCode.UNAUTHENTICATED and self.settings.username is not None:
                    log.info("etcd auth token refused; authenticating again", endpoint=self._where())
                    await client.close()
                    await client.connect()
                elif code in _UNREACHABLE and len(self.settings.endpoints) > 1:
                    log.warning("etcd endpoint failed; trying the next", endpoint=self._where(), error=error)
                    await self._fail_over()
                    client = self._conn()
                else:
                    break
            except (aetcd.exceptions.ClientError, grpc.RpcError, base.StoreError) as e:
                error = f"{error}; then: {e}"
                break
        raise base.StoreError(f"etcd at {self._where()} did not {what}: {error}")

    def _where(self) -> str:
        return "?" if self._endpoint is None else f"{self._endpoint[0]}:{self._endpoint[1]}"

    @property
    def address(self) -> str:
        """The endpoint in use, else every endpoint given (for status reports)."""
        return self._where() if self._endpoint is not None else ",".join(f"{h}:{p}" for h, p in self.settings.endpoints)

    async def check_health(self, timeout_s: float) -> tuple[bool, str]:
        """(healthy, how) from one linearizable read, which etcd answers only with a leader and a
        quorum, bounded by `timeout_s`: a stopped, paused or partitioned etcd is reported, not waited for."""
        client = self._client
        if client is None:
            return False, "not connected"
        started = time.monotonic()
        try:
            await asyncio.wait_for(client.get(self._key("controller_epoch")), timeout_s)
        except TimeoutError:
            return False, f"no answer to a read within {timeout_s:g}s (etcd stopped, paused or without quorum?)"
        except grpc.aio.AioRpcError as e:
            return False, f"{e.code().name}: {e.details()}"
        except aetcd.exceptions.ClientError as e:
            return False, f"{type(e).__name__}: {e}"
        return True, f"answered a read in {(time.monotonic() - started) * 1000:.0f} ms"

    async def _txn(
        self, what: str, compare: list[Any], success: list[Any], *, fenced: bool = True
    ) -> tuple[bool, list[Any], int]:
        """One transaction, fenced unless told otherwise (only the campaign: a deposed coordinator
        campaigns again); (succeeded, responses, the revision it was applied at).
        Shielded from the caller's cancellation (see the module docstring)."""
        client = self._conn()
        if fenced and self._fence_revision is not None:
            compare = [client.transactions.mod(self._key("controller_epoch")) == self._fence_revision, *compare]

        async def run(c: _Client) -> tuple[bool, list[Any], int]:
            compares = [x.build_message() for x in compare]
            request = aetcd.rpc.TxnRequest(compare=compares, success=c._ops_to_requests(success), failure=[])
            response = await c.kvstub.Txn(request, timeout=c._timeout, metadata=c.metadata)
            return bool(response.succeeded), list(response.responses), int(response.header.revision)

        # aetcd's transaction() hides the header's revision, which the CAS bookkeeping needs.
        return await asyncio.shield(self._call(what, run))

    async def _fenced_txn(self, what: str, compare: list[Any], success: list[Any]) -> tuple[list[Any], int]:
        """A transaction that fails only when a compare does: StoreConflict naming which."""
        ok, responses, revision = await self._txn(what, compare, success)
        if not ok:
            await self._raise_conflict(what)
        return responses, revision

    async def _raise_conflict(self, what: str) -> None:
        if self._fence_revision is not None:
            got = await self._call("read the controller epoch", lambda c: c.get(self._key("controller_epoch")))
            if got is None or got.mod_revision != self._fence_revision:
                raise base.StoreConflict(f"cannot {what}: another coordinator took control (the controller epoch changed)")
        raise base.StoreConflict(f"cannot {what}: the record changed since this coordinator read it")

    async def _range(self, *parts: str) -> list[Any]:
        prefix = self._key(*parts) + b"/"
        result = await self._call(f"read {'/'.join(parts)}", lambda c: c.get_prefix(prefix, sort_order="ascend"))
        return list(result)

    # -- controller epoch ---------------------------------------------------------------------------

    async def load_controller_epoch(self) -> int:
        got = await self._call("read the controller epoch", lambda c: c.get(self._key("controller_epoch")))
        return 0 if got is None else int(got.value)

    async def claim_controller_epoch(self) -> int:
        key = self._key("controller_epoch")
        got = await self._call("read the controller epoch", lambda c: c.get(key))
        epoch, revision = (0, 0) if got is None else (int(got.value), int(got.mod_revision))
        client = self._conn()
        self._fence_revision = None  # claiming again is how a deposed store takes control back
        ok, _responses, applied = await self._txn(
            "claim the controller epoch",
            [client.transactions.mod(key) == revision],
            [client.transactions.put(key, str(epoch + 1).encode())],
        )
        if not ok:
            raise base.StoreConflict(f"another coordinator claimed the controller epoch after {epoch} first")
        self._fence_revision = applied
        log.info("controller epoch claimed", epoch=epoch + 1, prefix=self.settings.prefix)
        return epoch + 1

    # -- brokers ------------------------------------------------------------------------------------

    async def upsert_broker(self, broker: BrokerRecord) -> None:
        value = _dumps({"host": broker.host, "port": broker.port, "registered_ms": broker.registered_ms, "rack": broker.rack})
        client = self._conn()
        await self._fenced_txn(
            f"record broker {broker.broker_id}", [], [client.transactions.put(self._key("brokers", f"{broker.broker_id:010d}"), value)]
        )

    async def load_brokers(self) -> list[BrokerRecord]:
        brokers = []
        for kv in await self._range("brokers"):
            d = json.loads(kv.value)
            broker_id = int(kv.key.rsplit(b"/", 1)[1])
            brokers.append(BrokerRecord(broker_id, str(d["host"]), int(d["port"]), int(d["registered_ms"]), str(d.get("rack") or "")))
        return sorted(brokers, key=lambda b: b.broker_id)

    # -- topics and partition states ----------------------------------------------------------------

    @staticmethod
    def _topic_json(topic: TopicRecord, partition_count: int) -> bytes:
        return _dumps(
            {
                "partition_count": partition_count,
                "config": topic.config.to_json(),
                "created_ms": topic.created_ms,
                "creator": topic.creator,
            }
        )

    async def _put_partitions(self, what: str, topic_compare: Any, states: Mapping[tuple[str, int], PartitionRecord]) -> None:
        client = self._conn()
        items = sorted(states.items())
        # One compare is the topic's (and one the fence's): the rest of a chunk's room is partitions.
        for chunk in _chunks(items, TXN_OPS_MAX - 2):
            _responses, revision = await self._fenced_txn(
                what, [topic_compare], [client.transactions.put(self._partition_key(t, p), _state_json(s)) for (t, p), s in chunk]
            )
            self._partition_revisions.update({key: revision for key, _s in chunk})

    async def create_topic(self, topic: TopicRecord) -> None:
        client = self._conn()
        topic_key = self._key("topics", topic.name)
        absent = client.transactions.create(topic_key) == 0
        try:
            await self._put_partitions(
                f"create topic {topic.name!r}", absent, {(topic.name, p): s for p, s in topic.states.items()}
            )
            _responses, revision = await self._fenced_txn(
                f"create topic {topic.name!r}", [absent], [client.transactions.put(topic_key, self._topic_json(topic, topic.partition_count))]
            )
        except base.StoreConflict as e:
            got = await self._call("read a topic", lambda c: c.get(topic_key))
            if got is not None:
                raise base.TopicExists(f"topic {topic.name!r} is already stored") from e
            raise
        self._topic_revisions[topic.name] = revision

    async def _read_topic(self, name: str) -> dict[str, Any]:
        got = await self._call(f"read topic {name!r}", lambda c: c.get(self._key("topics", name)))
        if got is None:
            raise base.StoreConflict(f"topic {name!r} is not stored")
        d: dict[str, Any] = json.loads(got.value)
        return d

    async def add_partitions(
        self, name: str, new_count: int, new_placement: Mapping[int, int] | Mapping[int, PartitionRecord]
    ) -> None:
        client = self._conn()
        topic_key = self._key("topics", name)
        expected = self._topic_revisions.get(name, 0)
        same = client.transactions.mod(topic_key) == expected
        states = {p: v if isinstance(v, PartitionRecord) else PartitionRecord.unreplicated(v) for p, v in new_placement.items()}
        what = f"add partitions to topic {name!r}"
        await self._put_partitions(what, same, {(name, p): s for p, s in states.items()})
        d = await self._read_topic(name)
        d["partition_count"] = new_count
        _responses, revision = await self._fenced_txn(what, [same], [client.transactions.put(topic_key, _dumps(d))])
        self._topic_revisions[name] = revision

    async def update_partitions(self, states: Mapping[tuple[str, int], PartitionRecord]) -> None:
        client = self._conn()
        # Partitions of topics this store knows are deleted are skipped, as SQLite's UPDATE matches no row.
        items = sorted((key, s) for key, s in states.items() if key[0] in self._topic_revisions)
        for chunk in _chunks(items, TXN_OPS_MAX - 1):
            compare = [
                client.transactions.mod(self._partition_key(t, p)) == self._partition_revisions.get((t, p), 0)
                for (t, p), _s in chunk
            ]
            _responses, revision = await self._fenced_txn(
                f"update {len(chunk)} partition states",
                compare,
                [client.transactions.put(self._partition_key(t, p), _state_json(s)) for (t, p), s in chunk],
            )
            self._partition_revisions.update({key: revision for key, _s in chunk})

    async def remove_partitions(self, name: str, count: int) -> None:
        client = self._conn()
        topic_key = self._key("topics", name)
        same = client.transactions.mod(topic_key) == self._topic_revisions.get(name, 0)
        d = await self._read_topic(name)
        d["partition_count"] = count
        end = aetcd.utils.prefix_range_end(self._key("partitions", name) + b"/")
        _responses, revision = await self._fenced_txn(
            f"remove partitions of topic {name!r}",
            [same],
            [client.transactions.put(topic_key, _dumps(d)), client.transactions.delete(self._partition_key(name, count), end)],
        )
        self._topic_revisions[name] = revision
        for key in [k for k in self._partition_revisions if k[0] == name and k[1] >= count]:
            del self._partition_revisions[key]

    async def delete_topic(self, name: str) -> None:
        client = self._conn()
        prefix = self._key("partitions", name) + b"/"
        await self._fenced_txn(
            f"delete topic {name!r}",
            [],
            [client.transactions.delete(self._key("topics", name)), client.transactions.delete(prefix, aetcd.utils.prefix_range_end(prefix))],
        )
        self._topic_revisions.pop(name, None)
        for key in [k for k in self._partition_revisions if k[0] == name]:
            del self._partition_revisions[key]

    async def load_topics(self) -> list[TopicRecord]:
        states: dict[str, dict[int, tuple[PartitionRecord, int]]] = {}
        for kv in await self._range("partitions"):
            topic, partition = kv.key[len(self._key("partitions")) + 1 :].decode().rsplit("/", 1)
            states.setdefault(topic, {})[int(partition)] = (_state_from(kv.value), int(kv.mod_revision))
        topics = []
        for kv in await self._range("topics"):
            name = kv.key[len(self._key("topics")) + 1 :].decode()
            d = json.loads(kv.value)
            count = int(d["partition_count"])
            # Keys at or above the count are an add_partitions that never reached its commit point.
            placed = {p: sr for p, sr in states.get(name, {}).items() if p < count}
            if sorted(placed) != list(range(count)):
                log.error("topic placement is incomplete", topic=name, partition_count=count, placed=len(placed))
            self._topic_revisions[name] = int(kv.mod_revision)
            self._partition_revisions.update({(name, p): revision for p, (_s, revision) in placed.items()})
            topics.append(
                TopicRecord(
                    name=name,
                    partition_count=count,
                    placement={},
                    states={p: s for p, (s, _revision) in placed.items()},
                    config=TopicSettings.from_json(str(d["config"])),
                    created_ms=int(d["created_ms"]),
                    creator=None if d.get("creator") is None else str(d["creator"]),
                )
            )
        return sorted(topics, key=lambda t: t.name)

    # -- groups -------------------------------------------------------------------------------------

    async def save_group(self, group: GroupRecord) -> None:
        value = _dumps(
            {
                "topic": group.topic,
                "app_id": group.app_id,
                "subscription_mode": group.subscription_mode,
                "subscription_from_ms": group.subscription_from_ms,
                "created_ms": group.created_ms,
                "start_offsets": {str(p): o for p, o in sorted(group.start_offsets.items())},
                "generation": group.generation,
                "state_json": group.state_json,
            }
        )
        client = self._conn()
        await self._fenced_txn(f"save group {group.group_id!r}", [], [client.transactions.put(self._key("groups", group.group_id), value)])

    async def load_groups(self) -> list[GroupRecord]:
        groups = []
        for kv in await self._range("groups"):
            d = json.loads(kv.value)
            groups.append(
                GroupRecord(
                    group_id=kv.key[len(self._key("groups")) + 1 :].decode(),
                    topic=str(d["topic"]),
                    app_id=str(d["app_id"]),
                    subscription_mode=str(d["subscription_mode"]),
                    subscription_from_ms=None if d["subscription_from_ms"] is None else int(d["subscription_from_ms"]),
                    created_ms=int(d["created_ms"]),
                    start_offsets={int(p): int(o) for p, o in d["start_offsets"].items()},
                    generation=int(d.get("generation", 0)),
                    state_json=str(d.get("state_json", "")),
                )
            )
        return sorted(groups, key=lambda g: g.group_id)

    async def delete_group(self, group_id: str) -> bool:
        client = self._conn()
        responses, _revision = await self._fenced_txn(
            f"delete group {group_id!r}", [], [client.transactions.delete(self._key("groups", group_id))]
        )
        return int(responses[0].response_delete_range.deleted) > 0

    # -- ACLs ---------------------------------------------------------------------------------------

    def _acl_key(self, row: AclRow) -> bytes:
        return self._key("acls", json.dumps(list(row), separators=(",", ":")))

    async def change_acls(self, add: Iterable[AclRow], remove: Iterable[AclRow], version: int) -> int:
        """One transaction when the change fits in one (TXN_OPS_MAX operations), else the rows in
        chunks and the version last, so that brokers reload only once every row is in."""
        client = self._conn()
        present = {tuple(json.loads(kv.key[len(self._key("acls")) + 1 :])) for kv in await self._range("acls")}
        added = sorted({tuple(r) for r in add} - present)
        removed = sorted({tuple(r) for r in remove} & present)
        ops = [client.transactions.put(self._acl_key(r), b"") for r in added]
        ops += [client.transactions.delete(self._acl_key(r)) for r in removed]
        version_op = client.transactions.put(self._key("acl_version"), str(version).encode())
        if len(ops) < TXN_OPS_MAX:
            await self._fenced_txn("change ACLs", [], [*ops, version_op])
        else:
            for chunk in _chunks(ops, TXN_OPS_MAX):
                await self._fenced_txn("change ACLs", [], list(chunk))
            await self._fenced_txn("change ACLs", [], [version_op])
        return len(added) + len(removed)

    async def load_acls(self) -> tuple[int, list[AclRow]]:
        got = await self._call("read the ACL version", lambda c: c.get(self._key("acl_version")))
        rows = sorted(tuple(str(w) for w in json.loads(kv.key[len(self._key("acls")) + 1 :])) for kv in await self._range("acls"))
        return (0 if got is None else int(got.value)), rows

    # -- principal limits ---------------------------------------------------------------------------

    async def save_principal_limits(self, limits: PrincipalLimitsRecord) -> None:
        value = _dumps({"max_topics": limits.max_topics, "max_partitions": limits.max_partitions, "exempt": list(limits.exempt)})
        client = self._conn()
        await self._fenced_txn("save principal limits", [], [client.transactions.put(self._key("principal_limits"), value)])

    async def load_principal_limits(self) -> PrincipalLimitsRecord | None:
        got = await self._call("read principal limits", lambda c: c.get(self._key("principal_limits")))
        if got is None:
            return None
        d = json.loads(got.value)
        return PrincipalLimitsRecord(int(d["max_topics"]), int(d["max_partitions"]), tuple(str(p) for p in d["exempt"]))

    # -- leadership: the seam for standby coordinators (issue 28 item 2) ---------------------------
    # The etcd election pattern without a background task: the caller owns the renew loop (aetcd
    # has no keep-alive of its own), renews well within the TTL, and stops acting as soon as a
    # renewal fails, before the lease can lapse. Key `leader` = the candidate's name, bound to its lease.

    async def campaign(self, candidate: str, ttl_s: int) -> int | None:
        """One attempt to lead: a lease of `ttl_s` seconds and `leader` created only if absent,
        bound to it. The lease id when won (then claim_controller_epoch()), None when another
        candidate leads (the lease just granted is revoked)."""
        if not 1 <= ttl_s <= LEASE_TTL_MAX_S:
            raise ValueError(f"ttl_s must be 1..{LEASE_TTL_MAX_S}, got {ttl_s}")
        key = self._key("leader")
        lease = await self._call("grant a lease", lambda c: c.lease(ttl_s))
        client = self._conn()
        won, _responses, _revision = await self._txn(
            "campaign", [client.transactions.create(key) == 0], [client.transactions.put(key, candidate.encode(), lease=lease.id)],
            fenced=False,  # a deposed coordinator's store is fenced on its old epoch: it may still campaign
        )
        if not won:
            await self._call("revoke a lease", lambda c: c.revoke_lease(lease.id))
            return None
        log.info("leadership won", candidate=candidate, ttl_s=ttl_s, prefix=self.settings.prefix)
        return int(lease.id)

    async def renew_leadership(self, lease_id: int) -> int:
        """Refresh the lease; the seconds it now has. StoreConflict when it has lapsed (leadership lost)."""
        reply = await self._call("renew the leadership lease", lambda c: c.refresh_lease(lease_id))
        ttl = 0 if reply is None else int(reply.TTL)
        if ttl <= 0:
            raise base.StoreConflict("the leadership lease has lapsed: another coordinator may lead now")
        return ttl

    async def resign(self, lease_id: int) -> None:
        """Hand leadership over at once (a clean shutdown): revoking the lease deletes `leader`."""
        await self._call("revoke the leadership lease", lambda c: c.revoke_lease(lease_id))

    async def leader(self) -> str | None:
        """The leading candidate's name, None when nobody leads."""
        got = await self._call("read the leader", lambda c: c.get(self._key("leader")))
        return None if got is None else bytes(got.value).decode()
