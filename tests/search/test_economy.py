"""The search economy's parts on small cases: hypervolume gains, the compile-time model, the
linear designs, the physical prior's measured spread, the choice and its stop rules, and
the whole choice loop on a tiny simulated space (no Ray: units are measured in-process)."""
import dataclasses

import numpy as np
import pytest

from searchkit import write_space
from lens.compose import UnitTable, predict
from lens.distributions import sample
from lens.metrics import summarize_prediction
from lens.types import BucketProfile, Candidate
from lens.workload import fit_to
from runners import get_runner
from search.cost import CompileModel, Cost, CostModel, TaskRecord
from search.design import Designs, DesignStack
from search.economy import UnitOption, decide, point_gains
from search.encoding import all_candidates
from search.evaluate import Evaluator
from search.pareto import hypervolume, pareto_mask
from search.physical import PhysicalPrior
from search.planner import ProfilePlanner
from search.profiler import measure_unit
from search.selection import front_of
from spaces import load_requests, load_space


def test_point_gains_are_the_area_a_point_adds_beyond_the_front():
    front = np.array([[10.0, 1.0]])
    # (20, 2) adds (20 - 10) x (3 - 2); (5, 0.5) adds 5 x (1 - 0.5) below the front's latency, nothing after
    got = point_gains(np.array([20.0, 5.0, 8.0]), np.array([2.0, 0.5, 1.5]), front, 3.0)
    assert got == pytest.approx([10.0, 2.5, 0.0])
    # and it is what the hypervolume says
    hv0 = hypervolume(front[:, 0], front[:, 1], ref_latency=3.0)
    hv1 = hypervolume(np.array([10.0, 20.0]), np.array([1.0, 2.0]), ref_latency=3.0)
    assert hv1 - hv0 == pytest.approx(10.0)


def _records(fixed=100.0, per=10.0):
    return [TaskRecord(tp=1, batch=1, buckets=n, compile_s=fixed + per * n, run_s=1.0, probe_s=1.0) for n in (1, 2, 4)]


def test_compile_model_splits_the_fixed_part_from_the_part_per_bucket():
    m = CompileModel.fit(_records())
    assert m.fixed_s == pytest.approx(100.0, rel=1e-3) and m.per_bucket_s == pytest.approx(10.0, rel=1e-3)
    assert m.worst < 1e-3
    assert CompileModel.fit([]) is None


@pytest.fixture(scope="module")
def space_file(tmp_path_factory):
    return write_space(tmp_path_factory.mktemp("economy"))


def test_reopening_a_unit_pays_its_fixed_compile_again(space_file):
    sp = load_space(space_file)
    cm = CostModel(buckets=sp.search.buckets, policy="exclusive", profile=sp.profile, records=_records())
    one = cm.predict(4, [128, 256], [0.01, 0.01], [0.001, 0.001])
    a = cm.predict(4, [128], [0.01], [0.001])
    b = cm.predict(4, [256], [0.01], [0.001])
    assert a.mean_s + b.mean_s == pytest.approx(one.mean_s + 100.0, rel=1e-3)
    assert one.high_s > one.mean_s


@pytest.mark.parametrize("prefill", ["sequential", "batched"])
def test_a_design_predicts_what_compose_predicts(space_file, prefill):
    sp = load_space(space_file)
    reqs, _ = fit_to(sample("sharegpt", 50, 3), 1024)
    c = Candidate(1, 4, (256, 512, 1024), (256, 512, 1024))
    designs = Designs(reqs, policy="exclusive", mode=sp.target.batching, prefill=prefill)
    buckets = sp.search.buckets
    stack = DesignStack([designs(c)], buckets)
    rng = np.random.default_rng(0)
    ttft, tbt = rng.uniform(0.01, 0.1, (3, len(buckets))), rng.uniform(1e-3, 1e-2, (3, len(buckets)))
    names = ["throughput_tok_s_per_chip", "e2e_p90_s", "ttft_mean_s", "tpot_p50_s"]
    got = stack.metrics(ttft, tbt, names, chips=np.array([1]))
    for d in range(3):
        prof = {b: BucketProfile(bucket=b, ttft_s=float(ttft[d, i]), tbt_s=float(tbt[d, i]), input_len=1, l1=1, l2=2,
                                 t1_s=0.0, t2_s=0.0, repeats=0, spread=0.0) for i, b in enumerate(buckets)}
        p = predict(UnitTable.build(c, prof, policy="exclusive", prefill=prefill), reqs, mode=sp.target.batching)
        want = summarize_prediction(reqs, p, chips=1)
        for n in names:
            assert got[n][0, d] == pytest.approx(want[n], rel=1e-9), n


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Every unit of a small simulated space (15 units, 5 buckets), measured with every bucket."""
    p = write_space(tmp_path_factory.mktemp("tiny"))
    p.write_text(p.read_text().replace("tp = [1, 2]", "tp = [1, 2, 4]").replace("batch = [1, 4]", "batch = [1, 2, 4, 8, 16]")
                 .replace("buckets = [128, 256, 512, 1024]", "buckets = [128, 256, 512, 1024, 2048]"))
    sp = load_space(p)
    b = sp.search.buckets
    units = {}
    for tp in sp.search.tp:
        for batch in sp.search.batch:
            # a runner of its own per task, as a Ray task has: nothing compiled is reused
            units[(tp, batch)] = measure_unit(sp.target, tp=tp, batch=batch, buckets=b, all_buckets=b,
                                              profile=sp.profile, runner=get_runner(sp.target))
    return sp, units


def test_the_physical_prior_spread_is_measured_and_covers_a_left_out_unit(tiny):
    sp, units = tiny
    prior = PhysicalPrior(sp.target.model, sp.target.dtype, buckets=sp.search.buckets, policy="exclusive",
                          max_output=sp.profile.max_output)
    out = (2, 4)
    measured = {u: m.profiles for u, m in units.items() if u != out and u[0] <= 2}
    pre, dec = prior.fit(measured)
    for fit in (pre, dec):
        assert 0 < fit.bucket_sd < 1 and 0 < fit.unit_sd < 1
    bel = prior.belief(*out, measured)
    assert not bel.measured.any()
    truth = units[out].profiles
    for log, attr, i in ((bel.log_ttft, "ttft_s", 0), (bel.log_tbt, "tbt_s", 1)):
        sd = np.hypot(bel.shared_sd[i], bel.bucket_sd[i])
        z = (np.log([getattr(truth[b], attr) for b in bel.buckets]) - log) / sd
        assert np.abs(z).max() < 3.5, (attr, z)
    # its own buckets condition a partly measured unit: a measured bucket is as measured, the
    # others carry less spread than a unit nothing is known of
    part = {**measured, out: {128: truth[128]}}
    bel2 = prior.belief(*out, part)
    assert bel2.measured.tolist() == [b == 128 for b in bel2.buckets]
    assert np.exp(bel2.log_ttft[0]) == pytest.approx(truth[128].ttft_s)
    assert bel2.shared_sd[0] < bel.shared_sd[0] and bel2.shared_sd[1] < bel.shared_sd[1]


def test_with_batched_prefill_the_prior_keeps_ttft_as_one_call_of_the_batch(tiny):
    sp, units = tiny
    kw = dict(buckets=sp.search.buckets, policy="exclusive", max_output=sp.profile.max_output)
    seq = PhysicalPrior(sp.target.model, sp.target.dtype, **kw)
    bat = PhysicalPrior(sp.target.model, sp.target.dtype, prefill="batched", **kw)
    measured = {u: m.profiles for u, m in units.items()}
    for u in ((1, 4), (2, 16)):
        for prior in (seq, bat):  # a measured unit's numbers come back as measured, either way
            ttft, _ = prior.belief(*u, measured).median()
            assert ttft == pytest.approx([measured[u][b].ttft_s for b in sp.search.buckets])
    # profiles of a batched prefill (one call of the batch's prompts: batch x the per-row
    # time) predict an unmeasured unit as batch x what the per-prompt profiles predict
    part = {u: p for u, p in measured.items() if u[1] != 16}
    as_batched = {u: {b: dataclasses.replace(p, ttft_s=p.ttft_s * u[1]) for b, p in prof.items()}
                  for u, prof in part.items()}
    a, _ = seq.belief(2, 16, part).median()
    b, _ = bat.belief(2, 16, as_batched).median()
    assert b == pytest.approx(16 * a, rel=1e-6)


def _option(throughput_draws, cost_s, latency=1.0):
    """One unit, one candidate missing bucket 128, whose draws put it at these throughputs."""
    t = np.asarray(throughput_draws, float)
    draws = np.stack([t, np.full_like(t, latency)], axis=-1)[None]
    return UnitOption(unit=(1, 1), missing=(frozenset({128}),), draws=draws, median=draws[:, 0],
                      cost=lambda s: Cost(mean_s=cost_s, high_s=2 * cost_s))


def test_decide_chooses_stops_on_evidence_and_keeps_the_budget_cap():
    front = np.array([[10.0, 1.0], [20.0, 2.0]])  # hypervolume 14 to the reference latency 2.2
    worth = _option([30.0, 30.0], 100.0, latency=2.0)  # adds (30 - 20) x 0.2 = 2: a seventh of it
    d = decide([worth], front, stop_gain=0.01, per_round=1, budget_left_s=None)
    assert [c.unit for c in d.choices] == [(1, 1)] and d.stop is None
    assert d.choices[0].gain == pytest.approx(2.0) and d.hypervolume == pytest.approx(14.0)
    # a candidate every draw puts behind the front: nothing is expected, profiling stops
    d = decide([_option([15.0, 19.0], 100.0, latency=2.1)], front, stop_gain=0.01, per_round=1, budget_left_s=None)
    assert not d.choices and "no choice is expected" in d.stop
    # worth it, but its cost bound (200 s) does not fit what the cap leaves
    d = decide([worth], front, stop_gain=0.01, per_round=1, budget_left_s=150.0)
    assert not d.choices and "budget" in d.stop
    # the fraction is the user's: one above a seventh stops what a small one takes
    d = decide([worth], front, stop_gain=0.2, per_round=1, budget_left_s=None)
    assert not d.choices and "no choice is expected" in d.stop


def test_the_economy_finds_the_true_front_of_a_small_space_for_less_than_exhaustive(tiny):
    """The search's choice loop (planner, prior, cost model) against every unit measured.

    The search's own measurements differ from the exhaustive ones by the simulator's noise
    (a few percent per unit), which the score counts against it: hence 98%, not 99%."""
    sp, units = tiny
    reqs, _ = load_requests(sp)
    truth = Evaluator(sp, reqs)
    for u, m in units.items():
        truth.set_measured(u, m.profiles)
    cands = list(all_candidates(sp.search))
    tv = np.array([e.values(sp) for e in map(truth.evaluate, cands) if e.metrics and e.meets_slo(sp)])
    tv = tv[pareto_mask(tv[:, 0], tv[:, 1])]
    ref = 1.1 * tv[:, 1].max()
    exhaustive_s = sum(m.hardware_s for m in units.values())

    ev = Evaluator(sp, reqs)
    prior = PhysicalPrior(sp.target.model, sp.target.dtype, buckets=sp.search.buckets, policy="exclusive",
                          max_output=sp.profile.max_output)
    ev.priors.append(prior)
    planner = ProfilePlanner(space=sp, requests=reqs, evaluator=ev, prior=prior, per_round=1)
    spent = 0.0

    def profile(unit, buckets):
        nonlocal spent
        m = measure_unit(sp.target, tp=unit[0], batch=unit[1], buckets=buckets, all_buckets=sp.search.buckets,
                         profile=sp.profile, runner=get_runner(sp.target))
        spent += m.hardware_s
        ev.set_measured(unit, m.profiles)
        planner.note_task(unit, buckets=len(m.profiles), compile_s=m.compile_s, run_s=m.run_s, profiles=m.profiles)

    anchor = (1, 4)
    profile(anchor, ev.needed(Candidate(1, 4, sp.search.buckets, sp.search.buckets)))
    stop = None
    for _ in range(30):
        measured = [e for e in map(ev.evaluate, planner.measured_sweep()) if e.metrics and e.measured]
        d = planner.decide(proposed=(), measured=measured, budget_left_s=None)
        if not d.choices:
            stop = d.stop
            break
        for ch in d.choices:
            profile(ch.unit, list(ch.buckets))
    assert stop is not None and "no choice is expected" in stop
    front = front_of([e for e in map(ev.evaluate, planner.measured_sweep()) if e.metrics and e.measured], sp)
    fv = np.array([truth.evaluate(e.candidate).values(sp) for e in front])  # scored on the full measurement
    share = hypervolume(fv[:, 0], fv[:, 1], ref_latency=ref) / hypervolume(tv[:, 0], tv[:, 1], ref_latency=ref)
    assert share >= 0.98, share
    assert spent < 0.8 * exhaustive_s, (spent, exhaustive_s)
