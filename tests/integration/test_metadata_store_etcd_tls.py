"""The etcd metadata store over TLS with client certificates (--etcd-ca-file / --etcd-cert-file /
--etcd-key-file), against a real etcd that requires them; the certificates are `dmq certs create`'s."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest

from dmq.client.cli._certs import create_dev_certs
from dmq.coordinator.metastore.base import BrokerRecord, StoreError
from dmq.coordinator.metastore.config import make_metadata_store
from tests.etcd_server import EtcdServer, EtcdTls, running_etcd

pytestmark = pytest.mark.processes  # left out of `make check`


@pytest.fixture
def tls_etcd(tmp_path: pathlib.Path) -> Iterator[tuple[EtcdServer, pathlib.Path]]:
    certs = tmp_path / "certs"
    create_dev_certs(certs, clients=("coordinator",))
    tls = EtcdTls(certs / "ca.pem", certs / "server.pem", certs / "server.key", certs / "coordinator.pem",
                  certs / "coordinator.key")
    with running_etcd(tmp_path, tls) as server:
        yield server, certs


async def test_mutual_tls_to_etcd(tls_etcd: tuple[EtcdServer, pathlib.Path], tmp_path: pathlib.Path) -> None:
    server, certs = tls_etcd
    store = make_metadata_store(server.url("tls"), tmp_path, etcd_ca_file=certs / "ca.pem",
                                etcd_cert_file=certs / "coordinator.pem", etcd_key_file=certs / "coordinator.key")
    await store.open()
    try:
        await store.upsert_broker(BrokerRecord(1, "h", 1, 1))
        assert await store.load_brokers() == [BrokerRecord(1, "h", 1, 1)]
    finally:
        await store.close()


@pytest.mark.parametrize("settings", ["plaintext", "TLS without a client certificate"])
async def test_without_the_right_tls_settings_open_fails_naming_the_endpoint(
    tls_etcd: tuple[EtcdServer, pathlib.Path], tmp_path: pathlib.Path, settings: str
) -> None:
    server, certs = tls_etcd
    ca = None if settings == "plaintext" else certs / "ca.pem"
    store = make_metadata_store(server.url("tls"), tmp_path, etcd_ca_file=ca)
    with pytest.raises(StoreError, match=server.endpoint):
        await store.open()
