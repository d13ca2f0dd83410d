"""Arrival processes, serving metrics (goodput, queue growth) and the sustainable-rate bisection."""
import math

import numpy as np
import pytest

from lens import arrivals
from lens.capacity import at_rate, evaluate, judge, max_sustainable_rate, saturation_rate, sweep
from lens.errors import UserError
from lens.serving import Scheduler, predict_serving
from lens.serving_metrics import RequestSLO, queue_growth, summarize_serving, summarize_serving_prediction
from lens.types import Requests
from lens.workload import window

from servingkit import table

# B = 1, every request (3 in, 2 out): prefill 1.0 s + one decode step 0.1 s = 1.1 s of service
N = 101
SAME = Requests(np.full(N, 3), np.full(N, 2))
REGULAR = np.arange(N, dtype=float)  # one arrival per second at rate 1


def test_poisson_arrivals_are_seeded_and_scale_with_the_rate():
    a = arrivals.poisson(20_000, rate=4.0, seed=7)
    assert a[0] == 0.0 and (np.diff(a) >= 0).all()
    assert arrivals.mean_rate(a) == pytest.approx(4.0, rel=0.03)
    np.testing.assert_array_equal(a, arrivals.poisson(20_000, rate=4.0, seed=7))
    np.testing.assert_allclose(arrivals.poisson(50, rate=2.0, seed=3) * 2.0, arrivals.unit_gaps(50, seed=3))
    assert not np.array_equal(a, arrivals.poisson(20_000, rate=4.0, seed=8))
    gaps = np.diff(a) * 4.0
    assert gaps.std() == pytest.approx(1.0, rel=0.05)  # exponential gaps: cv 1
    bursty = np.diff(arrivals.unit_gaps(20_000, seed=1, burstiness=0.25))
    assert bursty.std() == pytest.approx(2.0, rel=0.08)  # Gamma(k) gaps: cv 1/sqrt(k)


@pytest.mark.parametrize("bad", [0, -1.0, math.inf, math.nan, "3", True])
def test_bad_rates_are_user_errors(bad):
    with pytest.raises(UserError, match="requests per second"):
        arrivals.poisson(5, rate=bad, seed=0)


def test_trace_arrivals_rescale_and_window():
    a = np.array([10.0, 11.0, 11.5, 14.0])
    # own rate 3 gaps over 4 s = 0.75 req/s; at 2 req/s the span is 1.5 s
    np.testing.assert_allclose(arrivals.rescale(a, 2.0), [0.0, 0.375, 0.5625, 1.5])
    with pytest.raises(UserError, match="same time"):
        arrivals.rescale(np.zeros(3), 1.0)
    req = Requests(np.arange(1, 11), np.arange(1, 11), np.arange(10, dtype=float) + 100)
    w = window(req, 4, seed=0)
    assert len(w) == 4 and w.arrival_s[0] == 0.0
    np.testing.assert_array_equal(np.diff(w.input_len), 1)  # consecutive rows
    np.testing.assert_allclose(np.diff(w.arrival_s), 1.0)


def test_request_slo_from_percentile_constraints():
    s = RequestSLO.from_constraints({"ttft_p50_s": 0.2, "ttft_p99_s": 1.0, "e2e_mean_s": 3.0, "tpot_p90_s": 0.05})
    assert (s.ttft_s, s.tpot_s, s.e2e_s) == (1.0, 0.05, 3.0)
    good = s.good(ttft_s=np.array([0.5, 1.5, 0.5, 0.5]), tpot_s=np.array([0.01, 0.01, 0.06, np.nan]),
                  e2e_s=np.array([2.0, 2.0, 2.0, 2.0]))
    assert good.tolist() == [True, False, False, True]
    assert RequestSLO.from_constraints({}).empty


def test_goodput_and_throughput_by_hand():
    req = Requests(np.array([3, 3, 3, 3]), np.array([2, 2, 2, 1]), np.array([0.0, 1.0, 2.0, 3.0]))
    m = summarize_serving(req, ttft_s=np.array([0.1, 0.2, 0.9, 0.3]), e2e_s=np.array([0.5, 0.6, 1.5, 0.3]),
                          total_s=4.0, chips=2, slo=RequestSLO(ttft_s=0.5))
    assert m["request_throughput_req_s"] == 1.0
    assert m["request_goodput_req_s"] == 0.75
    assert m["goodput_req_s_per_chip"] == 0.375
    assert m["throughput_tok_s"] == 7 / 4.0
    assert m["offered_rate_req_s"] == 1.0


def test_queue_growth_is_the_slope_of_ttft_over_arrival():
    a = np.arange(10.0)
    assert queue_growth(a, 0.5 + 0.0 * a) == 0.0
    assert queue_growth(a, 1.0 + 0.3 * a) == pytest.approx(0.3)
    assert queue_growth(np.zeros(4), np.arange(4.0)) == 0.0


def test_overload_grows_the_queue_at_lambda_over_mu_minus_one():
    for rate in (0.5, 2.0):
        req = Requests(SAME.input_len, SAME.output_len, REGULAR / rate)
        p = predict_serving(table(1), req)
        m = summarize_serving_prediction(req, p)
        want = max(0.0, 1.1 * rate - 1.0)  # served every 1.1 s, arriving every 1/rate s
        assert m["queue_growth"] == pytest.approx(want, abs=1e-9)


def test_saturation_rate_of_one_slot():
    assert saturation_rate(table(1), SAME, scheduler=Scheduler()) == pytest.approx(1 / 1.1)


def test_bisection_finds_the_queue_growth_boundary():
    # without SLOs only the queue decides: 1.1 * rate - 1 <= 0.05  <=>  rate <= 1.05 / 1.1
    r = max_sustainable_rate(table(1), SAME, unit_arrival_s=REGULAR, scheduler=Scheduler(), slo={})
    assert r.rate_req_s <= 1.05 / 1.1 <= r.upper_req_s
    assert r.upper_req_s / r.rate_req_s <= 1.005 + 1e-12
    assert "queue grows" in r.why_not
    assert r.saturation_req_s == pytest.approx(1 / 1.1)


def test_bisection_finds_the_slo_boundary():
    # past mu = 1/1.1, TTFT_i = 1 + i (1.1 - 1/rate); its p90 (i = 90) <= 1.5 s up to rate 1 / (1.1 - 1/180)
    r = max_sustainable_rate(table(1), SAME, unit_arrival_s=REGULAR, scheduler=Scheduler(), slo={"ttft_p90_s": 1.5})
    edge = 1 / (1.1 - 1 / 180)
    assert r.rate_req_s <= edge <= r.upper_req_s
    assert r.upper_req_s / r.rate_req_s <= 1.005 + 1e-12
    assert r.why_not.startswith("ttft_p90_s")
    assert all(p.verdict.sustainable == (p.rate_req_s <= edge) for p in r.points)
    # sustainable at a quarter of saturation: the bracket's low end, no trickle predicted below it
    assert min(p.rate_req_s for p in r.points) == pytest.approx(r.saturation_req_s / 4)


def test_a_boundary_below_a_quarter_of_saturation_is_bracketed_from_a_trickle():
    # Poisson arrivals into one slot: a prompt alone waits 1.0 s for its first token, and from a quarter of
    # saturation more than a tenth of them queue behind another (so a p90 TTFT of 1.2 s holds only lower)
    unit = arrivals.unit_gaps(N, seed=0)
    slo = {"ttft_p90_s": 1.2}
    r = max_sustainable_rate(table(1), SAME, unit_arrival_s=unit, scheduler=Scheduler(), slo=slo)
    sat = r.saturation_req_s
    assert [p.rate_req_s for p in r.points[1:3]] == pytest.approx([sat / 4, sat / 1000])
    assert not r.points[1].verdict.sustainable and r.points[2].verdict.sustainable
    assert 0 < r.rate_req_s < r.upper_req_s <= r.rate_req_s * 1.005 + 1e-12 and r.upper_req_s < sat / 4
    assert r.why_not.startswith("ttft_p90_s")
    # the boundary it found is where a scan of the same predictions crosses it
    grid = np.geomspace(sat / 1000, sat / 4, 60)
    ok = [evaluate(
        table(1), at_rate(SAME, unit, x), scheduler=Scheduler(), chips=1, slo=slo)[1].sustainable for x in grid]
    crossing = grid[ok.index(False)]
    assert ok[0] and not any(ok[ok.index(False):])  # monotone in the rate, as the bisection assumes
    assert grid[ok.index(False) - 1] <= r.upper_req_s and r.rate_req_s <= crossing


def test_an_slo_no_rate_meets_gives_zero():
    r = max_sustainable_rate(table(1), SAME, unit_arrival_s=REGULAR, scheduler=Scheduler(), slo={"ttft_p50_s": 0.5})
    assert r.rate_req_s == 0.0 and "ttft_p50_s" in r.why_not


def test_sweep_latency_rises_with_the_rate():
    pts = sweep(table(2), SAME, unit_arrival_s=arrivals.unit_gaps(N, seed=0), rates=[0.1, 0.5, 1.0, 3.0],
                scheduler=Scheduler(), chips=1, slo={"e2e_p90_s": 5.0})
    p90 = [p.summary["e2e_p90_s"] for p in pts]
    assert p90 == sorted(p90)
    assert pts[0].verdict.sustainable and not pts[-1].verdict.sustainable


def test_judge_names_the_first_broken_constraint():
    v = judge({"ttft_p90_s": 0.7, "queue_growth": 0.0}, slo={"ttft_p90_s": 0.5})
    assert not v.sustainable and "ttft_p90_s" in v.why
    assert judge({"ttft_p90_s": 0.4, "queue_growth": 0.01}, slo={"ttft_p90_s": 0.5}).sustainable
