"""The largest sustainable arrival rate, and latency-versus-rate sweeps, on predictions.

A rate is *sustainable* (docs/serving.md) when, predicted over the workload at that rate,
every SLO constraint holds and the queue does not grow (``queue_growth`` at most
``max_queue_growth``). The arrival pattern is fixed at rate 1 and divided by the rate
(common random numbers), so each prediction is a deterministic function of the rate and a
bisection converges on one boundary.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from .compose import UnitTable
from .errors import UserError
from .serving import Scheduler, predict_serving
from .serving_metrics import RequestSLO, summarize_serving_prediction
from .types import Requests

#: default cap on the queue's growth, seconds of waiting per second of trace
MAX_QUEUE_GROWTH = 0.05
#: the bisection stops when its bracket's ends are within this fraction of each other
REL_TOL = 0.005
#: the bracket's lower end: tried first at saturation / GUESS (where most deployments' rate lies above), and at
#: saturation / TRICKLE only when that one is not sustainable
GUESS = 4.0
TRICKLE = 1000.0


@dataclass(frozen=True)
class Verdict:
    """Whether one predicted run is sustainable, and the first reason it is not."""

    sustainable: bool
    why: str = ""


def judge(summary: Mapping[str, Any], *, slo: Mapping[str, float], max_queue_growth: float = MAX_QUEUE_GROWTH) -> Verdict:
    """Apply the definition: every SLO constraint met, and the queue not growing."""
    for key, bound in sorted(slo.items()):
        v = summary.get(key)
        if v is None or not math.isfinite(v) or v > bound:
            return Verdict(False, f"{key} = {v:.4g} s > {bound:g} s" if v is not None else f"no {key}")
    g = summary["queue_growth"]
    if g > max_queue_growth:
        return Verdict(False, f"queue grows ({g:.3g} s/s > {max_queue_growth:g})")
    return Verdict(True)


@dataclass(frozen=True)
class RatePoint:
    """One rate of a sweep: its predicted summary and verdict."""

    rate_req_s: float
    summary: Mapping[str, Any]
    verdict: Verdict


@dataclass(frozen=True)
class RateSearch:
    """The result of the bisection (rates in requests/s)."""

    rate_req_s: float  # the largest rate found sustainable (0 when even a trickle is not)
    upper_req_s: float  # the smallest rate found unsustainable (inf when none was)
    saturation_req_s: float  # request throughput with every request arriving at once
    evaluations: int
    why_not: str  # why the upper end is unsustainable
    points: tuple[RatePoint, ...] = field(default=(), repr=False)


def at_rate(requests: Requests, unit_arrival_s: np.ndarray, rate: float) -> Requests:
    """``requests`` arriving in the pattern ``unit_arrival_s`` (given at rate 1) at ``rate`` requests/s."""
    return Requests(requests.input_len, requests.output_len, np.asarray(unit_arrival_s, np.float64) / rate,
                    requests.name)


def evaluate(table: UnitTable, requests: Requests, *, scheduler: Scheduler, chips: int, slo: Mapping[str, float],
             max_queue_growth: float = MAX_QUEUE_GROWTH) -> tuple[dict[str, Any], Verdict]:
    """Predict ``requests`` (with arrivals) and judge the run."""
    pred = predict_serving(table, requests, scheduler=scheduler)
    summary = summarize_serving_prediction(requests, pred, chips=chips, slo=RequestSLO.from_constraints(slo))
    return summary, judge(summary, slo=slo, max_queue_growth=max_queue_growth)


def saturation_rate(table: UnitTable, requests: Requests, *, scheduler: Scheduler) -> float:
    """Request throughput when every request arrives at time 0 (the deployment flat out)."""
    burst = Requests(requests.input_len, requests.output_len, np.zeros(len(requests)), requests.name)
    pred = predict_serving(table, burst, scheduler=scheduler, tail=False)  # (the throughput is the run as composed)
    return len(requests) / pred.total_s if pred.total_s > 0 else math.inf


def sweep(table: UnitTable, requests: Requests, *, unit_arrival_s: np.ndarray, rates: Sequence[float],
          scheduler: Scheduler, chips: int, slo: Mapping[str, float],
          max_queue_growth: float = MAX_QUEUE_GROWTH) -> list[RatePoint]:
    """Predicted summaries at each of ``rates`` (the latency-versus-rate curve)."""
    out = []
    for r in rates:
        s, v = evaluate(table, at_rate(requests, unit_arrival_s, r), scheduler=scheduler, chips=chips, slo=slo,
                        max_queue_growth=max_queue_growth)
        out.append(RatePoint(float(r), s, v))
    return out


def max_sustainable_rate(
    table: UnitTable,
    requests: Requests,
    *,
    unit_arrival_s: np.ndarray,
    scheduler: Scheduler,
    chips: int = 1,
    slo: Mapping[str, float],
    max_queue_growth: float = MAX_QUEUE_GROWTH,
    rel_tol: float = REL_TOL,
) -> RateSearch:
    """Bisection (geometric) for the largest sustainable rate; see the module docstring.

    The upper end starts at 2 x saturation and doubles while still sustainable (at most 10
    times); the lower end is saturation / ``GUESS``, or saturation / ``TRICKLE`` when that is
    not sustainable (and 0 is returned when even a trickle is not). Then the bracket halves
    until within ``rel_tol``. (The trickle is tried only when needed: at a thousandth of
    saturation the run spans a thousand times the trace, and a measured decode pace then
    draws its path over all of it.)
    """
    if not 0 < rel_tol < 1:
        raise UserError(f"rel_tol = {rel_tol}: give a fraction between 0 and 1")
    unit = np.asarray(unit_arrival_s, dtype=np.float64)
    if unit.shape != requests.input_len.shape:
        raise UserError(f"{unit.size} arrival times for {len(requests)} requests")
    sat = saturation_rate(table, requests, scheduler=scheduler)
    points: list[RatePoint] = []

    def check(rate: float) -> Verdict:
        s, v = evaluate(table, at_rate(requests, unit, rate), scheduler=scheduler, chips=chips, slo=slo,
                        max_queue_growth=max_queue_growth)
        points.append(RatePoint(rate, s, v))
        return v

    lo, hi = 0.0, 2.0 * sat  # lo: the largest rate found sustainable so far (0: none yet)
    top = check(hi)
    for _ in range(10):
        if not top.sustainable:
            break
        lo, hi = hi, hi * 2.0
        top = check(hi)
    if top.sustainable:  # sustainable far past saturation: only a very short trace does that
        return RateSearch(hi, math.inf, sat, len(points), "", tuple(points))
    why = top.why
    if not lo:
        for lo in (sat / GUESS, sat / TRICKLE):
            low = check(lo)
            if low.sustainable:
                break
            hi, why = lo, low.why
        else:
            return RateSearch(0.0, hi, sat, len(points), why, tuple(points))
    while hi / lo > 1.0 + rel_tol:
        mid = math.sqrt(lo * hi)
        v = check(mid)
        if v.sustainable:
            lo = mid
        else:
            hi, why = mid, v.why
    return RateSearch(lo, hi, sat, len(points), why, tuple(points))
