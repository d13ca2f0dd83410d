"""``lensopt run`` and ``lensopt confirm``: the search, end to end.

1. Load the space and the workload sample; open the profile cache; start (or join) Ray.
2. Units already in the cache under this target's fingerprint are reused as they are.
   With nothing measured and no analytical prior, one anchor unit is profiled first.
3. Rounds of an Optuna multi-objective study (NSGA-II by default) on *predictions*:
   measured profiles where the unit has them, a prior estimate where it does not.
   After each round ``planner`` chooses what to profile: the units and buckets expected
   to add the most hypervolume to the measured front per hardware second, under the
   physical prior's uncertainty (``economy``), each unit only as far as its candidates
   need, a partly profiled unit extended when one needs more; they run as Ray tasks, one
   per unit, and their front candidates are enqueued again so the sampler sees the
   measured values. This repeats until no choice is expected to add ``[budget]
   stop_gain`` of the front's hypervolume, or the next task might overrun
   ``[budget] profile_s`` (checked before each dispatch).
4. The final front keeps only candidates predicted from measured profiles; the top-k are
   confirmed on the hardware (the workload sample run by the runner).
5. Everything lands in ``results/<run>/``; a rerun of the same command resumes.

The pieces: ``selection`` (front, promising units, knee), ``study`` (Optuna, the trial
store), ``profiler`` (claims, Ray tasks, the cache), ``confirm``, ``ledger`` (run.json)
and ``results`` (the files). This module orders them, and sets up Ray, the cache and the
runner once for both commands.

Faults it survives: a unit is claimed in the cache before its task is dispatched, so two
searches sharing a cache profile it once (the second waits for the first's profiles); a
task past ``profile.timeout_s`` is cancelled and its unit recorded as failed; a worker
lost mid-task is retried by Ray; a kill at any moment loses no trial (the trial store is
appended per trial) and no measured unit (the cache is written per unit). A results
folder that cannot be written (read-only, disk full) stops the search with a
``ResultsError`` naming the file; the cache is a separate file and stays whole.
"""
from __future__ import annotations

import os
import shlex
import signal
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pandas as pd

from lens import methods
from lens.errors import LensoptError, UserError
from lens.types import Candidate, Requests
from runners import Runner, get_runner
from spaces import Space, load_requests, load_space, requests_again
from store import ProfileCache, resolve_cache_path

from .cmd_cache import rm_unit_argv
from .confirm import confirm_front
from .dispatch import Dispatcher, check_address
from .economy import PER_ROUND
from .evaluate import Evaluation, Evaluator
from .ledger import RunLedger, software_versions
from .physical import PhysicalPrior
from .planner import ProfilePlanner
from .prior import AmaliPrior
from .profiler import UnitMeasurement, UnitProfiler, unit_checker
from .progress import bar
from .results import (
    ResultsError, SearchResult, default_run_name, prepare_dir, results_error, trials_table,
    write_confirm, write_ledger, write_results,
)
from .selection import (
    anchor_unit, by_latency, distinct, front_of, knee, nearest, promising_units,
)
from .study import DEFAULT_SAMPLER, STORE_FILE, SearchStudy, TrialStore, check_sampler
from .sweep import rate_sweep

__all__ = ["ResultsError", "SearchResult", "confirm_run", "run"]


def _sigterm(signum, frame):
    raise KeyboardInterrupt


@contextmanager
def _session(space: Space, *, ray_address: str | None, num_cpus: int | None = None
             ) -> Iterator[tuple[Runner, Dispatcher, str]]:
    """The runner, a started Ray and the target's fingerprint; SIGTERM interrupts like Ctrl-C."""
    runner = get_runner(space.target)
    dispatcher = Dispatcher(resources_for=space.hosts.resources_for, address=ray_address, num_cpus=num_cpus)
    # Ray forks its daemons: start it before a runner's SDK (e.g. JAX) starts threads here
    dispatcher.start()
    old_handler = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _sigterm)
    try:
        yield runner, dispatcher, runner.fingerprint()
    finally:
        signal.signal(signal.SIGTERM, old_handler)
        dispatcher.stop()


def run(
    space: Space | str | Path,
    *,
    results_dir: str | Path = "results",
    name: str | None = None,
    cache: str | Path | None = None,
    ray_address: str | None = None,
    workload: str | None = None,
    requests: int | None = None,
    seed: int | None = None,
    trials: int | None = None,
    sampler: str = DEFAULT_SAMPLER,
    confirm: bool = True,
    top_k: int | None = None,
    fresh: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
    num_cpus: int | None = None,
    profile_all: bool = False,
    retry_failed: bool = False,
) -> SearchResult:
    """Search ``space``; return the Pareto front and the trials as DataFrames (see module doc).

    ``retry_failed``: measure again the units whose profiling failed for good (the cache
    remembers them, and a resumed run its own failures) instead of skipping them.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sp = space if isinstance(space, Space) else load_space(space)
    reqs, wdesc = load_requests(sp, workload=workload, requests=requests, seed=seed)
    check_sampler(sampler)
    n_trials = trials if trials is not None else sp.budget.trials
    if n_trials < 1:
        raise UserError(f"--trials {n_trials}: must be at least 1")
    k = top_k if top_k is not None else sp.budget.top_k
    if k < 0:
        raise UserError(f"--top {k}: must be 0 or more")
    if ray_address:
        check_address(ray_address)  # before anything is written: it answers, and takes our token
    run_name = name or default_run_name(sp, [workload, requests, seed, sampler])
    run_dir = Path(results_dir) / run_name
    cache_path = resolve_cache_path(str(cache) if cache is not None else None)
    if os.path.lexists(cache_path):  # a damaged or foreign cache stops the run before anything is written
        ProfileCache.open(cache_path, create=False).close()
    t_start = time.time()
    with _session(sp, ray_address=ray_address, num_cpus=num_cpus) as (runner, dispatcher, fp):
        # the run folder once Ray has joined its cluster: a cluster that refuses us leaves nothing behind
        prepare_dir(run_dir, fresh=fresh)
        if sp.path.exists():
            try:
                (run_dir / "space.toml").write_bytes(sp.path.read_bytes())
            except OSError as exc:
                raise results_error(run_dir / "space.toml", exc) from None
        ledger = RunLedger(run=run_name, space=str(sp.path), space_sha256=sp.sha256, fingerprint=fp, target=sp.target,
                           workload=wdesc, sampler=sampler, trials_requested=n_trials, simulated=bool(runner.simulated),
                           versions=software_versions(runner), cache=str(cache_path),
                           ray_address=ray_address or "local", started_at=t_start)
        search = _Search(sp, reqs, run_dir, runner, dispatcher, ledger, log=log, progress=progress,
                         retry_failed=retry_failed)
        try:
            with ProfileCache.open(cache_path) as pc:
                search.open(pc, sampler)
                search.setup(profile_all=profile_all)
                search.rounds(n_trials)
                front = search.final_front()
                if confirm and k > 0:
                    ledger.confirmed = confirm_front(front, k, space=sp, requests=reqs, dispatcher=dispatcher,
                                                     ledger=ledger, log=log, progress=progress,
                                                     profiles=search.ev.measured)
                    if front:
                        write_confirm(run_dir, ledger.confirmed)
            ledger.state = "complete"
        except KeyboardInterrupt:
            ledger.state = "interrupted"
            search.write(front=None)
            raise
    ledger.wall_s = time.time() - t_start
    return search.write(front=front)


def confirm_run(
    run_dir: str | Path,
    *,
    top_k: int | None = None,
    cache: str | Path | None = None,
    ray_address: str | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> SearchResult:
    """Rerun the confirmation of a finished search (``lensopt confirm RESULTS_DIR``).

    The front is read from the run's ledger (run.json), its predictions recomputed from
    the cached profiles it was found with; the run's files are written again with the new
    confirmation (report, pareto.csv, confirm.csv, run.json, the sweep under continuous
    serving), its trials.csv left as it is.
    """
    rd = Path(run_dir)
    ledger = RunLedger.read(rd / "run.json")
    if ledger is None or ledger.state != "complete":
        raise UserError(f"RESULTS_DIR {str(run_dir) or repr('')} is not a finished lensopt run (no complete run.json "
                        f"in {rd.absolute()}); give a results/<run> folder")
    if ledger.front is None:
        raise UserError(f"{rd / 'run.json'} records no Pareto front (an older lensopt wrote it); run the search "
                        f"again: it reuses every cached profile")
    if not ledger.front:
        raise UserError(f"the run in {rd} found no Pareto front (see its report.md): there is nothing to confirm")
    space_file = rd / "space.toml"
    sp = load_space(space_file if space_file.exists() else ledger.space)
    w = ledger.workload
    reqs, again = requests_again(sp, w)  # the run's own sample: its --workload, size and seed
    if (again.input_mean, again.output_mean, again.input_max, again.output_max) != (
            w.input_mean, w.output_mean, w.input_max, w.output_max):
        raise UserError(f"the workload {w.source} no longer gives the sample the run in {rd} drew (a trace file that "
                        f"changed since?); run the search again to confirm on it")
    k = top_k if top_k is not None else sp.budget.top_k
    if k < 1:
        raise UserError(f"--top {k}: must be at least 1")
    cache_path = resolve_cache_path(str(cache) if cache is not None else ledger.cache)
    with _session(sp, ray_address=ray_address) as (runner, dispatcher, fp):
        if fp != ledger.fingerprint:
            raise UserError(f"the target's fingerprint is now {fp}, the run was made under {ledger.fingerprint}: "
                            f"its profiles do not apply here (other host, SDK or model); run the search again")
        ev = Evaluator(sp, reqs)
        with ProfileCache.open(cache_path, create=False) as pc:
            for tp, b in {(c.tp, c.batch) for c in ledger.front}:
                ev.set_measured((tp, b), pc.get_unit(fp, tp, b))
        front = [ev.evaluate(c, interval=True) for c in ledger.front]
        ledger.confirm_hardware_s = 0.0
        ledger.confirmed = confirm_front(front, k, space=sp, requests=reqs, dispatcher=dispatcher, ledger=ledger,
                                         log=log, progress=progress, profiles=ev.measured)
    # every file that shows the confirmation is written again (the report, pareto.csv's confirmed column), from
    # the same cached profiles as the search: its sweep under continuous serving too (predictions only)
    chosen = ledger.chosen
    stair = ev.measured.get((chosen.tp, chosen.batch), {}) if chosen else {}
    sweep = rate_sweep(front, ev, sp) if ev.continuous else None
    write_confirm(rd, ledger.confirmed)
    trials = pd.read_csv(rd / "trials.csv") if (rd / "trials.csv").exists() else pd.DataFrame()
    return write_results(rd, space=sp, runner=runner, ledger=ledger, trials=trials, front=front, staircase=stair,
                         sweep=sweep, write_trials=False)


class _Search:
    """The mutable state of one search: evaluator, study, profiler and ledger."""

    def __init__(self, space: Space, reqs: Requests, run_dir: Path, runner: Runner, dispatcher: Dispatcher,
                 ledger: RunLedger, *, log: Callable[[str], None], progress: bool, retry_failed: bool = False):
        self.sp, self.reqs, self.run_dir, self.runner, self.ledger = space, reqs, run_dir, runner, ledger
        self.dispatcher, self.log, self.progress = dispatcher, log, progress
        self.retry_failed = retry_failed
        self.ev = Evaluator(space, reqs, unit_check=unit_checker(runner, dispatcher))
        self.study: SearchStudy | None = None
        self.nearest: list[Evaluation] = []
        self._sweep: tuple[object, list[Candidate]] = (None, [])
        t = space.target
        self.physical = PhysicalPrior(t.model, t.dtype, buckets=space.search.buckets, policy=t.bucket_policy,
                                      max_output=space.profile.max_output, prefill=t.prefill)
        self.planner = ProfilePlanner(space=space, requests=reqs, evaluator=self.ev, prior=self.physical,
                                      per_round=PER_ROUND)

    def open(self, cache: ProfileCache, sampler: str) -> None:
        """Open the trial store (a rerun resumes from it) and the profiler on the cache."""
        self.profiler = UnitProfiler(space=self.sp, runner=self.runner, fingerprint=self.ledger.fingerprint,
                                     cache=cache, dispatcher=self.dispatcher, evaluator=self.ev, ledger=self.ledger,
                                     log=self.log, progress=self.progress, checkpoint=self.checkpoint,
                                     retry_failed=self.retry_failed, on_task=self._on_task)
        store = TrialStore(self.run_dir / STORE_FILE, study_name=self.run_dir.name, space=self.sp)
        self.study = SearchStudy(self.sp, store, sampler=sampler, study_name=self.run_dir.name)

    def _note_outdated(self) -> None:
        """Say which cached units hold host costs an older way of measuring gave (lens.methods), and how to have
        the search measure them anew."""
        for (tp, b), prof in sorted(self.ev.measured.items()):
            rm = rm_unit_argv(self.ledger.fingerprint, tp, b, self.ledger.cache)
            line = methods.advice(prof, f"tp{tp} b{b}", f"{shlex.join(rm)}, and the next search profiles it again",
                                  serving=self.sp.target.serving == "continuous")
            if line:
                self.log(f"note: {line}")

    def _units(self) -> list[tuple[int, int]]:
        return [(t, b) for t in self.sp.search.tp for b in self.sp.search.batch]

    def _full(self, tp: int, batch: int) -> Candidate:
        b = self.sp.search.buckets
        return Candidate(tp, batch, b, b)

    def setup(self, *, profile_all: bool = False) -> None:
        sp, ledger = self.sp, self.ledger
        prev = RunLedger.read(self.run_dir / "run.json")
        if prev is not None and prev.fingerprint == ledger.fingerprint:
            ledger.resume_from(prev)
        if self.retry_failed:
            ledger.units_failed.clear()  # each is tried again, and listed again only if it fails again
        for unit, why in ledger.units_failed.items():  # the evaluator knows what the ledger says
            self.ev.set_failed(unit, why)
        for unit in self._units():
            self.profiler.adopt(unit)
        self._note_cached_tasks()
        amali = AmaliPrior.for_hardware(sp.target.model, sp.target.dtype, sp.target.hardware, sp.target.prefill)
        if amali is not None:  # the GPU prior: analytical, it needs no measured unit
            self.ev.priors.append(amali)
        self.ev.priors.append(self.physical)
        self.log(f"{sp.target.name}: runner {sp.target.runner} on {sp.target.hardware}"
                 f"{' (SIMULATED)' if self.runner.simulated else ''}, fingerprint {ledger.fingerprint}; "
                 f"{len(self.reqs)} requests ({ledger.workload.source}); "
                 f"{len(self.ev.measured)} of {len(self._units())} units already in the cache {ledger.cache}")
        self._note_outdated()
        if profile_all:
            todo = {u: list(sp.search.buckets) for u in self._units()
                    if self.ev.infeasible_reason(self._full(*u)) is None}
            self.log(f"profiling every feasible unit ({len(todo)}) as asked")
            self.profiler.profile(todo)
        if not self.ev.measured and amali is None:
            anchor = anchor_unit(sp.search, lambda t, b: self.ev.infeasible_reason(self._full(t, b)))
            if anchor is None:
                raise UserError("no unit of the space is feasible: " + "; ".join(
                    f"tp{t} b{b}: {self.ev.infeasible_reason(self._full(t, b))}" for t, b in self._units()))
            self.log(f"nothing measured yet: profiling anchor unit tp={anchor[0]} batch={anchor[1]} first")
            # the buckets the workload runs in (and the longest, for the memory): the prior
            # learns its shape from them, and the anchor's candidates need no more
            self.profiler.profile({anchor: self.ev.needed(self._full(*anchor))})
            if not self.ev.measured:
                raise LensoptError(f"profiling the anchor unit failed: {self.ev.failed.get(anchor)}")

    def rounds(self, n_trials: int) -> None:
        """Trials in rounds; after each, profile the promising units and enqueue their candidates."""
        study = self.study
        done = len(study.records)
        if done:
            self.log(f"resuming: {done} trials already done in {self.run_dir}")
        round_size = max(20, n_trials // 5)
        shown = bar(n_trials, "trials", self.progress, initial=min(done, n_trials))
        while True:
            for _ in range(max(min(round_size, n_trials - done), 0)):
                study.trial(self.ev)
                done += 1
                shown.update(1)
            promising, bounds = self.plan()
            if promising:
                shown.clear()
                self.log(f"profiling {len(promising)} unit(s): " + ", ".join(
                    f"tp{t}xb{b} [{' '.join(map(str, bk))}]" for (t, b), bk in promising.items()))
                self.profiler.profile(promising, bounds=bounds)
                for e in front_of(self.evals(measured_only=False), self.sp):
                    if (e.candidate.tp, e.candidate.batch) in promising:
                        study.enqueue(e.candidate)
                continue
            if done >= n_trials:
                break
        shown.close()

    def plan(self) -> tuple[dict[tuple[int, int], list[int]], dict[tuple[int, int], float]]:
        """What to profile next (unit -> buckets) and each task's cost bound; nothing to stop."""
        left = self.profiler.budget_left_s()
        if left is not None and left <= 0:
            self._stopped(f"[budget] profile_s ({self.sp.budget.profile_s:g} hardware-s) is spent")
            return {}, {}
        serving = self.sp.target.serving == "continuous"
        if serving or not self.ev.measured or self.planner.cost.compile_model() is None:
            # nothing measured (a GPU target's analytical prior) or no task priced yet (profiles
            # imported without their hardware seconds): the estimated front's best unit, as needed.
            # Continuous serving too: the expected-gain designs compose static batches as matrix
            # products, and queueing is not linear in the profiles, so it profiles the estimated
            # front's most promising units instead.
            first = promising_units(self.evals(measured_only=False), self.sp, failed=self.ev.failed,
                                    missing=self.ev.missing, per_round=1)
            if not first:
                self._stopped("no unmeasured unit is on the estimated front")
            return first, {}
        d = self.planner.decide(proposed=self.study.candidates(), measured=self.evals(measured_only=True),
                                budget_left_s=left)
        if not d.choices:
            self._stopped(d.stop or "nothing to profile")
        return {c.unit: list(c.buckets) for c in d.choices}, {c.unit: c.cost.high_s for c in d.choices}

    def _stopped(self, why: str) -> None:
        if self.ledger.profile_stop != why:
            self.ledger.profile_stop = why
            self.log(f"profiling stops: {why}")

    def _on_task(self, unit: tuple[int, int], m: UnitMeasurement) -> None:
        self.planner.note_task(unit, buckets=len(m.profiles), compile_s=m.compile_s, run_s=m.run_s,
                               profiles=m.profiles)

    def _note_cached_tasks(self) -> None:
        """The hardware seconds of units profiled by earlier searches, each counted as one task
        of its cached buckets (the cache keeps a unit's sum, not its tasks)."""
        units = self.profiler.cache.units()
        units = units[units["fingerprint"] == self.ledger.fingerprint] if len(units) else units
        for r in units.itertuples():
            prof = self.ev.measured.get((int(r.tp), int(r.batch)), {})
            if prof:
                self.planner.note_task((int(r.tp), int(r.batch)), buckets=len(prof), compile_s=r.compile_s,
                                       run_s=r.run_s, profiles=prof)

    def candidates(self) -> list[Candidate]:
        """Every candidate a trial proposed, plus every bucket set of the measured units that
        their measured buckets cover."""
        key = tuple(sorted((u, tuple(sorted(p))) for u, p in self.ev.measured.items()))
        if self._sweep[0] != key:
            self._sweep = (key, self.planner.measured_sweep())
        return list(dict.fromkeys(self.study.candidates() + self._sweep[1]))

    def evals(self, *, measured_only: bool) -> list[Evaluation]:
        """The feasible, predicted evaluations of ``candidates()`` (measured ones only, if asked)."""
        evs = (self.ev.evaluate(c) for c in self.candidates())
        return [e for e in evs if e.metrics and not e.infeasible and (e.measured or not measured_only)]

    def final_front(self) -> list[Evaluation]:
        """The front of candidates predicted from measured profiles, lowest latency first."""
        evs = self.evals(measured_only=True)
        front = by_latency(front_of(evs, self.sp), self.sp)
        self.ledger.slo_met = bool(front) or not self.sp.slo
        # confirmation reads the predictions; the report and the pick of the least certain, their intervals
        front = [self.ev.evaluate(e.candidate, interval=True) for e in front]
        if not front and evs:
            self.nearest = nearest(evs, self.sp)
            self.log("no candidate meets the SLO " + ", ".join(f"{k} <= {v:g}" for k, v in self.sp.slo)
                     + "; the nearest candidates are in report.md")
        self.ledger.front = [e.candidate for e in front]
        # the knee of the front a person reads: a near-duplicate with more buckets is never chosen
        self.ledger.chosen = knee(distinct(front, self.sp), self.sp).candidate if front else None
        return front

    def checkpoint(self) -> None:
        """run.json as it stands, so a run killed later still knows what it measured."""
        self.ledger.trials = len(self.study.records) if self.study else 0
        write_ledger(self.run_dir, self.ledger)

    def write(self, *, front: list[Evaluation] | None) -> SearchResult:
        """The run's files; ``front=None`` for an interrupted run (trials and run.json)."""
        records = self.study.records if self.study else []
        self.ledger.trials = len(records)
        trials = trials_table(records, {c: self.ev.evaluate(c) for c in dict.fromkeys(r.candidate for r in records)},
                              self.sp)
        chosen = self.ledger.chosen
        stair = self.ev.measured.get((chosen.tp, chosen.batch), {}) if chosen and front is not None else {}
        sweep = rate_sweep(front, self.ev, self.sp) if front and self.ev.continuous else None
        return write_results(self.run_dir, space=self.sp, runner=self.runner, ledger=self.ledger, trials=trials,
                             front=front, staircase=stair, nearest=self.nearest, sweep=sweep)
