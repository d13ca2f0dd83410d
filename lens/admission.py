"""What a server's admissions cost against the static profile: a pass's first prompt, and each further one.

``TTFT_b`` is solved from static probes (``lens.probes``): one generate call encodes the
batch's prompts, and the call's fixed part -- tokenizing, padding and uploading the
batch, setting up sampling -- is spread over them (sequential prefill: TTFT_b = one
prefill + fixed / B). A server admits prompts as they arrive, in scheduler passes
(docs/serving.md), and what a pass costs need not be what a static call costs:

- a stack that pays the call's fixed part once per pass makes a lone arrival pay all of
  it, not a B-th of it: at a light rate TTFT reads higher than the profiles compose (by
  the fixed part x (1 - 1/B));
- a stack whose server skips part of the static call's setup, or adds work of its own per
  admitted request, costs less, or more, per admission.

Three offsets from TTFT_b describe a unit's server: ``first_s`` for the first prompt of a pass
that finds the device idle (it waited for an arrival), ``busy_s`` for the first prompt of a
pass that stops a running decode (or follows the last one's end with a request waiting), and
``next_s`` for each further one in the same pass. ``lens.serving`` charges a pass's prompts
TTFT_b + first_s (or busy_s), then TTFT_b + next_s each. With ``prefill = "batched"`` a pass
is one call whatever it holds: ``first_s`` or ``busy_s`` only. The two first prompts differ
where waking an idle host or device costs what a running one does not (on the jax runner on
this 2-core host, per request against three served runs, a prefill after an idle spell of
hundreds of milliseconds ran 1.4-3.3 ms over TTFT_b and one that stopped a running decode
within a millisecond of it: with one offset for both, lone arrivals at a light rate were
predicted 1.4-1.8 ms short and, at batch 4, those during a decode 1.2-2.8 ms long).

The measurement, in the unit's smallest measured bucket with one-token requests (a
prefill and nothing else; a served one frees its slot at once): ``ROUNDS`` rounds (and
``MORE_ROUNDS`` more where an offset is ``undecided``), each

- a static call of ``BATCHES`` full batches as the bucket's short probe runs them (a prefill
  and one decode step): per batch, its end less a step at TBT_b, over its prefill calls, is
  TTFT_b as the probes solve it (``lens.probes.derive``). That holds the first decode step's
  start-up over TBT_b, divided over the batch's prompts (on the jax runner at bucket 64,
  +0.62 ms a batch at batch 4, +0.80 at batch 8); a served prompt's first token does not wait
  for it (the decode after a pass pays it, ``lens.resume``). Against the prefill alone, as
  before, every offset carried it and every served prompt was charged it twice;
- a served call (``mode = "continuous"``) of ``BURSTS`` bursts of ``m`` requests arriving
  together at an idle device (``m``: the batch, or the scheduler's ``max_prefills`` when
  smaller; 1 with batched prefill): the first one's TTFT, and the slope of the later
  ones' TTFTs;
- a served call of carrier requests, each decoding in one token-generation bucket
  (``busy_plan``) while up to ``LONE`` one-token requests arrive, each ``SETTLE`` steps
  after the last pass and at another phase of a step, ``CARRIERS`` x ``LONE`` lone requests
  in all: a lone request waits for the step under way (half the carrier's step on average),
  then is prefilled, so its TTFT less half a step is a busy pass's first prompt. The
  carriers decode in the smallest measured window that holds one with a lone arrival (as
  many of them per carrier as it holds, and as many more carriers): the wait spreads a lone
  TTFT over a whole step, so the shortest steps give the tightest offset (on the jax runner,
  batch 8, the rounds' offsets spread 0.72 ms in bucket 64's window, 3.3 ms steps, against
  1.37 ms in bucket 512's, 6.7 ms steps, where the carriers of 6 went before, at the same
  mean within its error: docs/serving.md), and short carriers cost fewer seconds. Not for a
  batch of one (no slot is free while a request decodes) or where no measured window holds
  a carrier: ``busy_s`` is then ``first_s``, as one offset priced both before.

Per round, ``first = median(first TTFTs) - median(static)``, ``next = median(slopes) -
median(static)`` and ``busy = median(lone TTFTs - half a step) - median(static)``: the calls
are adjacent, so a host that drifts over minutes lands on all alike. The estimate is the
mean over the rounds; its standard error the larger of what resampling each call's batches,
bursts and lone requests gives and what the rounds' disagreement gives (each call has a
speed of its own on a drifting host, which resampling within one call does not see). Each
offset is kept only beyond ``SIGMAS`` standard errors (else 0: the server costs what the
profile says), and never below -TTFT_b (no admission is free).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .buckets import decode_windows
from .noise import DRAWS, SEED, rounds_estimate
from .probes import intercept, prefill_calls
from .types import PREFILLS, BucketProfile, Requests

#: rounds of a static call and a served call: two, so that the rounds' disagreement shows a host that drifts
#: between calls, and no more, since every call costs a stack's own set-up (an engine's warm-up batch, a
#: command program's start). In all it costs about what the row cost's workload does (lens.rows): the
#: prefills of 24 full batches and about as long idle between the bursts
ROUNDS = 2
#: full static batches per static call, bursts per served call
BATCHES = 6
BURSTS = 6
#: bursts arrive this many times a burst's expected prefill seconds apart, so that each finds the device idle
#: on a host up to that much slower than when it profiled (a late burst would queue behind the last one)
GAP = 3.0
#: an offset is kept only beyond this many of its standard errors (as lens.rows's row cost)
SIGMAS = 3.0
#: an offset beyond this many standard errors but within SIGMAS is undecided: the measurement runs
#: MORE_ROUNDS more rounds, once, and solves on all of them. On the jax runner the quickstart's batch-4 unit
#: counted about +1 ms for a pass's first prompt in five measurements of seven and stored 0 in two, whose
#: TTFT p50 then came out 16-19% low at confirmation (docs/serving.md)
UNDECIDED = 1.0
MORE_ROUNDS = 2
#: lone one-token requests per busy call, CARRIERS x LONE, arriving at most LONE while one carrier decodes (fewer
#: where the smallest window holds fewer, with as many more carriers): the wait for the step under way spreads a
#: lone TTFT over a whole step (up to 4 ms on the jax runner), and 24 of them a round bring the offset's standard
#: error to about what the idle bursts give
CARRIERS = 4
LONE = 6
#: decode steps the carrier runs after each pass before the next lone arrival, so that each lands on settled
#: steps (lens.resume: the steps after a served prefill settle over about eight on the jax runner)
SETTLE = 16
#: the carrier decodes this many times the steps its lone arrivals span at the profile's pace, so that the last
#: one still finds it decoding on a host that much faster than when it profiled
MARGIN = 1.5
#: the fraction of a step between consecutive lone arrivals' phases (the golden ratio's, which spreads them
#: evenly over a step): the step under way is waited on half a step on average
PHASE = 0.6180339887


@dataclass(frozen=True)
class AdmissionCost:
    """Seconds a served admission costs beyond TTFT_b: a pass's first prompt, each further one."""

    first_s: float
    next_s: float
    #: one standard error of ``raw_first_s`` / ``raw_next_s`` (see the module docstring)
    first_err_s: float = 0.0
    next_err_s: float = 0.0
    #: the estimates before the significance test and the bound
    raw_first_s: float = 0.0
    raw_next_s: float = 0.0
    #: prompts per burst (1: a pass's further prompts were not measured: ``next_s`` 0)
    burst: int = 0
    #: a busy pass's first prompt (``first_s`` when not measured: ``busy_measured`` False), its error and raw value
    busy_s: float = 0.0
    busy_err_s: float = 0.0
    raw_busy_s: float = 0.0
    busy_measured: bool = False
    #: why a value is not its raw estimate ("" when both are)
    note: str = ""

    def said(self) -> str:
        """One line for the profile output."""
        def one(v: float, raw: float, err: float) -> str:
            kept = f"{v * 1e3:+.3f} ms"
            return f"{kept} (+- {err * 1e3:.3f})" if v == raw else f"{kept} (measured {raw * 1e3:+.3f} +- {err * 1e3:.3f})"

        text = f"a pass's first prompt {one(self.first_s, self.raw_first_s, self.first_err_s)}"
        if self.burst > 1:
            text += f", each further one {one(self.next_s, self.raw_next_s, self.next_err_s)}"
        if self.busy_measured:
            text += f"; a pass's first during a decode {one(self.busy_s, self.raw_busy_s, self.busy_err_s)}"
        return text + (f"; {self.note}" if self.note else "")


def unit_admission(profiles: Sequence[BucketProfile]) -> tuple[float, float, float]:
    """A unit's (first_s, next_s, busy_s) from its profiles: their medians (one measurement gives them all the
    same; buckets measured at different times may differ); zeros without any."""
    if not profiles:
        return 0.0, 0.0, 0.0
    return (float(np.median([p.admit_first_s for p in profiles])),
            float(np.median([p.admit_next_s for p in profiles])),
            float(np.median([p.admit_busy_s for p in profiles])))


def burst_size(batch: int, *, max_prefills: int, prefill: str = PREFILLS[0]) -> int:
    """Prompts one pass of the server admits at most from a burst of one-token requests."""
    if prefill == "batched":
        return 1  # one call whatever it holds: only the pass's cost is measured
    return batch if max_prefills == 0 else min(batch, max_prefills)


def _probe_tokens(p: BucketProfile) -> int:
    """Tokens of bucket ``p``'s short probe (``l1``; at least one)."""
    return max(int(p.l1), 1)


def static_workload(p: BucketProfile, batch: int, batches: int = BATCHES) -> Requests:
    """``batches`` full batches of requests as bucket ``p``'s short probe runs them: its prompt, and its ``l1`` tokens
    (a prefill and one decode step; one token where the bucket was too narrow for two)."""
    n = batch * batches
    return Requests(np.full(n, p.input_len, np.int64), np.full(n, _probe_tokens(p), np.int64),
                    name=f"admission-static-{p.bucket}")


def served_workload(p: BucketProfile, m: int, bursts: int = BURSTS) -> Requests:
    """``bursts`` bursts of ``m`` one-token requests with bucket ``p``'s prompt, each finding the device idle."""
    gap = GAP * m * max(p.ttft_s, 1e-6)
    arrival = np.repeat(np.arange(bursts, dtype=np.float64) * gap, m)
    n = m * bursts
    return Requests(np.full(n, p.input_len, np.int64), np.ones(n, np.int64), arrival,
                    name=f"admission-served-{p.bucket}")


@dataclass(frozen=True, eq=False)
class BusyPlan:
    """The busy call: its requests (carriers and lone ones), which are lone, and the carriers' step."""

    requests: Requests
    lone: np.ndarray  # bool per request
    step_s: float


def busy_plan(p: BucketProfile, profiles: Mapping[int, BucketProfile], buckets: Sequence[int], policy: str, *,
              batch: int, carriers: int = CARRIERS, lone: int = LONE, window: int | None = None) -> BusyPlan | None:
    """Carrier requests one after another, each with one-token requests with bucket ``p``'s prompt arriving while it
    decodes, ``carriers`` x ``lone`` of those in all, in the smallest measured token-generation window that holds a
    carrier with one of them (with as many as it holds, ``lone`` at most, and as many carriers as that takes); None
    for a batch of one or where no window holds one. ``window``: that token-generation bucket's window only (a
    diagnostic's choice). A carrier decodes alone (or beside the one before it, in the same bucket): its step is
    TBT_b less the free rows' host cost (``row_s``)."""
    if batch < 2:
        return None
    bk = sorted(buckets)
    total = carriers * lone
    for b, prompt, room, ctx_bucket in decode_windows(profiles, bk, policy):
        if window is not None and b != window:
            continue
        tkg = profiles[b]
        step = tkg.tbt_s - (batch - 1) * tkg.row_s
        if step <= 0:
            continue
        ctx = profiles[ctx_bucket]
        spacing = GAP * max(p.ttft_s, 0.0) + SETTLE * step
        for per in range(lone, 0, -1):
            # each lone arrival at its own step's start, then a phase within the step (the last one's at most a step)
            starts = MARGIN * max(ctx.ttft_s, 0.0) + SETTLE * step + np.arange(per, dtype=np.float64) * spacing
            steps = int(np.ceil(MARGIN * (starts[-1] + step + max(p.ttft_s, 0.0)) / step)) + SETTLE
            if steps <= room:
                break
        else:
            continue
        n_car = -(-total // per)
        period = starts[-1] + step + spacing  # the next carrier comes after the last lone request's pass settled
        # every lone arrival at another phase of a step, across the carriers too
        phase = (np.arange(n_car * per, dtype=np.float64) * PHASE % 1.0).reshape(n_car, per) * step
        arr = np.concatenate([np.concatenate([[0.0], starts + phase[c]]) + c * period for c in range(n_car)])
        one_lin = np.concatenate([[prompt], np.full(per, p.input_len)])
        one_lout = np.concatenate([[steps + 1], np.ones(per)])
        lin = np.tile(one_lin, n_car).astype(np.int64)
        lout = np.tile(one_lout, n_car).astype(np.int64)
        return BusyPlan(Requests(lin, lout, arr, name=f"admission-busy-{p.bucket}"),
                        np.tile(np.arange(per + 1) > 0, n_car), step)
    return None


def busy_times(ttft_s: Sequence[float], plan: BusyPlan) -> np.ndarray:
    """Per lone request of ``plan``'s run: its TTFT less half the carriers' step (the wait for the step under way,
    on average)."""
    return np.asarray(ttft_s, dtype=float)[plan.lone] - plan.step_s / 2


def static_times(e2e_s: Sequence[float], batch: int, prefill: str = PREFILLS[0], *, p: BucketProfile) -> np.ndarray:
    """Per batch of ``static_workload(p)``'s run: TTFT_b as the probes solve it (``lens.probes.derive``): its last
    request's end less its decode steps at ``p``'s TBT_b, per prefill call. The first decode step after the prefills
    runs slower than TBT_b, and the solve puts that in the intercept."""
    t = np.asarray(e2e_s, dtype=float).reshape(-1, batch)
    return intercept(t.max(axis=1), p.tbt_s, l1=_probe_tokens(p), calls=prefill_calls(batch, prefill))


def burst_times(ttft_s: Sequence[float], m: int) -> tuple[np.ndarray, np.ndarray]:
    """Per burst of ``served_workload``'s run: the first request's TTFT, and the later ones' slope (NaN for m = 1)."""
    t = np.asarray(ttft_s, dtype=float).reshape(-1, m)
    first = t[:, 0]
    slope = (t[:, -1] - t[:, 0]) / (m - 1) if m > 1 else np.full(len(first), np.nan)
    return first, slope


def undecided(cost: AdmissionCost) -> bool:
    """Whether an offset measured lies beyond ``UNDECIDED`` and within ``SIGMAS`` standard errors of none."""
    pairs = [(cost.raw_first_s, cost.first_err_s)]
    if cost.burst > 1:
        pairs.append((cost.raw_next_s, cost.next_err_s))
    if cost.busy_measured:
        pairs.append((cost.raw_busy_s, cost.busy_err_s))
    return any(err > 0 and UNDECIDED * err < abs(raw) <= SIGMAS * err for raw, err in pairs)


def solve(rounds: Sequence[tuple[np.ndarray, ...]], *, p: BucketProfile, burst: int, draws: int = DRAWS,
          seed: int = SEED) -> AdmissionCost:
    """The offsets from ``rounds`` of (static times, first TTFTs, slopes[, busy times]), one tuple per round; the
    busy times (``busy_times``) only where the busy call ran."""
    if not rounds:
        return AdmissionCost(0.0, 0.0, burst=burst, note="no round was run")
    rng = np.random.default_rng(seed)

    def resampled(x: np.ndarray) -> np.ndarray:
        """Medians of ``draws`` resamples of ``x``."""
        x = np.asarray(x, dtype=float)
        return np.median(x[rng.integers(0, len(x), size=(draws, len(x)))], axis=1)

    # per round: (its difference, its resampled differences) for the first prompt, a further one, a busy first
    firsts, nexts, busies = [], [], []
    for q, f, s, *b in rounds:
        q_star = resampled(q)
        firsts.append((float(np.median(f) - np.median(q)), resampled(f) - q_star))
        if burst > 1:
            nexts.append((float(np.median(s) - np.median(q)), resampled(s) - q_star))
        if b and len(b[0]):
            busies.append((float(np.median(b[0]) - np.median(q)), resampled(b[0]) - q_star))
    notes = []

    def kept(name: str, per_round: list[tuple[float, np.ndarray]]) -> tuple[float, float, float]:
        raw, err = rounds_estimate([r[0] for r in per_round], [r[1] for r in per_round])
        if abs(raw) <= SIGMAS * err:
            notes.append(f"{name} within {SIGMAS:g} standard errors of none, none counted")
            return 0.0, err, raw
        floor = -max(p.ttft_s, 0.0)
        if raw < floor:
            notes.append(f"{name} bounded at -TTFT_b (no admission is free)")
            return floor, err, raw
        return raw, err, raw

    first, first_err, raw_first = kept("first", firsts)
    nxt, next_err, raw_next = kept("next", nexts) if burst > 1 else (0.0, 0.0, 0.0)
    measured = len(busies) == len(rounds)
    # not measured: as one offset priced both passes before
    busy, busy_err, raw_busy = kept("during a decode", busies) if measured else (first, 0.0, 0.0)
    return AdmissionCost(first, nxt, first_err, next_err, raw_first, raw_next, burst, busy, busy_err, raw_busy,
                         measured, "; ".join(notes))
