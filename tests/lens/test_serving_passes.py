"""Passes of one served workload read as one measurement (``lens.serving_metrics.summarize_serving_passes``)."""
import numpy as np
import pytest

from lens.serving_metrics import RequestSLO, median_summary, summarize_serving, summarize_serving_passes
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
