"""Confirmation: front candidates run end to end on the hardware, predicted vs measured.

The picks are spread along the front (both ends included); each runs the whole workload
sample as one Ray task, after a warm-up run that compiles its graphs (both count as
hardware seconds). A confirmation disagreeing by more than ``budget.tolerance`` on any of
``CONFIRM_METRICS`` is flagged; a failed one (an error, or past ``budget.confirm_timeout_s``)
is recorded with its error.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from lens.metrics import summarize
from lens.types import Candidate, Requests
from spaces import Space

from .evaluate import Evaluation
from .progress import bar
from .selection import distinct, spread_pick

if TYPE_CHECKING:
    from .dispatch import Dispatcher
    from .ledger import RunLedger

#: metrics compared (with the two objectives); a disagreement on one of them flags the candidate
CONFIRM_METRICS = ("throughput_tok_s", "e2e_p90_s", "ttft_p50_s", "tpot_p50_s")


@dataclass(frozen=True)
class Confirmation:
    """One front candidate run on the hardware: predicted and measured, or why it failed."""

    candidate: Candidate
    flagged: bool
    simulated: bool = False
    #: metric -> value, for CONFIRM_METRICS and the objectives, in that order
    predicted: Mapping[str, float] = field(default_factory=dict)
    measured: Mapping[str, float] = field(default_factory=dict)
    #: mean over the requests of |predicted - measured| / measured E2E, in percent
    e2e_request_mape_pct: float | None = None
    error: str | None = None

    def error_pct(self, metric: str) -> float:
        p, q = self.predicted[metric], self.measured[metric]
        return (p - q) / q * 100 if q else float("nan")

    def to_json(self) -> dict[str, Any]:
        d = {"candidate": self.candidate.to_dict(), "flagged": self.flagged, "simulated": self.simulated,
             "predicted": dict(self.predicted), "measured": dict(self.measured),
             "e2e_request_mape_pct": self.e2e_request_mape_pct, "error": self.error}
        return {k: v for k, v in d.items() if v is not None}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Confirmation":
        nan = float("nan")
        return cls(candidate=Candidate.from_dict(d["candidate"]), flagged=bool(d["flagged"]),
                   simulated=bool(d.get("simulated", False)),
                   predicted={k: nan if v is None else float(v) for k, v in d.get("predicted", {}).items()},
                   measured={k: nan if v is None else float(v) for k, v in d.get("measured", {}).items()},
                   e2e_request_mape_pct=d.get("e2e_request_mape_pct"), error=d.get("error"))


def confirm_front(front: Sequence[Evaluation], k: int, *, space: Space, requests: Requests, dispatcher: "Dispatcher",
                  ledger: "RunLedger", log: Callable[[str], None], progress: bool) -> list[Confirmation]:
    """Run ``k`` candidates spread along ``front`` (lowest latency first) on the hardware.

    Near-duplicate points (``selection.near_duplicates``) are not picked: only what a person
    reads of the front is confirmed.
    Each evaluation must carry its prediction (the per-request E2E compared). Stops early
    once ``budget.confirm_s`` hardware seconds are spent; ``ledger`` counts tasks and seconds.
    The confirmations are returned in the front's order.
    """
    if not front:
        return []
    shown = distinct(front, space)  # a near-duplicate row is neither shown nor confirmed
    picks = [shown[i] for i in spread_pick(len(shown), k)]
    by_cand = {e.candidate: e for e in picks}
    cap = space.budget.confirm_s
    metrics = tuple(dict.fromkeys(CONFIRM_METRICS + (space.objectives.throughput, space.objectives.latency)))
    out: list[Confirmation] = []
    log(f"confirming {len(picks)} candidate(s) on the hardware with the {len(requests)}-request workload")
    shown = bar(len(picks), "confirming", progress)
    for done in dispatcher.confirm(space.target, [e.candidate for e in picks], requests,
                                   timeout_s=space.budget.confirm_timeout_s):
        ledger.confirm_tasks += 1
        c, ev = done.key, by_cand[done.key]
        if done.error:
            out.append(Confirmation(c, flagged=True, error=done.error))
        else:
            wr = done.value
            ledger.confirm_hardware_s += wr.compile_s + wr.run_s
            meas = summarize(requests, ttft_s=wr.ttft_s, e2e_s=wr.e2e_s, total_s=wr.total_s, chips=c.tp)
            per_req = np.abs(ev.prediction.e2e_s - wr.e2e_s) / wr.e2e_s
            conf = Confirmation(c, flagged=False, simulated=wr.simulated, predicted={m: ev.metrics[m] for m in metrics},
                                measured={m: meas[m] for m in metrics}, e2e_request_mape_pct=float(per_req.mean() * 100))
            tol = space.budget.tolerance * 100  # (a NaN error, e.g. no TPOT of one-token outputs, flags nothing)
            out.append(dataclasses.replace(conf, flagged=any(abs(conf.error_pct(m)) > tol for m in CONFIRM_METRICS)))
        shown.update(1)
        if cap is not None and ledger.confirm_hardware_s >= cap:
            log(f"confirmation budget of {cap:g} hardware-s spent; stopping confirmation")
            break
    shown.close()
    order = {e.candidate: i for i, e in enumerate(picks)}  # front order, not the order the tasks ended in
    return sorted(out, key=lambda c: order[c.candidate])
