"""The selection rules on hand-made evaluations (no Ray, no Optuna, no profiles)."""
from pathlib import Path

import pytest

from lens.types import Candidate, ModelShape, Target
from search.evaluate import Evaluation
from search.selection import (
    anchor_unit, by_latency, confirm_pick, distinct, front_of, hv_gain, knee, least_certain_near_knee,
    may_be_dominated_by, near_duplicates, nearest, promising_units, spread_pick,
)
from spaces import SearchSpace, Space

T, L = "throughput_tok_s_per_chip", "e2e_p90_s"
ALL = (64, 128, 256)


def space(slo=()) -> Space:
    target = Target(name="t", runner="sim", hardware="inf2", bucket_policy="exclusive", dtype="bfloat16",
                    model=ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=100))
    return Space(path=Path("s.toml"), sha256="", target=target,
                 search=SearchSpace(tp=(1, 2), batch=(1, 2, 4, 8), buckets=ALL), slo=slo)


def ev(tp, batch, t, l, buckets=ALL, source="measured") -> Evaluation:
    return Evaluation(Candidate(tp, batch, tuple(buckets), tuple(buckets)), metrics={T: t, L: l}, source=source)


def test_front_keeps_the_undominated_that_meet_the_slo():
    sp = space(slo=((L, 5.0),))
    a, b, c = ev(1, 1, 10, 1), ev(1, 2, 20, 2), ev(1, 4, 15, 3)  # c: dominated by b
    d = ev(2, 8, 99, 6)  # the best throughput, but over the SLO
    assert {e.candidate for e in front_of([a, b, c, d], sp)} == {a.candidate, b.candidate}
    assert front_of([d], sp) == []


def test_equal_predictions_keep_the_fewest_buckets():
    sp = space()
    full, lean = ev(1, 1, 10, 1, ALL), ev(1, 1, 10, 1, (128, 256))
    assert front_of([full, lean], sp) == [lean]


def test_by_latency_orders_lowest_latency_first():
    sp = space()
    f = by_latency([ev(1, 4, 30, 3), ev(1, 1, 10, 1), ev(1, 2, 20, 2)], sp)
    assert [e.metrics[L] for e in f] == [1, 2, 3]


def test_knee_is_the_point_nearest_the_ideal_corner():
    sp = space()
    # normalised: (0, 0), (0.8, 0.11), (1, 1): the middle one is closest to (1, 0)
    f = [ev(1, 1, 10, 1), ev(1, 2, 50, 2), ev(1, 4, 60, 10)]
    assert knee(f, sp) is f[1]
    assert knee(f[:1], sp) is f[0]


@pytest.mark.parametrize(("n", "k", "want"), [(5, 3, [0, 2, 4]), (5, 1, [4]), (2, 5, [0, 1]), (10, 4, [0, 3, 6, 9])])
def test_spread_pick_covers_both_ends(n, k, want):
    assert spread_pick(n, k) == want


def test_hv_gain_is_each_points_exclusive_area():
    sp = space()
    a, b = ev(1, 1, 10, 1), ev(1, 2, 20, 2)
    # reference latency 2.2: total = 10 * 1.2 + (20 - 10) * 0.2 = 14; without a: 20 * 0.2 = 4; without b: 12
    assert hv_gain(a, [a, b], sp) == pytest.approx(10.0)
    assert hv_gain(b, [a, b], sp) == pytest.approx(2.0)


def test_promising_units_are_the_unmeasured_ones_on_the_front():
    sp = space()
    measured = ev(1, 1, 10, 1)
    on_front = ev(1, 2, 30, 2, source="estimate:scaling")  # adds the most hypervolume
    also = ev(2, 1, 12, 1.5, source="estimate:scaling")  # on the front too, adds less
    behind = ev(1, 4, 5, 9, source="estimate:scaling")  # dominated: not worth profiling
    broken = ev(2, 2, 31, 2.5, source="estimate:scaling")  # on the front, but its unit failed to profile
    missing = {(1, 2): [64, 128], (2, 1): [256], (1, 4): [64], (2, 2): [64]}
    got = promising_units([measured, on_front, also, behind, broken], sp, failed={(2, 2)},
                          missing=lambda c: missing[(c.tp, c.batch)])
    assert got == {(1, 2): [64, 128], (2, 1): [256]}
    one = promising_units([measured, on_front, also, behind], sp, failed=(), per_round=1,
                          missing=lambda c: missing[(c.tp, c.batch)])
    assert one == {(1, 2): [64, 128]}  # ranked by the hypervolume it could add


def test_a_unit_just_behind_the_front_is_not_promising_and_no_setting_says_otherwise():
    """What the docs say: the units of candidates on the estimated front are profiled, ranked
    by the hypervolume they add. No knob widens that to candidates "close to" the front or
    cuts it by a share of the hypervolume: settings that did nothing are gone."""
    import inspect

    import search.selection as selection

    sp = space()
    est = dict(source="estimate:scaling")
    a, b = ev(1, 1, 10, 1, **est), ev(1, 2, 20, 2, **est)
    close = ev(1, 4, 19.9, 2.01, **est)  # within 1% of b on both objectives, but dominated by it
    tiny = ev(2, 1, 10.01, 1.5, **est)  # on the front, adding next to no hypervolume: still profiled
    got = promising_units([a, b, close, tiny], sp, failed=(), missing=lambda c: [64])
    assert got == {(1, 1): [64], (1, 2): [64], (2, 1): [64]}
    assert set(inspect.signature(promising_units).parameters) == {"evals", "space", "failed", "missing", "per_round"}
    assert not hasattr(selection, "NEAR_FRONT") and not hasattr(selection, "MIN_HV_GAIN")


def test_with_no_candidate_meeting_the_slo_the_nearest_are_promising():
    sp = space(slo=((L, 1.0),))
    est = dict(source="estimate:scaling")
    a, b, c = ev(1, 1, 10, 1.5, **est), ev(1, 2, 20, 3, **est), ev(1, 4, 30, 4, **est)
    d = ev(2, 8, 90, 20, **est)  # the best throughput, but the farthest from the SLO
    assert nearest([d, c, b, a], sp) == [a, b, c, d]
    got = promising_units([a, b, c, d], sp, failed=(), missing=lambda c: [64])
    assert got == {(1, 1): [64], (1, 2): [64], (1, 4): [64]}  # the three nearest, not d


def test_anchor_is_the_smallest_tp_at_a_middling_batch():
    sp = space()
    assert anchor_unit(sp.search, lambda tp, b: None) == (1, 4)
    assert anchor_unit(sp.search, lambda tp, b: "no" if tp == 1 else None) == (2, 4)
    assert anchor_unit(sp.search, lambda tp, b: "no") is None


def test_near_duplicate_front_rows_collapse_into_the_fewest_buckets():
    """Three rows of one unit a small bucket apart, within noise (472.1, 473.0, 473.1 tok/s):
    a person reads one, the one with the fewest buckets; another unit's row stays apart."""
    sp = space()
    lean = ev(2, 4, 472.1, 1.000, (128, 256))
    mid = ev(2, 4, 473.0, 1.004, (64, 128, 256))
    full = ev(2, 4, 473.1, 1.006, (64, 128, 256, 512))
    other = ev(1, 4, 473.0, 1.004, (128, 256))  # as close, but another unit: a different deployment
    apart = ev(2, 4, 520.0, 1.300, ALL)  # the same unit, 10% away: a real trade-off
    front = [lean, mid, full, other, apart]
    assert near_duplicates(front, sp) == [None, 0, 0, None, None]
    assert distinct(front, sp) == [lean, other, apart]


def test_the_front_table_keeps_every_row_and_marks_the_collapsed_ones():
    from search.results import front_table

    sp = space()
    front = [ev(2, 4, 472.1, 1.0, (128, 256)), ev(2, 4, 473.0, 1.004, ALL), ev(2, 8, 700.0, 2.0)]
    t = front_table(front, sp)
    assert list(t["rank"]) == [1, 2, 3] and len(t) == 3
    assert t["collapsed_into"].tolist()[1] == 1 and t["collapsed_into"].isna().tolist() == [True, False, True]


def evb(batch, t, l, rel) -> Evaluation:
    """An evaluation whose objectives are known to +-``rel`` (relative)."""
    e = ev(1, batch, t, l)
    return Evaluation(e.candidate, metrics=e.metrics, source="measured",
                      bounds={T: (t * (1 - rel), t * (1 + rel)), L: (l * (1 - rel), l * (1 + rel))})


def test_front_points_whose_intervals_overlap_a_better_ones_are_marked():
    sp = space()
    # lowest latency first; b and c are 2% apart on both objectives, each known to +-5%
    a, b, c, d = evb(1, 10, 1.0, 0.01), evb(2, 20, 2.0, 0.05), evb(4, 20.4, 2.04, 0.05), evb(8, 40, 4.0, 0.01)
    marks = may_be_dominated_by([a, b, c, d], sp)
    assert marks == [[], [2], [1], []]
    # without intervals (nothing known of the noise) nothing is marked
    assert may_be_dominated_by([ev(1, 1, 10, 1), ev(1, 2, 20.4, 2.04)], sp) == [[], []]


def test_confirmation_runs_the_chosen_point_and_the_least_certain_near_it():
    sp = space()
    front = [evb(b, t, l, r) for b, t, l, r in
             [(1, 10, 1, 0.01), (2, 30, 1.2, 0.01), (4, 38, 1.5, 0.01), (8, 40, 3, 0.01), (16, 41, 6, 0.01)]]
    chosen = front.index(knee(front, sp))
    assert chosen == 2
    # the chosen point alone, then the ends (the farthest from what is picked; the throughput end on a tie)
    assert confirm_pick(front, 1, sp) == [2]
    assert confirm_pick(front, 2, sp) == [2, 4] and confirm_pick(front, 3, sp) == [0, 2, 4]
    assert confirm_pick(front, 9, sp) == [0, 1, 2, 3, 4]
    # a point near the knee known to +-20% joins from three picks up: it may be the better deployment
    front[1] = evb(2, 30, 1.2, 0.20)
    assert least_certain_near_knee(front, sp) == 1
    assert confirm_pick(front, 2, sp) == [2, 4] and confirm_pick(front, 3, sp) == [1, 2, 4]
    assert confirm_pick(front, 4, sp) == [0, 1, 2, 4]
    # a front as `make demo` printed it (tok/s/chip, E2E p90 in s, +-): the knee, batch 4, is the chosen
    # point; the least certain near it, batch 2, joins it instead of taking its place
    demo = [evb(b, t, l, r) for b, t, l, r in
            [(1, 703.7, 0.458, 0.017), (2, 765.2, 0.727, 0.032), (4, 901.9, 1.088, 0.018), (8, 946.1, 1.919, 0.012)]]
    assert knee(demo, sp) is demo[2] and least_certain_near_knee(demo, sp) == 1
    assert confirm_pick(demo, 1, sp) == [2] and confirm_pick(demo, 2, sp) == [2, 3]
    assert confirm_pick(demo, 3, sp) == [1, 2, 3]