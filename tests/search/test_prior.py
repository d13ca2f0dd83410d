import pytest

from lens.types import BucketProfile, ModelShape
from search.prior import ScalingPrior, kv_bytes, memory_gib, weight_bytes

M = ModelShape(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=128256)


def bp(b, ttft, tbt):
    return BucketProfile(bucket=b, ttft_s=ttft, tbt_s=tbt, input_len=1, l1=1, l2=2, t1_s=0, t2_s=0, repeats=1, spread=0)


def test_one_unit_uses_the_ideal_scaling_law():
    p = ScalingPrior(M, "bfloat16")
    est = p.estimate(2, 8, [1024], {(1, 8): {1024: bp(1024, 0.2, 0.01)}})
    assert est[1024].ttft_s == pytest.approx(0.1)
    assert est[1024].tbt_s == pytest.approx(0.005)
    assert est[1024].source == "estimate:scaling" and est[1024].repeats == 0


def test_exponents_are_recovered_from_a_synthetic_power_law():
    p = ScalingPrior(M, "bfloat16")

    def by(tp, b, bk):
        return p._bytes(b, bk)

    true_a, true_c, true_d = -0.8, -0.6, 0.9
    meas = {}
    for tp in (1, 2, 4):
        for b in (1, 8, 32):
            meas[(tp, b)] = {bk: bp(bk, 0.01 * bk ** 0.5 * tp ** true_a, 1e-12 * tp ** true_c * by(tp, b, bk) ** true_d)
                             for bk in (128, 1024, 8192)}
    a, c, d = p.exponents(meas)
    assert (a, c, d) == pytest.approx((true_a, true_c, true_d), abs=1e-6)


def test_batched_prefill_scales_the_call_with_the_batch():
    # one call of batch 8 took 0.8 s: its share per prompt, at tp 2 (ideal law) and batch 4, is 4 x 0.05
    p = ScalingPrior(M, "bfloat16", prefill="batched")
    est = p.estimate(2, 4, [1024], {(1, 8): {1024: bp(1024, 0.8, 0.01)}})
    assert est[1024].ttft_s == pytest.approx(4 * 0.1 / 2)
    # the exponent fit sees the share per prompt: a call that grows with the batch is not a tp effect
    meas = {(tp, b): {1024: bp(1024, b * 0.1 * tp ** -0.8, 0.01)} for tp in (1, 2) for b in (1, 8)}
    assert p.exponents(meas)[0] == pytest.approx(-0.8)


def test_amali_prior_charges_a_batched_call_for_every_prompt():
    from search.prior import AmaliPrior

    seq = AmaliPrior.for_hardware(M, "bfloat16", "h100")
    bat = AmaliPrior.for_hardware(M, "bfloat16", "h100", prefill="batched")
    a, b = seq.estimate(1, 8, [1024])[1024], bat.estimate(1, 8, [1024])[1024]
    assert b.ttft_s == pytest.approx(8 * a.ttft_s) and b.tbt_s == a.tbt_s


def test_missing_bucket_everywhere_gives_no_estimate():
    p = ScalingPrior(M, "bfloat16")
    assert p.estimate(1, 1, [128, 256], {(1, 8): {128: bp(128, 0.1, 0.01)}}) is None


def test_memory_model():
    w = weight_bytes(M, "bfloat16")
    assert w == pytest.approx(M.param_count() * 2)
    assert kv_bytes(M, "bfloat16", 1000) == 2 * 16 * 1000 * 8 * 64 * 2
    assert memory_gib(M, "bfloat16", tp=2, batch=4, max_len=1000) == pytest.approx((w + 4 * kv_bytes(M, "bfloat16", 1000)) / 2 / 2**30)
