"""What profiling a unit's buckets will cost in hardware seconds, before it is dispatched.

A profiling task compiles the unit (a fixed part: trace, shard and lay out the weights,
load) and the graphs of each bucket it profiles (a part per bucket), then runs two probes
per bucket. ``CompileModel`` is fitted on the tasks measured so far (their ``compile_s``
and bucket counts: fixed + per bucket x buckets, non-negative least squares); the run
time follows from the probe plan and the unit's (predicted) TTFT_b and TBT_b, scaled by
what the measured tasks really ran over what their own profiles say they ran (retries,
per-call costs). A task that re-opens a unit pays the fixed part again: every task is
a compilation of its own.

``high_s`` bounds a task's cost for the hard ``[budget] profile_s`` cap: the compile
prediction widened by the worst miss seen on the measured tasks (at least ``MIN_MARGIN``),
plus the run time if every bucket were measured ``profile.attempts`` times with the
repeats doubling each time, as ``measure_unit`` does at worst.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

from lens.probes import plan_probes
from lens.types import BucketProfile
from spaces import ProfileSettings

from .physical import nnls

#: least relative widening of the compile prediction in ``high_s``
MIN_MARGIN = 0.5


@dataclass(frozen=True)
class TaskRecord:
    """One measured profiling task: its unit, how many buckets it compiled, what it cost."""

    tp: int
    batch: int
    buckets: int
    compile_s: float
    run_s: float
    #: what its profiles say the probes ran: sum over buckets of repeats x (T1 + T2)
    probe_s: float


@dataclass(frozen=True)
class CompileModel:
    """compile_s = fixed_s + per_bucket_s x buckets, and how far off it has been."""

    fixed_s: float
    per_bucket_s: float
    #: worst relative miss on the tasks it was fitted on
    worst: float
    tasks: int

    @classmethod
    def fit(cls, records: Sequence[TaskRecord]) -> "CompileModel | None":
        """None without a measured task. With one bucket count only, the fixed part and the
        per-bucket part cannot be told apart: the fixed part is taken as one bucket's worth."""
        recs = [r for r in records if r.buckets > 0 and np.isfinite(r.compile_s) and r.compile_s >= 0]
        if not recs:
            return None
        n = np.array([r.buckets for r in recs], float)
        y = np.array([r.compile_s for r in recs], float)
        if y.max() <= 0:  # a runner that compiles nothing (or too fast to time)
            return cls(0.0, 0.0, 0.0, len(recs))
        # relative errors, with compilations too fast to time weighed as the fastest timed one
        y = np.maximum(y, y[y > 0].min())
        if len(set(n.tolist())) < 2:
            per = float(y.sum() / (n + 1).sum())
            fixed = per
        else:
            fixed, per = nnls(np.column_stack([np.ones_like(n), n]) / y[:, None], np.ones_like(y))
        pred = fixed + per * n
        worst = float(np.max(np.abs(y / np.maximum(pred, 1e-9) - 1.0)))
        return cls(float(fixed), float(per), worst, len(recs))

    def predict(self, buckets: int) -> float:
        return self.fixed_s + self.per_bucket_s * buckets


@dataclass(frozen=True)
class Cost:
    """Expected hardware seconds of one profiling task, and a bound for the budget."""

    mean_s: float
    high_s: float


class CostModel:
    """Hardware seconds of profiling (unit, buckets), from the tasks measured so far."""

    def __init__(self, *, buckets: Sequence[int], policy: str, profile: ProfileSettings,
                 records: Iterable[TaskRecord] = ()):
        self.profile = profile
        probes = plan_probes(buckets, policy=policy, max_output=profile.max_output, repeats=profile.repeats)
        self._probes: dict[int, list[int]] = {}
        for p in probes:
            self._probes.setdefault(p.bucket, []).append(p.output_len)
        self.records: list[TaskRecord] = list(records)
        self._fit: tuple[int, CompileModel | None, float] | None = None

    def add(self, record: TaskRecord) -> None:
        self.records.append(record)

    def probe_s(self, batch: int, buckets: Sequence[int], ttft_s: Sequence[float], tbt_s: Sequence[float]) -> float:
        """Seconds the probes of ``buckets`` run, measured once each: repeats x (T1 + T2),
        T(L) = batch x TTFT_b + (L - 1) x TBT_b."""
        reps = self.profile.repeats
        return float(sum(reps * sum(batch * f + (out - 1) * d for out in self._probes[b])
                         for b, f, d in zip(buckets, ttft_s, tbt_s)))

    def measured_probe_s(self, batch: int, profiles: Mapping[int, BucketProfile]) -> float:
        b = sorted(profiles)
        return self.probe_s(batch, b, [profiles[x].ttft_s for x in b], [profiles[x].tbt_s for x in b])

    def _model(self) -> tuple[CompileModel | None, float]:
        if self._fit is None or self._fit[0] != len(self.records):
            compile_model = CompileModel.fit(self.records)
            probe = sum(r.probe_s for r in self.records if r.probe_s > 0 and np.isfinite(r.run_s))
            run = sum(r.run_s for r in self.records if r.probe_s > 0 and np.isfinite(r.run_s))
            self._fit = (len(self.records), compile_model, run / probe if probe > 0 else 1.0)
        return self._fit[1], self._fit[2]

    def compile_model(self) -> CompileModel | None:
        return self._model()[0]

    def predict(self, batch: int, buckets: Sequence[int], ttft_s: Sequence[float], tbt_s: Sequence[float]) -> Cost | None:
        """Profiling ``buckets`` of a unit in one task, given their (predicted) TTFT_b and
        TBT_b; None while no task has been measured."""
        model, run_factor = self._model()
        if model is None:
            return None
        compile_s = model.predict(len(buckets))
        run = self.probe_s(batch, buckets, ttft_s, tbt_s) * run_factor
        worst_run = run * (2 ** self.profile.attempts - 1)
        margin = max(MIN_MARGIN, 2.0 * model.worst)
        return Cost(mean_s=compile_s + run, high_s=(compile_s + worst_run) * (1.0 + margin))
