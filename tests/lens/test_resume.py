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


def test_the_workload_runs_short_and_long_lone_requests_after_each_idle_spell():
    w = rs.workload(7, ttft_s=0.01, tbt_s=0.002, groups=2)
    k = 2 * len(rs.IDLE)
    assert w.input_len.tolist() == [7] * 2 * k
    assert w.output_len.tolist() == [rs.SHORT + 1, rs.LONG + 1] * k
    # each arrives its spell after the one before is expected to end, with the same slack after either length
    expected = 0.01 + (w.output_len[:-1] - 1) * 0.002 + rs.MARGIN * (0.01 + rs.LONG * 0.002)
    spells = np.tile(np.repeat(rs.IDLE, 2), 2)[1:]
    np.testing.assert_allclose(np.diff(w.arrival_s), expected + spells)
    assert w.arrival_s[0] == 0.0


def served(cost, step, groups=8, noise=0.0, seed=0, late=0.0):
    """``lone_runs`` of ``workload``'s call on a device whose decode runs cost ``cost(idle spell)`` + steps x
    ``step`` (a median-robust noise of relative size ``noise``), each request ending ``late`` seconds later than
    the profile says (its wait before the next one that much shorter)."""
    rng = np.random.default_rng(seed)
    w = rs.workload(31, ttft_s=0.01, tbt_s=step, groups=groups)
    n = len(w)
    ttft = np.full(n, 0.01)
    e2e = np.empty(n)
    for j in range(n):
        spell = np.inf if j == 0 else w.arrival_s[j] - (w.arrival_s[j - 1] + e2e[j - 1])
        steps = w.output_len[j] - 1
        e2e[j] = ttft[j] + (cost(max(spell, 0.0)) + steps * step) * (1 + noise * rng.standard_normal()) + late
    return rs.lone_runs(w, ttft, e2e)


def test_a_resume_cost_is_solved_exactly_at_every_idle_spell_and_kept():
    def cost(spell):  # 1 ms after a short wait, 3 ms after one of tens of ms, 5 ms after a long one (the short
        # and the long request of one spell wait a little differently: the one before each ends differently late)
        return 0.001 if spell < 0.02 else 0.003 if spell < 0.08 else 0.005

    c = rs.solve([served(cost, 0.0018) for _ in range(2)], p=prof(), prompt=31)
    assert c.value == pytest.approx(0.005)
    assert c.step_s == pytest.approx(0.0018)
    assert c.note == ""
    # each spell's own idle seconds (arrival less the previous end: the margin the profile leaves, and the spell)
    spells = [i for i, _ in c.by_idle]
    assert len(spells) == len(rs.IDLE) and spells == sorted(spells) and spells[-1] > rs.IDLE[-1]
    assert [x for _, x in c.by_idle] == pytest.approx([0.001, 0.003, 0.005])
    assert "+5.000 ms" in c.said() and "after an idle spell of" in c.said()
    # what a pass costs by its spell: interpolated, the shortest spell's for a busy pass, flat beyond the last
    xs, ys = rs.curve(c.value, c.by_idle)
    assert rs.after_idle(0.0, xs, ys) == pytest.approx(cost(spells[0]))
    assert rs.after_idle(10.0, xs, ys) == pytest.approx(0.005)
    mid = (spells[0] + spells[1]) / 2
    assert rs.after_idle(mid, xs, ys) == pytest.approx((cost(spells[0]) + cost(spells[1])) / 2)
    # without the spells (a cache of before them): the one cost after any pass
    assert rs.after_idle(0.0, *rs.curve(0.004)) == 0.004


def test_a_request_that_did_not_run_alone_is_left_out():
    # every request ends 0.5 s late: none finds the device idle, nothing is read
    c = rs.solve([served(lambda s: 0.004, 0.0018, late=0.5) for _ in range(2)], p=prof(), prompt=31)
    assert c.value == 0.0 and c.note == "no lone request ran after the longest idle spell"
    # each 20 ms late (a cost of 24 ms): the shortest spell's requests (1 ms after the expected end and a slack of
    # 9.6 ms) queue behind the one before, the others still run alone
    c = rs.solve([served(lambda s: 0.004, 0.0018, late=0.02) for _ in range(2)], p=prof(), prompt=31)
    assert c.value == pytest.approx(0.024) and len(c.by_idle) == len(rs.IDLE) - 1


def test_a_shorter_spell_never_costs_more_than_a_longer_one():
    def cost(spell):  # noisy reading: the shortest spell reads more than the longest
        return 0.006 if spell < 0.01 else 0.003

    c = rs.solve([served(cost, 0.0018) for _ in range(2)], p=prof(), prompt=31)
    assert c.value == pytest.approx(0.003)
    assert [x for _, x in c.by_idle] == pytest.approx([0.003] * len(rs.IDLE))


def test_the_calls_disagreement_counts_in_the_error():
    # each call exact, but one finds 2 ms and the other 6 ms: the mean, with the disagreement as its error
    c = rs.solve([served(lambda s: 0.002, 0.0018), served(lambda s: 0.006, 0.0018)], p=prof(), prompt=31)
    assert c.raw == pytest.approx(0.004)
    assert c.err == pytest.approx(0.002)
    assert c.value == 0.0 and "none counted" in c.note and c.by_idle == ()  # 4 ms within 3 x 2 ms


def test_no_resume_on_a_noisy_device_is_not_counted():
    c = rs.solve([served(lambda s: 0.0, 0.002, noise=0.05, seed=s) for s in (1, 2)], p=prof(), prompt=31)
    assert c.value == 0.0 and "within 3 standard errors" in c.note
    assert c.err > 0


def test_a_negative_resume_is_bounded_at_minus_one_step():
    c = rs.solve([served(lambda s: -0.01, 0.002) for _ in range(2)], p=prof(), prompt=31)
    assert c.raw == pytest.approx(-0.01)
    assert c.value == pytest.approx(-0.002) and "bounded" in c.note and c.by_idle == ()


def test_nothing_run_leaves_none():
    c = rs.solve([], p=prof(), prompt=31)
    assert c.value == 0.0 and "no lone request" in c.note
    assert rs.unit_resume([]) == 0.0 and rs.unit_by_idle([]) == ()
    p = BucketProfile(bucket=8, ttft_s=1, tbt_s=1, input_len=1, l1=1, l2=2, t1_s=0, t2_s=0, repeats=1, spread=0,
                      resume_s=0.003, resume_idle=((0.001, 0.001), (0.1, 0.003)))
    assert rs.unit_resume([p]) == 0.003 and rs.unit_by_idle([p]) == ((0.001, 0.001), (0.1, 0.003))
