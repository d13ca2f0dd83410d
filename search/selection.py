"""Choosing on predictions: the Pareto front, the promising units, the knee, the spread pick.

Pure functions of ``Evaluation`` records and the space's objectives and SLOs: no Ray, no
Optuna, no files. The throughput objective is maximised and the latency one minimised.
"""
from __future__ import annotations

import math
from typing import Callable, Container, Iterable, Sequence

import numpy as np

from lens.types import Candidate
from spaces import SearchSpace, Space

from .evaluate import Evaluation
from .pareto import hypervolume, pareto_mask

#: most units profiled per round: later rounds see better priors, so fewer wasted units
UNITS_PER_ROUND = 4
#: candidates shown as the nearest ones when none meets the SLO
NEAREST = 5
#: front points of one unit whose two objectives both differ by less than this fraction read
#: as one: bucket sets a small bucket apart, within the spread of the profiles they stand on
NEAR_DUPLICATE = 0.01

Unit = tuple[int, int]


def front_of(evals: Iterable[Evaluation], space: Space) -> list[Evaluation]:
    """The evaluations that meet the SLO and that no other one dominates.

    Bucket sets that predict exactly alike (a bucket no request uses) keep only the one
    with the fewest buckets: the cheapest to compile and to hold in device memory.
    """
    ok = [e for e in evals if e.meets_slo(space)]
    if not ok:
        return []
    best: dict[tuple[float, float], Evaluation] = {}
    for e in sorted(ok, key=lambda e: (len(e.candidate.ctx_buckets) + len(e.candidate.tkg_buckets), e.candidate.label())):
        best.setdefault(tuple(e.values(space)), e)
    ok = list(best.values())
    vals = np.array([e.values(space) for e in ok])
    return [e for e, m in zip(ok, pareto_mask(vals[:, 0], vals[:, 1])) if m]


def near_duplicates(front: Sequence[Evaluation], space: Space, tol: float = NEAR_DUPLICATE) -> list[int | None]:
    """For each point of ``front``: None when a person should read it, else the index of the
    point it collapses into (same tp and batch, both objectives within ``tol``, fewer buckets).

    Points are taken fewest buckets first, so what is shown is the cheapest bucket set of
    each group; a tie goes to the lower latency.
    """
    order = sorted(range(len(front)), key=lambda i: (len(front[i].candidate.ctx_buckets) + len(front[i].candidate.tkg_buckets),
                                                     front[i].metrics[space.objectives.latency]))
    into: list[int | None] = [None] * len(front)
    shown: list[int] = []
    for i in order:
        c, (t, l) = front[i].candidate, front[i].values(space)
        for j in shown:
            cj, (tj, lj) = front[j].candidate, front[j].values(space)
            if (cj.tp, cj.batch) == (c.tp, c.batch) and abs(t - tj) <= tol * abs(tj) and abs(l - lj) <= tol * abs(lj):
                into[i] = j
                break
        else:
            shown.append(i)
    return into


def distinct(front: Sequence[Evaluation], space: Space) -> list[Evaluation]:
    """The points of ``front`` a person reads (``near_duplicates`` left out), in its order."""
    return [e for e, into in zip(front, near_duplicates(front, space)) if into is None]


def by_latency(front: Sequence[Evaluation], space: Space) -> list[Evaluation]:
    """The front in the order it is reported and confirmed: lowest latency first."""
    return sorted(front, key=lambda e: e.metrics[space.objectives.latency])


def violation_score(e: Evaluation, space: Space) -> float:
    """How far a candidate is from meeting the SLO, each limit's excess relative to it."""
    return sum(max(v, 0) / lim for (k, lim), v in zip(space.slo, e.violations(space).values()))


def nearest(evals: Iterable[Evaluation], space: Space, n: int = NEAREST) -> list[Evaluation]:
    """The ``n`` candidates closest to meeting the SLO."""
    return sorted(evals, key=lambda e: violation_score(e, space))[:n]


def hv_gain(e: Evaluation, front: Sequence[Evaluation], space: Space) -> float:
    """Hypervolume the front would lose without ``e`` (its exclusive contribution)."""
    vals = np.array([f.values(space) for f in front])
    ref = float(vals[:, 1].max() * 1.1)
    others = [f for f in front if f.candidate != e.candidate]
    ov = np.array([f.values(space) for f in others]) if others else np.zeros((0, 2))
    return hypervolume(vals[:, 0], vals[:, 1], ref_latency=ref) - hypervolume(ov[:, 0], ov[:, 1], ref_latency=ref)


def promising_units(
    evals: Sequence[Evaluation],
    space: Space,
    *,
    failed: Container[Unit],
    missing: Callable[[Candidate], Iterable[int]],
    per_round: int = UNITS_PER_ROUND,
) -> dict[Unit, list[int]]:
    """Unmeasured buckets of the units of candidates on the estimated front.

    ``evals`` are every evaluated candidate, estimated or measured; ``missing(c)`` lists the
    buckets a candidate needs that its unit has no measured profile for. The units are
    ranked by the hypervolume their candidates add to the front; at most ``per_round`` of
    them. A candidate behind the front, however close, does not make its unit promising:
    the rounds stop when the front stands on measured units.
    """
    front = front_of(evals, space)
    if not front:
        # nothing meets the SLO yet: the candidates closest to meeting it are the promising ones
        front = nearest(evals, space, 3)
    fv = np.array([e.values(space) for e in front]) if front else np.zeros((0, 2))
    slo_reachable = bool(front) and front[0].meets_slo(space)
    out: dict[Unit, set[int]] = {}
    gain: dict[Unit, float] = {}
    for e in evals:
        unit = (e.candidate.tp, e.candidate.batch)
        if e.measured or unit in failed:
            continue
        if slo_reachable and not e.meets_slo(space):
            continue
        t, l = e.values(space)
        # on the front: no worse than one of its points on both objectives (an equal
        # prediction with more buckets counts too: its unit is the same)
        if not len(fv) or np.any((t >= fv[:, 0]) & (l <= fv[:, 1])):
            out.setdefault(unit, set()).update(missing(e.candidate))
            gain[unit] = max(gain.get(unit, 0.0), hv_gain(e, front, space))
    best = sorted(out, key=lambda u: -gain[u])[:per_round]
    return {u: sorted(out[u]) for u in sorted(best)}


def knee(front: Sequence[Evaluation], space: Space) -> Evaluation:
    """The front point closest to the ideal corner in normalised objective space."""
    t = np.array([e.metrics[space.objectives.throughput] for e in front], dtype=float)
    l = np.array([e.metrics[space.objectives.latency] for e in front], dtype=float)
    tn = (t - t.min()) / (np.ptp(t) or 1)
    ln = (l - l.min()) / (np.ptp(l) or 1)
    return front[int(np.argmin((1 - tn) ** 2 + ln ** 2))]


def spread_pick(n: int, k: int) -> list[int]:
    """k indices spread evenly along a front of n (both ends included)."""
    if k >= n:
        return list(range(n))
    if k == 1:
        return [n - 1]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def may_be_dominated_by(front: Sequence[Evaluation], space: Space) -> list[list[int]]:
    """For each front point (in order), the positions of the others that may dominate it within their intervals.

    Point j may dominate point i when j's throughput can reach above i's lowest and j's
    latency below i's highest (``Evaluation.box``): their predictions are closer than the
    profiles' +- can tell apart, and a measurement may order them the other way.
    """
    boxes = [e.box(space) for e in front]
    out = []
    for i, ((ti0, _), (_, li1)) in enumerate(boxes):
        out.append([j for j, ((_, tj1), (lj0, _)) in enumerate(boxes)
                    if j != i and tj1 >= ti0 and lj0 <= li1])
    return out


#: front points on each side of the knee that count as near it
NEAR_KNEE = 2


def least_certain_near_knee(front: Sequence[Evaluation], space: Space) -> int | None:
    """Position (in ``front``, lowest latency first) of the widest interval among the knee and its neighbours."""
    if not front:
        return None
    k = front.index(knee(front, space))
    near = range(max(0, k - NEAR_KNEE), min(len(front), k + NEAR_KNEE + 1))
    best = max(near, key=lambda i: (front[i].rel_width(space), -abs(i - k)))
    return best if front[best].rel_width(space) > 0 else None


def confirm_pick(front: Sequence[Evaluation], k: int, space: Space) -> list[int]:
    """Positions of the ``k`` front points to confirm, in front order.

    The knee first: it is the chosen configuration (``deploy/`` holds it), and what is deployed
    is what most needs checking. From three picks up, the least certain prediction near the
    knee (it may be the better point, the profiles cannot tell). The rest are spread along the
    front: the ends (they bound it; the higher-throughput end first), then each time the point
    farthest from those picked.
    """
    n = len(front)
    if k >= n:
        return list(range(n))
    doubt = least_certain_near_knee(front, space) if k >= 3 else None
    picks: list[int] = []
    for i in (front.index(knee(front, space)), doubt, n - 1, 0):
        if i is not None and i not in picks and len(picks) < k:
            picks.append(i)
    while len(picks) < k:
        picks.append(max((i for i in range(n) if i not in picks), key=lambda i: (min(abs(i - j) for j in picks), i)))
    return sorted(picks)


def anchor_unit(space: SearchSpace, infeasible: Callable[[int, int], str | None]) -> Unit | None:
    """The unit profiled first when nothing is measured: the smallest tp, a middling batch."""
    batches = space.batch
    order = sorted(batches, key=lambda b: abs(math.log2(b) - math.log2(batches[len(batches) // 2])))
    for tp in space.tp:
        for b in order:
            if infeasible(tp, b) is None:
                return (tp, b)
    return None
