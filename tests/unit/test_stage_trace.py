"""The broker's stage trace for bench/replication_bench.py: off unless asked, bounded when on."""

from __future__ import annotations

from dmq.broker.replication import stage_trace
from dmq.broker.replication.stage_trace import TRACE_ENV, StageTrace


def test_off_without_the_environment_setting(monkeypatch, tmp_path):
    monkeypatch.delenv(TRACE_ENV, raising=False)
    trace = StageTrace.from_environment()
    assert not trace.enabled
    trace.mark("leader_appended", "t", 0, 5)  # a no-op
    trace.close()
    assert list(tmp_path.iterdir()) == []


def test_lines_name_stage_topic_partition_and_offset_and_stop_at_the_bound(monkeypatch, tmp_path):
    path = tmp_path / "b1.trace"
    monkeypatch.setenv(TRACE_ENV, str(path))
    monkeypatch.setattr(stage_trace, "MAX_LINES", 3)
    trace = StageTrace.from_environment()
    assert trace.enabled
    for offset in range(1, 6):
        trace.mark("high_watermark", "orders", 2, offset)
    assert not trace.enabled  # stopped at the bound, file closed
    trace.close()  # idempotent
    lines = [line.split() for line in path.read_text().splitlines()]
    assert [fields[1:] for fields in lines] == [["high_watermark", "orders", "2", str(o)] for o in (1, 2, 3)]
    assert all(int(fields[0]) > 0 for fields in lines)  # wall-clock ns, lined up across processes by the bench
