"""Priors: estimates for units that have no measured profile yet.

They only rank candidates so the profiler measures the *promising* units; a candidate is
never put on the final front on a prior.  Two priors:

- ``ScalingPrior`` (any target): takes the nearest measured unit (same tp first, then the
  closest batch in log scale) and scales its numbers.  TTFT_b (one request's prefill) is
  compute-bound: scaled by tp0 / tp.  TBT_b (one decode step of the whole batch) is
  memory-bound: scaled by the bytes a step reads per device,
  (weights + batch * KV(b)) / tp, over the same for the measured unit.
- ``AmaliPrior`` (GPU targets): the analytical model of ``lens.amali`` when the target's
  hardware is a GPU it knows; needs no measurement at all.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

from lens.types import BucketProfile, ModelShape

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}


def weight_bytes(model: ModelShape, dtype: str) -> float:
    return model.param_count() * DTYPE_BYTES.get(dtype, 2)


def kv_bytes(model: ModelShape, dtype: str, tokens: int) -> float:
    """K and V of ``tokens`` positions of one sequence, all layers."""
    return 2.0 * model.layers * tokens * model.kv_heads * model.head_dim * DTYPE_BYTES.get(dtype, 2)


def memory_gib(model: ModelShape, dtype: str, *, tp: int, batch: int, max_len: int) -> float:
    """Device memory one chip needs: its share of the weights and of the KV cache."""
    return (weight_bytes(model, dtype) + batch * kv_bytes(model, dtype, max_len)) / tp / 2**30


class ScalingPrior:
    name = "estimate:scaling"

    def __init__(self, model: ModelShape, dtype: str):
        self.model, self.dtype = model, dtype

    def estimate(
        self, tp: int, batch: int, buckets: Sequence[int], measured: Mapping[tuple[int, int], Mapping[int, BucketProfile]]
    ) -> dict[int, BucketProfile] | None:
        """Per bucket, the nearest measured unit that has it, scaled; None if a bucket has none."""
        w = weight_bytes(self.model, self.dtype)
        out = {}
        for b in buckets:
            have = [(u, prof[b]) for u, prof in measured.items() if b in prof]
            if not have:
                return None
            (tp0, b0), p = min(
                have, key=lambda kv: (2 * abs(math.log2(kv[0][0] / tp)) + abs(math.log2(kv[0][1] / batch)), kv[0])
            )
            kv = kv_bytes(self.model, self.dtype, b)
            step = ((w + batch * kv) / tp) / ((w + b0 * kv) / tp0)
            out[b] = dataclasses.replace(
                p, ttft_s=p.ttft_s * tp0 / tp, tbt_s=p.tbt_s * step, source=self.name, repeats=0, raw_t1=(), raw_t2=()
            )
        return out


class AmaliPrior:
    name = "estimate:amali"

    def __init__(self, model: ModelShape, dtype: str, gpu: str):
        self.model, self.dtype, self.gpu = model, dtype, gpu

    @staticmethod
    def for_hardware(model: ModelShape, dtype: str, hardware: str) -> "AmaliPrior | None":
        try:
            from lens.amali import gpu_spec
        except ImportError:
            return None
        try:
            gpu_spec(hardware)
        except Exception:
            return None
        return AmaliPrior(model, dtype, hardware)

    def estimate(self, tp: int, batch: int, buckets: Sequence[int], measured=None) -> dict[int, BucketProfile]:
        from lens.amali import estimate_unit

        return estimate_unit(model=self.model, gpu=self.gpu, tp=tp, batch=batch, buckets=list(buckets), dtype=self.dtype)
