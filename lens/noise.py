"""Noise of repeated probe runs: the expected time of each probe, and the spread of what is derived from it.

A probe is run ``repeats`` times on a deterministic workload, so its runs differ only by
the host: run-to-run jitter of about a percent, and slow-downs that only ever add time
(a straggling graph call, a garbage-collection pause, another process taking a core).
What a prediction needs is the *expected* cost of a prefill and of a decode step, slow
calls included: a long request pays for its share of them. What makes a profile wrong is
not the noise of T1 and T2 themselves but that of the difference T2 - T1, which the
slope divides by (L2 - L1): 8% on T1 can be 50% on TBT_b.

The estimators below turn the repeats of every probe of one unit into one expected time
per probe. They work on arrays of shape (draws, repeats) so that the bootstrap of
``derived_spread`` evaluates thousands of resamples at once.

Which one lensopt uses (``ESTIMATOR``) was chosen on measured data by
``benchmarks/estimators.py`` (docs/noise.md has its tables): the whole measurement with
each estimator, then a held-out workload run on the device, on (a) the simulated fleet
with 1 straggling call in 50 taking 4x and (b) the command example's straggler mode; and
pools of interleaved repeats of every probe, resampled at 3 and 5 repeats, on those and
on (c) the jax runner on this CPU under a competing busy process, each estimator's
derived TTFT_b / TBT_b compared with those of the pool means (the expected cost). The
reasons are at ``ESTIMATOR``.
"""
from __future__ import annotations

import math
from typing import Callable, Collection, Sequence

import numpy as np

#: one estimator: per-probe arrays (draws, repeats), each probe's class (probes of one class make
#: as many graph calls) and the classes whose excess counts (None: every class; ``counted_classes``)
#: -> (expected times (draws, probes), excess (draws,))
Estimator = Callable[[Sequence[np.ndarray], Sequence[int], Collection[int] | None], tuple[np.ndarray, np.ndarray]]


def _classes(classes: Sequence[int], n: int) -> dict[int, list[int]]:
    """The probes of each class, by position (no classes given: each probe a class of its own)."""
    out: dict[int, list[int]] = {}
    for i, k in enumerate(list(classes) or range(n)):
        out.setdefault(k, []).append(i)
    return out


def _per_probe(f: Callable[[np.ndarray], np.ndarray]) -> Estimator:
    def est(xs: Sequence[np.ndarray], classes: Sequence[int] = (),
            counted: Collection[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        out = np.stack([f(x) for x in xs], axis=1)
        return out, np.zeros(out.shape[0])

    return est


def _trimmed(x: np.ndarray) -> np.ndarray:
    """Mean after dropping the ceil(20%) largest and smallest repeats (3 repeats: the median)."""
    r = x.shape[1]
    k = math.ceil(0.2 * r) if r >= 3 else 0
    return np.sort(x, axis=1)[:, k:r - k].mean(axis=1)


def _pooled_excess(center: Callable[[np.ndarray], np.ndarray]) -> Estimator:
    """A robust centre per probe, plus the unit's expected slow-down over it, pooled over every run.

    The slow-downs a host adds (stragglers, a busy core) are a share of the time spent,
    the same for every probe of a unit; pooling all of a unit's runs estimates that share
    from dozens of runs instead of the few repeats of one probe, and adding it back counts
    the expected cost of slow calls in TTFT_b and TBT_b instead of hiding it.
    """
    def est(xs: Sequence[np.ndarray], classes: Sequence[int] = (),
            counted: Collection[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        c = np.stack([center(x) for x in xs], axis=1)  # (draws, probes)
        over = sum((x - c[:, [i]]).sum(axis=1) for i, x in enumerate(xs))
        base = sum(c[:, i] * x.shape[1] for i, x in enumerate(xs))
        rho = np.maximum(over / base, 0.0)
        return c * (1.0 + rho[:, None]), rho

    return est


def _class_excess(center: Callable[[np.ndarray], np.ndarray]) -> Estimator:
    """A robust centre of each probe, plus the expected slow-down beyond it, pooled over the probes of its class.

    A probe's runs share their graph calls' count with the other probes of the same output
    length (one class): ``batch`` prefills and L - 1 decode steps, whatever the bucket. A
    slow call -- a straggler, a busy core -- adds about the same share of a run's time to
    each of them, and is as likely to lift its median, so the excess of the mean over the
    median is one number per class. Estimated from every run of the class (a dozen or more
    instead of a probe's three), it counts the expected cost of slow calls -- the mean's
    value -- without the mean's noise: a straggler in one of three short runs moves the
    class's excess a little, not the probe's time by a third of it. A class outside
    ``counted`` (an excess that rests on one run: ``counted_classes``) keeps its medians.
    """
    def est(xs: Sequence[np.ndarray], classes: Sequence[int],
            counted: Collection[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        med = np.stack([center(x) for x in xs], axis=1)  # (draws, probes)
        out = np.empty_like(med)
        total_over = np.zeros(med.shape[0])
        total_base = np.zeros(med.shape[0])
        for k, idx in _classes(classes, len(xs)).items():
            base = sum(med[:, i] * xs[i].shape[1] for i in idx)
            over = sum((xs[i] - med[:, [i]]).sum(axis=1) for i in idx) if counted is None or k in counted \
                else np.zeros_like(base)
            rho = over / base
            out[:, idx] = med[:, idx] * (1.0 + rho[:, None])
            total_over += over
            total_base += base
        return out, total_over / total_base

    return est


ESTIMATORS: dict[str, Estimator] = {
    "median": _per_probe(lambda x: np.median(x, axis=1)),
    "mean": _per_probe(lambda x: x.mean(axis=1)),
    "min": _per_probe(lambda x: x.min(axis=1)),
    "trimmed": _per_probe(_trimmed),
    "min+excess": _pooled_excess(lambda x: x.min(axis=1)),
    "median+excess": _pooled_excess(lambda x: np.median(x, axis=1)),
    "median+class": _class_excess(lambda x: np.median(x, axis=1)),
    "min+class": _class_excess(lambda x: x.min(axis=1)),
}
#: The estimator of every profile. Why, from ``benchmarks/estimators.py --quick --sources sim,toy``
#: (the whole measurement, then the workload run; per-request E2E error mean / p90, |throughput
#: error| mean / max, SIMULATED):
#:   sim, 1 call in 50 at 4x:  median 2.0 / 4.1, 2.4 / 4.3;  mean 3.2 / 5.8, 3.1 / 4.1;  min 3.3 / 6.6,
#:   1.1 / 2.0;  median+class 2.1 / 4.4, 1.6 / 2.3  (profiling as it was: 3.7 / 7.5, 6.5 / 10.5)
#:   toy straggler mode:  every estimator about 5.0 / 9.0-10.8 (the toy's own per-request noise);
#:   |throughput error| median 1.4, mean 1.3, min 2.2, median+class 1.2
#: The median is the most robust per request but hides the expected cost of slow calls, which a
#: long workload pays (the throughput error); the mean counts that cost but a straggler in one of
#: three short runs moves a probe by a third of its cost (E2E error 3.2% vs 2.0%); the minimum
#: drops the cost of every slow call and is the worst per request. The median plus its class's
#: excess keeps the median's robustness (2.1%) and counts the cost (throughput error 1.6%, at most
#: 2.3%). On the jax runner under load the pool means beat the medians on derived values (a busy
#: core slows whole runs: the median drops that cost; mean TTFT_b / TBT_b error 23% / 27% against
#: 28% / 32% at 3 repeats) -- the class excess adds that cost back.
#: Rerun with every seed after the slow-run gate (``counted_classes``), the two simulated
#: benchmarks disagree: on ``benchmarks/stragglers.py --estimator NAME`` (32 units, drift on)
#: median+class is the best (E2E 2.65%, |throughput error| at most 2.8% against 4.9-9.4% for the
#: median, mean and trimmed mean); on ``estimators.py`` view A (drift off) it is behind them
#: (|throughput error| mean 2.0% against 1.1-1.4%). It stays; docs/noise.md has both tables.
ESTIMATOR = "median+class"
#: bootstrap resamples behind a derived spread, and their fixed seed (a profile is reproducible)
DRAWS = 400
SEED = 20240611


def expected_times(times: Sequence[Sequence[float]], *, classes: Sequence[int] = (),
                   estimator: str = ESTIMATOR, counted: Collection[int] | None = None) -> tuple[np.ndarray, float]:
    """The expected time of each probe (one list of repeats each) of a unit, and the unit's excess."""
    xs = [np.asarray(t, dtype=float)[None, :] for t in times]
    out, rho = ESTIMATORS[estimator](xs, classes, counted)
    return out[0], float(rho[0])


#: a run is slow when it is this many robust standard deviations (1.4826 x the median absolute deviation
#: of its class's runs from their probes' medians) above its probe's median, and at least SLOW_FLOOR
SLOW_SIGMAS = 5.0
SLOW_FLOOR = 1e-3


def counted_classes(times: Sequence[Sequence[float]], classes: Sequence[int]) -> frozenset[int]:
    """The classes whose excess of the mean over the median counts: two of their runs or more are slow.

    A single slow run among a class's dozens is left out of the estimate: its excess is all
    noise (most resamples of the runs lose it or double it), and the excess is a share of
    the time of every probe of the class. On a device whose prefill is one graph call, one
    straggling call among 30 short runs lifted a class by 19%, which the slopes TBT_b =
    (T2 - T1)/(L2 - L1) then paid for at every bucket (-8% to -38%). The median keeps its
    part of such a run. Slow runs that recur -- a straggler that comes back, a busy core --
    are counted, as is the cost they add.
    """
    out = set()
    for k, idx in _classes(classes, len(times)).items():
        rel = np.concatenate([np.asarray(times[i], float) / np.median(times[i]) - 1.0 for i in idx])
        sigma = 1.4826 * np.median(np.abs(rel))
        if np.count_nonzero(rel > max(SLOW_SIGMAS * sigma, SLOW_FLOOR)) >= 2:
            out.add(k)
    return frozenset(out)


def resample(times: Sequence[Sequence[float]], *, draws: int = DRAWS, seed: int = SEED) -> list[np.ndarray]:
    """``draws`` bootstrap resamples of each probe's repeats: arrays (draws, repeats)."""
    rng = np.random.default_rng(seed)
    out = []
    for t in times:
        a = np.asarray(t, dtype=float)
        out.append(a[rng.integers(0, len(a), size=(draws, len(a)))])
    return out


def bootstrap_times(times: Sequence[Sequence[float]], *, classes: Sequence[int] = (), estimator: str = ESTIMATOR,
                    draws: int = DRAWS, seed: int = SEED, counted: Collection[int] | None = None) -> np.ndarray:
    """Expected times of the probes under ``draws`` resamples of the repeats: (draws, probes)."""
    return ESTIMATORS[estimator](resample(times, draws=draws, seed=seed), classes, counted)[0]


def spread(values: np.ndarray, axis: int = 0) -> np.ndarray:
    """A robust standard deviation: half the central 68% range (one sigma for a normal)."""
    hi, lo = np.percentile(values, [84.135, 15.865], axis=axis)
    return (hi - lo) / 2.0


def rounds_estimate(per_round: Sequence[float], resampled: Sequence[np.ndarray]) -> tuple[float, float]:
    """The mean of per-round estimates and its standard error: the larger of what resampling within each
    round gives (``resampled``: each round's bootstrap draws, aligned) and what the rounds' disagreement gives
    (each call has a speed of its own on a drifting host, which resampling within one call does not see)."""
    d = np.asarray(per_round, dtype=float)
    within = float(spread(np.mean(resampled, axis=0)))
    between = float(d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else 0.0
    return float(d.mean()), max(within, between)


def median_se(runs: np.ndarray, *, draws: int = 400, seed: int = SEED) -> np.ndarray:
    """Per column, the standard error of the median of its rows (its runs), relative to that median.

    ``runs``: (passes, requests) times of the same requests run ``passes`` times. Bootstrapped:
    the robust spread of the median over ``draws`` resamples of the passes. It is the
    measurement's own noise: a prediction cannot be judged closer to a request's median than
    about this. One pass: zeros (nothing to tell the noise from).
    """
    a = np.asarray(runs, dtype=float)
    if a.ndim != 2:
        raise ValueError(f"median_se: runs must be (passes, requests), got shape {a.shape}")
    passes = a.shape[0]
    rng = np.random.default_rng(seed)
    meds = np.median(a[rng.integers(0, passes, size=(draws, passes))], axis=1)  # (draws, requests)
    return spread(meds) / np.median(a, axis=0)


#: the standard error of the median of n normal draws is about sqrt(pi / 2) sigma / sqrt(n)
MEDIAN_SE_FACTOR = math.sqrt(math.pi / 2)


def passes_for(jitter: float, *, target: float, least: int, most: int) -> int:
    """The passes whose per-request medians are uncertain by about ``target`` (a share) on a host
    whose identical runs jitter by ``jitter`` (a relative robust sd), within ``[least, most]``."""
    if not least <= most:
        raise ValueError(f"passes_for: least {least} > most {most}")
    if not math.isfinite(jitter) or jitter <= 0:
        return least
    return max(least, min(most, math.ceil((MEDIAN_SE_FACTOR * jitter / target) ** 2)))
