"""A lone served prompt's TTFT tail: the measurement's reading, the draws, and the percentiles read over them."""
import dataclasses

import numpy as np
import pytest

from lens import prefill_tail as pt
from lens.serving import predict_serving
from lens.serving_metrics import RequestSLO, summarize_serving_prediction
from lens.types import Requests

from servingkit import prof, table  # tests/lens is on sys.path (pytest rootdir imports)


def test_the_workload_is_lone_one_token_prompts_after_cycled_idle_spells():
    p = prof(8)  # TTFT_b 1 s
    req = pt.workload(p, lone=6)
    assert list(req.output_len) == [1] * 6 and list(req.input_len) == [p.input_len] * 6
    gaps = np.diff(req.arrival_s)
    # each arrives a spell after the one before is expected to end (its TTFT, and as much again)
    assert np.allclose(gaps, [s + 2.0 for s in (pt.SPELLS * 2)[:5]])


def test_residuals_are_about_the_calls_median_and_leave_out_a_request_that_did_not_run_alone():
    req = Requests(np.ones(5, np.int64), np.ones(5, np.int64), np.array([0.0, 1.0, 2.0, 2.001, 4.0]))
    ttft = np.array([0.010, 0.012, 0.011, 0.030, 0.020])  # the fourth arrived while the third ran
    r = pt.read(req, ttft)
    assert np.allclose(np.sort(r), np.sort(np.array([0.010, 0.012, 0.011, 0.020]) - 0.0115))


def test_the_kept_quantiles_span_the_pooled_residuals_and_need_enough_of_them():
    rng = np.random.default_rng(0)
    slow = np.r_[rng.normal(0.0, 0.0004, 45), [0.003, 0.005, 0.006]]  # a tail of slow calls
    got = pt.solve([slow[:24], slow[24:]], p=prof(8), medians=[0.0066, 0.0064])
    assert len(got.quantiles) == pt.LEVELS and got.n == 48 and got.median_s == pytest.approx(0.0065)
    assert got.quantiles[0] == pytest.approx(slow.min()) and got.quantiles[-1] == pytest.approx(slow.max())
    assert all(b >= a for a, b in zip(got.quantiles, got.quantiles[1:]))
    assert "p95" in got.said() and "bucket 8" in got.said()
    few = pt.solve([slow[:10]], p=prof(8))
    assert few.quantiles == () and "fewer than" in few.note and few.said() == few.note


def test_one_slow_call_in_the_measurement_stays_about_that_rare_in_the_draws():
    x = np.r_[np.zeros(95), [0.040]]  # 96 lone prompts, one of them stalled 40 ms
    got = pt.solve([x[:48], x[48:]], p=prof(8), medians=[0.016, 0.016])
    d = pt.draws(np.zeros(1000), got.quantiles, n=pt.DRAWS)
    slow = d > 0.001
    # the kept quantiles do not spread it over a whole top level's mass (at 21 levels: 5% of the draws, at a
    # mean of half its excess); what the draws add on average is about what the measurement held
    assert slow.mean() < 0.02
    assert d.mean() == pytest.approx(x.mean(), rel=0.5)


def test_draws_follow_the_tail_and_are_the_same_every_time():
    tail = tuple(np.linspace(-0.001, 0.003, pt.LEVELS))  # uniform on [-1, +3] ms
    pre = np.array([0.005, 0.010])
    d = pt.draws(pre, tail, n=400)  # no median: the tail's seconds as they are, whatever the prefill
    assert d.shape == (2, 400)
    assert np.allclose(d.mean(axis=1), 0.001, atol=1e-4)  # the uniform's mean, in every row (stratified)
    assert d.min() >= -0.001 - 1e-12 and d.max() <= 0.003 + 1e-12
    assert np.array_equal(d, pt.draws(pre, tail, n=400))
    assert np.array_equal(pt.draws(pre, (), n=3), np.zeros((2, 3)))  # no tail: as composed


def test_draws_scale_with_each_prompts_own_prefill_over_the_median():
    tail = tuple(np.linspace(-0.001, 0.003, pt.LEVELS))  # about a median of 5 ms: -20% .. +60%
    pre = np.array([0.005, 0.010, 0.050])
    d = pt.draws(pre, tail, 0.005, n=400)
    # the prompt at the median draws the tail as measured; one of ten times its prefill, ten times the seconds
    m = d.mean(axis=1)
    assert m[0] == pytest.approx(0.001, abs=0.00003)  # the uniform's mean, less half a level (read as steps)
    assert np.allclose(m / m[0], [1.0, 2.0, 10.0])
    assert d[2].min() >= -0.010 - 1e-12 and d[2].max() <= 0.030 + 1e-12
    assert np.allclose(d[0], pt.draws(pre, tail, n=400)[0])  # the same levels: at the median, as unscaled


def _riser():
    """Lone arrivals, far apart: 18 prompts in bucket 8 (TTFT 1 s), 2 in bucket 16 (2 s)."""
    lin = np.array([1] * 18 + [9] * 2)
    return Requests(lin, np.full(20, 3), np.arange(20) * 100.0)


def test_a_percentile_below_a_riser_reads_the_tail_and_tpot_does_not_move():
    req = _riser()
    tail = tuple(np.r_[np.zeros(18), [0.2, 0.5, 0.8]])  # one prompt in ten or so is slow
    plain = table(batch=2)
    with_tail = dataclasses.replace(plain, prefill_tail=tail)
    a = summarize_serving_prediction(req, predict_serving(plain, req))
    b = summarize_serving_prediction(req, predict_serving(with_tail, req))
    # as composed, 18 of 20 TTFTs are 1 s: the p90 (between the 18th and 19th) sits on the riser at 1.1 s ...
    assert a["ttft_p50_s"] == pytest.approx(1.0) and a["ttft_p90_s"] == pytest.approx(1.1)
    # ... the slow tenth of the bucket-8 prompts lifts it; the median stays; the mean grows by the tail's mean
    assert b["ttft_p90_s"] > a["ttft_p90_s"] + 0.05
    assert b["ttft_p50_s"] == pytest.approx(1.0)
    assert b["ttft_mean_s"] == pytest.approx(a["ttft_mean_s"] + np.mean(pt.draws(np.zeros(20), tail)), rel=1e-9)
    assert b["e2e_p90_s"] >= a["e2e_p90_s"] and b["tpot_p90_s"] == pytest.approx(a["tpot_p90_s"], rel=1e-9)
    assert b["request_throughput_req_s"] == a["request_throughput_req_s"]


def test_goodput_counts_the_draws_that_miss_the_slo():
    req = _riser()
    tail = tuple(np.r_[np.zeros(18), [0.2, 0.5, 0.8]])
    slo = RequestSLO(ttft_s=1.05)
    plain = summarize_serving_prediction(req, predict_serving(table(batch=2), req), slo=slo)
    tailed = summarize_serving_prediction(
        req, predict_serving(dataclasses.replace(table(batch=2), prefill_tail=tail), req), slo=slo)
    assert plain["good_fraction"] == pytest.approx(0.9)  # the two bucket-16 prompts miss it
    assert 0.7 < tailed["good_fraction"] < 0.9  # and now the slow draws of the others
    assert tailed["request_goodput_req_s"] == pytest.approx(
        plain["request_throughput_req_s"] * tailed["good_fraction"])


def test_a_longer_prompts_percentile_reads_a_wider_tail_when_the_median_is_known():
    req = _riser()
    tail = tuple(np.r_[np.zeros(18), [0.2, 0.5, 0.8]])
    plain = dataclasses.replace(table(batch=2), prefill_tail=tail)  # measured about a 1 s median (bucket 8)
    scaled = dataclasses.replace(plain, prefill_tail_median_s=1.0)
    a = summarize_serving_prediction(req, predict_serving(plain, req))
    b = summarize_serving_prediction(req, predict_serving(scaled, req))
    # the bucket-8 prompts prefill in 1 s, the median: their draws are the same; the two bucket-16 ones (2 s)
    # draw twice the seconds, so the max grows and the mean by their share of the tail's mean
    pred = predict_serving(scaled, req)
    assert np.allclose(pred.prefill_s, [1.0] * 18 + [2.0] * 2)
    # (each prompt draws once from the top sixteenth of the levels, a slow one: its max moves by what it draws)
    flat = predict_serving(plain, req)
    moved, moved_flat = pred.tail_runs.first_s - pred.first_s[:, None], flat.tail_runs.first_s - flat.first_s[:, None]
    assert np.allclose(moved[:18], moved_flat[:18]) and np.allclose(moved[18:], 2 * moved_flat[18:])
    assert moved[18:].max(axis=1).min() >= 0.4
    d = pt.draws(np.zeros(20), tail)  # the same levels either way; the two long prompts draw theirs once more
    extra = d[18:].mean() * 2 / 20
    assert b["ttft_mean_s"] == pytest.approx(a["ttft_mean_s"] + extra, rel=1e-6)


def test_the_unit_table_takes_the_tail_from_its_profiles():
    from lens.compose import UnitTable
    from lens.types import Candidate

    tail = (-0.001, 0.0, 0.002)
    profiles = {b: dataclasses.replace(prof(b), prefill_tail=tail, prefill_tail_median_s=0.0065) for b in (8, 16)}
    t = UnitTable.build(Candidate(1, 2, (8, 16), (8, 16)), profiles, policy="exclusive")
    assert t.prefill_tail == tail and t.prefill_tail_median_s == 0.0065
    pred = predict_serving(t, _riser())
    assert pred.tail_runs.first_s.shape == pred.tail_runs.finish_s.shape == (20, pt.replicas(20))
    assert predict_serving(t, _riser(), tail=False).tail_runs is None
    assert table(batch=2).prefill_tail == () and pt.unit_tail([prof(8)]) == ((), 0.0)
    assert predict_serving(table(batch=2), _riser()).tail_runs is None


#: every prefill 50% slower than its median (a tail of one value, measured about a 1 s median)
SLOW = {"prefill_tail": (0.5, 0.5), "prefill_tail_median_s": 1.0}


def test_a_slow_prefill_pushes_back_the_request_queued_behind_it():
    # one slot, two prompts at once: the second waits for the first to end, so it waits out the first's slow
    # prefill as well as its own (a draw added to its own times alone would give it +0.5 s, not +1 s)
    req = Requests(np.array([1, 1]), np.array([3, 3]), np.array([0.0, 0.0]))
    plain = predict_serving(table(batch=1), req)
    slow = predict_serving(dataclasses.replace(table(batch=1), **SLOW), req)
    assert np.allclose(plain.ttft_s, [1.0, 2.2])
    ttft = slow.tail_runs.first_s - req.arrival_s[:, None]
    assert np.allclose(ttft[0], 1.5) and np.allclose(ttft[1], 2.2 + 1.0)
    m = summarize_serving_prediction(req, slow)
    assert m["ttft_mean_s"] == pytest.approx((1.5 + 3.2) / 2)
    # its wait in the queue is read over the same runs: the first's slow prefill and its two steps
    assert np.allclose(slow.tail_runs.admit_s[1], 1.7) and m["queue_mean_s"] == pytest.approx(1.7 / 2)
    assert summarize_serving_prediction(req, plain)["queue_mean_s"] == pytest.approx(1.2 / 2)


def test_a_slow_prefill_stalls_the_decode_of_the_live_rows():
    # the first request decodes when the second arrives: the second's prefill (1 s, 1.5 s slow) stops its
    # decode, so its E2E grows by its own prefill's half second and the other's
    req = Requests(np.array([1, 1]), np.array([12, 2]), np.array([0.0, 2.0]))
    plain = predict_serving(table(batch=2), req)
    slow = predict_serving(dataclasses.replace(table(batch=2), **SLOW), req)
    assert plain.admit_s[1] < plain.finish_s[0]  # it arrived during the first's decode
    assert np.allclose(slow.tail_runs.finish_s[0] - plain.finish_s[0], 1.0)
    tpot = (slow.tail_runs.finish_s[0] - slow.tail_runs.first_s[0]) / 11
    assert np.allclose(tpot, plain.tpot_s[0] + 0.5 / 11)
    assert summarize_serving_prediction(req, slow)["tpot_p90_s"] > summarize_serving_prediction(req, plain)[
        "tpot_p90_s"]


def test_a_batched_prefill_call_is_stretched_once_for_all_its_rows():
    # two prompts at once into one batched call of bucket 16 (the longer prompt's, 2 s): slow, it takes 3 s, and
    # both first tokens come at its end (not 1.5 x the sum of the rows' prefills)
    req = Requests(np.array([1, 9]), np.array([2, 2]), np.array([0.0, 0.0]))
    plain = predict_serving(table(batch=2, prefill="batched"), req)
    slow = predict_serving(dataclasses.replace(table(batch=2, prefill="batched"), **SLOW), req)
    assert np.allclose(plain.ttft_s, 2.0) and np.allclose(slow.tail_runs.first_s, 3.0)


def test_a_short_workload_runs_the_tail_more_times_and_no_run_is_all_slow():
    assert pt.replicas(20) == pt.replicas(120) == pt.DRAWS and pt.replicas(10_000) == 1
    # between the caps, the runs hold at least SAMPLES latencies, and one run fewer would not
    between = [n for n in range(1, 5000, 7) if 1 < pt.replicas(n) < pt.DRAWS]
    assert between and all(pt.replicas(n) * n >= pt.SAMPLES > (pt.replicas(n) - 1) * n for n in between)
    s = pt.stretches(np.ones(200), tuple(np.linspace(-1.0, 1.0, 101)), 1.0, n=pt.DRAWS)
    # every request draws once from each sixteenth of the range ...
    lo = np.arange(pt.DRAWS) / pt.DRAWS * 2.0 - 1.0  # each sixteenth's bottom; a level is 0.02 wide
    ordered = np.sort(s, axis=1)
    assert ((ordered >= lo - 0.02 - 1e-12) & (ordered < lo + 2.0 / pt.DRAWS)).all()
    # ... in an order of its own, so each run (a column) holds slow and fast prefills alike
    assert np.abs(s.mean(axis=0)).max() < 0.2
    assert np.array_equal(s, pt.stretches(np.ones(200), tuple(np.linspace(-1.0, 1.0, 101)), 1.0, n=pt.DRAWS))
