"""What a decode run costs after a served admission (lens.resume): picked, laid out and solved by hand."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lens import resume as rs
from lens.buckets import select
from lens.types import BucketProfile


def prof(bucket=64, ttft_s=0.01, tbt_s=0.002):
    return BucketProfile(bucket=bucket, ttft_s=ttft_s, tbt_s=tbt_s, input_len=bucket // 2, l1=2, l2=40, t1_s=0,
                         t2_s=0, repeats=3, spread=0)


@pytest.mark.parametrize("policy", ["exclusive", "inclusive"])
def test_the_smallest_bucket_that_holds_the_long_requests_is_picked(policy):
    bk = (32, 64, 128, 256)
    profiles = {b: prof(b) for b in bk}
    p, prompt = rs.pick(profiles, bk, policy)
    # neither 32 nor 64 holds a prompt and LONG = 48 steps (64's window: 32..63 or 33..64); 128 does
    assert p.bucket == 128
    assert {select(x, bk, policy) for x in (prompt + 1, prompt + rs.LONG)} == {128}
    # the first bucket's window starts at one token: 64 holds them there
    p, prompt = rs.pick({b: prof(b) for b in (64, 256)}, (64, 256), policy)
    assert (p.bucket, prompt) == (64, 1)
    # a bucket without a profile is skipped, and so is one whose prompt's bucket has none
    p, prompt = rs.pick({b: profiles[b] for b in (128, 256)}, bk, policy)  # 128's prompt would run in 64
    assert p.bucket == 256 and select(prompt, bk, policy) == 128
    assert rs.pick({b: profiles[b] for b in (64, 256)}, bk, policy) is None
    assert rs.pick({b: prof(b) for b in (8, 16)}, (8, 16), policy) is None


def test_the_workload_alternates_lone_short_and_long_requests_far_enough_apart():
    w = rs.workload(7, ttft_s=0.01, tbt_s=0.002, pairs=3)
    assert w.input_len.tolist() == [7] * 6
    assert w.output_len.tolist() == [rs.SHORT + 1, rs.LONG + 1] * 3
    gaps = np.diff(w.arrival_s)
    # each arrives after the last could have ended on a host GAP times slower than the profile
    assert np.all(gaps >= rs.GAP * (0.01 + (w.output_len[:-1] - 1) * 0.002))
    assert w.arrival_s[0] == 0.0


def decode(resume, step, pairs=8, noise=0.0, seed=0):
    """Per-request TTFT and E2E of ``workload``'s run on a device whose decode runs cost ``resume`` + steps x
    ``step`` (a median-robust noise of relative size ``noise``)."""
    rng = np.random.default_rng(seed)
    steps = np.tile([rs.SHORT, rs.LONG], pairs)
    d = (resume + steps * step) * (1 + noise * rng.standard_normal(steps.size))
    ttft = np.full(steps.size, 0.01)
    return ttft, ttft + d


def test_a_resume_cost_is_solved_exactly_and_kept():
    rounds = [rs.decode_times(*decode(0.004, 0.0018)) for _ in range(2)]
    c = rs.solve(rounds, p=prof(), prompt=31)
    assert c.value == pytest.approx(0.004)
    assert c.step_s == pytest.approx(0.0018)
    assert c.note == ""
    assert "+4.000 ms" in c.said()


def test_the_calls_disagreement_counts_in_the_error():
    # each call exact, but one finds 2 ms and the other 6 ms: the mean, with the disagreement as its error
    c = rs.solve([rs.decode_times(*decode(0.002, 0.0018)), rs.decode_times(*decode(0.006, 0.0018))],
                 p=prof(), prompt=31)
    assert c.raw == pytest.approx(0.004)
    assert c.err == pytest.approx(0.002)
    assert c.value == 0.0 and "none counted" in c.note  # 4 ms within 3 x 2 ms


def test_no_resume_on_a_noisy_device_is_not_counted():
    rounds = [rs.decode_times(*decode(0.0, 0.002, noise=0.05, seed=s)) for s in (1, 2)]
    c = rs.solve(rounds, p=prof(), prompt=31)
    assert c.value == 0.0 and "within 3 standard errors" in c.note
    assert c.err > 0


def test_a_negative_resume_is_bounded_at_minus_one_step():
    c = rs.solve([rs.decode_times(*decode(-0.01, 0.002)) for _ in range(2)], p=prof(), prompt=31)
    assert c.raw == pytest.approx(-0.01)
    assert c.value == pytest.approx(-0.002) and "bounded" in c.note


def test_nothing_run_leaves_none():
    c = rs.solve([], p=prof(), prompt=31)
    assert c.value == 0.0 and c.note == "no whole pair was run"
    assert rs.unit_resume([]) == (0.0, 0.0)
    assert rs.unit_resume([BucketProfile(bucket=8, ttft_s=1, tbt_s=1, input_len=1, l1=1, l2=2, t1_s=0, t2_s=0,
                                         repeats=1, spread=0, resume_s=0.003, resume_busy_s=-0.001)]) == \
        (0.003, -0.001)


# -- after a pass that stops a running decode ----------------------------------------------------------------

@pytest.mark.parametrize("policy", ["exclusive", "inclusive"])
def test_the_busy_call_lays_each_lone_request_on_a_carrier_that_outlasts_it_in_one_window(policy):
    bk = (64, 128, 256, 512)
    profiles = {b: prof(b, ttft_s=0.003, tbt_s=0.002) for b in bk}
    plan = rs.busy_plan(profiles, bk, policy, batch=4, pairs=3)
    # 64's and 128's windows hold fewer steps than a carrier needs (about 1.5 x (16 + 49) + 16): 256 is picked
    assert plan.bucket == 256
    w = plan.requests
    assert w.input_len.tolist() == [plan.prompt] * 12
    assert plan.lone.tolist() == [False, True] * 6
    assert w.output_len[plan.lone].tolist() == [rs.SHORT + 1, rs.LONG + 1] * 3
    carriers = w.output_len[~plan.lone] - 1
    # every context of every request decodes in the picked bucket
    top = plan.prompt + int(carriers.max())
    assert {select(x, bk, policy) for x in (plan.prompt + 1, top)} == {256}
    lead = w.arrival_s[plan.lone] - w.arrival_s[~plan.lone]
    # the lone request lands on the carrier's settled steps, and the carrier still decodes when it ends on a host
    # MARGIN times faster than the profile (its ttft and steps shrink, the arrivals do not)
    assert np.all(lead >= rs.SETTLE * 0.002)
    lone_end = lead + (0.003 + (w.output_len[plan.lone] - 1) * 0.002)
    assert np.all(carriers * 0.002 / rs.MARGIN > lone_end)
    # the next carrier arrives after the last lone request ends on a host GAP times slower: no other pass falls
    # in a lone request's decode
    starts = w.arrival_s[~plan.lone]
    assert np.all(np.diff(starts) >= rs.GAP * lone_end[:-1] - 1e-12)


def test_there_is_no_busy_call_for_a_batch_of_one_or_without_a_window_that_holds_a_carrier():
    bk = (64, 128, 256, 512)
    profiles = {b: prof(b, ttft_s=0.003, tbt_s=0.002) for b in bk}
    assert rs.busy_plan(profiles, bk, "exclusive", batch=1) is None
    assert rs.busy_plan({b: profiles[b] for b in (64, 128)}, bk, "exclusive", batch=4) is None
    # a carrier alone would cost nothing a step (its free rows' host cost is the whole step): no plan
    free = {b: dataclasses.replace(p, row_s=0.001) for b, p in profiles.items()}
    assert rs.busy_plan(free, bk, "exclusive", batch=3) is None


def test_a_busy_resume_is_solved_from_the_lone_requests_only():
    bk = (64, 128, 256, 512)
    plan = rs.busy_plan({b: prof(b, ttft_s=0.003, tbt_s=0.002) for b in bk}, bk, "exclusive", batch=4)
    lout = plan.requests.output_len
    ttft = np.full(lout.size, 0.003)
    # the lone requests decode at 2.2 ms a step (two live rows) and pay 1 ms after their pass; the carriers'
    # own decode seconds (which would solve to something else) are left out
    e2e = ttft + np.where(plan.lone, 0.001 + (lout - 1) * 0.0022, 0.05 + (lout - 1) * 0.002)
    rounds = [rs.busy_decode_times(ttft, e2e, plan) for _ in range(2)]
    c = rs.solve(rounds, p=prof(256), prompt=plan.prompt)
    assert c.value == pytest.approx(0.001) and c.step_s == pytest.approx(0.0022)

