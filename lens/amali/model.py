"""Per-kernel cycles, AMALI-style, from kernel shapes.

The paper (Cao et al., ISCA 2025) writes a kernel's cycles as

    C = S_I + S_IP + KLL + ID
    S_I  = S_selected + S_wait + S_short_scoreboard + S_long_scoreboard   (interval stalls)
    S_IP = S_math_pipe + S_lg + S_mio,  S_mio = S_MSHR + S_NoC + S_DRAM  (throttle stalls)
    KLL  = s * GridSize + k,  s = a * BS^2 + b * BS + c                   (kernel launch)
    ID   = (max sub-core instructions - representative sub-core's) / IssueRate

for one representative warp, repeated over the waves of CTAs an SM runs. This module
computes the same terms from the kernel's *shape* (``kernels.py``):

1. **Launch configuration.** A GEMM's grid and block come from its tiling (BM x BN x BK
   tiles, warps per CTA, pipeline stages, split-K); an element-wise kernel runs one CTA
   per row; fused attention tiles queries (prefill) or splits the KV sequence (decode).
   Registers and shared memory follow from the tile, and give CTAs per SM and occupancy
   as the minimum of the warp, CTA, register and shared-memory limits (``occupancy``).
2. **Waves.** ``grid`` CTAs run in ``floor(grid / (SMs * CTAs per SM))`` full waves plus
   a partial last wave with ``ceil(remainder / SMs)`` CTAs on its busiest SM (``waves``).
3. **Per-wave terms** of the busiest SM, for ``n`` co-resident CTAs:
   - ``S_selected``: issued warp instructions per sub-core at one per clock, with the
     instruction count of a warp *derived from the tiling* (HMMA.16816-equivalent MMAs,
     ldmatrix, cp.async, loop and epilogue instructions; loads, conversions, arithmetic
     and shuffles per element for element-wise kernels);
   - ``ID``: the sub-core imbalance when the warps of the SM do not split evenly over
     the four sub-cores (the only divergence a shape reveals);
   - tensor pipe: FMAs / (tensor-core FMA per clock per SM), i.e. the issue interval
     ``II_TC = FMA_count / TP_dt`` of each MMA summed over the warps sharing the SM; FP32
     and special-function pipes likewise from their per-clock throughput;
   - L2 -> SM traffic over the SM's share of L2 bandwidth (``S_NoC``), capped per SM;
   - the dependent-latency path of one CTA (memory round trips not covered by pipeline
     stages, reduction latency), the shape-based stand-in for ``S_long_scoreboard``.
   The wave takes ``S_selected + ID`` plus the stall by which the binding throttle or
   latency term exceeds issue, plus the prologue/epilogue latency of its CTAs.
4. **DRAM** (``S_DRAM``): the kernel's DRAM bytes over DRAM bandwidth, compared once with
   the sum of the waves (DRAM is shared by all SMs and streams across waves as CTAs are
   dispatched); ``S_DRAM`` is the excess, if any. Comparing per wave instead would let
   bytes hide in a latency-bound last wave, making a larger kernel predict faster.
5. **KLL** with the paper's fitted ``a, b, c`` and ``BS`` in warps per CTA, plus ``k`` per
   helper kernel (split-K or split-KV reduction); the last stores' trip to L2 is added
   once per kernel.

Each term is kept so a breakdown can show where the cycles go; the attributed columns
(``s_selected, divergence, s_math_pipe, s_noc, s_dram, s_long_scoreboard, kll``) sum to
the kernel's cycles.

Where this departs from the paper:
- no SASS traces: instruction counts come from the tiling and element counts above,
  not from NVBit; no cache simulation: every operand is read from DRAM once per kernel
  (perfect L2 reuse across tiles, cold L2 at kernel start) and re-read from L2 per tile;
- the kernel a library would pick is not observable without traces: GEMMs and fused
  attention take the candidate tiling (and split-K / split-KV) this model predicts
  fastest, i.e. a well-tuned library is assumed; element-wise kernels use one CTA per row
  with 16-byte vector accesses;
- stalls overlap as a maximum of per-wave throughput and latency terms (a roofline per
  wave) instead of the paper's per-warp interval sums; S_wait, S_short_scoreboard, S_lg
  and S_MSHR have no shape-based counterpart and are folded into those terms (a fused
  attention kernel adds its tensor, FP32 and special-function times, which depend on
  one another in series);
- the instruction mix per tile or element (e.g. one ldmatrix per two MMAs, about 8
  loop instructions per k-tile, 4-7 FP32 instructions per element) is the model's own
  estimate of compiled code, written down in this file, not read from a binary;
- ``BS`` of the KLL fit is read as warps per CTA (in threads the fitted quadratic would
  give thousands of cycles per CTA); the intercept ``k`` is not in the project's reading
  of the paper and is a per-GPU spec field (``kll_k_us``); the A100-fitted ``a, b, c``
  are used on every GPU;
- bandwidths are the spec-sheet peaks; real kernels reach somewhat less, so memory-bound
  kernels tend to be predicted a little fast.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

from ..errors import UserError
from .kernels import ROW_OPS, AllReduce, FusedAttention, Gemm, Kernel, RowOp, act_bytes, gemm_bytes
from .specs import GpuSpec, canonical_dtype

#: the paper's KLL fit on A100: s = a * BS^2 + b * BS + c cycles per CTA (the AMALI paper)
KLL_A, KLL_B, KLL_C = 0.0036, 0.0366, 1.1891
#: warp instructions issued per clock by one sub-core's scheduler
ISSUE_RATE = 1.0
#: FMA of one HMMA.16816 warp instruction (m16 n8 k16), the MMA granularity counted
HMMA_FMA = 16 * 8 * 16
WARP = 32
#: dependent latency of a warp shuffle or barrier step, cycles (folded into smem latency)
_BARRIER = 20
#: FP32 dependent-issue latency, cycles
_FP32_LAT = 4
#: special-function (MUFU) latency, cycles
_SFU_LAT = 20

#: GEMM tiles (BM, BN, warps per CTA, stages) tried for every GEMM; BK is 128 bytes of K
GEMM_TILES: tuple[tuple[int, int, int, int], ...] = (
    (256, 128, 8, 3),
    (128, 256, 8, 3),
    (128, 128, 4, 4),
    (128, 64, 4, 4),
    (64, 128, 4, 4),
    (64, 64, 4, 4),
    # skinny tiles for few rows (decode GEMVs): one m16 MMA row block per warp
    (32, 128, 4, 4),
    (16, 128, 4, 4),
    (16, 64, 4, 4),
)
SPLIT_K = (1, 2, 4, 8, 16)
SPLIT_KV = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class LaunchConfig:
    grid: int
    block: int  # threads per CTA
    regs: int  # registers per thread
    smem: int  # bytes of shared memory per CTA
    tile: str = ""
    #: helper kernels launched with it (split-K / split-KV reduction), each costing k
    extra_kernels: int = 0


@dataclass(frozen=True)
class CtaWork:
    """What one (representative) CTA does."""

    instr_per_warp: float
    tc_fma: float = 0.0
    fp32_warp_instr: float = 0.0
    sfu_warp_instr: float = 0.0
    l2_bytes: float = 0.0
    #: dependent-latency path of one CTA's main part, alone on an SM (cycles)
    latency: float = 0.0
    #: prologue + epilogue latency every wave pays on top (cycles)
    fill: float = 0.0
    #: the tensor, FP32 and special-function work depend on one another in series (a fused
    #: attention's softmax sits between its two MMAs), so their pipe times add up
    serial_math: bool = False


@dataclass(frozen=True)
class Occupancy:
    ctas_per_sm: int
    occupancy: float  # resident warps / max warps per SM
    limiter: str  # "warps" | "ctas" | "regs" | "smem"


@dataclass(frozen=True)
class Wave:
    n: int  # CTAs on the busiest SM
    active_sms: int
    ctas: int  # CTAs in the wave (all SMs)
    repeat: int  # identical waves


@dataclass(frozen=True)
class KernelCost:
    """The predicted cycles of one kernel launch, with every term (cycles unless noted)."""

    name: str
    phase: str
    kind: str
    op: str
    shape: str
    count: int
    tile: str
    grid: int
    block: int
    regs: int
    smem: int
    ctas_per_sm: int
    occupancy: float
    limiter: str
    waves: float
    full_waves: int
    last_wave_ctas_per_sm: int
    # attributed terms: they sum to ``cycles``
    s_selected: float
    divergence: float
    s_math_pipe: float
    s_noc: float
    s_dram: float
    s_long_scoreboard: float
    kll: float
    # raw demands, before overlap
    issue_cycles: float
    tensor_cycles: float
    fp32_cycles: float
    sfu_cycles: float
    l2_cycles: float
    dram_cycles: float
    latency_cycles: float
    fill_cycles: float
    cycles: float
    us: float
    flops: float
    dram_bytes: float
    bound: str  # the term that dominates the kernel

    @property
    def total_us(self) -> float:
        return self.us * self.count


# -- occupancy, waves, launch ----------------------------------------------------------------
def occupancy(spec: GpuSpec, *, block: int, regs: int, smem: int) -> Occupancy:
    """CTAs per SM and occupancy: the minimum of the warp, CTA, register and smem limits.

    Registers are allocated per warp in units of 256 (8 per thread); each CTA also
    reserves 1 KiB of shared memory (cc 8.x/9.x). Raises ``ValueError`` for a CTA that
    cannot launch at all.
    """
    if block < 1 or block > 1024:
        raise ValueError(f"block of {block} threads cannot launch")
    if regs > spec.max_regs_per_thread:
        raise ValueError(f"{regs} registers per thread exceed {spec.max_regs_per_thread}")
    if smem > spec.smem_per_cta_kib * 1024:
        raise ValueError(f"{smem} bytes of shared memory exceed the per-CTA limit")
    warps = -(-block // WARP)
    limits = {
        "warps": spec.max_warps_per_sm // warps,
        "ctas": spec.max_ctas_per_sm,
    }
    regs_per_warp = -(-max(regs, 1) * WARP // 256) * 256
    limits["regs"] = spec.regs_per_sm // (regs_per_warp * warps)
    if smem > 0:
        limits["smem"] = (spec.smem_per_sm_kib * 1024) // (smem + 1024)
    limiter = min(limits, key=lambda k: (limits[k], list(limits).index(k)))
    c = limits[limiter]
    if c < 1:
        raise ValueError(f"CTA does not fit an SM (limited by {limiter})")
    return Occupancy(c, c * warps / spec.max_warps_per_sm, limiter)


def waves(grid: int, sms: int, ctas_per_sm: int) -> list[Wave]:
    """Full waves plus a partial last wave (its busiest SM holds ceil(rest / SMs) CTAs)."""
    if grid < 1:
        return []
    slots = sms * ctas_per_sm
    full, rest = divmod(grid, slots)
    out = []
    if full:
        out.append(Wave(ctas_per_sm, sms, slots, full))
    if rest:
        out.append(Wave(-(-rest // sms), min(rest, sms), rest, 1))
    return out


def kll_cycles(spec: GpuSpec, *, grid: int, block: int, extra_kernels: int = 0) -> float:
    """KLL = s * GridSize + k with s = a * BS^2 + b * BS + c, BS in warps per CTA."""
    bs = block / WARP
    s = KLL_A * bs * bs + KLL_B * bs + KLL_C
    return s * grid + spec.kll_k_cycles * (1 + extra_kernels)


# -- the per-wave interval model ----------------------------------------------------------------
_TERMS = ("s_math_pipe", "s_noc", "s_dram", "s_long_scoreboard")
_WAVE_TERMS = ("s_math_pipe", "s_noc", "s_long_scoreboard")


def simulate(spec: GpuSpec, cfg: LaunchConfig, work: CtaWork, *, dram_bytes: float, dtype: str | None) -> dict:
    """Cycles of one launch: per-wave terms, their attribution, DRAM, KLL and the final drain.

    Per wave (busiest SM): ``issue + ID`` plus the stall by which the largest of the
    math-pipe, L2 (NoC) and latency terms exceeds it, plus the wave's prologue/epilogue.
    DRAM is one shared resource whose traffic streams across waves (CTAs are dispatched
    as slots free up), so it is compared once, for the whole kernel, with the SM side:
    ``S_DRAM`` is the time by which the kernel's DRAM transfer exceeds the waves' total.
    """
    occ = occupancy(spec, block=cfg.block, regs=cfg.regs, smem=cfg.smem)
    warps = -(-cfg.block // WARP)
    tc_rate = spec.tc_fma_per_sm(dtype) if (dtype and work.tc_fma) else 1.0
    fp32_rate = spec.fp32_lanes_per_sm / WARP  # warp instructions per clock per SM
    sfu_rate = spec.sfu_per_sm_per_clk / WARP
    acc = dict.fromkeys(
        ("s_selected", "divergence", *_TERMS, "issue", "tensor", "fp32", "sfu", "l2", "dram", "lat", "fill"), 0.0
    )
    wl = waves(cfg.grid, spec.sms, occ.ctas_per_sm)
    for w in wl:
        warps_sm = w.n * warps
        mean = warps_sm / spec.subcores_per_sm
        issue = mean * work.instr_per_warp / ISSUE_RATE
        div = (math.ceil(mean) - mean) * work.instr_per_warp / ISSUE_RATE
        tensor = w.n * work.tc_fma / tc_rate
        fp32 = w.n * work.fp32_warp_instr / fp32_rate
        sfu = w.n * work.sfu_warp_instr / sfu_rate
        l2_share = min(spec.sm_l2_bytes_per_clk, spec.l2_bytes_per_clk / w.active_sms)
        l2 = w.n * work.l2_bytes / l2_share
        math_pipe = tensor + fp32 + sfu if work.serial_math else max(tensor, fp32, sfu)
        demand = {"s_math_pipe": math_pipe, "s_noc": l2, "s_long_scoreboard": work.latency}
        base = issue + div
        bind = max(_WAVE_TERMS, key=lambda k: demand[k])
        stall = max(0.0, demand[bind] - base)
        r = w.repeat
        acc["s_selected"] += r * issue
        acc["divergence"] += r * div
        acc[bind] += r * stall
        for k, v in (("issue", issue), ("tensor", tensor), ("fp32", fp32), ("sfu", sfu), ("l2", l2),
                     ("lat", work.latency), ("fill", work.fill)):
            acc[k] += r * v
    sm_side = acc["s_selected"] + acc["divergence"] + sum(acc[k] for k in _WAVE_TERMS)
    acc["dram"] = dram_bytes / spec.dram_bytes_per_clk
    acc["s_dram"] = max(0.0, acc["dram"] - sm_side)
    # prologue/epilogue of every wave, and the last stores reaching L2 before the kernel retires
    acc["s_long_scoreboard"] += acc["fill"] + spec.l2_latency
    acc["kll"] = kll_cycles(spec, grid=cfg.grid, block=cfg.block, extra_kernels=cfg.extra_kernels)
    acc["cycles"] = sum(acc[k] for k in ("s_selected", "divergence", *_TERMS, "kll"))
    acc["occ"] = occ
    acc["waves"] = wl
    return acc


# -- GEMM ----------------------------------------------------------------------------------
def _gemm_candidate(spec: GpuSpec, g: Gemm, bm: int, bn: int, warps: int, stages: int, sk: int):
    e = gemm_bytes(g.dtype)
    bk = 128 // e
    kc = -(-g.k // sk)
    if sk > 1 and kc < 2 * bk:
        return None
    k_iters = -(-kc // bk)
    while stages > 2 and stages * (bm + bn) * bk * e > spec.smem_per_cta_kib * 1024:
        stages -= 1
    smem = stages * (bm + bn) * bk * e
    if smem > spec.smem_per_cta_kib * 1024:
        return None
    threads = warps * WARP
    acc_per_thread = bm * bn // threads
    regs = min(spec.max_regs_per_thread, acc_per_thread + 64)
    grid = -(-g.m // bm) * -(-g.n // bn) * sk * g.batch
    rows, cols = min(g.m, bm), min(g.n, bn)
    tc_fma = float(bm * bn * k_iters * bk)
    mma = tc_fma / warps / HMMA_FMA
    ldg = (bm + bn) * bk * e / (threads * 16)  # 16-byte cp.async per thread per k tile
    epi = acc_per_thread * 0.75 + (acc_per_thread * 0.5 if sk > 1 else 0.0)
    instr = mma + mma / 2 + k_iters * (ldg + 8) + epi + 40
    ce = act_bytes(g.dtype)  # C is written in the activation type
    l2 = (rows + cols) * kc * e + rows * cols * ce + (rows * cols * 4 * 2 if sk > 1 else 0)
    ii_tc = HMMA_FMA / spec.tc_fma(g.dtype)
    t_k = max(mma / k_iters * ii_tc, spec.mem_latency / (stages - 1))
    fill = spec.mem_latency + spec.l2_latency + (2 * spec.l2_latency if sk > 1 else 0)
    work = CtaWork(instr_per_warp=instr, tc_fma=tc_fma, l2_bytes=l2, latency=k_iters * t_k, fill=fill)
    dram = g.batch * ((g.m * g.k + g.k * g.n) * e + g.m * g.n * ce)
    tile = f"{bm}x{bn}x{bk} w{warps} s{stages}" + (f" splitK{sk}" if sk > 1 else "")
    cfg = LaunchConfig(grid=grid, block=threads, regs=regs, smem=smem, tile=tile, extra_kernels=int(sk > 1))
    return cfg, work, float(dram)


def _gemm(spec: GpuSpec, g: Gemm):
    best = None
    for bm, bn, warps, stages in GEMM_TILES:
        for sk in SPLIT_K:
            cand = _gemm_candidate(spec, g, bm, bn, warps, stages, sk)
            if cand is None:
                continue
            cfg, work, dram = cand
            try:
                res = simulate(spec, cfg, work, dram_bytes=dram, dtype=g.dtype)
            except ValueError:
                continue
            if best is None or res["cycles"] < best[3]["cycles"]:
                best = (cfg, work, dram, res)
    if best is None:
        raise UserError(f"{g.name}: no GEMM tiling fits {spec.name}")
    return best


# -- element-wise rows ----------------------------------------------------------------------
def _rowop(spec: GpuSpec, r: RowOp):
    kind = ROW_OPS[r.op]
    e = r.elem_bytes
    vec = 16 // e
    n_vec = -(-r.row_len // vec)
    threads = min(1024, max(WARP, -(-n_vec // WARP) * WARP))
    warps = threads // WARP
    ept = -(-r.row_len // threads)
    vloads = -(-ept // vec)
    # a reduction row too long to keep in registers is read twice (the second time from L2)
    passes = 2 if (kind.reductions and ept > 32) else 1
    extra_loads = -(-r.extra_row_bytes // (threads * 16)) if r.extra_row_bytes else 0
    weight_loads = -(-(r.vector_len * e) // (threads * 16)) if r.vector_len else 0
    instr = (
        kind.inputs * vloads * passes
        + kind.outputs * vloads
        + ept * (kind.fp32_ops + kind.sfu_ops)
        + kind.reductions * 12  # 5 shuffles + 5 ops + shared-memory exchange + barrier
        + extra_loads
        + weight_loads
        + 24  # indexing and parameter loads
    )
    row_bytes = r.row_len * e * (kind.inputs + kind.outputs) + r.extra_row_bytes
    l2 = row_bytes + (passes - 1) * r.row_len * e * kind.inputs + r.vector_len * e
    red_lat = 7 * spec.smem_latency + 2 * _BARRIER
    latency = (
        spec.mem_latency
        + (passes - 1) * spec.l2_latency
        + kind.reductions * red_lat
        + kind.fp32_ops * _FP32_LAT
        + kind.sfu_ops * _SFU_LAT
    )
    work = CtaWork(
        instr_per_warp=float(instr),
        fp32_warp_instr=float(warps * ept * kind.fp32_ops),
        sfu_warp_instr=float(warps * ept * kind.sfu_ops),
        l2_bytes=float(l2),
        latency=float(latency),
    )
    regs = min(spec.max_regs_per_thread, 24 + min(ept, 32) * kind.inputs)
    cfg = LaunchConfig(grid=r.rows, block=threads, regs=regs, smem=WARP * 4 * kind.reductions,
                       tile=f"row/CTA vec{vec}")
    dram = float(r.rows * row_bytes + r.vector_len * e)
    return cfg, work, dram, simulate(spec, cfg, work, dram_bytes=dram, dtype=None)


# -- fused attention ------------------------------------------------------------------------
def _attn_prefill(spec: GpuSpec, a: FusedAttention):
    e = gemm_bytes(a.dtype)
    bm, bn, warps, stages = 128, 64, 4, 2
    d = a.head_dim
    kv = max(bn, -(-math.ceil(a.kv_eff) // bn) * bn)
    kv_iters = kv // bn
    rows = min(a.q_len, bm)
    tc_fma = float(2 * bm * kv * d)
    mma = tc_fma / warps / HMMA_FMA
    fp32 = bm * kv * 6 / WARP
    sfu = bm * kv / WARP
    threads = warps * WARP
    ldg = 2 * bn * d * e / (threads * 16)
    instr = mma * 1.5 + (fp32 + sfu) / warps + kv_iters * (ldg + 10) + 100
    ii_tc = HMMA_FMA / spec.tc_fma(a.dtype)
    t_k = max(mma / kv_iters * ii_tc + 6 * _FP32_LAT + _SFU_LAT, spec.mem_latency / (stages - 1))
    work = CtaWork(
        instr_per_warp=instr, tc_fma=tc_fma, fp32_warp_instr=fp32, sfu_warp_instr=sfu,
        l2_bytes=float((2 * rows * d + 2 * kv * d) * e), latency=kv_iters * t_k,
        fill=spec.mem_latency + spec.l2_latency, serial_math=True,
    )
    smem = (bm * d + 2 * stages * bn * d) * e
    cfg = LaunchConfig(grid=-(-a.q_len // bm) * a.heads * a.batch, block=threads, regs=255, smem=smem,
                       tile=f"q{bm} kv{bn} w{warps}")
    dram = float(a.batch * (2 * a.q_len * a.heads * d + 2 * a.kv_len * a.kv_heads * d) * e)
    return cfg, work, dram, simulate(spec, cfg, work, dram_bytes=dram, dtype=a.dtype)


def _attn_decode(spec: GpuSpec, a: FusedAttention):
    e = gemm_bytes(a.dtype)
    bn, warps, stages = 64, 4, 2
    d = a.head_dim
    group = a.heads // a.kv_heads
    rows = group * a.q_len
    rows_pad = max(16, -(-rows // 16) * 16)
    threads = warps * WARP
    best = None
    for s in SPLIT_KV:
        chunk = -(-a.kv_len // s)
        if s > 1 and chunk < bn:
            break
        kv_iters = -(-chunk // bn)
        tc_fma = float(2 * rows_pad * kv_iters * bn * d)
        mma = tc_fma / warps / HMMA_FMA
        fp32 = rows * chunk * 6 / WARP
        sfu = rows * chunk / WARP
        ldg = 2 * bn * d * e / (threads * 16)
        instr = mma * 1.5 + (fp32 + sfu) / warps + kv_iters * (ldg + 10) + 80
        ii_tc = HMMA_FMA / spec.tc_fma(a.dtype)
        t_k = max(mma / kv_iters * ii_tc + 6 * _FP32_LAT + _SFU_LAT, spec.mem_latency / (stages - 1))
        fill = spec.mem_latency + spec.l2_latency + (2 * spec.l2_latency if s > 1 else 0)
        work = CtaWork(
            instr_per_warp=instr, tc_fma=tc_fma, fp32_warp_instr=fp32, sfu_warp_instr=sfu,
            l2_bytes=float((2 * chunk * d + 2 * rows * d) * e + (rows * d * 4 * 2 if s > 1 else 0)),
            latency=kv_iters * t_k, fill=fill, serial_math=True,
        )
        smem = (rows_pad * d + 2 * stages * bn * d) * e
        cfg = LaunchConfig(grid=a.batch * a.kv_heads * s, block=threads, regs=128, smem=smem,
                           tile=f"splitKV{s} kv{bn} w{warps}", extra_kernels=int(s > 1))
        dram = float(a.batch * (2 * a.kv_len * a.kv_heads * d + 2 * a.q_len * a.heads * d) * e)
        res = simulate(spec, cfg, work, dram_bytes=dram, dtype=a.dtype)
        if best is None or res["cycles"] < best[3]["cycles"]:
            best = (cfg, work, dram, res)
    return best


# -- collectives ----------------------------------------------------------------------------
def allreduce_seconds(spec: GpuSpec, *, nbytes: float, tp: int) -> float:
    """Ring all-reduce: 2(tp-1)/tp of the bytes over one link direction, 2(tp-1) steps of latency.

    Two all-reduces per layer (after the attention output and after the MLP down
    projection, Megatron-style), each over ``tokens * hidden * 2`` bytes, plus the
    collective kernel's own launch constant ``k``.
    """
    if tp <= 1:
        return 0.0
    steps = 2 * (tp - 1)
    bw = spec.link_gbps_per_dir * 1e9
    return steps / tp * nbytes / bw + steps * spec.link_hop_us * 1e-6 + spec.kll_k_us * 1e-6


# -- public ---------------------------------------------------------------------------------
def _cost(kernel: Kernel, spec: GpuSpec, cfg: LaunchConfig | None, res: dict | None, dram: float,
          comm_s: float = 0.0) -> KernelCost:
    clock = spec.clock_hz
    if res is None:  # a collective: no grid, its time is all link time
        cyc = comm_s * clock
        z = 0.0
        return KernelCost(
            name=kernel.name, phase=kernel.phase, kind=kernel.kind, op=kernel.op, shape=kernel.shape(),
            count=kernel.count, tile="ring", grid=0, block=0, regs=0, smem=0, ctas_per_sm=0, occupancy=0.0,
            limiter="", waves=0.0, full_waves=0, last_wave_ctas_per_sm=0,
            s_selected=z, divergence=z, s_math_pipe=z, s_noc=cyc, s_dram=z, s_long_scoreboard=z, kll=z,
            issue_cycles=z, tensor_cycles=z, fp32_cycles=z, sfu_cycles=z, l2_cycles=z, dram_cycles=z,
            latency_cycles=z, fill_cycles=z, cycles=cyc, us=comm_s * 1e6, flops=0.0, dram_bytes=0.0,
            bound="link",
        )
    occ: Occupancy = res["occ"]
    wl: list[Wave] = res["waves"]
    full = sum(w.repeat for w in wl if w.n == occ.ctas_per_sm and w.active_sms == spec.sms)
    last = wl[-1].n if wl and (wl[-1].n != occ.ctas_per_sm or wl[-1].active_sms != spec.sms) else 0
    attributed = {k: res[k] for k in ("s_selected", "divergence", *_TERMS, "kll")}
    bound = max(attributed, key=lambda k: attributed[k])
    return KernelCost(
        name=kernel.name, phase=kernel.phase, kind=kernel.kind, op=kernel.op, shape=kernel.shape(),
        count=kernel.count, tile=cfg.tile, grid=cfg.grid, block=cfg.block, regs=cfg.regs, smem=cfg.smem,
        ctas_per_sm=occ.ctas_per_sm, occupancy=occ.occupancy, limiter=occ.limiter,
        waves=cfg.grid / (spec.sms * occ.ctas_per_sm), full_waves=full, last_wave_ctas_per_sm=last,
        s_selected=res["s_selected"], divergence=res["divergence"], s_math_pipe=res["s_math_pipe"],
        s_noc=res["s_noc"], s_dram=res["s_dram"], s_long_scoreboard=res["s_long_scoreboard"], kll=res["kll"],
        issue_cycles=res["issue"], tensor_cycles=res["tensor"], fp32_cycles=res["fp32"], sfu_cycles=res["sfu"],
        l2_cycles=res["l2"], dram_cycles=res["dram"], latency_cycles=res["lat"], fill_cycles=res["fill"],
        cycles=res["cycles"], us=res["cycles"] / clock * 1e6, flops=float(kernel.flops), dram_bytes=dram,
        bound=bound,
    )


@lru_cache(maxsize=65536)
def kernel_cost(kernel: Kernel, spec: GpuSpec) -> KernelCost:
    """Predicted cycles and every term of one launch of ``kernel`` on ``spec``."""
    if isinstance(kernel, Gemm):
        canonical_dtype(kernel.dtype)
        spec.tc_fma(kernel.dtype)
        cfg, work, dram, res = _gemm(spec, kernel)
    elif isinstance(kernel, RowOp):
        cfg, work, dram, res = _rowop(spec, kernel)
    elif isinstance(kernel, FusedAttention):
        spec.tc_fma(kernel.dtype)
        if kernel.causal or kernel.q_len > 16:
            cfg, work, dram, res = _attn_prefill(spec, kernel)
        else:
            cfg, work, dram, res = _attn_decode(spec, kernel)
    elif isinstance(kernel, AllReduce):
        return _cost(kernel, spec, None, None, 0.0, allreduce_seconds(spec, nbytes=kernel.nbytes, tp=kernel.tp))
    else:  # pragma: no cover - kernels.py defines the closed set
        raise TypeError(f"not a kernel: {kernel!r}")
    return _cost(kernel, spec, cfg, res, dram)


def step_costs(kernels: Iterable[Kernel], spec: GpuSpec) -> list[KernelCost]:
    return [kernel_cost(k, spec) for k in kernels]


def step_seconds(kernels: Sequence[Kernel], spec: GpuSpec) -> float:
    """Sum over the step's kernels of one launch's time times its count."""
    return sum(c.us * c.count for c in step_costs(kernels, spec)) * 1e-6
