"""What to profile next: expected hypervolume gain per hardware second, and when to stop.

A *choice* is a unit and the buckets to profile in one task. Its value is the hypervolume
the front is expected to gain once those buckets are measured, under the prior's
uncertainty, divided by the hardware seconds the task is expected to cost:

- the unit's per-bucket numbers are drawn ``DRAWS`` times from the prior's belief (measured
  buckets as measured); every candidate of the unit that the choice would leave fully
  measured is predicted on each draw (``search.design``: a matrix product per candidate);
- on each draw the choice gains what its best such candidate adds to the measured front
  (the area it dominates that the front does not; 0 if it misses an SLO); the expected
  gain is the mean over the draws, so a unit the prior is unsure about is worth more;
- the cost is ``search.cost``'s: a fixed compile part per task (paid again by a task that
  re-opens a partly profiled unit) plus a part per bucket, plus the probes' run time.

Only the buckets a candidate needs are asked for (those its workload's requests run in,
and the largest one until the unit is known to fit memory with it: see
``Evaluator.needed``), so a unit's buckets are profiled only as far as the front needs
them; a later choice extends a partly profiled unit when a candidate needs more of it.

Profiling stops on evidence: when no choice is expected to add ``stop_gain`` of the
current front's hypervolume. ``[budget] profile_s`` stays a hard cap: a choice is made
only if its cost bound (``Cost.high_s``) fits in what is left, with the rest of its round.
A round takes up to ``per_round`` choices of different units; after each, the front is
assumed to gain the chosen candidates' median predictions, so the next choice is valued
for what it adds beyond them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from lens.types import Candidate
from spaces import Space

from .cost import Cost, CostModel
from .design import Designs, DesignStack
from .evaluate import Evaluator
from .pareto import hypervolume, pareto_mask
from .physical import UnitBelief

Unit = tuple[int, int]

#: draws of a unit's numbers per decision
DRAWS = 64
#: choices per round: one, so each choice is made knowing what the last one measured (the
#: user pays hardware seconds; parallel tasks would save wall-clock time only)
PER_ROUND = 1
#: most candidates (bucket sets) of one unit priced per decision
CANDIDATE_CAP = 128
#: the hypervolume's reference latency, as a multiple of the largest latency on the front
REF_FACTOR = 1.1


@dataclass(frozen=True)
class Choice:
    """Profile ``buckets`` of ``unit`` in one task: expected gain and cost."""

    unit: Unit
    buckets: tuple[int, ...]
    gain: float
    cost: Cost
    #: a probe: one bucket of a unit nothing is known of, measured to decide whether to go on
    probe: bool = False

    @property
    def per_second(self) -> float:
        return self.gain / max(self.cost.mean_s, 1e-9)


@dataclass(frozen=True)
class Decision:
    """One round's choices, or why there are none."""

    choices: tuple[Choice, ...]
    #: hypervolume of the measured front (the stop rule's yardstick)
    hypervolume: float
    #: the largest expected gain of any choice (0 when there is none)
    best_gain: float
    stop: str | None = None


@dataclass(frozen=True, eq=False)
class UnitOption:
    """The candidates of one unit that still need profiling, priced under its belief."""

    unit: Unit
    #: per candidate: the buckets it still needs measured
    missing: tuple[frozenset, ...]
    #: (candidates, draws, 2): throughput and latency per draw; throughput 0 where an SLO is missed
    draws: np.ndarray
    #: (candidates, 2) at the belief's medians (throughput 0 where an SLO is missed)
    median: np.ndarray
    cost: Callable[[frozenset], Cost | None]
    #: for a unit nothing is measured of: the bucket that weighs most in its candidates'
    #: time, and what measuring it would show on each draw (log ratios to the medians)
    probe_bucket: int | None = None
    probe_seen: np.ndarray | None = None


def point_gains(throughput: np.ndarray, latency: np.ndarray, front: np.ndarray, ref: float) -> np.ndarray:
    """Hypervolume each point alone would add to ``front`` ((m, 2) throughput, latency).

    The front dominates, at latency x, the throughput of its best point with latency <= x;
    a point (t, l) adds the integral over x in [l, ref) of max(0, t - that throughput).
    """
    t = np.asarray(throughput, float)[..., None]
    lat = np.asarray(latency, float)[..., None]
    f = np.asarray(front, float).reshape(-1, 2)
    f = f[(f[:, 0] > 0) & (f[:, 1] < ref)]
    if len(f):
        f = f[pareto_mask(f[:, 0], f[:, 1])]
        f = f[np.argsort(f[:, 1])]
    starts = np.concatenate([[-np.inf], f[:, 1]])
    ends = np.concatenate([f[:, 1], [ref]])
    levels = np.concatenate([[0.0], f[:, 0]])
    width = np.clip(np.minimum(ends, ref) - np.maximum(starts, lat), 0.0, None)
    return (np.clip(t - levels, 0.0, None) * width).sum(axis=-1)


def unit_options(
    *,
    space: Space,
    evaluator: Evaluator,
    candidates: Mapping[Unit, Sequence[Candidate]],
    belief: Callable[[int, int], UnitBelief | None],
    designs: Designs,
    cost: CostModel,
    draws: int = DRAWS,
    seed: int = 0,
) -> list[UnitOption]:
    """Every unit with candidates that need profiling, each candidate predicted per draw."""
    obj = space.objectives
    names = [obj.throughput, obj.latency, *[k for k, _ in space.slo]]
    out = []
    for unit in sorted(candidates):
        if unit in evaluator.failed:
            continue
        cands = [c for c in candidates[unit][:CANDIDATE_CAP] if evaluator.missing(c)]
        cands = [c for c in cands if evaluator.infeasible_reason(c) is None]
        if not cands:
            continue
        bel = belief(*unit)
        if bel is None:
            continue
        rng = np.random.default_rng([seed, *unit])
        dt, dd = bel.sample(rng, draws)
        mt, md = bel.median()
        stack = DesignStack([designs(c) for c in cands], bel.buckets)
        # the medians ride along as one more draw
        m = stack.metrics(np.vstack([dt, mt]), np.vstack([dd, md]), names, chips=np.array([c.tp for c in cands]))
        both = _objectives(m, space)  # (candidates, draws + 1, 2)
        where = {b: i for i, b in enumerate(bel.buckets)}

        def price(buckets: frozenset, _mt=mt, _md=md, _where=where, _batch=unit[1]) -> Cost | None:
            b = sorted(buckets)
            return cost.predict(_batch, b, [float(_mt[_where[x]]) for x in b], [float(_md[_where[x]]) for x in b])

        probe = seen = None
        if not bel.measured.any():
            k = len(bel.buckets)
            share = stack.total * np.concatenate([mt, md])
            share = share[:, :k] + share[:, k:]
            i = int(np.argmax((share / share.sum(axis=1, keepdims=True)).mean(axis=0)))
            probe, seen = bel.buckets[i], np.column_stack([np.log(dt[:, i] / mt[i]), np.log(dd[:, i] / md[i])])
        out.append(UnitOption(unit=unit, missing=tuple(frozenset(evaluator.missing(c)) for c in cands),
                              draws=both[:, :-1], median=both[:, -1], cost=price, probe_bucket=probe,
                              probe_seen=seen))
    return out


def _objectives(metrics: Mapping[str, np.ndarray], space: Space) -> np.ndarray:
    """(..., 2) throughput and latency; throughput 0 where an SLO is missed."""
    t = np.asarray(metrics[space.objectives.throughput], float)
    lat = np.asarray(metrics[space.objectives.latency], float)
    ok = np.ones_like(t, bool)
    for k, limit in space.slo:
        ok &= np.asarray(metrics[k]) <= limit
    return np.stack([np.where(ok & np.isfinite(t), t, 0.0), np.where(np.isfinite(lat), lat, np.inf)], axis=-1)


def decide(
    options: Sequence[UnitOption],
    front: np.ndarray,
    *,
    stop_gain: float,
    per_round: int,
    budget_left_s: float | None,
) -> Decision:
    """Up to ``per_round`` choices by expected gain per second (see the module docstring).

    ``front``: (m, 2) throughput and latency of the measured front. A choice must be
    expected to add at least ``stop_gain`` of its hypervolume (of the options' median
    front while nothing measured meets the SLOs) and fit ``budget_left_s``.
    """
    front = np.asarray(front, float).reshape(-1, 2)
    medians = np.concatenate([o.median for o in options]) if options else np.zeros((0, 2))
    pool = np.concatenate([front, medians[medians[:, 0] > 0]])
    pool = pool[np.isfinite(pool[:, 1])]
    if not len(pool):
        return Decision((), 0.0, 0.0, "no candidate is expected to meet the SLOs")
    ref = REF_FACTOR * float(pool[pareto_mask(pool[:, 0], pool[:, 1])][:, 1].max())
    hv = hypervolume(front[:, 0], front[:, 1], ref_latency=ref) if len(front) else 0.0
    scale = hv if hv > 0 else hypervolume(pool[:, 0], pool[:, 1], ref_latency=ref)
    threshold = stop_gain * scale
    left = budget_left_s
    chosen: list[Choice] = []
    best_gain, priced_out = 0.0, None
    current = front
    for _ in range(per_round):
        best = None
        for o in options:
            if any(c.unit == o.unit for c in chosen):
                continue
            unit_best = None
            g = point_gains(o.draws[..., 0], o.draws[..., 1], current, ref)  # (candidates, draws)
            for subset in dict.fromkeys(o.missing):
                gain = _gain(o, g, subset)
                if not chosen:
                    best_gain = max(best_gain, gain)
                if gain < threshold or gain <= 0:
                    continue
                cost = o.cost(subset)
                if cost is None:
                    continue
                if left is not None and cost.high_s > left:
                    priced_out = cost if priced_out is None or cost.high_s < priced_out.high_s else priced_out
                    continue
                c = Choice(o.unit, tuple(sorted(subset)), gain, cost)
                if best is None or c.per_second > best[0].per_second:
                    best = (c, o, g)
                if unit_best is None or c.per_second > unit_best.per_second:
                    unit_best = c
            if unit_best is not None and o.probe_bucket is not None:
                p = _probe(o, g, unit_best, threshold=threshold, left=left)
                if p is not None and p.per_second > best[0].per_second:
                    best = (p, o, g)
        if best is None:
            break
        choice = best[0] if best[0].probe else _extend(*best, threshold=threshold, left=left)
        chosen.append(choice)
        if left is not None:
            left -= choice.cost.high_s
        o = best[1]
        gained = o.median[np.array([m <= frozenset(choice.buckets) for m in o.missing])]
        current = np.concatenate([current, gained[gained[:, 0] > 0]])
    stop = None
    if not chosen:
        if priced_out is not None and best_gain >= threshold:
            stop = (f"the profiling budget: the cheapest worthwhile choice may cost up to {priced_out.high_s:.0f} "
                    f"hardware-s, {left:.0f} s are left")
        else:
            stop = (f"no choice is expected to add {stop_gain:.2%} of the front's hypervolume "
                    f"(the best: {best_gain / scale if scale > 0 else 0:.3%})")
    return Decision(tuple(chosen), hv, best_gain, stop)


def _gain(o: UnitOption, g: np.ndarray, buckets: frozenset) -> float:
    """Expected gain of measuring ``buckets``: the mean over draws of its best enabled candidate."""
    return float(_per_draw(o, g, buckets).mean())


def _extend(choice: Choice, o: UnitOption, g: np.ndarray, *, threshold: float, left: float | None) -> Choice:
    """Widen the chosen task with buckets other candidates of its unit need, while that pays.

    A wider task pays once what a later task re-opening the unit would pay again: its fixed
    compile part. So buckets ``m`` join when the seconds they add now are less than what a
    later task for them is expected to cost: its price times the share of draws in which
    they would then be worth profiling (they raise the unit's best gain on that draw by the
    stop rule's threshold). A wider set with a better gain per second joins as well.
    """
    while True:
        have = frozenset(choice.buckets)
        base = _per_draw(o, g, have)
        best, best_value = None, 0.0
        for m in dict.fromkeys(o.missing):
            if m <= have:
                continue
            wider = have | m
            cost = o.cost(wider)
            if cost is None or (left is not None and cost.high_s > left):
                continue
            per_draw = _per_draw(o, g, wider)
            c = Choice(o.unit, tuple(sorted(wider)), float(per_draw.mean()), cost)
            later = o.cost(wider - have)
            needed = float(np.mean(per_draw - base >= max(threshold, 1e-300)))
            value = (needed * later.mean_s if later is not None else 0.0) - (cost.mean_s - choice.cost.mean_s)
            if c.per_second > choice.per_second:
                value = max(value, 1e-300)
            if value > best_value:
                best, best_value = c, value
        if best is None:
            return choice
        choice = best


def _per_draw(o: UnitOption, g: np.ndarray, buckets: frozenset) -> np.ndarray:
    """Per draw, the gain of the best candidate that measuring ``buckets`` completes."""
    enabled = np.array([m <= buckets for m in o.missing])
    return g[enabled].max(axis=0) if enabled.any() else np.zeros(g.shape[1])


#: draws whose probe would show about the same, averaged to guess what a probe tells
NEIGHBOURS = 8


def _probe(o: UnitOption, g: np.ndarray, direct: Choice, *, threshold: float, left: float | None) -> Choice | None:
    """Measure the unit's probe bucket first, and its other buckets only if that shows them
    worth it: valued over the draws by what the probe would show on each (the draws that
    would look alike are averaged to say whether the unit would then be profiled on).

    A probe pays the fixed compile part twice when the unit goes on, and saves the other
    buckets when it does not: worth it when the unit's worth is uncertain as a whole.
    """
    b = o.probe_bucket
    probe_cost = o.cost(frozenset({b}))
    if probe_cost is None or (left is not None and probe_cost.high_s > left):
        return None
    rest = frozenset(direct.buckets) - {b}
    rest_cost = o.cost(rest).mean_s if rest else 0.0
    enabled = np.array([m <= frozenset(direct.buckets) for m in o.missing])
    gains = g[enabled].max(axis=0)  # per draw: what the unit would add once profiled on
    seen = o.probe_seen / np.maximum(o.probe_seen.std(axis=0), 1e-12)
    dist = ((seen[:, None, :] - seen[None, :, :]) ** 2).sum(axis=2)
    near = np.argsort(dist, axis=1)[:, :NEIGHBOURS]
    go_on = gains[near].mean(axis=1) >= max(threshold, 1e-300)
    value = float((gains * go_on).mean())
    if value < threshold or value <= 0:
        return None
    mean_s = probe_cost.mean_s + float(go_on.mean()) * rest_cost
    return Choice(o.unit, (b,), value, Cost(mean_s=mean_s, high_s=probe_cost.high_s), probe=True)
