"""Evaluating candidates on predictions: feasibility, LENS composition, objectives, SLOs.

Static batches compose with ``lens.compose``; continuous serving (``[target] serving``) with
``lens.serving`` at the workload's arrival times, and the largest sustainable rate
(``lens.capacity``) is found only when an objective asks for it.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from lens.arrivals import mean_rate
from lens.buckets import decode_contexts, used_buckets
from lens.capacity import RateSearch, max_sustainable_rate
from lens.compose import Prediction, UnitTable, predict
from lens.errors import LensoptError
from lens.metrics import band, summarize_prediction
from lens.serving import ServingPrediction, predict_serving
from lens.serving_metrics import RequestSLO, summarize_serving_prediction
from lens.types import BucketProfile, Candidate, Requests
from spaces import Space

from .encoding import bucket_count_ok
from .prior import memory_gib

MEASURED_SOURCES = ("measured", "simulated")
#: bytes of per-request predictions the evaluator's memo keeps; past it, memoised evaluations
#: keep their metrics only (a large workload times thousands of bucket sets would not fit)
PREDICTION_MEMO_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Evaluation:
    """A candidate predicted on the workload: its metrics, per-request prediction and provenance."""

    candidate: Candidate
    metrics: Mapping[str, float] = field(default_factory=dict)
    #: where the per-bucket numbers came from: "measured", "simulated" or "estimate:<prior>"
    source: str = ""
    infeasible: str | None = None
    #: the per-request prediction behind ``metrics`` (None when infeasible, or dropped by the memo)
    prediction: Prediction | ServingPrediction | None = field(default=None, compare=False, repr=False)
    #: metric -> (low, high) from the profiles' +- (``Evaluator.evaluate(interval=True)``); empty when not asked
    bounds: Mapping[str, tuple[float, float]] = field(default_factory=dict, compare=False, repr=False)
    #: the bisection behind ``sustainable_rate_req_s`` (continuous serving with the sustainable rate as the
    #: objective; None otherwise)
    capacity: RateSearch | None = field(default=None, compare=False, repr=False)

    @property
    def measured(self) -> bool:
        return self.source in MEASURED_SOURCES

    def values(self, space: Space) -> tuple[float, float]:
        return (self.metrics[space.objectives.throughput], self.metrics[space.objectives.latency])

    def violations(self, space: Space) -> dict[str, float]:
        """SLO metric -> how far over its limit (<= 0 means met)."""
        return {k: self.metrics[k] - limit for k, limit in space.slo}

    def meets_slo(self, space: Space) -> bool:
        return all(v <= 0 for v in self.violations(space).values())

    def box(self, space: Space) -> tuple[tuple[float, float], tuple[float, float]]:
        """(throughput low, high), (latency low, high): the prediction's interval on the two objectives."""
        t, l = self.values(space)
        return (self.bounds.get(space.objectives.throughput, (t, t)), self.bounds.get(space.objectives.latency, (l, l)))

    def rel_width(self, space: Space) -> float:
        """The widest relative interval of the two objectives (0 without bounds)."""
        (t0, t1), (l0, l1) = self.box(space)
        t, l = self.values(space)
        return max((t1 - t0) / t if t else 0.0, (l1 - l0) / l if l else 0.0)


class Evaluator:
    """Predicts candidates on the workload from measured profiles, or from a prior."""

    def __init__(self, space: Space, requests: Requests, *, unit_check: Callable[[int, int], str | None] | None = None):
        self.space = space
        self.requests = requests
        self.measured: dict[tuple[int, int], dict[int, BucketProfile]] = {}
        self.failed: dict[tuple[int, int], str] = {}
        self.priors: list = []
        self._unit_check = unit_check
        self._prior_cache: dict[tuple[int, int], dict[int, BucketProfile] | None] = {}
        self._memo: dict[Candidate, Evaluation] = {}
        self._memo_bytes = 0
        self._used: dict[tuple, frozenset[int]] = {}
        self._contexts = decode_contexts(requests.input_len, requests.output_len)
        self.continuous = space.target.serving == "continuous"
        if self.continuous:
            if requests.arrival_s is None:
                raise LensoptError("continuous serving needs requests with arrival times (spaces.load_requests)")
            w = space.workload
            self.rate = w.arrival_rate if w is not None and w.arrival_rate is not None else mean_rate(requests.arrival_s)
            #: the arrival pattern at one request per second: a rate sweep divides it by the rate
            self.unit_arrival_s = requests.arrival_s * self.rate
            self.request_slo = RequestSLO.from_constraints(dict(space.slo))

    # -- profiles -----------------------------------------------------------------------
    def set_measured(self, unit: tuple[int, int], profiles: Mapping[int, BucketProfile]) -> None:
        """Add measured bucket profiles of a unit (a unit may hold only some buckets)."""
        self.measured.setdefault(unit, {}).update(profiles)
        self.failed.pop(unit, None)  # measured after all (a retry, or another search)
        self._prior_cache.clear()  # priors lean on the measured units
        # what other units' measured profiles predict stays as it was (more knowledge of the
        # memory fit only drops buckets a prediction does not use); estimates do not
        self._memo = {c: e for c, e in self._memo.items() if e.measured and (c.tp, c.batch) != unit}
        self._memo_bytes = sum(_nbytes(e) for e in self._memo.values())

    def forget(self) -> None:
        """Drop every memoised evaluation (the next ``evaluate`` of each candidate predicts afresh)."""
        self._memo.clear()
        self._memo_bytes = 0

    def set_failed(self, unit: tuple[int, int], reason: str) -> None:
        self.failed[unit] = reason
        self._memo = {c: e for c, e in self._memo.items() if (c.tp, c.batch) != unit}

    def used(self, c: Candidate) -> frozenset[int]:
        """The buckets of ``c`` whose numbers the workload's prediction can depend on.

        A ctx bucket is used when some prompt runs in it; a tkg bucket when its length range
        meets the workload's decode contexts (a superset: never drops a bucket in use).
        """
        key = (c.ctx_buckets, c.tkg_buckets)
        if key not in self._used:
            self._used[key] = used_buckets(c.ctx_buckets, c.tkg_buckets, self.requests.input_len,
                                           policy=self.space.target.bucket_policy, contexts=self._contexts)
        return self._used[key]

    def fits_memory(self, tp: int, batch: int, bucket: int) -> bool:
        """Whether the unit is known to hold a KV cache of ``bucket``: the space declares the
        device memory (``infeasible_reason`` checks it), or a unit that needs at least as much
        memory per device (tp no larger, batch no smaller) was measured at a bucket as long."""
        if self.space.hosts.memory_gib_per_chip is not None:
            return True
        return any(t <= tp and b >= batch and max(prof, default=0) >= bucket for (t, b), prof in self.measured.items())

    def needed(self, c: Candidate) -> list[int]:
        """Buckets whose profiles the candidate's prediction needs: the ones the workload uses,
        and its largest bucket (it sizes the KV cache) until the unit is known to fit it."""
        top = max(c.all_buckets)
        need = set(self.used(c))
        if not self.fits_memory(c.tp, c.batch, top):
            need.add(top)
        return sorted(need)

    def missing(self, c: Candidate) -> list[int]:
        """Buckets the candidate needs that its unit has no measured profile for."""
        have = self.measured.get((c.tp, c.batch), {})
        return [b for b in self.needed(c) if b not in have]

    def _profiles(self, c: Candidate) -> tuple[dict[int, BucketProfile] | None, str]:
        unit = (c.tp, c.batch)
        have = self.measured.get(unit, {})
        miss = self.missing(c)
        # buckets the prediction does not use still need a number in the table: a prior's, or
        # any measured one of the unit (it changes nothing)
        fill = [b for b in c.all_buckets if b not in have]
        key = (unit, tuple(fill))
        if fill and key not in self._prior_cache:
            est = None
            for prior in self.priors:
                est = prior.estimate(c.tp, c.batch, fill, self.measured)
                if est:
                    break
            self._prior_cache[key] = est
        est = self._prior_cache.get(key) if fill else {}
        if not miss:
            if est is None:
                any_p = next(iter(have.values()))
                est = {b: dataclasses.replace(any_p, bucket=b) for b in fill}
            need = self.needed(c)
            return {**have, **est}, ("simulated" if any(have[b].simulated for b in need) else "measured")
        if not est:
            return None, ""
        return {**have, **est}, next(iter(est.values())).source

    # -- feasibility --------------------------------------------------------------------
    def infeasible_reason(self, c: Candidate) -> str | None:
        sp, m = self.space, self.space.target.model
        if m.heads % c.tp or m.kv_heads % c.tp:
            return f"tp {c.tp} does not divide heads {m.heads} and kv_heads {m.kv_heads}"
        if not bucket_count_ok(c, sp.search):
            return f"more than max_buckets = {sp.search.max_buckets} buckets"
        hosts = sp.hosts
        if hosts.chips_per_host is not None and c.tp > hosts.chips_per_host:
            return f"tp {c.tp} exceeds chips_per_host {hosts.chips_per_host}"
        if hosts.memory_gib_per_chip is not None:
            # the KV cache holds the longest sequence either phase runs: a context-encoding
            # bucket longer than every token-generation one still fills its rows
            need = memory_gib(m, sp.target.dtype, tp=c.tp, batch=c.batch, max_len=max(c.all_buckets))
            if need > hosts.memory_gib_per_chip:
                return f"needs {need:.1f} GiB per chip for weights and KV cache, {hosts.memory_gib_per_chip:g} GiB available"
        unit = (c.tp, c.batch)
        if unit in self.failed:
            return f"profiling failed: {self.failed[unit]}"
        if self._unit_check is not None:
            reason = self._unit_check(c.tp, c.batch)
            if reason:
                return reason
        return None

    # -- evaluation ---------------------------------------------------------------------
    def evaluate(self, c: Candidate, *, with_prediction: bool = False, interval: bool = False) -> Evaluation:
        """``c`` predicted (memoised); ``with_prediction`` guarantees the per-request prediction,
        ``interval`` (implies it) its bounds from the profiles' +-."""
        with_prediction = with_prediction or interval
        hit = self._memo.get(c)
        if hit is not None and (hit.prediction is not None or not with_prediction or not hit.metrics) \
                and (hit.bounds or not interval or not hit.metrics):
            return hit
        ev = self._evaluate(c, interval=interval)
        keep = ev
        if ev.prediction is not None:
            size = _nbytes(ev)
            if self._memo_bytes + size > PREDICTION_MEMO_BYTES:
                keep = dataclasses.replace(ev, prediction=None)
            else:
                self._memo_bytes += size
        self._memo[c] = keep
        return ev

    def _evaluate(self, c: Candidate, *, interval: bool = False) -> Evaluation:
        reason = self.infeasible_reason(c)
        if reason:
            return Evaluation(c, infeasible=reason)
        prof, source = self._profiles(c)
        if prof is None:
            return Evaluation(c, source="", infeasible=None)
        try:
            tbl = UnitTable.build(c, prof, policy=self.space.target.bucket_policy,
                                  prefill=self.space.target.prefill)
            if self.continuous:
                pred = predict_serving(tbl, self.requests, scheduler=self.space.target.scheduler)
                metrics, capacity = self._serving_metrics(c, tbl, pred)
                # the band: the same machine on the profiles one standard error below and above
                ends = [self._serving_metrics(c, t, predict_serving(t, self.requests,
                                                                   scheduler=self.space.target.scheduler))[0]
                        for t in (tbl.shifted(-1.0), tbl.shifted(1.0))] if interval else None
            else:
                capacity = None
                pred = predict(tbl, self.requests, mode=self.space.target.batching, interval=interval)
                metrics = self._metrics(c, pred)
                ends = ([self._metrics(c, pred.low), self._metrics(c, pred.high)]
                        if pred.low is not None and pred.high is not None else None)
        except LensoptError as exc:
            return Evaluation(c, infeasible=str(exc))
        if not all(math.isfinite(metrics[k]) for k in (self.space.objectives.throughput, self.space.objectives.latency)):
            return Evaluation(c, infeasible="objective is undefined for this workload (e.g. TPOT of one-token outputs)")
        bounds = band(metrics, *ends) if ends is not None else {}
        return Evaluation(c, metrics=metrics, source=source, prediction=pred, bounds=bounds, capacity=capacity)

    def _metrics(self, c: Candidate, pred: Prediction) -> dict:
        return self._per_host(c, summarize_prediction(self.requests, pred, chips=c.tp))

    def _per_host(self, c: Candidate, metrics: dict) -> dict:
        cph = self.space.hosts.chips_per_host
        if cph:
            metrics["throughput_tok_s_per_host"] = metrics["throughput_tok_s_per_chip"] * (cph // c.tp) * c.tp
        return metrics

    def _serving_metrics(self, c: Candidate, tbl: UnitTable,
                         pred: ServingPrediction) -> tuple[dict[str, float], RateSearch | None]:
        """The summary of ``pred``, and the sustainable-rate bisection when that is the objective."""
        sp = self.space
        metrics = summarize_serving_prediction(self.requests, pred, chips=c.tp, slo=self.request_slo)
        found = None
        if sp.objectives.throughput == "sustainable_rate_req_s_per_chip":
            found = self.sustainable(c, tbl)
            metrics["sustainable_rate_req_s"] = found.rate_req_s
            metrics["sustainable_rate_req_s_per_chip"] = found.rate_req_s / c.tp
        return self._per_host(c, metrics), found

    def table(self, c: Candidate) -> UnitTable:
        """The per-bucket numbers of a candidate that has profiles (measured, or from a prior)."""
        prof, _ = self._profiles(c)
        if prof is None:
            raise LensoptError(f"no profiles for {c.label()}")
        return UnitTable.build(c, prof, policy=self.space.target.bucket_policy, prefill=self.space.target.prefill)

    def sustainable(self, c: Candidate, tbl: UnitTable | None = None) -> RateSearch:
        """The largest sustainable rate of ``c`` on this workload's arrival pattern (``lens.capacity``)."""
        tbl = self.table(c) if tbl is None else tbl
        return max_sustainable_rate(tbl, self.requests, unit_arrival_s=self.unit_arrival_s,
                                    scheduler=self.space.target.scheduler, chips=c.tp, slo=dict(self.space.slo),
                                    max_queue_growth=self.space.objectives.max_queue_growth)

    def reevaluate(self, candidates) -> list[Evaluation]:
        return [self.evaluate(c) for c in candidates]


def _nbytes(e: Evaluation) -> int:
    """Bytes of an evaluation's per-request arrays (a static or a serving prediction, its tail's runs too)."""
    return 0 if e.prediction is None else _array_bytes(e.prediction)


def _array_bytes(record) -> int:
    """Bytes of the arrays a record holds, in its own fields and in the records among them."""
    total = 0
    for f in dataclasses.fields(record):
        v = getattr(record, f.name)
        if isinstance(v, np.ndarray):
            total += v.nbytes
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            total += _array_bytes(v)
    return total
