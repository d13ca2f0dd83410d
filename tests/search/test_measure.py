"""Measuring a unit on noisy hosts: stragglers caught and measured again, long runs sized to the slope,
the staircase's shape checked, and nothing corrupted stored as accepted (toy_npu and sim: SIMULATED)."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

from lens import decode_pace, methods
from lens.prefill_tail import LEVELS
from lens.probes import fit, plan_probes, probe_window
from lens.context_cost import STEPS
from lens.errors import RunnerError
from lens.rows import measured_context
from lens.types import ModelShape, ProbeRun, Target, Unit
from runners import get_runner
from search.measure import SHAPE_TOLERANCE, measure_unit
from search.profiler import profile_missing
from spaces import ProfileSettings
from store import ProfileCache

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "examples" / "command_runner" / "toy_npu.py"
MODEL = ModelShape(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=128256)
BUCKETS = (128, 256, 512, 1024)


def toy(*args: str, seed: int = 0) -> Target:
    return Target("toy", "command", "toy-npu", "exclusive", "bfloat16", MODEL,
                  (("argv", [sys.executable, str(TOY), *args]),), seed=seed)


def truth(target: Target, batch: int) -> dict:
    """The expected TTFT_b and TBT_b of the device: the mean of 300 repeats of every probe."""
    runner = get_runner(target)
    res = runner.profile(Unit(target, 1, batch), plan_probes(BUCKETS, policy="exclusive", max_output=128, repeats=300))
    return fit(res.runs, batch=batch, estimator="mean", draws=10)


def first_attempt(target: Target, batch: int) -> dict:
    """What the first measurement of ``measure_unit`` sees (the toy answers a request alike every time)."""
    s = ProfileSettings()
    runner = get_runner(target)
    probes = plan_probes(BUCKETS, policy="exclusive", max_output=s.max_output, repeats=s.repeats)
    return {b: f for b, f in fit(runner.profile(Unit(target, 1, batch), probes).runs, batch=batch,
                                 estimator="median").items()}


def off(a: float, b: float) -> float:
    return abs(a / b - 1)


def test_a_straggler_corrupted_bucket_is_caught_measured_again_and_never_stored_as_accepted(tmp_path):
    # 1 graph call in 20 takes 4x: the first three repeats of some bucket meet stragglers that a
    # median-of-three profile turns into a slope off by far more than the device's noise
    target, batch = toy("--mode", "straggler", "--straggler-every", "20", seed=5), 8
    true = truth(target, batch)
    first = first_attempt(target, batch)
    corrupted = [b for b in BUCKETS if off(first[b].tbt_s, true[b].tbt_s) > 0.10]
    assert corrupted, "the injected stragglers corrupt no bucket's first measurement: pick another seed"
    runner = get_runner(target)
    fp = runner.fingerprint()
    with ProfileCache.open(tmp_path / "c.sqlite") as cache:
        out = profile_missing(cache=cache, runner=runner, fingerprint=fp, tp=1, batch=batch, buckets=list(BUCKETS),
                              all_buckets=list(BUCKETS), profile=ProfileSettings())
        stored = cache.get_unit(fp, 1, batch)
    for b in corrupted:
        assert b in out.notes, f"bucket {b} was not measured again"
        p = stored[b]
        assert p.repeats > 3 or p.l2 > first[b].r2.probe.output_len  # more repeats, or a longer long run
        if p.accepted:  # what the cache accepts is the device's expected cost, within the bucket's own +-
            assert off(p.tbt_s, true[b].tbt_s) < max(3 * p.tbt_err_s / p.tbt_s, 0.05)
            assert off(p.ttft_s, true[b].ttft_s) < max(3 * p.ttft_err_s / p.ttft_s, 0.05)
            assert p.tbt_err_s / p.tbt_s <= ProfileSettings().max_spread
    # and no accepted profile in the cache carries a straggler's distortion
    for b, p in stored.items():
        if p.accepted:
            assert off(p.tbt_s, true[b].tbt_s) < 0.08 and off(p.ttft_s, true[b].ttft_s) < 0.08, b


def test_a_quiet_device_is_measured_once():
    m = measure_unit(toy(), tp=1, batch=4, buckets=BUCKETS, all_buckets=BUCKETS, profile=ProfileSettings())
    assert m.attempts == 1 and m.notes == {} and m.noisy == {}
    assert all(p.accepted and p.rel_err < 0.05 for p in m.profiles.values())
    assert set(m.bucket_s) == set(BUCKETS) and all(v > 0 for v in m.bucket_s.values())
    # every profile records the way this lensopt measures host costs, so a cache can tell an older one
    assert {p.host_costs_method for p in m.profiles.values()} == {methods.HOST_COSTS}


def sim(**options) -> Target:
    opts = {"drift": False, **options}
    return Target("s", "sim", "trn1", "exclusive", "bfloat16", MODEL, tuple(sorted(opts.items())), seed=1)


def test_the_long_run_grows_when_the_slope_hides_in_the_noise_of_t1():
    """Batch 32 at bucket 2048: 32 prefills make T1 long; 128 decode steps barely stand out of its noise."""
    buckets = (1024, 2048)
    target = sim(noise=0.03, stragglers=False)
    m = measure_unit(target, tp=2, batch=32, buckets=buckets, all_buckets=buckets, profile=ProfileSettings())
    lo, hi = probe_window(2048, buckets, "exclusive")
    p = m.profiles[2048]
    assert 128 < p.l2 <= hi - lo + 1  # grown, never past the bucket's window
    assert "long run grown" in m.notes[2048]
    assert p.tbt_err_s / p.tbt_s <= ProfileSettings().max_spread or not p.accepted


def test_a_staircase_that_breaks_its_shape_is_measured_again_and_kept_as_measured(monkeypatch):
    """A bucket whose runs come back too fast once is measured again; a real dip is kept, never fixed."""
    target = sim(noise=0.0, stragglers=False, quirks=0.0)
    runner = get_runner(target)
    real = runner.profile
    calls = []

    def once_too_fast(unit, probes):
        res = real(unit, probes)
        calls.append(sorted({p.bucket for p in probes}))
        if len(calls) > 1:
            return res
        runs = tuple(ProbeRun(r.probe, tuple(t * (0.8 if r.probe.bucket == 512 and r.probe.output_len > 2 else 1)
                                             for t in r.times_s)) for r in res.runs)
        return dataclasses.replace(res, runs=runs)

    monkeypatch.setattr(runner, "profile", once_too_fast)
    m = measure_unit(target, tp=1, batch=1, buckets=BUCKETS, all_buckets=BUCKETS, profile=ProfileSettings(),
                     runner=runner)
    assert 512 in calls[1] and "re-measured" in m.notes[512]
    tbt = [m.profiles[b].tbt_s for b in BUCKETS]
    assert all(b >= a * (1 - SHAPE_TOLERANCE) for a, b in zip(tbt, tbt[1:]))  # the clean runs restored the shape
    assert len(calls) >= 2


@pytest.mark.parametrize("repeats", [1, 3])
def test_every_bucket_of_the_unit_gets_its_cost(repeats):
    m = measure_unit(sim(stragglers=False), tp=1, batch=2, buckets=BUCKETS, all_buckets=BUCKETS,
                     profile=ProfileSettings(repeats=repeats))
    # and the runs of the row cost, of the served admissions, of a row's context and of resuming the decode
    assert sum(m.bucket_s.values()) + m.rows_s + m.admission_s + m.context_s + m.resume_s + m.busy_resume_s + \
        m.tail_s == pytest.approx(m.run_s, rel=1e-9)
    assert all(p.repeats >= repeats for p in m.profiles.values())
    assert np.isfinite([p.ttft_err_s for p in m.profiles.values()]).all()


# -- the host's cost per live row (lens.rows) ---------------------------------------------------------

def test_the_host_cost_of_a_live_row_is_measured_and_kept_in_every_profile():
    # the simulated stack's host handles each generating row after every step: 20 us a row as shipped
    m = measure_unit(sim(noise=0.0, stragglers=False), tp=1, batch=16, buckets=BUCKETS, all_buckets=BUCKETS,
                     profile=ProfileSettings())
    assert m.rows is not None and m.rows.value == pytest.approx(2e-5, rel=0.02) and m.rows.note == ""
    assert {p.row_s for p in m.profiles.values()} == {m.rows.value} and m.rows_s > 0
    # a stack without that host work shows none beyond its noise (counted as none, or as the little seen)
    m = measure_unit(sim(noise=0.01, stragglers=False, row_host=False), tp=1, batch=16, buckets=BUCKETS,
                     all_buckets=BUCKETS, profile=ProfileSettings())
    assert abs(m.rows.raw) < 4 * m.rows.err and m.rows.value <= max(m.rows.raw, 0.0)
    assert m.rows.value < 2e-5 / 2 and all(p.row_s == m.rows.value for p in m.profiles.values())
    # a batch of one has no row that could end early: nothing is run for it
    m = measure_unit(sim(), tp=1, batch=1, buckets=BUCKETS, all_buckets=BUCKETS, profile=ProfileSettings())
    assert m.rows is None and m.rows_s == 0.0


def test_the_row_cost_stands_on_a_device_with_stragglers_and_through_the_command_protocol():
    # 1 graph call in 50 takes 4x: the short runs and the median over the pairs see past them
    m = measure_unit(sim(straggler_rate=0.02, straggler_factor=4.0), tp=1, batch=32, buckets=BUCKETS[:2],
                     all_buckets=BUCKETS, profile=ProfileSettings())
    assert m.rows.value == pytest.approx(2e-5, rel=0.25), m.rows
    # the example program's host spends 10 us per generating row per step (its own model, not lens')
    m = measure_unit(toy(), tp=1, batch=8, buckets=BUCKETS[:2], all_buckets=BUCKETS, profile=ProfileSettings())
    assert m.rows.value == pytest.approx(1e-5, abs=3 * m.rows.err), m.rows


# -- what the server's admissions cost against TTFT_b (lens.admission) ----------------------------------

@pytest.mark.parametrize("batch", [4, 8])
def test_a_server_that_launches_once_a_pass_is_measured_against_the_profile(batch):
    # the simulated stack pays a 3 ms launch once per generate call and once per served admission pass: a
    # static probe spreads it over its batch, a lone arrival pays all of it
    launch = 3e-3
    m = measure_unit(sim(noise=0.0, stragglers=False), tp=1, batch=batch, buckets=BUCKETS, all_buckets=BUCKETS,
                     profile=ProfileSettings())
    a = m.admission
    assert a is not None and a.burst == batch and m.admission_s > 0
    assert a.first_s == pytest.approx(launch * (1 - 1 / batch), rel=0.05), a
    assert a.next_s == pytest.approx(-launch / batch, rel=0.1), a
    assert {(p.admit_first_s, p.admit_next_s) for p in m.profiles.values()} == {(a.first_s, a.next_s)}
    # it pays the launch whatever the device was doing: a pass that stops a running decode costs the same, once
    # the lone requests' wait for the step under way is taken out
    assert a.busy_measured and a.busy_s == pytest.approx(launch * (1 - 1 / batch), abs=3 * a.busy_err_s), a
    assert 0 < a.busy_err_s < 0.2 * launch and {p.admit_busy_s for p in m.profiles.values()} == {a.busy_s}
    # as shipped (1% noise, stragglers): still within a few percent
    m = measure_unit(sim(), tp=1, batch=batch, buckets=BUCKETS[:2], all_buckets=BUCKETS, profile=ProfileSettings())
    assert m.admission.first_s == pytest.approx(launch * (1 - 1 / batch), rel=0.1), m.admission


def test_a_batch_of_one_prices_a_busy_pass_as_an_idle_one():
    # no slot is free while a request decodes: the busy call is not run, and one offset prices both passes
    m = measure_unit(sim(noise=0.0, stragglers=False), tp=1, batch=1, buckets=BUCKETS[:2], all_buckets=BUCKETS,
                     profile=ProfileSettings())
    a = m.admission
    assert a is not None and not a.busy_measured and a.busy_s == a.first_s
    assert "during a decode" not in a.said() and {p.admit_busy_s for p in m.profiles.values()} == {a.first_s}


def test_a_runner_that_fails_the_busy_call_keeps_its_idle_offsets_and_says_why(monkeypatch):
    runner = get_runner(sim(noise=0.0, stragglers=False))
    real = runner.run_workload

    def refusing(cand, requests, **kw):
        if requests.name.startswith("admission-busy"):
            raise RunnerError("the carrier's output is longer than this engine serves")
        return real(cand, requests, **kw)

    monkeypatch.setattr(runner, "run_workload", refusing)
    m = measure_unit(sim(noise=0.0, stragglers=False), tp=1, batch=4, buckets=BUCKETS, all_buckets=BUCKETS,
                     profile=ProfileSettings(), runner=runner)
    a = m.admission
    assert a.first_s == pytest.approx(3e-3 * (1 - 1 / 4), rel=0.05), a  # the idle offsets measured as ever
    assert not a.busy_measured and a.busy_s == a.first_s
    assert "a pass during a decode not measured (" in a.note and "the carrier's output is longer" in a.note


def test_an_undecided_offset_is_measured_again_with_more_rounds_once(monkeypatch):
    from lens import admission as admission_cost

    target = sim(noise=0.01, stragglers=False)
    calls = []

    def count(decided):
        runner = get_runner(target)
        plain = runner.run_workload

        def counted(cand, requests, **kw):
            calls.append(requests.name)
            return plain(cand, requests, **kw)

        runner.run_workload = counted
        monkeypatch.setattr(admission_cost, "undecided", lambda cost: not decided)
        calls.clear()
        m = measure_unit(target, tp=1, batch=4, buckets=BUCKETS[:2], all_buckets=BUCKETS,
                         profile=ProfileSettings(), runner=runner)
        return m, sum(1 for name in calls if name.startswith("admission-static"))

    m, static_calls = count(decided=True)
    assert static_calls == admission_cost.ROUNDS and "rounds" not in m.admission.note
    first = m.admission
    m, static_calls = count(decided=False)  # undecided however many rounds: more once, never again
    assert static_calls == admission_cost.ROUNDS + admission_cost.MORE_ROUNDS
    assert f"{static_calls} rounds (an offset was undecided after {admission_cost.ROUNDS})" in m.admission.note
    # a runner that fails the further rounds leaves the first rounds' offsets as they were, and says so
    runner = get_runner(target)
    plain = runner.run_workload
    static_calls = []

    def failing_late(cand, requests, **kw):
        if requests.name.startswith("admission-static"):
            static_calls.append(1)
            if len(static_calls) > admission_cost.ROUNDS:
                raise RunnerError("the engine went away")
        return plain(cand, requests, **kw)

    runner.run_workload = failing_late
    m = measure_unit(target, tp=1, batch=4, buckets=BUCKETS[:2], all_buckets=BUCKETS, profile=ProfileSettings(),
                     runner=runner)
    a = m.admission
    assert (a.raw_first_s, a.first_err_s, a.raw_busy_s) == (first.raw_first_s, first.first_err_s, first.raw_busy_s)
    assert "the rounds run again for an undecided offset failed (RunnerError: the engine went away)" in a.note
    assert m.unmeasured() == {}


def test_a_server_that_costs_what_the_profile_says_shows_none_beyond_its_noise():
    m = measure_unit(sim(noise=0.01, launch=False), tp=1, batch=4, buckets=BUCKETS[:2], all_buckets=BUCKETS,
                     profile=ProfileSettings())
    a = m.admission
    for kept, raw, err in ((a.first_s, a.raw_first_s, a.first_err_s), (a.next_s, a.raw_next_s, a.next_err_s),
                           (a.busy_s, a.raw_busy_s, a.busy_err_s)):
        assert kept == 0.0 or abs(raw) > 3 * err
        assert abs(kept) < 0.02 * m.profiles[BUCKETS[0]].ttft_s  # nothing of the size of a launch


def test_the_admission_cost_comes_through_the_command_protocol_and_is_skipped_where_nothing_serves():
    # the example program: a static call's 1.5 ms spread over the batch; its server 0.3 ms per admitted prompt
    # (+0.11 ms a prompt: about 1% of its prefill here, the size of its run-to-run factor)
    m = measure_unit(toy(), tp=1, batch=8, buckets=BUCKETS[:2], all_buckets=BUCKETS, profile=ProfileSettings())
    a, want = m.admission, 0.3e-3 - 1.5e-3 / 8
    assert a.burst == 8 and m.admission_s > 0 and a.first_err_s > 0
    assert abs(a.raw_first_s - want) <= 3 * a.first_err_s and abs(a.raw_next_s - want) <= 3 * a.next_err_s, a
    # a runner that does not serve continuous mode is never asked to: nothing run, nothing kept
    runner = get_runner(sim())
    runner.modes = ("static",)
    m = measure_unit(sim(), tp=1, batch=4, buckets=BUCKETS[:1], all_buckets=BUCKETS, profile=ProfileSettings(),
                     runner=runner)
    assert m.admission is None and m.admission_s == 0.0
    assert all(p.admit_first_s == p.admit_next_s == 0.0 for p in m.profiles.values())


# -- what a live row's context costs a decode step (lens.context_cost) ------------------------------------

def test_a_paged_decode_kernels_reads_are_measured_and_a_bucket_shaped_one_shows_none():
    # the simulated TPU stack reads each row's own pages (ragged paged attention); what its graphs cost the
    # measurement's two batches, step by step (contexts prompt + 1 .. prompt + STEPS), per token of difference
    tpu = Target("s", "sim", "tpu-v6e", "inclusive", "bfloat16", MODEL,
                 (("drift", False), ("noise", 0.0), ("stragglers", False)), seed=1)
    runner = get_runner(tpu)
    m = measure_unit(tpu, tp=1, batch=4, buckets=BUCKETS, all_buckets=BUCKETS, profile=ProfileSettings(),
                     runner=runner)
    c = m.context
    assert c is not None and c.bucket == 1024 and m.context_s > 0 and c.note == "", c
    g = runner._graphs(1, 4)
    steps = np.arange(1, STEPS + 1)[:, None] + np.zeros((1, 4), np.int64)
    d = [float(g.decode_s(length + steps, np.full(STEPS, 1024)).sum()) for length in (c.short_len, c.long_len)]
    device = (d[1] - d[0]) / (STEPS * 4 * (c.long_len - c.short_len))
    assert c.value == pytest.approx(device, rel=0.02), (c, device)
    assert {p.kv_token_s for p in m.profiles.values()} == {c.value}
    # the row cost's measured row (its reads are taken out of the row cost where a step is composed)
    assert {p.row_context for p in m.profiles.values()} == {measured_context(m.profiles[BUCKETS[0]])}
    # NxD Inference's token-generation kernel takes the bucket's whole cache: none counted, as shipped (noise
    # and stragglers on)
    m = measure_unit(sim(), tp=1, batch=4, buckets=BUCKETS, all_buckets=BUCKETS, profile=ProfileSettings())
    assert m.context is not None and m.context.value == 0.0 and "none counted" in m.context.note, m.context
    assert all(p.kv_token_s == 0.0 for p in m.profiles.values())


# -- what resuming the decode after a served admission costs (lens.resume) ------------------------------------

def test_a_stack_whose_decode_resumes_slowly_is_measured_and_a_steady_one_shows_none():
    # the simulated stacks run every step at its cost whatever came before: none counted, as shipped
    served = dataclasses.replace(sim(), serving="continuous")
    m = measure_unit(served, tp=1, batch=4, buckets=BUCKETS[:2], all_buckets=BUCKETS, profile=ProfileSettings())
    r = m.resume
    assert r is not None and r.bucket == BUCKETS[0] and r.prompt == 1 and m.resume_s > 0 and r.err > 0, r
    assert abs(r.value) < 0.5 * m.profiles[BUCKETS[0]].tbt_s, r  # nothing of the size of a step
    assert {p.resume_s for p in m.profiles.values()} == {r.value}
    # a stack that pays 40 ms whenever its decode resumes after a prefill (every request of the measurement
    # is alone: it resumes once per request): measured through the runner, kept in every profile
    runner = get_runner(served)
    plain = runner.run_workload

    def slow_resume(cand, requests, *, mode="static"):
        run = plain(cand, requests, mode=mode)
        if mode == "continuous":
            run = dataclasses.replace(run, e2e_s=run.e2e_s + np.where(requests.output_len > 1, 0.04, 0.0))
        return run

    runner.run_workload = slow_resume
    m = measure_unit(served, tp=1, batch=4, buckets=BUCKETS[:2], all_buckets=BUCKETS, profile=ProfileSettings(),
                     runner=runner)
    assert m.resume.value == pytest.approx(0.04, abs=3 * m.resume.err) and m.resume.note == "", m.resume
    assert {p.resume_s for p in m.profiles.values()} == {m.resume.value}


def test_what_a_busy_pass_costs_the_decode_after_it_is_measured_by_its_prefill():
    # the simulated stacks resume at their pace after any pass: none counted, as shipped
    served = dataclasses.replace(sim(), serving="continuous")
    m = measure_unit(served, tp=1, batch=4, buckets=BUCKETS[:2], all_buckets=BUCKETS, profile=ProfileSettings())
    b = m.busy_resume
    assert b is not None and m.busy_resume_s > 0 and [lv.bucket for lv in b.levels] == list(BUCKETS[:2]), b
    assert b.bucket in BUCKETS[:2] and b.ratio == 0.0 and "none counted" in b.note, b
    assert {p.resume_busy for p in m.profiles.values()} == {b.by_pass} and all(y == 0 for _, y in b.by_pass)
    # a stack whose decode pays 300 us per prompt token of each pass that stopped it: measured through the
    # runner at each level (its prompt's cost), and counted
    runner = get_runner(served)
    plain = runner.run_workload

    def slow_after_prefill(cand, requests, *, mode="static"):
        run = plain(cand, requests, mode=mode)
        if mode != "continuous" or requests.arrival_s is None:
            return run
        arr = requests.arrival_s
        first, end = arr + run.ttft_s, arr + run.e2e_s
        lone = requests.output_len == 1
        extra = np.array([3e-4 * requests.input_len[lone & (arr >= first[i]) & (first <= end[i])].sum()
                          if not lone[i] else 0.0 for i in range(len(requests))])
        return dataclasses.replace(run, e2e_s=run.e2e_s + extra)

    runner.run_workload = slow_after_prefill
    m = measure_unit(served, tp=1, batch=4, buckets=BUCKETS[:2], all_buckets=BUCKETS, profile=ProfileSettings(),
                     runner=runner)
    b = m.busy_resume
    assert b.ratio > 0 and b.note == "", b
    for lv in b.levels:
        assert lv.measured == pytest.approx(3e-4 * lv.prompt, abs=3 * lv.err + 1e-4), b
    assert {p.resume_busy for p in m.profiles.values()} == {b.by_pass}


def test_a_runner_that_fails_the_served_workloads_leaves_their_costs_at_zero_and_says_which():
    served = dataclasses.replace(sim(noise=0.0, stragglers=False), serving="continuous")
    runner = get_runner(served)
    plain = runner.run_workload

    def no_serving(cand, requests, *, mode="static"):
        if mode == "continuous":
            raise RunnerError("the engine stopped\nwith a second line")
        return plain(cand, requests, mode=mode)

    runner.run_workload = no_serving
    m = measure_unit(served, tp=1, batch=4, buckets=BUCKETS[:2], all_buckets=BUCKETS, profile=ProfileSettings(),
                     runner=runner)
    gone = m.unmeasured()
    # the row cost and a row's context run static batches: measured; the admissions and the resume need a
    # served run: each left at 0, its note saying why, in one line
    assert set(gone) == {"the served admissions", "the resume cost", "the resume cost after a busy pass",
                         "a lone prompt's TTFT tail", "a lone decode's pace"}, gone
    assert set(gone.values()) == {"not measured (RunnerError: the engine stopped with a second line)"}, gone
    assert {(p.admit_first_s, p.resume_s) for p in m.profiles.values()} == {(0.0, 0.0)}
    # a unit whose workloads all ran has nothing to say
    assert measure_unit(served, tp=1, batch=4, buckets=BUCKETS[:2], all_buckets=BUCKETS,
                        profile=ProfileSettings()).unmeasured() == {}


def test_resuming_is_measured_only_for_a_target_served_continuously():
    m = measure_unit(sim(), tp=1, batch=4, buckets=BUCKETS[:1], all_buckets=BUCKETS, profile=ProfileSettings())
    assert m.resume is None and m.resume_s == 0.0 and all(p.resume_s == 0.0 for p in m.profiles.values())
    assert m.busy_resume is None and m.busy_resume_s == 0.0 and all(p.resume_busy == () for p in m.profiles.values())
    assert m.tail is None and m.tail_s == 0.0 and all(p.prefill_tail == () for p in m.profiles.values())
    assert m.pace is None and m.pace_s == 0.0 and all(p.decode_pace == () for p in m.profiles.values())


def test_a_lone_prompts_ttft_tail_is_measured_and_kept_in_every_profile():
    served = dataclasses.replace(sim(noise=0.0, stragglers=False), serving="continuous")
    runner = get_runner(served)
    plain = runner.run_workload
    # a host where every tenth lone prompt is 5 ms slow (a straggling call) and the rest are on time
    def slow_tenth(cand, requests, *, mode="static"):
        run = plain(cand, requests, mode=mode)
        if mode != "continuous" or not (requests.name or "").startswith("prefill-tail"):
            return run
        extra = np.where(np.arange(len(requests)) % 10 == 9, 0.005, 0.0)
        return dataclasses.replace(run, ttft_s=run.ttft_s + extra, e2e_s=run.e2e_s + extra)

    runner.run_workload = slow_tenth
    m = measure_unit(served, tp=1, batch=4, buckets=BUCKETS[:2], all_buckets=BUCKETS, profile=ProfileSettings(),
                     runner=runner)
    t = m.tail
    assert t is not None and m.tail_s > 0 and t.note == "" and t.bucket == BUCKETS[0], t
    q = np.asarray(t.quantiles)
    assert t.n == 2 * 48 and q.size == LEVELS
    # at most a tenth is slow: every level up to 0.85 reads the quiet prompts, the top one the slow ones
    assert np.allclose(q[:86], 0.0, atol=2e-4) and q[-1] == pytest.approx(0.005, abs=2e-4), q
    assert {p.prefill_tail for p in m.profiles.values()} == {t.quantiles}
    # with the median it lies about, which scales each prompt's draws by its own prefill
    assert t.median_s > 0 and {p.prefill_tail_median_s for p in m.profiles.values()} == {t.median_s}


def test_a_lone_decodes_pace_is_measured_with_its_correlation_and_kept_in_every_profile():
    served = dataclasses.replace(sim(noise=0.0, stragglers=False), serving="continuous")
    runner = get_runner(served)
    plain = runner.run_workload
    # a host whose decode runs 20% slow for four lone requests in a row, then 20% fast for four, and so on
    def blocks(cand, requests, *, mode="static"):
        run = plain(cand, requests, mode=mode)
        if mode != "continuous" or not (requests.name or "").startswith("decode-pace"):
            return run
        k = np.where((np.arange(len(requests)) // 4) % 2 == 1, 1.2, 0.8)
        return dataclasses.replace(run, e2e_s=run.ttft_s + (run.e2e_s - run.ttft_s) * k)

    runner.run_workload = blocks
    m = measure_unit(served, tp=1, batch=4, buckets=BUCKETS[:2], all_buckets=BUCKETS, profile=ProfileSettings(),
                     runner=runner)
    pace = m.pace
    assert pace is not None and m.pace_s > 0 and pace.note == "" and pace.bucket == BUCKETS[0], pace
    q = np.asarray(pace.quantiles)
    assert pace.n == decode_pace.ROUNDS * decode_pace.LONE and q.size == decode_pace.LEVELS
    # half the requests 20% under the call's mean, half 20% over
    assert np.allclose(q[:50], -0.2, atol=1e-3) and np.allclose(q[51:], 0.2, atol=1e-3), q
    # neighbours within a block agree, across one they differ: per call 36 pairs of 47 alike, 11 not
    assert pace.rho == pytest.approx((36 - 11) / 48, abs=0.01)
    first = m.profiles[min(m.profiles)]  # the lone requests' prompt, and as many steps as were measured
    req = decode_pace.workload(first, steps=decode_pace.steps_for(first, BUCKETS[:2]))
    spacing = float(np.diff(req.arrival_s)[0])
    assert pace.spacing_s == pytest.approx(spacing) and pace.tau_s == pytest.approx(-spacing / np.log(pace.rho))
    assert {(p.decode_pace, p.decode_pace_window_s, p.decode_pace_tau_s) for p in m.profiles.values()} == {
        (pace.quantiles, pace.window_s, pace.tau_s)}
    assert "a lone decode's pace" in m.host_costs()
