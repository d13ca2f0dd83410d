#!/usr/bin/env python3
"""Validate the AMALI kernel model (lens.amali) against torch kernels on a real GPU.

For a Llama-3-8B-shaped model with random weights (tp=1), this script takes the kernel
list of prefill steps (one request of several lengths) and decode steps (several batch
sizes and KV contexts) from ``lens.amali.kernels``, runs each distinct kernel with torch
on the GPU, and compares the measured time with the model's prediction for ``--gpu``:

- GEMMs: ``F.linear`` (weight [N, K]) and ``torch.bmm`` (attention score and value) -- cuBLAS;
- element-wise: residual add and softmax in eager torch (one kernel each); RMSNorm, RoPE
  and SiLU*mul through ``torch.compile`` so each is ONE fused kernel as the model assumes;
- fused attention (``--attention fused``): ``F.scaled_dot_product_attention``.

Timing: CUDA events around a CUDA graph that replays ``reps`` back-to-back launches,
after warm-up; the median over ``--iters`` replays, divided by ``reps``. Inputs rotate
over enough copies (each launch of a replay uses the next one) that the working set
exceeds the L2 cache, so every launch starts with a cold L2 as the model assumes (and as Nsight Compute's cache flush does in the
paper). Where the graph capture fails, a plain loop of launches is timed instead (the
``method`` column says which). With ``--profile`` (default) one launch of each kernel is
traced to count the GPU kernels it really ran (``n_kernels``; 1 expected).

Output: the kernel MAPE by kind (GEMM, element-wise, attention) and by phase (prefill,
decode) beside the paper's figures, the error of whole steps, and a CSV with one row per
kernel (to ``$OUT/amali_validate.csv``, or the path given with ``--out``).

Run on the GPU machine from the repository root:

    python3 benchmarks/gpu/amali_validate.py --gpu H200            # about 3-5 minutes on an H200
    python3 benchmarks/gpu/amali_validate.py --gpu H200 --quick    # a smaller case list

Only ``main`` imports torch; the case list and the aggregation are plain Python and are
unit-tested on machines without a GPU.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lens.amali import decode_kernels, gpu_spec, kernel_cost, prefill_kernels  # noqa: E402
from lens.amali.kernels import FusedAttention, Gemm, RowOp  # noqa: E402
from lens.types import ModelShape  # noqa: E402

LLAMA3_8B = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=128256)

#: the paper's kernel MAPE on A100 (Llama3-8B and a 15B variant), percent; None: not reported
PAPER_MAPE: dict[str, float | None] = {
    "overall": 23.59,
    "gemm": 17.84,
    "elementwise": 27.29,
    "attention": None,
    "prefill": 15.56,
    "decode": 34.90,
}
GROUPS = ("overall", "gemm", "elementwise", "attention", "prefill", "decode")

PREFILL_TOKENS = (128, 512, 2048, 4096)
DECODE_POINTS = ((1, 512), (1, 4096), (8, 2048), (32, 1024), (64, 4096))
QUICK_PREFILL_TOKENS = (512, 2048)
QUICK_DECODE_POINTS = ((1, 2048), (32, 2048))

CSV_FIELDS = (
    "case", "phase", "name", "kind", "op", "shape", "count", "tile", "grid", "block", "predicted_us",
    "measured_us", "measured_min_us", "ape_pct", "n_kernels", "method", "reps", "copies", "error",
)


# -- the case list (no torch) ---------------------------------------------------------------
def _key(kernel) -> Any:
    """Kernels of the same op and shape are measured once (e.g. the three RMSNorms of a step).

    GEMMs keep their name: the attention score and value products can share a shape but
    not a layout.
    """
    group = kernel.op if isinstance(kernel, RowOp) else kernel.name
    return (group, replace(kernel, name="", count=1))


def cases(
    *,
    model: ModelShape = LLAMA3_8B,
    quick: bool = False,
    attention: str = "eager",
    prefill_tokens: Sequence[int] | None = None,
    decode_points: Sequence[tuple[int, int]] | None = None,
) -> list[dict[str, Any]]:
    """Distinct kernels of the prefill and decode steps to measure, each with its step's label.

    Returns one dict per distinct kernel: ``case`` (step label), ``phase``, ``kernel`` (the
    ``lens.amali.kernels`` value) and ``uses``: every (case, count) where that shape occurs,
    so step totals can be rebuilt from per-kernel times.
    """
    pre = prefill_tokens or (QUICK_PREFILL_TOKENS if quick else PREFILL_TOKENS)
    dec = decode_points or (QUICK_DECODE_POINTS if quick else DECODE_POINTS)
    steps: list[tuple[str, tuple]] = []
    for t in pre:
        steps.append((f"prefill T={t}", prefill_kernels(model, tokens=t, attention=attention)))
    for b, c in dec:
        steps.append((f"decode B={b} C={c}", decode_kernels(model, batch=b, context=c, attention=attention)))
    seen: dict[Any, dict[str, Any]] = {}
    for label, ks in steps:
        for k in ks:
            if k.kind == "comm":
                continue
            key = _key(k)
            if key not in seen:
                seen[key] = {"case": label, "phase": k.phase, "kernel": k, "uses": []}
            seen[key]["uses"].append((label, k.count))
    return list(seen.values())


# -- aggregation (no torch) ------------------------------------------------------------------
def ape(predicted: float, measured: float) -> float:
    """Absolute percentage error of a prediction against a measurement."""
    return abs(predicted - measured) / measured * 100.0


def aggregate(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Kernel MAPE overall, by kind and by phase: ``{group: {"mape": %, "n": count}}``.

    Rows need ``predicted_us``, ``measured_us`` (> 0; others are skipped), ``kind`` and
    ``phase``. Groups with no rows get ``mape = nan``.
    """
    buckets: dict[str, list[float]] = {g: [] for g in GROUPS}
    for r in rows:
        m = r.get("measured_us")
        p = r.get("predicted_us")
        if m is None or p is None or not (isinstance(m, (int, float)) and m > 0 and math.isfinite(m)):
            continue
        e = ape(float(p), float(m))
        buckets["overall"].append(e)
        if r.get("kind") in buckets:
            buckets[r["kind"]].append(e)
        if r.get("phase") in buckets:
            buckets[r["phase"]].append(e)
    return {g: {"mape": (sum(v) / len(v)) if v else float("nan"), "n": len(v)} for g, v in buckets.items()}


def step_errors(rows: Iterable[dict[str, Any]], uses: dict[Any, list[tuple[str, int]]]) -> dict[str, dict[str, float]]:
    """Predicted and measured time of whole steps, rebuilt from per-kernel rows and their uses.

    ``uses`` maps a row's ``key`` to the (step label, count) pairs where it occurs. A step
    with any unmeasured kernel is left out.
    """
    pred: dict[str, float] = {}
    meas: dict[str, float] = {}
    broken: set[str] = set()
    for r in rows:
        for label, count in uses.get(r["key"], ()):
            m = r.get("measured_us")
            if m is None or not (m > 0):
                broken.add(label)
                continue
            pred[label] = pred.get(label, 0.0) + float(r["predicted_us"]) * count
            meas[label] = meas.get(label, 0.0) + float(m) * count
    return {
        s: {"predicted_ms": pred[s] / 1e3, "measured_ms": meas[s] / 1e3, "ape_pct": ape(pred[s], meas[s])}
        for s in pred
        if s not in broken
    }


def format_summary(agg: dict[str, dict[str, float]], steps: dict[str, dict[str, float]] | None = None) -> str:
    """The MAPE table beside the paper's figures (and the step errors, if given)."""
    lines = [
        "kernel MAPE (this shape-based model vs. measured)   beside the paper (AMALI, A100, Llama3-8B/15B)",
        f"{'group':<12} {'n':>4} {'MAPE %':>8} {'paper %':>8}",
    ]
    for g in GROUPS:
        a = agg.get(g, {"mape": float("nan"), "n": 0})
        paper = PAPER_MAPE.get(g)
        mape = "n/a" if a["n"] == 0 else f"{a['mape']:.2f}"
        lines.append(f"{g:<12} {a['n']:>4} {mape:>8} {'-' if paper is None else f'{paper:.2f}':>8}")
    lines.append("kinds: gemm = weight GEMMs/GEMVs; elementwise = RMSNorm, RoPE, SiLU*mul, residual add; "
                 "attention = score/value GEMMs and softmax (or the fused kernel)")
    if steps:
        lines += ["", f"{'step':<22} {'predicted ms':>13} {'measured ms':>12} {'error %':>8}"]
        for s, v in steps.items():
            lines.append(f"{s:<22} {v['predicted_ms']:>13.3f} {v['measured_ms']:>12.3f} {v['ape_pct']:>8.2f}")
    return "\n".join(lines)


def write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)


def default_out() -> Path:
    out = os.environ.get("OUT")
    return Path(out) / "amali_validate.csv" if out else Path("amali_validate.csv")


# -- torch (GPU only) ------------------------------------------------------------------------
def _input_bytes(kernel) -> int:
    if isinstance(kernel, Gemm):
        return 2 * kernel.batch * (kernel.m * kernel.k + kernel.k * kernel.n)
    if isinstance(kernel, RowOp):
        streams = {"add": 2, "silu_mul": 2}.get(kernel.op, 1)
        return 2 * kernel.rows * kernel.row_len * streams + kernel.rows * kernel.extra_row_bytes
    if isinstance(kernel, FusedAttention):
        d = kernel.head_dim
        return 2 * kernel.batch * d * (kernel.q_len * kernel.heads + 2 * kernel.kv_len * kernel.kv_heads)
    return 0


class _Torch:
    """Builds inputs and one-kernel callables for each kernel kind (imported on the GPU only)."""

    def __init__(self, torch, compile_ops: bool):
        self.torch = torch
        self.F = torch.nn.functional
        self.dev = torch.device("cuda")
        self.dt = torch.bfloat16
        F = self.F

        def rmsnorm(x, w):
            xf = x.float()
            r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)
            return (xf * r * w.float()).to(x.dtype)

        def silu_mul(gu):
            g, u = gu.chunk(2, dim=-1)
            return (F.silu(g.float()) * u.float()).to(gu.dtype)

        def rope(x, cos, sin):
            x1, x2 = x.float().chunk(2, dim=-1)
            c = cos[:, None, :]
            s = sin[:, None, :]
            return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)

        self.raw = {"rmsnorm": rmsnorm, "silu_mul": silu_mul, "rope": rope}
        if compile_ops:
            dyn = torch._dynamo.config
            for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                         "accumulated_recompile_limit"):
                if hasattr(dyn, name):
                    setattr(dyn, name, 4096)
            comp = lambda f: torch.compile(f, dynamic=False)  # noqa: E731
            self.rmsnorm, self.silu_mul, self.rope = comp(rmsnorm), comp(silu_mul), comp(rope)
        else:
            self.rmsnorm, self.silu_mul, self.rope = rmsnorm, silu_mul, rope

    def randn(self, *shape, dtype=None):
        return self.torch.randn(*shape, device=self.dev, dtype=dtype or self.dt)

    def build(self, kernel, *, eager: bool = False) -> tuple[Callable, Callable[[], tuple]]:
        """(fn, make_args): ``fn(*make_args())`` launches the kernel once (``eager``: no torch.compile)."""
        t, F = self.torch, self.F
        if eager:
            rmsnorm, silu_mul, rope = self.raw["rmsnorm"], self.raw["silu_mul"], self.raw["rope"]
        else:
            rmsnorm, silu_mul, rope = self.rmsnorm, self.silu_mul, self.rope
        if isinstance(kernel, Gemm):
            m, n, k, b = kernel.m, kernel.n, kernel.k, kernel.batch
            if kernel.name == "attn_score":
                return (lambda q, kk: t.bmm(q, kk.transpose(1, 2))), lambda: (self.randn(b, m, k), self.randn(b, n, k))
            if b > 1:
                return t.bmm, lambda: (self.randn(b, m, k), self.randn(b, k, n))
            return F.linear, lambda: (self.randn(m, k), self.randn(n, k) * 0.02)
        if isinstance(kernel, RowOp):
            r, ln = kernel.rows, kernel.row_len
            if kernel.op == "rmsnorm":
                return rmsnorm, lambda: (self.randn(r, ln), self.randn(ln))
            if kernel.op == "add":
                return t.add, lambda: (self.randn(r, ln), self.randn(r, ln))
            if kernel.op == "silu_mul":
                return silu_mul, lambda: (self.randn(r, 2 * ln),)
            if kernel.op == "softmax":
                return (lambda x: t.softmax(x, dim=-1)), lambda: (self.randn(r, ln),)
            if kernel.op == "rope":
                h = kernel.heads
                d = ln // h
                return rope, lambda: (
                    self.randn(r, h, d), self.randn(r, d // 2, dtype=t.float32), self.randn(r, d // 2, dtype=t.float32)
                )
            raise ValueError(f"no torch op for row op {kernel.op!r}")
        if isinstance(kernel, FusedAttention):
            a = kernel

            def attn(q, kk, v):
                return F.scaled_dot_product_attention(q, kk, v, is_causal=a.causal, enable_gqa=a.heads != a.kv_heads)

            return attn, lambda: (
                self.randn(a.batch, a.heads, a.q_len, a.head_dim),
                self.randn(a.batch, a.kv_heads, a.kv_len, a.head_dim),
                self.randn(a.batch, a.kv_heads, a.kv_len, a.head_dim),
            )
        raise ValueError(f"cannot measure {kernel!r}")

    def time(self, fn, make_args, *, copies: int, reps: int, iters: int) -> tuple[float, float, str]:
        """(median us, min us, method) of one launch, from graph replays of ``reps`` launches."""
        t = self.torch
        args = [make_args() for _ in range(copies)]
        for a in args[: min(2, copies)]:
            fn(*a)
        t.cuda.synchronize()
        method = "graph"
        try:
            side = t.cuda.Stream()
            side.wait_stream(t.cuda.current_stream())
            with t.cuda.stream(side):
                for a in args[: min(3, copies)]:
                    fn(*a)
            t.cuda.current_stream().wait_stream(side)
            t.cuda.synchronize()
            g = t.cuda.CUDAGraph()
            with t.cuda.graph(g):
                for i in range(reps):
                    fn(*args[i % copies])
            run = g.replay
        except Exception:  # capture unsupported for this op: time plain launches
            method = "loop"
            t.cuda.synchronize()

            def run():
                for i in range(reps):
                    fn(*args[i % copies])

        run()
        t.cuda.synchronize()
        times = []
        for _ in range(iters):
            start, end = t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / reps)
        del args
        return statistics.median(times), min(times), method

    def count_kernels(self, fn, make_args) -> int:
        t = self.torch
        from torch.profiler import ProfilerActivity, profile

        a = make_args()
        fn(*a)
        t.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(*a)
            t.cuda.synchronize()
        n = 0
        for e in prof.events():
            if getattr(e, "device_type", None) == t.autograd.DeviceType.CUDA and "memcpy" not in e.name.lower() \
                    and "memset" not in e.name.lower():
                n += 1
        return n


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Compare lens.amali kernel predictions with torch measurements on a GPU.")
    ap.add_argument("--gpu", default="H200", help="GPU spec the model predicts for (default H200)")
    ap.add_argument("--out", type=Path, default=None, help="CSV path (default $OUT/amali_validate.csv)")
    ap.add_argument("--quick", action="store_true", help="fewer lengths and batch sizes")
    ap.add_argument("--attention", choices=("eager", "fused"), default="eager")
    ap.add_argument("--iters", type=int, default=7, help="timed graph replays per kernel (median)")
    ap.add_argument("--budget-s", type=float, default=400.0, help="stop starting new kernels after this many seconds")
    ap.add_argument("--no-compile", action="store_true", help="eager torch for RMSNorm/RoPE/SiLU*mul (several kernels)")
    ap.add_argument("--no-profile", action="store_true", help="do not count the kernels each op launches")
    args = ap.parse_args(argv)

    import torch  # the GPU machine's torch; nothing above needs it

    if not torch.cuda.is_available():
        print("amali_validate: no CUDA device visible to torch", file=sys.stderr)
        return 2
    spec = gpu_spec(args.gpu)
    props = torch.cuda.get_device_properties(0)
    l2 = int(getattr(props, "L2_cache_size", 0) or spec.l2_mb * 2**20)
    print(f"device: {props.name}, {props.multi_processor_count} SMs, L2 {l2 / 2**20:.0f} MiB, torch {torch.__version__}")
    print(f"model spec: {spec.name} ({spec.sms} SMs, {spec.clock_mhz:.0f} MHz, {spec.dram_gbps:.0f} GB/s)")
    if props.multi_processor_count != spec.sms:
        print(f"warning: the device has {props.multi_processor_count} SMs, the spec {spec.sms}")
    torch.manual_seed(0)
    tk = _Torch(torch, compile_ops=not args.no_compile)
    todo = cases(quick=args.quick, attention=args.attention)
    print(f"{len(todo)} distinct kernels to measure")
    rows: list[dict[str, Any]] = []
    uses: dict[Any, list[tuple[str, int]]] = {}
    t0 = time.time()
    for i, c in enumerate(todo):
        k = c["kernel"]
        cost = kernel_cost(k, spec)
        key = _key(k)
        uses[key] = c["uses"]
        row: dict[str, Any] = {
            "key": key, "case": c["case"], "phase": k.phase, "name": k.name, "kind": k.kind, "op": cost.op,
            "shape": k.shape(), "count": k.count, "tile": cost.tile, "grid": cost.grid, "block": cost.block,
            "predicted_us": round(cost.us, 3), "measured_us": None, "measured_min_us": None, "ape_pct": None,
            "n_kernels": None, "method": "", "reps": 0, "copies": 0, "error": "",
        }
        if time.time() - t0 > args.budget_s:
            row["error"] = "skipped: time budget"
            rows.append(row)
            continue
        try:
            nbytes = max(1, _input_bytes(k))
            # enough input copies that one pass over them overflows L2 (every launch starts cold),
            # and at least one launch per copy in each graph replay
            copies = max(1, min(512, math.ceil(2.5 * l2 / nbytes), (8 << 30) // nbytes))
            reps = max(copies, 20 if cost.us < 200 else 5)
            fn, make = tk.build(k)
            try:
                med, mn, method = tk.time(fn, make, copies=copies, reps=reps, iters=args.iters)
            except Exception as exc:
                if args.no_compile or not (isinstance(k, RowOp) and k.op in tk.raw):
                    raise
                # torch.compile failed here: measure the eager ops (several kernels) and say so
                fn, make = tk.build(k, eager=True)
                med, mn, method = tk.time(fn, make, copies=copies, reps=reps, iters=args.iters)
                method = "eager-fallback"
                row["error"] = f"compile failed: {type(exc).__name__}"
            row.update(measured_us=round(med, 3), measured_min_us=round(mn, 3), method=method, reps=reps,
                       copies=copies, ape_pct=round(ape(cost.us, med), 2))
            if not args.no_profile:
                try:
                    row["n_kernels"] = tk.count_kernels(fn, make)
                except Exception as exc:  # the profiler is optional
                    row["n_kernels"] = -1
                    row["error"] = (row["error"] + "; " if row["error"] else "") + f"profiler: {type(exc).__name__}"
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:200]
        finally:
            torch.cuda.empty_cache()
        rows.append(row)
        print(f"[{i + 1:3d}/{len(todo)} {time.time() - t0:6.1f}s] {row['case']:<18} {k.name:<13} {k.shape():<34} "
              f"pred {cost.us:9.2f} us  meas {row['measured_us'] if row['measured_us'] is not None else '-':>9} us  "
              f"{row['error']}", flush=True)
    out = args.out or default_out()
    write_csv(out, rows)
    print()
    print(format_summary(aggregate(rows), step_errors(rows, uses)))
    multi = [r for r in rows if isinstance(r.get("n_kernels"), int) and r["n_kernels"] > 1]
    if multi:
        print(f"\nnote: {len(multi)} ops ran more than one GPU kernel: "
              + ", ".join(f"{r['case']}/{r['name']}={r['n_kernels']}" for r in multi[:12]))
    print(f"\nwrote {out} ({len(rows)} rows) in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
