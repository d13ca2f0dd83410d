"""lens.methods: which host costs of a unit's profiles an older way of measuring them produced."""
from __future__ import annotations

import dataclasses

from lens import methods
from lens.types import BucketProfile


def _p(bucket: int, method: int, **kw) -> BucketProfile:
    return BucketProfile(bucket=bucket, ttft_s=0.01, tbt_s=0.001, input_len=bucket - 1, l1=2, l2=64, t1_s=0.1,
                         t2_s=0.2, repeats=3, spread=0.0, host_costs_method=method, **kw)


def test_admission_offsets_of_an_unknown_method_are_outdated():
    unit = {64: _p(64, 0, admit_first_s=0.0012, admit_busy_s=0.0004), 128: _p(128, 0, admit_first_s=0.0012)}
    changes = methods.outdated(unit)
    assert [c.costs for c in changes] == [methods.CHANGES[1].costs]
    line = methods.advice(unit, "tp1 b4", "lensopt cache rm --tp 1 --batch 4")
    assert line.startswith("the cached tp1 b4's served-admission offsets (lens.admission) were stored before")
    assert line.endswith("to measure them anew: lensopt cache rm --tp 1 --batch 4") and "\n" not in line


def test_a_unit_measured_by_this_method_or_holding_no_offset_is_not_outdated():
    now = {64: _p(64, methods.HOST_COSTS, admit_first_s=0.0012, admit_next_s=-0.0001)}
    assert methods.outdated(now) == () and methods.advice(now, "tp1 b4", "x") is None
    # an offset of 0 was never measured (a static target, a runner without continuous mode): nothing to redo
    static = {64: _p(64, 0), 128: _p(128, 0, row_s=1e-5)}
    assert methods.outdated(static) == () and methods.advice(static, "tp1 b4", "x") is None
    assert methods.outdated({}) == ()


def test_one_old_profile_among_new_ones_is_enough():
    old = _p(64, 0, admit_next_s=0.0002)
    new = dataclasses.replace(old, bucket=128, host_costs_method=methods.HOST_COSTS)
    assert methods.outdated({64: old, 128: new}) == (methods.CHANGES[1],)
    # but an old one that holds none of the changed costs is not
    assert methods.outdated({64: dataclasses.replace(old, admit_next_s=0.0), 128: new}) == ()


def test_every_version_says_what_it_changed():
    assert sorted(methods.CHANGES) == list(range(1, methods.HOST_COSTS + 1))
    for change in methods.CHANGES.values():
        assert change.costs and change.before


def test_a_static_prediction_is_not_told_of_costs_only_serving_reads():
    unit = {64: _p(64, 0, admit_first_s=0.0012)}
    assert methods.CHANGES[1].serving_only
    assert methods.outdated(unit, serving=False) == () and methods.advice(unit, "u", "x", serving=False) is None
    assert methods.outdated(unit, serving=True) == (methods.CHANGES[1],)


def test_a_known_older_method_is_named_as_such(monkeypatch):
    later = methods.Change("row costs", "count each row twice", lambda p: p.row_s != 0, serving_only=False)
    monkeypatch.setattr(methods, "HOST_COSTS", 2)
    monkeypatch.setattr(methods, "CHANGES", {**methods.CHANGES, 2: later})
    unit = {64: _p(64, 1, admit_first_s=0.001, row_s=2e-5)}
    assert methods.outdated(unit) == (later,)  # measured after change 1: only the later one touches it
    assert methods.advice(unit, "tp1 b8", "again", serving=False) == (
        "the cached tp1 b8's row costs were measured by an older method: they count each row twice; "
        "to measure them anew: again")
    both = methods.advice({64: _p(64, 0, admit_first_s=0.001, row_s=2e-5)}, "tp1 b8", "again")
    assert "served-admission offsets (lens.admission) and row costs were stored before" in both
    assert "; the row costs count each row twice; to measure them anew: again" in both
