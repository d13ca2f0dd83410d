"""What a served pass that stops a running decode costs that decode, by the size of its prefill.

A scheduler pass that admits a prompt while rows are decoding stops the decode for the
prefill; the decode then resumes. Beyond the pass's own seconds (its prompts' TTFT_b and
the admission offsets, ``lens.admission``), the steps after it may run slower than the
steady step for a while: on the jax runner on this 2-core host they ran about 1.5, 1.4,
1.25, 1.2 ... x the steady step after a prefill in bucket 512 and settled over 10-20 steps
(``benchmarks/resume_transient.py``). What that costs grows with the prefill: in served runs
of the quickstart model at batch 4, +1.4 to +2.5 ms after a prefill in bucket 64 (5 ms),
+4.5 to +6.4 after one in bucket 256 (18 ms) and +11.5 after one in bucket 512 (41 ms); a
pass of four prefills cost no more than one of the largest. ``lens.resume`` measures the
cost after an idle spell with small prompts; a pass that finds the device busy is priced
here, by its largest prefill.

The measurement: ``ROUNDS`` served calls, each of short carriers decoding one after another
in the smallest measured token-generation window that holds them (``plan``), all of the
same decode steps. A control carrier decodes alone; each other one is stopped once, ``LEAD``
steps in, by a one-token request (a prefill and nothing else: a served one frees its slot at
once) whose prompt lies in one context-encoding bucket (a *level*: the unit's measured
buckets, at most ``LEVELS`` of them, the smallest and the largest among them), at another
phase of a step each time, and decodes ``TAIL`` steps or more after the pass. A carrier's
decode seconds ``D`` (its E2E less its TTFT) are its steps' seconds, plus the pass's
seconds, plus what the pass cost the steps after it. A pass's seconds are its lone
request's TTFT less the wait for the step under way (half a step on average, as
``lens.admission``'s busy offset), so per stopped carrier

    cost = D - D of the controls beside it - (TTFT - step / 2)

(a pass that came after the carrier ended is not counted). Controls and stopped carriers
alternate (each level in turn, forward then backward), and each stopped carrier is
compared with the mean of the two controls on either side of it: on this host a carrier's
pace wandered by 5-10% from one carrier to the next, which a control from elsewhere in the
call would add to the cost, and which is why the carriers are short. A carrier that arrived
before the one ahead of it ended did not run alone and is left out.

Even so one carrier's cost scatters by 4-5 ms (jax runner, batch 4), too much to price each
level on its own in a few calls. What is kept is one number, the cost per second of the pass's
prefill (``ratio``): per call, the least-squares slope through the origin of the stopped
carriers' costs on their passes' seconds (in served runs the cost was 0.21-0.36 of the
prefill's seconds at every size measured). The estimate is the mean over the calls; its
standard error the larger of what resampling each call's carriers gives and what the
calls' disagreement gives (``lens.noise.rounds_estimate``); it is kept only beyond
``SIGMAS`` standard errors (else 0: the decode resumes at its pace after such a pass).
Each level's own mean cost is kept for the record (``LevelCost``).

``lens.serving`` charges the first decode run after a pass that found the device busy
``ratio`` x the seconds of the pass's largest prefill (``by_pass``: at each level's pass
seconds, never below minus one step; ``after_pass`` interpolates between them, flat beyond
either end). A unit without the measurement prices such a pass as before: ``lens.resume``'s
cost at its shortest idle spell.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .buckets import decode_windows
from .noise import DRAWS, SEED, rounds_estimate
from .resume import after_idle, split
from .types import BucketProfile, Requests

#: the most context-encoding buckets measured (the smallest and the largest, evenly between them)
LEVELS = 4
#: stopped carriers of each level per call (a control beside each), and served calls. Short carriers stopped once
#: each, many of them: on the jax runner a carrier's pace wandered by 5-10% from one carrier to the next, so the
#: noise of its decode seconds grows with its length (four passes in carriers of 250 steps: +- 0.11 on the ratio
#: from 3 calls of 24 s; one pass in carriers of 68 steps: +- 0.023 from 3 calls of 18-25 s, 8 carriers a level)
CARRIERS = 6
ROUNDS = 3
#: decode steps before a stopped carrier's lone arrival (its own admission's slow steps settle, lens.resume), and
#: after its pass on the profile's pace (the 10-20 slow steps after a bucket-512 prefill on the jax runner)
LEAD = 24
TAIL = 24
#: a carrier decodes this many times the steps its lone arrival and pass take at the profile's pace, so that it still
#: decodes when the pass comes on a host that much faster than when it profiled (as lens.admission's busy carrier);
#: the next carrier arrives this many times a carrier's expected seconds after the one before it
MARGIN = 1.25
#: the fraction of a step between consecutive carriers' lone arrival phases (the golden ratio's, as lens.admission)
PHASE = 0.6180339887
#: kept only beyond this many standard errors (as lens.resume)
SIGMAS = 3.0


@dataclass(frozen=True)
class LevelCost:
    """What busy passes with a prompt in context-encoding bucket ``bucket`` cost the decode after them, as
    measured (the mean over the calls of each call's median carrier; the record: ``BusyResume.ratio`` prices)."""

    bucket: int
    prompt: int
    #: the pass's seconds as served (the lone requests' median TTFT less half a step)
    pass_s: float
    measured: float
    err: float


@dataclass(frozen=True)
class BusyResume:
    """What a busy pass costs the decode after it per second of its prefill (``ratio``, as kept), the levels it
    was measured at, and where (``note``: why nothing was measured, or why ``ratio`` is not ``raw``)."""

    levels: tuple[LevelCost, ...] = ()
    ratio: float = 0.0
    #: one standard error of ``raw``, and the estimate before the significance test
    err: float = 0.0
    raw: float = 0.0
    #: the token-generation bucket of the carriers and their served steady step (seconds)
    bucket: int = 0
    step_s: float = 0.0
    note: str = ""

    @property
    def by_pass(self) -> tuple[tuple[float, float], ...]:
        """(a pass's seconds, what it costs the decode after it) at each level's pass seconds, increasing, as kept
        (never below minus one step: a resumed run cannot skip one); empty when nothing was measured."""
        out: list[tuple[float, float]] = []
        for x in sorted(lv.pass_s for lv in self.levels):
            if not out or x > out[-1][0]:
                out.append((float(x), float(max(self.ratio * x, -self.step_s))))
        return tuple(out)

    def said(self) -> str:
        """One line for the profile output."""
        if not self.levels:
            return self.note or "not measured"
        kept = f"{self.ratio:+.3f} s per second of the pass's largest prefill (+- {self.err:.3f})"
        levels = ", ".join(f"bucket {lv.bucket} ({lv.pass_s * 1e3:.1f} ms) {lv.measured * 1e3:+.2f} ms "
                           f"(+- {lv.err * 1e3:.2f})" for lv in self.levels)
        return (f"after a pass during a decode {kept}{f': {self.note}' if self.note else ''}; measured in "
                f"token-generation bucket {self.bucket} (steady step {self.step_s * 1e3:.3f} ms): {levels}")


def after_pass(pass_s: float, pairs: Sequence[tuple[float, float]]) -> float:
    """What the first decode run after a busy pass whose largest prefill takes ``pass_s`` seconds costs beyond its
    steps: ``pairs`` (``BusyResume.by_pass``, non-empty) interpolated by pass seconds, flat beyond either end (as
    ``lens.resume.after_idle`` does by idle seconds)."""
    return after_idle(pass_s, *split(pairs))


def levels(profiles: Mapping[int, BucketProfile], buckets: Sequence[int], most: int = LEVELS) -> list[int]:
    """The context-encoding buckets measured: ``buckets`` that are in ``profiles``, at most ``most`` of them
    (the smallest, the largest and evenly between them)."""
    have = sorted(b for b in set(buckets) if b in profiles)
    if len(have) <= most:
        return have
    pick = np.unique(np.round(np.linspace(0, len(have) - 1, most)).astype(int))
    return [have[i] for i in pick]


@dataclass(frozen=True, eq=False)
class Plan:
    """One served call: its requests, and per request its carrier's index (every request belongs to one carrier)
    and whether it is a lone one; per carrier its level's bucket (0: a control)."""

    requests: Requests
    carrier: np.ndarray
    lone: np.ndarray
    level: np.ndarray
    #: the carriers' token-generation bucket, decode steps, and their step on the profile's pace (seconds)
    bucket: int
    steps: int
    step_s: float


def plan(profiles: Mapping[int, BucketProfile], buckets: Sequence[int], policy: str, *, batch: int,
         carriers: int = CARRIERS, most: int = LEVELS) -> Plan | None:
    """The served call (see the module doc) in the smallest measured token-generation window that holds a carrier;
    None for a batch of one (no slot is free while a carrier decodes), without a level, or where no window holds
    one. A carrier decodes alone: its step is TBT_b less the free rows' host cost (``row_s``)."""
    lv = levels(profiles, buckets, most)
    if batch < 2 or not lv:
        return None
    widest = max(max(profiles[b].ttft_s + profiles[b].admit_busy_s, 0.0) for b in lv)
    for b, prompt, room, ctx_bucket in decode_windows(profiles, sorted(buckets), policy):
        tkg = profiles[b]
        step = tkg.tbt_s - (batch - 1) * tkg.row_s
        if step <= 0:
            continue
        steps = int(np.ceil(MARGIN * ((LEAD + 1) * step + widest) / step)) + TAIL
        if steps > room:
            continue
        seconds = max(profiles[ctx_bucket].ttft_s, 0.0) + steps * step + widest
        order = [0]
        for c in range(carriers):  # each level in turn, forward then backward, a control after each
            for level in (lv if c % 2 == 0 else lv[::-1]):
                order += [level, 0]
        lin, lout, arr, owner, is_lone = [], [], [], [], []
        for c, level in enumerate(order):
            t0 = c * MARGIN * seconds
            lin.append(prompt)
            lout.append(steps + 1)
            arr.append(t0)
            owner.append(c)
            is_lone.append(False)
            if level:
                lin.append(profiles[level].input_len)
                lout.append(1)
                arr.append(t0 + (LEAD + c * PHASE % 1.0) * step)
                owner.append(c)
                is_lone.append(True)
        return Plan(Requests(np.asarray(lin), np.asarray(lout), np.asarray(arr, dtype=np.float64),
                             name="busy-resume"), np.asarray(owner), np.asarray(is_lone), np.asarray(order),
                    b, steps, step)
    return None


@dataclass(frozen=True, eq=False)
class Carriers:
    """One served call of a ``Plan`` read per carrier: its level's bucket (0: control), its decode seconds, the
    passes that came while it decoded and their seconds summed before the wait for the step under way, and
    whether it ran alone (arrived after the one ahead ended)."""

    level: np.ndarray
    decode_s: np.ndarray
    passes: np.ndarray
    ttft_sum: np.ndarray
    alone: np.ndarray
    #: per level's bucket: the TTFTs of its lone requests that stopped a carrier
    lone_ttft: dict[int, np.ndarray]


def read(p: Plan, ttft_s: Sequence[float], e2e_s: Sequence[float]) -> Carriers:
    """A served call of ``p`` per carrier (``Carriers``)."""
    ttft, e2e = np.asarray(ttft_s, dtype=float), np.asarray(e2e_s, dtype=float)
    arr = np.asarray(p.requests.arrival_s, dtype=float)
    heads = np.flatnonzero(~p.lone)
    first, end = arr[heads] + ttft[heads], arr[heads] + e2e[heads]
    n = heads.size
    passes, ttft_sum = np.zeros(n, np.int64), np.zeros(n)
    lone_ttft: dict[int, list[float]] = {}
    for c in range(n):
        mine = np.flatnonzero(p.lone & (p.carrier == c))
        inside = mine[(arr[mine] >= first[c]) & (arr[mine] + ttft[mine] <= end[c])]
        passes[c] = inside.size
        ttft_sum[c] = float(ttft[inside].sum())
        if inside.size:
            lone_ttft.setdefault(int(p.level[c]), []).extend(ttft[inside].tolist())
    alone = np.concatenate([[True], arr[heads][1:] >= end[:-1]])
    return Carriers(p.level.copy(), e2e[heads] - ttft[heads], passes, ttft_sum, alone,
                    {k: np.asarray(v) for k, v in lone_ttft.items()})


def _controls(c: Carriers) -> np.ndarray:
    """Per carrier, the mean decode seconds of the controls on either side of it that ran alone (NaN: none)."""
    ok = np.flatnonzero((c.level == 0) & c.alone)
    out = np.full(c.level.size, np.nan)
    for i in range(c.level.size):
        j = np.searchsorted(ok, i)
        near = [k for k in (j - 1, j) if 0 <= k < ok.size]
        if near:
            out[i] = float(np.mean(c.decode_s[ok[near]]))
    return out


def _cost(c: Carriers, ctrl: np.ndarray, steps: int, mask: np.ndarray) -> np.ndarray:
    """Each carrier's cost per pass in ``mask`` against the control decode seconds ``ctrl`` beside it, with the
    served step ``ctrl / steps``."""
    step = ctrl[mask] / steps
    return (c.decode_s[mask] - ctrl[mask] - (c.ttft_sum[mask] - c.passes[mask] * step / 2)) / c.passes[mask]


def _ratio(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The least-squares slope through the origin of ``y`` on ``x`` along the last axis."""
    return np.sum(x * y, axis=-1) / np.sum(x * x, axis=-1)


def solve(rounds: Sequence[Carriers], p: Plan, *, draws: int = DRAWS, seed: int = SEED) -> BusyResume:
    """The ratio, and the cost measured at each level, from ``rounds`` of ``read``, one per served call."""
    rng = np.random.default_rng(seed)
    buckets = sorted({int(x) for x in p.level if x})
    per: dict[int, list[float]] = {b: [] for b in buckets}
    boot: dict[int, list[np.ndarray]] = {b: [] for b in buckets}
    lone: dict[int, list[np.ndarray]] = {b: [] for b in buckets}
    ratios, ratio_boot, steps_s = [], [], []
    for c in rounds:
        ctrl = _controls(c)
        if not np.isfinite(ctrl).any():
            continue
        steps_s.append(float(np.nanmedian(ctrl)) / p.steps)
        m = (c.level > 0) & c.alone & (c.passes > 0) & np.isfinite(ctrl)
        if not m.any():
            continue
        y = _cost(c, ctrl, p.steps, m)
        x = (c.ttft_sum[m] - c.passes[m] * ctrl[m] / p.steps / 2) / c.passes[m]  # each carrier's mean pass
        pick = rng.integers(0, y.size, size=(draws, y.size))
        ratios.append(float(_ratio(x, y)))
        ratio_boot.append(_ratio(x[pick], y[pick]))
        for b in buckets:
            at = c.level[m] == b
            if not at.any():
                continue
            per[b].append(float(np.median(y[at])))
            boot[b].append(np.median(y[at][rng.integers(0, at.sum(), size=(draws, at.sum()))], axis=1))
            lone[b].append(c.lone_ttft.get(b, np.zeros(0)))
    if not ratios:
        why = "no control carrier ran alone" if not steps_s else "no stopped carrier ran alone"
        return BusyResume(bucket=p.bucket, note=why)
    step = float(np.mean(steps_s))
    levels = []
    for b in buckets:
        if per[b]:
            prompt = int(p.requests.input_len[p.lone & (p.level[p.carrier] == b)][0])
            mean, err = rounds_estimate(per[b], boot[b])
            levels.append(LevelCost(b, prompt, float(np.median(np.concatenate(lone[b]))) - step / 2, mean, err))
    raw, err = rounds_estimate(ratios, ratio_boot)
    if abs(raw) <= SIGMAS * err:
        return BusyResume(tuple(levels), 0.0, err, raw, p.bucket, step,
                          f"{raw:+.3f} +- {err:.3f} is within {SIGMAS:g} standard errors of none, none counted: the "
                          f"decode resumes at its pace after such a pass")
    return BusyResume(tuple(levels), raw, err, raw, p.bucket, step)
