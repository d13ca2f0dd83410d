"""The search's profiling plan: which units and buckets to profile next, or why to stop.

It holds what the choice needs across rounds and hands ``search.economy.decide`` the
current state: the physical prior fitted on the measured units (``search.physical``), the
compile-time model fitted on the profiling tasks measured so far, with the cache's units
of earlier searches counted as one task each (``search.cost``), the linear designs of the
workload (``search.design``), the candidates of every unit (the sampler's first, then
every bucket set of the space up to ``economy.CANDIDATE_CAP`` per unit) and the measured
front. Pure: no Ray, no files.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np

from lens.types import BucketProfile, Candidate, Requests
from spaces import Space

from .cost import CostModel, TaskRecord
from .design import Designs
from .economy import Decision, decide, unit_options
from .encoding import all_candidates
from .evaluate import Evaluation, Evaluator
from .physical import PhysicalPrior
from .selection import front_of

Unit = tuple[int, int]


class ProfilePlanner:
    """Chooses what to profile by expected hypervolume gain per hardware second."""

    def __init__(self, *, space: Space, requests: Requests, evaluator: Evaluator, prior: PhysicalPrior,
                 per_round: int):
        self.space, self.ev, self.prior, self.per_round = space, evaluator, prior, per_round
        sp = space.search
        self.cost = CostModel(buckets=sp.buckets, policy=space.target.bucket_policy, profile=space.profile)
        self.designs = Designs(requests, policy=space.target.bucket_policy, mode=space.target.batching,
                               prefill=space.target.prefill)
        self._by_unit: dict[Unit, list[Candidate]] | None = None

    def by_unit(self) -> dict[Unit, list[Candidate]]:
        """Every candidate of the space, by unit (built once)."""
        if self._by_unit is None:
            self._by_unit = {}
            for c in all_candidates(self.space.search):
                self._by_unit.setdefault((c.tp, c.batch), []).append(c)
        return self._by_unit

    # -- what profiling cost ------------------------------------------------------------------
    def note_task(self, unit: Unit, *, buckets: int, compile_s: float, run_s: float,
                  profiles: Mapping[int, BucketProfile]) -> None:
        """One profiling task measured: ``buckets`` compiled, its hardware seconds, its profiles."""
        if buckets > 0 and np.isfinite(compile_s) and np.isfinite(run_s):
            self.cost.add(TaskRecord(tp=unit[0], batch=unit[1], buckets=buckets, compile_s=float(compile_s),
                                     run_s=float(run_s), probe_s=self.cost.measured_probe_s(unit[1], profiles)))

    # -- the plan -----------------------------------------------------------------------------
    def measured_sweep(self) -> list[Candidate]:
        """Every candidate of a measured unit that its measured buckets cover."""
        units = self.by_unit()
        return [c for u in self.ev.measured for c in units.get(u, []) if not self.ev.missing(c)]

    def decide(self, *, proposed: Iterable[Candidate], measured: Sequence[Evaluation],
               budget_left_s: float | None) -> Decision:
        """This round's choices. ``proposed``: the sampler's candidates (they come first in
        their unit); ``measured``: the evaluations predicted from measured profiles."""
        stop_gain = self.space.budget.stop_gain
        units = self.by_unit()
        cands: dict[Unit, list[Candidate]] = {}
        for c in proposed:
            cands.setdefault((c.tp, c.batch), []).append(c)
        for u, cs in units.items():
            cands[u] = list(dict.fromkeys(cands.get(u, []) + cs))
        front = front_of(measured, self.space)
        fv = np.array([e.values(self.space) for e in front]) if front else np.zeros((0, 2))
        options = unit_options(space=self.space, evaluator=self.ev, candidates=cands,
                               belief=lambda t, b: self.prior.belief(t, b, self.ev.measured), designs=self.designs,
                               cost=self.cost)
        return decide(options, fv, stop_gain=stop_gain, per_round=self.per_round, budget_left_s=budget_left_s)
