"""A continuous measurement's passes read one by one: how far each serving metric moves between them."""
from __future__ import annotations

import math

from lens.serving_metrics import range_share
from search.passes import KNEE_SPREAD, PASS_METRICS, pass_spread_line, pass_spreads


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


def test_a_queue_that_amplifies_the_hosts_noise_is_named():
    # the latencies of the passes near the knee: TTFT 3x apart, the rest within a few percent
    passes = [_summary(1.0, 1.0), _summary(1.01, 3.0), _summary(0.99, 1.5)]
    spreads = pass_spreads(passes)
    assert spreads["ttft_p50_s"] > KNEE_SPREAD and spreads["e2e_p90_s"] < KNEE_SPREAD
    line = pass_spread_line(passes)
    assert f"TTFT p50, TTFT p90 spread over {KNEE_SPREAD:.0%}: at this rate the queue amplifies" in line
    assert "\n" not in line
