"""What a decode run costs after a served admission, beyond its steps' TBT_b.

A static batch prefills its prompts once and then decodes to its end; its probes (``lens.probes``)
solve TBT_b as the slope between a short and a long run, so whatever the first decode steps
after the prefills cost beyond the steady step lands in T1 and, spread over the batch, in
TTFT_b. A server alternates: every scheduler pass that admits a prompt stops the decode steps
for a prefill, and the decode then resumes. Where resuming costs something -- a stack that
switches between a context-encoding and a token-generation graph, caches the prefill left
cold, a host that drops the decode's pace while it prefills -- every pass pays it in full,
and every live request's TPOT carries it. Measured on the jax runner on this 2-core host,
the decode steps right after a served prefill run up to twice the steady step and settle
over about eight steps: a few milliseconds per pass, which the static profile does not
compose (served TPOT came out below the measured one in 23 of 24 rows of the jax serving
benchmark, and the knee's queueing with it).

``lens.serving`` adds ``resume_s`` to the first decode run after each pass that leaves a
live row.

The measurement, in the smallest measured token-generation bucket whose window holds a
prompt and ``LONG`` decode steps after it (``pick``): ``ROUNDS`` served calls, each of
``PAIRS`` pairs of lone requests (each arrives at an idle device and runs alone) of
``SHORT`` and of ``LONG`` decode steps, alternating. A lone request's decode seconds (its
E2E less its TTFT) are ``steps x step + resume``: per call,

    resume = (LONG median(D_short) - SHORT median(D_long)) / (LONG - SHORT)

the intercept of the two lengths. The served step is the slope of the same call, so a host
slower than when it profiled moves both alike and leaves the intercept alone; ``SHORT`` is
past the settling steps, so the slope is the steady step's. The estimate is the mean over
the calls; its standard error the larger of what resampling each call's pairs gives and what
the calls' disagreement gives (as ``lens.admission``). It is kept only beyond ``SIGMAS``
standard errors (else 0: the decode resumes at its steady pace), and never below minus one
steady step (a resumed run cannot skip a step).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .buckets import decode_windows
from .noise import DRAWS, SEED, rounds_estimate
from .types import BucketProfile, Requests

#: decode steps of the short and the long requests: the short past the settling steps (about eight on the
#: jax runner), the long far enough from it that the slope between them is the steady step's
SHORT = 16
LONG = 48
#: pairs of lone requests per served call, and served calls: the calls' disagreement shows a host that drifts
#: between them (as lens.admission's rounds), and on the jax runner two calls disagreed by 5-12 ms on an effect
#: of 10-17 ms, which three tell apart from none more often
PAIRS = 8
ROUNDS = 3
#: each lone request arrives this many times its predecessor's expected seconds after it, so that it finds the
#: device idle on a host up to that much slower than when it profiled
GAP = 1.5
#: kept only beyond this many standard errors (as lens.rows, lens.admission and lens.context_cost)
SIGMAS = 3.0


@dataclass(frozen=True)
class ResumeCost:
    """Seconds a decode run costs after a served admission beyond its steps (``value``), as measured and as kept."""

    value: float
    #: one standard error of ``raw``
    err: float
    #: the estimate before the significance test and the bound
    raw: float
    #: the token-generation bucket it was measured in and the prompt (0: not measured)
    bucket: int = 0
    prompt: int = 0
    #: the served steady step of the calls (seconds), for the record
    step_s: float = 0.0
    #: why ``value`` is not ``raw`` ("" when it is)
    note: str = ""

    def said(self) -> str:
        """One line for the profile output."""
        kept = f"{self.value * 1e3:+.3f} ms per decode run after an admission pass"
        where = f" (bucket {self.bucket}, prompt {self.prompt}, steady step {self.step_s * 1e3:.3f} ms)" \
            if self.bucket else ""
        if self.note:
            return f"{kept}{where}: {self.note}"
        return f"{kept} (+- {self.err * 1e3:.3f}){where}"


def unit_resume(profiles: Sequence[BucketProfile]) -> float:
    """A unit's ``resume_s`` from its profiles: their median (one measurement gives them all the same); 0 without."""
    return float(np.median([p.resume_s for p in profiles])) if profiles else 0.0


def pick(profiles: Mapping[int, BucketProfile], buckets: Sequence[int], policy: str) -> tuple[BucketProfile, int] | None:
    """The token-generation bucket to measure in and the prompt: the smallest measured bucket whose window holds a
    prompt and ``LONG`` decode steps after it (``lens.buckets.decode_windows``); None when no bucket qualifies."""
    found = next((w for w in decode_windows(profiles, buckets, policy) if w[2] >= LONG), None)
    return None if found is None else (profiles[found[0]], found[1])


def workload(prompt: int, *, ttft_s: float, tbt_s: float, pairs: int = PAIRS) -> Requests:
    """``pairs`` pairs of lone requests of ``prompt`` tokens, ``SHORT`` then ``LONG`` decode steps, each arriving
    at an idle device (``ttft_s``, ``tbt_s``: the profile's prefill and step, for the gap)."""
    n = 2 * pairs
    lout = np.tile(np.asarray([SHORT + 1, LONG + 1], dtype=np.int64), pairs)
    gaps = GAP * (max(ttft_s, 0.0) + (lout - 1) * max(tbt_s, 0.0)) + 1e-3
    arrival = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    return Requests(np.full(n, prompt, np.int64), lout, arrival, name="resume-cost")


def decode_times(ttft_s: Sequence[float], e2e_s: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """The short and the long requests' decode seconds in ``workload``'s run (E2E - TTFT), one of each per pair."""
    d = np.asarray(e2e_s, dtype=float) - np.asarray(ttft_s, dtype=float)
    d = d[: d.size // 2 * 2]
    return d[0::2], d[1::2]


def intercept(d_short: np.ndarray, d_long: np.ndarray, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """(resume, step) from the medians of the short and the long decode seconds."""
    ms, ml = np.median(d_short, axis=axis), np.median(d_long, axis=axis)
    return (LONG * ms - SHORT * ml) / (LONG - SHORT), (ml - ms) / (LONG - SHORT)


def solve(rounds: Sequence[tuple[np.ndarray, np.ndarray]], *, p: BucketProfile, prompt: int,
          draws: int = DRAWS, seed: int = SEED) -> ResumeCost:
    """``resume_s`` from ``rounds`` of (short, long) decode seconds, one tuple per served call."""
    rounds = [(np.asarray(s, dtype=float), np.asarray(lg, dtype=float)) for s, lg in rounds]
    rounds = [(s, lg) for s, lg in rounds if s.size and s.size == lg.size]
    if not rounds:
        return ResumeCost(0.0, 0.0, 0.0, p.bucket, prompt, note="no whole pair was run")
    rng = np.random.default_rng(seed)
    per, boot, steps = [], [], []
    for s, lg in rounds:
        r, st = intercept(s, lg)
        per.append(float(r))
        steps.append(float(st))
        idx = rng.integers(0, s.size, size=(draws, s.size))  # pairs drawn whole: a slow minute stays paired
        boot.append(intercept(s[idx], lg[idx], axis=1)[0])
    raw, err = rounds_estimate(per, boot)
    step = float(np.mean(steps))
    if abs(raw) <= SIGMAS * err:
        return ResumeCost(0.0, err, raw, p.bucket, prompt, step,
                          f"{raw * 1e3:+.3f} ms +- {err * 1e3:.3f}: within {SIGMAS:g} standard errors of none, none "
                          f"counted: the decode resumes at its steady pace")
    floor = -max(step, 0.0)
    if raw < floor:
        return ResumeCost(floor, err, raw, p.bucket, prompt, step,
                          f"measured {raw * 1e3:+.3f} ms, bounded at minus one step (a resumed run cannot skip one)")
    return ResumeCost(raw, err, raw, p.bucket, prompt, step)
