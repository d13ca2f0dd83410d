"""Latency versus arrival rate for the front's candidates (continuous serving), for the report.

Each candidate is predicted at a grid of rates on the workload's own arrival pattern
(``lens.capacity.sweep``: the pattern at one request per second, divided by the rate), and
its largest sustainable rate is found by bisection. The grid spans a tenth of the slowest
candidate's saturation rate to past the fastest one's, geometrically, with the operator's
rate (the workload's) in it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from lens.capacity import saturation_rate, sweep
from spaces import Space

from .evaluate import Evaluation, Evaluator
from .selection import spread_pick

#: most front candidates a sweep draws (spread along the front, both ends included)
MAX_CANDIDATES = 6
#: rates per candidate
POINTS = 14
#: columns of the sweep table besides the candidate and the rate
COLUMNS = ("ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "e2e_p50_s", "e2e_p90_s", "request_throughput_req_s",
           "request_goodput_req_s", "goodput_req_s_per_chip", "queue_growth")


@dataclass(frozen=True, eq=False)
class RateSweep:
    """The sweep of a search: one row per candidate and rate, one row per candidate's capacity."""

    points: pd.DataFrame
    capacity: pd.DataFrame
    rate: float  # the workload's own rate, requests/s


def rate_sweep(front: Sequence[Evaluation], ev: Evaluator, space: Space) -> RateSweep | None:
    """The sweep of up to ``MAX_CANDIDATES`` candidates spread along ``front`` (None when it is empty)."""
    picks = [front[i] for i in spread_pick(len(front), MAX_CANDIDATES)] if front else []
    if not picks:
        return None
    sched, slo = space.target.scheduler, dict(space.slo)
    tables, caps = {}, []
    for e in picks:
        c = e.candidate
        tables[c] = ev.table(c)
        # (the evaluation's own bisection where the sustainable rate is its objective: the same table)
        found = e.capacity if e.capacity is not None else ev.sustainable(c, tables[c])
        caps.append({"candidate": c.label(), "tp": c.tp, "batch": c.batch,
                     "saturation_req_s": saturation_rate(tables[c], ev.requests, scheduler=sched),
                     "sustainable_rate_req_s": found.rate_req_s,
                     "sustainable_rate_req_s_per_chip": found.rate_req_s / c.tp, "limited_by": found.why_not})
    cap = pd.DataFrame(caps)
    lo = max(min(cap["saturation_req_s"]) / 10, 1e-6)
    hi = max(cap["saturation_req_s"]) * 1.3
    grid = np.unique(np.concatenate([np.geomspace(lo, hi, POINTS), [ev.rate]]))
    rows = []
    for e in picks:
        c = e.candidate
        for p in sweep(tables[c], ev.requests, unit_arrival_s=ev.unit_arrival_s, rates=grid, scheduler=sched,
                       chips=c.tp, slo=slo, max_queue_growth=space.objectives.max_queue_growth):
            rows.append({"candidate": c.label(), "rate_req_s": p.rate_req_s,
                         **{k: p.summary[k] for k in COLUMNS}, "sustainable": p.verdict.sustainable})
    return RateSweep(pd.DataFrame(rows), cap, ev.rate)

