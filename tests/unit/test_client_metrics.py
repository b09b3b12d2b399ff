"""The client metrics' windows (dmq.client._metrics) on an injected clock."""

from __future__ import annotations

from dmq.client._metrics import ClientStats, Windowed
from tests.clocks import ManualClock


def test_windowed_rate_avg_and_max_forget_what_left_the_window() -> None:
    clock = ManualClock()
    w = Windowed(window_s=30, clock=clock)
    assert (w.rate(), w.avg(), w.max()) == (0.0, 0.0, 0.0)
    clock.now += 10
    w.record(0.010)
    w.record(0.030)
    assert w.avg() == 0.020 and w.max() == 0.030
    assert w.count_rate() == 2 / 10  # younger than the window: over its age
    clock.now += 40  # both recordings left the window
    w.record(0.005)
    assert w.avg() == 0.005 and w.max() == 0.005 and w.count_rate() == 1 / 30


def test_snapshots_use_kafkas_names() -> None:
    clock = ManualClock()
    stats = ClientStats(clock=clock)
    clock.now += 2
    stats.request(0.004)
    stats.request(0.002, ok=False)
    stats.transferred(10, 1000)
    stats.committed()
    stats.rebalanced()
    stats.lag(7)
    sent = stats.snapshot("send")
    assert sent["record_send_total"] == 10 and sent["bytes_send_total"] == 1000
    assert sent["record_send_rate"] == 5.0 and sent["bytes_send_rate"] == 500.0
    assert sent["request_total"] == 2 and sent["request_error_total"] == 1
    assert sent["request_latency_avg_ms"] == 3.0 and sent["request_latency_max_ms"] == 4.0
    consumed = stats.consumer_snapshot()
    assert consumed["record_consumed_total"] == 10 and consumed["records_lag_max"] == 7
    assert consumed["commit_total"] == 1 and consumed["rebalance_total"] == 1
