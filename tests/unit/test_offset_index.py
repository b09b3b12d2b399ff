"""OffsetIndex: the sparse offset -> position file stays strictly increasing on disk, also after
an entry is inserted behind its end (the entry right after damage found on a read)."""

from __future__ import annotations

from dmq.broker.log.index import OffsetIndex


def entries(index: OffsetIndex) -> list[tuple[int, int]]:
    return list(zip(index.rel_offsets, index.positions))


def test_an_entry_inserted_before_the_file_end_is_persisted_in_order(tmp_path):
    path = str(tmp_path / "00000000000000000000.index")
    index = OffsetIndex(path)
    for rel, pos in [(10, 1000), (30, 3000), (50, 5000)]:
        index.append(rel, pos)
    index.write_pending()
    index.insert(20, 2000)  # behind the file's end
    index.insert(20, 2000)  # twice: one entry
    index.append(60, 6000)
    index.write_pending()
    again = OffsetIndex(path)
    assert again.load(segment_size=10_000) is True
    assert entries(again) == [(10, 1000), (20, 2000), (30, 3000), (50, 5000), (60, 6000)]


def test_an_entry_inserted_at_the_end_is_appended(tmp_path):
    path = str(tmp_path / "00000000000000000000.index")
    index = OffsetIndex(path)
    index.append(10, 1000)
    index.write_pending()
    index.insert(30, 3000)
    assert not index.file_stale
    index.write_pending()
    again = OffsetIndex(path)
    assert again.load(segment_size=10_000) is True
    assert entries(again) == [(10, 1000), (30, 3000)]
