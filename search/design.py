"""A workload's prediction on one candidate as a linear map of the per-bucket numbers.

``lens.compose.predict`` is linear in TTFT_b and TBT_b: every request's TTFT and E2E, and
the workload's total time, are sums of per-bucket numbers with counts that depend only on
the candidate's bucket sets, its batch size and the requests (the longest row of a batch
ends last whatever the numbers, as long as none is negative). So one candidate's
prediction under *many* draws of its unit's per-bucket numbers is a matrix product, which
is what pricing a unit under its prior's uncertainty needs: thousands of predictions per
round instead of one ``predict`` each.

The map is read off ``predict`` itself, one basis vector per bucket (the column of a bucket
no request uses is zero), so it can never disagree with the composition it stands for.
It does not depend on tp, so one ``Design`` serves every tp of a (batch, bucket sets).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from lens.compose import UnitTable, predict
from lens.types import PREFILLS, BucketProfile, Candidate, Requests

#: latency statistics a design computes, as ``lens.metrics`` names them
_STATS = {"mean": None, "p50": 50, "p90": 90, "p99": 99}


@dataclass(frozen=True, eq=False)
class Design:
    """Prediction = linear map of (TTFT_b of the ctx buckets, TBT_b of the tkg buckets)."""

    batch: int
    ctx: tuple[int, ...]
    tkg: tuple[int, ...]
    #: (requests, len(ctx)): each request's TTFT per unit of each ctx bucket's TTFT_b
    ttft: np.ndarray
    #: (requests, len(ctx) + len(tkg)): each request's E2E, per unit of each number
    e2e: np.ndarray
    #: (len(ctx) + len(tkg),): the workload's total time
    total: np.ndarray
    #: decode steps of each request (output length - 1)
    steps: np.ndarray
    out_tokens: int

    def used(self) -> tuple[set[int], set[int]]:
        """The ctx and tkg buckets whose numbers change the prediction."""
        k = len(self.ctx)
        nz = (self.e2e != 0).any(axis=0) | (self.total != 0)
        return ({b for b, u in zip(self.ctx, nz[:k]) if u}, {b for b, u in zip(self.tkg, nz[k:]) if u})



class DesignStack:
    """The designs of many candidates of one unit, over the space's buckets, for many draws.

    Each design's columns sit at its buckets' places among ``buckets`` (zero elsewhere), so
    one tensor product predicts every candidate on every draw.
    """

    def __init__(self, designs: Sequence[Design], buckets: Sequence[int]):
        at = {b: i for i, b in enumerate(buckets)}
        k, c, n = len(buckets), len(designs), len(designs[0].steps)
        # (candidates, numbers, requests): a draw's row vector times it is a matrix product
        self.ttft = np.zeros((c, k, n))
        self.e2e = np.zeros((c, 2 * k, n))
        self.total = np.zeros((c, 2 * k))
        for i, d in enumerate(designs):
            ic = [at[b] for b in d.ctx]
            it = [k + at[b] for b in d.tkg]
            self.ttft[i][ic] = d.ttft.T
            self.e2e[i][ic + it] = d.e2e.T
            self.total[i, ic + it] = d.total
        self.steps = designs[0].steps
        self.out_tokens = designs[0].out_tokens

    def metrics(self, ttft_s: np.ndarray, tbt_s: np.ndarray, names: Sequence[str], *,
                chips: np.ndarray) -> dict[str, np.ndarray]:
        """``names`` (``lens.metrics`` keys) of every candidate on every draw: (candidates, draws).

        ``ttft_s``/``tbt_s``: (draws, buckets). Computed as ``lens.metrics.summarize`` does
        (linear-interpolated percentiles; TPOT over the requests with a decode step).
        """
        v = np.concatenate([ttft_s, tbt_s], axis=1)  # (draws, 2k)
        out: dict[str, np.ndarray] = {}
        per_request: dict[str, np.ndarray] = {}
        for name in names:
            if name in ("throughput_tok_s", "throughput_tok_s_per_chip"):
                per = self.out_tokens / (self.total @ v.T)
                out[name] = per / np.asarray(chips, float)[:, None] if name.endswith("per_chip") else per
                continue
            kind, stat, _ = name.split("_", 2)
            if kind not in per_request:
                per_request[kind] = self._latency(kind, v, ttft_s)
            x = per_request[kind]
            q = _STATS[stat]
            out[name] = x.mean(axis=2) if q is None else quantile(x, q / 100.0, axis=2)
        return out

    def _latency(self, kind: str, v: np.ndarray, ttft_s: np.ndarray) -> np.ndarray:
        """(candidates, draws, requests) of ``ttft``, ``e2e`` or ``tpot`` (requests with a decode step)."""
        if kind == "ttft":
            return ttft_s @ self.ttft
        e2e = v @ self.e2e
        if kind == "e2e":
            return e2e
        dec = self.steps > 0
        return (e2e[..., dec] - ttft_s @ self.ttft[..., dec]) / self.steps[dec]


def quantile(x: np.ndarray, q: float, *, axis: int) -> np.ndarray:
    """``np.percentile(x, 100 q, axis)`` (linear interpolation) by partial sorting, faster on stacks."""
    n = x.shape[axis]
    pos = q * (n - 1)
    lo, hi = int(np.floor(pos)), int(np.ceil(pos))
    part = np.partition(x, sorted({lo, hi}), axis=axis)
    a = np.take(part, lo, axis=axis)
    b = np.take(part, hi, axis=axis)
    return a + (b - a) * (pos - lo)


def build(candidate: Candidate, requests: Requests, *, policy: str, mode: str, prefill: str = PREFILLS[0]) -> Design:
    """The design of ``candidate`` on ``requests``, read off ``predict`` one basis vector at a time
    (``mode``: the target's batching, ``prefill``: its prefill, as the evaluator predicts)."""
    ctx, tkg = tuple(candidate.ctx_buckets), tuple(candidate.tkg_buckets)
    placeholder = {b: BucketProfile(bucket=b, ttft_s=1.0, tbt_s=1.0, input_len=1, l1=1, l2=2, t1_s=0.0, t2_s=0.0,
                                    repeats=0, spread=0.0) for b in set(ctx) | set(tkg)}
    table = UnitTable.build(candidate, placeholder, policy=policy, prefill=prefill)
    k = len(ctx) + len(tkg)
    n = len(requests)
    ttft = np.zeros((n, len(ctx)))
    e2e = np.zeros((n, k))
    total = np.zeros(k)
    for j in range(k):
        basis = np.zeros(k)
        basis[j] = 1.0
        p = predict(dataclasses.replace(table, ttft_s=basis[:len(ctx)], tbt_s=basis[len(ctx):]), requests, mode=mode)
        e2e[:, j] = p.e2e_s
        total[j] = p.total_s
        if j < len(ctx):
            ttft[:, j] = p.ttft_s
    return Design(batch=candidate.batch, ctx=ctx, tkg=tkg, ttft=ttft, e2e=e2e, total=total,
                  steps=np.asarray(requests.output_len, np.int64) - 1, out_tokens=int(requests.output_len.sum()))


class Designs:
    """Designs of one workload, built once per (batch, bucket sets) as they are asked for."""

    def __init__(self, requests: Requests, *, policy: str, mode: str, prefill: str = PREFILLS[0]):
        self.requests, self.policy, self.mode, self.prefill = requests, policy, mode, prefill
        self._cache: dict[tuple, Design] = {}

    def __call__(self, c: Candidate) -> Design:
        key = (c.batch, tuple(c.ctx_buckets), tuple(c.tkg_buckets))
        d = self._cache.get(key)
        if d is None:
            d = self._cache[key] = build(c, self.requests, policy=self.policy, mode=self.mode, prefill=self.prefill)
        return d
