"""Host drift: is the host as fast now as when it profiled?

A measurement made minutes or days after a profile meets a host that may have changed
(CPU frequency, thermal state, a neighbour on a shared VM, another process). Its error
against a prediction is then drift, not model error. Before a measurement, one probe of
the profile -- the *reference probe* -- is run again; ``host_drift`` is the median of its
times now over the median of its repeats in the cached profile: 1.0 is an unchanged host,
1.10 one 10% slower. Medians on both sides: a host that got slower moves every run, while
a straggler in one of a few runs would move a mean by a share of a third; and the same
statistic on both sides compares like with like (the profile's expected time adds a
slow-call excess that a few runs now cannot estimate). A prediction corrected for drift
is the prediction times ``host_drift`` (latencies) or divided by it (throughputs).

A shared host's speed wanders over seconds, not only over minutes: on a 2-core VM a fixed
kernel's run-to-run spread is 6-8% (docs/noise.md). So the reference probe is run on both
sides of the measurement (its repeats split before and after the workload: the drift is
the host's speed over the measurement's own window, not at its start), and the drift
carries its own noise (``Drift.err``, bootstrapped over the repeats of both sides). A drift
inside its noise says nothing: ``Drift.significant`` tells when re-scaling a prediction by
it corrects more than it adds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .buckets import select_index
from .noise import DRAWS, SEED, spread
from .types import BucketProfile, Probe


#: the fewest repeats of the reference probe: the drift's own noise stays well under the drifts worth telling
REFERENCE_REPEATS = 5


@dataclass(frozen=True)
class Reference:
    """The probe run again to measure drift, and the median of its repeats in the cached profile."""

    probe: Probe
    cached_s: float
    #: the reference's repeats in the profile (empty for a profile stored without its raw runs)
    cached_times_s: tuple[float, ...] = ()


@dataclass(frozen=True)
class Drift:
    """``host_drift`` and its noise: one standard error, from the repeats of both sides."""

    value: float
    err: float

    def significant(self, tolerance: float) -> bool:
        """True when the host moved by more than ``tolerance`` and by more than twice the drift's own noise."""
        return abs(self.value - 1.0) > max(tolerance, 2.0 * self.err)


def reference_probe(profiles: Mapping[int, BucketProfile], input_len: Sequence[int], ctx_buckets: Sequence[int],
                    *, policy: str, repeats: int) -> Reference | None:
    """The cheapest probe of the profile that covers the buckets the requests' prompts run in.

    Among the context buckets the requests use (and the profile holds), the one whose long
    probe took the least time: its run covers a prefill and decode steps of a bucket the
    requests exercise, at the least cost. None when the profile holds none of them.
    """
    b = np.asarray(sorted(ctx_buckets))
    idx = select_index(np.asarray(input_len), b, policy)
    used = sorted({int(b[i]) for i in idx if i >= 0})
    have = [profiles[x] for x in used if x in profiles and profiles[x].t2_s > 0]
    if not have:
        return None
    p = min(have, key=lambda p: (p.t2_s, p.bucket))
    cached = float(np.median(p.raw_t2)) if p.raw_t2 else p.t2_s  # a profile without its raw runs: its time
    return Reference(Probe(bucket=p.bucket, input_len=p.input_len, output_len=p.l2,
                           repeats=max(repeats, REFERENCE_REPEATS)), cached, tuple(p.raw_t2))


def host_drift(ref: Reference, times_s: Sequence[float]) -> float:
    """The median of the reference probe's times now over the median of its repeats in the profile."""
    return float(np.median(np.asarray(times_s, dtype=float)) / ref.cached_s)


def drift_of(ref: Reference, times_s: Sequence[float], *, draws: int = DRAWS, seed: int = SEED) -> Drift:
    """``host_drift`` with its noise: the spread of the ratio of medians over resamples of both sides' repeats.

    A profile stored without its raw runs contributes no noise of its own (its side is a point).
    """
    now = np.asarray(times_s, dtype=float)
    rng = np.random.default_rng(seed)
    ratio = np.median(now[rng.integers(0, len(now), size=(draws, len(now)))], axis=1)
    then = np.asarray(ref.cached_times_s, dtype=float)
    if then.size:
        ratio = ratio / np.median(then[rng.integers(0, len(then), size=(draws, len(then)))], axis=1)
    else:
        ratio = ratio / ref.cached_s
    return Drift(host_drift(ref, now), float(spread(ratio)))


def round_speeds(rounds: Sequence[Mapping[object, Sequence[float]]]) -> tuple[float, ...]:
    """The host's speed in each round of probes run around a piece of work (before it, between its chunks, after
    it), 1.10 a round 10% slower than the rounds' whole: each run's time over its probe's median over every round,
    and the median of those ratios in the round (nan for a round without runs). ``rounds[i]`` maps a probe to its
    times in round i. The drift says how the host compares with its profile; this, how it moved during the work.
    """
    pooled: dict[object, list[float]] = {}
    for r in rounds:
        for k, ts in r.items():
            pooled.setdefault(k, []).extend(ts)
    mid = {k: float(np.median(v)) for k, v in pooled.items() if v}
    out = []
    for r in rounds:
        ratios = [t / mid[k] for k, ts in r.items() for t in ts if mid.get(k, 0.0) > 0]
        out.append(float(np.median(ratios)) if ratios else float("nan"))
    return tuple(out)


#: what a measurement did about the host's drift before it was judged
NO_REFERENCE, NO_ACTION, RESCALED, REPROFILED = "no reference", "none", "rescaled", "reprofiled"
#: how a measurement checks the drift (``budget.drift_check``): the probes of every bucket the
#: requests use in rounds between and around the runs, or the reference probe alone before and after
SIDE_BY_SIDE, REFERENCE_ONLY = "side-by-side", "reference"
DRIFT_CHECKS = (SIDE_BY_SIDE, REFERENCE_ONLY)


def action(d: Drift | None, *, tolerance: float, reprofile_above: float, rescalable: bool = True) -> str:
    """What to do about drift ``d`` before a prediction is judged against a measurement.

    Inside its noise or the ``tolerance``: nothing. Beyond them, a drift larger than
    ``reprofile_above`` re-profiles the buckets in use: one factor stands for the host only
    when every part of the work (launches, matmuls, memory traffic) slowed alike, which a
    shared host does not do (docs/noise.md), and a drift that large decides a verdict by
    itself. A smaller one re-scales the prediction by it, where the metrics scale with the
    host's speed (``rescalable``: not under continuous serving, where below saturation the
    throughput is the offered rate and queueing is not proportional to the host's speed).
    """
    if d is None:
        return NO_REFERENCE
    if not d.significant(tolerance):
        return NO_ACTION
    if abs(d.value - 1.0) > reprofile_above:
        return REPROFILED
    return RESCALED if rescalable else NO_ACTION


def corrected(metric: str, value: float, drift: float) -> float:
    """A predicted metric corrected for ``drift``: latencies times it, throughputs divided by it."""
    if metric.startswith("throughput"):
        return value / drift
    if metric.endswith("_s"):
        return value * drift
    return value
