"""The leadership primitive of the etcd metadata store (the seam for standby coordinators): one
candidate wins, the others see it; resigning hands over at once; an unrenewed lease lapses and
its holder's renewal then fails. Real etcd; TTL 2 s, etcd's minimum with default settings."""

from __future__ import annotations

import asyncio
import pathlib
import time

import pytest

from dmq.coordinator.metastore.base import StoreConflict
from dmq.coordinator.metastore.config import make_metadata_store
from dmq.coordinator.metastore.etcd import EtcdMetadataStore

pytestmark = pytest.mark.processes  # left out of `make check`

TTL_S = 2
LAPSE_TIMEOUT_S = 15.0  # etcd's lessor checks expiry every 500 ms; a loaded machine adds more


async def _open(url: str, tmp_path: pathlib.Path) -> EtcdMetadataStore:
    store = make_metadata_store(url, tmp_path)
    assert isinstance(store, EtcdMetadataStore)
    await store.open()
    return store


async def test_one_candidate_leads_until_it_resigns(etcd_url: str, tmp_path: pathlib.Path) -> None:
    a, b = await _open(etcd_url, tmp_path), await _open(etcd_url, tmp_path)
    try:
        assert await a.leader() is None
        lease_a = await a.campaign("a:1", TTL_S)
        assert lease_a is not None
        assert await b.campaign("b:2", TTL_S) is None
        assert await b.leader() == "a:1"
        assert 1 <= await a.renew_leadership(lease_a) <= TTL_S
        await a.resign(lease_a)
        assert await b.leader() is None
        lease_b = await b.campaign("b:2", TTL_S)
        assert lease_b is not None and await a.leader() == "b:2"
        with pytest.raises(StoreConflict):  # a resigned lease cannot be renewed
            await a.renew_leadership(lease_a)
    finally:
        await a.close()
        await b.close()


async def test_an_unrenewed_lease_lapses(etcd_url: str, tmp_path: pathlib.Path) -> None:
    a, b = await _open(etcd_url, tmp_path), await _open(etcd_url, tmp_path)
    try:
        lease = await a.campaign("a:1", TTL_S)
        assert lease is not None
        deadline = time.monotonic() + LAPSE_TIMEOUT_S
        while await b.leader() is not None:  # a condition polled under a deadline
            assert time.monotonic() < deadline, "the leader key outlived its lease"
            await asyncio.sleep(0.05)
        with pytest.raises(StoreConflict):
            await a.renew_leadership(lease)
        assert await b.campaign("b:2", TTL_S) is not None
    finally:
        await a.close()
        await b.close()


async def test_a_bad_ttl_is_refused(etcd_url: str, tmp_path: pathlib.Path) -> None:
    a = await _open(etcd_url, tmp_path)
    try:
        with pytest.raises(ValueError, match="ttl_s must be 1..3600"):
            await a.campaign("a", 0)
    finally:
        await a.close()


async def test_a_deposed_store_campaigns_again_and_claims_a_higher_epoch(etcd_url: str, tmp_path: pathlib.Path) -> None:
    """A store fenced on an old controller epoch (another claimed after it) may still campaign:
    a deposed coordinator stands by and can lead again; its writes stay fenced until it claims."""
    a, b = await _open(etcd_url, tmp_path), await _open(etcd_url, tmp_path)
    try:
        lease_a = await a.campaign("a:1", TTL_S)
        assert lease_a is not None
        assert await a.claim_controller_epoch() == 1
        await a.resign(lease_a)
        lease_b = await b.campaign("b:2", TTL_S)
        assert lease_b is not None
        assert await b.claim_controller_epoch() == 2
        await b.resign(lease_b)
        with pytest.raises(StoreConflict):  # still fenced: the epoch moved on
            await a.delete_group("G_t_app")
        assert await a.campaign("a:1", TTL_S) is not None
        assert await a.claim_controller_epoch() == 3
        await a.delete_group("G_t_app")  # fenced on its new epoch, which is current
    finally:
        await a.close()
        await b.close()
