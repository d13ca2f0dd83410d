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
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .buckets import select_index
from .types import BucketProfile, Probe


#: the fewest repeats of the reference probe: the drift's own noise stays well under the drifts worth telling
REFERENCE_REPEATS = 5


@dataclass(frozen=True)
class Reference:
    """The probe run again to measure drift, and the median of its repeats in the cached profile."""

    probe: Probe
    cached_s: float


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
                           repeats=max(repeats, REFERENCE_REPEATS)), cached)


def host_drift(ref: Reference, times_s: Sequence[float]) -> float:
    """The median of the reference probe's times now over the median of its repeats in the profile."""
    return float(np.median(np.asarray(times_s, dtype=float)) / ref.cached_s)


def corrected(metric: str, value: float, drift: float) -> float:
    """A predicted metric corrected for ``drift``: latencies times it, throughputs divided by it."""
    if metric.startswith("throughput"):
        return value / drift
    if metric.endswith("_s"):
        return value * drift
    return value
