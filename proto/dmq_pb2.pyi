from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NONE: _ClassVar[ErrorCode]
    OFFSET_OUT_OF_RANGE: _ClassVar[ErrorCode]
    UNKNOWN_TOPIC_OR_PARTITION: _ClassVar[ErrorCode]
    NOT_LEADER: _ClassVar[ErrorCode]
    INVALID_REQUEST: _ClassVar[ErrorCode]
    STORAGE_ERROR: _ClassVar[ErrorCode]
    CORRUPT_DATA: _ClassVar[ErrorCode]
    FENCED_LEADER_EPOCH: _ClassVar[ErrorCode]
    UNKNOWN_LEADER_EPOCH: _ClassVar[ErrorCode]

class Acks(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACKS_ALL: _ClassVar[Acks]
    ACKS_NONE: _ClassVar[Acks]
    ACKS_LEADER: _ClassVar[Acks]

class EventGroupAction(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_GROUP_STATUS: _ClassVar[EventGroupAction]
    EVENT_GROUP_REGISTER: _ClassVar[EventGroupAction]
    EVENT_GROUP_STOP: _ClassVar[EventGroupAction]
    EVENT_GROUP_START: _ClassVar[EventGroupAction]
    EVENT_GROUP_RESET: _ClassVar[EventGroupAction]

class SubscriptionMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUBSCRIPTION_MODE_UNSPECIFIED: _ClassVar[SubscriptionMode]
    SUBSCRIPTION_MODE_ALL: _ClassVar[SubscriptionMode]
    SUBSCRIPTION_MODE_NEW: _ClassVar[SubscriptionMode]
    SUBSCRIPTION_MODE_TIMESTAMP: _ClassVar[SubscriptionMode]

class GroupStateCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GROUP_STATE_EMPTY: _ClassVar[GroupStateCode]
    GROUP_STATE_PREPARING_REBALANCE: _ClassVar[GroupStateCode]
    GROUP_STATE_REBALANCING: _ClassVar[GroupStateCode]
    GROUP_STATE_STABLE: _ClassVar[GroupStateCode]
NONE: ErrorCode
OFFSET_OUT_OF_RANGE: ErrorCode
UNKNOWN_TOPIC_OR_PARTITION: ErrorCode
NOT_LEADER: ErrorCode
INVALID_REQUEST: ErrorCode
STORAGE_ERROR: ErrorCode
CORRUPT_DATA: ErrorCode
FENCED_LEADER_EPOCH: ErrorCode
UNKNOWN_LEADER_EPOCH: ErrorCode
ACKS_ALL: Acks
ACKS_NONE: Acks
ACKS_LEADER: Acks
EVENT_GROUP_STATUS: EventGroupAction
EVENT_GROUP_REGISTER: EventGroupAction
EVENT_GROUP_STOP: EventGroupAction
EVENT_GROUP_START: EventGroupAction
EVENT_GROUP_RESET: EventGroupAction
SUBSCRIPTION_MODE_UNSPECIFIED: SubscriptionMode
SUBSCRIPTION_MODE_ALL: SubscriptionMode
SUBSCRIPTION_MODE_NEW: SubscriptionMode
SUBSCRIPTION_MODE_TIMESTAMP: SubscriptionMode
GROUP_STATE_EMPTY: GroupStateCode
GROUP_STATE_PREPARING_REBALANCE: GroupStateCode
GROUP_STATE_REBALANCING: GroupStateCode
GROUP_STATE_STABLE: GroupStateCode

class TopicPartition(_message.Message):
    __slots__ = ("topic", "partition")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ...) -> None: ...

class TopicConfig(_message.Message):
    __slots__ = ("retention_ms", "retention_bytes", "segment_bytes", "segment_ms", "max_message_bytes", "dedup_window_ms", "delay_ms", "max_wait_ms", "window_buffer_ms", "lease_ms", "max_delivery_attempts", "max_queue_size", "kind", "replication_factor", "min_insync_replicas", "unclean_leader_election")
    RETENTION_MS_FIELD_NUMBER: _ClassVar[int]
    RETENTION_BYTES_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEDUP_WINDOW_MS_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_BUFFER_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_DELIVERY_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    MIN_INSYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    UNCLEAN_LEADER_ELECTION_FIELD_NUMBER: _ClassVar[int]
    retention_ms: int
    retention_bytes: int
    segment_bytes: int
    segment_ms: int
    max_message_bytes: int
    dedup_window_ms: int
    delay_ms: int
    max_wait_ms: int
    window_buffer_ms: int
    lease_ms: int
    max_delivery_attempts: int
    max_queue_size: int
    kind: str
    replication_factor: int
    min_insync_replicas: int
    unclean_leader_election: bool
    def __init__(self, retention_ms: _Optional[int] = ..., retention_bytes: _Optional[int] = ..., segment_bytes: _Optional[int] = ..., segment_ms: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., dedup_window_ms: _Optional[int] = ..., delay_ms: _Optional[int] = ..., max_wait_ms: _Optional[int] = ..., window_buffer_ms: _Optional[int] = ..., lease_ms: _Optional[int] = ..., max_delivery_attempts: _Optional[int] = ..., max_queue_size: _Optional[int] = ..., kind: _Optional[str] = ..., replication_factor: _Optional[int] = ..., min_insync_replicas: _Optional[int] = ..., unclean_leader_election: _Optional[bool] = ...) -> None: ...

class PartitionInfo(_message.Message):
    __slots__ = ("partition", "leader_id", "leader_address", "leader_alive", "replicas", "isr", "leader_epoch")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LEADER_ALIVE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    partition: int
    leader_id: int
    leader_address: str
    leader_alive: bool
    replicas: _containers.RepeatedScalarFieldContainer[int]
    isr: _containers.RepeatedScalarFieldContainer[int]
    leader_epoch: int
    def __init__(self, partition: _Optional[int] = ..., leader_id: _Optional[int] = ..., leader_address: _Optional[str] = ..., leader_alive: _Optional[bool] = ..., replicas: _Optional[_Iterable[int]] = ..., isr: _Optional[_Iterable[int]] = ..., leader_epoch: _Optional[int] = ...) -> None: ...

class PartitionState(_message.Message):
    __slots__ = ("topic", "partition", "leader_id", "leader_address", "leader_epoch", "replicas", "isr", "partition_epoch")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    PARTITION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    leader_id: int
    leader_address: str
    leader_epoch: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    isr: _containers.RepeatedScalarFieldContainer[int]
    partition_epoch: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., leader_id: _Optional[int] = ..., leader_address: _Optional[str] = ..., leader_epoch: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., isr: _Optional[_Iterable[int]] = ..., partition_epoch: _Optional[int] = ...) -> None: ...

class TopicInfo(_message.Message):
    __slots__ = ("name", "partition_count", "partitions", "config", "created_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITION_COUNT_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    partition_count: int
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionInfo]
    config: TopicConfig
    created_ms: int
    def __init__(self, name: _Optional[str] = ..., partition_count: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[PartitionInfo, _Mapping]]] = ..., config: _Optional[_Union[TopicConfig, _Mapping]] = ..., created_ms: _Optional[int] = ...) -> None: ...

class BrokerInfo(_message.Message):
    __slots__ = ("broker_id", "host", "port", "alive", "last_heartbeat_ms", "partitions_led", "rack", "partitions_followed", "partitions_under_replicated")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_MS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_LED_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FOLLOWED_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_UNDER_REPLICATED_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    host: str
    port: int
    alive: bool
    last_heartbeat_ms: int
    partitions_led: int
    rack: str
    partitions_followed: int
    partitions_under_replicated: int
    def __init__(self, broker_id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., alive: _Optional[bool] = ..., last_heartbeat_ms: _Optional[int] = ..., partitions_led: _Optional[int] = ..., rack: _Optional[str] = ..., partitions_followed: _Optional[int] = ..., partitions_under_replicated: _Optional[int] = ...) -> None: ...

class ProduceRequest(_message.Message):
    __slots__ = ("topic", "partition", "batch", "acks")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    batch: bytes
    acks: Acks
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., batch: _Optional[bytes] = ..., acks: _Optional[_Union[Acks, str]] = ...) -> None: ...

class ProduceResponse(_message.Message):
    __slots__ = ("base_offset", "log_append_time_ms", "log_start_offset", "duplicate", "record_offsets")
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_APPEND_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    RECORD_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    base_offset: int
    log_append_time_ms: int
    log_start_offset: int
    duplicate: bool
    record_offsets: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, base_offset: _Optional[int] = ..., log_append_time_ms: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., duplicate: _Optional[bool] = ..., record_offsets: _Optional[_Iterable[int]] = ...) -> None: ...

class FetchPartition(_message.Message):
    __slots__ = ("topic", "partition", "offset", "max_bytes", "current_leader_epoch")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offset: int
    max_bytes: int
    current_leader_epoch: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., max_bytes: _Optional[int] = ..., current_leader_epoch: _Optional[int] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("partitions", "max_wait_ms", "min_bytes", "max_bytes", "replica_id")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[FetchPartition]
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    replica_id: int
    def __init__(self, partitions: _Optional[_Iterable[_Union[FetchPartition, _Mapping]]] = ..., max_wait_ms: _Optional[int] = ..., min_bytes: _Optional[int] = ..., max_bytes: _Optional[int] = ..., replica_id: _Optional[int] = ...) -> None: ...

class FetchPartitionResult(_message.Message):
    __slots__ = ("topic", "partition", "error", "error_message", "high_watermark", "log_start_offset", "records", "log_end_offset", "leader_epoch", "epochs")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error: ErrorCode
    error_message: str
    high_watermark: int
    log_start_offset: int
    records: bytes
    log_end_offset: int
    leader_epoch: int
    epochs: _containers.RepeatedCompositeFieldContainer[EpochStart]
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., high_watermark: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., records: _Optional[bytes] = ..., log_end_offset: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., epochs: _Optional[_Iterable[_Union[EpochStart, _Mapping]]] = ...) -> None: ...

class EpochStart(_message.Message):
    __slots__ = ("epoch", "start_offset")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    start_offset: int
    def __init__(self, epoch: _Optional[int] = ..., start_offset: _Optional[int] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("partitions",)
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[FetchPartitionResult]
    def __init__(self, partitions: _Optional[_Iterable[_Union[FetchPartitionResult, _Mapping]]] = ...) -> None: ...

class OffsetQuery(_message.Message):
    __slots__ = ("topic", "partition", "timestamp_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    timestamp_ms: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., timestamp_ms: _Optional[int] = ...) -> None: ...

class ListOffsetsRequest(_message.Message):
    __slots__ = ("queries",)
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    queries: _containers.RepeatedCompositeFieldContainer[OffsetQuery]
    def __init__(self, queries: _Optional[_Iterable[_Union[OffsetQuery, _Mapping]]] = ...) -> None: ...

class OffsetAnswer(_message.Message):
    __slots__ = ("topic", "partition", "error", "error_message", "offset", "log_start_offset", "log_end_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error: ErrorCode
    error_message: str
    offset: int
    log_start_offset: int
    log_end_offset: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., offset: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., log_end_offset: _Optional[int] = ...) -> None: ...

class ListOffsetsResponse(_message.Message):
    __slots__ = ("answers",)
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[OffsetAnswer]
    def __init__(self, answers: _Optional[_Iterable[_Union[OffsetAnswer, _Mapping]]] = ...) -> None: ...

class PartitionOffset(_message.Message):
    __slots__ = ("topic", "partition", "offset", "metadata")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offset: int
    metadata: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., metadata: _Optional[str] = ...) -> None: ...

class CommitOffsetsRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "generation", "offsets", "member_secret")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_SECRET_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    generation: int
    offsets: _containers.RepeatedCompositeFieldContainer[PartitionOffset]
    member_secret: str
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., generation: _Optional[int] = ..., offsets: _Optional[_Iterable[_Union[PartitionOffset, _Mapping]]] = ..., member_secret: _Optional[str] = ...) -> None: ...

class CommitOffsetsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FetchCommittedOffsetsRequest(_message.Message):
    __slots__ = ("group_id", "partitions")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    partitions: _containers.RepeatedCompositeFieldContainer[TopicPartition]
    def __init__(self, group_id: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[TopicPartition, _Mapping]]] = ...) -> None: ...

class FetchCommittedOffsetsResponse(_message.Message):
    __slots__ = ("offsets",)
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    offsets: _containers.RepeatedCompositeFieldContainer[PartitionOffset]
    def __init__(self, offsets: _Optional[_Iterable[_Union[PartitionOffset, _Mapping]]] = ...) -> None: ...

class CreatePartitionsRequest(_message.Message):
    __slots__ = ("topic", "partitions", "config", "topic_partition_count", "states")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    TOPIC_PARTITION_COUNT_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    config: TopicConfig
    topic_partition_count: int
    states: _containers.RepeatedCompositeFieldContainer[PartitionState]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ..., config: _Optional[_Union[TopicConfig, _Mapping]] = ..., topic_partition_count: _Optional[int] = ..., states: _Optional[_Iterable[_Union[PartitionState, _Mapping]]] = ...) -> None: ...

class CreatePartitionsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeletePartitionsRequest(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class DeletePartitionsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DeleteGroupOffsetsRequest(_message.Message):
    __slots__ = ("group_id",)
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    def __init__(self, group_id: _Optional[str] = ...) -> None: ...

class DeleteGroupOffsetsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeLogsRequest(_message.Message):
    __slots__ = ("partitions", "verify")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[TopicPartition]
    verify: bool
    def __init__(self, partitions: _Optional[_Iterable[_Union[TopicPartition, _Mapping]]] = ..., verify: _Optional[bool] = ...) -> None: ...

class LogInfo(_message.Message):
    __slots__ = ("topic", "partition", "error", "log_start_offset", "log_end_offset", "size_bytes", "segment_count", "status", "status_detail", "problems", "batches_checked", "indexes_rebuilt")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SEGMENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STATUS_DETAIL_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_CHECKED_FIELD_NUMBER: _ClassVar[int]
    INDEXES_REBUILT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error: ErrorCode
    log_start_offset: int
    log_end_offset: int
    size_bytes: int
    segment_count: int
    status: str
    status_detail: str
    problems: _containers.RepeatedScalarFieldContainer[str]
    batches_checked: int
    indexes_rebuilt: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error: _Optional[_Union[ErrorCode, str]] = ..., log_start_offset: _Optional[int] = ..., log_end_offset: _Optional[int] = ..., size_bytes: _Optional[int] = ..., segment_count: _Optional[int] = ..., status: _Optional[str] = ..., status_detail: _Optional[str] = ..., problems: _Optional[_Iterable[str]] = ..., batches_checked: _Optional[int] = ..., indexes_rebuilt: _Optional[_Iterable[str]] = ...) -> None: ...

class DescribeLogsResponse(_message.Message):
    __slots__ = ("logs",)
    LOGS_FIELD_NUMBER: _ClassVar[int]
    logs: _containers.RepeatedCompositeFieldContainer[LogInfo]
    def __init__(self, logs: _Optional[_Iterable[_Union[LogInfo, _Mapping]]] = ...) -> None: ...

class FindTraceRequest(_message.Message):
    __slots__ = ("trace_id", "max_records")
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_FIELD_NUMBER: _ClassVar[int]
    trace_id: str
    max_records: int
    def __init__(self, trace_id: _Optional[str] = ..., max_records: _Optional[int] = ...) -> None: ...

class TracePartition(_message.Message):
    __slots__ = ("topic", "partition", "offsets", "records")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offsets: _containers.RepeatedScalarFieldContainer[int]
    records: bytes
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offsets: _Optional[_Iterable[int]] = ..., records: _Optional[bytes] = ...) -> None: ...

class FindTraceResponse(_message.Message):
    __slots__ = ("partitions", "truncated")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[TracePartition]
    truncated: bool
    def __init__(self, partitions: _Optional[_Iterable[_Union[TracePartition, _Mapping]]] = ..., truncated: _Optional[bool] = ...) -> None: ...

class UpdatePartitionStatesRequest(_message.Message):
    __slots__ = ("states", "controller_epoch")
    STATES_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedCompositeFieldContainer[PartitionState]
    controller_epoch: int
    def __init__(self, states: _Optional[_Iterable[_Union[PartitionState, _Mapping]]] = ..., controller_epoch: _Optional[int] = ...) -> None: ...

class UpdatePartitionStatesResponse(_message.Message):
    __slots__ = ("errors",)
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    errors: _containers.RepeatedCompositeFieldContainer[PartitionStateError]
    def __init__(self, errors: _Optional[_Iterable[_Union[PartitionStateError, _Mapping]]] = ...) -> None: ...

class PartitionStateError(_message.Message):
    __slots__ = ("topic", "partition", "error", "error_message")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error: ErrorCode
    error_message: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class OffsetForLeaderEpochRequest(_message.Message):
    __slots__ = ("queries", "replica_id")
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    queries: _containers.RepeatedCompositeFieldContainer[EpochQuery]
    replica_id: int
    def __init__(self, queries: _Optional[_Iterable[_Union[EpochQuery, _Mapping]]] = ..., replica_id: _Optional[int] = ...) -> None: ...

class EpochQuery(_message.Message):
    __slots__ = ("topic", "partition", "leader_epoch", "current_leader_epoch")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CURRENT_LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    leader_epoch: int
    current_leader_epoch: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., current_leader_epoch: _Optional[int] = ...) -> None: ...

class EpochEndOffset(_message.Message):
    __slots__ = ("topic", "partition", "error", "error_message", "leader_epoch", "end_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error: ErrorCode
    error_message: str
    leader_epoch: int
    end_offset: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error: _Optional[_Union[ErrorCode, str]] = ..., error_message: _Optional[str] = ..., leader_epoch: _Optional[int] = ..., end_offset: _Optional[int] = ...) -> None: ...

class OffsetForLeaderEpochResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[EpochEndOffset]
    def __init__(self, results: _Optional[_Iterable[_Union[EpochEndOffset, _Mapping]]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("type", "tags", "payload", "metadata")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    type: str
    tags: _containers.RepeatedScalarFieldContainer[str]
    payload: bytes
    metadata: bytes
    def __init__(self, type: _Optional[str] = ..., tags: _Optional[_Iterable[str]] = ..., payload: _Optional[bytes] = ..., metadata: _Optional[bytes] = ...) -> None: ...

class SequencedEvent(_message.Message):
    __slots__ = ("position", "event", "append_time_ms")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    APPEND_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    position: int
    event: Event
    append_time_ms: int
    def __init__(self, position: _Optional[int] = ..., event: _Optional[_Union[Event, _Mapping]] = ..., append_time_ms: _Optional[int] = ...) -> None: ...

class EventQueryItem(_message.Message):
    __slots__ = ("types", "tags")
    TYPES_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    types: _containers.RepeatedScalarFieldContainer[str]
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, types: _Optional[_Iterable[str]] = ..., tags: _Optional[_Iterable[str]] = ...) -> None: ...

class EventQuery(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[EventQueryItem]
    def __init__(self, items: _Optional[_Iterable[_Union[EventQueryItem, _Mapping]]] = ...) -> None: ...

class AppendCondition(_message.Message):
    __slots__ = ("fail_if_events_match", "after")
    FAIL_IF_EVENTS_MATCH_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    fail_if_events_match: EventQuery
    after: int
    def __init__(self, fail_if_events_match: _Optional[_Union[EventQuery, _Mapping]] = ..., after: _Optional[int] = ...) -> None: ...

class EventAppendRequest(_message.Message):
    __slots__ = ("topic", "events", "condition")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    CONDITION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    events: _containers.RepeatedCompositeFieldContainer[Event]
    condition: AppendCondition
    def __init__(self, topic: _Optional[str] = ..., events: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., condition: _Optional[_Union[AppendCondition, _Mapping]] = ...) -> None: ...

class EventAppendResponse(_message.Message):
    __slots__ = ("last_position", "append_time_ms", "status_code", "status_message", "status_metadata")
    LAST_POSITION_FIELD_NUMBER: _ClassVar[int]
    APPEND_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    STATUS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STATUS_METADATA_FIELD_NUMBER: _ClassVar[int]
    last_position: int
    append_time_ms: int
    status_code: int
    status_message: str
    status_metadata: _containers.RepeatedCompositeFieldContainer[Attribute]
    def __init__(self, last_position: _Optional[int] = ..., append_time_ms: _Optional[int] = ..., status_code: _Optional[int] = ..., status_message: _Optional[str] = ..., status_metadata: _Optional[_Iterable[_Union[Attribute, _Mapping]]] = ...) -> None: ...

class EventReadRequest(_message.Message):
    __slots__ = ("topic", "query", "after", "limit", "columnar")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    COLUMNAR_FIELD_NUMBER: _ClassVar[int]
    topic: str
    query: EventQuery
    after: int
    limit: int
    columnar: bool
    def __init__(self, topic: _Optional[str] = ..., query: _Optional[_Union[EventQuery, _Mapping]] = ..., after: _Optional[int] = ..., limit: _Optional[int] = ..., columnar: _Optional[bool] = ...) -> None: ...

class EventReadResponse(_message.Message):
    __slots__ = ("events", "head", "positions", "types", "tags", "payloads", "metadata", "append_times_ms", "read_to")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    TYPES_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    PAYLOADS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    APPEND_TIMES_MS_FIELD_NUMBER: _ClassVar[int]
    READ_TO_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[SequencedEvent]
    head: int
    positions: _containers.RepeatedScalarFieldContainer[int]
    types: _containers.RepeatedScalarFieldContainer[str]
    tags: _containers.RepeatedScalarFieldContainer[str]
    payloads: _containers.RepeatedScalarFieldContainer[bytes]
    metadata: _containers.RepeatedScalarFieldContainer[bytes]
    append_times_ms: _containers.RepeatedScalarFieldContainer[int]
    read_to: int
    def __init__(self, events: _Optional[_Iterable[_Union[SequencedEvent, _Mapping]]] = ..., head: _Optional[int] = ..., positions: _Optional[_Iterable[int]] = ..., types: _Optional[_Iterable[str]] = ..., tags: _Optional[_Iterable[str]] = ..., payloads: _Optional[_Iterable[bytes]] = ..., metadata: _Optional[_Iterable[bytes]] = ..., append_times_ms: _Optional[_Iterable[int]] = ..., read_to: _Optional[int] = ...) -> None: ...

class EventSubscribeRequest(_message.Message):
    __slots__ = ("topic", "query", "after")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    query: EventQuery
    after: int
    def __init__(self, topic: _Optional[str] = ..., query: _Optional[_Union[EventQuery, _Mapping]] = ..., after: _Optional[int] = ...) -> None: ...

class EventGroupControlRequest(_message.Message):
    __slots__ = ("topic", "group", "action")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    group: str
    action: EventGroupAction
    def __init__(self, topic: _Optional[str] = ..., group: _Optional[str] = ..., action: _Optional[_Union[EventGroupAction, str]] = ...) -> None: ...

class EventGroupStatus(_message.Message):
    __slots__ = ("group", "known", "active")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    group: str
    known: bool
    active: bool
    def __init__(self, group: _Optional[str] = ..., known: _Optional[bool] = ..., active: _Optional[bool] = ...) -> None: ...

class Attribute(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class EventClaimRef(_message.Message):
    __slots__ = ("topic", "group", "partition_key", "worker_id", "position")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PARTITION_KEY_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    group: str
    partition_key: str
    worker_id: str
    position: int
    def __init__(self, topic: _Optional[str] = ..., group: _Optional[str] = ..., partition_key: _Optional[str] = ..., worker_id: _Optional[str] = ..., position: _Optional[int] = ...) -> None: ...

class EventClaimRequest(_message.Message):
    __slots__ = ("topic", "group", "partition_by", "handled_types", "worker_id", "claim_timeout_ms", "limit", "ack", "more_acks", "releases", "max_claims")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PARTITION_BY_FIELD_NUMBER: _ClassVar[int]
    HANDLED_TYPES_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    CLAIM_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    MORE_ACKS_FIELD_NUMBER: _ClassVar[int]
    RELEASES_FIELD_NUMBER: _ClassVar[int]
    MAX_CLAIMS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    group: str
    partition_by: _containers.RepeatedScalarFieldContainer[str]
    handled_types: _containers.RepeatedScalarFieldContainer[str]
    worker_id: str
    claim_timeout_ms: int
    limit: int
    ack: EventClaimRef
    more_acks: _containers.RepeatedCompositeFieldContainer[EventClaimRef]
    releases: _containers.RepeatedCompositeFieldContainer[EventClaimRef]
    max_claims: int
    def __init__(self, topic: _Optional[str] = ..., group: _Optional[str] = ..., partition_by: _Optional[_Iterable[str]] = ..., handled_types: _Optional[_Iterable[str]] = ..., worker_id: _Optional[str] = ..., claim_timeout_ms: _Optional[int] = ..., limit: _Optional[int] = ..., ack: _Optional[_Union[EventClaimRef, _Mapping]] = ..., more_acks: _Optional[_Iterable[_Union[EventClaimRef, _Mapping]]] = ..., releases: _Optional[_Iterable[_Union[EventClaimRef, _Mapping]]] = ..., max_claims: _Optional[int] = ...) -> None: ...

class ClaimedPartition(_message.Message):
    __slots__ = ("partition_key", "values", "events", "last_position")
    PARTITION_KEY_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    LAST_POSITION_FIELD_NUMBER: _ClassVar[int]
    partition_key: str
    values: _containers.RepeatedCompositeFieldContainer[Attribute]
    events: _containers.RepeatedCompositeFieldContainer[SequencedEvent]
    last_position: int
    def __init__(self, partition_key: _Optional[str] = ..., values: _Optional[_Iterable[_Union[Attribute, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[SequencedEvent, _Mapping]]] = ..., last_position: _Optional[int] = ...) -> None: ...

class EventClaimResponse(_message.Message):
    __slots__ = ("claimed", "partition_key", "values", "events", "last_position", "head", "more_claims")
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    PARTITION_KEY_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    LAST_POSITION_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    MORE_CLAIMS_FIELD_NUMBER: _ClassVar[int]
    claimed: bool
    partition_key: str
    values: _containers.RepeatedCompositeFieldContainer[Attribute]
    events: _containers.RepeatedCompositeFieldContainer[SequencedEvent]
    last_position: int
    head: int
    more_claims: _containers.RepeatedCompositeFieldContainer[ClaimedPartition]
    def __init__(self, claimed: _Optional[bool] = ..., partition_key: _Optional[str] = ..., values: _Optional[_Iterable[_Union[Attribute, _Mapping]]] = ..., events: _Optional[_Iterable[_Union[SequencedEvent, _Mapping]]] = ..., last_position: _Optional[int] = ..., head: _Optional[int] = ..., more_claims: _Optional[_Iterable[_Union[ClaimedPartition, _Mapping]]] = ...) -> None: ...

class EventClaimAnswer(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EventGroupDescribeRequest(_message.Message):
    __slots__ = ("topic", "group")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    topic: str
    group: str
    def __init__(self, topic: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class EventPartitionState(_message.Message):
    __slots__ = ("partition_key", "values", "acked_position", "claimed_by", "claimed_since_ms", "pending")
    PARTITION_KEY_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    ACKED_POSITION_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_BY_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    partition_key: str
    values: _containers.RepeatedCompositeFieldContainer[Attribute]
    acked_position: int
    claimed_by: str
    claimed_since_ms: int
    pending: int
    def __init__(self, partition_key: _Optional[str] = ..., values: _Optional[_Iterable[_Union[Attribute, _Mapping]]] = ..., acked_position: _Optional[int] = ..., claimed_by: _Optional[str] = ..., claimed_since_ms: _Optional[int] = ..., pending: _Optional[int] = ...) -> None: ...

class EventGroupDescription(_message.Message):
    __slots__ = ("group", "active", "partition_by", "handled_types", "partitions", "head")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_BY_FIELD_NUMBER: _ClassVar[int]
    HANDLED_TYPES_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    group: str
    active: bool
    partition_by: _containers.RepeatedScalarFieldContainer[str]
    handled_types: _containers.RepeatedScalarFieldContainer[str]
    partitions: _containers.RepeatedCompositeFieldContainer[EventPartitionState]
    head: int
    def __init__(self, group: _Optional[str] = ..., active: _Optional[bool] = ..., partition_by: _Optional[_Iterable[str]] = ..., handled_types: _Optional[_Iterable[str]] = ..., partitions: _Optional[_Iterable[_Union[EventPartitionState, _Mapping]]] = ..., head: _Optional[int] = ...) -> None: ...

class EventStoreDescribeRequest(_message.Message):
    __slots__ = ("topic", "limit")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    limit: int
    def __init__(self, topic: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class EventCount(_message.Message):
    __slots__ = ("name", "events")
    NAME_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    events: int
    def __init__(self, name: _Optional[str] = ..., events: _Optional[int] = ...) -> None: ...

class EventStoreDescription(_message.Message):
    __slots__ = ("head", "types", "type_count", "tags", "tag_count", "groups", "group_count")
    HEAD_FIELD_NUMBER: _ClassVar[int]
    TYPES_FIELD_NUMBER: _ClassVar[int]
    TYPE_COUNT_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    TAG_COUNT_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    GROUP_COUNT_FIELD_NUMBER: _ClassVar[int]
    head: int
    types: _containers.RepeatedCompositeFieldContainer[EventCount]
    type_count: int
    tags: _containers.RepeatedCompositeFieldContainer[EventCount]
    tag_count: int
    groups: _containers.RepeatedCompositeFieldContainer[EventGroupDescription]
    group_count: int
    def __init__(self, head: _Optional[int] = ..., types: _Optional[_Iterable[_Union[EventCount, _Mapping]]] = ..., type_count: _Optional[int] = ..., tags: _Optional[_Iterable[_Union[EventCount, _Mapping]]] = ..., tag_count: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[EventGroupDescription, _Mapping]]] = ..., group_count: _Optional[int] = ...) -> None: ...

class RegisterBrokerRequest(_message.Message):
    __slots__ = ("broker_id", "host", "port", "rack")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    host: str
    port: int
    rack: str
    def __init__(self, broker_id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., rack: _Optional[str] = ...) -> None: ...

class RegisterBrokerResponse(_message.Message):
    __slots__ = ("partitions", "heartbeat_interval_ms", "controller_epoch")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[CreatePartitionsRequest]
    heartbeat_interval_ms: int
    controller_epoch: int
    def __init__(self, partitions: _Optional[_Iterable[_Union[CreatePartitionsRequest, _Mapping]]] = ..., heartbeat_interval_ms: _Optional[int] = ..., controller_epoch: _Optional[int] = ...) -> None: ...

class BrokerHeartbeatRequest(_message.Message):
    __slots__ = ("broker_id", "shutting_down")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    SHUTTING_DOWN_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    shutting_down: bool
    def __init__(self, broker_id: _Optional[int] = ..., shutting_down: _Optional[bool] = ...) -> None: ...

class BrokerHeartbeatResponse(_message.Message):
    __slots__ = ("reregister", "acl_version", "controller_epoch")
    REREGISTER_FIELD_NUMBER: _ClassVar[int]
    ACL_VERSION_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    reregister: bool
    acl_version: int
    controller_epoch: int
    def __init__(self, reregister: _Optional[bool] = ..., acl_version: _Optional[int] = ..., controller_epoch: _Optional[int] = ...) -> None: ...

class ListBrokersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListBrokersResponse(_message.Message):
    __slots__ = ("brokers",)
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerInfo]
    def __init__(self, brokers: _Optional[_Iterable[_Union[BrokerInfo, _Mapping]]] = ...) -> None: ...

class CreateTopicRequest(_message.Message):
    __slots__ = ("name", "partitions", "config")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: int
    config: TopicConfig
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[int] = ..., config: _Optional[_Union[TopicConfig, _Mapping]] = ...) -> None: ...

class DeleteTopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteTopicResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTopicsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTopicsResponse(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[TopicInfo]
    def __init__(self, topics: _Optional[_Iterable[_Union[TopicInfo, _Mapping]]] = ...) -> None: ...

class DescribeTopicRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class AddPartitionsRequest(_message.Message):
    __slots__ = ("name", "partitions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    partitions: int
    def __init__(self, name: _Optional[str] = ..., partitions: _Optional[int] = ...) -> None: ...

class AlterIsrRequest(_message.Message):
    __slots__ = ("broker_id", "topic", "partition", "leader_epoch", "partition_epoch", "isr")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    topic: str
    partition: int
    leader_epoch: int
    partition_epoch: int
    isr: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, broker_id: _Optional[int] = ..., topic: _Optional[str] = ..., partition: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., partition_epoch: _Optional[int] = ..., isr: _Optional[_Iterable[int]] = ...) -> None: ...

class AlterIsrResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: PartitionState
    def __init__(self, state: _Optional[_Union[PartitionState, _Mapping]] = ...) -> None: ...

class ReassignPartitionRequest(_message.Message):
    __slots__ = ("topic", "partition", "replicas")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ...) -> None: ...

class ReassignPartitionResponse(_message.Message):
    __slots__ = ("state",)
    STATE_FIELD_NUMBER: _ClassVar[int]
    state: PartitionState
    def __init__(self, state: _Optional[_Union[PartitionState, _Mapping]] = ...) -> None: ...

class GetMetadataRequest(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topics: _Optional[_Iterable[str]] = ...) -> None: ...

class GetMetadataResponse(_message.Message):
    __slots__ = ("brokers", "topics")
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerInfo]
    topics: _containers.RepeatedCompositeFieldContainer[TopicInfo]
    def __init__(self, brokers: _Optional[_Iterable[_Union[BrokerInfo, _Mapping]]] = ..., topics: _Optional[_Iterable[_Union[TopicInfo, _Mapping]]] = ...) -> None: ...

class AclEntry(_message.Message):
    __slots__ = ("principal", "resource_type", "pattern_type", "resource_name", "operation", "permission")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    PATTERN_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    principal: str
    resource_type: str
    pattern_type: str
    resource_name: str
    operation: str
    permission: str
    def __init__(self, principal: _Optional[str] = ..., resource_type: _Optional[str] = ..., pattern_type: _Optional[str] = ..., resource_name: _Optional[str] = ..., operation: _Optional[str] = ..., permission: _Optional[str] = ...) -> None: ...

class AddAclsRequest(_message.Message):
    __slots__ = ("acls",)
    ACLS_FIELD_NUMBER: _ClassVar[int]
    acls: _containers.RepeatedCompositeFieldContainer[AclEntry]
    def __init__(self, acls: _Optional[_Iterable[_Union[AclEntry, _Mapping]]] = ...) -> None: ...

class RemoveAclsRequest(_message.Message):
    __slots__ = ("acls",)
    ACLS_FIELD_NUMBER: _ClassVar[int]
    acls: _containers.RepeatedCompositeFieldContainer[AclEntry]
    def __init__(self, acls: _Optional[_Iterable[_Union[AclEntry, _Mapping]]] = ...) -> None: ...

class AclsChangeResponse(_message.Message):
    __slots__ = ("version", "changed")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    version: int
    changed: int
    def __init__(self, version: _Optional[int] = ..., changed: _Optional[int] = ...) -> None: ...

class ListAclsRequest(_message.Message):
    __slots__ = ("principal",)
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    principal: str
    def __init__(self, principal: _Optional[str] = ...) -> None: ...

class ListAclsResponse(_message.Message):
    __slots__ = ("acls", "version")
    ACLS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    acls: _containers.RepeatedCompositeFieldContainer[AclEntry]
    version: int
    def __init__(self, acls: _Optional[_Iterable[_Union[AclEntry, _Mapping]]] = ..., version: _Optional[int] = ...) -> None: ...

class DescribeCoordinatorRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeCoordinatorResponse(_message.Message):
    __slots__ = ("address", "active", "controller_epoch", "active_address", "metadata_store", "metadata_store_address", "metadata_store_healthy", "metadata_store_detail")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    METADATA_STORE_FIELD_NUMBER: _ClassVar[int]
    METADATA_STORE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    METADATA_STORE_HEALTHY_FIELD_NUMBER: _ClassVar[int]
    METADATA_STORE_DETAIL_FIELD_NUMBER: _ClassVar[int]
    address: str
    active: bool
    controller_epoch: int
    active_address: str
    metadata_store: str
    metadata_store_address: str
    metadata_store_healthy: bool
    metadata_store_detail: str
    def __init__(self, address: _Optional[str] = ..., active: _Optional[bool] = ..., controller_epoch: _Optional[int] = ..., active_address: _Optional[str] = ..., metadata_store: _Optional[str] = ..., metadata_store_address: _Optional[str] = ..., metadata_store_healthy: _Optional[bool] = ..., metadata_store_detail: _Optional[str] = ...) -> None: ...

class Subscription(_message.Message):
    __slots__ = ("mode", "from_ms", "created_ms")
    MODE_FIELD_NUMBER: _ClassVar[int]
    FROM_MS_FIELD_NUMBER: _ClassVar[int]
    CREATED_MS_FIELD_NUMBER: _ClassVar[int]
    mode: SubscriptionMode
    from_ms: int
    created_ms: int
    def __init__(self, mode: _Optional[_Union[SubscriptionMode, str]] = ..., from_ms: _Optional[int] = ..., created_ms: _Optional[int] = ...) -> None: ...

class FindOrCreateGroupRequest(_message.Message):
    __slots__ = ("topic", "app_id", "subscription_mode", "subscription_from_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    APP_ID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_MODE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FROM_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    app_id: str
    subscription_mode: SubscriptionMode
    subscription_from_ms: int
    def __init__(self, topic: _Optional[str] = ..., app_id: _Optional[str] = ..., subscription_mode: _Optional[_Union[SubscriptionMode, str]] = ..., subscription_from_ms: _Optional[int] = ...) -> None: ...

class FindOrCreateGroupResponse(_message.Message):
    __slots__ = ("group_id", "coordinator_address", "subscription", "created")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    coordinator_address: str
    subscription: Subscription
    created: bool
    def __init__(self, group_id: _Optional[str] = ..., coordinator_address: _Optional[str] = ..., subscription: _Optional[_Union[Subscription, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class JoinGroupRequest(_message.Message):
    __slots__ = ("group_id", "consumer_id", "client_id", "session_timeout_ms", "max_poll_interval_ms")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_POLL_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    consumer_id: str
    client_id: str
    session_timeout_ms: int
    max_poll_interval_ms: int
    def __init__(self, group_id: _Optional[str] = ..., consumer_id: _Optional[str] = ..., client_id: _Optional[str] = ..., session_timeout_ms: _Optional[int] = ..., max_poll_interval_ms: _Optional[int] = ...) -> None: ...

class JoinGroupResponse(_message.Message):
    __slots__ = ("member_id", "generation", "member_secret")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    MEMBER_SECRET_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    generation: int
    member_secret: str
    def __init__(self, member_id: _Optional[str] = ..., generation: _Optional[int] = ..., member_secret: _Optional[str] = ...) -> None: ...

class StartPosition(_message.Message):
    __slots__ = ("partition", "offset")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    partition: int
    offset: int
    def __init__(self, partition: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class GetAssignmentRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "wait_ms", "member_secret")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_SECRET_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    wait_ms: int
    member_secret: str
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., wait_ms: _Optional[int] = ..., member_secret: _Optional[str] = ...) -> None: ...

class GetAssignmentResponse(_message.Message):
    __slots__ = ("generation", "partitions", "rebalance_in_progress", "start_positions", "topic")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_IN_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    START_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    generation: int
    partitions: _containers.RepeatedScalarFieldContainer[int]
    rebalance_in_progress: bool
    start_positions: _containers.RepeatedCompositeFieldContainer[StartPosition]
    topic: str
    def __init__(self, generation: _Optional[int] = ..., partitions: _Optional[_Iterable[int]] = ..., rebalance_in_progress: _Optional[bool] = ..., start_positions: _Optional[_Iterable[_Union[StartPosition, _Mapping]]] = ..., topic: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "generation", "poll_age_ms", "member_secret")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    POLL_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_SECRET_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    generation: int
    poll_age_ms: int
    member_secret: str
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., generation: _Optional[int] = ..., poll_age_ms: _Optional[int] = ..., member_secret: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("generation", "assignment_changed")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_CHANGED_FIELD_NUMBER: _ClassVar[int]
    generation: int
    assignment_changed: bool
    def __init__(self, generation: _Optional[int] = ..., assignment_changed: _Optional[bool] = ...) -> None: ...

class WatchGroupRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "member_secret")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_SECRET_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    member_secret: str
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., member_secret: _Optional[str] = ...) -> None: ...

class GroupEvent(_message.Message):
    __slots__ = ("generation", "assignment_changed")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_CHANGED_FIELD_NUMBER: _ClassVar[int]
    generation: int
    assignment_changed: bool
    def __init__(self, generation: _Optional[int] = ..., assignment_changed: _Optional[bool] = ...) -> None: ...

class LeaveGroupRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "member_secret")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_SECRET_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    member_secret: str
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., member_secret: _Optional[str] = ...) -> None: ...

class LeaveGroupResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GroupSummary(_message.Message):
    __slots__ = ("group_id", "topic", "state", "generation", "member_count")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    MEMBER_COUNT_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    topic: str
    state: GroupStateCode
    generation: int
    member_count: int
    def __init__(self, group_id: _Optional[str] = ..., topic: _Optional[str] = ..., state: _Optional[_Union[GroupStateCode, str]] = ..., generation: _Optional[int] = ..., member_count: _Optional[int] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupSummary]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupSummary, _Mapping]]] = ...) -> None: ...

class DescribeGroupRequest(_message.Message):
    __slots__ = ("group_id",)
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    def __init__(self, group_id: _Optional[str] = ...) -> None: ...

class MemberDescription(_message.Message):
    __slots__ = ("member_id", "client_id", "host", "partitions", "target_partitions")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TARGET_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    client_id: str
    host: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    target_partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, member_id: _Optional[str] = ..., client_id: _Optional[str] = ..., host: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ..., target_partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class PartitionLag(_message.Message):
    __slots__ = ("partition", "committed_offset", "log_end_offset", "lag", "owner_member_id")
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    OWNER_MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    partition: int
    committed_offset: int
    log_end_offset: int
    lag: int
    owner_member_id: str
    def __init__(self, partition: _Optional[int] = ..., committed_offset: _Optional[int] = ..., log_end_offset: _Optional[int] = ..., lag: _Optional[int] = ..., owner_member_id: _Optional[str] = ...) -> None: ...

class DescribeGroupResponse(_message.Message):
    __slots__ = ("group_id", "topic", "state", "generation", "subscription", "members", "partitions", "total_lag")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_LAG_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    topic: str
    state: GroupStateCode
    generation: int
    subscription: Subscription
    members: _containers.RepeatedCompositeFieldContainer[MemberDescription]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionLag]
    total_lag: int
    def __init__(self, group_id: _Optional[str] = ..., topic: _Optional[str] = ..., state: _Optional[_Union[GroupStateCode, str]] = ..., generation: _Optional[int] = ..., subscription: _Optional[_Union[Subscription, _Mapping]] = ..., members: _Optional[_Iterable[_Union[MemberDescription, _Mapping]]] = ..., partitions: _Optional[_Iterable[_Union[PartitionLag, _Mapping]]] = ..., total_lag: _Optional[int] = ...) -> None: ...

class DeleteGroupRequest(_message.Message):
    __slots__ = ("group_id",)
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    def __init__(self, group_id: _Optional[str] = ...) -> None: ...

class DeleteGroupResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CheckOwnershipRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "generation", "partitions", "topic", "member_secret")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MEMBER_SECRET_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    generation: int
    partitions: _containers.RepeatedScalarFieldContainer[int]
    topic: str
    member_secret: str
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., generation: _Optional[int] = ..., partitions: _Optional[_Iterable[int]] = ..., topic: _Optional[str] = ..., member_secret: _Optional[str] = ...) -> None: ...

class CheckOwnershipResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QueuePopRequest(_message.Message):
    __slots__ = ("topic", "group", "max_records", "lease_ms", "timeout_ms", "max_bytes", "ack_lease_id", "ack_up_to_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    ACK_LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    ACK_UP_TO_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    group: str
    max_records: int
    lease_ms: int
    timeout_ms: int
    max_bytes: int
    ack_lease_id: str
    ack_up_to_offset: int
    def __init__(self, topic: _Optional[str] = ..., group: _Optional[str] = ..., max_records: _Optional[int] = ..., lease_ms: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., max_bytes: _Optional[int] = ..., ack_lease_id: _Optional[str] = ..., ack_up_to_offset: _Optional[int] = ...) -> None: ...

class QueuePopResponse(_message.Message):
    __slots__ = ("lease_id", "partition", "start_offset", "end_offset", "expiry_ms", "delivery_count", "records", "acked_offset", "lease_ms")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EXPIRY_MS_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    ACKED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    partition: int
    start_offset: int
    end_offset: int
    expiry_ms: int
    delivery_count: int
    records: bytes
    acked_offset: int
    lease_ms: int
    def __init__(self, lease_id: _Optional[str] = ..., partition: _Optional[int] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., expiry_ms: _Optional[int] = ..., delivery_count: _Optional[int] = ..., records: _Optional[bytes] = ..., acked_offset: _Optional[int] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class QueueAckRequest(_message.Message):
    __slots__ = ("lease_id", "up_to_offset", "keep_lease")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    UP_TO_OFFSET_FIELD_NUMBER: _ClassVar[int]
    KEEP_LEASE_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    up_to_offset: int
    keep_lease: bool
    def __init__(self, lease_id: _Optional[str] = ..., up_to_offset: _Optional[int] = ..., keep_lease: _Optional[bool] = ...) -> None: ...

class QueueAckResponse(_message.Message):
    __slots__ = ("acked_offset",)
    ACKED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    acked_offset: int
    def __init__(self, acked_offset: _Optional[int] = ...) -> None: ...

class QueueNackRequest(_message.Message):
    __slots__ = ("lease_id", "error", "failed_offset")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FAILED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    error: str
    failed_offset: int
    def __init__(self, lease_id: _Optional[str] = ..., error: _Optional[str] = ..., failed_offset: _Optional[int] = ...) -> None: ...

class QueueNackResponse(_message.Message):
    __slots__ = ("acked_offset", "delivery_count", "dead_lettered")
    ACKED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTERED_FIELD_NUMBER: _ClassVar[int]
    acked_offset: int
    delivery_count: int
    dead_lettered: bool
    def __init__(self, acked_offset: _Optional[int] = ..., delivery_count: _Optional[int] = ..., dead_lettered: _Optional[bool] = ...) -> None: ...

class QueueRejectRequest(_message.Message):
    __slots__ = ("lease_id", "offset", "error")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    offset: int
    error: str
    def __init__(self, lease_id: _Optional[str] = ..., offset: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class QueueRejectResponse(_message.Message):
    __slots__ = ("acked_offset", "dlq_topic", "dlq_partition", "dlq_offset")
    ACKED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DLQ_TOPIC_FIELD_NUMBER: _ClassVar[int]
    DLQ_PARTITION_FIELD_NUMBER: _ClassVar[int]
    DLQ_OFFSET_FIELD_NUMBER: _ClassVar[int]
    acked_offset: int
    dlq_topic: str
    dlq_partition: int
    dlq_offset: int
    def __init__(self, acked_offset: _Optional[int] = ..., dlq_topic: _Optional[str] = ..., dlq_partition: _Optional[int] = ..., dlq_offset: _Optional[int] = ...) -> None: ...

class QueueRenewRequest(_message.Message):
    __slots__ = ("lease_id", "lease_ms")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    lease_ms: int
    def __init__(self, lease_id: _Optional[str] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class QueueRenewResponse(_message.Message):
    __slots__ = ("expiry_ms",)
    EXPIRY_MS_FIELD_NUMBER: _ClassVar[int]
    expiry_ms: int
    def __init__(self, expiry_ms: _Optional[int] = ...) -> None: ...

class QueueDescribeRequest(_message.Message):
    __slots__ = ("topic", "group")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    topic: str
    group: str
    def __init__(self, topic: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class QueueGroupPartition(_message.Message):
    __slots__ = ("topic", "partition", "group", "acked_offset", "pending", "delivery_count", "last_error", "lease_id", "lease_records", "lease_expiry_ms")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    ACKED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_RECORDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRY_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    group: str
    acked_offset: int
    pending: int
    delivery_count: int
    last_error: str
    lease_id: str
    lease_records: int
    lease_expiry_ms: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., group: _Optional[str] = ..., acked_offset: _Optional[int] = ..., pending: _Optional[int] = ..., delivery_count: _Optional[int] = ..., last_error: _Optional[str] = ..., lease_id: _Optional[str] = ..., lease_records: _Optional[int] = ..., lease_expiry_ms: _Optional[int] = ...) -> None: ...

class QueuePartitionDepth(_message.Message):
    __slots__ = ("topic", "partition", "log_start_offset", "log_end_offset", "depth")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    log_start_offset: int
    log_end_offset: int
    depth: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., log_end_offset: _Optional[int] = ..., depth: _Optional[int] = ...) -> None: ...

class QueueTopicLimit(_message.Message):
    __slots__ = ("topic", "max_queue_size", "share", "depth")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_SIZE_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    topic: str
    max_queue_size: int
    share: int
    depth: int
    def __init__(self, topic: _Optional[str] = ..., max_queue_size: _Optional[int] = ..., share: _Optional[int] = ..., depth: _Optional[int] = ...) -> None: ...

class QueueDescribeResponse(_message.Message):
    __slots__ = ("groups", "partitions", "limits", "broker_id")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[QueueGroupPartition]
    partitions: _containers.RepeatedCompositeFieldContainer[QueuePartitionDepth]
    limits: _containers.RepeatedCompositeFieldContainer[QueueTopicLimit]
    broker_id: int
    def __init__(self, groups: _Optional[_Iterable[_Union[QueueGroupPartition, _Mapping]]] = ..., partitions: _Optional[_Iterable[_Union[QueuePartitionDepth, _Mapping]]] = ..., limits: _Optional[_Iterable[_Union[QueueTopicLimit, _Mapping]]] = ..., broker_id: _Optional[int] = ...) -> None: ...
