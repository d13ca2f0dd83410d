"""How far a lone served prompt's TTFT strays from its median: the spread a latency percentile needs.

``lens.serving`` composes one time per request: every prompt of a bucket that finds the
device idle gets the same TTFT (``TTFT_b`` plus the admission offset). A host does not run
them alike. On the jax runner on this 2-core host, lone one-token prompts of bucket 64
(served TTFT 6.6 ms) spread about 0.4 ms between repeats of the same request, cost more after
a longer idle spell (5.8 ms after spells under 50 ms, 7.1-7.5 ms after 0.5 s or more), and
2-7 of 120 per run took 8.5-12.6 ms (slow calls: a garbage collection, another process on a
core). The mean of those is in the profile (``lens.noise`` counts slow calls in ``TTFT_b``);
their spread is not, and a percentile that falls where the composed times leave a gap -- the
top of bucket 64's TTFT, below the riser to bucket 128's -- reads the slow ones: a light
rate's TTFT p90 came out 13-34% under the served one, the prediction at the served p84-p87.

The measurement (``workload``, ``read``, ``solve``): ``ROUNDS`` served calls of ``LONE``
one-token requests with the prompt of the unit's smallest measured bucket, each arriving
when the one before it has long ended, after idle spells cycling through ``SPELLS`` (as a
light rate leaves them). Per call, each request's TTFT less the call's median (a host that
drifts between calls moves the median, not the spread); the calls' residuals pooled, the
profile keeps their quantiles at ``LEVELS`` evenly spaced levels from 0 to 1
(``prefill_tail``) and the calls' median (``prefill_tail_median_s``). A request that arrived before the one ahead of it ended did not run
alone and is left out.

The prediction (``stretches``, ``lens.serving``): the composition runs again ``replicas(n)``
times, each request's prefill stretched in every run by one draw from that distribution as a
fraction of the median the tail was measured about (``median_s``, kept beside the quantiles
as ``prefill_tail_median_s``): the spread grows with the prefill. Measured on this host,
batch 4, two passes per bucket, the residuals' p10 and p90 were -0.5..-0.7 and +0.3..+1.3 ms
in bucket 64 (median 6.7-7.1 ms), -1.8..-4.9 and +3.6..+10.0 ms in buckets 256 and 512
(19.6-52.8 ms): as fractions of the median -8..-15% and +5..+27% in every bucket, where in
seconds bucket 512's p10 was 7-9 times bucket 64's. A slow prefill in a run delays what
queues behind it and stalls the live rows' decode, as it does on a host; the latency
percentiles, means and the SLOs' good fraction are read over every run's requests
(``lens.serving_metrics``). Draws are stratified: over its runs each request draws once from
every ``1/replicas`` of the range, in an order of its own, so no run is all slow. It
applies to every prompt, lone or not: slow calls come whatever the device did before, and
the idle spells in the measurement are a light rate's.

Adding a draw to its own request's times instead (one composition, no queue behind it) was
the reading before; near the knee, where one slow prefill delays the queue, it understated
the spread (``benchmarks/serving_accuracy.py`` prints both).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .types import BucketProfile, Requests

#: lone requests per call: enough to see a tail of a few percent in two calls
LONE = 48
#: calls
ROUNDS = 2
#: the idle spells before the lone requests, cycled (seconds): a light rate leaves spells of tens of
#: milliseconds to about a second
SPELLS = (0.02, 0.06, 0.18, 0.5)
#: the quantile levels kept: 0, 1/100, ..., 1 (about as fine as the ``ROUNDS * LONE`` residuals are many)
LEVELS = 101
#: draws per request when a prediction reads its percentiles over the tail (its most runs), and their seed
DRAWS = 16
SEED = 20261205
#: latencies the runs of a prediction hold together, at least: a short workload runs up to ``DRAWS`` times
SAMPLES = 2000
#: fewest lone requests (after the ones that did not run alone) the tail is read from
LEAST = 24


@dataclass(frozen=True, eq=False)
class PrefillTail:
    """The tail as kept (``quantiles``: seconds from the median at ``LEVELS`` levels), what it was read from,
    and ``note`` (why nothing was measured)."""

    quantiles: tuple[float, ...] = ()
    #: the lone requests read, the median TTFT of the calls (seconds) and their bucket
    n: int = 0
    median_s: float = 0.0
    bucket: int = 0
    note: str = ""

    def said(self) -> str:
        """One line for the profile output."""
        if not self.quantiles:
            return self.note or "not measured"
        q = np.asarray(self.quantiles)

        def at(level: float) -> str:
            v = float(np.interp(level, np.linspace(0.0, 1.0, q.size), q))
            pc = f" ({v / self.median_s * 100:+.1f}%)" if self.median_s > 0 else ""
            return f"{v * 1e3:+.2f} ms{pc}"

        return (f"a lone prompt's TTFT about its median ({self.median_s * 1e3:.2f} ms, bucket {self.bucket}, "
                f"{self.n} requests): p10 {at(0.1)}, p90 {at(0.9)}, p95 {at(0.95)}, max {at(1.0)}; "
                f"each prompt's draws scaled by its own prefill over the median")


def unit_tail(profiles: Sequence[BucketProfile]) -> tuple[tuple[float, ...], float]:
    """A unit's ``prefill_tail`` and ``prefill_tail_median_s`` from its profiles (one measurement gives them all
    the same); ((), 0.0) without."""
    return next(((p.prefill_tail, p.prefill_tail_median_s) for p in profiles if p.prefill_tail), ((), 0.0))


def pick(profiles: Mapping[int, BucketProfile]) -> BucketProfile:
    """The profile whose prompt the lone requests take: the smallest measured bucket's."""
    return profiles[min(profiles)]


def workload(p: BucketProfile, *, lone: int = LONE) -> Requests:
    """``lone`` one-token requests with ``p``'s prompt, each ``SPELLS[i % len]`` after the one before is expected
    to end (its TTFT, with a slack of as much again)."""
    took = 2.0 * max(p.ttft_s, 1e-6)
    gaps = np.array([SPELLS[i % len(SPELLS)] + took for i in range(lone)])
    arrival = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    return Requests(np.full(lone, p.input_len, np.int64), np.ones(lone, np.int64), arrival,
                    name=f"prefill-tail-{p.bucket}")


def read(requests: Requests, ttft_s: Sequence[float]) -> np.ndarray:
    """One call's residuals: each lone request's TTFT less the median of the call's lone ones."""
    ttft = np.asarray(ttft_s, dtype=np.float64)
    arr = np.asarray(requests.arrival_s, dtype=np.float64)
    end = arr + ttft
    alone = np.ones(ttft.size, bool)
    alone[1:] = arr[1:] >= end[:-1]
    x = ttft[alone & np.isfinite(ttft)]
    return x - np.median(x) if x.size else x


def solve(rounds: Sequence[np.ndarray], *, p: BucketProfile, medians: Sequence[float] = (),
          levels: int = LEVELS) -> PrefillTail:
    """The kept quantiles of the pooled residuals of ``rounds``; none (with the reason) under ``LEAST``."""
    x = np.concatenate([np.asarray(r, dtype=np.float64) for r in rounds]) if rounds else np.zeros(0)
    med = float(np.median(medians)) if len(medians) else 0.0
    if x.size < LEAST:
        return PrefillTail(n=int(x.size), median_s=med, bucket=p.bucket,
                           note=f"not measured: {x.size} lone requests ran alone, fewer than {LEAST}")
    # each a residual measured, so non-decreasing as they come
    q = np.quantile(x, np.linspace(0.0, 1.0, levels), method="inverted_cdf")
    return PrefillTail(tuple(float(v) for v in q), n=int(x.size), median_s=med, bucket=p.bucket)


def replicas(n: int) -> int:
    """How many runs a prediction of ``n`` requests reads the tail over: about ``SAMPLES`` latencies, 1 to ``DRAWS``."""
    return max(1, min(DRAWS, -(-SAMPLES // max(n, 1))))


def draws(prefill_s: np.ndarray, tail: Sequence[float], median_s: float = 0.0, *, n: int = DRAWS,
          seed: int = SEED) -> np.ndarray:
    """``n`` draws per request from ``tail``'s distribution, seconds to add to its prefill: shape (requests, n); the
    kept quantiles read as steps (a level ``u`` takes the quantile of the level at or below it) at stratified
    levels (every request gets the whole range, column ``j`` a stratum of its own order, so no column is all
    slow), each scaled by the request's ``prefill_s`` over ``median_s`` (0: the tail's seconds as they are). No
    tail: zeros.

    Steps, not a line between levels: a line from the level below the max to the max spreads one slow call over
    a whole level's mass at half its excess, and from a type-7 quantile at 21 levels one stalled call in 96 came
    to 5% of the draws and 2.4 times its mean. The max itself (the last level) is the bound, not drawn."""
    pre = np.asarray(prefill_s, dtype=np.float64)
    q = np.asarray(tail, dtype=np.float64)
    if q.size < 2:
        return np.zeros((pre.size, n))
    rng = np.random.default_rng(seed)
    strata = rng.permuted(np.broadcast_to(np.arange(n), (pre.size, n)), axis=1)
    u = (strata + rng.random((pre.size, n))) / n  # one draw in each n-th of the range
    scale = pre[:, None] / median_s if median_s > 0 else 1.0
    return q[(u * (q.size - 1)).astype(np.int64)] * scale


def stretches(prefill_s: np.ndarray, tail: Sequence[float], median_s: float = 0.0, *, n: int = DRAWS,
              seed: int = SEED) -> np.ndarray:
    """``draws`` as fractions of each request's ``prefill_s`` (a prefill of p seconds takes p (1 + s))."""
    pre = np.asarray(prefill_s, dtype=np.float64)
    d = draws(pre, tail, median_s, n=n, seed=seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(pre[:, None] > 0, d / pre[:, None], 0.0)
