"""A continuous measurement's passes read one by one: how far each serving metric moves between them."""
from __future__ import annotations

import math

import pytest

from lens.serving_metrics import range_share
from search.passes import KNEE_SPREAD, PASS_METRICS, pass_intervals, pass_spread_line, pass_spreads


def _summary(scale: float, ttft_scale: float = 1.0) -> dict:
    base = {"request_throughput_req_s": 2.0, "ttft_p50_s": 0.020, "ttft_p90_s": 0.050, "tpot_p50_s": 0.010,
            "tpot_p90_s": 0.012, "e2e_p50_s": 0.5, "e2e_p90_s": 1.0}
    return {k: v * scale * (ttft_scale if k.startswith("ttft") else 1.0) for k, v in base.items()}


def test_range_share_is_the_range_over_the_median():
    assert range_share([1.0, 2.0, 4.0]) == 1.5
    assert range_share([3.0]) == 0.0
    assert math.isnan(range_share([])) and math.isnan(range_share([0.0, 0.0]))


def test_quiet_passes_read_alike_and_say_nothing_of_the_knee():
    passes = [_summary(1.0), _summary(1.02), _summary(0.99)]
    spreads = pass_spreads(passes)
    assert set(spreads) == set(PASS_METRICS)
    assert all(abs(v - 0.03 / 1.0) < 1e-9 for v in spreads.values())
    line = pass_spread_line(passes)
    assert line.startswith("over the 3 passes: request throughput 1.98 to 2.04 req/s (3%), TTFT p50 ")
    assert "knee" not in line
    at = pass_intervals(passes)
    assert at["e2e_p50_s"]["below"] == pytest.approx(0.01) and at["e2e_p50_s"]["above"] == pytest.approx(0.02)
    assert at["e2e_p50_s"]["coverage"] == 0.75


def test_a_queue_that_amplifies_the_hosts_noise_is_named():
    # the latencies of the passes near the knee: TTFT 3x apart, the rest within a few percent
    passes = [_summary(1.0, 1.0), _summary(1.01, 3.0), _summary(0.99, 1.5)]
    spreads = pass_spreads(passes)
    assert spreads["ttft_p50_s"] > KNEE_SPREAD and spreads["e2e_p90_s"] < KNEE_SPREAD
    line = pass_spread_line(passes)
    assert f"TTFT p50, TTFT p90 spread over {KNEE_SPREAD:.0%}: at this rate the queue amplifies" in line
    # three passes: their range holds the median 75% of the time; TTFT read 1.0, 1.485 and 3.03 x, the median
    # 1.485 x: 33% below it to 104% above
    assert ("the true median lies, with 75% confidence whatever the noise's shape, within TTFT p50 -33% to +104%, "
            "TTFT p90 -33% to +104% of these passes' median") in line
    assert "\n" not in line
