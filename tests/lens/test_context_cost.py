"""What a live row's context costs a decode step (lens.context_cost): picked, solved and composed by hand."""
from __future__ import annotations

import numpy as np
import pytest

from lens import context_cost as cc
from lens import rows
from lens.serving import predict_serving
from lens.types import BucketProfile, Requests

from servingkit import table  # tests/lens is on sys.path (pytest rootdir imports)


def prof(bucket=256, tbt_s=0.002, input_len=130, l1=2, l2=100):
    return BucketProfile(bucket=bucket, ttft_s=0.01, tbt_s=tbt_s, input_len=input_len, l1=l1, l2=l2, t1_s=0,
                         t2_s=0, repeats=3, spread=0)


def run_of(d_short, d_long, batch, ttft=0.01):
    """Per-request TTFT and E2E of ``workload``'s run whose batches decode in ``d_short`` / ``d_long`` seconds."""
    d = np.ravel(np.column_stack([d_short, d_long]))  # short, long, short, long, ...
    t = np.full(len(d) * batch, ttft)
    return t, t + np.repeat(d, batch)


def test_the_probes_reference_context_and_the_row_costs_measured_one():
    # TBT_b is the slope over decode steps L1 .. L2 - 1, each at the prompt plus its step
    assert cc.reference_context(prof(input_len=130, l1=2, l2=100)) == pytest.approx(130 + 50.5)
    # the row cost's full batch decodes STEPS steps at contexts l + 1 .. l + STEPS
    p = prof(input_len=40, l2=100)
    assert rows.measured_context(p) == pytest.approx(40 + (rows.STEPS + 1) / 2)
    # its host part: the measured row's own reads taken out, never below 0
    assert cc.host_row_s(30e-6, 20e-9, 500.0) == pytest.approx(20e-6)
    assert cc.host_row_s(5e-6, 20e-9, 500.0) == 0.0


@pytest.mark.parametrize("policy, short, long_", [("exclusive", 127, 256 - cc.STEPS),
                                                   ("inclusive", 128, 256 - cc.STEPS)])
def test_the_widest_window_is_picked_with_prompts_whose_steps_stay_in_it(policy, short, long_):
    profiles = {b: prof(b) for b in (64, 128, 256)}
    p, s, lg = cc.pick(profiles, (64, 128, 256), policy)
    assert (p.bucket, s, lg) == (256, short, long_)
    # every decode step of both prompts runs in bucket 256 under the policy
    from lens.buckets import select
    assert {select(x, (64, 128, 256), policy) for x in (s + 1, s + cc.STEPS, lg + 1, lg + cc.STEPS)} == {256}
    # a bucket without a profile is not measured; windows narrower than MIN_SPAN are never picked
    assert cc.pick({64: prof(64), 128: prof(128)}, (64, 128, 256), policy)[0].bucket in (64, 128)
    assert cc.pick({b: prof(b) for b in (64, 80)}, (64, 80), "exclusive")[0].bucket == 64
    assert cc.pick({b: prof(b) for b in (8, 16)}, (8, 16), "exclusive") is None


def test_the_workload_alternates_full_batches_of_the_two_prompts():
    w = cc.workload(100, 200, batch=3, pairs=2)
    assert w.input_len.tolist() == [100] * 3 + [200] * 3 + [100] * 3 + [200] * 3
    assert set(w.output_len.tolist()) == {cc.STEPS + 1}


def test_a_paged_kernels_reads_are_solved_exactly():
    # 1.5 ms fixed per step + 20 ns per KV token of each of 4 rows
    batch, short, long_, kv = 4, 127, 240, 20e-9
    step = lambda ctx: 1.5e-3 + kv * batch * ctx  # noqa: E731
    d_short = np.full(cc.PAIRS, sum(step(short + j) for j in range(1, cc.STEPS + 1)))
    d_long = np.full(cc.PAIRS, sum(step(long_ + j) for j in range(1, cc.STEPS + 1)))
    c = cc.solve(*run_of(d_short, d_long, batch), p=prof(), short=short, long_=long_, batch=batch)
    assert c.value == pytest.approx(kv) and c.raw == pytest.approx(kv) and c.note == ""
    assert (c.bucket, c.short_len, c.long_len) == (256, short, long_)
    assert "20.00 ns per KV token" in c.said()


def test_a_kernel_of_the_buckets_shape_counts_none_and_a_straggler_does_not_make_one():
    rng = np.random.default_rng(3)
    batch, base = 4, 16 * 1.5e-3
    d_short = base * (1 + 0.01 * rng.standard_normal(cc.PAIRS))
    d_long = base * (1 + 0.01 * rng.standard_normal(cc.PAIRS))
    d_long[2] *= 4.0  # one batch caught a 4x slow call: a median looks past it
    c = cc.solve(*run_of(d_short, d_long, batch), p=prof(), short=127, long_=240, batch=batch)
    assert c.value == 0.0 and "none counted" in c.note and c.err > 0


def test_reads_larger_than_the_whole_step_are_bounded():
    # a step of 0.2 ms measured to read 1 us per token per row: more than TBT_b at the probes' context
    batch, short, long_ = 2, 127, 240
    d_short = np.full(cc.PAIRS, 16 * 1e-3)
    d_long = d_short + 16 * batch * (long_ - short) * 1e-6
    p = prof(tbt_s=2e-4)
    c = cc.solve(*run_of(d_short, d_long, batch), p=p, short=short, long_=long_, batch=batch)
    assert c.value == pytest.approx(p.tbt_s / (batch * cc.reference_context(p))) and "bounded" in c.note


def test_served_steps_cost_their_live_rows_reads_by_hand():
    # servingkit's table: TBT 0.1 in bucket 8, probes' rows at context 2 (REF). B = 2, 0.01 s per context token,
    # row cost 0.02 measured on a row of context 1: its host part 0.01.
    # r0 (3 in, 3 out) alone: prefill 1.0 -> 1.0; step 1 at context 4: 0.1 - 2 x 0.01 x 2 + 0.01 x 4 - 1 free
    # x 0.01 = 0.09 -> 1.09; step 2 at context 5: 0.10 -> 1.19
    t = table(2, row_s=0.02, kv=0.01, row_context=1.0)
    p = predict_serving(t, Requests([3], [3], np.array([0.0])))
    np.testing.assert_allclose(p.finish_s, [1.19], atol=1e-12)
    # without the reads (a kernel of the bucket's shape) the row cost is all host: 1 + 2 x (0.1 - 0.02)
    p = predict_serving(table(2, row_s=0.02), Requests([3], [3], np.array([0.0])))
    np.testing.assert_allclose(p.finish_s, [1.16], atol=1e-12)
