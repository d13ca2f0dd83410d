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

What it costs depends on what the device did before the pass. On the jax runner it grows with
the idle spell before it: lone requests in bucket 64 paid +0.8 and +1.9 ms after 4-6 ms idle,
+3.7 and +4.0 after 30 ms and +4.2 and +4.9 after 100 ms (batch 4 and 8, one diagnostic run),
so a pass that comes while the device decodes pays little of what one after a long wait does
(a host's caches and clocks going cold while it waits). ``lens.serving`` adds to the first
decode run after each pass that leaves a live row the cost at the idle spell before the pass
(``after_idle``): interpolated between the measured spells, the shortest one's for a pass that
found the device busy (no spell shorter than it is measured), ``resume_s`` (the longest
one's) for a pass after a longer one.

The measurement, in the smallest measured token-generation bucket whose window holds a
prompt and ``LONG`` decode steps after it (``pick``): ``ROUNDS`` served calls, each of
``GROUPS`` groups of lone requests of ``SHORT`` and of ``LONG`` decode steps, each arriving
``IDLE`` seconds after the one before it is expected to end (with a slack: ``MARGIN``). A
lone request's decode seconds (its E2E less its TTFT) are ``steps x step + resume``: per
call and idle spell,

    resume = (LONG median(D_short) - SHORT median(D_long)) / (LONG - SHORT)

the intercept of the two lengths. The served step is the slope of the same call, so a host
slower than when it profiled moves both alike and leaves the intercept alone; ``SHORT`` is
past the settling steps, so the slope is the steady step's. A request that arrived before
the one ahead of it ended did not run alone and is left out; the spell each idle level had
is the median of its requests' own (their arrival less the previous one's end). The
estimate is the mean over the calls; its standard error the larger of what resampling each
call's requests gives and what the calls' disagreement gives (as ``lens.admission``). The
longest spell's is ``resume_s``, kept only beyond ``SIGMAS`` standard errors (else 0, and
none at any spell: the decode resumes at its steady pace), and never below minus one steady
step (a resumed run cannot skip a step); a shorter spell's is bounded by it and by the
next longer one's (a device that waited less is not colder).
"""
from __future__ import annotations

import bisect
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
#: the idle spells before the lone requests, in seconds after the one before is expected to end (``MARGIN``):
#: about what a pass that follows a decode's end finds, a short wait and a long one
IDLE = (0.001, 0.03, 0.1)
#: groups of lone requests (each a short and a long one at every idle spell) per served call, and served calls:
#: the calls' disagreement shows a host that drifts between them (as lens.admission's rounds), and on the jax
#: runner two calls disagreed by 5-12 ms on an effect of 10-17 ms, which three tell apart from none more often
GROUPS = 8
ROUNDS = 3
#: a request is expected to end its profile's seconds after it arrives, plus a slack of this share of a long
#: request's (the same after either length, so that a short and a long request wait alike): the shortest spell's
#: requests find the device idle on a host up to that much slower than when it profiled (the others later)
MARGIN = 0.1
#: the fewest lone requests of each length an idle spell needs in a call to be read there
LEAST = 3
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
    #: (idle seconds before the pass, seconds) at each idle spell read, shortest first, as kept (empty: ``value``
    #: after any pass)
    by_idle: tuple[tuple[float, float], ...] = ()

    def said(self) -> str:
        """One line for the profile output."""
        kept = f"{self.value * 1e3:+.3f} ms per decode run after an admission pass"
        where = f" (bucket {self.bucket}, prompt {self.prompt}, steady step {self.step_s * 1e3:.3f} ms)" \
            if self.bucket else ""
        if self.note:
            return f"{kept}{where}: {self.note}"
        spells = "" if not self.by_idle else "; after an idle spell of " + ", ".join(
            f"{i * 1e3:.0f} ms {c * 1e3:+.2f}" for i, c in self.by_idle) + " ms"
        return f"{kept} (+- {self.err * 1e3:.3f}){where}{spells}"


def unit_resume(profiles: Sequence[BucketProfile]) -> float:
    """A unit's ``resume_s`` from its profiles: their median (one measurement gives them all the same); 0 without."""
    return float(np.median([p.resume_s for p in profiles])) if profiles else 0.0


def unit_by_idle(profiles: Sequence[BucketProfile]) -> tuple[tuple[float, float], ...]:
    """A unit's ``resume_idle`` from its profiles (one measurement gives them all the same); () without."""
    return next((p.resume_idle for p in profiles if p.resume_idle), ())


def unit_by_pass(profiles: Sequence[BucketProfile]) -> tuple[tuple[float, float], ...]:
    """A unit's ``resume_busy`` from its profiles (one measurement gives them all the same); () without."""
    return next((p.resume_busy for p in profiles if p.resume_busy), ())


def split(pairs: Sequence[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """(x, cost) pairs as the two lists ``after_idle`` interpolates over (empty for none)."""
    return [float(x) for x, _ in pairs], [float(c) for _, c in pairs]


def curve(resume_s: float, by_idle: Sequence[tuple[float, float]] = ()) -> tuple[list[float], list[float]]:
    """(idle spells, costs) for ``after_idle``: the measured ones, or ``resume_s`` after any spell without them."""
    if not by_idle:
        return [0.0], [resume_s]
    return split(by_idle)


def after_idle(idle_s: float, spells: list[float], costs: list[float]) -> float:
    """What the first decode run after a pass costs beyond its steps when the device sat idle ``idle_s`` before
    it (0: it was busy): ``costs`` interpolated over ``spells`` (``curve``), flat beyond either end."""
    if idle_s <= spells[0]:
        return costs[0]
    if idle_s >= spells[-1]:
        return costs[-1]
    j = bisect.bisect_right(spells, idle_s)
    w = (idle_s - spells[j - 1]) / (spells[j] - spells[j - 1])
    return costs[j - 1] + w * (costs[j] - costs[j - 1])


def pick(profiles: Mapping[int, BucketProfile], buckets: Sequence[int], policy: str) -> tuple[BucketProfile, int] | None:
    """The token-generation bucket to measure in and the prompt: the smallest measured bucket whose window holds a
    prompt and ``LONG`` decode steps after it (``lens.buckets.decode_windows``); None when no bucket qualifies."""
    found = next((w for w in decode_windows(profiles, buckets, policy) if w[2] >= LONG), None)
    return None if found is None else (profiles[found[0]], found[1])


def _levels(n: int) -> np.ndarray:
    """The index in ``IDLE`` of each of ``workload``'s first ``n`` requests (a short and a long one per spell)."""
    return np.arange(n) // 2 % len(IDLE)


def workload(prompt: int, *, ttft_s: float, tbt_s: float, groups: int = GROUPS) -> Requests:
    """``groups`` groups of lone requests of ``prompt`` tokens: at each ``IDLE`` spell one of ``SHORT`` and one of
    ``LONG`` decode steps, each arriving that spell after the one before is expected to end (``ttft_s``, ``tbt_s``:
    the profile's prefill and step)."""
    lout = np.tile(np.asarray([SHORT + 1, LONG + 1], dtype=np.int64), groups * len(IDLE))
    idle = np.asarray(IDLE)[_levels(lout.size)]
    ttft_s, tbt_s = max(ttft_s, 0.0), max(tbt_s, 0.0)
    ends = ttft_s + (lout - 1) * tbt_s + MARGIN * (ttft_s + LONG * tbt_s)
    arrival = np.concatenate([[0.0], np.cumsum(ends[:-1] + idle[1:])])
    return Requests(np.full(lout.size, prompt, np.int64), lout, arrival, name="resume-cost")


@dataclass(frozen=True)
class LoneRuns:
    """One served call of ``workload``: per request its idle spell's index in ``IDLE``, its decode steps, its
    decode seconds (E2E - TTFT) and the idle seconds before it (<= 0: it arrived before the one ahead ended)."""

    level: np.ndarray
    steps: np.ndarray
    decode_s: np.ndarray
    idle_s: np.ndarray


def lone_runs(requests: Requests, ttft_s: Sequence[float], e2e_s: Sequence[float]) -> LoneRuns:
    """``workload``'s served call as ``LoneRuns`` (the first request's spell: infinite, a run starts idle)."""
    arr = np.asarray(requests.arrival_s, dtype=float)
    e2e = np.asarray(e2e_s, dtype=float)
    n = arr.size
    idle = np.concatenate([[np.inf], arr[1:] - (arr[:-1] + e2e[:-1])])
    return LoneRuns(_levels(n), np.asarray(requests.output_len[:n], dtype=np.int64) - 1, e2e - np.asarray(ttft_s, float),
                    idle)


def intercept(d_short: np.ndarray, d_long: np.ndarray, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """(resume, step) from the medians of the short and the long decode seconds."""
    ms, ml = np.median(d_short, axis=axis), np.median(d_long, axis=axis)
    return (LONG * ms - SHORT * ml) / (LONG - SHORT), (ml - ms) / (LONG - SHORT)


def _spell(rounds: Sequence[LoneRuns], level: int, rng, draws: int):
    """(raw, err, step, idle seconds) at one idle spell over the calls that ran enough of it alone; None if none."""
    per, boot, steps, idle = [], [], [], []
    for r in rounds:
        m = (r.level == level) & (r.idle_s > 0) & np.isfinite(r.idle_s)  # (a call's first waited for as long)
        s, lg = r.decode_s[m & (r.steps == SHORT)], r.decode_s[m & (r.steps == LONG)]
        if min(s.size, lg.size) < LEAST:
            continue
        c, st = intercept(s, lg)
        per.append(float(c))
        steps.append(float(st))
        idle.append(float(np.median(r.idle_s[m])))
        boot.append(intercept(s[rng.integers(0, s.size, size=(draws, s.size))],
                              lg[rng.integers(0, lg.size, size=(draws, lg.size))], axis=1)[0])
    if not per:
        return None
    raw, err = rounds_estimate(per, boot)
    return raw, err, float(np.mean(steps)), float(np.median(idle))


def solve(rounds: Sequence[LoneRuns], *, p: BucketProfile, prompt: int, draws: int = DRAWS,
          seed: int = SEED) -> ResumeCost:
    """``resume_s``, and the cost at each idle spell, from ``rounds`` of ``lone_runs``, one per served call."""
    rng = np.random.default_rng(seed)
    spells = [_spell(rounds, lv, rng, draws) for lv in range(len(IDLE))]
    if spells[-1] is None:
        return ResumeCost(0.0, 0.0, 0.0, p.bucket, prompt, note="no lone request ran after the longest idle spell")
    raw, err, step, _ = spells[-1]
    if abs(raw) <= SIGMAS * err:
        return ResumeCost(0.0, err, raw, p.bucket, prompt, step,
                          f"{raw * 1e3:+.3f} ms +- {err * 1e3:.3f}: within {SIGMAS:g} standard errors of none, none "
                          f"counted: the decode resumes at its steady pace")
    floor = -max(step, 0.0)
    if raw < floor:
        return ResumeCost(floor, err, raw, p.bucket, prompt, step,
                          f"measured {raw * 1e3:+.3f} ms, bounded at minus one step (a resumed run cannot skip one)")
    read = []
    for c, _, _, idle in sorted((x for x in spells if x is not None), key=lambda x: x[3]):
        if not read or idle > read[-1][0]:  # one cost per idle spell (a tie of medians keeps the first)
            read.append((idle, c))
    costs = np.minimum.accumulate(np.maximum([c for _, c in read], floor)[::-1])[::-1]  # a colder device pays more
    return ResumeCost(raw, err, raw, p.bucket, prompt, step,
                      by_idle=tuple((float(i), float(c)) for (i, _), c in zip(read, costs)))
