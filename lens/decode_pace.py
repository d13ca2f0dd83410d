"""How a served decode's pace wanders in time: the spread a TPOT percentile needs.

``lens.serving`` composes each decode step at its bucket's TBT_b: every request that decodes
the same steps gets the same TPOT. A shared host does not run them alike. On the jax runner
on this 2-core host, lone requests decoding 48 steps one after another (bucket 64's prompt,
about 80 ms of decode each, 50 ms apart) took 0.85-0.88 x to 1.15-1.27 x their call's mean
decode seconds at p10 and p90, and the pace of one request carried over to the next (lag-one
autocorrelation 0.4-0.5 at 0.17 s apart): the host's speed wanders over tenths of a second
to seconds, a few steps of a slow call would not (a step is 1.6-2 ms). In served runs at
0.15 and 0.5 x saturation a request's TPOT measured over its composed one spread alike (log
standard deviation 11-19% within a run), with a lag-one autocorrelation of 0.4-0.75 between
requests in arrival order, whatever its number of steps, and no request was slow in every
repeat: the served TPOT p90 came out 11-18% over the composed one while its median agreed.
The profile holds the decode's mean (TBT_b from static runs); its wander is not there.

The measurement (``workload``, ``read``, ``solve``): ``ROUNDS`` served calls of ``LONE``
requests, each decoding ``STEPS`` steps (or as many as the largest bucket holds) after the
prompt of the unit's smallest measured bucket, each arriving ``GAP_S`` after the one before it
is expected to end. Per call, each lone request's decode seconds (its E2E less its TTFT) over the call's mean, less one: its
pace about the call's (a host that drifts between calls moves the mean, not the wander). The
residuals of the calls pooled, the profile keeps their quantiles at ``LEVELS`` evenly spaced
levels (``decode_pace``); the median decode seconds, the window each residual averages the
pace over (``decode_pace_window_s``); and how fast the pace forgets, ``tau`` in
``exp(-lag / tau)`` from the residuals' lag-one autocorrelation between neighbouring requests
at their median spacing (``decode_pace_tau_s``; 0: no correlation seen). A request that
arrived before the one ahead of it ended did not run alone and is left out, and a pair with
one left out is not a neighbour.

The prediction (``Pace``, ``lens.serving``): in each of the runs the prefill tail already
asks for (``lens.prefill_tail.replicas``), the device's pace is a path over the run's clock,
constant over cells of the measured window: a Gaussian AR(1) sequence with the measured
correlation between neighbouring cells, ``exp(-window / tau)``, its ranks read as evenly
spaced levels of the kept quantiles (so each run's cells take the measured distribution as a
whole, and only their order is drawn). A cell's factor is the wall seconds one composed
second takes in it. Every decode run of the machine (steps with a fixed live set, and the
resume cost before them) ends when the path has done its composed seconds (``Pace.work``,
``Pace.wall``), and an arrival during it is counted in the path's work too, so the admission
still lands on the first step boundary after it. (Scaling a run by the path's mean over its
composed seconds instead let a run stopped for an arrival end well after it.) Residuals
about the call's mean, not its median, and the factors scaled so that the path does one
composed second per wall second on average: the profile's TBT_b is an uninterrupted decode's
mean, so the paths keep it and spread it; the throughput moves only where a slow spell
stalls a queue. The pace applies to the decode alone; the prefill's own spread is the
prefill tail's (measured the same way, on one-token requests).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .buckets import max_length
# the quantile levels kept, and the fewest lone requests read: as the prefill tail's
from .prefill_tail import LEAST, LEVELS
from .types import BucketProfile, Requests

#: lone requests per call and the decode steps each runs: a window of a few tens of milliseconds on a CPU
LONE = 48
STEPS = 48
#: the fewest steps a lone request decodes (a window that short reads the resume transient more than the pace)
FEWEST = 8
#: calls
ROUNDS = 2
#: idle seconds between one lone request's expected end and the next one's arrival (beyond a slack of half its
#: expected time): short, so the calls sample the pace densely in time
GAP_S = 0.05
#: the largest neighbour correlation kept (a path that never forgets is a drift, which the drift check handles)
RHO_MAX = 0.95
#: the most cells of a path (a long trace's path is coarser than the window beyond it)
CELLS_MAX = 200_000
SEED = 20261206


@dataclass(frozen=True, eq=False)
class DecodePace:
    """The wander as kept (``quantiles``: a lone decode's seconds over its call's mean, less one, at ``LEVELS``
    levels; ``window_s``; ``tau_s``), what it was read from, and ``note`` (why nothing was measured)."""

    quantiles: tuple[float, ...] = ()
    window_s: float = 0.0
    tau_s: float = 0.0
    #: the lone requests read, their neighbour correlation and spacing (seconds), and the bucket of their prompt
    n: int = 0
    rho: float = 0.0
    spacing_s: float = 0.0
    bucket: int = 0
    note: str = ""

    def said(self) -> str:
        """One line for the profile output."""
        if not self.quantiles:
            return self.note or "not measured"
        q = np.asarray(self.quantiles)

        def at(level: float) -> str:
            return f"{q[int(level * (q.size - 1))] * 100:+.1f}%"

        tau = f"forgets in {self.tau_s * 1e3:.0f} ms" if self.tau_s > 0 else "no correlation seen"
        return (f"a lone decode's pace about its call's mean ({self.n} requests of {self.window_s * 1e3:.1f} ms, "
                f"bucket {self.bucket} prompt): p10 {at(0.1)}, p50 {at(0.5)}, p90 {at(0.9)}, max {at(1.0)}; "
                f"neighbours {self.spacing_s * 1e3:.0f} ms apart correlate {self.rho:.2f}: {tau}")


def unit_pace(profiles: Sequence[BucketProfile]) -> tuple[tuple[float, ...], float, float]:
    """A unit's ``decode_pace``, ``decode_pace_window_s`` and ``decode_pace_tau_s`` from its profiles (one
    measurement gives them all the same); ((), 0.0, 0.0) without."""
    return next(((p.decode_pace, p.decode_pace_window_s, p.decode_pace_tau_s) for p in profiles if p.decode_pace),
                ((), 0.0, 0.0))


def steps_for(p: BucketProfile, buckets: Sequence[int]) -> int | None:
    """The decode steps a lone request with ``p``'s prompt runs: ``STEPS``, or as many as the largest of
    ``buckets`` holds after the prompt; None under ``FEWEST``."""
    steps = min(STEPS, max_length(sorted(buckets)) - p.input_len)
    return steps if steps >= FEWEST else None


def workload(p: BucketProfile, *, lone: int = LONE, steps: int = STEPS) -> Requests:
    """``lone`` requests with ``p``'s prompt, each decoding ``steps`` steps, each ``GAP_S`` after the one before
    is expected to end (with a slack of half its expected time)."""
    took = 1.5 * max(p.ttft_s + steps * p.tbt_s, 1e-6)
    arrival = np.arange(lone, dtype=np.float64) * (GAP_S + took)
    return Requests(np.full(lone, p.input_len, np.int64), np.full(lone, steps + 1, np.int64), arrival,
                    name=f"decode-pace-{p.bucket}")


@dataclass(frozen=True)
class Call:
    """One call's lone requests: each one's pace residual, and which ones are neighbours (the one before ran
    alone too) with their arrivals' spacing."""

    residual: np.ndarray
    decode_s: np.ndarray
    follows: np.ndarray  # bool: request i's predecessor in the call is request i - 1 of ``residual``
    spacing_s: np.ndarray  # seconds from the predecessor's arrival (nan: none)


def read(requests: Requests, ttft_s: Sequence[float], e2e_s: Sequence[float]) -> Call:
    """One call's lone requests' decode seconds over their mean, less one."""
    ttft = np.asarray(ttft_s, dtype=np.float64)
    e2e = np.asarray(e2e_s, dtype=np.float64)
    arr = np.asarray(requests.arrival_s, dtype=np.float64)
    alone = np.ones(ttft.size, bool)
    alone[1:] = arr[1:] >= arr[:-1] + e2e[:-1]
    alone &= np.isfinite(e2e) & np.isfinite(ttft)
    decode = e2e - ttft
    idx = np.flatnonzero(alone & (decode > 0))
    d = decode[idx]
    resid = d / d.mean() - 1.0 if d.size else d
    follows = np.zeros(idx.size, bool)
    follows[1:] = np.diff(idx) == 1
    spacing = np.full(idx.size, np.nan)
    spacing[1:] = np.where(follows[1:], arr[idx[1:]] - arr[idx[:-1]], np.nan)
    return Call(resid, d, follows, spacing)


def solve(calls: Sequence[Call], *, p: BucketProfile, levels: int = LEVELS) -> DecodePace:
    """The kept quantiles, window and correlation time of ``calls``; none (with the reason) under ``LEAST``."""
    x = np.concatenate([c.residual for c in calls]) if calls else np.zeros(0)
    if x.size < LEAST:
        return DecodePace(n=int(x.size), bucket=p.bucket,
                          note=f"not measured: {x.size} lone requests ran alone, fewer than {LEAST}")
    q = np.quantile(x, np.linspace(0.0, 1.0, levels), method="inverted_cdf")
    window = float(np.median(np.concatenate([c.decode_s for c in calls])))
    # lag-one autocorrelation, pooled over the calls (each call's residuals are about its own mean)
    num = sum(float((c.residual[1:] * c.residual[:-1])[c.follows[1:]].sum()) for c in calls)
    den = sum(float((c.residual ** 2).sum()) for c in calls)
    rho = min(num / den, RHO_MAX) if den > 0 else 0.0
    gaps = np.concatenate([c.spacing_s[np.isfinite(c.spacing_s)] for c in calls])
    spacing = float(np.median(gaps)) if gaps.size else 0.0
    tau = -spacing / math.log(rho) if rho > 0 and spacing > 0 else 0.0
    return DecodePace(tuple(float(v) for v in q), window_s=window, tau_s=tau, n=int(x.size), rho=float(rho),
                      spacing_s=spacing, bucket=p.bucket)


@dataclass(frozen=True, eq=False)
class Pace:
    """One run's path of the device's pace: the wall seconds one composed second takes (``factor``), per cell of
    ``cell_s`` wall seconds from the run's start (cells past the last repeat from the first), and the composed
    seconds done by each cell's start, in cells (``done[k]``: the sum of 1 / factor over cells 0..k-1)."""

    cell_s: float
    factor: list[float]
    done: list[float]

    def work(self, t: float) -> float:
        """The composed seconds the device has done by wall time ``t`` (>= 0)."""
        n = len(self.factor)
        k, rest = divmod(t / self.cell_s, 1.0)
        laps, k = divmod(int(k), n)
        return (laps * self.done[n] + self.done[k] + rest / self.factor[k]) * self.cell_s

    def wall(self, w: float) -> float:
        """The wall time by which the device has done ``w`` composed seconds (the inverse of ``work``)."""
        n = len(self.factor)
        laps, rest = divmod(w / self.cell_s, self.done[n])
        k = min(bisect.bisect_right(self.done, rest) - 1, n - 1)
        return (laps * n + k + (rest - self.done[k]) * self.factor[k]) * self.cell_s


def paths(quantiles: Sequence[float], window_s: float, tau_s: float, horizon_s: float, runs: int, *,
          seed: int = SEED) -> list[Pace]:
    """``runs`` paths over ``horizon_s`` seconds (``Pace``); none without a measured wander."""
    q = np.asarray(quantiles, dtype=np.float64)
    if q.size < 2 or window_s <= 0 or runs < 1:
        return []
    cells = int(min(max(math.ceil(horizon_s / window_s), 1), CELLS_MAX))
    cell = max(window_s, horizon_s / cells)
    a = math.exp(-cell / tau_s) if tau_s > 0 else 0.0
    rng = np.random.default_rng(seed)
    z = _ar1(rng.standard_normal((runs, cells)), a)
    # each run's cells take the levels in the order of their z: the whole distribution, stratified
    order = np.argsort(z, axis=1)
    rank = np.empty_like(order)  # the inverse of each row's order (what argsort of it gives, without the sort)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(cells), order.shape), axis=1)
    u = (rank + 0.5) / cells
    f = 1.0 + q[(u * (q.size - 1)).astype(np.int64)]
    # a device that decodes without a pause does its composed seconds in as many wall seconds (the profile's
    # TBT_b is such a decode's mean): the cells' work, 1 / factor each, averages one
    f *= (1.0 / f).mean(axis=1, keepdims=True)
    done = np.concatenate([np.zeros((runs, 1)), np.cumsum(1.0 / f, axis=1)], axis=1)
    return [Pace(cell, f[j].tolist(), done[j].tolist()) for j in range(runs)]


def _ar1(eps: np.ndarray, a: float) -> np.ndarray:
    """z[:, k] = a z[:, k - 1] + sqrt(1 - a^2) eps[:, k], z[:, 0] = eps[:, 0]: a stationary AR(1) along axis 1.

    In blocks short enough that a^-k stays finite: within one, z_k = a^k (z_0 + s sum_j a^-j eps_j)."""
    if a < 1e-6:
        return eps.copy()
    s = math.sqrt(1.0 - a * a)
    block = max(1, int(27.0 / -math.log(a)))  # a^-block <= e^27
    z = np.empty_like(eps)
    z[:, 0] = eps[:, 0]
    start = 1
    while start < eps.shape[1]:
        end = min(start + block, eps.shape[1])
        k = np.arange(1, end - start + 1, dtype=np.float64)
        up = a ** -k
        z[:, start:end] = (a ** k) * (z[:, start - 1:start] + s * np.cumsum(eps[:, start:end] * up, axis=1))
        start = end
    return z
