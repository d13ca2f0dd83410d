"""The simulated NPU runner: identity, options, semantics, staircase, noise, quirks, memory, compile.

The machine's semantics are checked on a clean device (no noise, every effect off), where
step costs are exact; each effect has its own on/off tests in ``test_sim_effects.py``.
"""
from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

from lens.errors import RunnerError, UserError
from lens.types import Candidate, ModelShape, Probe, Requests, Target, Unit
from runners.sim import EFFECTS, SIM_VERSION, SimOptions, SimRunner, device_info, fits_memory, hardware_names
from runners.sim.options import clean
from runners.sim.stacks import STACKS

ROOT = Path(__file__).resolve().parents[2]
BUCKETS = (128, 256, 512, 1024, 2048, 4096, 8192)
LLAMA_1B = ModelShape(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=128256)
LLAMA_70B = ModelShape(layers=80, hidden=8192, heads=64, kv_heads=8, intermediate=28672, vocab=128256)


def target(hardware="inf2", policy="exclusive", model=LLAMA_1B, seed=0, prefill="sequential", **options) -> Target:
    return Target("t", "sim", hardware, policy, "bfloat16", model, tuple(sorted(options.items())), seed,
                  prefill=prefill)


def clean_target(hardware="inf2", policy="exclusive", model=LLAMA_1B, seed=0, **options) -> Target:
    """A target whose device has no noise and no effect, with ``options`` on top."""
    return target(hardware, policy, model, seed, **{**clean(), **options})


def reqs(lin, lout) -> Requests:
    return Requests(np.asarray(lin), np.asarray(lout))


def cand(tp=2, batch=1, buckets=BUCKETS) -> Candidate:
    return Candidate(tp, batch, tuple(buckets), tuple(buckets))


# -- identity and errors -------------------------------------------------------------------
def test_known_hardware_and_device_info():
    assert {"inf2", "trn1", "trn2", "tpu-v5e", "tpu-v6e"} <= set(hardware_names())
    for hw in hardware_names():
        d = device_info(hw)
        for key in ("memory_gib", "devices_per_host", "peak_tflops", "bandwidth_gbs", "link_gbs", "source"):
            assert key in d
        assert d["memory_gib"] > 0 and d["devices_per_host"] >= 1 and d["peak_tflops"] > 0
    assert device_info("inf2")["devices_per_host"] == 24  # inf2.48xlarge: 12 chips x 2 NeuronCores
    assert device_info("trn1")["devices_per_host"] == 32
    assert device_info("tpu-v6e")["devices_per_host"] == 8


def test_unknown_hardware_lists_the_known_ones():
    with pytest.raises(UserError) as exc:
        SimRunner(target("h100"))
    for hw in hardware_names():
        assert hw in str(exc.value)
    with pytest.raises(UserError):
        device_info("h100")


def test_options_are_validated():
    with pytest.raises(UserError, match="unknown option 'nois'.*accepted: .*noise"):
        SimRunner(target(nois=0.1))
    with pytest.raises(UserError, match="unknown option 'straglers'"):
        SimRunner(target(straglers=False))
    with pytest.raises(UserError, match="must be a float"):
        SimRunner(target(noise="high"))
    with pytest.raises(UserError, match=">= 0"):
        SimRunner(target(noise=-0.1))
    with pytest.raises(UserError, match="finite"):
        SimRunner(target(noise=float("nan")))
    with pytest.raises(UserError, match="'stragglers' must be true or false"):
        SimRunner(target(stragglers=1))
    # the stack's prefill is the target's own setting now, read by the device and the estimator alike
    moved = Target("t", "sim", "inf2", "exclusive", "bfloat16", LLAMA_1B, (("prefill", "batched"),))
    with pytest.raises(UserError, match=r"option 'prefill' .* no longer an option: write prefill = .* under \[target\]"):
        SimRunner(moved)
    with pytest.raises(UserError, match="'straggler_factor' must be >= 1"):
        SimRunner(target(straggler_factor=0.5))
    with pytest.raises(UserError, match="'straggler_rate' must be <= 1"):
        SimRunner(target(straggler_rate=2.0))
    with pytest.raises(UserError, match="'drift_period_s' must be > 0"):
        SimRunner(target(drift_period_s=0))
    assert SimRunner(target(noise=0)).options.noise == 0.0  # an integer is a valid float
    assert SimRunner(target()).options == SimOptions()


def test_every_effect_is_a_boolean_option_on_by_default():
    defaults = SimOptions()
    for name in EFFECTS:
        assert SimRunner.options_schema[name] == (bool, True)
        assert getattr(defaults, name) is True
    off = SimRunner(clean_target()).options
    assert off.noise == 0.0 and not any(getattr(off, name) for name in EFFECTS)


def test_every_output_says_simulated():
    r = SimRunner(target())
    assert r.simulated and r.name == "sim" and r.host() == "sim:inf2"
    assert r.versions()["simulator"] == SIM_VERSION
    p = r.profile(Unit(r.target, 2, 1), [Probe(1024, 600, 16, 2)])
    assert p.simulated and p.host == "sim:inf2" and p.versions["simulator"] == SIM_VERSION
    w = r.run_workload(cand(), reqs([10], [5]))
    assert w.simulated and w.host == "sim:inf2"


def test_fingerprint_is_stable_and_changes_with_what_changes_measurements():
    a = SimRunner(target()).fingerprint()
    assert a == SimRunner(target()).fingerprint()
    assert a == SimRunner(target(seed=9)).fingerprint()  # the seed only draws noise
    assert a != SimRunner(target("trn1")).fingerprint()
    assert a != SimRunner(target(quirk_seed=1)).fingerprint()
    assert "quirk_seed" not in str(SimRunner(target(quirk_seed=1)).fingerprint_fields())
    assert a != SimRunner(target(stragglers=False)).fingerprint()  # another device behaviour
    assert a != SimRunner(target(prefill="batched")).fingerprint()
    # a sequential device keeps the fingerprint it had while its prefill was a [target.options] key
    # (the value lensopt-sim 2.0 computed then), so the profiles cached under it stay found
    assert a == "840e07aa234488e7"
    assert a == SimRunner(target(wall_delay_s=1.0)).fingerprint()  # never enters a simulated time


def test_check_unit():
    r = SimRunner(target())
    r.check_unit(Unit(r.target, 8, 4))
    with pytest.raises(UserError, match="divide"):
        r.check_unit(Unit(r.target, 3, 1))
    with pytest.raises(UserError, match="divide"):
        r.check_unit(Unit(r.target, 16, 1))  # 16 divides 32 heads but not 8 kv heads
    wide = ModelShape(layers=2, hidden=4096, heads=64, kv_heads=64, intermediate=512, vocab=1000)
    v6e = SimRunner(target("tpu-v6e", "inclusive", model=wide))
    with pytest.raises(UserError, match="8 .* devices"):
        v6e.check_unit(Unit(v6e.target, 16, 1))  # a v6e host has 8 chips
    with pytest.raises(UserError):
        r.profile(Unit(r.target, 3, 1), [Probe(1024, 600, 16, 1)])


def test_lengths_that_fit_no_bucket_name_the_request():
    r = SimRunner(target())
    with pytest.raises(UserError, match="request 2"):
        r.run_workload(cand(), reqs([10, 20, 9000], [5, 5, 5]))
    with pytest.raises(UserError, match="request 1"):
        r.run_workload(cand(), reqs([10, 8000], [5, 500]))  # its last decode context is 8499
    with pytest.raises(UserError, match="request 0"):
        r.run_workload(cand(), reqs([0], [5]))
    with pytest.raises(UserError):
        r.profile(Unit(r.target, 2, 1), [Probe(128, 100, 64, 1)])  # decode leaves the only bucket


# -- determinism, noise, quirks ------------------------------------------------------------
def test_deterministic_for_a_seed():
    probes = [Probe(b, b // 2 + 1, 32, 3) for b in (256, 1024, 4096)]
    work = reqs([100, 700, 3000, 50], [40, 3, 200, 90])
    a, b = SimRunner(target(seed=5)), SimRunner(target(seed=5))
    pa, pb = a.profile(Unit(a.target, 2, 4), probes), b.profile(Unit(b.target, 2, 4), probes)
    assert [x.times_s for x in pa.runs] == [x.times_s for x in pb.runs]
    assert pa.compile_s == pb.compile_s and pa.run_s == pb.run_s
    wa, wb = a.run_workload(cand(batch=2), work), b.run_workload(cand(batch=2), work)
    np.testing.assert_array_equal(wa.e2e_s, wb.e2e_s)
    c = SimRunner(target(seed=6))
    pc = c.profile(Unit(c.target, 2, 4), probes)
    assert [x.times_s for x in pa.runs] != [x.times_s for x in pc.runs]
    assert len(set(pa.runs[0].times_s)) == 3  # repeats differ from each other


@pytest.mark.parametrize("sigma", [0.01, 0.05])
def test_noise_spread_follows_the_option(sigma):
    r = SimRunner(clean_target(noise=sigma))
    (run,) = r.profile(Unit(r.target, 1, 1), [Probe(1024, 600, 64, 400)]).runs
    spread = float(np.std(np.log(run.times_s)))
    assert spread == pytest.approx(sigma, rel=0.15)
    r0 = SimRunner(clean_target())
    (run0,) = r0.profile(Unit(r0.target, 1, 1), [Probe(1024, 600, 64, 5)]).runs
    assert len(set(run0.times_s)) == 1
    assert run.median_s == pytest.approx(run0.times_s[0], rel=3 * sigma)


def _tbt_by_bucket(r: SimRunner, tp=2, batch=1) -> np.ndarray:
    """Noise-free decode cost per bucket, from two probes per bucket."""
    out = []
    lo = (0,) + BUCKETS[:-1]
    for a, b in zip(lo, BUCKETS):
        lin = a + 1  # inside b under both policies
        l2 = min(64, b - lin - 1)
        runs = r.profile(Unit(r.target, tp, batch), [Probe(b, lin, 2, 1), Probe(b, lin, l2, 1)]).runs
        out.append((runs[1].times_s[0] - runs[0].times_s[0]) / (l2 - 2))
    return np.array(out)


def test_quirks_are_off_trend_seeded_and_can_be_switched_off():
    tbt0 = _tbt_by_bucket(SimRunner(clean_target(quirk_seed=0)))
    tbt1 = _tbt_by_bucket(SimRunner(clean_target(quirk_seed=1)))
    plain = _tbt_by_bucket(SimRunner(clean_target(quirks=0.0)))
    assert not np.allclose(tbt0, tbt1)
    np.testing.assert_allclose(plain, _tbt_by_bucket(SimRunner(clean_target(quirks=0.0, quirk_seed=1))))
    assert np.all(np.diff(plain) > 0)  # without quirks decode cost grows with the KV bucket
    ratio = tbt0 / plain
    assert ratio.min() >= 0.85 - 1e-9 and ratio.max() <= 1.30 + 1e-9
    assert np.ptp(ratio) > 0.03  # some buckets are favoured or disfavoured


# -- machine semantics ---------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["exclusive", "inclusive"])
def test_ttft_staircase(policy):
    r = SimRunner(clean_target(policy=policy))
    lin = np.arange(600, 1500, 7)
    w = r.run_workload(cand(batch=1), reqs(lin, np.ones_like(lin)))
    edge = 1024  # exclusive: 1024 runs in 2048; inclusive: 1024 runs in 1024
    inside = lin < edge if policy == "exclusive" else lin <= edge
    assert np.ptp(w.ttft_s[inside]) == 0.0 and np.ptp(w.ttft_s[~inside]) == 0.0
    assert w.ttft_s[~inside][0] > 1.5 * w.ttft_s[inside][0]
    np.testing.assert_array_equal(w.e2e_s, w.ttft_s)  # one token: the prefill's
    one = r.run_workload(cand(batch=1), reqs([edge - 1, edge, edge + 1], [1, 1, 1])).ttft_s
    jump_at = 1 if policy == "exclusive" else 2
    assert one[jump_at] > 1.5 * one[jump_at - 1]


def test_decode_bucket_follows_the_context():
    r = SimRunner(clean_target())
    # decode contexts 1001..1100: steps 1..22 in bucket 1024, steps 23..99 in 2048 (exclusive)
    e2e = r.run_workload(cand(batch=1), reqs([1001] * 100, np.arange(1, 101))).e2e_s
    step = np.diff(e2e)
    assert np.ptp(step[:22]) < 1e-12 and np.ptp(step[23:]) < 1e-12
    assert step[23] > step[0]


def test_static_batch_semantics():
    r = SimRunner(clean_target())
    lin = np.array([100, 300, 50, 900])
    lout = np.array([10, 1, 40, 25])
    w = r.run_workload(cand(batch=4), reqs(lin, lout))
    # prompts one by one: TTFT cumulative, each step the prefill of its own bucket
    assert np.all(np.diff(w.ttft_s) > 0)
    assert w.e2e_s[1] == w.ttft_s[1]  # a one-token request ends with its prefill
    # the rest decode together after the last prefill; longer outputs end later
    assert np.all(w.e2e_s[[0, 2, 3]] > w.ttft_s[-1])
    assert w.e2e_s[0] < w.e2e_s[3] < w.e2e_s[2] == pytest.approx(w.total_s)
    # decode steps run in the bucket of the batch's longest context (900 + k): 1024 and 2048
    # for everyone, so request 0 (10 tokens) pays the 1024-bucket step 9 times
    alone = r.run_workload(cand(batch=4), reqs([900, 900, 900, 900], [10, 1, 1, 1]))
    assert w.e2e_s[0] - w.ttft_s[-1] == pytest.approx(alone.e2e_s[0] - alone.ttft_s[-1])


def test_finished_requests_stop_setting_the_decode_bucket():
    r = SimRunner(clean_target())
    # the 900-token prompt finishes after 4 decode steps; the 50-token one goes on in bucket 128
    w = r.run_workload(cand(batch=2), reqs([900, 50], [5, 40]))
    short = r.run_workload(cand(batch=2), reqs([50, 50], [1, 40]))
    long = r.run_workload(cand(batch=2), reqs([900, 900], [1, 5]))
    dec = lambda x, i: x.e2e_s[i] - x.ttft_s[-1]  # noqa: E731
    step_128 = dec(short, 1) / 39
    step_1024 = dec(long, 1) / 4
    assert step_1024 > step_128
    assert dec(w, 0) == pytest.approx(4 * step_1024)
    assert dec(w, 1) == pytest.approx(4 * step_1024 + 35 * step_128)


def test_profile_agrees_with_a_workload_of_identical_requests():
    r = SimRunner(clean_target())
    probe = Probe(1024, 600, 100, 1)
    (run,) = r.profile(Unit(r.target, 2, 4), [probe]).runs
    w = r.run_workload(Candidate(2, 4, (1024,), (1024,)), reqs([600] * 4, [100] * 4))
    assert run.times_s[0] == pytest.approx(w.total_s)
    assert w.e2e_s.max() == pytest.approx(w.total_s)


def test_batches_run_one_after_another():
    r = SimRunner(clean_target())
    one = r.run_workload(cand(batch=2), reqs([100, 100], [20, 20]))
    two = r.run_workload(cand(batch=2), reqs([100] * 5, [20] * 5))
    last = r.run_workload(cand(batch=2), reqs([100], [20]))  # one real row, one padding row
    assert two.total_s == pytest.approx(2 * one.total_s + last.total_s)
    assert last.total_s < one.total_s  # padding rows are not encoded, but decode as one shape
    np.testing.assert_allclose(two.ttft_s[2:4], one.ttft_s)  # TTFT from its own batch start


# -- memory and compile time ---------------------------------------------------------------
def test_out_of_memory_is_a_runner_error():
    r = SimRunner(target(model=LLAMA_70B))
    assert not fits_memory("inf2", LLAMA_70B, "bfloat16", 1, 1, 1024)
    with pytest.raises(RunnerError, match="out of device memory"):
        r.profile(Unit(r.target, 1, 1), [Probe(1024, 600, 16, 1)])
    with pytest.raises(RunnerError, match="out of device memory"):
        r.run_workload(cand(tp=1), reqs([10], [5]))
    # the KV cache counts too: a 1B model fits at batch 1 but not at batch 4096
    small = SimRunner(target())
    small.profile(Unit(small.target, 1, 1), [Probe(8192, 4097, 16, 1)])
    with pytest.raises(RunnerError, match="out of device memory"):
        small.profile(Unit(small.target, 1, 4096), [Probe(8192, 4097, 16, 1)])


def test_compile_and_run_time_are_simulated_not_slept():
    r = SimRunner(target())
    probes = [Probe(b, b // 2 + 1, 32, 3) for b in BUCKETS]
    p = r.profile(Unit(r.target, 2, 8), probes)
    assert p.compile_s > 60 + 7 * 2 * 10  # a fixed part per unit, then tens of seconds per graph
    assert p.run_s == pytest.approx(sum(sum(x.times_s) for x in p.runs))
    # the runner keeps what it compiled: profiling the same unit again compiles nothing
    assert r.profile(Unit(r.target, 2, 8), probes[:2]).compile_s == 0.0
    # fewer buckets compile fewer graphs; every unit pays its fixed part
    fresh = SimRunner(target())
    few = fresh.profile(Unit(fresh.target, 2, 8), probes[:2]).compile_s
    assert 60 < few < p.compile_s
    # hundreds of requests with long outputs: many simulated seconds, returned at once
    rng = np.random.default_rng(0)
    w = r.run_workload(cand(batch=1), reqs(rng.integers(1, 2000, 300), rng.integers(200, 1000, 300)))
    assert w.total_s > 600 and w.run_s == w.total_s and w.compile_s > 0


def test_compile_time_grows_with_bucket_and_model_size():
    def graphs_s(model, bucket_list):
        r = SimRunner(target(model=model))
        probes = [Probe(b, b // 2 + 1, 8, 1) for b in bucket_list]
        return r.profile(Unit(r.target, 8, 1), probes).compile_s

    one_small, one_large = graphs_s(LLAMA_1B, (256,)), graphs_s(LLAMA_1B, (8192,))
    assert one_large > one_small  # a longer bucket is a larger graph
    big = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=32000)
    assert graphs_s(big, (256,)) > 1.5 * one_small  # 7B parameters against 1.2B
    # the fixed part: two graphs cost less than twice one
    assert graphs_s(LLAMA_1B, (256, 8192)) < one_small + one_large


# -- shipped paper-style targets -----------------------------------------------------------
SPACE_FILES = sorted((ROOT / "spaces").glob("sim-*.toml"))


def test_one_target_per_simulated_device():
    assert {tomllib.loads(p.read_text())["target"]["hardware"] for p in SPACE_FILES} == set(hardware_names())


@pytest.mark.parametrize("path", SPACE_FILES, ids=lambda p: p.name)
def test_shipped_sim_targets(path):
    doc = tomllib.loads(path.read_text())
    assert set(doc) == {"target", "space"}
    t, s = doc["target"], doc["space"]
    assert set(t) <= {"name", "runner", "hardware", "bucket_policy", "dtype", "seed", "prefill", "model", "options"}
    assert t["runner"] == "sim"
    assert t["bucket_policy"] == ("inclusive" if t["hardware"].startswith("tpu") else "exclusive")
    # the prefill the real stack runs: vLLM TPU encodes a batch's prompts in one call, NxD one at a time
    vllm = STACKS[t["hardware"]].software == "vLLM TPU"
    assert t.get("prefill", "sequential") == ("batched" if vllm else "sequential")
    model = ModelShape(**t["model"])
    tgt = Target(t["name"], "sim", t["hardware"], t["bucket_policy"], t["dtype"], model,
                 tuple(sorted(t.get("options", {}).items())), t.get("seed", 0))
    r = SimRunner(tgt)  # validates hardware, dtype and options
    assert s["batch"] == [1, 2, 4, 8, 16, 32] and s["buckets"] == list(BUCKETS)
    for tp in s["tp"]:
        r.check_unit(Unit(tgt, tp, 1))
        assert fits_memory(tgt.hardware, model, tgt.dtype, tp, 1, 8192), f"tp {tp} never fits"
    # the space is worth searching: the widest tp fits the whole batch range at 8192
    assert fits_memory(tgt.hardware, model, tgt.dtype, max(s["tp"]), 32, 8192)
    try:
        from runners import available
        from spaces.loader import load_space
    except ImportError:
        return
    if "sim" in available():
        assert load_space(path).target.hardware == tgt.hardware


def test_the_options_listing_reads_every_declared_option(capsys):
    from runners.sim.__main__ import main

    assert main() == 0
    text = capsys.readouterr().out
    for name in SimRunner.options_schema:
        assert f"  {name} " in text
    assert text.count("effect\n") == len(EFFECTS)
