"""TTFT_b / TBT_b per bucket from the AMALI kernel model: the LENS estimator's shape.

For a unit (model, GPU, tp, batch) and a bucket set:

- ``TTFT_b`` = the prefill step over ``b`` padded tokens of ONE request (prompts are
  encoded one request at a time, as the LENS static-batch composition assumes);
- ``TBT_b``  = one decode step of the whole batch (``batch`` sequences) with KV context
  ``b`` (every sequence padded to the bucket).

Each is the sum of the step's kernels (``kernels.py``) as predicted by ``model.py``, each
times its count (layers), plus the tensor-parallel all-reduces (two per layer). The
result is a ``dict[int, BucketProfile]`` like the one the LENS solve produces, so the
same composition, workload metrics and search run on it; every profile says
``source="estimate:amali"``, ``runner="amali"`` and ``repeats=0``: it was never measured.
The raw-run fields are filled consistently with the two-measurement identity
(``l1=0, l2=1, t1=TTFT, t2=TTFT+TBT``) so code that re-derives TTFT/TBT from them agrees.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Sequence, Union

import numpy as np

from ..buckets import validate_buckets
from ..errors import UserError
from ..types import BucketProfile, ModelShape, Unit
from .kernels import decode_kernels, prefill_kernels
from .model import KernelCost, step_costs, step_seconds
from .specs import GpuSpec, canonical_dtype, gpu_spec

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

SOURCE = "estimate:amali"
RUNNER = "amali"
LABEL = "estimate (AMALI analytical model), not a measurement"

GpuLike = Union[str, GpuSpec]


def _spec(gpu: GpuLike) -> GpuSpec:
    return gpu if isinstance(gpu, GpuSpec) else gpu_spec(gpu)


def _positive(**kw: int) -> None:
    for k, v in kw.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise UserError(f"{k}={v!r} must be a positive integer")


def prefill_seconds(
    *, model: ModelShape, gpu: GpuLike, tp: int = 1, tokens: int, dtype: str = "bf16", attention: str = "eager"
) -> float:
    """Predicted time of encoding one prompt of ``tokens`` tokens."""
    _positive(tokens=tokens)
    spec = _spec(gpu)
    return step_seconds(prefill_kernels(model, tokens=tokens, tp=tp, dtype=dtype, attention=attention), spec)


def decode_seconds(
    *,
    model: ModelShape,
    gpu: GpuLike,
    tp: int = 1,
    batch: int,
    context: int,
    dtype: str = "bf16",
    attention: str = "eager",
) -> float:
    """Predicted time of one decode step of ``batch`` sequences at KV context ``context``."""
    _positive(batch=batch, context=context)
    spec = _spec(gpu)
    ks = decode_kernels(model, batch=batch, context=context, tp=tp, dtype=dtype, attention=attention)
    return step_seconds(ks, spec)


def estimate_unit(
    *,
    model: ModelShape,
    gpu: GpuLike,
    tp: int,
    batch: int,
    buckets: Sequence[int],
    dtype: str = "bf16",
    attention: str = "eager",
) -> dict[int, BucketProfile]:
    """TTFT_b and TBT_b for every bucket of one unit, as ``BucketProfile`` estimates."""
    _positive(tp=tp, batch=batch)
    bs = validate_buckets(buckets)
    spec = _spec(gpu)
    dt = canonical_dtype(dtype)
    spec.tc_fma(dt)  # unsupported dtype on this GPU: UserError before any work
    out: dict[int, BucketProfile] = {}
    for b in bs:
        ttft = prefill_seconds(model=model, gpu=spec, tp=tp, tokens=b, dtype=dt, attention=attention)
        tbt = decode_seconds(model=model, gpu=spec, tp=tp, batch=batch, context=b, dtype=dt, attention=attention)
        out[b] = BucketProfile(
            bucket=b,
            ttft_s=ttft,
            tbt_s=tbt,
            input_len=b,
            l1=0,
            l2=1,
            t1_s=ttft,
            t2_s=ttft + tbt,
            repeats=0,
            spread=0.0,
            runner=RUNNER,
            host="",
            measured_at=0.0,
            simulated=False,
            source=SOURCE,
        )
    return out


def estimate_for(
    unit: Unit, *, buckets: Sequence[int], gpu: GpuLike | None = None, attention: str = "eager"
) -> dict[int, BucketProfile]:
    """``estimate_unit`` for a ``Unit``; the GPU defaults to ``unit.target.hardware``."""
    t = unit.target
    return estimate_unit(
        model=t.model, gpu=gpu if gpu is not None else t.hardware, tp=unit.tp, batch=unit.batch,
        buckets=buckets, dtype=t.dtype, attention=attention,
    )


def _frame(costs: list[KernelCost], step: str) -> "pd.DataFrame":
    import pandas as pd

    rows = []
    for c in costs:
        d = asdict(c)
        d["total_us"] = c.total_us
        d["step"] = step
        rows.append(d)
    df = pd.DataFrame(rows)
    front = ["step", "phase", "name", "kind", "op", "shape", "count", "tile", "grid", "block", "regs", "smem",
             "ctas_per_sm", "occupancy", "limiter", "waves", "full_waves", "last_wave_ctas_per_sm",
             "s_selected", "divergence", "s_math_pipe", "s_noc", "s_dram", "s_long_scoreboard", "kll",
             "cycles", "us", "total_us", "bound"]
    return df[front + [c for c in df.columns if c not in front]]


def breakdown(
    *,
    model: ModelShape,
    gpu: GpuLike,
    tp: int = 1,
    batch: int = 1,
    input_len: int,
    context: int | None = None,
    dtype: str = "bf16",
    attention: str = "eager",
) -> "pd.DataFrame":
    """One row per kernel of the prefill of one ``input_len`` prompt and of one decode step.

    The decode step runs ``batch`` sequences at KV context ``context`` (default
    ``input_len + 1``, the first decode step). Columns: the launch (tile, grid, block,
    registers, shared memory), CTAs per SM, theoretical occupancy (resident warps of a full
SM over the maximum) and its limiter, waves (grid over CTA slots), every cycle
    term (``s_selected + divergence + s_math_pipe + s_noc + s_dram + s_long_scoreboard +
    kll = cycles``), microseconds per launch and times ``count``, and the raw demands
    before overlap (``*_cycles``). Cycles are SM clock cycles of ``gpu``.
    """
    _positive(batch=batch, input_len=input_len)
    spec = _spec(gpu)
    ctx = input_len + 1 if context is None else context
    _positive(context=ctx)
    import pandas as pd

    pre = step_costs(prefill_kernels(model, tokens=input_len, tp=tp, dtype=dtype, attention=attention), spec)
    dec = step_costs(decode_kernels(model, batch=batch, context=ctx, tp=tp, dtype=dtype, attention=attention), spec)
    return pd.concat(
        [_frame(pre, f"prefill tokens={input_len}"), _frame(dec, f"decode batch={batch} context={ctx}")],
        ignore_index=True,
    )


def request_seconds(
    *,
    model: ModelShape,
    gpu: GpuLike,
    tp: int = 1,
    batch: int = 1,
    input_len: int,
    output_len: int,
    dtype: str = "bf16",
    attention: str = "eager",
    max_points: int = 65,
) -> dict[str, float]:
    """TTFT, TPOT and E2E of one request (``input_len``, ``output_len``) decoded in a batch.

    TTFT is the request's own prefill; decode step ``t`` (``0 <= t < output_len``) runs at
    context ``input_len + t + 1`` with the whole batch. For long outputs the step time is
    evaluated at ``max_points`` evenly spaced contexts and interpolated linearly between
    them (the step time is near-linear in context).
    """
    _positive(input_len=input_len, output_len=output_len, batch=batch)
    spec = _spec(gpu)
    ttft = prefill_seconds(model=model, gpu=spec, tp=tp, tokens=input_len, dtype=dtype, attention=attention)
    ctx = input_len + 1 + np.arange(output_len)
    pts = np.unique(np.linspace(ctx[0], ctx[-1], min(output_len, max_points)).round().astype(np.int64))
    tbt_pts = np.array([
        decode_seconds(model=model, gpu=spec, tp=tp, batch=batch, context=int(c), dtype=dtype, attention=attention)
        for c in pts
    ])
    steps = np.interp(ctx, pts, tbt_pts) if len(pts) > 1 else np.full(output_len, tbt_pts[0])
    decode = float(steps.sum())
    return {"ttft_s": ttft, "tpot_s": decode / output_len, "e2e_s": ttft + decode, "decode_s": decode}
