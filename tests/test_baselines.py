"""The accuracy baselines of benchmarks/baselines.py on hand-computed cases (CPU, fast)."""
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.baselines import MaverIQFit, OperatorSum, Peak, fit_maveriq  # noqa: E402
from lens.types import ModelShape, Requests  # noqa: E402


# -- MaverIQ-style fit ----------------------------------------------------------------------
def test_fit_recovers_an_exact_line():
    lout = np.array([1, 11, 21, 41])
    e2e = 0.5 + 0.01 * (lout - 1)
    f = fit_maveriq(lout, e2e)
    assert f.ttft_s == pytest.approx(0.5)
    assert f.tbt_s == pytest.approx(0.01)
    assert f.n == 4


def test_fit_is_ordinary_least_squares():
    # x = l_out - 1 = 0, 1, 2, 3; y = 1, 3, 2, 5 -> slope 1.1, intercept 1.1 (by hand)
    f = fit_maveriq([1, 2, 3, 4], [1.0, 3.0, 2.0, 5.0])
    assert f.tbt_s == pytest.approx(1.1)
    assert f.ttft_s == pytest.approx(1.1)


def test_negative_intercept_is_pinned_to_zero():
    # y = 0.01 x - 0.1 on x = 20, 30, 40: an OLS intercept of -0.1; refit through the origin
    x = np.array([20.0, 30.0, 40.0])
    y = 0.01 * x - 0.1
    f = fit_maveriq(x + 1, y)
    assert f.ttft_s == 0.0
    assert f.tbt_s == pytest.approx(float(x @ y / (x @ x)))


def test_negative_slope_falls_back_to_a_constant():
    f = fit_maveriq([2, 10], [2.0, 1.0])
    assert f.tbt_s == 0.0
    assert f.ttft_s == pytest.approx(1.5)


def test_one_distinct_output_length_gives_the_mean():
    f = fit_maveriq([5, 5, 5], [1.0, 2.0, 3.0])
    assert (f.ttft_s, f.tbt_s) == (pytest.approx(2.0), 0.0)


def test_predict_e2e():
    f = MaverIQFit(ttft_s=0.2, tbt_s=0.01, n=3)
    assert f.predict_e2e([1, 2, 101]).tolist() == pytest.approx([0.2, 0.21, 1.2])


@pytest.mark.parametrize("lout,e2e", [([], []), ([1, 2], [1.0]), ([1, 2], [1.0, 0.0]), ([1, 2], [1.0, np.nan])])
def test_fit_rejects_bad_input(lout, e2e):
    with pytest.raises(ValueError):
        fit_maveriq(lout, e2e)


# -- operator-sum roofline ------------------------------------------------------------------
#: h=4, H=2, K=1, d=2, I=8, V=16, one layer, 1-byte elements: every count below is by hand
TINY = ModelShape(layers=1, hidden=4, heads=2, kv_heads=1, intermediate=8, vocab=16)
BIG = 1e30


def test_prefill_flops_by_hand():
    # l = 3, tp 1: qkv 2*3*4*8 = 192, attention 4*9*2*2 = 144, o 2*3*2*2*4 = 96,
    # gate/up 4*3*4*8 = 384, down 2*3*8*4 = 192, LM head (last position) 2*4*16 = 128 -> 1136
    op = OperatorSum(TINY, Peak(flops_s=1.0, bandwidth_Bps=BIG, link_Bps=BIG), tp=1, dtype="fp8")
    assert op.prefill_s([3])[0] == pytest.approx(1136.0)


def test_decode_bytes_by_hand():
    # n = 1 row, contexts summing to S = 5, tp 1, 1 byte per element:
    # norms 2*(2*4) = 16; qkv 4*8 + 4 + 8 = 44; attention 2*5*1*2 + 2*1*2*2 = 28;
    # o 2*2*4 + 4 + 4 = 24; gate/up 2*4*8 + 4 + 16 = 84; act 3*8 = 24; down 8*4 + 8 + 4 = 44;
    # LM head 4*16 + 4 + 16 = 84 -> 348
    op = OperatorSum(TINY, Peak(flops_s=BIG, bandwidth_Bps=1.0, link_Bps=BIG), tp=1, dtype="fp8")
    assert op.decode_step_s([1], [5])[0] == pytest.approx(348.0)


def test_tensor_parallel_splits_compute_and_adds_all_reduces():
    one = OperatorSum(TINY, Peak(flops_s=1.0, bandwidth_Bps=BIG, link_Bps=BIG), tp=1, dtype="fp8")
    two = OperatorSum(TINY, Peak(flops_s=1.0, bandwidth_Bps=BIG, link_Bps=BIG), tp=2, dtype="fp8")
    assert two.prefill_s([3])[0] == pytest.approx(1136.0 / 2)
    # two ring all-reduces of l*h = 12 one-byte elements per layer: 2 * (2*(2-1)/2 * 12) / link
    slow_link = OperatorSum(TINY, Peak(flops_s=BIG, bandwidth_Bps=BIG, link_Bps=1.0), tp=2, dtype="fp8")
    assert slow_link.prefill_s([3])[0] == pytest.approx(24.0)
    assert OperatorSum(TINY, Peak(BIG, BIG, 1.0), tp=1, dtype="fp8").prefill_s([3])[0] == pytest.approx(0.0)


def test_roofline_takes_the_slower_of_compute_and_memory_per_operator():
    peak = Peak(flops_s=1.0, bandwidth_Bps=1.0, link_Bps=BIG)
    op = OperatorSum(TINY, peak, tp=1, dtype="fp8")
    compute = OperatorSum(TINY, Peak(1.0, BIG, BIG), tp=1, dtype="fp8").decode_step_s([1], [5])[0]
    memory = OperatorSum(TINY, Peak(BIG, 1.0, BIG), tp=1, dtype="fp8").decode_step_s([1], [5])[0]
    both = op.decode_step_s([1], [5])[0]
    assert max(compute, memory) <= both <= compute + memory


def test_static_batch_schedule():
    op = OperatorSum(TINY, Peak(flops_s=1e3, bandwidth_Bps=1e3, link_Bps=BIG), tp=1, dtype="fp8")
    req = Requests(np.array([2, 3]), np.array([2, 3]))
    ttft, e2e, total = op.predict(req, batch=2)
    p0, p1 = op.prefill_s([2, 3])
    s1 = op.decode_step_s([2], [(2 + 1) + (3 + 1)])[0]  # both rows generate at step 1
    s2 = op.decode_step_s([1], [3 + 2])[0]  # only the second at step 2
    assert ttft.tolist() == pytest.approx([p0, p0 + p1])
    assert e2e.tolist() == pytest.approx([p0 + p1 + s1, p0 + p1 + s1 + s2])
    assert total == pytest.approx(p0 + p1 + s1 + s2)


def test_one_token_request_ends_at_its_own_first_token():
    op = OperatorSum(TINY, Peak(1e3, 1e3, BIG), tp=1, dtype="fp8")
    ttft, e2e, total = op.predict(Requests(np.array([2, 3]), np.array([1, 1])), batch=2)
    assert e2e.tolist() == pytest.approx(ttft.tolist())
    assert total == pytest.approx(ttft[-1])


def test_batches_are_independent():
    op = OperatorSum(TINY, Peak(1e3, 1e3, BIG), tp=1, dtype="fp8")
    req = Requests(np.array([2, 3, 4, 5]), np.array([3, 2, 4, 1]))
    _, e2e, total = op.predict(req, batch=2)
    _, a, ta = op.predict(Requests(req.input_len[:2], req.output_len[:2]), batch=2)
    _, b, tb = op.predict(Requests(req.input_len[2:], req.output_len[2:]), batch=2)
    assert e2e.tolist() == pytest.approx(np.concatenate([a, b]).tolist())
    assert total == pytest.approx(ta + tb)


def test_peak_comes_from_the_public_spec():
    p = Peak.for_sim_device("tpu-v6e", "bfloat16")
    assert p.flops_s == pytest.approx(918e12)
    assert p.bandwidth_Bps == pytest.approx(1638e9)
    assert p.link_Bps == pytest.approx(400e9)


MODEL = ModelShape(layers=4, hidden=256, heads=4, kv_heads=2, intermediate=688, vocab=4096)
PEAK = Peak(flops_s=50e12, bandwidth_Bps=400e9, link_Bps=100e9)


def test_calibration_recovers_known_efficiencies_from_probes():
    op = OperatorSum(MODEL, PEAK, tp=2, dtype="bfloat16")
    probes = []
    for l_in, l_out in ((64, 2), (64, 60), (300, 2), (300, 120), (900, 2), (900, 100)):
        pre, dec = op.probe_parts(l_in, l_out, batch=4)
        probes.append((l_in, l_out, 2.5 * pre + 4.0 * dec))  # prefill at 40% of peak, decode at 25%
    cal = op.calibrated(probes, batch=4)
    assert cal.scale == pytest.approx((2.5, 4.0))
    req = Requests(np.array([100, 700]), np.array([5, 40]))
    _, e2e_peak, _ = op.predict(req, batch=2)
    _, e2e_cal, _ = cal.predict(req, batch=2)
    pre = op.prefill_s(req.input_len)
    assert e2e_cal[0] == pytest.approx(2.5 * pre.sum() + 4.0 * (e2e_peak[0] - pre.sum()))


def test_probe_parts_are_the_schedule_of_a_full_batch():
    op = OperatorSum(MODEL, PEAK, tp=1, dtype="bfloat16")
    pre, dec = op.probe_parts(200, 30, batch=3)
    _, e2e, total = op.predict(Requests(np.full(3, 200), np.full(3, 30)), batch=3)
    assert pre + dec == pytest.approx(total) and e2e.max() == pytest.approx(total)
    assert op.probe_parts(200, 1, batch=3)[1] == 0.0


def test_calibration_pins_a_negative_efficiency_and_refits_the_other():
    op = OperatorSum(MODEL, PEAK, tp=1, dtype="bfloat16")
    probes = [(l, n, 3.0 * op.probe_parts(l, n, batch=1)[1]) for l, n in ((64, 30), (64, 90), (500, 40))]
    cal = op.calibrated(probes, batch=1)  # the prefill share explains nothing: decode alone
    assert cal.scale[0] >= 0 and cal.scale[1] > 0
    with pytest.raises(ValueError):
        op.calibrated(probes[:1], batch=1)
