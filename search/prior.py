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

With the target's ``prefill = "batched"`` TTFT_b is one call of the whole batch: both
priors work with its share per row (TTFT_b / batch, the prefill of one prompt), then
multiply by the unit's batch.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

from lens.types import DTYPE_BYTES, PREFILLS, BucketProfile, ModelShape


def weight_bytes(model: ModelShape, dtype: str) -> float:
    return model.param_count() * DTYPE_BYTES.get(dtype, 2)


def kv_bytes(model: ModelShape, dtype: str, tokens: int) -> float:
    """K and V of ``tokens`` positions of one sequence, all layers."""
    return 2.0 * model.layers * tokens * model.kv_heads * model.head_dim * DTYPE_BYTES.get(dtype, 2)


def memory_gib(model: ModelShape, dtype: str, *, tp: int, batch: int, max_len: int) -> float:
    """Device memory one chip needs: its share of the weights and of the KV cache."""
    return (weight_bytes(model, dtype) + batch * kv_bytes(model, dtype, max_len)) / tp / 2**30


class ScalingPrior:
    """Nearest measured unit, scaled with exponents fitted on the measured units.

    TTFT_b ~ tp^a and TBT_b ~ tp^c * bytes(batch, b)^d, where bytes is what one decode step
    reads per device (weights + batch * KV(b)).  The exponents start at the ideal a = c = -1,
    d = 1 and are refitted by least squares (with one intercept per bucket) once the
    measured units vary in tp or batch, then clamped to a physical range: real tp scaling
    is sub-linear (collectives, fixed per-step costs), which the ideal law overrates.
    """

    name = "estimate:scaling"
    #: clamps of the fitted exponents
    TP_RANGE = (-1.2, 0.3)
    BYTES_RANGE = (0.0, 1.5)

    def __init__(self, model: ModelShape, dtype: str, prefill: str = PREFILLS[0]):
        self.model, self.dtype, self.prefill = model, dtype, prefill

    def _rows(self, batch: int) -> int:
        """Prompts one TTFT_b encodes: the whole batch in one call when batched, else one."""
        return batch if self.prefill == "batched" else 1

    def _bytes(self, batch: int, bucket: int) -> float:
        return weight_bytes(self.model, self.dtype) + batch * kv_bytes(self.model, self.dtype, bucket)

    def exponents(self, measured: Mapping[tuple[int, int], Mapping[int, BucketProfile]]) -> tuple[float, float, float]:
        rows = [(tp, b, bk, p) for (tp, b), prof in measured.items() for bk, p in prof.items()
                if p.ttft_s > 0 and p.tbt_s > 0]
        a, c, d = -1.0, -1.0, 1.0
        if len({r[0] for r in rows}) < 2 and len({r[1] for r in rows}) < 2:
            return a, c, d
        import numpy as np

        buckets = sorted({r[2] for r in rows})
        onehot = np.array([[1.0 if r[2] == bk else 0.0 for bk in buckets] for r in rows])
        ltp = np.log([r[0] for r in rows])
        if len({r[0] for r in rows}) >= 2:
            X = np.column_stack([onehot, ltp])
            coef, *_ = np.linalg.lstsq(X, np.log([r[3].ttft_s / self._rows(r[1]) for r in rows]), rcond=None)
            a = float(np.clip(coef[-1], *self.TP_RANGE))
        cols = [onehot]
        if len({r[0] for r in rows}) >= 2:
            cols.append(ltp[:, None])
        if len({r[1] for r in rows}) >= 2:
            cols.append(np.log([self._bytes(r[1], r[2]) for r in rows])[:, None])
        X = np.column_stack(cols)
        coef, *_ = np.linalg.lstsq(X, np.log([r[3].tbt_s for r in rows]), rcond=None)
        k = len(buckets)
        if len({r[0] for r in rows}) >= 2:
            c = float(np.clip(coef[k], *self.TP_RANGE))
            k += 1
        if len({r[1] for r in rows}) >= 2:
            d = float(np.clip(coef[k], *self.BYTES_RANGE))
        return a, c, d

    def estimate(
        self, tp: int, batch: int, buckets: Sequence[int], measured: Mapping[tuple[int, int], Mapping[int, BucketProfile]]
    ) -> dict[int, BucketProfile] | None:
        """Per bucket, the nearest measured unit that has it, scaled; None if a bucket has none."""
        a, c, d = self.exponents(measured)
        out = {}
        for b in buckets:
            have = [(u, prof[b]) for u, prof in measured.items() if b in prof]
            if not have:
                return None
            (tp0, b0), p = min(
                have, key=lambda kv: (2 * abs(math.log2(kv[0][0] / tp)) + abs(math.log2(kv[0][1] / batch)), kv[0])
            )
            r_tp = tp / tp0
            r_bytes = self._bytes(batch, b) / self._bytes(b0, b)
            out[b] = dataclasses.replace(
                p, ttft_s=p.ttft_s / self._rows(b0) * r_tp ** a * self._rows(batch),
                tbt_s=p.tbt_s * r_tp ** c * r_bytes ** d,
                source=self.name, repeats=0, raw_t1=(), raw_t2=(),
            )
        return out


class AmaliPrior:
    name = "estimate:amali"

    def __init__(self, model: ModelShape, dtype: str, gpu: str, prefill: str = PREFILLS[0]):
        self.model, self.dtype, self.gpu, self.prefill = model, dtype, gpu, prefill

    @staticmethod
    def for_hardware(model: ModelShape, dtype: str, hardware: str,
                     prefill: str = PREFILLS[0]) -> "AmaliPrior | None":
        try:
            from lens.amali import gpu_spec
        except ImportError:
            return None
        try:
            gpu_spec(hardware)
        except Exception:
            return None
        return AmaliPrior(model, dtype, hardware, prefill)

    def estimate(self, tp: int, batch: int, buckets: Sequence[int], measured=None) -> dict[int, BucketProfile]:
        from lens.amali import estimate_unit

        out = estimate_unit(model=self.model, gpu=self.gpu, tp=tp, batch=batch, buckets=list(buckets), dtype=self.dtype)
        if self.prefill == "batched":  # the model encodes one prompt; a call of the batch costs, at most, batch of them
            out = {b: dataclasses.replace(p, ttft_s=p.ttft_s * batch) for b, p in out.items()}
        return out
