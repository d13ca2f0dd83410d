"""Serving metrics of one run with arrivals: request throughput, goodput, queue growth.

The same function summarises a prediction (``lens.serving``) and a measurement (a runner's
continuous-mode ``WorkloadRun``): both give per-request TTFT and E2E from each request's
arrival, and the run's duration.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .arrivals import mean_rate
from .compose import UnitTable
from .metrics import LATENCIES, band, latency_stats, summarize, tpot_of
from .serving import predict_band
from .types import Requests, Scheduler, WorkloadRun

#: the order in which an SLO key's statistic ranks (the highest gives a per-request threshold)
_RANK = {"mean": 50.0, "p50": 50.0, "p90": 90.0, "p99": 99.0}


@dataclass(frozen=True)
class RequestSLO:
    """Per-request latency thresholds (seconds): a request within all of them counts toward goodput.

    ``None`` leaves a latency unconstrained (vLLM's ``--goodput ttft:MS tpot:MS e2el:MS``).
    """

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    @classmethod
    def from_constraints(cls, slo: Mapping[str, float]) -> "RequestSLO":
        """Thresholds from percentile constraints (``ttft_p90_s = 0.5`` ...): per latency, the
        value of its highest-percentile key (a request within it is one the constraint allows)."""
        best: dict[str, tuple[float, float]] = {}
        for key, value in slo.items():
            kind, stat = key.split("_")[0], key.split("_")[1] if key.count("_") >= 2 else ""
            if kind in LATENCIES and stat in _RANK:
                rank = _RANK[stat]
                if kind not in best or rank > best[kind][0]:
                    best[kind] = (rank, float(value))
        return cls(**{f"{k}_s": v for k, (_, v) in best.items()})

    @property
    def empty(self) -> bool:
        return self.ttft_s is None and self.tpot_s is None and self.e2e_s is None

    def good(self, *, ttft_s: np.ndarray, tpot_s: np.ndarray, e2e_s: np.ndarray) -> np.ndarray:
        """True for each request within every threshold (a one-token request has no TPOT to miss)."""
        ok = np.ones(np.shape(ttft_s), dtype=bool)
        if self.ttft_s is not None:
            ok &= np.asarray(ttft_s) <= self.ttft_s
        if self.tpot_s is not None:
            t = np.asarray(tpot_s)
            ok &= ~(t > self.tpot_s)  # NaN (one token) passes
        if self.e2e_s is not None:
            ok &= np.asarray(e2e_s) <= self.e2e_s
        return ok

    def label(self) -> str:
        parts = [f"{k} <= {v * 1e3:g} ms" for k, v in (("TTFT", self.ttft_s), ("TPOT", self.tpot_s),
                                                        ("E2E", self.e2e_s)) if v is not None]
        return ", ".join(parts) or "none"


def queue_growth(arrival_s: np.ndarray, ttft_s: np.ndarray) -> float:
    """Least-squares slope of TTFT against arrival time (seconds of waiting per second of trace).

    TTFT is queueing plus the prefills ahead of the request; only the queue trends, so the
    slope is near 0 for a deployment that keeps up and near lambda/mu - 1 for one offered
    lambda while it serves mu < lambda.
    """
    a = np.asarray(arrival_s, dtype=np.float64)
    y = np.asarray(ttft_s, dtype=np.float64)
    if a.size < 2 or float(a.max() - a.min()) <= 0:
        return 0.0
    a = a - a.mean()
    return float((a * (y - y.mean())).sum() / (a * a).sum())


def summarize_serving(
    requests: Requests,
    *,
    ttft_s: np.ndarray,
    e2e_s: np.ndarray,
    total_s: float,
    chips: int = 1,
    slo: RequestSLO | None = None,
    tpot_s: np.ndarray | None = None,
    queue_s: np.ndarray | None = None,
    prefill_padding: float | None = None,
    decode_padding: float | None = None,
) -> dict[str, Any]:
    """``lens.metrics.summarize`` plus request throughput, goodput, the offered rate and queue growth.

    ``total_s`` is the run's duration (first arrival to last completion); TTFT and E2E are
    measured from each request's arrival.
    """
    tpot = tpot_of(ttft_s, e2e_s, requests.output_len) if tpot_s is None else tpot_s
    m = summarize(requests, ttft_s=ttft_s, e2e_s=e2e_s, total_s=total_s, chips=chips, tpot_s=tpot,
                  prefill_padding=prefill_padding, decode_padding=decode_padding)
    n = len(requests)
    arrival = requests.arrival_s if requests.arrival_s is not None else np.zeros(n)
    good = (slo or RequestSLO()).good(ttft_s=ttft_s, tpot_s=tpot, e2e_s=e2e_s)
    dur = float(total_s)
    m["request_throughput_req_s"] = n / dur if dur > 0 else math.nan
    m["request_throughput_req_s_per_chip"] = m["request_throughput_req_s"] / chips
    m["request_goodput_req_s"] = float(good.sum()) / dur if dur > 0 else math.nan
    m["goodput_req_s_per_chip"] = m["request_goodput_req_s"] / chips
    m["good_fraction"] = float(good.mean())
    m["offered_rate_req_s"] = mean_rate(arrival)
    m["queue_growth"] = queue_growth(arrival, ttft_s)
    if queue_s is not None:
        q = np.asarray(queue_s, dtype=np.float64)
        m["queue_mean_s"] = float(q.mean())
        m["queue_p90_s"] = float(np.percentile(q, 90))
    return m


def summarize_serving_prediction(requests: Requests, pred, *, chips: int = 1,
                                 slo: RequestSLO | None = None) -> dict[str, Any]:
    """``summarize_serving`` for a ``lens.serving.ServingPrediction`` of ``requests``.

    With a measured tail of the prompts' TTFT (``lens.prefill_tail``) or wander of the decode's pace
    (``lens.decode_pace``), the prediction holds the runs that drew them (``pred.tail_runs``): the TTFT, TPOT and E2E means and percentiles, the queueing, the
    good fraction and the goodput are read over every run's requests. The throughput and the queue's growth are
    the run as composed.
    """
    m = summarize_serving(
        requests, ttft_s=pred.ttft_s, e2e_s=pred.e2e_s, total_s=pred.total_s, chips=chips, slo=slo,
        tpot_s=pred.tpot_s, queue_s=pred.queue_s, prefill_padding=pred.prefill_padding,
        decode_padding=pred.decode_padding,
    )
    runs = pred.tail_runs
    if runs is not None and len(requests):
        arr = pred.arrival_s[:, None]
        ttft, e2e, queue = runs.first_s - arr, runs.finish_s - arr, runs.admit_s - arr
        tpot = tpot_of(ttft, e2e, pred.output_len[:, None])
        for kind, x in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
            m.update(latency_stats(kind, x.ravel()))
        m["queue_mean_s"] = float(queue.mean())
        m["queue_p90_s"] = float(np.percentile(queue, 90))
        good = (slo or RequestSLO()).good(ttft_s=ttft, tpot_s=tpot, e2e_s=e2e)
        dur = float(pred.total_s)
        m["request_goodput_req_s"] = float(good.mean(axis=1).sum()) / dur if dur > 0 else math.nan
        m["goodput_req_s_per_chip"] = m["request_goodput_req_s"] / chips
        m["good_fraction"] = float(good.mean())
    return m


def summarized_band(requests: Requests, point: Mapping[str, Any], table: UnitTable, *, scheduler: Scheduler,
                    chips: int = 1, slo: RequestSLO | None = None) -> dict[str, tuple[float, float]]:
    """``lens.metrics.band`` of ``point``, the summary of ``predict_serving(table, requests)``: each figure's least and
    most over it and the same prediction on the table one standard error below and above (``lens.serving.predict_band``,
    summarized as ``point`` was)."""
    return band(point, *(summarize_serving_prediction(requests, p, chips=chips, slo=slo)
                         for p in predict_band(table, requests, scheduler=scheduler)))


def summarize_serving_passes(requests: Requests, runs: Sequence[WorkloadRun], *, chips: int = 1,
                             slo: RequestSLO | None = None) -> dict[str, Any]:
    """``summarize_serving`` of passes of ``requests`` served at the same arrivals: each figure the median of the
    passes' own (each pass summarized as it ran).

    Each pass holds the host's jitter, as each run of a prediction that draws it (``lens.prefill_tail``,
    ``lens.decode_pace``) does; the median over the passes leaves out a pass that met a slow spell of the host.
    Not the summary of each request's median over the passes (``WorkloadRun.median_of``): that strips every
    request of the jitter between passes, so its TTFT p90 sits below what any pass shows, and a prediction of
    that jitter would be judged against a narrower distribution than the one it predicts.
    """
    return median_summary([summarize_serving(requests, ttft_s=r.ttft_s, e2e_s=r.e2e_s, total_s=r.total_s,
                                             chips=chips, slo=slo) for r in runs])


def median_summary(each: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Summaries of passes of one workload as one: each number the passes' median (a count that all share stays
    a whole number), anything else the first pass's."""
    if not each:
        raise ValueError("median_summary: no passes")
    out: dict[str, Any] = {}
    for k, v in each[0].items():
        med = float(np.median([m[k] for m in each])) if isinstance(v, (int, float)) else v
        out[k] = int(med) if isinstance(v, int) and float(med).is_integer() else med  # counts stay counts
    return out


def range_share(values) -> float:
    """How far repeated readings of one metric spread: (max - min) / median (NaN without a median)."""
    v = np.asarray(values, dtype=np.float64)
    med = float(np.median(v)) if v.size else math.nan
    return float((v.max() - v.min()) / med) if v.size and med else math.nan


def median_interval(values, coverage: float = 0.9) -> tuple[float, float, float]:
    """Where the median of repeated readings of one metric lies: the distribution-free interval between the k-th
    smallest and the k-th largest reading, with k the largest whose coverage reaches ``coverage``.

    The median of n readings lies below the k-th smallest with probability P(Binomial(n, 1/2) < k), whatever the
    readings' distribution, so [x(k), x(n+1-k)] covers it with 1 - 2 P(Binomial(n, 1/2) <= k - 1). Few readings
    cannot reach a high coverage: 3 give at most 75% (their whole range), 9 give 96% between the second smallest
    and the second largest. Returns (low, high, the coverage reached); all NaN without a reading.
    """
    if not 0.0 < coverage < 1.0:
        raise ValueError(f"median_interval: coverage {coverage} is not between 0 and 1")
    v = np.sort(np.asarray(values, dtype=np.float64))
    n = v.size
    if n == 0:
        return math.nan, math.nan, math.nan

    # below[k]: P(Binomial(n, 1/2) <= k - 1), the chance the median lies below the k-th smallest
    below = np.cumsum([math.comb(n, i) for i in range(n)]) / 2.0 ** n
    k = 1
    while k + 1 <= (n + 1) // 2 and 1.0 - 2.0 * below[k] >= coverage:
        k += 1
    return float(v[k - 1]), float(v[n - k]), float(1.0 - 2.0 * below[k - 1])
