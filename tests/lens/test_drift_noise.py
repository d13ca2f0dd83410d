"""The drift's own noise: a shift inside the reference's scatter is not a drift to correct by."""
import numpy as np
import pytest

from lens.drift import Drift, Reference, action, drift_of
from lens.types import Probe


def ref_of(times) -> Reference:
    return Reference(Probe(64, 1, 40, 6), float(np.median(times)), tuple(times))


def test_a_clear_shift_is_significant_and_its_noise_small():
    then = [1.00, 1.01, 0.99, 1.00, 1.02, 0.99]
    d = drift_of(ref_of(then), [1.20, 1.21, 1.19, 1.20, 1.22, 1.18])
    assert d.value == pytest.approx(1.2, abs=0.01)
    assert 0 < d.err < 0.02
    assert d.significant(0.05)


def test_a_shift_inside_the_scatter_is_not_significant():
    # a host whose runs scatter by +-15% (a shared VM): a 7% shift of the medians is within the noise
    then = [0.85, 1.15, 1.00, 0.90, 1.10, 1.00]
    now = [1.22, 0.92, 1.07, 0.97, 1.18, 1.05]
    d = drift_of(ref_of(then), now)
    assert d.value == pytest.approx(1.06, abs=0.01)
    assert d.err > 0.035
    assert not d.significant(0.05)


def test_tolerance_and_noise_both_gate():
    assert not Drift(1.04, 0.001).significant(0.05)  # inside the tolerance
    assert not Drift(1.10, 0.06).significant(0.05)  # beyond it, but inside twice the noise
    assert Drift(0.88, 0.01).significant(0.05)  # faster counts too


def test_a_profile_without_raw_runs_compares_with_its_time():
    ref = Reference(Probe(64, 1, 40, 4), 2.0)
    d = drift_of(ref, [2.4, 2.4, 2.4, 2.4])
    assert d.value == pytest.approx(1.2) and d.err == pytest.approx(0.0)


@pytest.mark.parametrize("drift, err, rescalable, expected", [
    (1.03, 0.005, True, "none"),        # inside the tolerance
    (1.08, 0.05, True, "none"),         # inside twice its own noise
    (1.08, 0.005, True, "rescaled"),    # counts, under drift_reprofile
    (0.93, 0.005, True, "rescaled"),    # a faster host too
    (1.08, 0.005, False, "none"),       # counts, but queueing does not re-scale
    (1.25, 0.005, True, "reprofiled"),  # past drift_reprofile
    (0.80, 0.005, False, "reprofiled"),  # re-profiling applies under continuous serving too
    (1.25, 0.20, True, "none"),         # a large shift inside its noise is still noise
])
def test_what_is_done_about_a_drift(drift, err, rescalable, expected):
    assert action(Drift(drift, err), tolerance=0.05, reprofile_above=0.10, rescalable=rescalable) == expected


def test_no_reference_and_reprofile_at_any_drift_that_counts():
    assert action(None, tolerance=0.05, reprofile_above=0.10) == "no reference"
    assert action(Drift(1.06, 0.001), tolerance=0.05, reprofile_above=0.0) == "reprofiled"


def test_each_rounds_speed_is_its_runs_over_their_probes_median_over_every_round():
    from lens.drift import round_speeds

    rounds = [{"a": (1.0,), "b": (2.0,)}, {"a": (1.2,), "b": (2.4,)}, {"a": (1.0, 1.0), "b": (2.0,)}, {}]
    got = round_speeds(rounds)
    assert got[:3] == pytest.approx((1.0, 1.2, 1.0))
    assert np.isnan(got[3])  # a round without runs says nothing
    assert round_speeds([]) == ()
