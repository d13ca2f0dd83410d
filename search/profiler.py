"""Profiling units: plan the probes of the missing buckets, run them, solve, store.

``measure_unit`` is the piece that runs where the hardware is (in-process for the CLI,
inside a Ray task for the search); the cache is written by the caller as each unit
finishes, in one transaction, so a unit is in the cache whole or not at all.

A bucket whose runs are impossible to solve (the longer run not slower) or spread too
widely is measured again, with twice the repeats each time, up to ``attempts`` in all.
One that stays impossible fails the unit with ``NoisyMeasurement`` (never a negative
TBT_b stored); one that stays only noisy is kept, its spread recorded and reported.
"""
from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from lens.errors import LensoptError, RunnerError, UserError
from lens.probes import NoisyMeasurement, assess, check_probe, pair_runs, plan_probes, solve
from lens.types import BucketProfile, ProbeRun, Target, Unit
from runners import Runner, get_runner
from spaces import ProfileSettings
from store import ProfileCache, new_claimant_id


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
    #: buckets kept although their repeats spread more than ``max_spread``: bucket -> why
    noisy: dict = field(default_factory=dict)
    #: measurements made of the worst bucket (1 when the first one was good)
    attempts: int = 1

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
    profile: ProfileSettings,
    runner: Runner | None = None,
) -> UnitMeasurement:
    """Compile ``(tp, batch)`` once and measure two runs per bucket of ``buckets``.

    ``profile`` gives the repeats, the probes' longest output, the attempts and the
    largest accepted spread. Buckets whose runs are impossible or too noisy are measured
    again (see the module docstring); raises ``NoisyMeasurement`` when one stays impossible.
    """
    runner = runner or get_runner(target)
    unit = Unit(target=target, tp=tp, batch=batch)
    runner.check_unit(unit)
    repeats, max_output, attempts = profile.repeats, profile.max_output, profile.attempts
    if attempts < 1:
        raise UserError(f"profile.attempts {attempts}: needs at least 1")
    want = sorted(set(buckets))
    if not want:
        raise UserError(f"unit tp={tp} batch={batch}: no bucket to profile")
    probes = plan_probes(all_buckets, policy=target.bucket_policy, profile=want, max_output=max_output, repeats=repeats)
    for p in probes:
        check_probe(p, want, target.bucket_policy)
    started = time.time()
    compile_s = run_s = 0.0
    best: dict[int, tuple[ProbeRun, ProbeRun]] = {}
    verdict: dict[int, tuple[str, str] | None] = {}
    todo, reps, attempt = want, repeats, 0
    history: list[int] = []
    result = None
    while todo and attempt < attempts:
        attempt += 1
        history.append(reps)
        if attempt > 1:
            probes = plan_probes(all_buckets, policy=target.bucket_policy, profile=todo, max_output=max_output,
                                 repeats=reps)
        result = runner.profile(unit, probes)
        compile_s += result.compile_s
        run_s += result.run_s
        for b, pair in pair_runs(result.runs).items():
            v = assess(*pair, batch=batch, max_spread=profile.max_spread)
            # keep the better measurement of each bucket over the attempts
            if b not in best or _rank(v, pair) < _rank(verdict[b], best[b]):
                best[b], verdict[b] = pair, v
        todo = [b for b in want if verdict.get(b) is not None]
        reps *= 2
    lost = [b for b in want if b not in best]
    if lost:
        raise RunnerError(f"runner {runner.name}: no runs came back for bucket(s) {lost} of tp={tp} batch={batch}")
    impossible = {b: verdict[b][1] for b in want if verdict.get(b) and verdict[b][0] == "impossible"}
    if impossible:
        raise NoisyMeasurement(
            f"noisy measurement: {'; '.join(impossible.values())} (after {attempt} attempt(s) with "
            f"{', '.join(map(str, history))} repeats; the unit is left out)"
        )
    runs = [r for b in want for r in best[b]]
    profiles = solve(runs, batch=batch, runner=runner.name, host=result.host, simulated=result.simulated)
    noisy = {b: verdict[b][1] + f" after {attempt} attempt(s)" for b in want if verdict.get(b)}
    return UnitMeasurement(
        tp=tp,
        batch=batch,
        profiles=profiles,
        compile_s=compile_s,
        run_s=run_s,
        host=result.host,
        versions=dict(result.versions),
        simulated=result.simulated,
        started_at=started,
        ended_at=time.time(),
        noisy=noisy,
        attempts=attempt,
    )


def _rank(v: tuple[str, str] | None, pair: tuple[ProbeRun, ProbeRun]) -> tuple[int, float]:
    """Lower is better: good, then noisy, then impossible; ties go to the smaller spread."""
    kind = 0 if v is None else {"noisy": 1}.get(v[0], 2)
    return kind, max(pair[0].spread, pair[1].spread)


def store(cache: ProfileCache, fingerprint: str, target: Target, m: UnitMeasurement, runner_name: str,
          *, release_owner: str | None = None) -> None:
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
        release_owner=release_owner,
    )


@dataclass(frozen=True)
class ProfileOutcome:
    measured: tuple[int, ...]
    reused: tuple[int, ...]
    compile_s: float = 0.0
    run_s: float = 0.0
    wall_s: float = 0.0
    simulated: bool = False
    noisy: dict = field(default_factory=dict)
    #: seconds spent waiting for another process that held the unit
    waited_s: float = 0.0


class LeaseKeeper:
    """Renews an owner's claims from a background thread while a blocking measurement runs.

    It uses its own connection to the cache file (SQLite connections stay in their thread).
    """

    def __init__(self, path, *, owner: str, units: Sequence[tuple[str, int, int]], lease_s: float):
        self.path, self.owner, self.units, self.lease_s = path, owner, list(units), float(lease_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lensopt-lease", daemon=True)
        #: why renewing stopped early, if it did
        self.error: BaseException | None = None

    def _loop(self) -> None:
        try:
            with ProfileCache.open(self.path, create=False) as c:
                while not self._stop.wait(self.lease_s / 3):
                    c.renew_claims(owner=self.owner, units=self.units, lease_s=self.lease_s)
        except (LensoptError, sqlite3.Error) as exc:
            # the measurement goes on; at worst the claim lapses and another process may
            # measure the unit too (a duplicate, never a loss)
            self.error = exc

    def __enter__(self) -> "LeaseKeeper":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def profile_missing(
    *,
    cache: ProfileCache,
    runner: Runner,
    fingerprint: str,
    tp: int,
    batch: int,
    buckets: Sequence[int],
    all_buckets: Sequence[int],
    profile: ProfileSettings,
    poll_s: float = 1.0,
    log: Callable[[str], None] | None = None,
) -> ProfileOutcome:
    """Measure in-process the buckets of one unit that the cache lacks; store them atomically.

    The unit is claimed first, for ``lease_s`` seconds renewed while it is measured (the
    space's ``[profile] lease_s``): when another process is profiling it, this waits for its
    profiles (or for its claim to end) instead of measuring them a second time.
    """
    owner = new_claimant_id()
    lease_s = profile.lease_s
    t_wait = time.perf_counter()
    told = False
    while True:
        claim = cache.claim_unit(fingerprint=fingerprint, tp=tp, batch=batch, buckets=buckets, owner=owner,
                                 lease_s=lease_s)
        if claim.granted or not claim.missing:
            break
        if log is not None and not told:
            log(f"unit tp={tp} batch={batch} is being profiled by {claim.holder}; waiting for its profiles")
            told = True
        time.sleep(poll_s)
    waited = time.perf_counter() - t_wait if told else 0.0
    missing = list(claim.missing)
    reused = tuple(b for b in buckets if b not in missing)
    if not missing:
        return ProfileOutcome(measured=(), reused=reused, waited_s=waited)
    t0 = time.perf_counter()
    try:
        with LeaseKeeper(cache.path, owner=owner, units=[(fingerprint, tp, batch)], lease_s=lease_s):
            m = measure_unit(runner.target, tp=tp, batch=batch, buckets=missing, all_buckets=all_buckets,
                             profile=profile, runner=runner)
        store(cache, fingerprint, runner.target, m, runner.name, release_owner=owner)
    finally:
        cache.release_claims(owner=owner)
    return ProfileOutcome(
        measured=tuple(missing), reused=reused, compile_s=m.compile_s, run_s=m.run_s,
        wall_s=time.perf_counter() - t0, simulated=m.simulated, noisy=dict(m.noisy), waited_s=waited,
    )


def check_subset(buckets: Sequence[int], space_buckets: Sequence[int], path) -> None:
    extra = sorted(set(buckets) - set(space_buckets))
    if extra:
        raise UserError(
            f"bucket(s) {extra} are not in space.buckets {list(space_buckets)} of {path}; add them there first"
        )
