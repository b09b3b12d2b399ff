"""`dmq server --metrics-port`: the endpoint a real server process prints, its lag gauge against
`dmq groups describe`, and the option's refusals."""

from __future__ import annotations

import pathlib
import socket
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.cli.conftest import Dmq, ServerProcess


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_server_metrics_lag_equals_groups_describe(metered_server: ServerProcess) -> None:
    url = metered_server.metrics_url()
    dmq = Dmq(metered_server.bootstrap)
    dmq.ok("topics", "create", "m-orders", "-p", "2")
    dmq.ok("produce", "m-orders", "--key-separator", ":", input="".join(f"k{i}:v{i}\n" for i in range(10)))
    dmq.ok("consume", "m-orders", "--group", "app1", "--max-messages", "4")
    group = "G_m-orders_app1"
    described = dmq.json("groups", "describe", group)
    assert described["total_lag"] == 6
    samples = _samples(url)
    assert samples[("dmq_consumer_group_lag_sum_records", (("group", group), ("topic", "m-orders")))] == 6
    for p in described["partitions"]:
        key = ("dmq_consumer_group_lag_records", (("group", group), ("partition", str(p["partition"])),
                                                  ("topic", "m-orders")))
        assert samples[key] == p["lag"]
    assert sum(v for (name, labels), v in samples.items()
               if name == "dmq_broker_records_in_total" and ("topic", "m-orders") in labels) == 10
    # The broker leads both partitions (replication factor 1), as `dmq brokers list` says.
    [broker] = dmq.json("brokers", "list")["brokers"]
    assert broker["partitions_led"] == 2
    assert samples[("dmq_broker_partitions_led", (("broker", str(broker["broker_id"])),))] == 2
    # A lone coordinator (SQLite, no election) is always the active one, with the epoch it claimed.
    assert samples[("dmq_coordinator_active", ())] == 1
    epoch = samples[("dmq_coordinator_controller_epoch", ())]
    assert epoch >= 1
    listed = dmq.json("coordinators", "list")
    assert listed == {"controller_epoch": epoch, "coordinators": [
        {"address": metered_server.bootstrap, "state": "active", "controller_epoch": epoch,
         "active_address": metered_server.bootstrap, "error": None}]}


def test_metrics_port_refusals(dmq_bare, tmp_path: pathlib.Path) -> None:  # type: ignore[no-untyped-def]
    from dmq.client.cli.servers import DEFAULT_METRICS_PORT as CLI_DEFAULT
    from dmq.proto.server.metrics import DEFAULT_METRICS_PORT

    assert CLI_DEFAULT == DEFAULT_METRICS_PORT == 9464  # the CLI keeps its own copy (a light `dmq --help`)
    bad = dmq_bare("server", "--data-dir", str(tmp_path / "d"), "--metrics-port", "nine")
    assert bad.returncode == 2 and "--metrics-port" in bad.stderr and "0 (off) or auto" in bad.stderr
    high = dmq_bare("broker", "--coordinator", "127.0.0.1:1", "--broker-id", "0", "--data-dir", str(tmp_path / "b"),
                    "--metrics-port", "70000")
    assert high.returncode == 2 and "70000 is not a port" in high.stderr


def test_a_busy_metrics_port_is_named(dmq_bare, tmp_path: pathlib.Path) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = dmq_bare("server", "--port", "0", "--data-dir", str(tmp_path / "d"), "--metrics-port", str(port))
    assert result.returncode == 1, result
    assert f"--metrics-port): cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "or 0 to turn it off" in result.stderr
