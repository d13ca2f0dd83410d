"""Confirmation: front candidates run end to end on the hardware, predicted vs measured.

The picks are spread along the front (both ends included; near-duplicate points left out),
one of them traded for the least certain prediction near the knee
(``selection.confirm_pick``); each runs the whole workload sample as one Ray task (under
continuous serving, released at the same arrival times as predicted), after a warm-up run
that compiles its graphs (both count as hardware seconds). Around the workload (half its
repeats before, half after) the task runs one reference probe of the unit again
(``lens.drift``): ``host_drift`` says how much slower (> 1) or faster the host was over the
run than when it profiled. A confirmation disagreeing by more than ``budget.tolerance`` on
any of ``CONFIRM_METRICS`` is flagged -- judged on the prediction re-scaled by the drift
when the drift is over ``budget.drift_tolerance`` and beyond twice its own noise
(``drift_action = "rescaled"``, ``lens.drift.Drift``), since a slower host is not a model
error; both errors are kept. Under continuous serving the drift is recorded but never
re-scales the prediction: below saturation the throughput is the offered rate whatever the
host's speed, and queueing is not proportional to it. A failed one (an error, or past
``budget.confirm_timeout_s``) is recorded with its error.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from lens.drift import corrected as drift_corrected
from lens.drift import drift_of, reference_probe
from lens.metrics import summarize
from lens.serving_metrics import RequestSLO, summarize_serving
from lens.types import BucketProfile, Candidate, Requests
from spaces import Space

from .evaluate import Evaluation
from .progress import bar
from .selection import confirm_pick, distinct

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
    #: the reference probe's time now over its time in the profile (None: no reference was run)
    host_drift: float | None = None
    #: what was done about the drift before judging: "none", "rescaled" (or "no reference")
    drift_action: str = "none"
    #: the same mean error with the prediction re-scaled by ``host_drift``
    e2e_request_mape_corrected_pct: float | None = None
    #: the drift's own noise (one standard error, ``lens.drift.Drift``)
    host_drift_err: float | None = None

    def error_pct(self, metric: str, *, corrected: bool = False) -> float:
        """The prediction's error on ``metric`` in percent; ``corrected``: re-scaled by the host's drift first."""
        p, q = self.predicted[metric], self.measured[metric]
        if corrected and self.host_drift:
            p = drift_corrected(metric, p, self.host_drift)
        return (p - q) / q * 100 if q else float("nan")

    def to_json(self) -> dict[str, Any]:
        d = {"candidate": self.candidate.to_dict(), "flagged": self.flagged, "simulated": self.simulated,
             "predicted": dict(self.predicted), "measured": dict(self.measured),
             "e2e_request_mape_pct": self.e2e_request_mape_pct, "error": self.error,
             "host_drift": self.host_drift, "drift_action": self.drift_action,
             "e2e_request_mape_corrected_pct": self.e2e_request_mape_corrected_pct,
             "host_drift_err": self.host_drift_err}
        return {k: v for k, v in d.items() if v is not None}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Confirmation":
        nan = float("nan")
        return cls(candidate=Candidate.from_dict(d["candidate"]), flagged=bool(d["flagged"]),
                   simulated=bool(d.get("simulated", False)),
                   predicted={k: nan if v is None else float(v) for k, v in d.get("predicted", {}).items()},
                   measured={k: nan if v is None else float(v) for k, v in d.get("measured", {}).items()},
                   e2e_request_mape_pct=d.get("e2e_request_mape_pct"), error=d.get("error"),
                   host_drift=d.get("host_drift"), drift_action=d.get("drift_action", "none"),
                   e2e_request_mape_corrected_pct=d.get("e2e_request_mape_corrected_pct"),
                   host_drift_err=d.get("host_drift_err"))


def confirm_front(front: Sequence[Evaluation], k: int, *, space: Space, requests: Requests, dispatcher: "Dispatcher",
                  ledger: "RunLedger", log: Callable[[str], None], progress: bool,
                  profiles: Mapping[tuple[int, int], Mapping[int, BucketProfile]] | None = None) -> list[Confirmation]:
    """Run ``k`` candidates of ``front`` (lowest latency first) on the hardware (``selection.confirm_pick``).

    Near-duplicate points (``selection.near_duplicates``) are not picked: only what a person
    reads of the front is confirmed. Each evaluation must carry its prediction (the
    per-request E2E compared). ``profiles`` (unit -> bucket -> profile) give each
    candidate's reference probe for the drift check. Stops early once ``budget.confirm_s``
    hardware seconds are spent; ``ledger`` counts tasks and seconds. The confirmations are
    returned in the front's order.
    """
    if not front:
        return []
    shown = distinct(front, space)  # a near-duplicate row is neither shown nor confirmed
    picks = [shown[i] for i in confirm_pick(shown, k, space)]
    by_cand = {e.candidate: e for e in picks}
    refs = {e.candidate: reference_probe((profiles or {}).get((e.candidate.tp, e.candidate.batch), {}),
                                         requests.input_len, e.candidate.ctx_buckets,
                                         policy=space.target.bucket_policy, repeats=space.profile.repeats)
            for e in picks}
    cap = space.budget.confirm_s
    continuous = space.target.serving == "continuous"
    # the sustainable rate is a bisection over many runs: confirmation measures at the workload's own rate
    metrics = tuple(m for m in dict.fromkeys(CONFIRM_METRICS + (space.objectives.throughput, space.objectives.latency))
                    if m != "sustainable_rate_req_s_per_chip")
    out: list[Confirmation] = []
    log(f"confirming {len(picks)} candidate(s) on the hardware with the {len(requests)}-request workload")
    shown = bar(len(picks), "confirming", progress)
    probes = {c: (r.probe if r else None) for c, r in refs.items()}
    for done in dispatcher.confirm(space.target, [e.candidate for e in picks], requests, probes,
                                   timeout_s=space.budget.confirm_timeout_s):
        ledger.confirm_tasks += 1
        c, ev = done.key, by_cand[done.key]
        if done.error:
            out.append(Confirmation(c, flagged=True, error=done.error))
        else:
            run = done.value
            wr = run.workload
            ledger.confirm_hardware_s += wr.compile_s + wr.run_s + run.reference_hardware_s
            if continuous:
                meas = summarize_serving(requests, ttft_s=wr.ttft_s, e2e_s=wr.e2e_s, total_s=wr.total_s, chips=c.tp,
                                         slo=RequestSLO.from_constraints(dict(space.slo)))
            else:
                meas = summarize(requests, ttft_s=wr.ttft_s, e2e_s=wr.e2e_s, total_s=wr.total_s, chips=c.tp)
            dr = drift_of(refs[c], run.reference_s) if refs[c] and run.reference_s else None
            drift = None if dr is None else dr.value
            per_req = np.abs(ev.prediction.e2e_s - wr.e2e_s) / wr.e2e_s
            fixed = None if drift is None or continuous else float(
                (np.abs(ev.prediction.e2e_s * drift - wr.e2e_s) / wr.e2e_s).mean() * 100)
            action = "no reference" if drift is None else (
                "rescaled" if dr.significant(space.budget.drift_tolerance) and not continuous else "none")
            conf = Confirmation(c, flagged=False, simulated=wr.simulated, predicted={m: ev.metrics[m] for m in metrics},
                                measured={m: meas[m] for m in metrics}, e2e_request_mape_pct=float(per_req.mean() * 100),
                                host_drift=drift, drift_action=action, e2e_request_mape_corrected_pct=fixed,
                                host_drift_err=None if dr is None else dr.err)
            tol = space.budget.tolerance * 100  # (a NaN error, e.g. no TPOT of one-token outputs, flags nothing)
            judged = action == "rescaled"
            flagged = any(abs(conf.error_pct(m, corrected=judged)) > tol for m in CONFIRM_METRICS)
            if judged:
                log(f"  {c.label()}: host_drift {drift:.3f} (the reference probe of bucket {refs[c].probe.bucket} took "
                    f"{drift:.3f}x its profiled time); the prediction was re-scaled by it before it was judged")
            out.append(dataclasses.replace(conf, flagged=flagged))
        shown.update(1)
        if cap is not None and ledger.confirm_hardware_s >= cap:
            log(f"confirmation budget of {cap:g} hardware-s spent; stopping confirmation")
            break
    shown.close()
    order = {e.candidate: i for i, e in enumerate(picks)}  # front order, not the order the tasks ended in
    return sorted(out, key=lambda c: order[c.candidate])
