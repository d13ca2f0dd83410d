"""Confirmation: front candidates run end to end on the hardware, predicted vs measured.

The picks are the chosen configuration (the knee), from three picks up the least certain
prediction near it, and points spread along the front for the rest (near-duplicate points
left out; ``selection.confirm_pick``); each runs the whole workload sample ``budget.confirm_repeats``
times as one Ray task (under continuous serving, released at the same arrival times as
predicted), after a warm-up run that compiles its graphs (all count as hardware seconds),
and is judged on each request's median over the passes: on a shared host one pass
scatters by about the tolerance itself. A served workload (continuous mode) is judged on the
median of the passes' own figures instead: each pass holds the host's jitter, as each run of
its prediction does, where each request's median would strip it and read the latency tail
short. Around the workload the task
runs probes of the unit again (``search.drift_check``): ``host_drift`` says how much slower
(> 1) or faster the host was over the run than when it profiled, from its reference probe.
A confirmation disagreeing by more than ``budget.tolerance`` on any of ``CONFIRM_METRICS`` or
on one of the space's two objectives (the front's own axes) is flagged. A slower host is not a model error. Under ``budget.drift_check = "side-by-side"``
(the default) the probes of every bucket the requests use run before and after the
workload, and the confirmation is judged on the prediction from them: the model on the host
as it was during the run (``drift_action = "reprofiled"``). Under ``"reference"`` only the
reference probe runs; when its drift is over ``budget.drift_tolerance`` and beyond twice
its own noise (``lens.drift.action``), the confirmation is judged on a corrected prediction
instead: past ``budget.drift_reprofile`` predicted from the buckets profiled again in the
same task (``"reprofiled"``), below it re-scaled by the drift (``"rescaled"``). Both errors
are kept. Under continuous serving a drift is never re-scaled (below saturation the
throughput is the offered rate whatever the host's speed, and queueing is not
proportional to it), only re-profiled. A failed one (an error, or past
``budget.confirm_timeout_s``) is recorded with its error.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from lens.drift import NO_ACTION, REPROFILED, RESCALED
from lens.drift import corrected as drift_corrected
from lens.metrics import summarize
from lens.serving_metrics import RequestSLO, summarize_serving_passes
from lens.types import BucketProfile, Candidate, Requests
from spaces import Space

from .drift_check import DriftCheck, DriftOutcome
from .evaluate import Evaluation, Evaluator
from .progress import bar
from .selection import confirm_pick, distinct

if TYPE_CHECKING:
    from .dispatch import Dispatcher
    from .ledger import RunLedger

#: metrics compared besides the two objectives; a disagreement on one of them, or on an objective, flags the candidate
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
    #: what was done about the drift before judging: "none", "rescaled", "reprofiled" (or "no reference")
    drift_action: str = "none"
    #: the same mean error with the prediction corrected for the drift: re-profiled, or re-scaled by ``host_drift``
    e2e_request_mape_corrected_pct: float | None = None
    #: the drift's own noise (one standard error, ``lens.drift.Drift``)
    host_drift_err: float | None = None
    #: metric -> value predicted from the buckets profiled again during the confirmation (drift_action "reprofiled")
    reprofiled: Mapping[str, float] = field(default_factory=dict)
    #: why a re-profile that was due did not take place ("" when none failed)
    drift_note: str = ""
    #: passes of the workload run (``budget.confirm_repeats``); ``measured`` is each request's median over them
    passes: int = 1
    #: metric -> error in percent of each compared metric past the tolerance, as judged (the reason for the flag)
    flagged_on: Mapping[str, float] = field(default_factory=dict)

    @property
    def judged_corrected(self) -> bool:
        """Whether the verdict is on the drift-corrected prediction (re-profiled or re-scaled)."""
        return self.drift_action in (RESCALED, REPROFILED)

    def beyond(self, tolerance: float) -> dict[str, float]:
        """Metric -> judged error (percent) of the compared metrics (``predicted``: CONFIRM_METRICS and
        the objectives) over ``tolerance`` (a fraction).

        A NaN error (e.g. no TPOT of one-token outputs) is never over it.
        """
        errs = {m: self.error_pct(m, corrected=self.judged_corrected) for m in self.predicted}
        return {m: e for m, e in errs.items() if abs(e) > tolerance * 100}

    def error_pct(self, metric: str, *, corrected: bool = False) -> float:
        """The prediction's error on ``metric`` in percent; ``corrected``: the prediction corrected for the
        host's drift first (predicted again from the re-profiled buckets, or re-scaled by the drift)."""
        p, q = self.predicted[metric], self.measured[metric]
        if corrected and metric in self.reprofiled:
            p = self.reprofiled[metric]
        elif corrected and self.host_drift:
            p = drift_corrected(metric, p, self.host_drift)
        return (p - q) / q * 100 if q else float("nan")

    def to_json(self) -> dict[str, Any]:
        d = {"candidate": self.candidate.to_dict(), "flagged": self.flagged, "simulated": self.simulated,
             "predicted": dict(self.predicted), "measured": dict(self.measured),
             "e2e_request_mape_pct": self.e2e_request_mape_pct, "error": self.error,
             "host_drift": self.host_drift, "drift_action": self.drift_action,
             "e2e_request_mape_corrected_pct": self.e2e_request_mape_corrected_pct,
             "host_drift_err": self.host_drift_err, "reprofiled": dict(self.reprofiled) or None,
             "drift_note": self.drift_note or None, "passes": self.passes,
             "flagged_on": dict(self.flagged_on) or None}
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
                   host_drift_err=d.get("host_drift_err"),
                   reprofiled={k: nan if v is None else float(v) for k, v in (d.get("reprofiled") or {}).items()},
                   drift_note=d.get("drift_note") or "", passes=int(d.get("passes", 1)),
                   flagged_on={k: float(v) for k, v in (d.get("flagged_on") or {}).items()})


def confirm_front(front: Sequence[Evaluation], k: int, *, space: Space, requests: Requests, dispatcher: "Dispatcher",
                  ledger: "RunLedger", log: Callable[[str], None], progress: bool,
                  profiles: Mapping[tuple[int, int], Mapping[int, BucketProfile]] | None = None) -> list[Confirmation]:
    """Run ``k`` candidates of ``front`` (lowest latency first) on the hardware (``selection.confirm_pick``).

    Near-duplicate points (``selection.near_duplicates``) are not picked: only what a person
    reads of the front is confirmed. Each evaluation must carry its prediction (the
    per-request E2E compared). ``profiles`` (unit -> bucket -> profile) give each
    candidate's reference probe for the drift check, and with the re-profiled buckets the
    corrected prediction of a large drift. Stops early once ``budget.confirm_s``
    hardware seconds are spent; ``ledger`` counts tasks and seconds. The confirmations are
    returned in the front's order.
    """
    if not front:
        return []
    shown = distinct(front, space)  # a near-duplicate row is neither shown nor confirmed
    picks = [shown[i] for i in confirm_pick(shown, k, space)]
    by_cand = {e.candidate: e for e in picks}
    profiles = profiles or {}
    checks = {e.candidate: DriftCheck.of(space, e.candidate, requests, profiles.get((e.candidate.tp, e.candidate.batch), {}))
              for e in picks}
    cap = space.budget.confirm_s
    continuous = space.target.serving == "continuous"
    # the sustainable rate is a bisection over many runs: confirmation measures at the workload's own rate
    metrics = tuple(m for m in dict.fromkeys(CONFIRM_METRICS + (space.objectives.throughput, space.objectives.latency))
                    if m != "sustainable_rate_req_s_per_chip")
    out: list[Confirmation] = []
    log(f"confirming {len(picks)} candidate(s) on the hardware with the {len(requests)}-request workload")
    shown = bar(len(picks), "confirming", progress)
    for done in dispatcher.confirm(space.target, [e.candidate for e in picks], requests, checks,
                                   repeats=space.budget.confirm_repeats, timeout_s=space.budget.confirm_timeout_s):
        ledger.confirm_tasks += 1
        c, ev = done.key, by_cand[done.key]
        if done.error:
            out.append(Confirmation(c, flagged=True, error=done.error))
        else:
            run = done.value
            wr, dr = run.workload, run.drift
            ledger.confirm_hardware_s += wr.compile_s + wr.run_s + (dr.hardware_s if dr else 0.0)
            if continuous:
                # each pass holds the host's jitter as the prediction's runs do: the median of the passes' own
                meas = summarize_serving_passes(requests, run.passes or (wr,), chips=c.tp,
                                                slo=RequestSLO.from_constraints(dict(space.slo)))
            else:
                meas = summarize(requests, ttft_s=wr.ttft_s, e2e_s=wr.e2e_s, total_s=wr.total_s, chips=c.tp)
            conf = Confirmation(c, flagged=False, simulated=wr.simulated, passes=space.budget.confirm_repeats,
                                predicted={m: ev.metrics[m] for m in metrics},
                                measured={m: meas[m] for m in metrics},
                                e2e_request_mape_pct=_mape(ev.prediction.e2e_s, wr.e2e_s),
                                **_drift_fields(dr, ev, space, requests, profiles, metrics, wr.e2e_s, continuous))
            over = conf.beyond(space.budget.tolerance)
            if conf.judged_corrected:
                log(f"  {c.label()}: {_drift_said(dr, checks[c])}")
            if dr is not None and (moved := dr.moved_said(space.budget.drift_tolerance)):
                log(f"  {c.label()}: {moved}")
            out.append(dataclasses.replace(conf, flagged=bool(over), flagged_on=over))
        shown.update(1)
        if cap is not None and ledger.confirm_hardware_s >= cap:
            log(f"confirmation budget of {cap:g} hardware-s spent; stopping confirmation")
            break
    shown.close()
    order = {e.candidate: i for i, e in enumerate(picks)}  # front order, not the order the tasks ended in
    return sorted(out, key=lambda c: order[c.candidate])


def _mape(predicted_e2e: np.ndarray, measured_e2e: np.ndarray) -> float:
    """Mean over the requests of |predicted - measured| / measured E2E, in percent."""
    return float((np.abs(predicted_e2e - measured_e2e) / measured_e2e).mean() * 100)


def repredicted(space: Space, requests: Requests, measured: Mapping[tuple[int, int], Mapping[int, BucketProfile]],
                c: Candidate, fresh: Mapping[int, BucketProfile]) -> Evaluation:
    """``c`` predicted again with ``fresh`` profiles of its buckets over its unit's cached ones.

    Every measured unit is known, as the search knew them: another unit measured at the largest
    bucket is what shows this one's KV cache fits it (``Evaluator.fits_memory``), so that a bucket
    the workload never runs in is not asked for.
    """
    ev = Evaluator(space, requests)
    for unit, profs in measured.items():
        ev.set_measured(unit, profs)
    ev.set_measured((c.tp, c.batch), {**measured.get((c.tp, c.batch), {}), **fresh})
    return ev.evaluate(c, with_prediction=True)


def _drift_fields(dr: DriftOutcome | None, ev: Evaluation, space: Space, requests: Requests,
                  profiles: Mapping[tuple[int, int], Mapping[int, BucketProfile]], metrics: Sequence[str],
                  measured_e2e: np.ndarray, continuous: bool) -> dict[str, Any]:
    """A confirmation's drift, what was done about it, and the prediction's error once corrected for it."""
    if dr is None:
        return {"drift_action": "no reference"}
    c = ev.candidate
    out: dict[str, Any] = {"host_drift": dr.drift.value, "host_drift_err": dr.drift.err, "drift_action": dr.action,
                           "drift_note": dr.note}
    if dr.action == REPROFILED:  # the candidate predicted again from the buckets just measured
        again = repredicted(space, requests, profiles, c, dr.profiles)
        if again.prediction is not None:
            out["reprofiled"] = {m: again.metrics[m] for m in metrics}
            out["e2e_request_mape_corrected_pct"] = _mape(again.prediction.e2e_s, measured_e2e)
            return out
        out["drift_note"] = f"the re-profiled buckets give no prediction ({again.infeasible or 'profiles missing'})"
        out["drift_action"] = RESCALED if not continuous else NO_ACTION
    if not continuous:
        out["e2e_request_mape_corrected_pct"] = _mape(ev.prediction.e2e_s * dr.drift.value, measured_e2e)
    return out


def _drift_said(dr: DriftOutcome, check: DriftCheck) -> str:
    """The log line of a drift that changed how a confirmation was judged."""
    ref = f"host_drift {dr.drift.value:.3f} (the reference probe of bucket {check.reference.probe.bucket} took " \
          f"{dr.drift.value:.3f}x its profiled time)"
    if dr.action == REPROFILED:
        how = "profiled side by side with the run" if dr.side_by_side else "profiled again"
        if dr.run_again:
            how += f" ({dr.run_again_said})"
        return (f"{ref}; bucket(s) {', '.join(map(str, sorted(dr.profiles)))} were {how} "
                f"({dr.reprofile_s:.1f} hardware-s, not stored) and the prediction from them was judged")
    return f"{ref}; the prediction was re-scaled by it before it was judged" + (f" ({dr.note})" if dr.note else "")
