"""The physical prior: TTFT_b and TBT_b of units not measured yet, with an honest uncertainty.

One model is fitted across every measured unit of one target (pure numpy):

- **prefill** of one prompt in bucket b (TTFT_b):
  ``roofline(FLOPs, bytes) / tp + communication + fixed + per-call / batch``, where FLOPs
  = 2 N b + 4 h L pairs (N matmul weights, h hidden, L layers, pairs the attention's
  query-key pairs) and bytes = weights + b (KV + activations);
- **decode** step of the whole batch in bucket b (TBT_b):
  ``roofline(FLOPs, weights + batch x KV(context)) / tp + communication + fixed + per-row x batch``.

``roofline(F, M) = max(F, rho M) + kappa min(F, rho M)`` in FLOP units, ``rho`` (the
machine balance: FLOP/s per byte/s) and ``kappa`` (how imperfectly compute and memory
overlap) chosen on a grid, and so are the stack's choices no spec sheet gives: which
attention pairs the prefill kernel computes (the whole padded bucket, the real prompt's
keys, or the real prompt only) and which context a decode step reads (the bucket's whole
cache or the pages it holds). Communication is two all-reduces per layer: a latency per
ring hop and the bytes they move. The remaining coefficients are non-negative, fitted by
least squares on relative errors.

Its uncertainty is measured, not assumed: every measured unit is left out in turn and
predicted by the model fitted on the others. The spread of those residuals splits into a
part shared by all buckets of a unit (``unit_sd``: what the model gets wrong about tp and
batch) and a part per bucket (``bucket_sd``): the per-shape quirks of the compiler, which
no model of FLOPs and bytes can know, and measurement noise. Both are shrunk toward
stated defaults with the weight of one unit, so a few lucky units do not make the prior
overconfident, and a unit whose tp no measured unit shares, or whose batch lies outside
the measured ones, gets the larger spread of the units that were themselves such
extrapolations when left out.

A partly measured unit is conditioned on its own buckets: their residuals estimate its
shared offset, so its other buckets are predicted with the per-bucket spread only.

With the target's ``prefill = "batched"``, TTFT_b is one call of the whole batch: the
model is fitted on its share per row (TTFT_b / batch) and multiplies it back.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from lens.probes import plan_probes
from lens.types import DTYPE_BYTES, PREFILLS, BucketProfile, ModelShape

Unit = tuple[int, int]
Measured = Mapping[Unit, Mapping[int, BucketProfile]]

#: log-scale spreads used before the data can say, and the weight (in units) they keep after
DEFAULT_UNIT_SD = 0.5
DEFAULT_BUCKET_SD = 0.15
DEFAULT_WEIGHT = 0.25
#: grids of the roofline's machine balance (FLOP per byte) and overlap loss
RHO_GRID = np.concatenate([[1e-3], np.logspace(0, 4, 17), [1e7]])
#: forms whose error is within this share of the best are as good as it; the tie goes to the
#: physically expected one (decode reads memory: the largest balance)
TIE = 0.02
KAPPA_GRID = (0.0, 0.25, 1.0)
#: prefill attention pairs: padded bucket, real keys of a padded prompt, real prompt only
PAIRS = ("padded", "keys", "ragged")
#: decode context read: the bucket's whole cache, or the pages the rows hold
DECODE_CONTEXT = ("bucket", "real")


def nnls(a: np.ndarray, y: np.ndarray, *, iters: int = 60) -> np.ndarray:
    """min ||a x - y|| subject to x >= 0 (Lawson and Hanson's active set method)."""
    n = a.shape[1]
    x = np.linalg.lstsq(a, y, rcond=None)[0]
    if (x >= 0).all():
        return x
    x = np.zeros(n)
    passive = np.zeros(n, bool)
    w = a.T @ (y - a @ x)
    for _ in range(iters):
        if passive.all() or w[~passive].max(initial=0.0) <= 1e-12 * (np.abs(w).max() + 1e-300):
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], y, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
            if not passive.any():
                break
        w = a.T @ (y - a @ x)
    return x


@dataclass(frozen=True)
class Rows:
    """Measured (unit, bucket) numbers and what the model needs to know of each."""

    tp: np.ndarray
    batch: np.ndarray
    bucket: np.ndarray
    input_len: np.ndarray
    l2: np.ndarray
    ttft: np.ndarray
    tbt: np.ndarray

    def take(self, mask: np.ndarray) -> "Rows":
        return Rows(*(getattr(self, f)[mask] for f in self.__dataclass_fields__))

    def units(self) -> np.ndarray:
        return self.tp * 100_000 + self.batch


@dataclass(frozen=True)
class _Form:
    """One point of the grid: which roofline and which stack choices."""

    rho: float
    kappa: float
    variant: str


@dataclass(frozen=True)
class Fit:
    """The fitted model of one phase and its measured uncertainty."""

    form: _Form
    coef: np.ndarray
    unit_sd: float
    bucket_sd: float
    #: the unit spread of units that were extrapolations when left out (a tp no other
    #: measured unit shared, or a batch outside the others' range)
    far_sd: float
    tps: frozenset
    batches: tuple[float, float]

    def far(self, tp: int, batch: int) -> bool:
        """Whether the unit is an extrapolation from the measured units."""
        return tp not in self.tps or not self.batches[0] <= batch <= self.batches[1]


@dataclass(frozen=True)
class UnitBelief:
    """What the prior believes about one unit's TTFT_b and TBT_b, bucket by bucket.

    ``log_ttft``/``log_tbt`` are log-medians (the measured value where ``measured``); an
    unmeasured bucket's log number is its median plus a shift shared by the unit's
    unmeasured buckets (sd ``shared_sd``) plus its own (sd ``bucket_sd``), per phase.
    """

    tp: int
    batch: int
    buckets: tuple[int, ...]
    log_ttft: np.ndarray
    log_tbt: np.ndarray
    measured: np.ndarray
    shared_sd: tuple[float, float]
    bucket_sd: tuple[float, float]

    def median(self) -> tuple[np.ndarray, np.ndarray]:
        return np.exp(self.log_ttft), np.exp(self.log_tbt)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` draws of (TTFT_b, TBT_b) over the buckets: (n, K) each."""
        out = []
        free = ~self.measured
        for log, shared, own in ((self.log_ttft, self.shared_sd[0], self.bucket_sd[0]),
                                 (self.log_tbt, self.shared_sd[1], self.bucket_sd[1])):
            z = rng.standard_normal((n, 1)) * shared + rng.standard_normal((n, len(log))) * own
            out.append(np.exp(log[None, :] + np.where(free[None, :], z, 0.0)))
        return out[0], out[1]


class PhysicalPrior:
    """The fitted physical model of one target (see the module docstring)."""

    name = "estimate:physical"

    def __init__(self, model: ModelShape, dtype: str, *, buckets: Sequence[int], policy: str, max_output: int,
                 prefill: str = PREFILLS[0]):
        self.model, self.dtype = model, dtype
        #: TTFT_b is of one prompt, or of a batched call (then fitted per row)
        self.batched = prefill == "batched"
        self.buckets = tuple(sorted(buckets))
        probes = plan_probes(self.buckets, policy=policy, max_output=max_output, repeats=1)
        self._probe = {p.bucket: p for p in probes if p.output_len == max(q.output_len for q in probes
                                                                           if q.bucket == p.bucket)}
        e = DTYPE_BYTES.get(dtype, 2)
        m = model
        self.e = e
        self.head = float(m.vocab * m.hidden)
        self.matmul = float(m.param_count() - m.vocab * m.hidden)  # the embedding lookup is no matmul
        self.weights = float(m.param_count() * e)
        self.kv_token = 2.0 * m.layers * m.kv_heads * m.head_dim * e
        self._fits: dict[tuple, tuple[Fit, Fit] | None] = {}

    # -- physics -------------------------------------------------------------------------------
    def _comm(self, tp: np.ndarray, rows_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Two all-reduces per layer: ring hops and bytes moved per device."""
        m, many = self.model, tp > 1
        hops = np.where(many, 2.0 * m.layers * 2 * (tp - 1), 0.0)
        nbytes = np.where(many, 2.0 * m.layers * 2 * (tp - 1) / tp * rows_tokens * m.hidden * self.e, 0.0)
        return hops, nbytes

    def _prefill(self, r: Rows, form: _Form) -> np.ndarray:
        b, l = r.bucket.astype(float), r.input_len.astype(float)
        pairs = {"padded": b * b / 2, "keys": l * b - l * l / 2, "ragged": l * l / 2}[form.variant]
        flops = 2.0 * self.matmul * b + 4.0 * self.model.hidden * self.model.layers * pairs
        nbytes = self.weights + b * (self.kv_token + 4.0 * self.model.hidden * self.e * self.model.layers)
        hops, comm = self._comm(r.tp, b)
        return np.column_stack([_roof(flops, nbytes, form) / r.tp, hops, comm, np.ones_like(b), 1.0 / r.batch])

    def _decode(self, r: Rows, form: _Form) -> np.ndarray:
        b, B = r.bucket.astype(float), r.batch.astype(float)
        ctx = b if form.variant == "bucket" else r.input_len + r.l2 / 2.0
        flops = 2.0 * (self.matmul + self.head) * B + 4.0 * self.model.hidden * self.model.layers * B * ctx
        nbytes = self.weights + B * self.kv_token * ctx
        hops, comm = self._comm(r.tp, B)
        return np.column_stack([_roof(flops, nbytes, form) / r.tp, hops, comm, np.ones_like(b), B])

    # -- data ----------------------------------------------------------------------------------
    def rows(self, measured: Measured) -> Rows:
        items = [(tp, b, p) for (tp, b), prof in sorted(measured.items()) for p in prof.values()
                 if p.ttft_s > 0 and p.tbt_s > 0]
        return Rows(tp=np.array([i[0] for i in items], float), batch=np.array([i[1] for i in items], float),
                    bucket=np.array([i[2].bucket for i in items], float),
                    input_len=np.array([i[2].input_len for i in items], float),
                    l2=np.array([i[2].l2 for i in items], float),
                    ttft=np.array([i[2].ttft_s / self._rows(i[1]) for i in items]),
                    tbt=np.array([i[2].tbt_s for i in items]))

    def _rows(self, batch: int) -> int:
        """Prompts one TTFT_b covers."""
        return batch if self.batched else 1

    def grid_rows(self, tp: int, batch: int) -> Rows:
        """The space's buckets of one unit, as the probes would measure them."""
        k = len(self.buckets)
        return Rows(tp=np.full(k, float(tp)), batch=np.full(k, float(batch)), bucket=np.array(self.buckets, float),
                    input_len=np.array([self._probe[b].input_len for b in self.buckets], float),
                    l2=np.array([self._probe[b].output_len for b in self.buckets], float),
                    ttft=np.ones(k), tbt=np.ones(k))

    # -- fitting -------------------------------------------------------------------------------
    def fit(self, measured: Measured) -> tuple[Fit, Fit] | None:
        """The (prefill, decode) fits on ``measured``; None when nothing is measured."""
        key = tuple(sorted((u, b, p.ttft_s, p.tbt_s) for u, prof in measured.items() for b, p in prof.items()))
        if key not in self._fits:
            r = self.rows(measured)
            self._fits[key] = None if not len(r.ttft) else (
                self._fit_phase(r, r.ttft, self._prefill, PAIRS, memory_bound=False),
                self._fit_phase(r, r.tbt, self._decode, DECODE_CONTEXT, memory_bound=True))
        return self._fits[key]

    def _fit_phase(self, r: Rows, y: np.ndarray, features, variants, *, memory_bound: bool) -> Fit:
        tried = []
        for rho, kappa, variant in itertools.product(RHO_GRID, KAPPA_GRID, variants):
            form = _Form(float(rho), kappa, variant)
            coef, err = _solve(features(r, form), y)
            tried.append((err, form, coef))
        least = min(t[0] for t in tried)
        # one unit cannot tell a compute-bound decode from a memory-bound one (both grow
        # with the bucket): among the forms that fit as well, a decode step reads memory
        good = [t for t in tried if t[0] <= least * (1 + TIE) + 1e-12]
        _, form, coef = max(good, key=lambda t: t[1].rho) if memory_bound else min(good, key=lambda t: t[0])
        unit_sd, bucket_sd, far_sd = self._loo(r, y, features, form)
        return Fit(form, coef, unit_sd, bucket_sd, far_sd, frozenset(r.tp.tolist()),
                   (float(r.batch.min()), float(r.batch.max())))

    def _loo(self, r: Rows, y: np.ndarray, features, form: _Form) -> tuple[float, float, float]:
        """Leave-one-unit-out residuals, split into a shared and a per-bucket spread."""
        units = r.units()
        means, far, dev = [], [], []
        for u in np.unique(units):
            out = units == u
            if out.all():
                break
            coef, _ = _solve(features(r.take(~out), form), y[~out])
            pred = features(r.take(out), form) @ coef
            res = np.log(y[out] / np.maximum(pred, 1e-30))
            means.append(res.mean())
            dev.extend(res - res.mean())
            rest = r.batch[~out]
            if r.tp[out][0] not in set(r.tp[~out].tolist()) or not rest.min() <= r.batch[out][0] <= rest.max():
                far.append(res.mean())
        unit_sd = _shrunk(means, DEFAULT_UNIT_SD)
        bucket_sd = _shrunk(dev, DEFAULT_BUCKET_SD)
        return unit_sd, bucket_sd, max(unit_sd, _shrunk(far, DEFAULT_UNIT_SD))

    # -- predicting ----------------------------------------------------------------------------
    def belief(self, tp: int, batch: int, measured: Measured) -> UnitBelief | None:
        """The unit's buckets: measured ones as measured, the others with their spread."""
        fits = self.fit(measured)
        if fits is None:
            return None
        grid = self.grid_rows(tp, batch)
        own = measured.get((tp, batch), {})
        have = np.array([b in own for b in self.buckets])
        logs, shared, per_bucket = [], [], []
        for fit, features, attr in ((fits[0], self._prefill, "ttft_s"), (fits[1], self._decode, "tbt_s")):
            log = np.log(np.maximum(features(grid, fit.form) @ fit.coef, 1e-30))
            unit_sd = fit.far_sd if fit.far(tp, batch) else fit.unit_sd
            sd = unit_sd
            if have.any():
                per = self._rows(batch) if attr == "ttft_s" else 1
                got = np.log([max(getattr(own[b], attr) / per, 1e-30) for b in self.buckets if b in own])
                res = got - log[have]
                # the unit's shift, estimated from its own buckets (normal prior, normal noise)
                prec = len(res) / fit.bucket_sd ** 2 + 1.0 / unit_sd ** 2
                shift = res.sum() / fit.bucket_sd ** 2 / prec
                log = np.where(have, 0.0, log + shift)
                log[have] = got
                sd = float(np.sqrt(1.0 / prec))
            logs.append(log)
            shared.append(float(sd))
            per_bucket.append(fit.bucket_sd)
        return UnitBelief(tp=tp, batch=batch, buckets=self.buckets, log_ttft=logs[0] + np.log(self._rows(batch)),
                          log_tbt=logs[1], measured=have,
                          shared_sd=(shared[0], shared[1]), bucket_sd=(per_bucket[0], per_bucket[1]))

    def estimate(self, tp: int, batch: int, buckets: Sequence[int], measured: Measured) -> dict[int, BucketProfile] | None:
        """Median TTFT_b and TBT_b of ``buckets`` of the unit (the evaluator's prior interface)."""
        bel = self.belief(tp, batch, measured)
        if bel is None:
            return None
        ttft, tbt = bel.median()
        out = {}
        calls = 1 if self.batched else batch  # prefill calls in one probe run
        for b in buckets:
            if b not in self.buckets:
                return None
            i, p = self.buckets.index(b), self._probe[b]
            out[b] = BucketProfile(bucket=b, ttft_s=float(ttft[i]), tbt_s=float(tbt[i]), input_len=p.input_len,
                                   l1=1, l2=p.output_len, t1_s=float(calls * ttft[i]),
                                   t2_s=float(calls * ttft[i] + (p.output_len - 1) * tbt[i]), repeats=0, spread=0.0,
                                   source=self.name)
        return out


def _roof(flops: np.ndarray, nbytes: np.ndarray, form: _Form) -> np.ndarray:
    m = form.rho * nbytes
    return np.maximum(flops, m) + form.kappa * np.minimum(flops, m)


def _solve(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Non-negative coefficients minimising the squared *relative* error; and that error."""
    a = x / y[:, None]
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    # a whisper of ridge: columns the data cannot tell apart (one batch size: fixed vs per-call)
    # share their weight instead of one taking all of it by chance
    ridge = 1e-6 * np.eye(a.shape[1])
    coef = nnls(np.vstack([a / scale, ridge]), np.concatenate([np.ones(len(y)), np.zeros(a.shape[1])])) / scale
    err = float(np.sum((a @ coef - 1.0) ** 2))
    return coef, err


def _shrunk(residuals: Sequence[float], default: float) -> float:
    """RMS of ``residuals`` with ``default`` counted as ``DEFAULT_WEIGHT`` more observations."""
    r = np.asarray(residuals, float)
    return float(np.sqrt((DEFAULT_WEIGHT * default ** 2 + np.sum(r ** 2)) / (DEFAULT_WEIGHT + r.size)))
