"""Options of the `dmq` Spark source and sink, parsed and checked before any work starts.

Names and meanings follow Spark's Kafka source so a Kafka user can switch by changing the format.
Spark hands options over case-insensitively (lower-cased keys); error messages use the canonical
camelCase names below. Every option that is unknown, malformed, or contradicts another option (or
the kind of query: batch vs streaming, read vs write) fails with a message naming the option.

Source options::

    bootstrap              coordinator address host:port                      required
                           (also bootstrap_servers, kafka.bootstrap.servers)
    subscribe              topic[,topic...]                                   one of subscribe /
    subscribePattern       a regex matching whole topic names (a stream      subscribePattern /
                           reads matching topics created later from offset 0)
    assign                 {"topic": [0, 1], ...}                             assign
    startingOffsets        earliest | latest | {"topic": {"0": 23, "1": -2}}  batch: earliest (default);
                           (-2 = earliest, -1 = latest in the JSON form)     stream: latest (default)
    endingOffsets          latest | {"topic": {"0": 50, "1": -1}}             batch only; default latest
    startingTimestamp      ms since the epoch, for every partition            one of the starting
    startingOffsetsByTimestamp  {"topic": {"0": ms, "1": ms}}, every partition  options
    endingTimestamp        ms since the epoch, exclusive                      batch only; one of the
    endingOffsetsByTimestamp    {"topic": {"0": ms}}, every partition         ending options
    maxOffsetsPerTrigger   records per micro-batch, spread over partitions    stream only
    minPartitions          split offset ranges into at least this many tasks
    includeHeaders         true | false (default false)
    failOnDataLoss         true | false (default true)
    groupId                app id whose consumer group gets the stream's     stream only
                           finished offsets (one group per topic, like every DMQ consumer)
    fetchMaxBytes          the most bytes per Fetch call (default 16 MiB; a reader holds about 3x this);
                           each call asks for about what the rows left in the range need
    pollTimeoutMs          how long a read retries an unavailable broker (default 120000)
    sslCafile              the CA of the cluster's certificates (TLS)         security options, also
    sslCertfile, sslKeyfile  a client certificate and its key (mutual TLS)    of the sink; each
    token                  a token naming the principal (`dmq tokens create`)  overrides its DMQ_*
                                                                               environment variable

Security options override the environment's (DMQ_SSL_CAFILE, DMQ_SSL_CERTFILE, DMQ_SSL_KEYFILE,
DMQ_TOKEN) setting by setting, in the driver and in every executor: an option travels with the
plan, what it leaves out is taken from each process's own environment (spark.executorEnv.*), and
files are opened where the task runs, so they must exist there. The token is never shown in a repr.

Timestamps select by the broker's append time (ListOffsets), the one time index DMQ keeps: the
first offset appended at or after the time, or the log end when no record is that recent (so a
start after every record reads nothing; Spark's startingOffsetsByTimestampStrategy has no use).

Kafka's names (`kafka.` prefix, as Spark's Kafka source passes them to the Kafka client) are
aliases of the DMQ options of the same meaning (KAFKA_ALIASES); a few more are checked for
agreement (kafka.security.protocol PLAINTEXT | SSL, kafka.sasl.mechanism OAUTHBEARER,
kafka.ssl.truststore.type PEM). Kafka options that have no meaning for DMQ fail with the reason
(NOT_APPLICABLE), as does any other `kafka.` setting.

Sink options::

    bootstrap              coordinator address                                required
    topic                  topic for every row; overrides a `topic` column   required without one
    compression            none | zstd | lz4 (default none)
    lingerMs, batchSize    producer batching
    sslCafile, sslCertfile, sslKeyfile, token    as for the source
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from dmq.proto.offset_markers import EARLIEST, LATEST
from dmq.proto.security.settings import ClientSecurity, SecurityConfigError

# Measured (broker CPU serving 1M x 100 B records to the Spark bench): it spends ~30% less CPU per byte at 16 MiB than at
# 8 MiB (2 MiB: +30%), 32 MiB gains little more. A reader holds ~3x this (answer, Arrow, prefetch).
DEFAULT_FETCH_MAX_BYTES = 16 * 1024 * 1024
MAX_FETCH_MAX_BYTES = 60 * 1024 * 1024  # the broker's fetch response cap
DEFAULT_POLL_TIMEOUT_MS = 120_000

# Security options -> the client library's keyword of the same meaning (dmq.client._security).
SECURITY_OPTIONS = {"sslCafile": "ssl_cafile", "sslCertfile": "ssl_certfile", "sslKeyfile": "ssl_keyfile",
                    "token": "token"}
SOURCE_OPTIONS = (
    "bootstrap",
    "subscribe",
    "subscribePattern",
    "assign",
    "startingOffsets",
    "endingOffsets",
    "startingTimestamp",
    "endingTimestamp",
    "startingOffsetsByTimestamp",
    "endingOffsetsByTimestamp",
    "maxOffsetsPerTrigger",
    "minPartitions",
    "includeHeaders",
    "failOnDataLoss",
    "groupId",
    "fetchMaxBytes",
    "pollTimeoutMs",
    *SECURITY_OPTIONS,
)
SINK_OPTIONS = ("bootstrap", "topic", "compression", "lingerMs", "batchSize", *SECURITY_OPTIONS)
_CANONICAL = {name.lower(): name for name in SOURCE_OPTIONS + SINK_OPTIONS}

# Kafka's name -> the DMQ option it stands for. Files are PEM: librdkafka's (confluent-kafka's)
# names say so; Java's truststore is accepted only when its type says PEM. Kafka has no static
# token setting (OAUTHBEARER tokens come from a login callback), so DMQ's token takes the name a
# Kafka user looks for beside kafka.sasl.mechanism=OAUTHBEARER.
KAFKA_ALIASES = {
    "kafka.ssl.ca.location": "sslCafile",
    "kafka.ssl.truststore.location": "sslCafile",
    "kafka.ssl.certificate.location": "sslCertfile",
    "kafka.ssl.key.location": "sslKeyfile",
    "kafka.sasl.oauthbearer.token": "token",
    "kafka.fetch.max.bytes": "fetchMaxBytes",
    "kafkaConsumer.pollTimeoutMs": "pollTimeoutMs",
    "kafka.linger.ms": "lingerMs",
    "kafka.batch.size": "batchSize",
    "kafka.compression.type": "compression",
}
# Kafka settings with no DMQ option of their own, checked against what DMQ does.
_KAFKA_CHECKED = ("kafka.security.protocol", "kafka.sasl.mechanism", "kafka.ssl.truststore.type")
_KAFKA_CANONICAL = {name.lower(): name for name in (*KAFKA_ALIASES, *_KAFKA_CHECKED)}
# Options of Spark's Kafka source (or Kafka client settings) that mean nothing for DMQ: why.
NOT_APPLICABLE = {
    "kafka.group.id": "DMQ's source reads by offset ranges, not as a group member; give 'groupId' to have "
                      "the stream's finished offsets committed to that app's consumer group",
    "groupIdPrefix": "no consumer group is used for reading; 'groupId' names the group offsets are committed to",
    "kafka.ssl.keystore.location": "Java keystores are not read; give the PEM files as "
                                   "kafka.ssl.certificate.location and kafka.ssl.key.location",
    "kafka.ssl.keystore.type": "Java keystores are not read; give kafka.ssl.certificate.location and "
                               "kafka.ssl.key.location",
    "kafka.ssl.truststore.password": "the CA is a PEM file (kafka.ssl.truststore.type=PEM), it has no password",
    "kafka.ssl.keystore.password": "the client key is a PEM file (kafka.ssl.key.location) without a password",
    "kafka.ssl.key.password": "the client key is a PEM file (kafka.ssl.key.location) without a password",
    "kafka.sasl.jaas.config": "DMQ takes a token: kafka.sasl.oauthbearer.token (or 'token')",
    "kafka.key.deserializer": "the source's key and value columns are binary; cast or decode them in Spark",
    "kafka.value.deserializer": "the source's key and value columns are binary; cast or decode them in Spark",
    "kafka.key.serializer": "the sink writes the binary or string key and value columns as they are",
    "kafka.value.serializer": "the sink writes the binary or string key and value columns as they are",
    "kafka.auto.offset.reset": "give startingOffsets (earliest | latest | JSON)",
    "kafka.enable.auto.commit": "progress lives in the checkpoint; 'groupId' mirrors it into a group",
    "kafka.interceptor.classes": "there are no Kafka client classes to load",
    "fetchOffset.numRetries": "offsets are looked up with the client's own retries while leaders move",
    "fetchOffset.retryIntervalMs": "offsets are looked up with the client's own retries while leaders move",
    "startingOffsetsByTimestampStrategy": "a time after every record starts at the log end (reads nothing)",
    "minOffsetsPerTrigger": "not supported; give maxOffsetsPerTrigger",
    "maxTriggerDelay": "not supported (it goes with minOffsetsPerTrigger)",
    "kafkaConsumer.cache.capacity": "DMQ keeps no consumer pool: each task fetches with its own client",
}
_NOT_APPLICABLE = {name.lower(): (name, why) for name, why in NOT_APPLICABLE.items()}
# Options Spark itself puts among the data source's (a streaming query's checkpoint): not ours.
_SPARK_OWNED = {"checkpointlocation"}


class OptionError(ValueError):
    """A bad, unknown or contradictory option; the message names it and says what to do."""


# (client keyword, value) pairs: hashable and picklable, they travel to executors with the plan.
Credentials = tuple[tuple[str, str], ...]


def _credentials(opts: dict[str, str]) -> Credentials:
    """The security options given, checked on their own (the environment fills in the rest in
    each process, dmq.client._security); empty when none is."""
    given = {keyword: opts[name] for name, keyword in SECURITY_OPTIONS.items() if name in opts}
    for name, keyword in SECURITY_OPTIONS.items():
        if keyword in given and not given[keyword]:
            raise OptionError(f"option {name!r} must not be empty")
    if ("ssl_certfile" in given) != ("ssl_keyfile" in given):
        raise OptionError("options 'sslCertfile' and 'sslKeyfile' go together (a client certificate and its key)")
    try:
        ClientSecurity.from_settings(given, env={})
    except SecurityConfigError as e:
        raise OptionError(f"security options: {e}") from None
    return tuple(sorted(given.items()))


@dataclass(frozen=True)
class OffsetSpec:
    """Where a range starts or ends: earliest, latest, per-partition offsets, or a time.

    kind: "earliest" | "latest" | "specific" (offsets: (topic, partition) -> offset, where -2 and
    -1 mean earliest / latest) | "timestamp" (timestamp_ms for every partition) | "timestamps"
    (offsets: (topic, partition) -> timestamp_ms, from the *OffsetsByTimestamp options).
    """

    kind: str
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    timestamp_ms: int = 0

    def describe(self) -> str:
        if self.kind == "specific":
            return f"specific offsets for {len(self.offsets)} partitions"
        if self.kind == "timestamp":
            return f"timestamp {self.timestamp_ms}"
        if self.kind == "timestamps":
            return f"timestamps for {len(self.offsets)} partitions"
        return self.kind


@dataclass(frozen=True)
class SourceOptions:
    bootstrap: str
    topics: tuple[str, ...] = ()  # subscribe
    assign: dict[str, tuple[int, ...]] | None = None
    pattern: str | None = None  # subscribePattern: matched against whole topic names when planning
    starting: OffsetSpec = OffsetSpec("earliest")
    ending: OffsetSpec = OffsetSpec("latest")
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    include_headers: bool = False
    fail_on_data_loss: bool = True
    group_id: str | None = None
    fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    # The security options given, as client keywords (ssl_cafile=..., token=...); not shown: a token.
    credentials: Credentials = field(default=(), repr=False)

    @property
    def subscribed_topics(self) -> tuple[str, ...]:
        """The topics named by subscribe or assign (a pattern's are known only when planning)."""
        return tuple(sorted(self.assign)) if self.assign is not None else self.topics


@dataclass(frozen=True)
class SinkOptions:
    bootstrap: str
    topic: str | None = None
    compression: str = "none"
    linger_ms: int | None = None
    batch_size: int | None = None
    credentials: Credentials = field(default=(), repr=False)


# The client library's name of the address setting, and Spark's Kafka source's, are accepted for
# `bootstrap` (one address setting name everywhere, as users bring it from elsewhere).
_BOOTSTRAP_ALIASES = {"bootstrap_servers": "bootstrap", "bootstrap.servers": "bootstrap",
                      "kafka.bootstrap.servers": "bootstrap"}


def _normalise(options: Mapping[str, Any], allowed: tuple[str, ...], what: str) -> dict[str, str]:
    allowed_lower = {a.lower() for a in allowed}
    out: dict[str, str] = {}
    given_as: dict[str, str] = {}  # DMQ option -> the Kafka name it was given as
    kafka_checked: dict[str, str] = {}
    for key, value in options.items():
        k = str(key).lower()
        if k in _NOT_APPLICABLE:
            name, why = _NOT_APPLICABLE[k]
            raise OptionError(f"option {name!r} of Spark's Kafka source does not apply to DMQ: {why}")
        if k in (c.lower() for c in _KAFKA_CHECKED):
            if value is not None:
                kafka_checked[_KAFKA_CANONICAL[k]] = str(value).strip()
            continue
        alias = _KAFKA_CANONICAL.get(k)
        if alias in KAFKA_ALIASES and KAFKA_ALIASES[alias].lower() in allowed_lower:
            if value is None:
                continue
            target = KAFKA_ALIASES[alias]
            if target in out:
                other = given_as.get(target, target)
                raise OptionError(f"option {alias!r} repeats {target!r}" + (f" (given as {other!r})" if other != target else "")
                                  + ": give the setting once")
            given_as[target] = alias
            out[target] = str(value).strip()
            continue
        if k.startswith("kafka.") and k not in _BOOTSTRAP_ALIASES:
            known = sorted(a for a, target in KAFKA_ALIASES.items() if target.lower() in allowed_lower)
            raise OptionError(
                f"unknown option {key!r}: DMQ takes these Kafka settings in the {what}: kafka.bootstrap.servers, "
                f"{', '.join(known + list(_KAFKA_CHECKED))}"
            )
        if k in _BOOTSTRAP_ALIASES and "bootstrap" in allowed_lower:
            if value is not None and "bootstrap" in out:
                raise OptionError(f"option {key!r} repeats 'bootstrap': give the coordinator address once")
            k = _BOOTSTRAP_ALIASES[k]
        if k in _SPARK_OWNED:
            continue
        if k not in allowed_lower:
            hint = ""
            if k in _CANONICAL:
                hint = f" ({_CANONICAL[k]!r} is not a {what} option)"
            raise OptionError(
                f"unknown option {key!r} for the dmq {what}{hint}; known options: {', '.join(allowed)}"
            )
        if value is None:
            continue
        if k == "bootstrap" and "bootstrap" in out:
            raise OptionError(f"option {key!r} repeats 'bootstrap': give the coordinator address once")
        if _CANONICAL[k] in given_as:
            raise OptionError(f"option {given_as[_CANONICAL[k]]!r} repeats {_CANONICAL[k]!r}: give the setting once")
        out[_CANONICAL[k]] = str(value).strip()
    _check_kafka_settings(kafka_checked, out, given_as)
    return out


def _check_kafka_settings(kafka: dict[str, str], opts: dict[str, str], given_as: dict[str, str]) -> None:
    """Kafka settings DMQ has no option for must agree with what it does."""
    protocol = kafka.get("kafka.security.protocol")
    if protocol is not None:
        if protocol.upper() not in ("PLAINTEXT", "SSL"):
            raise OptionError(
                f"option 'kafka.security.protocol' must be PLAINTEXT or SSL, got {protocol!r}: DMQ authenticates "
                f"with a token (kafka.sasl.oauthbearer.token) over either"
            )
        tls = [given_as.get(n, n) for n in ("sslCafile", "sslCertfile", "sslKeyfile") if n in opts]
        if protocol.upper() == "PLAINTEXT" and tls:
            raise OptionError(f"option 'kafka.security.protocol'=PLAINTEXT contradicts the TLS option {tls[0]!r}")
    mechanism = kafka.get("kafka.sasl.mechanism")
    if mechanism is not None and mechanism.upper() != "OAUTHBEARER":
        raise OptionError(
            f"option 'kafka.sasl.mechanism' must be OAUTHBEARER (DMQ's token, kafka.sasl.oauthbearer.token), got {mechanism!r}"
        )
    if given_as.get("sslCafile") == "kafka.ssl.truststore.location" or "kafka.ssl.truststore.type" in kafka:
        kind = kafka.get("kafka.ssl.truststore.type")
        if kind is None or kind.upper() != "PEM":
            raise OptionError(
                "DMQ reads the CA as a PEM file: give kafka.ssl.truststore.type=PEM with kafka.ssl.truststore.location "
                f"(Kafka's default type is JKS), or kafka.ssl.ca.location; got type {kind!r}"
            )


def _bool(opts: dict[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name)
    if raw is None:
        return default
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    raise OptionError(f"option {name!r} must be 'true' or 'false', got {raw!r}")


def _int(opts: dict[str, str], name: str, *, minimum: int, maximum: int | None = None) -> int | None:
    raw = opts.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name!r} must be an integer, got {raw!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"within {minimum}..{maximum}"
        raise OptionError(f"option {name!r} must be {bound}, got {value}")
    return value


def _json(name: str, raw: str, example: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError as e:
        raise OptionError(f"option {name!r} is not valid JSON ({e.msg}); expected e.g. {example}") from None


def _parse_bootstrap(raw: str | None) -> str:
    if not raw:
        raise OptionError("option 'bootstrap' is required: the coordinator address, e.g. 'localhost:9092'")
    if "," in raw:
        # The workers each connect on their own: one address, so every task uses the same coordinator.
        raise OptionError(f"option 'bootstrap' takes one address, the coordinator's host:port, got {raw!r}")
    host, sep, port = raw.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise OptionError(f"option 'bootstrap' must be host:port, got {raw!r}")
    return raw


def _parse_subscribe(raw: str) -> tuple[str, ...]:
    topics = [t.strip() for t in raw.split(",")]
    if not raw or any(not t for t in topics):
        raise OptionError(f"option 'subscribe' must be a comma-separated list of topic names, got {raw!r}")
    return tuple(dict.fromkeys(topics))


def _parse_assign(raw: str) -> dict[str, tuple[int, ...]]:
    example = '{"orders": [0, 1]}'
    data = _json("assign", raw, example)
    if not isinstance(data, dict) or not data:
        raise OptionError(f"option 'assign' must be a JSON object of topic -> partitions, e.g. {example}")
    out: dict[str, tuple[int, ...]] = {}
    for topic, parts in data.items():
        if not topic:
            raise OptionError("option 'assign' names an empty topic")
        if (
            not isinstance(parts, list)
            or not parts
            or any(not isinstance(p, int) or isinstance(p, bool) or p < 0 for p in parts)
        ):
            raise OptionError(
                f"option 'assign': topic {topic!r} must map to a non-empty list of partition numbers >= 0, "
                f"got {parts!r}"
            )
        out[topic] = tuple(sorted(set(parts)))
    return out


def _parse_offsets(name: str, raw: str, *, allow: tuple[str, ...]) -> OffsetSpec:
    low = raw.lower()
    if low in ("earliest", "latest"):
        if low not in allow:
            raise OptionError(_not_allowed(name, low))
        return OffsetSpec(low)
    if not raw.startswith("{"):
        raise OptionError(
            f"option {name!r} must be 'earliest', 'latest' or per-partition JSON such as "
            f'{{"orders": {{"0": 23, "1": -2}}}}, got {raw!r}'
        )
    offsets: dict[tuple[str, int], int] = {}
    for topic, partition, off in _per_partition(name, raw, "offset", '{"orders": {"0": 23, "1": -2}}'):
        if not isinstance(off, int) or isinstance(off, bool) or off < EARLIEST:
            raise OptionError(
                f"option {name!r}: offset of {topic}[{partition}] must be an integer >= 0, "
                f"or -2 (earliest) / -1 (latest); got {off!r}"
            )
        if off == EARLIEST and "earliest" not in allow:
            raise OptionError(_not_allowed(name, "earliest (-2)"))
        if off == LATEST and "latest" not in allow:
            raise OptionError(_not_allowed(name, "latest (-1)"))
        offsets[(topic, partition)] = off
    return OffsetSpec("specific", offsets)


def _per_partition(name: str, raw: str, what: str, example: str) -> Iterator[tuple[str, int, object]]:
    """Option `name`'s JSON object of topic -> {partition: <what>}: (topic, partition, value) for
    each entry, the value for the caller to check."""
    data = _json(name, raw, example)
    if not isinstance(data, dict) or not data:
        raise OptionError(f"option {name!r} must be a JSON object of topic -> {{partition: {what}}}, e.g. {example}")
    for topic, parts in data.items():
        if not isinstance(parts, dict) or not parts:
            raise OptionError(f"option {name!r}: topic {topic!r} must map to an object of partition -> {what}")
        for p, value in parts.items():
            yield topic, _partition_key(name, topic, p), value


def _partition_key(name: str, topic: str, p: str) -> int:
    """A JSON object's partition key: a number >= 0 (both per-partition options spell them so)."""
    try:
        partition = int(p)
    except ValueError:
        raise OptionError(f"option {name!r}: partition {p!r} of topic {topic!r} is not a number") from None
    if partition < 0:
        raise OptionError(f"option {name!r}: partition {partition} of topic {topic!r} must be >= 0")
    return partition


def _not_allowed(name: str, what: str) -> str:
    if name == "startingOffsets":
        return (
            f"option 'startingOffsets' cannot be {what} in a batch query (it would read nothing); "
            f"use 'earliest', offsets or startingTimestamp"
        )
    return f"option 'endingOffsets' cannot be {what} (it would read nothing); use 'latest', offsets or endingTimestamp"


def _parse_pattern(raw: str) -> str:
    if not raw:
        raise OptionError("option 'subscribePattern' must not be empty")
    try:
        re.compile(raw)
    except re.error as e:
        raise OptionError(f"option 'subscribePattern' is not a valid regular expression ({e}): {raw!r}") from None
    return raw


def _parse_timestamps(name: str, raw: str) -> OffsetSpec:
    stamps: dict[tuple[str, int], int] = {}
    example = '{"orders": {"0": 1700000000000, "1": 1700000000000}}'
    for topic, partition, ts in _per_partition(name, raw, "timestamp_ms", example):
        if not isinstance(ts, int) or isinstance(ts, bool) or ts < 0:
            raise OptionError(
                f"option {name!r}: timestamp of {topic}[{partition}] must be an integer >= 0 (ms since the "
                f"epoch), got {ts!r}"
            )
        stamps[(topic, partition)] = ts
    return OffsetSpec("timestamps", stamps)


def _position(
    opts: dict[str, str], offsets_name: str, ts_name: str, default: OffsetSpec, allow: tuple[str, ...]
) -> OffsetSpec:
    by_ts_name = f"{offsets_name}ByTimestamp"
    given = [n for n in (offsets_name, by_ts_name, ts_name) if n in opts]
    if len(given) > 1:
        raise OptionError(
            f"options {given[0]!r} and {given[1]!r} contradict each other: give only one of them"
        )
    if by_ts_name in opts:
        return _parse_timestamps(by_ts_name, opts[by_ts_name])
    if ts_name in opts:
        ts = _int(opts, ts_name, minimum=0)
        assert ts is not None
        return OffsetSpec("timestamp", timestamp_ms=ts)
    if offsets_name in opts:
        return _parse_offsets(offsets_name, opts[offsets_name], allow=allow)
    return default


def parse_source_options(options: Mapping[str, Any], *, streaming: bool) -> SourceOptions:
    """Check every option for a batch (`streaming=False`) or streaming read."""
    opts = _normalise(options, SOURCE_OPTIONS, "source")
    bootstrap = _parse_bootstrap(opts.get("bootstrap"))

    ways = [n for n in ("subscribe", "subscribePattern", "assign") if n in opts]
    if len(ways) != 1:
        raise OptionError(
            "give exactly one of the options 'subscribe', 'subscribePattern' or 'assign' (topic names, a regex "
            "over topic names, JSON topic -> partitions)" + (f"; {' and '.join(ways)} were given" if ways else "")
        )
    topics = _parse_subscribe(opts["subscribe"]) if "subscribe" in opts else ()
    assign = _parse_assign(opts["assign"]) if "assign" in opts else None
    pattern = _parse_pattern(opts["subscribePattern"]) if "subscribePattern" in opts else None

    if streaming:
        for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if name in opts:
                raise OptionError(f"option {name!r} is for batch queries only; a streaming query has no end")
        starting = _position(
            opts, "startingOffsets", "startingTimestamp", OffsetSpec("latest"), ("earliest", "latest")
        )
        ending = OffsetSpec("latest")
    else:
        for name, why in (
            ("maxOffsetsPerTrigger", "it limits micro-batches"),
            ("groupId", "a batch query has no progress to commit"),
        ):
            if name in opts:
                raise OptionError(f"option {name!r} is for streaming queries only ({why})")
        starting = _position(opts, "startingOffsets", "startingTimestamp", OffsetSpec("earliest"), ("earliest",))
        ending = _position(opts, "endingOffsets", "endingTimestamp", OffsetSpec("latest"), ("latest",))

    for spec in (starting, ending):
        if spec.kind in ("specific", "timestamps"):
            _check_spec_topics(spec, topics, assign, pattern)

    group_id = opts.get("groupId")
    if group_id is not None and not group_id:
        raise OptionError("option 'groupId' must not be empty")
    fetch_max_bytes = _int(opts, "fetchMaxBytes", minimum=1024, maximum=MAX_FETCH_MAX_BYTES)
    poll_timeout_ms = _int(opts, "pollTimeoutMs", minimum=1)
    return SourceOptions(
        bootstrap=bootstrap,
        topics=topics,
        assign=assign,
        pattern=pattern,
        starting=starting,
        ending=ending,
        max_offsets_per_trigger=_int(opts, "maxOffsetsPerTrigger", minimum=1),
        min_partitions=_int(opts, "minPartitions", minimum=1),
        include_headers=_bool(opts, "includeHeaders", False),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        group_id=group_id,
        fetch_max_bytes=fetch_max_bytes or DEFAULT_FETCH_MAX_BYTES,
        poll_timeout_ms=poll_timeout_ms or DEFAULT_POLL_TIMEOUT_MS,
        credentials=_credentials(opts),
    )


def _check_spec_topics(
    spec: OffsetSpec, topics: tuple[str, ...], assign: dict[str, tuple[int, ...]] | None, pattern: str | None
) -> None:
    """Offsets JSON may only name what is read; with `assign` it must name exactly that.

    With `subscribe` the partition count is only known from metadata, so completeness is checked
    when offsets are resolved (resolve_spec); with `subscribePattern` the topics too.
    """
    named = {t for t, _ in spec.offsets}
    if pattern is not None:
        unmatched = sorted(t for t in named if not re.fullmatch(pattern, t))
        if unmatched:
            raise OptionError(f"offsets JSON names topics that subscribePattern {pattern!r} does not match: {unmatched}")
        return
    wanted = set(assign) if assign is not None else set(topics)
    extra = named - wanted
    if extra:
        raise OptionError(
            f"offsets JSON names topics that are not read: {sorted(extra)}; read topics: {sorted(wanted)}"
        )
    if assign is not None:
        wanted_tps = {(t, p) for t, ps in assign.items() for p in ps}
        if set(spec.offsets) != wanted_tps:
            missing = sorted(wanted_tps - set(spec.offsets))
            unknown = sorted(set(spec.offsets) - wanted_tps)
            raise OptionError(
                "offsets JSON must name exactly the assigned partitions"
                + (f"; missing: {_tps(missing)}" if missing else "")
                + (f"; not assigned: {_tps(unknown)}" if unknown else "")
            )


def _tps(tps: list[tuple[str, int]]) -> str:
    return ", ".join(f"{t}[{p}]" for t, p in tps)


def parse_sink_options(options: Mapping[str, Any]) -> SinkOptions:
    opts = _normalise(options, SINK_OPTIONS, "sink")
    bootstrap = _parse_bootstrap(opts.get("bootstrap"))
    topic = opts.get("topic")
    if topic is not None and not topic:
        raise OptionError("option 'topic' must not be empty")
    compression = opts.get("compression", "none").lower()
    if compression not in ("none", "zstd", "lz4"):
        raise OptionError(f"option 'compression' must be one of none, zstd, lz4; got {opts['compression']!r}")
    return SinkOptions(
        bootstrap=bootstrap,
        topic=topic,
        compression=compression,
        linger_ms=_int(opts, "lingerMs", minimum=0),
        batch_size=_int(opts, "batchSize", minimum=1),
        credentials=_credentials(opts),
    )
