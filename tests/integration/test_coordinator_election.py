"""Several real `dmq coordinator --metadata-store etcd://… --lease-ttl-s N` processes on one real
etcd (issue 28 item 2): one is active, the others stand by answering NOT_COORDINATOR with the
active one's address; a standby takes over when the active one is killed (SIGKILL), paused past
its lease (SIGSTOP: resumed, the deposed one stops acting and stands by in the same process, able
to lead again later) or stopped cleanly (its lease revoked: at once, far sooner than the TTL)."""

from __future__ import annotations

import asyncio
import functools
import json
import pathlib
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dmq.client import AdminClient, DMQConsumer, Producer
from dmq.client.errors import DMQError
from dmq.coordinator.metastore.config import make_metadata_store
from dmq.proto import dmq_pb2 as pb
from dmq.proto import dmq_pb2_grpc as pb_grpc
from dmq.proto import error_details
from tests import polling
from tests.etcd_server import running_etcd

pytestmark = pytest.mark.processes  # left out of `make check`

START_TIMEOUT_S = 30.0  # a child importing grpc on a loaded 2-core machine
WAIT_S = 30.0
TTL_S = 2  # etcd's minimum: keeps each test short
ACTIVE = "coordinator active"


class _Coordinator:
    """One `python -m dmq.client.cli coordinator` process; `address` once it listens."""

    def __init__(self, root: pathlib.Path, name: str, url: str, ttl_s: int = TTL_S, args: tuple[str, ...] = ()) -> None:
        self.name = name
        self.log_path = root / f"{name}.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dmq.client.cli", "coordinator", "--port", "0", "--data-dir", str(root / name),
                 "--metadata-store", url, "--lease-ttl-s", str(ttl_s), "--log-level", "warning", *args],
                stdout=log, stderr=log,
            )
        try:
            _wait(lambda: "coordinator listening on" in self.log() or self.proc.poll() is not None, START_TIMEOUT_S, "start")
        except AssertionError:
            self.kill()
            raise
        lines = [ln for ln in self.log().splitlines() if "coordinator listening on" in ln]
        assert lines, f"{name} did not start: {self.log()[-2000:]}"
        self.address = lines[0].rsplit(" ", 1)[-1].strip()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def active(self) -> bool:
        return ACTIVE in self.log()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a stopped process must be able to die
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


_wait = functools.partial(polling.seconds_until, poll_s=0.02)  # (predicate, timeout_s, what) -> seconds


def _one_active(coordinators: list[_Coordinator], timeout_s: float) -> _Coordinator:
    _wait(lambda: any(c.active() for c in coordinators), timeout_s, "active coordinator")
    active = [c for c in coordinators if c.active()]
    assert len(active) == 1, [c.name for c in active]
    return active[0]


def _refusal(address: str, call: Callable[[grpc.Channel], object]) -> grpc.RpcError | None:
    """call(a channel to `address`): None when answered, else its refusal."""
    with grpc.insecure_channel(address) as channel:
        try:
            call(channel)
        except grpc.RpcError as e:
            return e
    return None


def _list_topics(address: str) -> grpc.RpcError | None:
    """A metadata RPC (ListTopics) at `address`: None when answered, else its refusal."""
    return _refusal(address, lambda ch: pb_grpc.MetadataStub(ch).ListTopics(pb.ListTopicsRequest(), timeout=WAIT_S))


def _active_named_by(address: str) -> str | None:
    refused = _list_topics(address)
    return None if refused is None else error_details.value_of(refused.trailing_metadata(), error_details.ACTIVE_COORDINATOR_KEY)


def _epoch(url: str, tmp_path: pathlib.Path) -> int:
    async def read() -> int:
        store = make_metadata_store(url, tmp_path)
        await store.open()
        try:
            return await store.load_controller_epoch()
        finally:
            await store.close()

    return asyncio.run(read())


@pytest.fixture
def coordinators(tmp_path: pathlib.Path) -> object:
    started: list[_Coordinator] = []
    yield started
    for c in started:
        c.kill()


def test_one_active_standbys_name_it_and_one_takes_over_after_sigkill(  # and the CLI's --bootstrap a,b,c

    tmp_path: pathlib.Path, etcd_url: str, coordinators: list[_Coordinator]
) -> None:
    coordinators += [_Coordinator(tmp_path, f"c{i}", etcd_url) for i in range(3)]
    first = _one_active(coordinators, WAIT_S)
    assert _list_topics(first.address) is None
    for standby in (c for c in coordinators if c is not first):
        refused = _list_topics(standby.address)
        assert refused is not None and refused.code() == grpc.StatusCode.UNAVAILABLE, refused
        trailers = refused.trailing_metadata()
        assert error_details.reason_of(trailers) == error_details.NOT_COORDINATOR
        assert error_details.value_of(trailers, error_details.ACTIVE_COORDINATOR_KEY) == first.address
    assert _epoch(etcd_url, tmp_path) == 1

    first.proc.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    first.proc.wait(10)
    rest = [c for c in coordinators if c is not first]
    second = _one_active(rest, WAIT_S)
    took_s = time.monotonic() - killed
    print(f"takeover after SIGKILL: {took_s:.2f}s (lease TTL {TTL_S}s)")
    assert took_s <= TTL_S + 1, f"takeover took {took_s:.2f}s"
    assert _list_topics(second.address) is None
    assert _epoch(etcd_url, tmp_path) == 2
    standby = next(c for c in rest if c is not second)
    _wait(lambda: _active_named_by(standby.address) == second.address, WAIT_S, "standby naming the new active one")
    # The CLI given every address, the dead one and the standby first, finds the active one.
    bootstrap = ",".join([first.address, standby.address, second.address])
    done = subprocess.run([sys.executable, "-m", "dmq.client.cli", "--bootstrap", bootstrap, "topics", "list"],
                          capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr  # a standby would have answered UNAVAILABLE


def test_a_clean_stop_hands_over_at_once(tmp_path: pathlib.Path, etcd_url: str, coordinators: list[_Coordinator]) -> None:
    """A long lease (20 s): only a revoked lease lets the standby take over within a few seconds."""
    coordinators += [_Coordinator(tmp_path, f"c{i}", etcd_url, ttl_s=20) for i in range(2)]
    first = _one_active(coordinators, WAIT_S)
    first.proc.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    assert first.proc.wait(WAIT_S) == 0, first.log()[-2000:]
    second = next(c for c in coordinators if c is not first)
    _wait(second.active, WAIT_S, "takeover")
    took_s = time.monotonic() - stopped
    print(f"takeover after a clean stop: {took_s:.2f}s (lease TTL 20s)")
    assert took_s < 10, f"took {took_s:.2f}s: the lease was left to lapse, not revoked"


@pytest.fixture
def status() -> object:
    """status(address): the coordinator's DescribeCoordinator answer, over one channel per address
    kept for the test: polling with a new channel each time opens a connection every 20 ms, and
    a server counts each as in use for 30 s (dmq.proto.server.connections, 1,000 per client address)."""
    channels: dict[str, grpc.Channel] = {}

    def describe(address: str) -> pb.DescribeCoordinatorResponse:
        channel = channels.setdefault(address, grpc.insecure_channel(address))
        return pb_grpc.CoordinatorStatusStub(channel).DescribeCoordinator(pb.DescribeCoordinatorRequest(), timeout=WAIT_S)

    yield describe
    for channel in channels.values():
        channel.close()


def _group_refusal(address: str) -> grpc.RpcError | None:
    """A group RPC (ListGroups) at `address`: None when answered, else its refusal."""
    return _refusal(address, lambda ch: pb_grpc.GroupCoordinatorStub(ch).ListGroups(pb.ListGroupsRequest(), timeout=WAIT_S))


def _coordinators_list(bootstrap: str) -> dict[str, tuple[str, int]]:
    """`dmq --bootstrap … coordinators list -o json`: address -> (state, controller epoch)."""
    done = subprocess.run([sys.executable, "-m", "dmq.client.cli", "--bootstrap", bootstrap, "coordinators", "list",
                           "-o", "json"], capture_output=True, text=True, timeout=2 * WAIT_S)
    assert done.returncode == 0, done.stderr
    return {c["address"]: (c["state"], c["controller_epoch"]) for c in json.loads(done.stdout)["coordinators"]}


def test_a_paused_coordinator_is_deposed_stands_by_when_resumed_and_leads_again_later(
    tmp_path: pathlib.Path, etcd_url: str, coordinators: list[_Coordinator],
    status: Callable[[str], pb.DescribeCoordinatorResponse],
) -> None:
    """SIGSTOP past the lease, SIGCONT: the deposed coordinator does not exit; it is a standby in
    the same process (status RPC, `dmq coordinators list`), refuses metadata and group requests
    naming the new active one, and wrote nothing (the controller epoch is the new one's). SIGKILL
    the new active one: the first takes control again, with a new, higher epoch."""
    coordinators += [_Coordinator(tmp_path, f"c{i}", etcd_url) for i in range(2)]
    first = _one_active(coordinators, WAIT_S)
    second = next(c for c in coordinators if c is not first)
    first.proc.send_signal(signal.SIGSTOP)
    try:
        took_s = _wait(second.active, WAIT_S, "takeover from a paused coordinator")
    finally:
        first.proc.send_signal(signal.SIGCONT)
    print(f"takeover from a paused coordinator: {took_s:.2f}s (lease TTL {TTL_S}s)")
    _wait(lambda: "stepping down" in first.log() or first.proc.poll() is not None, WAIT_S, "the resumed one stepping down")
    _wait(lambda: status(second.address).active, WAIT_S, "the new active one serving")
    # Standing by, in the same process: it names the new active one and acts on nothing.
    _wait(lambda: first.proc.poll() is not None or status(first.address).active_address == second.address,
          WAIT_S, "the resumed one naming the new active one")
    assert first.proc.poll() is None, f"the deposed coordinator exited: {first.log()[-2000:]}"
    resumed = status(first.address)
    assert not resumed.active and resumed.active_address == second.address, resumed
    for refused in (_list_topics(first.address), _group_refusal(first.address)):
        assert refused is not None and refused.code() == grpc.StatusCode.UNAVAILABLE, refused
        assert error_details.reason_of(refused.trailing_metadata()) == error_details.NOT_COORDINATOR, refused
        assert error_details.value_of(refused.trailing_metadata(), error_details.ACTIVE_COORDINATOR_KEY) == second.address
    assert _epoch(etcd_url, tmp_path) == 2 == status(second.address).controller_epoch  # the deposed one claimed nothing
    assert _list_topics(second.address) is None and _group_refusal(second.address) is None
    listed = _coordinators_list(f"{first.address},{second.address}")
    assert listed == {first.address: ("standby", 1), second.address: ("active", 2)}, listed

    # The new active one dies: the first, a standby again, takes control with a new epoch.
    second.proc.send_signal(signal.SIGKILL)
    second.proc.wait(10)
    _wait(lambda: status(first.address).active, WAIT_S, "the first one leading again")
    assert status(first.address).controller_epoch == 3 == _epoch(etcd_url, tmp_path)
    assert _list_topics(first.address) is None and _group_refusal(first.address) is None
    assert first.proc.poll() is None


def test_etcd_unreachable_past_the_ttl_deposes_the_active_one_which_stands_by_and_leads_again(
    tmp_path: pathlib.Path, coordinators: list[_Coordinator], status: Callable[[str], pb.DescribeCoordinatorResponse],
) -> None:
    """Its own etcd (paused here, SIGSTOP): the only coordinator cannot renew its lease, steps down
    before the lease can lapse and stands by in the same process; with etcd back it is elected
    again and claims a new epoch."""
    with running_etcd(tmp_path / "etcd") as etcd:
        url = etcd.url("ha")
        coordinators.append(_Coordinator(tmp_path, "c0", url))
        only = _one_active(coordinators, WAIT_S)
        _wait(lambda: status(only.address).active, WAIT_S, "active")
        etcd.pause()
        try:
            _wait(lambda: "stepping down" in only.log() or only.proc.poll() is not None, WAIT_S, "stepping down")
            assert only.proc.poll() is None, only.log()[-2000:]
            assert not status(only.address).active  # answered while etcd is still unreachable
            refused = _list_topics(only.address)
            assert refused is not None and refused.code() == grpc.StatusCode.UNAVAILABLE, refused
            assert error_details.reason_of(refused.trailing_metadata()) == error_details.NOT_COORDINATOR
        finally:
            etcd.resume()
        _wait(lambda: status(only.address).controller_epoch == 2 and status(only.address).active, WAIT_S,
              "leading again with a new epoch")
        assert _epoch(url, tmp_path) == 2 and _list_topics(only.address) is None
        only.kill()


def _stop(broker: subprocess.Popen[bytes] | None, coordinators: list[_Coordinator]) -> None:
    """A test's cleanup: SIGKILL the broker process (if one was started) and every coordinator."""
    if broker is not None:
        if broker.poll() is None:
            broker.send_signal(signal.SIGKILL)
        broker.wait(10)
    for c in coordinators:
        c.kill()


def _broker(root: pathlib.Path, coordinators: list[_Coordinator]) -> subprocess.Popen[bytes]:
    log_path = root / "broker0.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dmq.client.cli", "broker", "--coordinator", ",".join(c.address for c in coordinators),
             "--broker-id", "0", "--data-dir", str(root / "b0"), "--log-level", "warning"],
            stdout=log, stderr=log,
        )
    return proc


def test_a_client_and_a_broker_given_every_address_follow_a_takeover(
    tmp_path: pathlib.Path, etcd_url: str, coordinators: list[_Coordinator]
) -> None:
    """`dmq broker --coordinator a,b` and clients with bootstrap_servers="a,b": topic creation,
    produce and a group's consumption work before and after the active coordinator is killed; the
    broker then refuses a push of the old controller epoch."""
    coordinators += [_Coordinator(tmp_path, f"c{i}", etcd_url) for i in range(2)]
    first = _one_active(coordinators, WAIT_S)
    broker = _broker(tmp_path, coordinators)
    bootstrap = ",".join(c.address for c in reversed(coordinators))  # a standby first, as likely as not
    try:
        with AdminClient(bootstrap_servers=bootstrap) as admin:
            _wait(lambda: _alive_brokers(admin) == {0}, WAIT_S, "broker registered")
            admin.create_topic("orders", partitions=2)
        with Producer(bootstrap_servers=bootstrap) as producer, DMQConsumer(
            bootstrap_servers=bootstrap, group_id="app", auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=1000,
        ) as consumer:
            for i in range(10):
                producer.send("orders", f"before-{i}".encode(), partition=i % 2).get(WAIT_S)
            consumer.subscribe("orders")
            got = _consume(consumer, 10)
            consumer.commit_sync()

            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait(10)
            second = _one_active([c for c in coordinators if c is not first], WAIT_S)
            with AdminClient(bootstrap_servers=bootstrap) as admin:
                took_s = _wait(lambda: _alive_brokers(admin) == {0}, WAIT_S, "broker re-registered with the new active one")
                print(f"broker alive at the new active coordinator {took_s:.2f}s after it took over")
                admin.create_topic("after", partitions=1)
                assert {t.name for t in admin.list_topics()} >= {"orders", "after"}
                broker_address = next(b.address for b in admin.list_brokers() if b.broker_id == 0)
            # What the deposed coordinator (controller epoch 1) would push is refused; the new one's (2) is not.
            with grpc.insecure_channel(broker_address) as channel:
                stub = pb_grpc.BrokerStub(channel)
                with pytest.raises(grpc.RpcError) as refused:
                    stub.UpdatePartitionStates(pb.UpdatePartitionStatesRequest(controller_epoch=1), timeout=WAIT_S)
                assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                assert "controller_epoch 1 is older than 2" in (refused.value.details() or "")
                stub.UpdatePartitionStates(pb.UpdatePartitionStatesRequest(controller_epoch=2), timeout=WAIT_S)
            for i in range(10):
                producer.send("orders", f"after-{i}".encode(), partition=i % 2).get(WAIT_S)
            got += _consume(consumer, 10)
            consumer.commit_sync()
        assert sorted(got) == sorted([f"before-{i}".encode() for i in range(10)] + [f"after-{i}".encode() for i in range(10)])
        assert second.proc.poll() is None
    finally:
        _stop(broker, [])


def test_a_broker_following_coordinators_through_an_election_keeps_its_connections(
    tmp_path: pathlib.Path, etcd_url: str, coordinators: list[_Coordinator]
) -> None:
    """While no coordinator is active (the dead one's lease not yet lapsed, the standby naming it),
    a broker given every address goes round them; it must reuse one channel per address, not open
    a connection per attempt: the coordinators count each connection for 30 s against the
    address's 1,000 (dmq.proto.server.connections), and a broker churning ~50 a second through a 5 s
    lease locked itself and every client on its host out of the new active coordinator."""
    coordinators += [_Coordinator(tmp_path, f"c{i}", etcd_url, args=("--metrics-port", "auto")) for i in range(2)]
    first = _one_active(coordinators, WAIT_S)
    second = next(c for c in coordinators if c is not first)
    broker = _broker(tmp_path, coordinators)
    try:
        with AdminClient(bootstrap_servers=first.address) as admin:
            _wait(lambda: _alive_brokers(admin) == {0}, WAIT_S, "broker registered")
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
        _wait(second.active, WAIT_S, "takeover")
        with AdminClient(bootstrap_servers=second.address) as admin:
            _wait(lambda: _alive_brokers(admin) == {0}, WAIT_S, "broker re-registered with the new active one")
        url = _metrics_url(second)
        with urllib.request.urlopen(url, timeout=WAIT_S) as answer:
            text = answer.read().decode()
        (connections,) = [s.value for f in text_string_to_metric_families(text) for s in f.samples
                          if s.name == "dmq_open_connections"]
        # The broker's one channel, this test's admin clients and the metrics scrape: a handful.
        assert connections <= 10, f"{connections:.0f} connections counted at the new active coordinator"
    finally:
        broker.send_signal(signal.SIGKILL)
        broker.wait(10)


def _metrics_url(c: _Coordinator) -> str:
    _wait(lambda: "coordinator metrics at " in c.log(), WAIT_S, f"{c.name}'s metrics URL")
    return c.log().split("coordinator metrics at ", 1)[1].split()[0]


def _alive_brokers(admin: AdminClient) -> set[int]:
    try:
        return {b.broker_id for b in admin.list_brokers() if b.alive}
    except DMQError:  # no coordinator active yet: not yet
        return set()


def _consume(consumer: DMQConsumer, count: int) -> list[bytes]:
    values: list[bytes] = []
    deadline = time.monotonic() + WAIT_S
    while len(values) < count and time.monotonic() < deadline:
        values += [r.value for r in consumer.poll(timeout_ms=200)]
    assert len(values) == count, values
    return values
