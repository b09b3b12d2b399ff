"""AsyncAdminClient: topic and broker administration from asyncio code.

The request checks (the coordinator's own name and size rules), the result types and the error
mapping are the sync AdminClient's (dmq.client.admin); only the calls are awaited, on grpc.aio.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import grpc

from dmq.client.admin import (
    _METADATA_ERRORS,
    BrokerDescription,
    TopicDescription,
    _check,
    topic_config,
    validate_partition_count,
    validate_topic_name,
)
from dmq.client.aio._cluster import AsyncCluster, bootstrap_address
from dmq.client.errors import ClientClosedError, InvalidConfigError, from_rpc_error
from dmq.proto import dmq_pb2 as pb

log = logging.getLogger(__name__)

__all__ = ["AsyncAdminClient"]


class AsyncAdminClient:
    """``async with AsyncAdminClient(bootstrap_servers="h:p") as admin: await admin.create_topic(...)``.
    ``start()`` is optional (the channel connects on first use); ``close()`` ends it."""

    def __init__(self, bootstrap_servers: str | list[str] = "127.0.0.1:9091", *, request_timeout_ms: int = 30_000) -> None:
        self._bootstrap = bootstrap_address(bootstrap_servers)
        if isinstance(request_timeout_ms, bool) or not isinstance(request_timeout_ms, int) or request_timeout_ms <= 0:
            raise InvalidConfigError(f"request_timeout_ms must be a positive int, got {request_timeout_ms!r}")
        self._request_timeout_ms = request_timeout_ms
        self._cluster: AsyncCluster | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<AsyncAdminClient bootstrap={self._bootstrap!r} closed={self._closed}>"

    async def start(self) -> None:
        if self._closed:
            raise ClientClosedError("this AsyncAdminClient is closed; create a new one")
        if self._cluster is None:
            self._cluster = AsyncCluster(self._bootstrap, request_timeout_ms=self._request_timeout_ms)

    async def close(self) -> None:
        self._closed = True
        if self._cluster is not None:
            await self._cluster.aclose()

    async def __aenter__(self) -> AsyncAdminClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _metadata_call(self, method: str, request: Any, what: str) -> Any:
        await self.start()
        cluster = self._cluster
        assert cluster is not None
        try:
            return await getattr(cluster.metadata_stub(), method)(request, timeout=cluster.timeout_s)
        except grpc.RpcError as e:
            raise from_rpc_error(e, context=f"{what} (coordinator {cluster.bootstrap})", overrides=_METADATA_ERRORS) from e

    async def create_topic(self, name: str, partitions: int = 1, config: Mapping[str, int] | None = None) -> TopicDescription:
        """Create a topic; TopicAlreadyExistsError if it exists. ``config`` as the sync AdminClient's."""
        _check(validate_topic_name, name)
        _check(validate_partition_count, partitions)
        request = pb.CreateTopicRequest(name=name, partitions=partitions, config=topic_config(config))
        info = await self._metadata_call("CreateTopic", request, f"create topic {name!r}")
        log.info("topic created: topic=%s partitions=%d", name, partitions)
        return TopicDescription.from_response(info)

    async def delete_topic(self, name: str) -> None:
        _check(validate_topic_name, name)
        await self._metadata_call("DeleteTopic", pb.DeleteTopicRequest(name=name), f"delete topic {name!r}")
        log.info("topic deleted: topic=%s", name)

    async def list_topics(self) -> list[TopicDescription]:
        response = await self._metadata_call("ListTopics", pb.ListTopicsRequest(), "list topics")
        return sorted((TopicDescription.from_response(t) for t in response.topics), key=lambda t: t.name)

    async def describe_topic(self, name: str) -> TopicDescription:
        _check(validate_topic_name, name)
        info = await self._metadata_call("DescribeTopic", pb.DescribeTopicRequest(name=name), f"describe topic {name!r}")
        return TopicDescription.from_response(info)

    async def add_partitions(self, name: str, total: int) -> TopicDescription:
        """Grow `name` to `total` partitions (the new total, not the number to add)."""
        _check(validate_topic_name, name)
        _check(validate_partition_count, total)
        info = await self._metadata_call("AddPartitions", pb.AddPartitionsRequest(name=name, partitions=total),
                                         f"add partitions to {name!r}")
        return TopicDescription.from_response(info)

    async def list_brokers(self) -> list[BrokerDescription]:
        response = await self._metadata_call("ListBrokers", pb.ListBrokersRequest(), "list brokers")
        return sorted((BrokerDescription.from_response(b) for b in response.brokers), key=lambda b: b.broker_id)
