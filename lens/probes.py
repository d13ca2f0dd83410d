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

import time
from typing import Iterable, Sequence

import numpy as np

from .buckets import bucket_ranges, select_index, validate_buckets
from .errors import RunnerError, UserError
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


def _solve_pair(bucket: int, r1: ProbeRun, r2: ProbeRun, calls: int) -> tuple[float, float]:
    l1, l2 = r1.probe.output_len, r2.probe.output_len
    t1, t2 = r1.median_s, r2.median_s
    tbt = (t2 - t1) / (l2 - l1)
    if not tbt > 0:
        raise RunnerError(
            f"bucket {bucket}: the longer run was not slower (T1={t1:.6f}s at L={l1}, "
            f"T2={t2:.6f}s at L={l2}); the measurement is too noisy to solve"
        )
    ttft = (t1 - (l1 - 1) * tbt) / calls
    if not ttft > 0:
        raise RunnerError(f"bucket {bucket}: solved TTFT {ttft:.6f}s is not positive; remeasure")
    return ttft, tbt


def assess(r1: ProbeRun, r2: ProbeRun, *, batch: int, max_spread: float,
           prefill: str = PREFILLS[0]) -> tuple[str, str] | None:
    """None when a bucket's two runs give a trustworthy profile, else ``(kind, reason)``.

    ``kind`` is ``"impossible"`` (no positive TBT_b and TTFT_b can be solved: T2 <= T1, or
    the intercept is not positive) or ``"noisy"`` (solvable, but a probe's repeats spread
    more than ``max_spread`` of their median).
    """
    try:
        _solve_pair(r1.probe.bucket, r1, r2, prefill_calls(batch, prefill))
    except RunnerError as exc:
        return "impossible", str(exc)
    spread = max(r1.spread, r2.spread)
    if spread > max_spread:
        return "noisy", (f"bucket {r1.probe.bucket}: repeats spread {spread:.0%} of their median "
                         f"(more than profile.max_spread = {max_spread:.0%})")
    return None


def solve(
    runs: Sequence[ProbeRun], *, batch: int, prefill: str = PREFILLS[0], runner: str = "", host: str = "",
    simulated: bool = False,
) -> dict[int, BucketProfile]:
    """TTFT_b and TBT_b per bucket from the medians of two probes each (``prefill``: the target's)."""
    calls = prefill_calls(batch, prefill)
    now = time.time()
    out: dict[int, BucketProfile] = {}
    for bucket, (r1, r2) in pair_runs(runs).items():
        l1, l2 = r1.probe.output_len, r2.probe.output_len
        t1, t2 = r1.median_s, r2.median_s
        ttft, tbt = _solve_pair(bucket, r1, r2, calls)
        out[bucket] = BucketProfile(
            bucket=bucket,
            ttft_s=float(ttft),
            tbt_s=float(tbt),
            input_len=r1.probe.input_len,
            l1=l1,
            l2=l2,
            t1_s=t1,
            t2_s=t2,
            repeats=len(r1.times_s),
            spread=max(r1.spread, r2.spread),
            runner=runner,
            host=host,
            measured_at=now,
            simulated=simulated,
            raw_t1=tuple(r1.times_s),
            raw_t2=tuple(r2.times_s),
            source="simulated" if simulated else "measured",
        )
    return out
