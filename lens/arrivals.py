"""Arrival processes for serving: seeded Poisson (Gamma) arrivals, and a trace's own arrivals.

The gaps are drawn once at rate 1 and divided by the rate, so one seed gives the same
arrival *pattern* at every rate: a rate sweep or a bisection then compares like with like
(common random numbers), and the prediction is a deterministic function of the rate.
"""
from __future__ import annotations

import math

import numpy as np

from .errors import UserError
from .types import Requests

#: most requests per second an arrival rate may name (more is a unit mistake)
MAX_RATE = 1e9


def check_rate(rate: float, *, what: str = "arrival rate") -> float:
    """``rate`` as a float; ``UserError`` unless it is a finite number > 0."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float, np.integer, np.floating)):
        raise UserError(f"{what} {rate!r}: give a number of requests per second > 0")
    r = float(rate)
    if not (math.isfinite(r) and 0 < r <= MAX_RATE):
        raise UserError(f"{what} {rate!r}: give a number of requests per second > 0 (at most {MAX_RATE:g})")
    return r


def unit_gaps(n: int, *, seed: int, burstiness: float = 1.0) -> np.ndarray:
    """``n`` arrival times at rate 1: first at 0, then Gamma(shape=burstiness, mean 1) gaps.

    ``burstiness`` 1 is a Poisson process; below 1 burstier, above 1 more regular (the
    process of ``vllm bench serve --request-rate R --burstiness K``).
    """
    if n < 1:
        raise UserError(f"{n} requests: an arrival process needs at least one")
    if isinstance(burstiness, bool) or not (isinstance(burstiness, (int, float)) and math.isfinite(burstiness)
                                             and burstiness > 0):
        raise UserError(f"burstiness {burstiness!r}: give a number > 0 (1 = Poisson)")
    if seed < 0:
        raise UserError(f"seed {seed}: a seed is an integer >= 0")
    rng = np.random.default_rng(seed)
    k = float(burstiness)
    gaps = rng.gamma(shape=k, scale=1.0 / k, size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def poisson(n: int, *, rate: float, seed: int, burstiness: float = 1.0) -> np.ndarray:
    """``n`` arrival times (seconds) of a seeded Poisson (or Gamma) process at ``rate`` requests/s."""
    return unit_gaps(n, seed=seed, burstiness=burstiness) / check_rate(rate)


def mean_rate(arrival_s: np.ndarray) -> float:
    """Requests per second of an arrival sequence: (n - 1) / span; inf when all arrive at once."""
    a = np.asarray(arrival_s, dtype=np.float64)
    span = float(a.max() - a.min()) if a.size else 0.0
    return (a.size - 1) / span if span > 0 else math.inf


def rescale(arrival_s: np.ndarray, rate: float) -> np.ndarray:
    """A trace's arrivals, shifted to start at 0 and stretched to mean ``rate`` requests/s."""
    a = np.asarray(arrival_s, dtype=np.float64)
    a = a - a.min()
    own = mean_rate(a)
    if not math.isfinite(own):
        raise UserError("the trace's requests all arrive at the same time; it has no rate to rescale")
    return a * (own / check_rate(rate))


def with_arrivals(requests: Requests, arrival_s: np.ndarray) -> Requests:
    """``requests`` with the given arrival times (one per request, finite, >= 0)."""
    a = np.asarray(arrival_s, dtype=np.float64)
    if a.shape != requests.input_len.shape:
        raise UserError(f"{a.size} arrival times for {len(requests)} requests; give one per request")
    if not np.isfinite(a).all() or (a < 0).any():
        raise UserError("arrival times must be finite and >= 0 seconds")
    return Requests(requests.input_len, requests.output_len, a, requests.name)


def window(requests: Requests, n: int, *, seed: int) -> Requests:
    """``n`` consecutive requests of a trace, from a seeded start: its arrival process unthinned.

    Random rows (``workload.sample``) would thin the arrivals; a window keeps their pattern.
    The window's arrivals start at 0.
    """
    total = len(requests)
    if n >= total:
        out = requests
    else:
        start = int(np.random.default_rng(seed).integers(0, total - n + 1))
        out = Requests(requests.input_len[start:start + n], requests.output_len[start:start + n],
                       None if requests.arrival_s is None else requests.arrival_s[start:start + n], requests.name)
    if out.arrival_s is not None:
        out = Requests(out.input_len, out.output_len, out.arrival_s - out.arrival_s.min(), out.name)
    return out
