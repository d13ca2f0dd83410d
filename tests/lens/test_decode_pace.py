"""How a served decode's pace wanders: the measurement's reading, the paths, and the machine run along them."""
import dataclasses
import math

import numpy as np
import pytest

from lens import decode_pace as dp
from lens import prefill_tail
from lens.serving import predict_serving
from lens.serving_metrics import summarize_serving_prediction
from lens.types import Requests

from servingkit import prof, table  # tests/lens is on sys.path (pytest rootdir imports)


def test_the_workload_is_lone_requests_decoding_one_after_another():
    p = prof(8)  # TTFT_b 1 s, TBT_b 0.1 s, prompt 1
    req = dp.workload(p, lone=5, steps=10)
    assert list(req.output_len) == [11] * 5 and list(req.input_len) == [1] * 5
    # each a gap after the one before is expected to end (its prefill and steps, with half as much again)
    assert np.allclose(np.diff(req.arrival_s), dp.GAP_S + 1.5 * (1.0 + 10 * 0.1))
    # as many steps as the largest bucket holds after the prompt, and none under FEWEST
    assert dp.steps_for(p, (8, 16)) == 15 and dp.steps_for(dataclasses.replace(p, input_len=12), (8, 16)) is None
    assert dp.steps_for(p, (64, 512)) == dp.STEPS


def test_residuals_are_about_the_calls_mean_and_neighbours_are_consecutive_lone_requests():
    req = Requests(np.ones(5, np.int64), np.full(5, 11, np.int64), np.array([0.0, 1.0, 2.0, 2.001, 4.0]))
    ttft = np.full(5, 0.01)
    decode = np.array([0.10, 0.12, 0.11, 0.30, 0.09])  # the fourth arrived while the third ran
    c = dp.read(req, ttft, ttft + decode)
    kept = np.array([0.10, 0.12, 0.11, 0.09])
    assert np.allclose(c.residual, kept / kept.mean() - 1.0) and np.allclose(c.decode_s, kept)
    # the fifth's predecessor (the fourth) was left out: it is no one's neighbour
    assert list(c.follows) == [False, True, True, False]
    assert np.allclose(c.spacing_s[1:3], 1.0) and np.isnan(c.spacing_s[[0, 3]]).all()


def _calls(x: np.ndarray, per: int, spacing: float, decode_s: float = 0.08) -> list[dp.Call]:
    """Calls of ``per`` lone requests whose residuals are ``x`` (mean-centred per call), ``spacing`` apart."""
    out = []
    for k in range(0, x.size, per):
        r = x[k:k + per]
        r = r - r.mean()
        follows = np.r_[False, np.ones(r.size - 1, bool)]
        out.append(dp.Call(r, decode_s * (1.0 + r), follows, np.r_[np.nan, np.full(r.size - 1, spacing)]))
    return out


def test_the_correlation_time_comes_from_neighbours_at_their_spacing():
    rng = np.random.default_rng(1)
    a = 0.6  # lag-one correlation of an AR(1) sequence
    z = np.empty(20_000)
    z[0] = rng.standard_normal()
    for k in range(1, z.size):
        z[k] = a * z[k - 1] + math.sqrt(1 - a * a) * rng.standard_normal()
    got = dp.solve(_calls(0.1 * z, 2000, 0.2), p=prof(8))
    assert got.rho == pytest.approx(a, abs=0.03) and got.spacing_s == pytest.approx(0.2)
    assert got.tau_s == pytest.approx(-0.2 / math.log(a), rel=0.1)
    assert got.window_s == pytest.approx(0.08, rel=0.01) and got.n == 20_000 and len(got.quantiles) == dp.LEVELS
    # independent neighbours: no correlation time
    flat = dp.solve(_calls(0.1 * rng.standard_normal(4000), 2000, 0.2), p=prof(8))
    assert abs(flat.rho) < 0.05 or flat.tau_s < 0.1
    assert "no correlation seen" in dp.solve(_calls(np.tile([0.1, -0.1], 30), 30, 0.2), p=prof(8)).said()
    few = dp.solve(_calls(np.zeros(10), 10, 0.2), p=prof(8))
    assert few.quantiles == () and "fewer than" in few.note and few.said() == few.note


def test_each_run_takes_the_whole_distribution_and_keeps_a_decodes_mean():
    q = tuple(np.linspace(-0.2, 0.4, dp.LEVELS))
    runs = dp.paths(q, 0.1, 0.5, 300.0, 4)
    assert len(runs) == 4 and all(r.cell_s == pytest.approx(0.1) for r in runs)
    f = np.array([r.factor for r in runs])
    # the same factors in every run, only their order drawn
    assert np.allclose(np.sort(f, axis=1), np.sort(f[0])) and not np.allclose(f[0], f[1])
    # spread as the quantiles are (a ratio of 1.4 / 0.8 between the extremes) ...
    assert f.max() / f.min() == pytest.approx(1.4 / 0.8, rel=0.02)
    # ... and an uninterrupted decode does its composed seconds in as many wall seconds
    for r in runs:
        assert r.work(300.0) == pytest.approx(300.0, rel=1e-9)
    # neighbouring cells correlate about as exp(-cell / tau) says (ranks: the levels are evenly spaced)
    lag1 = np.mean([np.corrcoef(row[:-1], row[1:])[0, 1] for row in f])
    assert lag1 == pytest.approx(math.exp(-0.1 / 0.5), abs=0.05)
    assert dp.paths(q, 0.1, 0.5, 300.0, 4) is not runs and all(
        a.factor == b.factor for a, b in zip(runs, dp.paths(q, 0.1, 0.5, 300.0, 4)))
    assert dp.paths((), 0.1, 0.5, 300.0, 4) == [] and dp.paths(q, 0.0, 0.5, 300.0, 4) == []


def test_without_correlation_cells_are_independent_and_a_long_horizon_has_coarser_cells():
    q = tuple(np.linspace(-0.2, 0.4, dp.LEVELS))
    f = np.array(dp.paths(q, 0.1, 0.0, 300.0, 1)[0].factor)
    assert abs(np.corrcoef(f[:-1], f[1:])[0, 1]) < 0.1
    long = dp.paths(q, 0.001, 0.0, 10_000.0, 1)[0]
    assert len(long.factor) == dp.CELLS_MAX and long.cell_s == pytest.approx(10_000.0 / dp.CELLS_MAX)


def test_work_and_wall_are_inverses_past_the_paths_end():
    p = dp.Pace(0.5, [2.0, 1.0], [0.0, 0.5, 1.5])  # half speed for 0.5 s, then full speed for 0.5 s
    assert p.work(0.5) == pytest.approx(0.25) and p.work(1.0) == pytest.approx(0.75)
    assert p.work(1.25) == pytest.approx(0.875)  # the path repeats from its start
    for t in (0.0, 0.1, 0.5, 0.7, 1.0, 3.3, 17.2):
        assert p.wall(p.work(t)) == pytest.approx(t)


def _paced(batch: int, factor: list[float], cell_s: float = 1.0) -> object:
    """A unit table whose runs are paced as ``factor`` says, cell by cell (one level: every run alike)."""
    t = table(batch=batch)
    return t, dp.Pace(cell_s, factor, list(np.r_[0.0, np.cumsum(1.0 / np.asarray(factor))]))


def test_a_decode_in_a_slow_spell_takes_longer_and_an_arrival_still_lands_on_the_next_step(monkeypatch):
    # the device runs at half speed for its first 10 s: the decode of a request at 0 (prefill 1 s, 5 steps of
    # 0.1 s) takes twice its composed 0.5 s; the prefill is the prefill tail's, not the pace's
    t, pace = _paced(2, [2.0] * 10 + [1.0] * 10)
    monkeypatch.setattr(dp, "paths", lambda *a, **k: [pace] * a[4])
    paced = dataclasses.replace(t, decode_pace=(0.0, 0.0), decode_pace_window_s=1.0)
    req = Requests(np.array([1, 1]), np.array([6, 2]), np.array([0.0, 1.25]))
    plain = predict_serving(t, req)
    got = predict_serving(paced, req)
    assert np.allclose(plain.finish_s[0] - plain.first_s[0], 0.5 + 1.0)  # its decode, stopped by the 2nd prefill
    run = got.tail_runs
    assert np.allclose(run.first_s[0], 1.0)
    # the second arrives 0.25 s into the first's decode: it is admitted at the end of the step under way (each
    # step 0.2 s now: at 1.4 s), not after a step's composed time
    assert np.allclose(run.admit_s[1], 1.4)
    assert np.allclose(run.finish_s[0] - run.first_s[0], 2 * 0.5 + 1.0)


def test_an_even_pace_changes_nothing_and_a_wandering_one_widens_tpot_but_keeps_its_mean():
    n = 200
    rng = np.random.default_rng(3)
    req = Requests(np.ones(n, np.int64), rng.integers(6, 16, n), np.sort(rng.uniform(0.0, 2000.0, n)))
    t = table(batch=4)
    even = dataclasses.replace(t, decode_pace=(0.0, 0.0), decode_pace_window_s=5.0, decode_pace_tau_s=20.0)
    plain = predict_serving(t, req)
    flat = predict_serving(even, req)
    assert plain.tail_runs is None and flat.tail_runs.finish_s.shape == (n, prefill_tail.replicas(n))
    assert np.allclose(flat.tail_runs.finish_s, plain.finish_s[:, None])
    wide = dataclasses.replace(even, decode_pace=tuple(np.linspace(-0.3, 0.5, 101)))
    a, b = summarize_serving_prediction(req, plain), summarize_serving_prediction(req, predict_serving(wide, req))
    assert b["tpot_p90_s"] > 1.1 * a["tpot_p90_s"] and b["tpot_p50_s"] < a["tpot_p90_s"]
    assert b["tpot_mean_s"] == pytest.approx(a["tpot_mean_s"], rel=0.05)
    # the throughput is the composed run's
    assert b["request_throughput_req_s"] == a["request_throughput_req_s"]


def test_the_unit_table_takes_the_pace_from_its_profiles():
    from lens.compose import UnitTable
    from lens.types import Candidate

    pace = dict(decode_pace=(-0.1, 0.0, 0.2), decode_pace_window_s=0.08, decode_pace_tau_s=0.3)
    profiles = {b: dataclasses.replace(prof(b), **pace) for b in (8, 16)}
    t = UnitTable.build(Candidate(1, 2, (8, 16), (8, 16)), profiles, policy="exclusive")
    assert (t.decode_pace, t.decode_pace_window_s, t.decode_pace_tau_s) == tuple(pace.values())
    assert dp.unit_pace([prof(8)]) == ((), 0.0, 0.0) and table(batch=2).decode_pace == ()
