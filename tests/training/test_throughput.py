"""The throughput meter: tokens per second since the last report, and MFU when the peak is known."""

import pytest

from cem.training import throughput
from cem.training.throughput import Throughput


def test_tokens_per_second_and_mfu(monkeypatch):
    clock = iter([0.0, 2.0, 3.0, 4.0, 5.0])
    monkeypatch.setattr(throughput.time, "perf_counter", lambda: next(clock))
    meter = Throughput(flops_per_token=6, peak=100.0)
    meter.add(10)
    meter.add(30)
    assert meter.report(world_size=2) == {"tokens_per_s": 20.0, "mfu": pytest.approx(20.0 * 6 / 200.0)}
    meter.add(5)
    assert meter.report(world_size=1)["tokens_per_s"] == 5.0  # counted from the last report
    assert "mfu" not in Throughput(6, None).report(1)
