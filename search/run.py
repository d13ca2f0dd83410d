"""``lensopt run``: the search, end to end.

1. Load the space and the workload sample; open the profile cache; start (or join) Ray.
2. Units already in the cache under this target's fingerprint are reused as they are.
   With nothing measured and no analytical prior, one anchor unit is profiled first.
3. Rounds of an Optuna multi-objective study (NSGA-II by default) on *predictions*:
   measured profiles where the unit has them, a prior estimate where it does not.
   After each round the units of the current front (and of candidates close to it) that
   have no measured profile are profiled as Ray tasks, one per unit; their candidates are
   enqueued again so the sampler sees the measured values.  This repeats until the front
   stands on measured units only, or the profiling budget is spent.
4. The final front keeps only candidates predicted from measured profiles; the top-k are
   confirmed on the hardware (the workload sample run by the runner).
5. Everything lands in ``results/<run>/``; a rerun of the same command resumes.

Faults it survives: a unit is claimed in the cache before its task is dispatched, so two
searches sharing a cache profile it once (the second waits for the first's profiles); a
task past ``profile.timeout_s`` is cancelled and its unit recorded as failed; a worker
lost mid-task is retried by Ray; a kill at any moment loses no trial (the journal is
appended per trial) and no measured unit (the cache is written per unit). A results
folder that cannot be written (read-only, disk full) stops the search with a
``ResultsError`` naming the file; the cache is a separate file and stays whole.
"""
from __future__ import annotations

import errno
import json
import os
import platform
import signal
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from lens.errors import LensoptError, UserError
from lens.metrics import summarize
from lens.types import Candidate, Requests, Unit, stable_hash
from runners import get_runner
from spaces import Space, load_space
from spaces import load_requests
from store import ProfileCache, new_claimant_id, resolve_cache_path

from .dispatch import Dispatcher
from .encoding import params_of, suggest
from .evaluate import Evaluation, Evaluator
from .prior import AmaliPrior, ScalingPrior
from .profiler import UnitMeasurement, store
from .selection import (
    anchor_unit, by_latency, front_of, knee, measured_sweep, nearest, promising_units, spread_pick,
)
from .study import DEFAULT_SAMPLER, check_sampler, make_sampler

#: seconds between two looks at a unit another process is profiling
CLAIM_POLL_S = 1.0


@dataclass
class SearchResult:
    run_dir: Path
    front: pd.DataFrame
    trials: pd.DataFrame
    confirm: pd.DataFrame | None
    info: dict = field(default_factory=dict)


class ResultsError(UserError):
    """The results folder cannot be written (read-only, not a folder, disk full)."""


def _results_error(path: Path, exc: BaseException) -> ResultsError:
    where = getattr(exc, "filename", None) or path
    why = getattr(exc, "strerror", None) or str(exc)
    hint = ("free some space on its disk" if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
            else "make it writable")
    return ResultsError(f"cannot write {where}: {why}; {hint} or pass --results DIR (the profile cache is a "
                        f"separate file and keeps every unit measured so far)")


class _Journal:
    """Append-only record of every trial (JSON lines): a killed run loses none of them."""

    def __init__(self, path: Path):
        self.path = path

    def load(self) -> list[dict]:
        """The trials of the journal; a last line cut by a kill is dropped from the file."""
        if not self.path.exists():
            return []
        if not self.path.is_file():
            raise ResultsError(f"{self.path} is not a regular file (the trial journal); move it away or pass --results DIR")
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise _results_error(self.path, exc) from None
        out, good_end, pos = [], 0, 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            end = len(data) if nl < 0 else nl + 1
            line = data[pos:end].strip()
            pos = end
            if not line:
                continue
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                rec = None
            if not isinstance(rec, dict) or nl < 0:
                continue  # a line cut by a kill (or never finished): skipped; a cut tail is dropped below
            out.append(rec)
            good_end = end
        if data[good_end:].strip():
            # later appends must not land behind a broken line, where a reader would stop
            try:
                with self.path.open("r+b") as fh:
                    fh.truncate(good_end)
            except OSError as exc:
                raise _results_error(self.path, exc) from None
        return out

    def append(self, rec: dict) -> None:
        try:
            with self.path.open("a") as fh:
                fh.write(json.dumps(rec) + "\n")
                fh.flush()
        except OSError as exc:
            raise _results_error(self.path, exc) from None


def _versions(runner) -> dict[str, str]:
    import optuna

    out = {"lensopt": _lensopt_version(), "python": platform.python_version(), "numpy": np.__version__,
           "pandas": pd.__version__, "optuna": optuna.__version__}
    try:
        import ray

        out["ray"] = ray.__version__
    except ImportError:
        pass
    out.update({f"runner.{k}": str(v) for k, v in runner.versions().items()})
    return out


def _lensopt_version() -> str:
    try:
        from importlib.metadata import version

        return version("lensopt")
    except Exception:
        return "0+unknown"


def default_run_name(space: Space, extra: Any = None) -> str:
    return f"{space.path.stem}-{stable_hash([space.sha256, extra], 8)}"


def _cands_hint(space: Space) -> int:
    nb = 2 ** (len(space.search.buckets) - 1)
    return len(space.search.tp) * len(space.search.batch) * (nb if space.search.tie_buckets else nb * nb)


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
) -> SearchResult:
    """Search ``space``; return the Pareto front and the trials as DataFrames (see module doc)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sp = space if isinstance(space, Space) else load_space(space)
    reqs, wdesc = load_requests(sp, workload=workload, requests=requests, seed=seed)
    wdesc = wdesc.to_json()
    check_sampler(sampler)
    n_trials = trials if trials is not None else sp.budget.trials
    if n_trials < 1:
        raise UserError(f"--trials {n_trials}: must be at least 1")
    k = top_k if top_k is not None else sp.budget.top_k
    if k < 0:
        raise UserError(f"--top {k}: must be 0 or more")

    if ray_address:
        from .dispatch import check_address

        check_address(ray_address)  # before anything is written
    run_name = name or default_run_name(sp, [workload, requests, seed, sampler])
    run_dir = Path(results_dir) / run_name
    cache_path = resolve_cache_path(str(cache) if cache is not None else None)
    if os.path.lexists(cache_path):  # a damaged or foreign cache stops the run before anything is written
        ProfileCache.open(cache_path, create=False).close()
    _prepare_dir(run_dir, fresh=fresh)
    if sp.path.exists():
        try:
            (run_dir / "space.toml").write_bytes(sp.path.read_bytes())
        except OSError as exc:
            raise _results_error(run_dir / "space.toml", exc) from None
    runner = get_runner(sp.target)
    t_start = time.time()
    dispatcher = Dispatcher(resources_for=sp.hosts.resources_for, address=ray_address, num_cpus=num_cpus)
    # Ray forks its daemons: start it before a runner's SDK (e.g. JAX) starts threads here
    dispatcher.start()
    old_handler = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, _sigterm)
    try:
        fp = runner.fingerprint()
    except BaseException:
        signal.signal(signal.SIGTERM, old_handler)
        dispatcher.stop()
        raise
    state = _State(sp, reqs, run_dir, fp, cache_path, runner, log, progress)
    state.info.update({
        "run": run_name, "space": str(sp.path), "space_sha256": sp.sha256, "fingerprint": fp,
        "target": sp.target.to_dict(), "workload": wdesc, "sampler": sampler, "trials_requested": n_trials,
        "simulated": bool(runner.simulated), "versions": _versions(runner), "cache": str(cache_path),
        "ray_address": ray_address or "local", "started_at": t_start,
    })
    try:
        with ProfileCache.open(cache_path) as pc:
            state.cache = pc
            state.dispatcher = dispatcher
            state.setup(profile_all=profile_all)
            state.search(n_trials, sampler)
            front = state.front()
            conf = state.confirm(front, k) if confirm and k > 0 else _read_confirm(run_dir)
        state.info["state"] = "complete"
    except KeyboardInterrupt:
        state.info["state"] = "interrupted"
        state.finish_files(partial=True)
        raise
    finally:
        signal.signal(signal.SIGTERM, old_handler)
        dispatcher.stop()
    state.info["wall_s"] = time.time() - t_start
    result = state.finish_files(front=front, confirm=conf)
    return result


def confirm_run(
    run_dir: str | Path,
    *,
    top_k: int | None = None,
    cache: str | Path | None = None,
    ray_address: str | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> SearchResult:
    """Rerun the confirmation of a finished search (``lensopt confirm RESULTS_DIR``)."""
    rd = Path(run_dir)
    info = _load_json(rd / "run.json")
    if not info or not (rd / "pareto.csv").exists():
        raise UserError(f"RESULTS_DIR {str(run_dir) or repr('')} is not a finished lensopt run (no run.json / "
                        f"pareto.csv in {rd.absolute()}); give a results/<run> folder")
    space_file = rd / "space.toml"
    sp = load_space(space_file if space_file.exists() else info["space"])
    w = info.get("workload", {})
    reqs, _ = load_requests(sp, workload=w.get("source") if sp.workload is None else None,
                            requests=w.get("requests"), seed=w.get("seed"))
    k = top_k if top_k is not None else sp.budget.top_k
    if k < 1:
        raise UserError(f"--top {k}: must be at least 1")
    runner = get_runner(sp.target)
    dispatcher = Dispatcher(resources_for=sp.hosts.resources_for, address=ray_address)
    dispatcher.start()  # before the runner's SDK starts threads in this process
    try:
        fp = runner.fingerprint()
    except BaseException:
        dispatcher.stop()
        raise
    if fp != info.get("fingerprint"):
        dispatcher.stop()
        raise UserError(f"the target's fingerprint is now {fp}, the run was made under {info.get('fingerprint')}: "
                        f"its profiles do not apply here (other host, SDK or model); run the search again")
    cache_path = resolve_cache_path(str(cache) if cache is not None else info.get("cache"))
    front = pd.read_csv(rd / "pareto.csv")
    state = _State(sp, reqs, rd, fp, cache_path, runner, log, progress)
    state.info.update(info)
    state.info["confirm_hardware_s"] = 0.0
    try:
        with ProfileCache.open(cache_path, create=False) as pc:
            for tp, b in {(int(r.tp), int(r.batch)) for r in front.itertuples()}:
                state.ev.set_measured((tp, b), pc.get_unit(fp, tp, b))
        state.front_evals = [state.ev.evaluate(_cand_from_row(front.iloc[i]), with_prediction=True)
                             for i in range(len(front))]
        state.dispatcher = dispatcher
        conf = state.confirm(front, k)
    finally:
        dispatcher.stop()
    front = _mark_confirmed(front, conf) if conf is not None else front
    front.to_csv(rd / "pareto.csv", index=False)
    _write_json(rd / "run.json", state.info)
    return SearchResult(rd, front, pd.read_csv(rd / "trials.csv") if (rd / "trials.csv").exists() else pd.DataFrame(),
                        conf, state.info)


def _sigterm(signum, frame):
    raise KeyboardInterrupt


def _prepare_dir(run_dir: Path, *, fresh: bool) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if fresh:
            for f in ("trials.jsonl", "study.sqlite", "confirm.csv", "pareto.csv", "trials.csv", "run.json"):
                (run_dir / f).unlink(missing_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ResultsError(f"results directory {run_dir} is not writable ({exc.strerror or exc}"
                           f"{': ' + str(exc.filename) if exc.filename and str(exc.filename) != str(run_dir) else ''}); "
                           f"pass --results DIR") from None


def _read_confirm(run_dir: Path) -> pd.DataFrame | None:
    p = run_dir / "confirm.csv"
    return pd.read_csv(p) if p.exists() else None


class _State:
    """The mutable state of one search (kept apart from ``run`` to keep steps readable)."""

    def __init__(self, space: Space, reqs: Requests, run_dir: Path, fp: str, cache_path: Path, runner, log, progress):
        self.sp, self.reqs, self.run_dir, self.fp, self.cache_path = space, reqs, run_dir, fp, cache_path
        self.runner, self.log, self.progress = runner, log, progress
        self.cache: ProfileCache | None = None
        self.dispatcher: Dispatcher | None = None
        self.journal = _Journal(run_dir / "trials.jsonl")
        self.info: dict[str, Any] = {"units_reused": [], "units_measured": [], "units_failed": {},
                                     "units_noisy": {}, "units_waited": [],
                                     "profile_hardware_s": 0.0, "confirm_hardware_s": 0.0, "profile_tasks": 0,
                                     "confirm_tasks": 0}
        #: who this search is when it claims units in the shared cache
        self.owner = new_claimant_id()
        self.ev = Evaluator(space, reqs, unit_check=self._unit_check)
        self.trial_log: list[dict] = []
        self.profile_tasks_this_run = 0
        self._unplaceable: dict[int, str | None] = {}
        self.study = None

    # -- setup ---------------------------------------------------------------------------
    def _unit_check(self, tp: int, batch: int) -> str | None:
        try:
            self.runner.check_unit(Unit(target=self.sp.target, tp=tp, batch=batch))
        except LensoptError as exc:
            return str(exc)
        if self.dispatcher is not None:
            if tp not in self._unplaceable:
                self._unplaceable[tp] = self.dispatcher.unplaceable(tp)
            return self._unplaceable[tp]
        return None

    def units(self) -> list[tuple[int, int]]:
        return [(t, b) for t in self.sp.search.tp for b in self.sp.search.batch]

    def setup(self, *, profile_all: bool = False) -> None:
        sp = self.sp
        prev = _load_json(self.run_dir / "run.json")
        for key in ("units_measured", "units_failed", "units_noisy", "profile_hardware_s", "confirm_hardware_s",
                    "profile_tasks", "confirm_tasks"):
            if key in prev and prev.get("fingerprint") == self.fp:
                self.info[key] = prev[key] if not isinstance(prev[key], list) else [tuple(u) for u in prev[key]]
        self.info["units_measured"] = [tuple(u) for u in self.info["units_measured"]]
        for unit in self.units():
            prof = {b: p for b, p in self.cache.get_unit(self.fp, *unit).items() if b in sp.search.buckets}
            if prof:
                self.ev.set_measured(unit, prof)
                self._note_spread(unit, prof)
                if unit not in self.info["units_measured"]:
                    self.info["units_reused"].append(unit)
        amali = AmaliPrior.for_hardware(sp.target.model, sp.target.dtype, sp.target.hardware)
        if amali is not None:
            self.ev.priors.append(amali)
        self.ev.priors.append(ScalingPrior(sp.target.model, sp.target.dtype))
        self.log(f"{sp.target.name}: runner {sp.target.runner} on {sp.target.hardware}"
                 f"{' (SIMULATED)' if self.runner.simulated else ''}, fingerprint {self.fp}; "
                 f"{len(self.reqs)} requests ({self.info['workload']['source'] if 'workload' in self.info else ''}); "
                 f"{len(self.ev.measured)} of {len(self.units())} units already in the cache {self.cache_path}")
        if profile_all:
            todo = {u: list(sp.search.buckets) for u in self.units()
                    if self.ev.infeasible_reason(self._full(*u)) is None}
            self.log(f"profiling every feasible unit ({len(todo)}) as asked")
            self.profile(todo)
        if not self.ev.measured and amali is None:
            anchor = anchor_unit(sp.search, lambda t, b: self.ev.infeasible_reason(self._full(t, b)))
            if anchor is None:
                raise UserError("no unit of the space is feasible: " + "; ".join(
                    f"tp{t} b{b}: {self.ev.infeasible_reason(self._full(t, b))}" for t, b in self.units()))
            self.log(f"nothing measured yet: profiling anchor unit tp={anchor[0]} batch={anchor[1]} first")
            self.profile({anchor: list(sp.search.buckets)})
            if not self.ev.measured:
                raise LensoptError(f"profiling the anchor unit failed: {self.ev.failed.get(anchor)}")

    def _full(self, tp: int, batch: int) -> Candidate:
        b = self.sp.search.buckets
        return Candidate(tp, batch, b, b)

    # -- profiling -----------------------------------------------------------------------
    def budget_left(self) -> bool:
        cap = self.sp.budget.profile_s
        return cap is None or self.info["profile_hardware_s"] < cap

    def profile(self, units: dict[tuple[int, int], list[int]]) -> None:
        """Measure the listed buckets of each unit: one Ray task (one compilation) per unit.

        Each unit is claimed in the cache first; a unit another search is profiling is
        waited for (its profiles are read when they land) rather than measured again.
        """
        have = self.ev.measured
        units = {u: sorted(b for b in bk if b not in have.get(u, {})) for u, bk in units.items() if u not in self.ev.failed}
        units = {u: bk for u, bk in units.items() if bk}
        told: set[tuple[int, int]] = set()
        try:
            while units:
                granted, waiting = {}, {}
                for u, bk in units.items():
                    c = self.cache.claim_unit(fingerprint=self.fp, tp=u[0], batch=u[1], buckets=bk, owner=self.owner,
                                              lease_s=self.sp.profile.lease_s)
                    if c.granted:
                        granted[u] = list(c.missing)
                    elif not c.missing:
                        self._take_from_cache(u, waited=u in told)
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
                units = waiting
        finally:
            self.cache.release_claims(owner=self.owner)
        self._checkpoint()

    def _take_from_cache(self, unit: tuple[int, int], *, waited: bool) -> None:
        prof = {b: p for b, p in self.cache.get_unit(self.fp, *unit).items() if b in self.sp.search.buckets}
        self.ev.set_measured(unit, prof)
        self._note_spread(unit, prof)
        if unit not in self.info["units_measured"] and unit not in self.info["units_reused"]:
            self.info["units_reused"].append(unit)
        if waited:
            self.info["units_waited"].append(list(unit))
            self.log(f"  unit tp={unit[0]} batch={unit[1]}: profiled by another search; {len(prof)} buckets read from the cache")

    def _dispatch(self, units: dict[tuple[int, int], list[int]]) -> None:
        sp = self.sp
        lease = sp.profile.lease_s

        def renew(keys: list) -> None:  # while tasks run: our claims must outlive them
            self.cache.renew_claims(owner=self.owner, units=[(self.fp, t, b) for t, b in keys], lease_s=lease)

        bar = _bar(len(units), "profiling units", self.progress)
        for out in self.dispatcher.profile_units(sp.target, units, all_buckets=sp.search.buckets, profile=sp.profile,
                                                 tick=renew, tick_s=lease / 3):
            self.info["profile_tasks"] += 1
            self.profile_tasks_this_run += 1
            unit = out.key
            if out.error:
                self.cache.release_claims(owner=self.owner, units=[(self.fp, *unit)])
                self.ev.set_failed(unit, out.error)
                self.info["units_failed"][f"{unit[0]}x{unit[1]}"] = out.error
                self.log(f"  unit tp={unit[0]} batch={unit[1]}: FAILED: {out.error}")
            else:
                m: UnitMeasurement = out.value
                # whole unit and the end of its claim, one transaction
                store(self.cache, self.fp, sp.target, m, self.runner.name, release_owner=self.owner)
                self.ev.set_measured(unit, m.profiles)
                self.info["units_measured"].append(unit)
                self.info["profile_hardware_s"] += m.hardware_s
                self.info.setdefault("unit_tasks", []).append(
                    {"tp": unit[0], "batch": unit[1], "buckets": sorted(m.profiles), "node_id": m.node_id,
                     "started_at": m.started_at, "ended_at": m.ended_at, "hardware_s": m.hardware_s,
                     "attempts": m.attempts})
                self._note_spread(unit, m.profiles, m.noisy)
                sim = " simulated" if m.simulated else ""
                noisy = f"; NOISY: {'; '.join(m.noisy.values())}" if m.noisy else ""
                self.log(f"  unit tp={unit[0]} batch={unit[1]}: {len(m.profiles)} buckets measured on {m.host}, "
                         f"{m.hardware_s:.1f}{sim} hardware-s (compile {m.compile_s:.1f} s){noisy}")
            bar.update(1)
        bar.close()

    def _note_spread(self, unit: tuple[int, int], profiles: dict, reasons: dict | None = None) -> None:
        """Record the buckets of a unit whose repeats spread more than profile.max_spread."""
        lim = self.sp.profile.max_spread
        noisy = {str(b): (reasons or {}).get(b) or f"bucket {b}: repeats spread {p.spread:.0%} of their median "
                                                      f"(more than profile.max_spread = {lim:.0%})"
                 for b, p in profiles.items() if p.spread > lim or b in (reasons or {})}
        if noisy:
            self.info["units_noisy"].setdefault(f"{unit[0]}x{unit[1]}", {}).update(noisy)

    def _checkpoint(self) -> None:
        """run.json as it stands, so a run killed later still knows what it measured."""
        info = dict(self.info, state="running")
        info["units_measured"] = [list(u) for u in dict.fromkeys(map(tuple, info["units_measured"]))]
        info["units_reused"] = [list(u) for u in info["units_reused"]]
        _write_json(self.run_dir / "run.json", info)

    # -- the study -----------------------------------------------------------------------
    def _new_study(self, sampler: str):
        import optuna

        st = optuna.create_study(directions=["maximize", "minimize"], sampler=make_sampler(sampler, 0, _cands_hint(self.sp)),
                                 study_name=self.run_dir.name)
        past = self.journal.load()
        if past:
            self.log(f"resuming: {len(past)} trials already done in {self.run_dir}")
        for rec in past:
            self.trial_log.append(rec)
            st.add_trial(_frozen(rec, self.sp))
        return st

    def search(self, n_trials: int, sampler: str) -> None:
        import optuna

        self.study = st = self._new_study(sampler)
        done = len(self.trial_log)
        round_size = max(20, n_trials // 5)
        bar = _bar(n_trials, "trials", self.progress, initial=min(done, n_trials))
        while True:
            todo = min(round_size, n_trials - done)
            for _ in range(max(todo, 0)):
                self._one_trial(st)
                done += 1
                bar.update(1)
            promising = self.promising_units()
            if promising and self.budget_left():
                bar.clear()
                self.log(f"profiling {len(promising)} promising unit(s): " + ", ".join(
                    f"tp{t}xb{b} [{' '.join(map(str, bk))}]" for (t, b), bk in promising.items()))
                self.profile(promising)
                for e in front_of(self._evals(measured_only=False), self.sp):
                    if (e.candidate.tp, e.candidate.batch) in promising:
                        st.enqueue_trial(params_of(e.candidate, self.sp.search), skip_if_exists=False)
                continue
            if done >= n_trials:
                break
        bar.close()

    def _one_trial(self, st) -> None:
        import optuna
        from optuna.trial import TrialState

        t = st.ask()
        cand = suggest(t, self.sp.search)
        ev = self.ev.evaluate(cand)
        rec = {"number": t.number, "params": t.params, "candidate": _cand_dict(cand), "source": ev.source}
        if ev.infeasible or not ev.metrics:
            reason = ev.infeasible or "no profile and no prior estimate for this unit yet"
            t.set_user_attr("infeasible", reason)
            st.tell(t, state=TrialState.FAIL)
            rec.update({"state": "FAIL", "infeasible": reason})
        else:
            vals = list(ev.values(self.sp))
            viol = ev.violations(self.sp)
            for k, v in viol.items():
                t.set_constraint(k, v)
            t.set_user_attr("source", ev.source)
            st.tell(t, vals)
            rec.update({"state": "COMPLETE", "values": vals, "constraints": viol})
        self.trial_log.append(rec)
        self.journal.append(rec)

    def distinct_candidates(self) -> list[Candidate]:
        """Every candidate a trial proposed, plus every bucket set of the measured units."""
        seen = dict.fromkeys(_cand_from(rec["candidate"]) for rec in self.trial_log)
        key = tuple(sorted((u, tuple(sorted(p))) for u, p in self.ev.measured.items()))
        if getattr(self, "_sweep_key", None) != key:
            self._sweep_key, self._sweep_list = key, measured_sweep(self.sp.search, self.ev.measured)
        seen.update(dict.fromkeys(self._sweep_list))
        return list(seen)

    def _evals(self, *, measured_only: bool) -> list[Evaluation]:
        out = []
        for c in self.distinct_candidates():
            ev = self.ev.evaluate(c)
            if ev.infeasible or not ev.metrics:
                continue
            if measured_only and not ev.measured:
                continue
            out.append(ev)
        return out

    def promising_units(self) -> dict[tuple[int, int], list[int]]:
        return promising_units(self._evals(measured_only=False), self.sp, failed=self.ev.failed, missing=self.ev.missing)

    def front(self) -> pd.DataFrame:
        evs = self._evals(measured_only=True)
        front = by_latency(front_of(evs, self.sp), self.sp)
        self.info["slo_met"] = bool(front) or not self.sp.slo
        front = [self.ev.evaluate(e.candidate, with_prediction=True) for e in front]  # confirmation reads them
        self.front_evals = front
        if not front and evs:
            self.nearest = nearest(evs, self.sp)
            self.log("no candidate meets the SLO " + ", ".join(f"{k} <= {v:g}" for k, v in self.sp.slo)
                     + "; the nearest candidates are in report.md")
        else:
            self.nearest = []
        df = pd.DataFrame([_eval_row(e, self.sp) for e in front])
        if len(df):
            df.insert(0, "rank", range(1, len(df) + 1))
        return df

    # -- confirmation --------------------------------------------------------------------
    def confirm(self, front: pd.DataFrame, k: int) -> pd.DataFrame | None:
        if front.empty:
            return None
        picks = spread_pick(len(self.front_evals), k)
        cands = [self.front_evals[i].candidate for i in picks]
        by_cand = {e.candidate: e for e in self.front_evals}
        rows = []
        cap = self.sp.budget.confirm_s
        self.log(f"confirming {len(cands)} candidate(s) on the hardware with the {len(self.reqs)}-request workload")
        bar = _bar(len(cands), "confirming", self.progress)
        for out in self.dispatcher.confirm(self.sp.target, cands, self.reqs):
            self.info["confirm_tasks"] += 1
            c = out.key
            ev = by_cand[c]
            row = {"tp": c.tp, "batch": c.batch, "ctx_buckets": _join(c.ctx_buckets), "tkg_buckets": _join(c.tkg_buckets)}
            if out.error:
                row.update({"error": out.error, "flagged": True})
            else:
                wr = out.value
                self.info["confirm_hardware_s"] += wr.compile_s + wr.run_s
                meas = summarize(self.reqs, ttft_s=wr.ttft_s, e2e_s=wr.e2e_s, total_s=wr.total_s, chips=c.tp)
                row.update(_compare(ev.metrics, meas, self.sp, wr.simulated))
                per_req = np.abs(ev.prediction.e2e_s - wr.e2e_s) / wr.e2e_s
                row["e2e_request_mape_%"] = float(per_req.mean() * 100)
                row["flagged"] = any(abs(row[f"{m}_err_%"]) > self.sp.budget.tolerance * 100 for m in _CONFIRM_METRICS)
            rows.append(row)
            bar.update(1)
            if cap is not None and self.info["confirm_hardware_s"] >= cap:
                self.log(f"confirmation budget of {cap:g} hardware-s spent; stopping confirmation")
                break
        bar.close()
        df = pd.DataFrame(rows)
        try:
            df.to_csv(self.run_dir / "confirm.csv", index=False)
        except OSError as exc:
            raise _results_error(self.run_dir / "confirm.csv", exc) from None
        return df

    # -- outputs -------------------------------------------------------------------------
    def trials_frame(self) -> pd.DataFrame:
        rows = []
        for rec in self.trial_log:
            c = _cand_from(rec["candidate"])
            ev = self.ev.evaluate(c)  # the final estimate, from measured profiles where there are some
            row = {"trial": rec["number"], "state": rec["state"], "tp": c.tp, "batch": c.batch,
                   "ctx_buckets": _join(c.ctx_buckets), "tkg_buckets": _join(c.tkg_buckets),
                   "source_at_trial": rec.get("source", ""), "source_now": ev.source,
                   "infeasible": ev.infeasible or rec.get("infeasible", "")}
            if ev.metrics:
                row.update({k: ev.metrics[k] for k in _REPORT_METRICS if k in ev.metrics})
                row["meets_slo"] = ev.meets_slo(self.sp)
            rows.append(row)
        return pd.DataFrame(rows)

    def finish_files(self, *, front: pd.DataFrame | None = None, confirm: pd.DataFrame | None = None,
                     partial: bool = False) -> SearchResult:
        try:
            return self._finish_files(front=front, confirm=confirm, partial=partial)
        except OSError as exc:
            raise _results_error(self.run_dir, exc) from None
        except Exception as exc:
            # the study mirror is written through SQLAlchemy, which wraps "disk full" in its own error
            if type(exc).__module__.startswith("sqlalchemy") or isinstance(exc, sqlite3.Error):
                raise _results_error(self.run_dir / "study.sqlite", exc) from None
            raise

    def _finish_files(self, *, front: pd.DataFrame | None, confirm: pd.DataFrame | None,
                      partial: bool) -> SearchResult:
        from .deploy import write_deploy
        from .report import write_report

        rd = self.run_dir
        info = self.info
        info["units_measured"] = [list(u) for u in dict.fromkeys(map(tuple, info["units_measured"]))]
        info["units_reused"] = [list(u) for u in info["units_reused"]]
        info["trials"] = len(self.trial_log)
        info["profile_tasks_this_run"] = self.profile_tasks_this_run
        trials = self.trials_frame()
        trials.to_csv(rd / "trials.csv", index=False)
        _mirror_study(self.trial_log, self.sp, rd / "study.sqlite", rd.name)
        if partial:
            _write_json(rd / "run.json", info)
            return SearchResult(rd, pd.DataFrame(), trials, None, info)
        front = front if front is not None else pd.DataFrame()
        if confirm is not None and len(front):
            front = _mark_confirmed(front, confirm)
        front.to_csv(rd / "pareto.csv", index=False)
        if len(front):
            chosen = knee(self.front_evals, self.sp).candidate
            info["chosen"] = _cand_dict(chosen)
            write_deploy(rd / "deploy", self.sp, chosen, self.runner)
            stair = self.ev.measured.get((chosen.tp, chosen.batch), {})
        else:
            chosen, stair = None, {}
        _write_json(rd / "run.json", info)
        write_report(rd, space=self.sp, front=front, trials=trials, confirm=confirm, info=info,
                     chosen=chosen, staircase=stair, nearest=[_eval_row(e, self.sp) for e in getattr(self, "nearest", [])])
        return SearchResult(rd, front, trials, confirm, info)


_CONFIRM_METRICS = ("throughput_tok_s", "e2e_p90_s", "ttft_p50_s", "tpot_p50_s")
_REPORT_METRICS = ("throughput_tok_s", "throughput_tok_s_per_chip", "throughput_tok_s_per_host", "ttft_mean_s", "ttft_p50_s",
                   "ttft_p90_s", "ttft_p99_s", "tpot_mean_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "e2e_mean_s",
                   "e2e_p50_s", "e2e_p90_s", "e2e_p99_s", "prefill_padding", "decode_padding", "total_s")


def _compare(pred: dict, meas: dict, sp: Space, simulated: bool) -> dict:
    row = {"simulated": simulated}
    for m in dict.fromkeys(_CONFIRM_METRICS + (sp.objectives.throughput, sp.objectives.latency)):
        p, q = pred[m], meas[m]
        row[f"{m}_predicted"] = p
        row[f"{m}_measured"] = q
        row[f"{m}_err_%"] = (p - q) / q * 100 if q else float("nan")
    return row


def _mark_confirmed(front: pd.DataFrame, confirm: pd.DataFrame) -> pd.DataFrame:
    key = ["tp", "batch", "ctx_buckets", "tkg_buckets"]
    c = confirm[key + (["flagged"] if "flagged" in confirm else [])].copy()
    c["confirmed"] = True
    out = front.drop(columns=[x for x in ("confirmed", "flagged") if x in front], errors="ignore").merge(c, on=key, how="left")
    out["confirmed"] = out["confirmed"].fillna(False).astype(bool)
    return out


def _eval_row(e: Evaluation, sp: Space) -> dict:
    c = e.candidate
    row = {"tp": c.tp, "batch": c.batch, "ctx_buckets": _join(c.ctx_buckets), "tkg_buckets": _join(c.tkg_buckets),
           "source": e.source}
    row.update({k: e.metrics[k] for k in _REPORT_METRICS if k in e.metrics})
    for k, v in e.violations(sp).items():
        row[f"slo_{k}_over_s"] = v
    return row


def _join(b) -> str:
    return " ".join(map(str, b))


def _cand_dict(c: Candidate) -> dict:
    return {"tp": c.tp, "batch": c.batch, "ctx_buckets": list(c.ctx_buckets), "tkg_buckets": list(c.tkg_buckets)}


def _cand_from(d: dict) -> Candidate:
    return Candidate(int(d["tp"]), int(d["batch"]), tuple(d["ctx_buckets"]), tuple(d["tkg_buckets"]))


def _cand_from_row(r) -> Candidate:
    ctx = tuple(int(x) for x in str(r["ctx_buckets"]).split())
    tkg = tuple(int(x) for x in str(r["tkg_buckets"]).split())
    return Candidate(int(r["tp"]), int(r["batch"]), ctx, tkg)


def _distributions(sp: Space) -> dict:
    from optuna.distributions import CategoricalDistribution

    from .encoding import param_names

    d = {}
    for n in param_names(sp.search):
        if n == "tp":
            d[n] = CategoricalDistribution(list(sp.search.tp))
        elif n == "batch":
            d[n] = CategoricalDistribution(list(sp.search.batch))
        else:
            d[n] = CategoricalDistribution([0, 1])
    return d


def _frozen(rec: dict, sp: Space):
    import optuna
    from optuna.trial import TrialState

    dists = _distributions(sp)
    params = {k: v for k, v in rec["params"].items() if k in dists}
    if rec["state"] == "COMPLETE":
        return optuna.trial.create_trial(state=TrialState.COMPLETE, values=rec["values"], params=params,
                                         distributions={k: dists[k] for k in params}, constraints=rec.get("constraints") or None,
                                         user_attrs={"source": rec.get("source", "")})
    return optuna.trial.create_trial(state=TrialState.FAIL, params=params, distributions={k: dists[k] for k in params},
                                     user_attrs={"infeasible": rec.get("infeasible", "")})


def _mirror_study(trial_log: list[dict], sp: Space, path: Path, name: str) -> None:
    """Write the trials into an Optuna RDB file so optuna-dashboard can open it."""
    import warnings

    import optuna

    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    storage = optuna.storages.RDBStorage(f"sqlite:///{path}")
    try:
        st = optuna.load_study(study_name=name, storage=storage)
        have = len(st.trials)
    except KeyError:
        st = optuna.create_study(study_name=name, storage=storage, directions=["maximize", "minimize"])
        st.set_metric_names([sp.objectives.throughput, sp.objectives.latency])
        have = 0
    new = trial_log[have:]
    if new:
        st.add_trials([_frozen(r, sp) for r in new])
    storage.remove_session()
    storage.engine.dispose()


def _load_json(p: Path) -> dict:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return {}


def _write_json(p: Path, obj: dict) -> None:
    from .cli_common import _clean

    tmp = p.with_suffix(".json.tmp")
    try:
        tmp.write_text(json.dumps(_clean(obj), indent=2, default=str))
        os.replace(tmp, p)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise _results_error(p, exc) from None


class _NoBar:
    def update(self, n=1):
        pass

    def close(self):
        pass

    def clear(self):
        pass


def _bar(total: int, desc: str, enabled: bool, initial: int = 0):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, initial=initial, leave=False, dynamic_ncols=True)
