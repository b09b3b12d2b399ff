"""The leader-epoch cache's file in the partition directory (Kafka's leader-epoch-checkpoint).

    dmq-leader-epochs 1 <entries>
    <epoch> <start_offset>            one line per entry, ascending
    <crc32 of the lines above, hex>

Written atomically (tmp + fsync + rename + directory fsync, PartitionLog.write_side_file) after
every change, so a restarted replica knows its history and truncates by epoch (KIP-101) rather
than to a high watermark it does not remember. An unreadable file counts as an empty cache: the
replica then truncates to its high watermark when it next follows (truncation.py's fallback),
which loses nothing acknowledged.
"""

from __future__ import annotations

import zlib

import structlog

from dmq.broker.log import PartitionLog
from dmq.broker.replication.epochs import EpochEntry, LeaderEpochCache

__all__ = ["EPOCHS_FILE", "load_epochs", "save_epochs"]

log = structlog.get_logger(__name__)

EPOCHS_FILE = "leader-epochs"
_MAGIC = "dmq-leader-epochs 1"


def encode_epochs(cache: LeaderEpochCache) -> bytes:
    entries = cache.entries
    body = "".join(f"{e.epoch} {e.start_offset}\n" for e in entries)
    head = f"{_MAGIC} {len(entries)}\n"
    return (head + body + f"{zlib.crc32((head + body).encode()):08x}\n").encode("ascii")


def decode_epochs(text: str) -> LeaderEpochCache:
    """The cache the file holds; ValueError when it is damaged."""
    lines = text.split("\n")
    if not lines or not lines[0].startswith(_MAGIC + " "):
        raise ValueError("not a leader-epoch file")
    count = int(lines[0][len(_MAGIC) + 1:])
    if count < 0 or len(lines) < count + 2:
        raise ValueError(f"{count} entries announced, {max(len(lines) - 2, 0)} present")
    head_body = "".join(line + "\n" for line in lines[: count + 1])
    if int(lines[count + 1], 16) != zlib.crc32(head_body.encode()):
        raise ValueError("checksum mismatch")
    entries = []
    for line in lines[1: count + 1]:
        epoch, start = line.split(" ")
        entries.append(EpochEntry(int(epoch), int(start)))
    return LeaderEpochCache(entries)


def load_epochs(plog: PartitionLog) -> LeaderEpochCache:
    text = plog.read_side_file(EPOCHS_FILE)
    if text is None:
        return LeaderEpochCache()
    try:
        return decode_epochs(text)
    except ValueError as e:
        log.warning("leader-epoch file unreadable; starting with an empty cache",
                    topic=plog.topic, partition=plog.partition, error=str(e))
        return LeaderEpochCache()


def save_epochs(plog: PartitionLog, cache: LeaderEpochCache) -> None:
    """Raises dmq.broker.log.StorageUnavailableError when the file cannot be written."""
    plog.write_side_file(EPOCHS_FILE, encode_epochs(cache))
