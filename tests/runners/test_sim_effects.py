"""Each effect of the simulated stacks, switched on against off on the same seed.

Every test starts from a clean device (no noise, every effect off) and switches one effect
on, so the difference is that effect alone; sizes are checked against public figures
(peak FLOP/s and HBM bandwidth of ``runners.sim.devices``) with bounds wide enough for
the stack's hidden efficiencies, never against the simulator's own formulas.
"""
from __future__ import annotations

import numpy as np
import pytest

from lens.types import Candidate, ModelShape, Probe, Requests, Target, Unit
from runners.sim import SimRunner
from runners.sim.devices import DEVICES, kv_bytes_per_token
from runners.sim.host import SimClock
from runners.sim.options import clean

BUCKETS = (128, 256, 512, 1024, 2048, 4096, 8192)
LLAMA_1B = ModelShape(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=128256)
TINY = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256)
KV_1B = kv_bytes_per_token(LLAMA_1B, "bfloat16")


def runner(hardware="inf2", model=LLAMA_1B, seed=0, sim_clock=None, prefill="sequential", **on) -> SimRunner:
    """A clean device with the options in ``on`` set (an effect switched on, a size changed)."""
    policy = "inclusive" if hardware.startswith("tpu") else "exclusive"
    opts = {**clean(), **on}
    t = Target("t", "sim", hardware, policy, "bfloat16", model, tuple(sorted(opts.items())), seed, prefill=prefill)
    return SimRunner(t, clock=sim_clock)


def run(r: SimRunner, lin, lout, *, tp=1, batch=None, buckets=BUCKETS):
    lin, lout = np.asarray(lin), np.asarray(lout)
    cand = Candidate(tp, batch or len(lin), tuple(buckets), tuple(buckets))
    return r.run_workload(cand, Requests(lin, lout))


def decode_s(w) -> float:
    """Seconds from the end of the batch's prefills to its last token."""
    return float(w.e2e_s.max() - w.ttft_s.max())


def peak_bw(hw: str) -> float:
    return DEVICES[hw].bandwidth_gbs * 1e9


# -- attention that follows the real context --------------------------------------------------
def test_ragged_paged_decode_attention_reads_only_the_rows_pages():
    """vLLM TPU: a decode step reads each row's own KV pages, so it costs more late in a bucket."""
    steps, rows = 19, 8
    low, high = [4200] * rows, [7900] * rows  # both decode in bucket 8192 (inclusive)
    off = runner("tpu-v6e")
    on = runner("tpu-v6e", context_attention=True)
    assert decode_s(run(off, low, [steps + 1] * rows)) == pytest.approx(decode_s(run(off, high, [steps + 1] * rows)))
    grow = decode_s(run(on, high, [steps + 1] * rows)) - decode_s(run(on, low, [steps + 1] * rows))
    extra = rows * (7900 - 4200) * KV_1B  # bytes more per step
    assert extra / peak_bw("tpu-v6e") <= grow / steps <= extra / (0.5 * peak_bw("tpu-v6e"))
    # a row at the bottom of the bucket reads less than the padded machine's whole bucket
    assert decode_s(run(on, low, [steps + 1] * rows)) < decode_s(run(off, low, [steps + 1] * rows))


def test_nxd_decode_attention_reads_the_whole_bucket():
    """NxD Inference's token-generation kernel takes the bucket's whole cache: no following there."""
    on = runner("inf2", context_attention=True)
    rows = 8
    low = decode_s(run(on, [4200] * rows, [20] * rows))
    high = decode_s(run(on, [7900] * rows, [20] * rows))
    assert high == pytest.approx(low, rel=1e-12)


@pytest.mark.parametrize("hardware,tiles_low,tiles_high", [
    # prompts of 600 and 1020 tokens in bucket 1024 (tiles of 128 tokens: 5 and 8 of 8)
    ("inf2", 15 + 3 * 5, 36),  # NxD: causal tiles of the real keys, padded query rows included
    ("tpu-v6e", 15, 36),  # ragged: the prompt's own causal tiles only
])
def test_prefill_attention_follows_the_prompt_inside_its_bucket(hardware, tiles_low, tiles_high):
    off, on = runner(hardware), runner(hardware, context_attention=True)
    lin = [600, 1020]
    base = run(off, lin, [1, 1], batch=1).ttft_s  # batch 1: each TTFT is one prefill
    assert base[1] == pytest.approx(base[0], rel=1e-12)  # the padded machine: one cost per bucket
    ttft = run(on, lin, [1, 1], batch=1).ttft_s
    grow = ttft[1] - ttft[0]
    flops = 4 * LLAMA_1B.hidden * LLAMA_1B.layers * (tiles_high - tiles_low) * 128 * 128
    peak = DEVICES[hardware].peak_tflops * 1e12
    assert flops / peak <= grow <= flops / (0.2 * peak)
    # following the prompt never costs more than the padded bucket
    assert ttft[0] < base[0]


# -- KV-cache copy when the decode bucket changes -----------------------------------------------
def test_nxd_copies_the_kv_cache_when_the_bucket_grows():
    rows = 4
    lin, lout = [1000] * rows, [60] * rows  # contexts 1001..1059: bucket 1024, then 2048 from 1024 on
    off, on = runner("inf2"), runner("inf2", kv_relayout=True)
    extra = decode_s(run(on, lin, lout)) - decode_s(run(off, lin, lout))
    copy = 2 * rows * 1024 * KV_1B  # read and write the batch's cache of bucket 1024
    host = on.options.host_overhead_s  # the copy is a graph call of its own
    assert copy / peak_bw("inf2") <= extra - host <= copy / (0.5 * peak_bw("inf2"))
    # no bucket change, no copy
    assert decode_s(run(on, [100] * rows, [20] * rows)) == pytest.approx(decode_s(run(off, [100] * rows, [20] * rows)))


def test_a_paged_cache_is_never_copied():
    lin, lout = [1000] * 4, [60] * 4
    assert decode_s(run(runner("tpu-v6e", kv_relayout=True), lin, lout)) == pytest.approx(
        decode_s(run(runner("tpu-v6e"), lin, lout)))


# -- host costs ----------------------------------------------------------------------------------
def test_host_work_per_live_row():
    per_row = 1e-3
    off, on = runner(row_overhead_s=per_row), runner(row_host=True, row_overhead_s=per_row)
    lin, lout = [100, 100], [11, 21]  # both generate for 10 steps, then one for 10 more
    a, b = run(off, lin, lout), run(on, lin, lout)
    np.testing.assert_allclose(b.ttft_s, a.ttft_s)
    assert b.e2e_s[0] - a.e2e_s[0] == pytest.approx(10 * 2 * per_row)
    assert b.e2e_s[1] - a.e2e_s[1] == pytest.approx(10 * 2 * per_row + 10 * per_row)


def test_launch_cost_per_generate_call():
    off, on = runner(), runner(launch=True)
    lin, lout = [100] * 5, [20] * 5  # three calls at batch 2
    a, b = run(off, lin, lout, batch=2), run(on, lin, lout, batch=2)
    launch = on.options.launch_s
    np.testing.assert_allclose(b.ttft_s - a.ttft_s, launch)  # before every batch's first prefill
    assert b.total_s - a.total_s == pytest.approx(3 * launch)


def test_stragglers_are_rare_and_long():
    lin, lout = [10] * 3, [8000] * 3  # 3 calls of 7999 decode steps at batch 1
    off, on = runner(model=TINY), runner(model=TINY, stragglers=True)
    ratio = run(on, lin, lout, batch=1).total_s / run(off, lin, lout, batch=1).total_s
    o = on.options  # 1 call in 250 takes 4x: about 1.2% more in all
    expected = 1 + o.straggler_rate * (o.straggler_factor - 1)
    assert abs(ratio - expected) < 0.5 * (expected - 1)
    # a probe's median hardly sees them, its slowest repeat does
    probe = [Probe(128, 1, 100, 41)]
    t_off = np.array(off.profile(Unit(off.target, 1, 1), probe).runs[0].times_s)
    t_on = np.array(on.profile(Unit(on.target, 1, 1), probe).runs[0].times_s)
    assert np.median(t_on) / np.median(t_off) < 1.01
    assert t_on.max() / np.median(t_off) > 1.02


# -- drift of host speed ----------------------------------------------------------------------
def _probe_s(r: SimRunner) -> float:
    return r.profile(Unit(r.target, 1, 1), [Probe(128, 1, 100, 1)]).runs[0].times_s[0]


def test_drift_moves_host_speed_with_the_clock():
    """A host-bound probe at different clock times: within +-amplitude, deterministic for a seed."""
    period = 900.0
    starts = np.linspace(0.0, 4 * period, 41)
    times = np.array([_probe_s(runner(model=TINY, drift=True, sim_clock=SimClock(start_s=s))) for s in starts])
    flat = np.array([_probe_s(runner(model=TINY, sim_clock=SimClock(start_s=s))) for s in starts])
    assert np.ptp(flat) < 1e-12 * flat[0]  # without drift, the clock does not matter
    dev = times / flat[0] - 1
    amp = runner(drift=True).options.drift_amplitude
    assert np.abs(dev).max() <= amp  # host-bound: at most the amplitude
    assert np.abs(dev).max() >= 0.3 * amp  # and it does move
    again = _probe_s(runner(model=TINY, drift=True, sim_clock=SimClock(start_s=starts[7])))
    assert again == times[7]
    other_seed = _probe_s(runner(model=TINY, drift=True, seed=3, sim_clock=SimClock(start_s=starts[7])))
    assert other_seed != times[7]


def test_drift_separates_a_profile_from_a_measurement_minutes_later():
    r = runner(model=TINY, drift=True)
    first = _probe_s(r)
    assert _probe_s(r) == pytest.approx(first, rel=1e-3)  # a second later: the same host speed
    r.clock.advance(400.0)  # minutes later on the device's clock
    assert abs(_probe_s(r) / first - 1) > 1e-3


def test_a_wall_clock_offsets_the_simulated_one():
    wall = SimClock(wall=lambda: 1234.0)
    fixed = SimClock(start_s=1234.0)
    assert _probe_s(runner(model=TINY, drift=True, sim_clock=wall)) == _probe_s(
        runner(model=TINY, drift=True, sim_clock=fixed))
    assert runner(clock="wall").clock.now() > 1e9  # the option: seconds since the epoch
    assert runner().clock.now() == 0.0  # the default: only the device's own seconds


# -- batched prefill ------------------------------------------------------------------------------
def test_batched_prefill_encodes_the_batch_in_one_call():
    seq, bat = runner(), runner(prefill="batched")
    short = run(bat, [100] * 4, [1] * 4)
    assert np.ptp(short.ttft_s) == 0.0  # every first token lands when the one call ends
    # short prompts are memory-bound: one call reads the weights once instead of four times
    assert short.ttft_s[0] < run(seq, [100] * 4, [1] * 4).ttft_s[-1]
    # one long prompt pads the whole batch to its bucket: about four 4096-token prefills
    mixed = [100, 100, 100, 4000]
    t_bat = run(bat, mixed, [1] * 4).ttft_s[0]
    t_seq = run(seq, mixed, [1] * 4).ttft_s[-1]
    t_long = run(seq, [4000], [1]).ttft_s[0]
    assert t_bat > 2 * t_seq
    assert 3 * t_long < t_bat < 5 * t_long


def test_default_sizes_are_the_ones_the_stacks_are_said_to_have():
    """The sizes the module docstrings and docs/sim.md state, so a changed default cannot drift from them."""
    from runners.sim import SimOptions

    o = SimOptions()
    assert 10e-6 <= o.row_overhead_s <= 30e-6  # 10-30 us per live row per step
    assert 1e-3 <= o.launch_s <= 10e-3  # a few ms per generate call
    assert o.straggler_rate == pytest.approx(1 / 250) and o.straggler_factor == 4.0
    assert o.drift_amplitude == 0.05 and 5 * 60 <= o.drift_period_s <= 30 * 60  # +-5% over minutes
