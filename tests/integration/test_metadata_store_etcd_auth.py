"""The etcd metadata store with etcd's user / password authentication (--etcd-user,
--etcd-password), against a real etcd with auth enabled by its own etcdctl."""

from __future__ import annotations

import pathlib
import subprocess
from collections.abc import Iterator

import pytest

from dmq.coordinator.metastore.base import BrokerRecord, StoreError
from dmq.coordinator.metastore.config import make_metadata_store
from tests.etcd_server import EtcdServer, etcd_binary, running_etcd

pytestmark = pytest.mark.processes  # left out of `make check`

PASSWORD = "s3cret-for-tests"


def etcdctl(server: EtcdServer, *args: str) -> None:
    ctl = str(pathlib.Path(etcd_binary()).with_name("etcdctl"))
    subprocess.run([ctl, "--endpoints", server.endpoint, *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def auth_etcd(tmp_path: pathlib.Path) -> Iterator[EtcdServer]:
    with running_etcd(tmp_path) as server:
        etcdctl(server, "user", "add", f"root:{PASSWORD}")
        etcdctl(server, "auth", "enable")
        yield server


async def test_user_and_password(auth_etcd: EtcdServer, tmp_path: pathlib.Path) -> None:
    store = make_metadata_store(auth_etcd.url("auth"), tmp_path, etcd_username="root", etcd_password=PASSWORD)
    await store.open()
    try:
        await store.upsert_broker(BrokerRecord(1, "h", 1, 1))
        # Every token etcd issued is dropped when auth is disabled and enabled again (as when its
        # TTL lapses while unused): the next write authenticates again by itself.
        etcdctl(auth_etcd, "--user", f"root:{PASSWORD}", "auth", "disable")
        etcdctl(auth_etcd, "user", "add", f"other:{PASSWORD}")  # a write while auth is off: tokens are gone
        etcdctl(auth_etcd, "auth", "enable")
        await store.upsert_broker(BrokerRecord(2, "h", 2, 2))
        assert [b.broker_id for b in await store.load_brokers()] == [1, 2]
    finally:
        await store.close()


@pytest.mark.parametrize("password", [None, "wrong"])
async def test_without_the_right_credentials_open_fails(auth_etcd: EtcdServer, tmp_path: pathlib.Path, password: str | None) -> None:
    credentials = {} if password is None else {"etcd_username": "root", "etcd_password": password}
    store = make_metadata_store(auth_etcd.url("auth"), tmp_path, **credentials)
    with pytest.raises(StoreError, match=auth_etcd.endpoint):
        await store.open()
