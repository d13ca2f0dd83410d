"""Workload-level metrics from per-request latencies (predicted or measured)."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .types import Requests

PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "e2e")


def latency_stats(prefix: str, x: np.ndarray) -> dict[str, float]:
    """``{prefix}_mean_s`` and ``{prefix}_p50_s``, ``_p90_s``, ``_p99_s`` of the finite values of ``x`` (NaN without)."""
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {f"{prefix}_mean_s": float("nan"), **{f"{prefix}_p{p}_s": float("nan") for p in PERCENTILES}}
    out = {f"{prefix}_mean_s": float(x.mean())}
    qs = np.percentile(x, PERCENTILES)
    out.update({f"{prefix}_p{p}_s": float(q) for p, q in zip(PERCENTILES, qs)})
    return out


def tpot_of(ttft_s: np.ndarray, e2e_s: np.ndarray, output_len: np.ndarray) -> np.ndarray:
    """Time per output token after the first: (E2E - TTFT) / (l_out - 1); NaN for one token."""
    steps = np.asarray(output_len) - 1
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(steps > 0, (np.asarray(e2e_s) - np.asarray(ttft_s)) / steps, np.nan)


def summarize(
    requests: Requests,
    *,
    ttft_s: np.ndarray,
    e2e_s: np.ndarray,
    total_s: float,
    chips: int = 1,
    tpot_s: np.ndarray | None = None,
    prefill_padding: float | None = None,
    decode_padding: float | None = None,
) -> dict[str, Any]:
    """Throughput (output tokens/s per replica and per chip), TTFT/TPOT/E2E mean/p50/p90/p99."""
    out_tokens = int(requests.output_len.sum())
    tpot = tpot_of(ttft_s, e2e_s, requests.output_len) if tpot_s is None else tpot_s
    m: dict[str, Any] = {
        "requests": len(requests),
        "output_tokens": out_tokens,
        "total_s": float(total_s),
        "throughput_tok_s": out_tokens / total_s if total_s > 0 else float("nan"),
        "throughput_tok_s_per_chip": out_tokens / total_s / chips if total_s > 0 else float("nan"),
    }
    m.update(latency_stats("ttft", ttft_s))
    m.update(latency_stats("tpot", tpot))
    m.update(latency_stats("e2e", e2e_s))
    if prefill_padding is not None:
        m["prefill_padding"] = prefill_padding
    if decode_padding is not None:
        m["decode_padding"] = decode_padding
    return m


def band(point: Mapping[str, Any], low: Mapping[str, Any], high: Mapping[str, Any]) -> dict[str, tuple[float, float]]:
    """Each float figure of ``point`` as an interval: the least and the most of it over ``point`` and the summaries
    ``low`` and ``high`` of the same prediction on costs one standard error below and above (``UnitTable.shifted``).

    The point is in its band: a queueing percentile need not move monotonically with the costs (one request
    admitted a step earlier or later moves a p90 either way)."""
    return {k: (min(low[k], high[k], v), max(low[k], high[k], v)) for k, v in point.items()
            if isinstance(v, float) and k in low and k in high}


def summarize_prediction(requests: Requests, pred, *, chips: int = 1) -> dict[str, Any]:
    """``summarize`` for a ``lens.compose.Prediction``."""
    return summarize(
        requests,
        ttft_s=pred.ttft_s,
        e2e_s=pred.e2e_s,
        total_s=pred.total_s,
        chips=chips,
        tpot_s=pred.tpot_s,
        prefill_padding=pred.prefill_padding,
        decode_padding=pred.decode_padding,
    )
