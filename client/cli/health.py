"""`dmq health`: is the coordinator up, and every broker it knows of?

Each server answers the standard gRPC health service (grpc.health.v1.Health): SERVING once started,
NOT_SERVING while starting or shutting down. The coordinator is asked for itself ("" = the whole
server) and for the brokers it has registered; each broker is then asked directly, all at once,
for the Broker service. A broker counts as up only when it answers SERVING *and* the coordinator
sees its heartbeats: one without the other is a broker clients cannot use.

Exit codes: 0 everything up, 1 anything down (each one named with its address on stderr) or no
broker registered at all.

JSON schema: {"healthy": bool, "components": [{"component": "coordinator"|"broker", "broker_id",
              "address", "status": "up"|"down", "detail"}]}   (broker_id is null for the coordinator)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import click

from dmq.client.cli._errors import bootstrap, timeout_s
from dmq.client.cli._output import output_option, print_json, show, table
from dmq.proto.wire import BROKER_SERVICE

# A health check is one small answer: a server that has not given it in a few seconds is not
# healthy, whatever --timeout allows for slow admin calls.
CHECK_TIMEOUT_CAP_S = 5.0


@dataclass
class Component:
    component: str
    broker_id: int | None
    address: str
    status: str  # "up" | "down"
    detail: str

    @property
    def name(self) -> str:
        return "coordinator" if self.broker_id is None else f"broker {self.broker_id}"


def check_cluster(coordinator: str, timeout: float) -> list[Component]:
    """Probe the coordinator and every registered broker; never raises for a server that is down."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from dmq.proto import dmq_pb2 as pb
    from dmq.proto import dmq_pb2_grpc as pb_grpc
    from dmq.proto.grpc_options import channel_options
    from dmq.proto.security.settings import ClientSecurity, sync_channel

    timeout = min(timeout, CHECK_TIMEOUT_CAP_S)
    channels: dict[str, grpc.Channel] = {}

    def channel(address: str) -> grpc.Channel:
        if address not in channels:
            channels[address] = sync_channel(address, ClientSecurity.from_settings(None), channel_options())
        return channels[address]

    def health_future(address: str, service: str) -> Any:
        stub = health_pb2_grpc.HealthStub(channel(address))
        return stub.Check.future(health_pb2.HealthCheckRequest(service=service), timeout=timeout)

    def verdict(future: Any) -> tuple[bool, str]:
        try:
            answer = future.result()
        except grpc.RpcError as e:
            return False, _rpc_failure(e, timeout)
        name = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
        return answer.status == health_pb2.HealthCheckResponse.SERVING, name

    try:
        up, detail = verdict(health_future(coordinator, ""))
        components = [Component("coordinator", None, coordinator, "up" if up else "down", detail)]
        if not up:
            return components
        try:
            listed = pb_grpc.MetadataStub(channel(coordinator)).ListBrokers(pb.ListBrokersRequest(), timeout=timeout)
        except grpc.RpcError as e:
            components[0] = Component("coordinator", None, coordinator, "down",
                                      f"cannot list brokers: {_rpc_failure(e, timeout)}")
            return components
        brokers = sorted(listed.brokers, key=lambda b: b.broker_id)
        futures = [health_future(f"{b.host}:{b.port}", BROKER_SERVICE) for b in brokers]  # all in flight at once
        for b, future in zip(brokers, futures):
            up, detail = verdict(future)
            if up and not b.alive:
                up, detail = False, "SERVING, but the coordinator has had no heartbeat from it (session expired)"
            elif not up and b.alive:
                detail += "; the coordinator still counts it alive until its session expires"
            components.append(Component("broker", b.broker_id, f"{b.host}:{b.port}", "up" if up else "down", detail))
        return components
    finally:
        for ch in channels.values():
            ch.close()


def _rpc_failure(e: Any, timeout: float) -> str:
    import grpc

    from dmq.client.cli._session import is_connect_failure

    code = e.code() if hasattr(e, "code") else None
    details = (e.details() if hasattr(e, "details") else "") or ""
    if code == grpc.StatusCode.UNAVAILABLE and is_connect_failure(details):
        return "unreachable (nothing answers at this address)"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"no answer within {timeout:g}s"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return "no health service (an older dmq?)"
    return f"{code.name if code is not None else 'error'}: {details}"


@click.command("health")
@output_option
@click.pass_context
def health(ctx: click.Context, output: str) -> None:
    """Check the coordinator and every registered broker; exit 1 if any is down."""
    components = check_cluster(bootstrap(ctx), timeout_s(ctx))
    down = [c for c in components if c.status != "up"]
    if output == "json":
        print_json({"healthy": not down, "components": [asdict(c) for c in components]})
    else:
        rows = [
            [c.name, c.address, "[green]up[/]" if c.status == "up" else "[red]down[/]", c.detail]
            for c in components
        ]
        show(table(["COMPONENT", "ADDRESS", "STATUS", "DETAIL"], rows))
    if down:
        raise click.ClickException("unhealthy: " + "; ".join(f"{c.name} at {c.address} is down ({c.detail})" for c in down))
    if len(components) == 1:  # a coordinator without brokers can store nothing
        raise click.ClickException(
            f"unhealthy: no broker has registered with the coordinator at {components[0].address} "
            "(`dmq broker --coordinator HOST:PORT` adds one)"
        )
