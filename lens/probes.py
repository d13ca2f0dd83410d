"""The probe plan (two end-to-end runs per bucket) and the solve for TTFT_b and TBT_b.

Convention used everywhere in lensopt: a request (l_in, l_out) generates exactly l_out
tokens; the first comes from the prefill, then l_out - 1 decode steps follow, and decode
step k (k = 1 .. l_out - 1) has context l_in + k.  A probe runs a full batch of B identical
requests whose prompts take n prefill calls: B with ``prefill = "sequential"`` (one prompt
at a time), 1 with ``"batched"`` (one call of shape (B, b)).  So

    T(L) = n * TTFT_b + (L - 1) * TBT_b
    TBT_b  = (T2 - T1) / (L2 - L1)
    TTFT_b = (T1 - (L1 - 1) * TBT_b) / n

and TTFT_b is one prefill call in bucket b: one request's prompt (sequential), or the
whole batch's prompts in one call (batched; it is then every request's TTFT in a full
batch whose longest prompt runs in b).

The pitfall (the LENS paper, arXiv 2606.18042): the prompt must run in b *and* every
decode context of the longer run must stay in b under the target's policy, so l_in sits at
the bottom of the bucket and L2 is limited by the bucket's width.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from .buckets import bucket_ranges, select_index, validate_buckets
from .errors import RunnerError, UserError
from .noise import DRAWS, ESTIMATOR, bootstrap_times, counted_classes, expected_times, spread
from .types import PREFILLS, BucketProfile, Probe, ProbeRun


class NoisyMeasurement(RunnerError):
    """A bucket's runs stayed impossible to solve (T2 <= T1, TTFT <= 0) after every attempt.

    Measuring again the same way would only repeat it, so it is not retried further.
    """


def probe_window(bucket: int, buckets: Sequence[int], policy: str) -> tuple[int, int]:
    """Lowest prompt length that runs in ``bucket`` and the highest context that stays in it."""
    b = validate_buckets(buckets)
    if bucket not in b:
        raise UserError(f"bucket {bucket} is not one of the buckets {list(b)}")
    lo, hi = bucket_ranges(b, policy)
    k = b.index(bucket)
    return int(lo[k]), int(hi[k])


def plan_probes(
    buckets: Sequence[int],
    *,
    policy: str,
    profile: Iterable[int] | None = None,
    max_output: int,
    repeats: int,
) -> list[Probe]:
    """Two probes (L1 < L2) per bucket of ``profile`` (default: all of ``buckets``).

    ``buckets`` is the full candidate set: it fixes each bucket's lower neighbour, so the
    prompt lands in the bucket under any subset a search may later pick.  l_in is the
    lowest length the bucket takes; L2 the most steps whose contexts stay in the bucket,
    capped at ``max_output`` (more steps lower the TBT noise, but cost time); L1 = 2 (one decode step, so per-run decode start-up cost
    lands in the intercept, not the slope), or 1 when the bucket is too narrow.
    """
    b = validate_buckets(buckets)
    targets = b if profile is None else tuple(sorted(set(profile)))
    if max_output < 2:
        raise UserError(f"max_output {max_output}: needs at least 2 tokens to solve for TBT")
    if repeats < 1:
        raise UserError(f"repeats {repeats}: needs at least 1")
    probes: list[Probe] = []
    for bucket in targets:
        l_in, hi = probe_window(bucket, b, policy)
        l2 = min(hi - l_in + 1, max_output)  # contexts l_in+1 .. l_in+L2-1 stay <= hi
        if l2 < 2:
            raise UserError(
                f"bucket {bucket} is too narrow to profile under the {policy} policy "
                f"(prompts {l_in}..{hi}): widen the gap to the previous bucket to at least 2 tokens"
            )
        l1 = 2 if l2 >= 4 else 1
        probes.append(Probe(bucket=bucket, input_len=l_in, output_len=l1, repeats=repeats))
        probes.append(Probe(bucket=bucket, input_len=l_in, output_len=l2, repeats=repeats))
    return probes


def check_probe(probe: Probe, buckets: Sequence[int], policy: str) -> None:
    """Raise if the probe's prompt or any decode context leaves its bucket (the pitfall)."""
    b = np.asarray(buckets)
    ctx = np.arange(probe.input_len, probe.input_len + probe.output_len)  # prompt, then contexts
    idx = select_index(ctx, b, policy)
    if np.any(idx < 0) or np.any(b[np.maximum(idx, 0)] != probe.bucket):
        raise UserError(f"probe {probe} leaves bucket {probe.bucket} of {list(b)} under the {policy} policy")


def pair_runs(runs: Sequence[ProbeRun]) -> dict[int, tuple[ProbeRun, ProbeRun]]:
    """The two runs (shorter output first) of each bucket; ``RunnerError`` if a bucket lacks them."""
    by_bucket: dict[int, list[ProbeRun]] = {}
    for r in runs:
        by_bucket.setdefault(r.probe.bucket, []).append(r)
    out = {}
    for bucket, rs in sorted(by_bucket.items()):
        rs = sorted(rs, key=lambda r: r.probe.output_len)
        if len(rs) != 2 or rs[0].probe.output_len == rs[1].probe.output_len:
            raise RunnerError(f"bucket {bucket}: expected two runs at two output lengths, got {len(rs)}")
        out[bucket] = (rs[0], rs[1])
    return out


def prefill_calls(batch: int, prefill: str) -> int:
    """Prefill calls of one probe of ``batch`` identical requests under the target's ``prefill``."""
    if prefill not in PREFILLS:
        raise UserError(f"prefill = {prefill!r} is unknown: use one of {', '.join(PREFILLS)}")
    return batch if prefill == "sequential" else 1


def derive(t1, t2, *, l1: int, l2: int, calls: int):
    """TTFT_b and TBT_b from the (expected) times of a bucket's two probes; numbers or arrays alike.

    The one place the machine's cost model is inverted: the slope is the decode step, the
    intercept the ``calls`` prefill calls of the batch's prompts (``prefill_calls``).
    """
    tbt = (t2 - t1) / (l2 - l1)
    return intercept(t1, tbt, l1=l1, calls=calls), tbt


def intercept(t1, tbt, *, l1: int, calls: int):
    """TTFT_b from a short probe's time ``t1`` and the decode step ``tbt``: ``t1`` less its ``l1 - 1`` decode steps,
    per prefill call (``derive``'s intercept; numbers or arrays alike)."""
    return (t1 - (l1 - 1) * tbt) / calls


@dataclass(frozen=True)
class BucketFit:
    """What a bucket's two probes say: expected times, derived values and their spreads (1 sigma)."""

    bucket: int
    r1: ProbeRun
    r2: ProbeRun
    t1_s: float
    t2_s: float
    ttft_s: float
    tbt_s: float
    ttft_err_s: float
    tbt_err_s: float
    #: the unit's expected slow-down over the robust centre, counted in t1_s and t2_s
    excess: float
    #: the spreads of the expected times themselves
    t1_err_s: float = 0.0
    t2_err_s: float = 0.0

    @property
    def ttft_rel(self) -> float:
        return self.ttft_err_s / self.ttft_s if self.ttft_s > 0 else math.inf

    @property
    def tbt_rel(self) -> float:
        return self.tbt_err_s / self.tbt_s if self.tbt_s > 0 else math.inf

    def impossible(self) -> str | None:
        """Why no positive TTFT_b and TBT_b come out of these runs, or None."""
        l1, l2 = self.r1.probe.output_len, self.r2.probe.output_len
        if not self.tbt_s > 0:
            return (f"bucket {self.bucket}: the longer run was not slower (T1={self.t1_s:.6f}s at L={l1}, "
                    f"T2={self.t2_s:.6f}s at L={l2}); the measurement is too noisy to solve")
        if not self.ttft_s > 0:
            return f"bucket {self.bucket}: solved TTFT {self.ttft_s:.6f}s is not positive; remeasure"
        return None


def fit(runs: Sequence[ProbeRun], *, batch: int, prefill: str = PREFILLS[0], estimator: str = ESTIMATOR,
        draws: int = DRAWS) -> dict[int, BucketFit]:
    """Expected times (one estimator over all of the unit's runs), TTFT_b, TBT_b and their spreads.

    The spreads come from a bootstrap over the repeats of every probe (seeded: the same runs
    give the same spreads), through the very estimator and solve that give the values.
    ``prefill``: the target's (how many prefill calls a probe makes).
    """
    calls = prefill_calls(batch, prefill)
    pairs = pair_runs(runs)
    flat = [r for pair in pairs.values() for r in pair]
    times = [r.times_s for r in flat]
    classes = [r.probe.output_len for r in flat]  # probes of one output length make as many graph calls
    # which classes' excess counts is decided once, on the runs as they are, and held in every resample
    counted = counted_classes(times, classes)
    point, rho = expected_times(times, classes=classes, estimator=estimator, counted=counted)
    boot = bootstrap_times(times, classes=classes, estimator=estimator, draws=draws, counted=counted)
    out = {}
    for i, (bucket, (r1, r2)) in enumerate(pairs.items()):
        kw = dict(l1=r1.probe.output_len, l2=r2.probe.output_len, calls=calls)
        ttft, tbt = derive(point[2 * i], point[2 * i + 1], **kw)
        bt, bb = derive(boot[:, 2 * i], boot[:, 2 * i + 1], **kw)
        out[bucket] = BucketFit(bucket=bucket, r1=r1, r2=r2, t1_s=float(point[2 * i]), t2_s=float(point[2 * i + 1]),
                                ttft_s=float(ttft), tbt_s=float(tbt), ttft_err_s=float(spread(bt)),
                                tbt_err_s=float(spread(bb)), excess=rho, t1_err_s=float(spread(boot[:, 2 * i])),
                                t2_err_s=float(spread(boot[:, 2 * i + 1])))
    return out


def assess(f: BucketFit, *, max_spread: float) -> tuple[str, str] | None:
    """None when a bucket's fit is trustworthy, else ``(kind, reason)``.

    ``kind`` is ``"impossible"`` (no positive TBT_b and TTFT_b can be solved: T2 <= T1, or
    the intercept is not positive) or ``"noisy"`` (solvable, but the derived TTFT_b or
    TBT_b spreads more than ``max_spread`` of its value).
    """
    why = f.impossible()
    if why:
        return "impossible", why
    worst = max(f.ttft_rel, f.tbt_rel)
    if worst > max_spread:
        which = "TTFT_b" if f.ttft_rel >= f.tbt_rel else "TBT_b"
        return "noisy", (f"bucket {f.bucket}: derived TTFT_b +-{f.ttft_rel:.1%}, TBT_b +-{f.tbt_rel:.1%} "
                         f"({which} spreads more than profile.max_spread = {max_spread:.1%})")
    return None


def to_profile(f: BucketFit, *, accepted: bool, runner: str = "", host: str = "", simulated: bool = False,
               measured_at: float | None = None) -> BucketProfile:
    """The BucketProfile of a solvable fit (``RunnerError`` when it is not)."""
    why = f.impossible()
    if why:
        raise RunnerError(why)
    return BucketProfile(
        bucket=f.bucket, ttft_s=f.ttft_s, tbt_s=f.tbt_s, input_len=f.r1.probe.input_len,
        l1=f.r1.probe.output_len, l2=f.r2.probe.output_len, t1_s=f.t1_s, t2_s=f.t2_s,
        repeats=min(len(f.r1.times_s), len(f.r2.times_s)), spread=max(f.r1.spread, f.r2.spread),
        runner=runner, host=host, measured_at=time.time() if measured_at is None else measured_at,
        simulated=simulated, raw_t1=tuple(f.r1.times_s), raw_t2=tuple(f.r2.times_s),
        source="simulated" if simulated else "measured",
        ttft_err_s=f.ttft_err_s, tbt_err_s=f.tbt_err_s, excess=f.excess, accepted=accepted,
    )


def solve(
    runs: Sequence[ProbeRun], *, batch: int, prefill: str = PREFILLS[0], runner: str = "", host: str = "",
    simulated: bool = False, max_spread: float | None = None, estimator: str = ESTIMATOR,
) -> dict[int, BucketProfile]:
    """TTFT_b and TBT_b per bucket, with their spreads, from two probes each (``prefill``: the target's).

    ``RunnerError`` when a bucket cannot be solved. A profile is ``accepted`` when its
    derived spreads are within ``max_spread`` (always, when None).
    """
    now = time.time()
    out = {}
    for bucket, f in fit(runs, batch=batch, prefill=prefill, estimator=estimator).items():
        ok = max_spread is None or assess(f, max_spread=max_spread) is None
        out[bucket] = to_profile(f, accepted=ok, runner=runner, host=host, simulated=simulated, measured_at=now)
    return out
