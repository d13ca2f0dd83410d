"""What a server's admissions cost against the static profile (lens.admission): solved by hand."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lens import admission
from lens.types import BucketProfile


def prof(ttft_s=0.004):
    return BucketProfile(bucket=64, ttft_s=ttft_s, tbt_s=0.001, input_len=2, l1=2, l2=60, t1_s=0, t2_s=0,
                         repeats=3, spread=0)


#: a bucket whose short probe is one token: a static call's TTFT_b is its last first token per prefill call
ONE_TOKEN = dataclasses.replace(prof(), l1=1)


def stack(fixed, per, *, batch, served_fixed, served_per, m, rounds=admission.ROUNDS, jitter=0.0, seed=0):
    """Rounds of the measurement's times on a stack whose static call costs ``fixed`` + ``per`` a prompt and
    whose server pays ``served_fixed`` per pass + ``served_per`` a prompt (each time x (1 +- jitter))."""
    rng = np.random.default_rng(seed)
    j = lambda n: 1.0 + jitter * rng.standard_normal(n)  # noqa: E731
    out = []
    for _ in range(rounds):
        k = np.arange(1, batch + 1)
        ttft = np.concatenate([(fixed + k * per) * j(batch) for _ in range(admission.BATCHES)])
        served = np.concatenate([(served_fixed + np.arange(1, m + 1) * served_per) * j(m)
                                 for _ in range(admission.BURSTS)])
        out.append((admission.static_times(ttft, batch, p=ONE_TOKEN), *admission.burst_times(served, m)))
    return out


def test_a_pass_that_pays_the_static_calls_fixed_part_once_is_solved_exactly():
    # static: 3 ms per call + 1 ms a prompt, so TTFT_b = 1 + 3/4 ms; the server pays the 3 ms once a pass
    rounds = stack(3e-3, 1e-3, batch=4, served_fixed=3e-3, served_per=1e-3, m=4)
    c = admission.solve(rounds, p=prof(1.75e-3), burst=4)
    assert c.first_s == pytest.approx(3e-3 * (1 - 1 / 4)) and c.next_s == pytest.approx(-3e-3 / 4)
    assert c.note == "" and c.burst == 4


def test_a_server_that_pays_per_admitted_prompt_is_one_offset_for_each():
    # the example program's shape: a static call's 1.5 ms spread over 8, a server's 0.3 ms for each prompt
    rounds = stack(1.5e-3, 1e-3, batch=8, served_fixed=0.0, served_per=1.3e-3, m=8)
    c = admission.solve(rounds, p=prof(), burst=8)
    assert c.first_s == pytest.approx(0.3e-3 - 1.5e-3 / 8) and c.next_s == pytest.approx(c.first_s)


def test_noise_alone_counts_as_none_and_says_so():
    # a server that costs what the static call does per prompt (1 ms + 3 ms / 4), on a host jittering by 5%
    rounds = stack(3e-3, 1e-3, batch=4, served_fixed=0.0, served_per=1.75e-3, m=4, jitter=0.05)
    c = admission.solve(rounds, p=prof(), burst=4)
    assert c.first_s == 0.0 and c.next_s == 0.0
    assert abs(c.raw_first_s) <= admission.SIGMAS * c.first_err_s and c.first_err_s > 0
    assert "none counted" in c.note and "none counted" in c.said()


def test_a_cost_well_beyond_the_noise_is_kept_with_its_error():
    rounds = stack(3e-3, 1e-3, batch=4, served_fixed=3e-3, served_per=1e-3, m=4, jitter=0.01)
    c = admission.solve(rounds, p=prof(), burst=4)
    assert c.first_s == pytest.approx(2.25e-3, rel=0.1) and 0 < c.first_err_s < c.first_s / admission.SIGMAS
    assert c.next_s == pytest.approx(-0.75e-3, rel=0.2)


def test_one_prompt_per_pass_measures_the_first_only():
    rounds = stack(3e-3, 1e-3, batch=4, served_fixed=3e-3, served_per=1e-3, m=1)
    c = admission.solve(rounds, p=prof(1.75e-3), burst=1)
    assert c.first_s == pytest.approx(2.25e-3) and c.next_s == 0.0 and "each further" not in c.said()


def test_no_admission_is_cheaper_than_free():
    # the measurement's static calls read 8.5 ms a prompt, the profile 5 ms (another minute of the host)
    rounds = stack(30e-3, 1e-3, batch=4, served_fixed=0.0, served_per=0.1e-3, m=4)
    c = admission.solve(rounds, p=prof(5e-3), burst=4)
    assert c.first_s == c.next_s == -5e-3 and c.raw_first_s < -5e-3 and "bounded" in c.note


def test_no_round_counts_as_none():
    c = admission.solve([], p=prof(), burst=4)
    assert (c.first_s, c.next_s) == (0.0, 0.0) and c.note


def test_the_workloads_find_an_idle_device_and_read_back_by_burst():
    p = prof(0.004)
    served = admission.served_workload(p, 3)
    assert len(served) == 3 * admission.BURSTS and (served.output_len == 1).all()
    gaps = np.diff(np.unique(served.arrival_s))
    assert np.allclose(gaps, admission.GAP * 3 * 0.004)  # a burst's prefills several times over
    static = admission.static_workload(p, 4)
    # as the bucket's short probe ran: its prompt and its two tokens (a prefill, one decode step)
    assert len(static) == 4 * admission.BATCHES and (static.input_len == p.input_len).all()
    assert (static.output_len == p.l1).all() and p.l1 == 2
    assert (admission.static_workload(ONE_TOKEN, 4).output_len == 1).all()
    first, slope = admission.burst_times([1.0, 2.0, 3.0, 5.0, 7.0, 9.0], 3)
    np.testing.assert_allclose(first, [1.0, 5.0]) and np.testing.assert_allclose(slope, [1.0, 2.0])
    e2e = [1.0, 2.0, 4.0, 8.0]
    np.testing.assert_allclose(admission.static_times(e2e, 2, p=ONE_TOKEN), [1.0, 4.0])
    np.testing.assert_allclose(admission.static_times(e2e, 2, "batched", p=ONE_TOKEN), [2.0, 8.0])
    # the probes' solve: the batch's end less one step at TBT_b (1 ms), per prefill call
    np.testing.assert_allclose(admission.static_times(e2e, 2, p=p), [0.9995, 3.9995])
    np.testing.assert_allclose(admission.static_times(e2e, 2, "batched", p=p), [1.999, 7.999])


@pytest.mark.parametrize("cap, prefill, want", [(0, "sequential", 8), (2, "sequential", 2), (1, "sequential", 1),
                                                (0, "batched", 1), (16, "sequential", 8)])
def test_a_burst_is_what_one_pass_admits(cap, prefill, want):
    assert admission.burst_size(8, max_prefills=cap, prefill=prefill) == want


# -- a pass that stops a running decode (busy_plan, busy_times) ------------------------------------------------

def tkg(bucket, tbt_s, ttft_s=0.02, row_s=0.0):
    return BucketProfile(bucket=bucket, ttft_s=ttft_s, tbt_s=tbt_s, input_len=bucket // 2, l1=1, l2=8, t1_s=0,
                         t2_s=0, repeats=3, spread=0, row_s=row_s)


def check_busy_plan(plan, p, per, carrier_prompt, top):
    """``plan``'s invariants, with ``per`` lone requests a carrier whose prompt is ``carrier_prompt`` in a window up
    to ``top``."""
    r, lone = plan.requests, plan.lone
    n_car = -(-admission.CARRIERS * admission.LONE // per)
    assert len(r) == n_car * (per + 1) and lone.sum() == n_car * per >= admission.CARRIERS * admission.LONE
    assert np.all(r.input_len[~lone] == carrier_prompt) and np.all(r.input_len[lone] == p.input_len)
    assert np.all(r.output_len[lone] == 1) and np.all(np.diff(r.arrival_s) > 0) and r.arrival_s[0] == 0.0
    steps = int(r.output_len[0]) - 1
    assert r.input_len[0] + steps <= top  # never leaves the window
    phases = []
    for s in np.flatnonzero(~lone):
        mine = r.arrival_s[s + 1: s + 1 + per] - r.arrival_s[s]
        # each lone request arrives well before its carrier would end on a host MARGIN times faster
        assert mine[-1] + p.ttft_s < steps * plan.step_s / admission.MARGIN
        assert np.all(np.diff(mine) >= admission.GAP * p.ttft_s + (admission.SETTLE - 1) * plan.step_s)  # less a phase
        phases.extend((mine / plan.step_s) % 1.0)
    # the arrivals' phases within a step spread over it, across the carriers (the wait averages half a step)
    phases = np.asarray(phases)
    assert np.ptp(phases) > 0.8 and 0.3 < np.mean(phases < 0.5) < 0.7
    return r, lone


def test_the_busy_call_decodes_in_the_smallest_window_that_holds_a_lone_arrival():
    p = prof(0.006)
    profiles = {64: tkg(64, 0.002, 0.006), 256: tkg(256, 0.003), 1024: tkg(1024, 0.004, 0.05, row_s=1e-4)}
    plan = admission.busy_plan(p, profiles, (64, 256, 1024), "exclusive", batch=4)
    # bucket 64's window holds a carrier from prompt 1 with one lone arrival, not two: 24 carriers of one
    assert plan.step_s == pytest.approx(0.002)
    check_busy_plan(plan, p, 1, 1, 64)
    # TTFT less half the carriers' step, per lone request
    ttft = np.where(plan.lone, 0.009, 0.05)
    np.testing.assert_allclose(admission.busy_times(ttft, plan), np.full(plan.lone.sum(), 0.009 - plan.step_s / 2))


def test_a_window_that_holds_every_lone_arrival_takes_them_all_on_each_carrier():
    p = prof(0.006)
    profiles = {1024: tkg(1024, 0.004, 0.05, row_s=1e-4)}
    plan = admission.busy_plan(p, profiles, (1024,), "exclusive", batch=4)
    assert plan.step_s == pytest.approx(0.004 - 3 * 1e-4)  # alone: the three free rows' host cost saved
    check_busy_plan(plan, p, admission.LONE, 1, 1024)
    # the same window asked for by a diagnostic, in a set whose smaller windows would hold a carrier
    three = {64: tkg(64, 0.002, 0.006), 256: tkg(256, 0.003), 1024: tkg(1024, 0.004, 0.05, row_s=1e-4)}
    chosen = admission.busy_plan(p, three, (64, 256, 1024), "exclusive", batch=4, window=1024)
    check_busy_plan(chosen, p, admission.LONE, 255, 1024)
    assert admission.busy_plan(p, three, (64, 256, 1024), "exclusive", batch=4, window=128) is None  # no such bucket


def test_no_busy_call_for_a_batch_of_one_or_without_a_window_that_holds_it():
    # a carrier's own prefill (bucket 64's, 50 ms) and its settling steps outrun both windows
    profiles = {64: tkg(64, 0.002, 0.05), 128: tkg(128, 0.002)}
    assert admission.busy_plan(prof(), profiles, (64, 128), "exclusive", batch=4) is None
    big = {64: tkg(64, 0.002, 0.006), 1024: tkg(1024, 0.004, 0.05)}
    assert admission.busy_plan(prof(), big, (64, 1024), "exclusive", batch=1) is None


def test_a_busy_pass_is_solved_against_the_same_static_call_and_defaults_to_the_first_when_not_run():
    rounds = stack(3e-3, 1e-3, batch=4, served_fixed=3e-3, served_per=1e-3, m=4)
    # the static TTFT_b is 1.75 ms: lone prompts during a decode at 1.25 ms -> -0.5 ms, with some spread
    rng = np.random.default_rng(1)
    busy = [np.full(admission.LONE, 1.25e-3) + 1e-6 * rng.standard_normal(admission.LONE) for _ in rounds]
    c = admission.solve([(*r, b) for r, b in zip(rounds, busy)], p=prof(1.75e-3), burst=4)
    assert c.busy_measured and c.busy_s == pytest.approx(-0.5e-3, abs=2e-6) and c.busy_s == c.raw_busy_s
    assert "during a decode" in c.said()
    # not run (a batch of one, no window): the first prompt's offset prices both passes, as before
    c = admission.solve(rounds, p=prof(1.75e-3), burst=4)
    assert not c.busy_measured and c.busy_s == c.first_s != 0.0 and "during a decode" not in c.said()
    # noise alone: none counted, said so
    rng = np.random.default_rng(2)
    noisy = [1.75e-3 + 1e-4 * rng.standard_normal(admission.LONE) for _ in rounds]
    c = admission.solve([(*r, b) for r, b in zip(rounds, noisy)], p=prof(1.75e-3), burst=4)
    assert c.busy_s == 0.0 and c.busy_measured and "during a decode within" in c.note


def test_an_offset_between_one_and_three_standard_errors_is_undecided():
    def cost(raw, err, **kw):
        return admission.AdmissionCost(0.0, 0.0, first_err_s=err, raw_first_s=raw, burst=1, **kw)

    assert admission.undecided(cost(2e-3, 1e-3)) and admission.undecided(cost(-3e-3, 1e-3))
    assert not admission.undecided(cost(0.5e-3, 1e-3))  # noise: nothing to settle
    assert not admission.undecided(cost(3.5e-3, 1e-3))  # counted already
    assert not admission.undecided(cost(1e-3, 0.0))  # a noiseless device
    # a further prompt's and a busy pass's offsets count too, the latter only where it was measured
    settled = dict(first_err_s=1e-3, raw_first_s=5e-3)
    assert admission.undecided(admission.AdmissionCost(5e-3, 0.0, next_err_s=1e-3, raw_next_s=2e-3, burst=4,
                                                       **settled))
    assert not admission.undecided(admission.AdmissionCost(5e-3, 0.0, next_err_s=1e-3, raw_next_s=2e-3, burst=1,
                                                           **settled))
    busy = dict(busy_err_s=1e-3, raw_busy_s=2e-3)
    assert admission.undecided(admission.AdmissionCost(5e-3, 0.0, burst=1, busy_measured=True, **settled, **busy))
    assert not admission.undecided(admission.AdmissionCost(5e-3, 0.0, burst=1, busy_measured=False, **settled,
                                                           **busy))


def test_a_served_prompt_is_charged_what_it_costs_where_the_first_decode_step_starts_up_slow():
    """The probes' solve puts the first decode step's start-up in TTFT_b (lens.probes.derive, L1 = 2); a served
    prompt's first token does not wait for it. The static call solves TTFT_b the same way, so TTFT_b plus the
    offset is the served TTFT, not that plus the start-up per prompt."""
    from lens.probes import derive

    batch, pre, tbt, startup, l2 = 4, 0.005, 0.0015, 0.0008, 63
    # the probes: B prefills, then a first step that starts up slow and steady ones after it
    t1 = batch * pre + tbt + startup
    t2 = batch * pre + startup + (l2 - 1) * tbt
    ttft_b, tbt_b = derive(t1, t2, l1=2, l2=l2, calls=batch)
    assert tbt_b == pytest.approx(tbt) and ttft_b == pytest.approx(pre + startup / batch)
    p = dataclasses.replace(prof(ttft_b), tbt_s=tbt_b)
    rounds = []
    for _ in range(admission.ROUNDS):
        e2e = np.tile(np.full(batch, batch * pre + tbt + startup), admission.BATCHES)  # all end at the first step
        assert (admission.static_workload(p, batch).output_len == 2).all()
        served = np.tile(pre * np.arange(1, batch + 1), admission.BURSTS)  # a burst's prompts, one after another
        rounds.append((admission.static_times(e2e, batch, p=p), *admission.burst_times(served, batch)))
    cost = admission.solve(rounds, p=p, burst=batch)
    assert cost.raw_first_s == pytest.approx(-startup / batch)
    assert ttft_b + cost.raw_first_s == pytest.approx(pre)  # the served prompt's own prefill, no start-up in it
