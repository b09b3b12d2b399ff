"""The gRPC Metadata service: proto in, proto out. Each RPC is translated to the part of the
metadata service that does the job (dmq.coordinator.metadata lists them) and its answer back to
proto (dmq.coordinator.metadata_proto); a MetadataError (a DomainError) becomes its status, anything
unexpected INTERNAL (logged) (dmq.proto.server.server_errors). No handler lets an exception escape.
"""

from __future__ import annotations

import grpc
import structlog

from dmq.coordinator.acls import AclManager
from dmq.coordinator.controller.pushes import partition_state
from dmq.coordinator.metadata import MetadataManager
from dmq.coordinator.metadata_errors import UnknownTopicError
from dmq.coordinator.metadata_proto import broker_infos, topic_config_from_proto, topic_info
from dmq.coordinator.metastore.base import TopicRecord
from dmq.coordinator.store_writes import coordinator_disk_full
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto.server.security.interceptor import ANONYMOUS, current_principal
from dmq.proto.server.server_errors import rpc_handler
from dmq.proto.topic_settings import validate_topic_name

log = structlog.get_logger(__name__)


def _principal() -> str | None:
    """The calling principal; None with security off (every call is then anonymous)."""
    principal = current_principal.get()
    return None if principal == ANONYMOUS else principal


# MetadataError (a DomainError) becomes its status, anything unexpected INTERNAL (logged)
# (dmq.proto.server.server_errors).
_handler = rpc_handler(log=log)


class MetadataServicer(pb_grpc.MetadataServicer):
    def __init__(self, metadata: MetadataManager, acls: AclManager) -> None:
        self.metadata = metadata
        self.acls = acls

    @_handler
    async def RegisterBroker(
        self,
        request: pb.RegisterBrokerRequest,
        context: grpc.aio.ServicerContext[pb.RegisterBrokerRequest, pb.RegisterBrokerResponse],
    ) -> pb.RegisterBrokerResponse:
        partitions = await self.metadata.controller.register_broker(
            request.broker_id, request.host, request.port, principal=current_principal.get(), rack=request.rack
        )
        return pb.RegisterBrokerResponse(
            partitions=partitions, heartbeat_interval_ms=self.metadata.membership.heartbeat_interval_ms,
            controller_epoch=self.metadata.pusher.controller_epoch,
        )

    @_handler
    async def BrokerHeartbeat(
        self,
        request: pb.BrokerHeartbeatRequest,
        context: grpc.aio.ServicerContext[pb.BrokerHeartbeatRequest, pb.BrokerHeartbeatResponse],
    ) -> pb.BrokerHeartbeatResponse:
        if request.shutting_down:
            reregister = await self.metadata.controller.broker_shutting_down(request.broker_id)
        else:
            reregister = self.metadata.controller.heartbeat(request.broker_id)
        return pb.BrokerHeartbeatResponse(reregister=reregister, acl_version=self.acls.view.version,
                                          controller_epoch=self.metadata.pusher.controller_epoch)

    @_handler
    async def AlterIsr(
        self, request: pb.AlterIsrRequest, context: grpc.aio.ServicerContext[pb.AlterIsrRequest, pb.AlterIsrResponse]
    ) -> pb.AlterIsrResponse:
        topic, partition, state = await self.metadata.controller.alter_isr(
            request.broker_id, request.topic, request.partition, request.leader_epoch, request.partition_epoch,
            list(request.isr),
        )
        return pb.AlterIsrResponse(state=partition_state(topic, partition, state, self.metadata.broker_address))

    @_handler
    async def ReassignPartition(
        self,
        request: pb.ReassignPartitionRequest,
        context: grpc.aio.ServicerContext[pb.ReassignPartitionRequest, pb.ReassignPartitionResponse],
    ) -> pb.ReassignPartitionResponse:
        state = await self.metadata.reassignments.reassign_partition(request.topic, request.partition, list(request.replicas))
        return pb.ReassignPartitionResponse(
            state=partition_state(request.topic, request.partition, state, self.metadata.broker_address)
        )

    @_handler
    async def AddAcls(
        self, request: pb.AddAclsRequest, context: grpc.aio.ServicerContext[pb.AddAclsRequest, pb.AclsChangeResponse]
    ) -> pb.AclsChangeResponse:
        self.metadata.check_ready()
        with coordinator_disk_full():
            return await self.acls.change(add=request.acls)

    @_handler
    async def RemoveAcls(
        self, request: pb.RemoveAclsRequest, context: grpc.aio.ServicerContext[pb.RemoveAclsRequest, pb.AclsChangeResponse]
    ) -> pb.AclsChangeResponse:
        self.metadata.check_ready()
        with coordinator_disk_full():
            return await self.acls.change(remove=request.acls)

    @_handler
    async def ListAcls(
        self, request: pb.ListAclsRequest, context: grpc.aio.ServicerContext[pb.ListAclsRequest, pb.ListAclsResponse]
    ) -> pb.ListAclsResponse:
        self.metadata.check_ready()
        return self.acls.listing(request.principal)

    @_handler
    async def ListBrokers(
        self, request: pb.ListBrokersRequest, context: grpc.aio.ServicerContext[pb.ListBrokersRequest, pb.ListBrokersResponse]
    ) -> pb.ListBrokersResponse:
        self.metadata.check_ready()
        return pb.ListBrokersResponse(brokers=broker_infos(self.metadata.membership, self.metadata.topics()))

    @_handler
    async def CreateTopic(
        self, request: pb.CreateTopicRequest, context: grpc.aio.ServicerContext[pb.CreateTopicRequest, pb.TopicInfo]
    ) -> pb.TopicInfo:
        record = await self.metadata.topic_admin.create_topic(
            request.name, request.partitions, topic_config_from_proto(request.config), principal=_principal()
        )
        return topic_info(self.metadata.membership, record)

    @_handler
    async def DeleteTopic(
        self, request: pb.DeleteTopicRequest, context: grpc.aio.ServicerContext[pb.DeleteTopicRequest, pb.DeleteTopicResponse]
    ) -> pb.DeleteTopicResponse:
        await self.metadata.topic_admin.delete_topic(request.name)
        return pb.DeleteTopicResponse()

    @_handler
    async def ListTopics(
        self, request: pb.ListTopicsRequest, context: grpc.aio.ServicerContext[pb.ListTopicsRequest, pb.ListTopicsResponse]
    ) -> pb.ListTopicsResponse:
        self.metadata.check_ready()
        return pb.ListTopicsResponse(topics=[topic_info(self.metadata.membership, t) for t in self.metadata.topics()])

    @_handler
    async def DescribeTopic(
        self, request: pb.DescribeTopicRequest, context: grpc.aio.ServicerContext[pb.DescribeTopicRequest, pb.TopicInfo]
    ) -> pb.TopicInfo:
        return topic_info(self.metadata.membership, self._existing_topic(request.name))

    @_handler
    async def AddPartitions(
        self, request: pb.AddPartitionsRequest, context: grpc.aio.ServicerContext[pb.AddPartitionsRequest, pb.TopicInfo]
    ) -> pb.TopicInfo:
        record = await self.metadata.topic_admin.add_partitions(request.name, request.partitions, principal=_principal())
        return topic_info(self.metadata.membership, record)

    @_handler
    async def GetMetadata(
        self, request: pb.GetMetadataRequest, context: grpc.aio.ServicerContext[pb.GetMetadataRequest, pb.GetMetadataResponse]
    ) -> pb.GetMetadataResponse:
        self.metadata.check_ready()
        if request.topics:
            names = list(dict.fromkeys(request.topics))  # dedupe, keep order
            for i, name in enumerate(request.topics):
                validate_topic_name(name, field=f"topics[{i}]")
            found = [(n, self.metadata.topic(n)) for n in names]
            missing = [n for n, r in found if r is None]
            if missing:
                raise UnknownTopicError(missing)
            records = [r for _, r in found if r is not None]
        else:
            records = self.metadata.topics()
        return pb.GetMetadataResponse(
            brokers=broker_infos(self.metadata.membership, self.metadata.topics()),
            topics=[topic_info(self.metadata.membership, r) for r in records],
        )

    def _existing_topic(self, name: str) -> TopicRecord:
        self.metadata.check_ready()
        validate_topic_name(name)
        record = self.metadata.topic(name)
        if record is None:
            raise UnknownTopicError([name])
        return record
