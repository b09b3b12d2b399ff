"""Proto conversions of the metadata service: topic settings to and from pb.TopicConfig, and the
cluster as clients see it (pb.TopicInfo per topic, pb.BrokerInfo per broker), read from the topic
records and the brokers' sessions (dmq.coordinator.membership) at the moment of the answer.
"""

from __future__ import annotations

from collections.abc import Iterable

from dmq.coordinator.membership import BrokerMembership
from dmq.coordinator.metastore.base import NO_LEADER, TopicRecord
from dmq.proto import dmq_pb2 as pb
from dmq.proto import limits
from dmq.proto.topic_settings import TopicSettings

_CONFIG_FIELDS = (*limits.TOPIC_CONFIG_RANGES, "kind", "unclean_leader_election")


def topic_config_to_proto(settings: TopicSettings) -> pb.TopicConfig:
    return pb.TopicConfig(**settings.to_dict())


def topic_config_from_proto(config: pb.TopicConfig) -> TopicSettings:
    return TopicSettings(**{f: getattr(config, f) for f in _CONFIG_FIELDS if config.HasField(f)})


def topic_info(brokers: BrokerMembership, record: TopicRecord) -> pb.TopicInfo:
    live = set(brokers.live_broker_ids())
    partitions = []
    for p in range(record.partition_count):
        state = record.states.get(p)
        leader = state.leader if state else NO_LEADER
        partitions.append(
            pb.PartitionInfo(
                partition=p,
                leader_id=leader,
                leader_address=(brokers.broker_address(leader) or "") if leader != NO_LEADER else "",
                leader_alive=leader in live,
                replicas=state.replicas if state else (),
                isr=state.isr if state else (),
                leader_epoch=state.leader_epoch if state else 0,
            )
        )
    return pb.TopicInfo(
        name=record.name,
        partition_count=record.partition_count,
        partitions=partitions,
        config=topic_config_to_proto(record.config),
        created_ms=record.created_ms,
    )


def broker_infos(brokers: BrokerMembership, topics: Iterable[TopicRecord]) -> list[pb.BrokerInfo]:
    led: dict[int, int] = {}
    followed: dict[int, int] = {}
    under: dict[int, int] = {}
    for t in topics:
        for state in t.states.values():
            led[state.leader] = led.get(state.leader, 0) + 1
            if state.under_replicated:
                under[state.leader] = under.get(state.leader, 0) + 1
            for b in state.replicas:
                if b != state.leader:
                    followed[b] = followed.get(b, 0) + 1
    return [
        pb.BrokerInfo(
            broker_id=b.broker_id,
            host=b.host,
            port=b.port,
            alive=brokers.is_broker_alive(b.broker_id),
            last_heartbeat_ms=brokers.last_heartbeat_ms(b.broker_id),
            partitions_led=led.get(b.broker_id, 0),
            rack=b.rack,
            partitions_followed=followed.get(b.broker_id, 0),
            partitions_under_replicated=under.get(b.broker_id, 0),
        )
        for b in brokers.brokers()
    ]
