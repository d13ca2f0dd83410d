"""Profiling units: plan the probes of the missing buckets, run them, solve, store.

``measure_unit`` is the piece that runs where the hardware is (in-process for the CLI,
inside a Ray task for the search); the cache is written by the caller as each unit
finishes, in one transaction, so a unit is in the cache whole or not at all.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

from lens.cache import ProfileCache
from lens.errors import UserError
from lens.probes import check_probe, plan_probes, solve
from lens.types import BucketProfile, Target, Unit
from runners import Runner, get_runner


@dataclass(frozen=True)
class UnitMeasurement:
    """The solved profiles of one unit plus the hardware seconds they cost."""

    tp: int
    batch: int
    profiles: dict[int, BucketProfile]
    compile_s: float
    run_s: float
    host: str
    versions: dict = field(default_factory=dict)
    simulated: bool = False
    #: where and when it ran (the Ray node, wall-clock seconds since the epoch)
    node_id: str = ""
    started_at: float = 0.0
    ended_at: float = 0.0

    @property
    def hardware_s(self) -> float:
        return self.compile_s + self.run_s


def measure_unit(
    target: Target,
    *,
    tp: int,
    batch: int,
    buckets: Sequence[int],
    all_buckets: Sequence[int],
    repeats: int,
    max_output: int,
    runner: Runner | None = None,
) -> UnitMeasurement:
    """Compile ``(tp, batch)`` once and measure two runs per bucket of ``buckets``."""
    runner = runner or get_runner(target)
    unit = Unit(target=target, tp=tp, batch=batch)
    runner.check_unit(unit)
    probes = plan_probes(all_buckets, policy=target.bucket_policy, profile=buckets, max_output=max_output, repeats=repeats)
    for p in probes:
        check_probe(p, sorted(set(buckets)), target.bucket_policy)
    started = time.time()
    result = runner.profile(unit, probes)
    profiles = solve(result.runs, batch=batch, runner=runner.name, host=result.host, simulated=result.simulated)
    return UnitMeasurement(
        tp=tp,
        batch=batch,
        profiles=profiles,
        compile_s=result.compile_s,
        run_s=result.run_s,
        host=result.host,
        versions=dict(result.versions),
        simulated=result.simulated,
        started_at=started,
        ended_at=time.time(),
    )


def store(cache: ProfileCache, fingerprint: str, target: Target, m: UnitMeasurement, runner_name: str) -> None:
    cache.put_unit(
        fingerprint=fingerprint,
        tp=m.tp,
        batch=m.batch,
        profiles=list(m.profiles.values()),
        target=target.to_dict(),
        runner=runner_name,
        versions=m.versions,
        host=m.host,
        compile_s=m.compile_s,
        run_s=m.run_s,
    )


@dataclass(frozen=True)
class ProfileOutcome:
    measured: tuple[int, ...]
    reused: tuple[int, ...]
    compile_s: float = 0.0
    run_s: float = 0.0
    wall_s: float = 0.0
    simulated: bool = False


def profile_missing(
    *,
    cache: ProfileCache,
    runner: Runner,
    fingerprint: str,
    tp: int,
    batch: int,
    buckets: Sequence[int],
    all_buckets: Sequence[int],
    repeats: int,
    max_output: int,
) -> ProfileOutcome:
    """Measure in-process the buckets of one unit that the cache lacks; store them atomically."""
    missing = cache.missing(fingerprint, tp, batch, buckets)
    reused = tuple(b for b in buckets if b not in missing)
    if not missing:
        return ProfileOutcome(measured=(), reused=reused)
    t0 = time.perf_counter()
    m = measure_unit(
        runner.target, tp=tp, batch=batch, buckets=missing, all_buckets=all_buckets,
        repeats=repeats, max_output=max_output, runner=runner,
    )
    store(cache, fingerprint, runner.target, m, runner.name)
    return ProfileOutcome(
        measured=tuple(missing), reused=reused, compile_s=m.compile_s, run_s=m.run_s,
        wall_s=time.perf_counter() - t0, simulated=m.simulated,
    )


def check_subset(buckets: Sequence[int], space_buckets: Sequence[int], path) -> None:
    extra = sorted(set(buckets) - set(space_buckets))
    if extra:
        raise UserError(
            f"bucket(s) {extra} are not in space.buckets {list(space_buckets)} of {path}; add them there first"
        )
