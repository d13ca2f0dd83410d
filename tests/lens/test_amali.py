"""The AMALI analytical GPU model (lens.amali), its CLI and its GPU validation script (CPU parts)."""
from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import math
import types
from dataclasses import fields
from pathlib import Path

import pytest

from lens.amali import (
    LABEL,
    SOURCE,
    breakdown,
    decode_kernels,
    decode_seconds,
    estimate_for,
    estimate_unit,
    gpu_spec,
    is_known_gpu,
    kernel_cost,
    kll_cycles,
    known_gpus,
    occupancy,
    prefill_kernels,
    prefill_seconds,
    request_seconds,
    waves,
)
from lens.amali.kernels import AllReduce, FusedAttention, Gemm, RowOp, shard
from lens.amali.model import HMMA_FMA, KLL_A, KLL_B, KLL_C, CtaWork, LaunchConfig, allreduce_seconds, simulate
from lens.errors import UserError
from lens.types import BucketProfile, ModelShape, Target, Unit

ROOT = Path(__file__).resolve().parents[2]
LLAMA3_8B = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=128256)
TINY = ModelShape(layers=2, hidden=256, heads=4, kv_heads=2, intermediate=512, vocab=1000)


# -- specs ---------------------------------------------------------------------------------
def test_known_gpus_and_aliases():
    assert set(known_gpus()) >= {"A100-SXM", "H100-SXM", "H200-SXM", "L4"}
    assert gpu_spec("h200").name == "H200-SXM"
    assert gpu_spec("NVIDIA-H100").name == "H100-SXM"
    assert gpu_spec("A100 SXM4 80GB").name == "A100-SXM"
    assert gpu_spec("l4").name == "L4"
    assert is_known_gpu("nvidia-h200") and not is_known_gpu("inf2")


def test_unknown_gpu_lists_known_ones():
    with pytest.raises(UserError) as exc:
        gpu_spec("TPU-v5e")
    msg = str(exc.value)
    assert "TPU-v5e" in msg
    for name in known_gpus():
        assert name in msg


@pytest.mark.parametrize(
    "name, tflops, gbps, sms",
    [("A100-SXM", 312, 2039, 108), ("H100-SXM", 989, 3350, 132), ("H200-SXM", 989, 4800, 132), ("L4", 121, 300, 58)],
)
def test_specs_match_the_spec_sheets(name, tflops, gbps, sms):
    g = gpu_spec(name)
    assert g.peak_tflops("bf16") == pytest.approx(tflops)
    assert g.dram_gbps == gbps and g.sms == sms


def test_paper_a100_figures():
    a = gpu_spec("A100")
    assert a.clock_mhz == pytest.approx(1410, abs=1)  # derived from 312 TFLOPS, equals the paper's clock
    assert (a.l1_latency, a.smem_latency, a.l2_latency, a.dram_latency) == (37, 23, 224, 290)
    assert a.tc_fma("bf16") == 256 and gpu_spec("H100").tc_fma("bf16") == 512
    # HMMA.16816 = 2048 FMA: 8 cycles on A100's tensor core, 4 on Hopper's
    assert HMMA_FMA / a.tc_fma("bf16") == 8
    assert HMMA_FMA / gpu_spec("H200").tc_fma("bf16") == 4


def test_every_number_has_a_source():
    numeric = [f.name for f in fields(gpu_spec("A100")) if f.type in ("int", "float") or f.name == "tc_fma_per_clk"]
    for name in known_gpus():
        g = gpu_spec(name)
        missing = [f for f in numeric if not g.source(f)]
        assert not missing, f"{name}: no source for {missing}"


def test_dtypes():
    assert not gpu_spec("A100").supports("fp8")
    assert gpu_spec("H100").supports("float8_e4m3fn")
    with pytest.raises(UserError, match="fp8"):
        estimate_unit(model=TINY, gpu="A100", tp=1, batch=1, buckets=[64], dtype="fp8")
    with pytest.raises(UserError, match="not modelled"):
        estimate_unit(model=TINY, gpu="H100", tp=1, batch=1, buckets=[64], dtype="int3")
    assert not gpu_spec("H100").supports("int3")  # never raises
    # fp32 runs on the TF32 tensor-core path with 4-byte activations
    f32 = {k.name: k for k in prefill_kernels(TINY, tokens=64, dtype="float32")}
    assert f32["rmsnorm_attn"].elem_bytes == 4 and f32["qkv_proj"].dtype == "fp32"
    assert gpu_spec("A100").peak_tflops("fp32") == pytest.approx(156)
    assert estimate_unit(model=TINY, gpu="L4", tp=1, batch=1, buckets=[64], dtype="float32")[64].ttft_s > 0


# -- occupancy, waves, KLL: hand-worked cases -------------------------------------------------
def test_occupancy_hand_worked():
    h100, a100, l4 = gpu_spec("H100"), gpu_spec("A100"), gpu_spec("L4")
    # 8 warps, 32 regs: 64/8 = 8 CTAs by warps; 65536 / (1024 * 8) = 8 by registers
    o = occupancy(h100, block=256, regs=32, smem=0)
    assert (o.ctas_per_sm, o.occupancy, o.limiter) == (8, 1.0, "warps")
    # 168 regs -> 5376 per warp (256-register granules); 65536 / (5376 * 4) = 3 CTAs of 4 warps
    o = occupancy(a100, block=128, regs=168, smem=0)
    assert (o.ctas_per_sm, o.limiter) == (3, "regs") and o.occupancy == pytest.approx(12 / 64)
    # 96 KiB + 1 KiB reserved per CTA in 164 KiB: one CTA
    o = occupancy(a100, block=256, regs=32, smem=96 * 1024)
    assert (o.ctas_per_sm, o.limiter) == (1, "smem")
    # 32 small CTAs cap at the 32-CTA limit before 64 warps
    o = occupancy(h100, block=32, regs=16, smem=0)
    assert (o.ctas_per_sm, o.limiter, o.occupancy) == (32, "ctas", 0.5)
    # Ada: 48 warps per SM, so one 1024-thread CTA
    o = occupancy(l4, block=1024, regs=32, smem=0)
    assert o.ctas_per_sm == 1 and o.occupancy == pytest.approx(32 / 48)
    for bad in ({"block": 2048, "regs": 32, "smem": 0}, {"block": 128, "regs": 300, "smem": 0},
                {"block": 128, "regs": 32, "smem": 300 * 1024}):
        with pytest.raises(ValueError):
            occupancy(h100, **bad)


def test_waves_hand_worked():
    assert [(w.n, w.active_sms, w.ctas, w.repeat) for w in waves(264, 132, 1)] == [(1, 132, 132, 2)]
    assert [(w.n, w.active_sms, w.ctas, w.repeat) for w in waves(133, 132, 1)] == [(1, 132, 132, 1), (1, 1, 1, 1)]
    # 300 CTAs, 2 per SM: one full wave of 264, then 36 CTAs on 36 SMs
    assert [(w.n, w.active_sms, w.ctas, w.repeat) for w in waves(300, 132, 2)] == [(2, 132, 264, 1), (1, 36, 36, 1)]
    # 136 left over: the busiest SM holds ceil(136 / 132) = 2
    assert waves(400, 132, 2)[-1].n == 2
    assert waves(0, 132, 2) == []


def test_wave_quantisation_in_cycles():
    """1024-thread CTAs (one per SM by registers), 100 instructions per warp: 800 cycles of
    issue per wave (32 warps over 4 sub-cores = 8 per scheduler); a 133rd CTA adds a wave."""
    h100 = gpu_spec("H100")
    work = CtaWork(instr_per_warp=100.0)

    def issue(grid):
        cfg = LaunchConfig(grid=grid, block=1024, regs=64, smem=0)
        return simulate(h100, cfg, work, dram_bytes=0.0, dtype=None)["s_selected"]

    assert issue(132) == pytest.approx(800)
    assert issue(133) == pytest.approx(1600)
    assert issue(264) == pytest.approx(1600)
    assert issue(265) == pytest.approx(2400)


def test_divergence_is_sub_core_imbalance():
    """3 warps on 4 sub-cores: the representative sub-core issues 0.75 of a warp's
    instructions, the busiest a whole warp; ID is the difference."""
    h100 = gpu_spec("H100")
    cfg = LaunchConfig(grid=1, block=96, regs=32, smem=200 * 1024)  # smem: one CTA per SM
    res = simulate(h100, cfg, CtaWork(instr_per_warp=1000.0), dram_bytes=0.0, dtype=None)
    assert res["s_selected"] == pytest.approx(750)
    assert res["divergence"] == pytest.approx(250)


def test_tensor_issue_interval():
    """Tensor pipe: FMA / (tensor-core FMA per clock per SM), per co-resident CTA."""
    a100 = gpu_spec("A100")
    cfg = LaunchConfig(grid=108, block=128, regs=32, smem=0)
    res = simulate(a100, cfg, CtaWork(instr_per_warp=1.0, tc_fma=1024.0 * 1000), dram_bytes=0.0, dtype="bf16")
    assert res["tensor"] == pytest.approx(1000)  # 4 tensor cores x 256 FMA per clock
    assert res["s_math_pipe"] == pytest.approx(1000 - res["s_selected"])


def test_kll_is_the_papers_formula():
    assert (KLL_A, KLL_B, KLL_C) == (0.0036, 0.0366, 1.1891)
    g = gpu_spec("A100")
    for grid, block in [(1, 32), (1000, 256), (65536, 1024), (4096, 128)]:
        bs = block / 32
        s = KLL_A * bs**2 + KLL_B * bs + KLL_C
        assert kll_cycles(g, grid=grid, block=block) == pytest.approx(s * grid + g.kll_k_cycles)
    # 8 warps: s = 0.0036*64 + 0.0366*8 + 1.1891 = 1.7123 cycles per CTA
    assert kll_cycles(g, grid=1000, block=256) - g.kll_k_cycles == pytest.approx(1712.3)
    assert kll_cycles(g, grid=10, block=128, extra_kernels=1) == pytest.approx(
        10 * (KLL_A * 16 + KLL_B * 4 + KLL_C) + 2 * g.kll_k_cycles
    )


# -- kernels ---------------------------------------------------------------------------------
def test_kernel_lists():
    pre = prefill_kernels(LLAMA3_8B, tokens=1024)
    names = [k.name for k in pre]
    for n in ("rmsnorm_attn", "qkv_proj", "rope", "attn_score", "attn_softmax", "attn_value", "o_proj",
              "residual_attn", "rmsnorm_mlp", "gate_up_proj", "silu_mul", "down_proj", "residual_mlp",
              "final_norm", "lm_head"):
        assert n in names
    qkv = next(k for k in pre if k.name == "qkv_proj")
    assert (qkv.m, qkv.n, qkv.k, qkv.count) == (1024, (32 + 16) * 128, 4096, 32)
    assert next(k for k in pre if k.name == "lm_head").m == 1  # only the last prompt token
    dec = decode_kernels(LLAMA3_8B, batch=8, context=2048)
    score = next(k for k in dec if k.name == "attn_score")
    assert (score.m, score.n, score.k, score.batch) == (4, 2048, 128, 8 * 8)  # group of 4 folded in M
    assert next(k for k in dec if k.name == "lm_head").m == 8
    fused = decode_kernels(LLAMA3_8B, batch=8, context=2048, attention="fused")
    assert any(isinstance(k, FusedAttention) for k in fused)
    assert not any(k.name == "attn_softmax" for k in fused)
    assert not any(isinstance(k, AllReduce) for k in pre)


def test_tensor_parallel_shards_and_allreduces():
    s = shard(LLAMA3_8B, 4)
    assert (s.heads, s.kv_heads, s.intermediate, s.vocab) == (8, 2, 3584, 32064)
    assert shard(LLAMA3_8B, 16).kv_heads == 1  # fewer KV heads than GPUs: replicated
    ks = prefill_kernels(LLAMA3_8B, tokens=256, tp=4)
    ars = [k for k in ks if isinstance(k, AllReduce)]
    assert {k.name for k in ars} == {"allreduce_attn", "allreduce_mlp"}
    assert all(k.count == 32 and k.nbytes == 256 * 4096 * 2 for k in ars)  # two per layer
    with pytest.raises(UserError, match="heads"):
        prefill_kernels(LLAMA3_8B, tokens=256, tp=3)
    h = gpu_spec("H100")
    # ring: 2(tp-1)/tp of the bytes over 450 GB/s, 2(tp-1) steps of latency, one launch constant
    t = allreduce_seconds(h, nbytes=1e9, tp=4)
    assert t == pytest.approx(6 / 4 * 1e9 / 450e9 + 6 * h.link_hop_us * 1e-6 + h.kll_k_us * 1e-6)
    assert allreduce_seconds(h, nbytes=1e9, tp=1) == 0.0
    t1 = prefill_seconds(model=LLAMA3_8B, gpu="H100", tokens=512)
    t4 = prefill_seconds(model=LLAMA3_8B, gpu="H100", tokens=512, tp=4)
    assert t4 < t1


def test_bad_inputs_are_user_errors():
    with pytest.raises(UserError):
        prefill_kernels(LLAMA3_8B, tokens=0)
    with pytest.raises(UserError):
        decode_kernels(LLAMA3_8B, batch=1, context=16, attention="paged")
    with pytest.raises(UserError):
        estimate_unit(model=LLAMA3_8B, gpu="H100", tp=1, batch=1, buckets=[512, 256])


# -- per-kernel cost ----------------------------------------------------------------------------
def test_breakdown_terms_sum_to_cycles():
    df = breakdown(model=LLAMA3_8B, gpu="H100", batch=4, input_len=1000, tp=2)
    terms = ["s_selected", "divergence", "s_math_pipe", "s_noc", "s_dram", "s_long_scoreboard", "kll"]
    for col in ("grid", "block", "waves", "occupancy", "ctas_per_sm", "cycles", "us", "total_us", *terms):
        assert col in df.columns
    assert (df[terms].sum(axis=1) - df["cycles"]).abs().max() < 1e-6 * df["cycles"].max()
    assert ((df["total_us"] - df["us"] * df["count"]).abs() < 1e-9).all()
    assert (df["cycles"] > 0).all()
    clock = gpu_spec("H100").clock_hz
    assert ((df["us"] - df["cycles"] / clock * 1e6).abs() < 1e-9).all()
    pre = df[df["phase"] == "prefill"]["total_us"].sum() * 1e-6
    assert pre == pytest.approx(prefill_seconds(model=LLAMA3_8B, gpu="H100", tokens=1000, tp=2))
    assert set(df["step"]) == {"prefill tokens=1000", "decode batch=4 context=1001"}
    assert "allreduce_mlp" in set(df["name"])


def test_gemm_limits():
    """A big GEMM is compute (or L2) bound, a GEMV streams its weights from DRAM."""
    h = gpu_spec("H100")
    big = kernel_cost(Gemm("g", "prefill", m=4096, n=4096, k=4096), h)
    assert big.bound in ("s_math_pipe", "s_noc")
    assert big.tensor_cycles > big.dram_cycles
    gemv = kernel_cost(Gemm("g", "decode", m=1, n=14336 * 2, k=4096), h)
    assert gemv.bound == "s_dram"
    weights = 14336 * 2 * 4096 * 2
    assert gemv.us * 1e-6 >= weights / (h.dram_gbps * 1e9)  # never faster than the DRAM peak
    assert gemv.us * 1e-6 < 1.5 * weights / (h.dram_gbps * 1e9)


def test_more_tokens_never_cheaper_within_a_phase():
    for gpu in ("A100", "H100", "L4"):
        prev = 0.0
        for t in [*range(1, 130, 8), *range(130, 3000, 97)]:
            x = prefill_seconds(model=LLAMA3_8B, gpu=gpu, tokens=t)
            assert x >= prev, (gpu, t)
            prev = x
        prev = 0.0
        for b in range(1, 80, 6):
            x = decode_seconds(model=LLAMA3_8B, gpu=gpu, batch=b, context=1024)
            assert x >= prev, (gpu, b)
            prev = x
    h = gpu_spec("H200")
    for name, mk in (("gemm", lambda m: Gemm("g", "prefill", m=m, n=6144, k=4096)),
                     ("row", lambda m: RowOp("r", "prefill", "rmsnorm", rows=m, row_len=4096, vector_len=4096))):
        prev = 0.0
        for m in range(1, 700, 7):
            x = kernel_cost(mk(m), h).cycles
            assert x >= prev, (name, m)
            prev = x


@pytest.mark.parametrize("attention", ["eager", "fused"])
def test_larger_context_never_cheaper_decode(attention):
    for gpu in ("A100", "H200"):
        for batch in (1, 8, 64):
            prev = 0.0
            for c in [*range(1, 200, 7), *range(200, 6000, 113)]:
                x = decode_seconds(model=LLAMA3_8B, gpu=gpu, batch=batch, context=c, attention=attention)
                assert x >= prev, (gpu, batch, c)
                prev = x


def test_h100_prefill_2048_near_the_roofline():
    flops = sum(k.flops * k.count for k in prefill_kernels(LLAMA3_8B, tokens=2048) if k.kind != "comm")
    roofline = flops / (gpu_spec("H100").peak_tflops("bf16") * 1e12)
    t = prefill_seconds(model=LLAMA3_8B, gpu="H100", tokens=2048)
    assert roofline < t < 3 * roofline
    dec = decode_seconds(model=LLAMA3_8B, gpu="H100", batch=1, context=2048)
    weights = LLAMA3_8B.param_count() * 2 - LLAMA3_8B.vocab * LLAMA3_8B.hidden * 2  # embedding not read
    assert weights / 3350e9 < dec < 2 * weights / 3350e9


# -- the estimator ------------------------------------------------------------------------------
def test_estimate_unit_returns_estimate_profiles():
    buckets = [128, 512, 2048]
    out = estimate_unit(model=LLAMA3_8B, gpu="H200", tp=2, batch=8, buckets=buckets)
    assert list(out) == buckets
    for b, p in out.items():
        assert isinstance(p, BucketProfile)
        assert p.bucket == b and p.ttft_s > 0 and p.tbt_s > 0
        assert p.source == SOURCE == "estimate:amali"
        assert p.runner == "amali" and p.repeats == 0 and p.simulated is False
        # the raw fields satisfy the two-measurement identity
        assert (p.t2_s - p.t1_s) / (p.l2 - p.l1) == pytest.approx(p.tbt_s)
        assert p.t1_s - p.l1 * p.tbt_s == pytest.approx(p.ttft_s)
    ttft = [out[b].ttft_s for b in buckets]
    tbt = [out[b].tbt_s for b in buckets]
    assert ttft == sorted(ttft) and tbt == sorted(tbt)


def test_estimate_for_a_unit_uses_the_target():
    t = Target(name="t", runner="vllm", hardware="nvidia-h100", bucket_policy="inclusive", dtype="bfloat16",
               model=TINY)
    out = estimate_for(Unit(target=t, tp=2, batch=4), buckets=[64, 256])
    assert out[64].ttft_s == pytest.approx(
        prefill_seconds(model=TINY, gpu="H100", tp=2, tokens=64)
    )
    with pytest.raises(UserError, match="known GPUs"):
        estimate_for(Unit(target=Target(name="t", runner="sim", hardware="inf2", bucket_policy="inclusive",
                                         dtype="bf16", model=TINY), tp=1, batch=1), buckets=[64])


def test_request_seconds_composes_steps():
    r = request_seconds(model=TINY, gpu="L4", batch=2, input_len=100, output_len=5)
    steps = [decode_seconds(model=TINY, gpu="L4", batch=2, context=100 + t + 1) for t in range(5)]
    assert r["ttft_s"] == pytest.approx(prefill_seconds(model=TINY, gpu="L4", tokens=100))
    assert r["e2e_s"] == pytest.approx(r["ttft_s"] + sum(steps))
    assert r["tpot_s"] == pytest.approx(sum(steps) / 5)
    long = request_seconds(model=TINY, gpu="L4", batch=2, input_len=100, output_len=2000)
    assert long["e2e_s"] > r["e2e_s"]


# -- the CLI --------------------------------------------------------------------------------------
def _cli(monkeypatch, hardware="nvidia-h200", dtype="bf16"):
    import spaces

    target = Target(name="t", runner="vllm", hardware=hardware, bucket_policy="inclusive", dtype=dtype,
                    model=LLAMA3_8B)
    monkeypatch.setattr(spaces, "load_space", lambda path: types.SimpleNamespace(target=target), raising=False)
    from search import cmd_amali

    parser = argparse.ArgumentParser()
    cmd_amali.register(parser.add_subparsers())
    return parser


def test_cli_prints_a_labelled_kernel_table(monkeypatch, capsys):
    parser = _cli(monkeypatch)
    args = parser.parse_args(["amali", "space.toml", "--tp", "1", "--batch", "1", "--input-len", "512",
                              "--output-len", "16"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "estimate (AMALI analytical model), not a measurement" in out
    assert "H200-SXM" in out and "qkv_proj" in out and "attn_softmax" in out
    assert "TTFT" in out and "TPOT" in out and "E2E" in out
    assert "prefill step" in out and "decode step" in out


def test_cli_json(monkeypatch, capsys):
    parser = _cli(monkeypatch, hardware="inf2")
    args = parser.parse_args(["amali", "s.toml", "--tp", "2", "--batch", "4", "--input-len", "100",
                              "--output-len", "8", "--gpu", "A100", "--json"])
    assert args.func(args) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["label"] == LABEL and rep["gpu"]["name"] == "A100-SXM"
    assert rep["request"]["e2e_s"] > rep["request"]["ttft_s"] > 0
    assert any(k["name"] == "allreduce_attn" for k in rep["decode"]["kernels"])
    assert rep["prefill"]["total_us"] == pytest.approx(sum(k["total_us"] for k in rep["prefill"]["kernels"]))


def test_cli_unknown_hardware_without_gpu_flag(monkeypatch):
    parser = _cli(monkeypatch, hardware="inf2")
    args = parser.parse_args(["amali", "s.toml", "--input-len", "100", "--output-len", "8"])
    with pytest.raises(UserError) as exc:
        args.func(args)
    for name in known_gpus():
        assert name in str(exc.value)
    args = parser.parse_args(["amali", "s.toml", "--input-len", "100", "--output-len", "8", "--gpu", "B200"])
    with pytest.raises(UserError, match="H200-SXM"):
        args.func(args)


# -- the GPU validation script (its CPU parts) ------------------------------------------------
def _validate_module():
    path = ROOT / "benchmarks" / "gpu" / "amali_validate.py"
    spec = importlib.util.spec_from_file_location("amali_validate", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_validation_script_parses_and_needs_no_torch_to_import():
    path = ROOT / "benchmarks" / "gpu" / "amali_validate.py"
    tree = ast.parse(path.read_text())
    top_imports = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top_imports |= {n.module.split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
    assert "torch" not in top_imports
    mod = _validate_module()
    assert callable(mod.main)


def test_validation_case_list():
    mod = _validate_module()
    todo = mod.cases()
    kinds = {(c["phase"], c["kernel"].kind) for c in todo}
    assert kinds == {(p, k) for p in ("prefill", "decode") for k in ("gemm", "elementwise", "attention")}
    assert 40 <= len(todo) <= 150  # sized for one call of a few minutes
    keys = [mod._key(c["kernel"]) for c in todo]
    assert len(keys) == len(set(keys))  # each distinct kernel measured once
    # the three RMSNorms of a prefill step share one measurement, with all their uses
    norm = next(c for c in todo if c["case"] == "prefill T=128" and c["kernel"].op == "rmsnorm")
    assert sorted(n for _, n in norm["uses"]) == [1, 32, 32]
    # score and value share a shape at T=128 but are measured apart
    t128 = {c["kernel"].name for c in todo if c["case"] == "prefill T=128"}
    assert {"attn_score", "attn_value"} <= t128
    assert all(c["kernel"].kind != "comm" for c in todo)
    assert len(mod.cases(quick=True)) < len(todo)
    assert any(isinstance(c["kernel"], FusedAttention) for c in mod.cases(attention="fused"))


def test_validation_mape_aggregation():
    mod = _validate_module()
    rows = [
        {"kind": "gemm", "phase": "prefill", "predicted_us": 110.0, "measured_us": 100.0},  # 10%
        {"kind": "gemm", "phase": "decode", "predicted_us": 70.0, "measured_us": 100.0},  # 30%
        {"kind": "elementwise", "phase": "decode", "predicted_us": 5.0, "measured_us": 4.0},  # 25%
        {"kind": "attention", "phase": "prefill", "predicted_us": 1.0, "measured_us": None},  # unmeasured
        {"kind": "attention", "phase": "prefill", "predicted_us": 1.0, "measured_us": 0.0},  # invalid
    ]
    agg = mod.aggregate(rows)
    assert agg["overall"]["n"] == 3 and agg["overall"]["mape"] == pytest.approx((10 + 30 + 25) / 3)
    assert agg["gemm"]["mape"] == pytest.approx(20)
    assert agg["elementwise"]["mape"] == pytest.approx(25)
    assert agg["prefill"]["mape"] == pytest.approx(10) and agg["decode"]["mape"] == pytest.approx(27.5)
    assert agg["attention"]["n"] == 0 and math.isnan(agg["attention"]["mape"])
    text = mod.format_summary(agg)
    for figure in ("23.59", "17.84", "27.29", "15.56", "34.90"):
        assert figure in text
    assert mod.ape(90.0, 100.0) == pytest.approx(10.0)


def test_validation_step_errors_and_csv(tmp_path):
    mod = _validate_module()
    rows = [
        {"key": "a", "predicted_us": 10.0, "measured_us": 8.0},
        {"key": "b", "predicted_us": 1.0, "measured_us": 2.0},
        {"key": "c", "predicted_us": 1.0, "measured_us": None},
    ]
    uses = {"a": [("s1", 2), ("s2", 1)], "b": [("s1", 4)], "c": [("s2", 1)]}
    steps = mod.step_errors(rows, uses)
    assert set(steps) == {"s1"}  # s2 has an unmeasured kernel
    assert steps["s1"]["predicted_ms"] == pytest.approx(24e-3) and steps["s1"]["measured_ms"] == pytest.approx(24e-3)
    out = tmp_path / "x" / "v.csv"
    mod.write_csv(out, [{**r, "case": "s1", "extra": 1} for r in rows])
    lines = out.read_text().splitlines()
    assert lines[0].split(",") == list(mod.CSV_FIELDS) and len(lines) == 4
