"""``lensopt amali SPACE``: the AMALI model's per-kernel breakdown of one request.

Prints, like a profiler's kernel table, every kernel of the prefill step (one request of
``--input-len`` tokens) and of one decode step (``--batch`` sequences at the first decode
context, ``input_len + 1``) with its launch (grid, block, CTAs per SM, occupancy, waves),
its cycle terms and its time, then the predicted TTFT / TPOT / E2E of that request. All
numbers come from the analytical model (``lens.amali``): they are estimates, never
measurements, and are labelled so.

The model shape and dtype come from the space file's target; the GPU from ``--gpu``, else
from the target's hardware when it names a GPU the model knows.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from lens.amali import (
    LABEL,
    decode_kernels,
    gpu_spec,
    is_known_gpu,
    known_gpus,
    prefill_kernels,
    request_seconds,
    step_costs,
)
from lens.amali.kernels import ATTENTION_MODES
from lens.amali.model import KernelCost
from lens.amali.specs import GpuSpec, canonical_dtype
from lens.errors import UserError
from lens.types import ModelShape


#: the analytical model evaluates every decode step: longer requests than this are typos
MAX_AMALI_TOKENS = 10_000_000


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be at least 1")
    if v > MAX_AMALI_TOKENS:
        raise argparse.ArgumentTypeError(f"{v} is more than {MAX_AMALI_TOKENS:,}")
    return v


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "amali",
        help="per-kernel GPU latency estimate of one request (AMALI analytical model)",
        description=(
            "Estimate, without any hardware, the kernels of one prefill step and one decode step of the "
            "space's model on a GPU with the AMALI analytical model, and the request's TTFT, TPOT and E2E. "
            "Every number is an estimate, not a measurement."
        ),
    )
    p.add_argument("space", metavar="SPACE", help="space file (TOML): its target gives the model shape and dtype")
    p.add_argument("--tp", type=_positive_int, default=1, help="tensor-parallel GPUs (default 1)")
    p.add_argument("--batch", type=_positive_int, default=1, help="sequences decoded together (default 1)")
    p.add_argument("--input-len", type=_positive_int, required=True, help="prompt tokens of the request")
    p.add_argument("--output-len", type=_positive_int, required=True, help="generated tokens of the request")
    p.add_argument("--gpu", default=None,
                   help=f"GPU to model ({', '.join(known_gpus())}); default: the target's hardware")
    p.add_argument("--attention", choices=ATTENTION_MODES, default="eager",
                   help="eager: score GEMM, softmax, value GEMM (the paper's kernels); fused: one "
                        "FlashAttention-style kernel (default eager)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.set_defaults(func=handle)


# -- inputs ---------------------------------------------------------------------------------
def load_target(path: str):
    """The space file's target, through the space loader (``spaces.load_space``)."""
    try:
        from spaces import load_space  # type: ignore[attr-defined]
    except ImportError as exc:
        raise UserError(
            f"cannot read {path}: this installation has no space loader (spaces.load_space); "
            f"reinstall lensopt ({exc})"
        ) from exc
    return load_space(path).target


def resolve_gpu(gpu: str | None, hardware: str, path: str = "the space file") -> GpuSpec:
    """``--gpu`` if given, else the target's hardware if it is a known GPU, else ``UserError``."""
    if gpu:
        return gpu_spec(gpu)
    if hardware and is_known_gpu(hardware):
        return gpu_spec(hardware)
    raise UserError(
        f"target hardware {hardware!r} in {path} is not a GPU the AMALI model knows; "
        f"pass --gpu with one of {', '.join(known_gpus())}"
    )


# -- the report ----------------------------------------------------------------------------
def _kernel_row(c: KernelCost) -> dict[str, Any]:
    d = asdict(c)
    d["total_us"] = c.total_us
    return d


def report(
    *,
    model: ModelShape,
    spec: GpuSpec,
    tp: int,
    batch: int,
    input_len: int,
    output_len: int,
    dtype: str,
    attention: str = "eager",
) -> dict[str, Any]:
    """Everything ``lensopt amali`` prints, as plain data (JSON-able)."""
    dt = canonical_dtype(dtype)
    pre = step_costs(prefill_kernels(model, tokens=input_len, tp=tp, dtype=dt, attention=attention), spec)
    ctx = input_len + 1
    dec = step_costs(decode_kernels(model, batch=batch, context=ctx, tp=tp, dtype=dt, attention=attention), spec)
    req = request_seconds(model=model, gpu=spec, tp=tp, batch=batch, input_len=input_len,
                          output_len=output_len, dtype=dt, attention=attention)
    return {
        "label": LABEL,
        "gpu": {
            "name": spec.name, "sms": spec.sms, "clock_mhz": round(spec.clock_mhz, 1),
            "peak_tflops": round(spec.peak_tflops(dt), 1), "dram_gbps": spec.dram_gbps,
        },
        "model": model.to_dict(),
        "dtype": dt,
        "tp": tp,
        "batch": batch,
        "input_len": input_len,
        "output_len": output_len,
        "attention": attention,
        "prefill": {"tokens": input_len, "kernels": [_kernel_row(c) for c in pre],
                    "total_us": sum(c.total_us for c in pre)},
        "decode": {"batch": batch, "context": ctx, "kernels": [_kernel_row(c) for c in dec],
                   "total_us": sum(c.total_us for c in dec)},
        "request": {k: v for k, v in req.items()},
    }


def _k(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 1e6:
        return f"{x / 1e6:.2f}M"
    if abs(x) >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}"


_COLS = (
    ("kernel", "<", 14), ("kind", "<", 11), ("shape", "<", 24), ("calls", ">", 5), ("tile", "<", 26),
    ("grid", ">", 6), ("block", ">", 5), ("cta/SM", ">", 6), ("occ", ">", 4), ("waves", ">", 6),
    ("issue", ">", 7), ("div", ">", 6), ("math", ">", 7), ("noc", ">", 7), ("dram", ">", 7),
    ("lat", ">", 6), ("kll", ">", 6), ("cycles", ">", 7), ("us/call", ">", 8), ("total_us", ">", 9),
    ("%", ">", 5), ("bound", "<", 17),
)


def _table(rows: list[dict[str, Any]]) -> list[str]:
    total = sum(r["total_us"] for r in rows) or 1.0
    head = " ".join(f"{n:{a}{w}}" for n, a, w in _COLS)
    lines = [head, "-" * len(head)]
    for r in rows:
        comm = r["kind"] == "comm"
        vals = [
            r["name"], r["kind"], r["shape"], str(r["count"]), r["tile"],
            "-" if comm else str(r["grid"]), "-" if comm else str(r["block"]),
            "-" if comm else str(r["ctas_per_sm"]), "-" if comm else f"{r['occupancy']:.2f}",
            "-" if comm else f"{r['waves']:.2f}",
            _k(r["s_selected"]), _k(r["divergence"]), _k(r["s_math_pipe"]), _k(r["s_noc"]), _k(r["s_dram"]),
            _k(r["s_long_scoreboard"]), _k(r["kll"]), _k(r["cycles"]), f"{r['us']:.1f}", f"{r['total_us']:.1f}",
            f"{100 * r['total_us'] / total:.1f}", r["bound"],
        ]
        lines.append(" ".join(f"{v:{a}{w}}" for v, (_, a, w) in zip(vals, _COLS)))
    lines.append("-" * len(head))
    lines.append(f"{'total':<14} {len(rows)} kernels x calls, {total / 1e3:.3f} ms")
    return lines


def render(rep: dict[str, Any]) -> str:
    g, m = rep["gpu"], rep["model"]
    out = [
        f"AMALI per-kernel breakdown -- {rep['label']}",
        f"model: layers={m['layers']} hidden={m['hidden']} heads={m['heads']}/{m['kv_heads']} "
        f"intermediate={m['intermediate']} vocab={m['vocab']}  dtype={rep['dtype']}  attention={rep['attention']}",
        f"gpu: {g['name']} ({g['sms']} SMs, {g['clock_mhz']:.0f} MHz, {g['peak_tflops']:.0f} TFLOPS "
        f"{rep['dtype']}, {g['dram_gbps']:.0f} GB/s)  tp={rep['tp']}  batch={rep['batch']}",
        "cycle terms per launch (SM cycles): issue=S_selected div=ID math=S_math_pipe noc=S_NoC dram=S_DRAM "
        "lat=S_long_scoreboard kll=KLL; they sum to cycles",
        "",
        f"prefill step: one request of {rep['prefill']['tokens']} tokens",
        *_table(rep["prefill"]["kernels"]),
        "",
        f"decode step: batch {rep['decode']['batch']}, KV context {rep['decode']['context']} (the first decode step)",
        *_table(rep["decode"]["kernels"]),
        "",
    ]
    r = rep["request"]
    out += [
        f"request: input {rep['input_len']} tokens, output {rep['output_len']} tokens, decoded in a batch of "
        f"{rep['batch']} -- {rep['label']}",
        f"  TTFT {r['ttft_s'] * 1e3:10.3f} ms   (its own prefill)",
        f"  TPOT {r['tpot_s'] * 1e3:10.3f} ms   (mean decode step, contexts {rep['input_len'] + 1}.."
        f"{rep['input_len'] + rep['output_len']})",
        f"  E2E  {r['e2e_s'] * 1e3:10.3f} ms",
    ]
    return "\n".join(out)


def handle(args: argparse.Namespace) -> int:
    target = load_target(args.space)
    spec = resolve_gpu(args.gpu, getattr(target, "hardware", ""), args.space)
    try:
        rep = report(
            model=target.model, spec=spec, tp=args.tp, batch=args.batch, input_len=args.input_len,
            output_len=args.output_len, dtype=target.dtype, attention=args.attention,
        )
    except UserError as exc:
        if str(exc).startswith("tp="):  # the model cannot be split that way: say which flag and file
            raise UserError(f"--tp {args.tp}: {exc} (the model of {args.space})") from None
        raise
    print(json.dumps(rep, indent=2) if args.json else render(rep))
    return 0
