"""What a decode run costs after a served admission (lens.resume): picked, laid out and solved by hand."""
from __future__ import annotations

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
    assert rs.unit_resume([]) == 0.0
    assert rs.unit_resume([BucketProfile(bucket=8, ttft_s=1, tbt_s=1, input_len=1, l1=1, l2=2, t1_s=0, t2_s=0,
                                         repeats=1, spread=0, resume_s=0.003)]) == 0.003
