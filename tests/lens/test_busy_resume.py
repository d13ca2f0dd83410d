"""What a busy pass costs the decode after it (lens.busy_resume): laid out, read and solved by hand."""
from __future__ import annotations

import numpy as np
import pytest

from lens import busy_resume as br
from lens.buckets import select
from lens.types import BucketProfile

BUCKETS = (64, 128, 256, 512)


def prof(bucket, ttft_s=None, tbt_s=0.003):
    return BucketProfile(bucket=bucket, ttft_s=bucket * 5e-5 if ttft_s is None else ttft_s, tbt_s=tbt_s,
                         input_len=bucket - 1, l1=2, l2=40, t1_s=0, t2_s=0, repeats=3, spread=0)


def profiles(buckets=BUCKETS):
    return {b: prof(b) for b in buckets}


def test_the_levels_are_the_measured_buckets_at_most_four_smallest_and_largest_kept():
    assert br.levels(profiles(), BUCKETS) == [64, 128, 256, 512]
    wide = (16, 32, 64, 128, 256, 512, 1024)
    assert br.levels(profiles(wide), wide) == [16, 64, 256, 1024]
    assert br.levels({b: prof(b) for b in (64, 256)}, BUCKETS) == [64, 256]  # only those profiled


@pytest.mark.parametrize("policy", ["exclusive", "inclusive"])
def test_controls_and_stopped_carriers_alternate_in_one_window(policy):
    p = br.plan(profiles(), BUCKETS, policy, batch=4)
    assert p is not None
    heads = ~p.lone
    # a control first and after every stopped carrier; each level forward, then backward
    cycle = [0, 64, 0, 128, 0, 256, 0, 512, 0, 512, 0, 256, 0, 128, 0, 64]
    assert p.level.tolist() == cycle * (br.CARRIERS // 2) + [0]
    prompt = int(p.requests.input_len[heads][0])
    assert {select(prompt + k, BUCKETS, policy) for k in (1, p.steps)} == {p.bucket}  # one window throughout
    assert (p.requests.output_len[heads] == p.steps + 1).all()
    # each stopped carrier's lone request: a one-token prompt of its level, arriving LEAD steps in (at a phase of
    # a step of its own), with TAIL steps or more after its pass
    phases = []
    for c in np.flatnonzero(p.level):
        mine = p.lone & (p.carrier == c)
        assert mine.sum() == 1 and (p.requests.output_len[mine] == 1).all()
        assert select(int(p.requests.input_len[mine][0]), BUCKETS, policy) == p.level[c]
        at = float(p.requests.arrival_s[mine][0] - p.requests.arrival_s[heads][c]) / p.step_s - br.LEAD
        phases.append(at)
        pass_steps = prof(p.level[c]).ttft_s / p.step_s
        assert p.steps >= br.LEAD + 1 + pass_steps + br.TAIL
    assert min(phases) >= 0 and max(phases) < 1 and len(set(np.round(phases, 6))) == len(phases)
    assert not (p.lone & (p.level[p.carrier] == 0)).any()  # controls have none
    assert (np.diff(p.requests.arrival_s[heads]) > p.steps * p.step_s).all()  # one carrier after another


def test_no_plan_for_a_batch_of_one_or_without_a_window_that_holds_a_carrier():
    assert br.plan(profiles(), BUCKETS, "exclusive", batch=1) is None
    assert br.plan(profiles((8, 16)), (8, 16), "exclusive", batch=4) is None


def served(p, *, step, ratio, noise=0.0, drift=0.0, seed=0):
    """A served call of plan ``p`` on a device whose pass of a prompt in bucket b takes b x 5e-5 s (a lone
    request waits half a step for the step under way first) and costs
    the decode after it ``ratio`` x that; the carriers' pace drifts by ``drift`` over the call and scatters by
    ``noise`` (relative) per carrier."""
    rng = np.random.default_rng(seed)
    n = len(p.requests)
    ttft, e2e = np.zeros(n), np.zeros(n)
    heads = np.flatnonzero(~p.lone)
    for k, h in enumerate(heads):
        pace = step * (1 + drift * k / heads.size) * (1 + noise * rng.standard_normal())
        ttft[h] = 0.005
        mine = np.flatnonzero(p.lone & (p.carrier == k))
        pass_s = p.level[k] * 5e-5
        ttft[mine] = e2e[mine] = pace / 2 + pass_s  # (the wait the solver takes: half a step)
        e2e[h] = ttft[h] + p.steps * pace + mine.size * (1 + ratio) * pass_s
    return br.read(p, ttft, e2e)


def test_a_cost_proportional_to_the_prefill_is_solved_and_kept():
    p = br.plan(profiles(), BUCKETS, "exclusive", batch=4)
    c = br.solve([served(p, step=0.003, ratio=0.25, drift=0.1, seed=s) for s in range(3)], p)
    # the waits average half a step only over many phases: close, not exact
    assert c.ratio == pytest.approx(0.25) and c.ratio == c.raw and c.note == ""
    assert [lv.bucket for lv in c.levels] == list(BUCKETS)
    for lv in c.levels:
        assert lv.measured == pytest.approx(0.25 * lv.bucket * 5e-5)
        # (the lone requests' median wait is half the median control's step, near enough)
        assert lv.pass_s == pytest.approx(lv.bucket * 5e-5, abs=0.0005)
    pairs = c.by_pass
    assert [x for x, _ in pairs] == sorted(lv.pass_s for lv in c.levels)
    assert [y for _, y in pairs] == pytest.approx([c.ratio * x for x, _ in pairs])
    assert "per second of the pass's largest prefill" in c.said() and "bucket 512" in c.said()


def test_a_cost_within_the_noise_is_not_counted():
    p = br.plan(profiles(), BUCKETS, "exclusive", batch=4)
    c = br.solve([served(p, step=0.003, ratio=0.0, noise=0.05, seed=s) for s in range(3)], p)
    assert c.ratio == 0.0 and abs(c.raw) <= br.SIGMAS * c.err and "none counted" in c.note
    assert all(y == 0.0 for _, y in c.by_pass)  # measured: a busy pass costs nothing


def test_a_carrier_that_did_not_run_alone_is_left_out():
    p = br.plan(profiles(), BUCKETS, "exclusive", batch=4)
    c = served(p, step=0.003, ratio=0.25)
    assert c.alone.all()
    # a carrier that arrived before the one ahead of it ended: not alone (its decode seconds say nothing here)
    arr = p.requests.arrival_s.copy()
    heads = np.flatnonzero(~p.lone)
    arr[heads[2]] = arr[heads[1]] + 0.01
    early = br.Plan(type(p.requests)(p.requests.input_len, p.requests.output_len, arr), p.carrier, p.lone, p.level,
                    p.bucket, p.steps, p.step_s)
    ttft = np.zeros(len(arr))
    e2e = np.zeros(len(arr))
    ttft[heads], e2e[heads] = 0.005, 0.005 + c.decode_s
    late = br.read(early, ttft, e2e)
    assert late.alone.tolist()[:4] == [True, True, False, True]
    # left out, a carrier's seconds change nothing
    junk = br.Carriers(c.level, np.where(np.arange(c.level.size) == 2, 99.0, c.decode_s), c.passes, c.ttft_sum,
                       np.arange(c.level.size) != 2, c.lone_ttft)
    assert br.solve([junk], p).ratio == pytest.approx(br.solve([c], p).ratio)


def test_without_a_control_that_ran_alone_nothing_is_solved():
    p = br.plan(profiles(), BUCKETS, "exclusive", batch=4)
    c = served(p, step=0.003, ratio=0.25)
    c = br.Carriers(c.level, c.decode_s, c.passes, c.ttft_sum, c.level > 0, c.lone_ttft)
    out = br.solve([c], p)
    assert out.levels == () and out.by_pass == () and out.note == "no control carrier ran alone"
    assert out.said() == "no control carrier ran alone"


def test_a_pass_is_priced_by_its_seconds_between_the_levels_and_flat_beyond():
    pairs = ((0.005, 0.001), (0.02, 0.004), (0.05, 0.01))
    assert br.after_pass(0.0, pairs) == 0.001
    assert br.after_pass(0.0125, pairs) == pytest.approx(0.0025)
    assert br.after_pass(0.035, pairs) == pytest.approx(0.007)
    assert br.after_pass(1.0, pairs) == 0.01


def test_a_negative_ratio_is_bounded_at_minus_one_step():
    c = br.BusyResume((br.LevelCost(64, 32, 0.005, -0.004, 0.0), br.LevelCost(512, 256, 0.05, -0.04, 0.0)),
                      ratio=-0.8, err=0.01, raw=-0.8, bucket=512, step_s=0.003)
    assert c.by_pass == ((0.005, -0.003), (0.05, -0.003))
