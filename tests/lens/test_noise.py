"""The estimators of a probe's expected time, the bootstrap behind the derived spreads, the drift check."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lens.compose import UnitTable, predict
from lens.drift import REFERENCE_REPEATS, corrected, host_drift, reference_probe
from lens.noise import ESTIMATOR, ESTIMATORS, bootstrap_times, counted_classes, expected_times, median_se, spread
from lens.types import BucketProfile, Candidate, Requests


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_identical_repeats_are_their_own_expected_time(name):
    out, excess = expected_times([[2.0] * 3, [5.0] * 4], classes=[2, 64], estimator=name)
    assert out == pytest.approx([2.0, 5.0]) and excess == pytest.approx(0.0)


def test_the_chosen_estimator_counts_a_slow_call_in_its_whole_class():
    # six short probes (one class: as many graph calls each), one straggling run among their 18
    short = [[1.0 * k, 1.001 * k, 0.999 * k] for k in range(1, 7)]
    short[2] = [3.0 * 1.3, 3.003, 2.997]
    out, excess = expected_times(short + [[10.0, 10.01, 9.99]], classes=[2] * 6 + [64], estimator="median+class")
    mean = np.array([np.mean(t) for t in short])
    # the class's expected cost (what the mean gives, summed over the class) is kept whole ...
    assert out[:6].sum() == pytest.approx(mean.sum(), rel=1e-9)
    # ... but shared: the straggling probe is not lifted by a third of the straggler, the others pay a little
    assert out[2] < mean[2] and all(out[i] > mean[i] for i in (0, 1, 3, 4, 5))
    assert out[6] == pytest.approx(10.0)  # another class: untouched
    assert 0 < excess < 0.1


def test_an_excess_that_rests_on_one_run_is_not_counted():
    """A class's excess counts only when more than one of its runs shows it (lens.noise.counted_classes):
    one straggler among 30 runs is noise in the estimate of every probe of its class."""
    rng = np.random.default_rng(3)
    jitter = lambda n: list(1 + 0.003 * rng.standard_normal(n))  # noqa: E731
    short = [[k * j for j in jitter(10)] for k in (0.4, 1.5, 3.1)]  # one class: 30 runs
    long = [[k * j for j in jitter(10)] for k in (1.4, 2.6, 4.6)]
    one = [list(t) for t in short]
    one[2][4] *= 4.0  # one straggling run: not counted, the medians stand
    times, classes = one + long, [2] * 3 + [128] * 3
    assert counted_classes(times, classes) == frozenset()
    out, excess = expected_times(times, classes=classes, counted=counted_classes(times, classes))
    assert out[:3] == pytest.approx([np.median(t) for t in one]) and excess == 0.0
    # counted without the gate, it lifts every probe of the class by a fifth
    ungated, _ = expected_times(times, classes=classes)
    assert ungated[0] > 1.15 * np.median(one[0])
    # three slow runs of the class (a busy core now and then): counted, the class's mean cost kept whole
    three = [list(t) for t in short]
    for i in range(3):
        three[i][i] *= 1.5
    times = three + long
    assert counted_classes(times, classes) == frozenset({2})
    out, _ = expected_times(times, classes=classes, counted=counted_classes(times, classes))
    assert out[:3].sum() == pytest.approx(sum(np.mean(t) for t in three), rel=1e-9)


def test_bootstrap_is_reproducible_and_its_spread_is_a_standard_deviation():
    rng = np.random.default_rng(0)
    times = [list(1 + 0.01 * rng.standard_normal(400))]
    a = bootstrap_times(times, estimator="mean")
    b = bootstrap_times(times, estimator="mean")
    assert np.array_equal(a, b)
    # the standard error of a mean of 400 draws of sd 0.01
    assert spread(a[:, 0]) == pytest.approx(0.01 / 20, rel=0.2)
    assert ESTIMATOR in ESTIMATORS


def test_median_se_is_the_standard_error_of_each_requests_median_relative_to_it():
    rng = np.random.default_rng(1)
    # 2 requests of 0.1 s and 2 s, 200 passes with 5% jitter: the median's se is about 1.25 * 5% / sqrt(200)
    runs = np.array([0.1, 2.0]) * (1 + 0.05 * rng.standard_normal((200, 2)))
    se = median_se(runs)
    assert se.shape == (2,) and se == pytest.approx(1.2533 * 0.05 / np.sqrt(200), rel=0.3)
    # a quarter of the passes: twice the noise
    assert np.mean(median_se(runs[:50])) == pytest.approx(2 * np.mean(se), rel=0.4)
    assert np.array_equal(median_se(np.ones((3, 4))), np.zeros(4))  # identical passes: no noise
    assert np.array_equal(median_se(np.ones((1, 4))), np.zeros(4))  # one pass: nothing to tell it from
    with pytest.raises(ValueError, match="passes, requests"):
        median_se(np.ones(4))


def _profile(bucket, *, t2, l2=64, input_len=None, err=0.0):
    return BucketProfile(bucket=bucket, ttft_s=0.01, tbt_s=0.001, input_len=input_len or bucket // 2, l1=2, l2=l2,
                         t1_s=0.011, t2_s=t2, repeats=3, spread=0.0, ttft_err_s=err * 0.01, tbt_err_s=err * 0.001)


def test_reference_probe_is_the_cheapest_long_run_of_a_bucket_the_prompts_use():
    profiles = {64: _profile(64, t2=0.5), 128: _profile(128, t2=0.3), 256: _profile(256, t2=0.2)}
    # the prompts run in 64 and 128 only: 256's cheaper probe is not one of theirs
    ref = reference_probe(profiles, [10, 70, 100], (64, 128, 256), policy="exclusive", repeats=5)
    assert ref.probe.bucket == 128 and ref.probe.output_len == 64 and ref.probe.repeats == 5 and ref.cached_s == 0.3
    assert reference_probe({}, [10], (64,), policy="exclusive", repeats=3) is None
    assert host_drift(ref, [0.33, 0.33, 0.33]) == pytest.approx(1.1)


def test_host_drift_compares_medians_so_a_straggler_is_not_drift():
    """The profile's repeats and the runs now: one straggling run on either side moves nothing."""
    profiles = {128: dataclasses.replace(_profile(128, t2=0.31), raw_t2=(0.30, 0.30, 1.2))}
    ref = reference_probe(profiles, [70], (64, 128), policy="exclusive", repeats=3)
    assert ref.cached_s == pytest.approx(0.30) and ref.probe.repeats == REFERENCE_REPEATS
    assert host_drift(ref, [0.30, 0.30, 1.2, 0.30, 0.30]) == pytest.approx(1.0)
    assert host_drift(ref, [0.36, 0.36, 0.36, 0.36, 1.4]) == pytest.approx(1.2)
    assert corrected("e2e_p90_s", 2.0, 1.1) == pytest.approx(2.2)
    assert corrected("throughput_tok_s", 110.0, 1.1) == pytest.approx(100.0)


def test_a_prediction_carries_an_interval_from_the_profiles_spreads():
    cand = Candidate(1, 2, (64, 128), (64, 128))
    req = Requests(np.array([10, 100, 30]), np.array([20, 5, 1]))
    for err, wide in ((0.0, False), (0.05, True)):
        prof = {b: _profile(b, t2=0.1, err=err) for b in (64, 128)}
        p = predict(UnitTable.build(cand, prof, policy="exclusive"), req, interval=True)
        assert np.all(p.low.e2e_s <= p.e2e_s) and np.all(p.e2e_s <= p.high.e2e_s)
        assert (p.high.total_s > p.low.total_s) == wide
        assert predict(UnitTable.build(cand, prof, policy="exclusive"), req).low is None
