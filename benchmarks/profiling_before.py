"""lensopt's profiling as it was before profiles were judged on their derived values: the baseline
the noise benchmarks compare against ("today's method"), kept here, apart from the product.

Two probes per bucket (L1 = 2, L2 = the bucket's window capped at ``max_output`` = 128),
3 repeats each; TTFT_b and TBT_b solved from the *medians* of the repeats; a bucket is
measured again (twice the repeats, the better of the attempts kept, up to 3 attempts)
only when its runs are impossible to solve or a probe's raw repeats spread more than
``max_spread`` = 0.5 of their median. No bootstrap, no longer runs, no staircase check,
no expected cost of slow calls.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from lens.probes import derive, pair_runs, plan_probes
from lens.types import BucketProfile, ProbeRun, Target, Unit
from runners import Runner

MAX_OUTPUT, REPEATS, ATTEMPTS, MAX_SPREAD = 128, 3, 3, 0.5


@dataclass(frozen=True)
class Before:
    profiles: dict[int, BucketProfile]
    compile_s: float
    run_s: float

    @property
    def hardware_s(self) -> float:
        return self.compile_s + self.run_s


def _verdict(r1: ProbeRun, r2: ProbeRun, batch: int) -> int:
    """0 good, 1 noisy (raw spread), 2 impossible."""
    ttft, tbt = derive(r1.median_s, r2.median_s, l1=r1.probe.output_len, l2=r2.probe.output_len, calls=batch)
    if not (tbt > 0 and ttft > 0):
        return 2
    return 1 if max(r1.spread, r2.spread) > MAX_SPREAD else 0


def measure_before(target: Target, *, tp: int, batch: int, buckets: Sequence[int], runner: Runner) -> Before:
    unit = Unit(target, tp, batch)
    want = sorted(buckets)
    best: dict[int, tuple[ProbeRun, ProbeRun]] = {}
    verdict: dict[int, int] = {}
    todo, reps, compile_s, run_s = want, REPEATS, 0.0, 0.0
    for _ in range(ATTEMPTS):
        if not todo:
            break
        probes = plan_probes(want, policy=target.bucket_policy, profile=todo, max_output=MAX_OUTPUT, repeats=reps)
        res = runner.profile(unit, probes)
        compile_s += res.compile_s
        run_s += res.run_s
        for b, pair in pair_runs(res.runs).items():
            v = _verdict(*pair, batch)
            rank = (v, max(pair[0].spread, pair[1].spread))
            if b not in best or rank < (verdict[b], max(best[b][0].spread, best[b][1].spread)):
                best[b], verdict[b] = pair, v
        todo = [b for b in want if verdict[b]]
        reps *= 2
    now = time.time()
    out = {}
    for b in want:
        r1, r2 = best[b]
        ttft, tbt = derive(r1.median_s, r2.median_s, l1=r1.probe.output_len, l2=r2.probe.output_len, calls=batch)
        out[b] = BucketProfile(bucket=b, ttft_s=float(ttft), tbt_s=float(tbt), input_len=r1.probe.input_len,
                               l1=r1.probe.output_len, l2=r2.probe.output_len, t1_s=r1.median_s, t2_s=r2.median_s,
                               repeats=len(r1.times_s), spread=max(r1.spread, r2.spread), measured_at=now)
    return Before(out, compile_s, run_s)
