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

``lens.serving`` adds ``resume_s`` to the first decode run after a pass that found the device
idle (it waited for an arrival) and ``resume_busy_s`` to the first after one that stopped a
running decode, where a pass leaves a live row. The two differ where resuming after an idle
spell costs what resuming a decode that ran until the prefill does not (a host that lets its
caches go cold, or lowers its clock, while it waits).

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

A busy pass's (``busy_plan``), in the smallest measured window that holds a carrier request
decoding through a lone one: per served call, ``2 BUSY_PAIRS`` carriers one after another,
each arriving once the last lone request has ended, and one lone request of ``SHORT`` or
``LONG`` decode steps (alternating) arriving ``lens.admission.SETTLE`` steps into each
carrier's decode. The lone request's pass stops the carrier's decode; its decode seconds
are again ``steps x step + resume``, its steps those of two live rows, and the same
intercept solves it, kept as ``resume_s`` is. Not for a batch of one (no slot is free while
a request decodes) or where no window holds a carrier: ``resume_busy_s`` is then
``resume_s``, as one cost priced both before.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .admission import MARGIN, SETTLE
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
#: pairs per busy call: a lone request there decodes in the larger steps of the window that holds a carrier (on the
#: jax runner bucket 256 where the idle call's run in 64), whose jitter brought eight pairs' standard error to
#: 1.5-2.7 ms on an effect of 4-6 ms
BUSY_PAIRS = 16
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


def unit_resume(profiles: Sequence[BucketProfile]) -> tuple[float, float]:
    """A unit's (``resume_s``, ``resume_busy_s``) from its profiles: their medians (one measurement gives them all the
    same); zeros without any."""
    if not profiles:
        return 0.0, 0.0
    return (float(np.median([p.resume_s for p in profiles])),
            float(np.median([p.resume_busy_s for p in profiles])))


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


@dataclass(frozen=True, eq=False)
class BusyPlan:
    """The busy call: its requests (carriers and lone ones), which are lone, and where it decodes."""

    requests: Requests
    lone: np.ndarray  # bool per request
    bucket: int
    prompt: int


def busy_plan(profiles: Mapping[int, BucketProfile], buckets: Sequence[int], policy: str, *, batch: int,
              pairs: int = BUSY_PAIRS) -> BusyPlan | None:
    """``2 pairs`` carriers one after another, each with a lone request of ``SHORT`` or ``LONG`` decode steps
    (alternating) arriving while it decodes, all with the window's prompt, in the smallest measured
    token-generation window that holds a carrier; None for a batch of one or where no window does.

    A carrier outlasts its lone request on a host ``MARGIN`` times faster than when it profiled (its steps run
    alone then: TBT_b less the free rows' host cost, ``row_s``), and the next carrier arrives once that lone
    request has ended on a host ``GAP`` times slower: no pass falls in a lone request's decode but its own. The
    last carrier may still decode then, and for a few steps of the next lone request (its end is a completion,
    not a pass; a third row there costs ``row_s``; at a batch of two the next lone request waits for its slot,
    which moves its TTFT, not its decode)."""
    if batch < 2:
        return None
    for b, prompt, room, ctx_bucket in decode_windows(profiles, sorted(buckets), policy):
        tkg, ctx = profiles[b], profiles[ctx_bucket]
        tbt, ttft = max(tkg.tbt_s, 0.0), max(ctx.ttft_s, 0.0)
        alone = tkg.tbt_s - (batch - 1) * tkg.row_s
        if alone <= 0:
            continue
        lead = MARGIN * ttft + SETTLE * tbt  # the lone request lands on the carrier's settled steps
        lone = np.tile([SHORT, LONG], pairs)
        steps = np.ceil(MARGIN * (lead + ttft + lone * tbt) / alone).astype(np.int64) + SETTLE
        if steps.max() > room:
            continue
        period = GAP * (lead + ttft + lone * tbt)  # to the lone request's expected end, GAP times over
        start = np.concatenate([[0.0], np.cumsum(period[:-1])])
        n = 2 * lone.size
        arrival = np.empty(n)
        arrival[0::2], arrival[1::2] = start, start + lead
        lout = np.empty(n, np.int64)
        lout[0::2], lout[1::2] = steps + 1, lone + 1
        return BusyPlan(Requests(np.full(n, prompt, np.int64), lout, arrival, name=f"resume-busy-{b}"),
                        np.arange(n) % 2 == 1, b, prompt)
    return None


def busy_decode_times(ttft_s: Sequence[float], e2e_s: Sequence[float],
                      plan: BusyPlan) -> tuple[np.ndarray, np.ndarray]:
    """The lone short and long requests' decode seconds in ``plan``'s run, one of each per pair."""
    return decode_times(np.asarray(ttft_s, dtype=float)[plan.lone], np.asarray(e2e_s, dtype=float)[plan.lone])


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
