"""Passes of one served workload read as one measurement (``lens.serving_metrics.summarize_serving_passes``)."""
import math

import numpy as np
import pytest

from lens.serving_metrics import (RequestSLO, median_interval, median_summary, summarize_serving,
                                  summarize_serving_passes)
from lens.types import Requests, WorkloadRun

N = 20
REQ = Requests(np.full(N, 64), np.full(N, 9), np.arange(N) * 0.1, name="t")


def served(ttft: np.ndarray, total_s: float = 2.5) -> WorkloadRun:
    """A served pass: every request decodes 8 steps of 10 ms after its first token."""
    return WorkloadRun(ttft_s=ttft, e2e_s=ttft + 0.08, total_s=total_s, compile_s=0.0, run_s=total_s,
                       mode="continuous")


def jittered(slow: list[int]) -> WorkloadRun:
    """A pass in which the requests ``slow`` met the host's jitter (20 ms first tokens, the others 10 ms)."""
    t = np.full(N, 0.010)
    t[slow] = 0.020
    return served(t)


def test_each_figure_is_the_median_of_the_passes_own():
    runs = [jittered([0, 1]), jittered([2, 3, 4]), jittered([5, 6, 7, 8, 9]), served(np.full(N, 0.010), 2.0)]
    got = summarize_serving_passes(REQ, runs)
    each = [summarize_serving(REQ, ttft_s=r.ttft_s, e2e_s=r.e2e_s, total_s=r.total_s) for r in runs]
    for key in ("ttft_p90_s", "ttft_p50_s", "ttft_mean_s", "e2e_p90_s", "request_throughput_req_s", "good_fraction"):
        assert got[key] == pytest.approx(float(np.median([m[key] for m in each]))), key
    # counts the passes share stay whole numbers
    assert got["requests"] == N and isinstance(got["requests"], int)


def test_the_jitter_each_pass_holds_is_kept_where_each_requests_median_strips_it():
    # three passes, each with 3 of 20 requests slow, a different 3 each time: every pass's TTFT p90 reads a slow
    # request, but no request is slow in two passes, so each request's median over the passes is fast
    runs = [jittered([0, 1, 2]), jittered([3, 4, 5]), jittered([6, 7, 8])]
    got = summarize_serving_passes(REQ, runs)
    assert got["ttft_p90_s"] > 0.015
    med = WorkloadRun.median_of(runs)
    stripped = summarize_serving(REQ, ttft_s=med.ttft_s, e2e_s=med.e2e_s, total_s=med.total_s)
    assert stripped["ttft_p90_s"] == pytest.approx(0.010)


def test_a_pass_that_met_a_slow_spell_does_not_move_the_figures():
    clean = [jittered([0]), jittered([1])]
    slow = served(np.full(N, 0.050), total_s=4.0)  # the whole pass 5x slower
    assert summarize_serving_passes(REQ, [*clean, slow])["ttft_p50_s"] == pytest.approx(0.010)
    assert summarize_serving_passes(REQ, [*clean, slow])["request_throughput_req_s"] == pytest.approx(N / 2.5)


def test_one_pass_is_its_own_summary_and_the_slo_reaches_every_pass():
    run = jittered([0, 1, 2, 3])
    slo = RequestSLO(ttft_s=0.015)
    one = summarize_serving_passes(REQ, [run], slo=slo)
    assert one == summarize_serving(REQ, ttft_s=run.ttft_s, e2e_s=run.e2e_s, total_s=run.total_s, slo=slo)
    assert one["good_fraction"] == pytest.approx(16 / 20)


def test_no_passes_is_an_error_not_an_empty_summary():
    for empty in (lambda: summarize_serving_passes(REQ, []), lambda: median_summary([])):
        with pytest.raises(ValueError, match="no passes"):
            empty()


def test_median_interval_takes_the_order_statistics_whose_coverage_reaches_the_target():
    # 3 readings reach at most 75%: their whole range, in any order
    assert median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0, 0.75)
    # 9: the second smallest and the second largest, 1 - 2 (1 + 9) / 512
    assert median_interval([float(x) for x in range(9, 0, -1)]) == (2.0, 8.0, 1 - 20 / 512)
    # a lower target narrows it: 9 readings between the third smallest and largest cover 1 - 2 (1 + 9 + 36) / 512
    assert median_interval([float(x) for x in range(9)], coverage=0.8) == (2.0, 6.0, 1 - 92 / 512)
    low, high, cov = median_interval([5.0])
    assert (low, high, cov) == (5.0, 5.0, 0.0)
    assert all(math.isnan(x) for x in median_interval([]))
    with pytest.raises(ValueError, match="coverage"):
        median_interval([1.0, 2.0], coverage=1.0)


def test_median_interval_covers_a_skewed_distributions_median_as_often_as_it_says():
    rng = np.random.default_rng(7)
    trials = 4000
    for n in (3, 9, 20):
        hits, said = 0, None
        for _ in range(trials):
            low, high, said = median_interval(rng.lognormal(0.0, 1.0, n))
            hits += low <= 1.0 <= high  # the lognormal(0, 1)'s median is e^0
        # binomial sampling error of 4000 trials: under 0.008 at these coverages; 0.025 is three of it
        assert abs(hits / trials - said) < 0.025, (n, hits / trials, said)
