"""Profiling units: claim them in the shared cache, measure the missing buckets, store them whole.

``measure_unit`` (``search.measure``) is the piece that runs where the hardware is
(in-process for the CLI, inside a Ray task for the search); the cache is written here, by
the caller, as each unit finishes, in one transaction, so a unit is in the cache whole or
not at all.
"""
from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from lens.errors import LensoptError, UnitCannotRun, UserError, one_line
from lens.admission import AdmissionCost
from lens.context_cost import ContextCost
from lens.busy_resume import BusyResume
from lens.decode_pace import DecodePace
from lens.prefill_tail import PrefillTail
from lens.resume import ResumeCost
from lens.rows import RowCost
from lens.types import BucketProfile, Target, Unit
from runners import Runner
from spaces import ProfileSettings, Space
from store import ProfileCache, new_claimant_id

from .ledger import RunLedger, UnitTask
from .measure import UnitMeasurement, measure_unit
from .progress import bar

if TYPE_CHECKING:
    from .dispatch import Dispatcher
    from .evaluate import Evaluator

__all__ = ["UnitMeasurement", "measure_unit", "store", "profile_missing", "ProfileOutcome", "UnitProfiler"]


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
    #: timed seconds of each measured bucket's runs, and what was done beyond its first measurement
    bucket_s: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)
    #: the host's cost per live row measured with them (lens.rows; None: not measured) and its timed run seconds
    rows: RowCost | None = None
    rows_s: float = 0.0
    #: what the unit's served admissions cost against TTFT_b (lens.admission; None: not measured) and its
    #: timed run seconds
    admission: AdmissionCost | None = None
    admission_s: float = 0.0
    #: what a live row's context costs a decode step (lens.context_cost; None: not measured) and its timed run
    #: seconds
    context: ContextCost | None = None
    context_s: float = 0.0
    #: what a decode run costs after a served admission (lens.resume; None: not measured) and its timed run seconds
    resume: ResumeCost | None = None
    resume_s: float = 0.0
    #: what a served pass that stops a running decode costs the decode after it (lens.busy_resume; None: not
    #: measured) and its timed run seconds
    busy_resume: BusyResume | None = None
    busy_resume_s: float = 0.0
    #: how far a lone served prompt's TTFT strays from its median (lens.prefill_tail; None: not measured) and its
    #: timed run seconds
    tail: PrefillTail | None = None
    tail_s: float = 0.0
    #: how a lone served decode's pace wanders (lens.decode_pace; None: not measured) and its timed run seconds
    pace: DecodePace | None = None
    pace_s: float = 0.0


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
    retry_failed: bool = False,
) -> ProfileOutcome:
    """Measure in-process the buckets of one unit that the cache lacks; store them atomically.

    The unit is claimed first, for ``profile.lease_s`` seconds renewed while it is measured:
    when another process is profiling it, this waits for its profiles (or for its claim to
    end) instead of measuring them a second time. A unit the cache remembers as failed for
    good raises ``UnitCannotRun`` unless ``retry_failed``; such a failure met here is
    remembered too.
    """
    if not retry_failed:
        known = cache.get_failure(fingerprint, tp, batch)
        if known is not None and cache.missing(fingerprint, tp, batch, buckets):
            raise UnitCannotRun(f"unit tp={tp} batch={batch}: {known.describe()}")
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
            try:
                m = measure_unit(runner.target, tp=tp, batch=batch, buckets=missing, all_buckets=all_buckets,
                                 profile=profile, runner=runner)
            except UnitCannotRun as exc:
                cache.put_failure(fingerprint=fingerprint, tp=tp, batch=batch, reason=one_line(exc),
                                  kind=type(exc).__name__, host=runner.host(), release_owner=owner)
                raise
        store(cache, fingerprint, runner.target, m, runner.name, release_owner=owner)
    finally:
        cache.release_claims(owner=owner)
    return ProfileOutcome(
        measured=tuple(missing), reused=reused, compile_s=m.compile_s, run_s=m.run_s,
        wall_s=time.perf_counter() - t0, simulated=m.simulated, noisy=dict(m.noisy), waited_s=waited,
        bucket_s=dict(m.bucket_s), notes=dict(m.notes), rows=m.rows, rows_s=m.rows_s,
        admission=m.admission, admission_s=m.admission_s, context=m.context, context_s=m.context_s,
        resume=m.resume, resume_s=m.resume_s, busy_resume=m.busy_resume, busy_resume_s=m.busy_resume_s,
        tail=m.tail, tail_s=m.tail_s, pace=m.pace, pace_s=m.pace_s,
    )


def check_subset(buckets: Sequence[int], space_buckets: Sequence[int], path) -> None:
    extra = sorted(set(buckets) - set(space_buckets))
    if extra:
        raise UserError(
            f"bucket(s) {extra} are not in space.buckets {list(space_buckets)} of {path}; add them there first"
        )


# -- the search's profiling loop -------------------------------------------------------------------
#: seconds between two looks at a unit another process is profiling
CLAIM_POLL_S = 1.0


def unit_checker(runner: Runner, dispatcher: "Dispatcher | None") -> Callable[[int, int], str | None]:
    """Why a unit cannot run (the runner refuses it, or no node of the cluster offers its
    resources), or None; the cluster's answer is asked once per tp."""
    unplaceable: dict[int, str | None] = {}

    def check(tp: int, batch: int) -> str | None:
        try:
            runner.check_unit(Unit(target=runner.target, tp=tp, batch=batch))
        except LensoptError as exc:
            return str(exc)
        if dispatcher is None:
            return None
        if tp not in unplaceable:
            unplaceable[tp] = dispatcher.unplaceable(tp)
        return unplaceable[tp]

    return check


class UnitProfiler:
    """Profiles the units one search needs, each once across every search sharing the cache.

    Each unit is claimed in the cache before its task is dispatched; a unit another search
    is profiling is waited for (its profiles are read when they land) rather than measured
    again. One Ray task (one compilation) per unit; each unit is stored in the cache, with
    the end of its claim, as its task comes back. The evaluator learns every profile or
    failure, the ledger every unit and hardware second; ``checkpoint`` runs after a round.
    """

    def __init__(self, *, space: Space, runner: Runner, fingerprint: str, cache: ProfileCache,
                 dispatcher: "Dispatcher", evaluator: "Evaluator", ledger: RunLedger,
                 log: Callable[[str], None], progress: bool, checkpoint: Callable[[], None],
                 retry_failed: bool = False, on_task: Callable[[tuple[int, int], UnitMeasurement], None] | None = None):
        self.space, self.runner, self.fp, self.cache = space, runner, fingerprint, cache
        self.dispatcher, self.ev, self.ledger = dispatcher, evaluator, ledger
        self.log, self.progress, self.checkpoint = log, progress, checkpoint
        #: measure units the cache remembers as failed, instead of skipping them
        self.retry_failed = retry_failed
        #: who this search is when it claims units in the shared cache
        self.owner = new_claimant_id()
        #: told of each profiling task that came back measured (the cost model learns from it)
        self.on_task = on_task

    def budget_left_s(self) -> float | None:
        """Hardware seconds ``[budget] profile_s`` leaves (None: no cap)."""
        cap = self.space.budget.profile_s
        return None if cap is None else cap - self.ledger.profile_hardware_s

    def _within_cap(self, todo: Mapping[tuple[int, int], Sequence[int]],
                    bounds: Mapping[tuple[int, int], float]) -> dict[tuple[int, int], Sequence[int]]:
        """The units whose tasks fit what the cap leaves, each at its cost bound (0 when not
        priced: then only "something is left" is checked), checked before they are dispatched."""
        room = self.budget_left_s()
        if room is None:
            return dict(todo)
        keep = {}
        for u, bk in todo.items():
            need = bounds.get(u, 0.0)
            if room <= 0 or need > room:
                self.log(f"  unit tp={u[0]} batch={u[1]}: not profiled, [budget] profile_s leaves {max(room, 0):.0f} "
                         f"hardware-s and its task may cost up to {need:.0f}")
                continue
            room -= need
            keep[u] = bk
        return keep

    def adopt(self, unit: tuple[int, int], *, waited: bool = False) -> int:
        """Take the unit's cached profiles (of the space's buckets), or its remembered failure;
        how many profiles there were."""
        prof = {b: p for b, p in self.cache.get_unit(self.fp, *unit).items() if b in self.space.search.buckets}
        if prof:
            self.ev.set_measured(unit, prof)
            self._note_spread(unit, prof)
            self.ledger.note_reused(unit)
        else:
            self.skip_if_failed(unit)
        if waited:
            self.ledger.units_waited.append(unit)
            self.log(f"  unit tp={unit[0]} batch={unit[1]}: profiled by another search; {len(prof)} buckets read "
                     f"from the cache")
        return len(prof)

    def skip_if_failed(self, unit: tuple[int, int]) -> bool:
        """True (and the unit left out of the search) when the cache remembers it failed for good."""
        if self.retry_failed or unit in self.ev.failed:
            return unit in self.ev.failed
        f = self.cache.get_failure(self.fp, *unit)
        if f is None:
            return False
        self.ev.set_failed(unit, f.describe())
        self.ledger.units_failed[unit] = f.describe()
        return True

    def profile(self, units: Mapping[tuple[int, int], Sequence[int]], *,
                bounds: Mapping[tuple[int, int], float] | None = None) -> None:
        """Measure the listed buckets of each unit that the evaluator does not have yet.

        ``bounds``: the most hardware seconds each unit's task may cost; with a
        ``[budget] profile_s`` cap, a unit whose bound does not fit what is left is not
        dispatched.
        """
        have = self.ev.measured
        todo = {u: sorted(b for b in bk if b not in have.get(u, {})) for u, bk in units.items() if u not in self.ev.failed}
        todo = self._within_cap({u: bk for u, bk in todo.items() if bk}, bounds or {})
        told: set[tuple[int, int]] = set()
        try:
            while todo:
                granted, waiting = {}, {}
                for u, bk in todo.items():
                    if self.skip_if_failed(u):  # another search may have met its failure meanwhile
                        continue
                    c = self.cache.claim_unit(fingerprint=self.fp, tp=u[0], batch=u[1], buckets=bk, owner=self.owner,
                                              lease_s=self.space.profile.lease_s)
                    if c.granted:
                        granted[u] = list(c.missing)
                    elif not c.missing:
                        self.adopt(u, waited=u in told)
                    else:
                        waiting[u] = bk
                        if u not in told:
                            told.add(u)
                            self.log(f"  unit tp={u[0]} batch={u[1]} is being profiled by {c.holder} (same cache); "
                                     f"waiting for its profiles instead of measuring it again")
                if granted:
                    self._dispatch(granted)
                elif waiting:
                    time.sleep(CLAIM_POLL_S)
                todo = waiting
        finally:
            self.cache.release_claims(owner=self.owner)
        self.checkpoint()

    def _dispatch(self, units: dict[tuple[int, int], list[int]]) -> None:
        sp, ledger = self.space, self.ledger
        lease = sp.profile.lease_s

        def renew(keys: list) -> None:  # while tasks run: our claims must outlive them
            self.cache.renew_claims(owner=self.owner, units=[(self.fp, t, b) for t, b in keys], lease_s=lease)

        shown = bar(len(units), "profiling units", self.progress)
        for out in self.dispatcher.profile_units(sp.target, units, all_buckets=sp.search.buckets, profile=sp.profile,
                                                 tick=renew, tick_s=lease / 3):
            ledger.profile_tasks += 1
            ledger.profile_tasks_this_run += 1
            unit = out.key
            if out.error:
                if out.cannot_run:  # it would fail so on every try: the shared cache remembers it
                    self.cache.put_failure(fingerprint=self.fp, tp=unit[0], batch=unit[1], reason=out.error,
                                           kind=out.cannot_run, host=self._where(unit), release_owner=self.owner)
                else:
                    self.cache.release_claims(owner=self.owner, units=[(self.fp, *unit)])
                self.ev.set_failed(unit, out.error)
                ledger.units_failed[unit] = out.error
                self.log(f"  unit tp={unit[0]} batch={unit[1]}: FAILED: {out.error}")
            else:
                m: UnitMeasurement = out.value
                # whole unit and the end of its claim, one transaction
                store(self.cache, self.fp, sp.target, m, self.runner.name, release_owner=self.owner)
                self.ev.set_measured(unit, m.profiles)
                if self.on_task is not None:
                    self.on_task(unit, m)
                ledger.note_measured(unit, UnitTask(tp=unit[0], batch=unit[1], buckets=tuple(sorted(m.profiles)),
                                                    node_id=m.node_id, started_at=m.started_at, ended_at=m.ended_at,
                                                    hardware_s=m.hardware_s, attempts=m.attempts,
                                                    host_costs=tuple(m.host_costs().items())))
                self._note_spread(unit, m.profiles, m.noisy)
                sim = " simulated" if m.simulated else ""
                noisy = f"; NOISY: {'; '.join(m.noisy.values())}" if m.noisy else ""
                self.log(f"  unit tp={unit[0]} batch={unit[1]}: {len(m.profiles)} bucket"
                         f"{'' if len(m.profiles) == 1 else 's'} measured on {m.host}, "
                         f"{m.hardware_s:.1f}{sim} hardware-s (compile {m.compile_s:.1f} s){noisy}")
                for what, why in m.unmeasured().items():
                    self.log(f"    {what}: {why}; left at 0 (to measure it: lensopt cache rm --cache {self.cache.path} "
                             f"--fingerprint {self.fp} --tp {unit[0]} --batch {unit[1]}, then profile the unit again)")
            shown.update(1)
        shown.close()

    def _where(self, unit: tuple[int, int]) -> str:
        started = self.dispatcher.last_started.get(unit)
        return started.host if started is not None else self.runner.host()

    def _note_spread(self, unit: tuple[int, int], profiles: Mapping[int, BucketProfile],
                     reasons: Mapping[int, str] | None = None) -> None:
        """Record the buckets of a unit kept although their derived values spread more than profile.max_spread."""
        reasons = reasons or {}
        self.ledger.note_noisy(unit, {
            b: reasons.get(b) or (f"bucket {b}: derived TTFT_b +-{p.ttft_err_s / p.ttft_s:.1%}, TBT_b "
                                  f"+-{p.tbt_err_s / p.tbt_s:.1%} (not accepted when measured)")
            for b, p in profiles.items() if not p.accepted or b in reasons})
