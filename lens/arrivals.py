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


def assign(requests: Requests, *, rate: float | None, burstiness: float = 1.0,
           seed: int = 0) -> tuple[Requests, str, float]:
    """Arrival times for serving ``requests``: (requests with them, where they came from, nominal rate).

    ``rate`` None: the requests' own arrival times (a trace's), shifted to start at 0.
    ``rate`` given: a trace's own arrivals rescaled to that mean rate (their burstiness
    kept), or, for requests without arrival times, a seeded Poisson/Gamma process.
    """
    own = requests.arrival_s
    if rate is None:
        if own is None:
            raise UserError("continuous serving needs arrival times: give an arrival rate (requests per second), "
                            "or a trace with an arrival column")
        a = np.asarray(own, np.float64) - float(np.min(own))
        return with_arrivals(requests, a), "trace", mean_rate(a)
    rate = check_rate(rate)
    if own is not None and math.isfinite(mean_rate(own)):
        if burstiness != 1.0:
            raise UserError(f"burstiness {burstiness:g} shapes Poisson arrivals; these requests bring their own arrival "
                            f"times (rescaled to the rate), so leave burstiness at 1")
        return with_arrivals(requests, rescale(own, rate)), "trace, rescaled", rate
    return with_arrivals(requests, poisson(len(requests), rate=rate, seed=seed, burstiness=burstiness)), "poisson", rate
