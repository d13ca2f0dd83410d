import numpy as np
import pytest

from search.pareto import hypervolume, pareto_mask


def test_pareto_mask_hand_case():
    t = [10, 8, 12, 5, 12]
    l = [1.0, 0.5, 2.0, 0.6, 3.0]
    assert pareto_mask(t, l).tolist() == [True, True, True, False, False]


def test_hypervolume_hand_case():
    # points (t=2, l=1) and (t=1, l=0.5), ref (0, 2): 1*(2-0.5) + (2-1)*(2-1) = 2.5
    assert hypervolume([2, 1], [1.0, 0.5], ref_latency=2.0) == pytest.approx(2.5)
    # a dominated point adds nothing
    assert hypervolume([2, 1, 1.5], [1.0, 0.5, 1.5], ref_latency=2.0) == pytest.approx(2.5)


def test_hypervolume_matches_grid_count():
    rng = np.random.default_rng(0)
    t, l = rng.uniform(0, 1, 12), rng.uniform(0, 1, 12)
    hv = hypervolume(t, l, ref_latency=1.0)
    gt, gl = np.meshgrid(np.linspace(0, 1, 801)[:-1] + 1 / 1600, np.linspace(0, 1, 801)[:-1] + 1 / 1600)
    dom = np.zeros_like(gt, bool)
    for ti, li in zip(t, l):
        dom |= (gt <= ti) & (gl >= li)
    assert hv == pytest.approx(dom.mean(), abs=0.01)
