"""The Optuna glue of a search: samplers, the trial store, and the sampler's study.

The trials of a run live in one store, ``results/<run>/study.journal``: Optuna's
``JournalStorage`` on a ``JournalFileBackend``, one line appended (and synced) per finished
trial, with the candidate and where its numbers came from as user attributes. Everything
else is derived from it: the sampler's working copy (an in-memory study, rebuilt from the
store on resume, so asking costs no file IO), ``trials.csv``, and what optuna-dashboard
shows (``optuna-dashboard results/<run>/study.journal``).

A kill (even ``kill -9``) loses at most the trial being told: each line is written whole
and synced before the next trial starts, a last line cut by the kill is dropped before the
store is opened again, and appends are serialised by an ``flock`` the kernel releases when
its holder dies (Optuna's own file locks would leave a lock file behind that the next run
waits out).

Optuna is imported inside the functions that use it, so the command line (which lists the
sampler names) and ``lensopt profile | predict | measure`` run without it.
"""
from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from lens.types import Candidate
from spaces import SearchSpace, Space

from .encoding import candidate_of, param_names, params_of, suggest

if TYPE_CHECKING:
    from .evaluate import Evaluator

#: the trial store of a run folder
STORE_FILE = "study.journal"
#: maximise the throughput objective, minimise the latency one
DIRECTIONS = ("maximize", "minimize")


def _nsga2(seed: int, n_candidates: int) -> Any:
    import optuna

    return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(8, min(50, n_candidates // 4)))


def _tpe(seed: int, n_candidates: int) -> Any:
    import optuna

    return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=10)


def _random(seed: int, n_candidates: int) -> Any:
    import optuna

    return optuna.samplers.RandomSampler(seed=seed)


#: sampler name -> factory(seed, number of candidates in the space); the first is the default
SAMPLERS: dict[str, Callable[[int, int], Any]] = {"nsga2": _nsga2, "tpe": _tpe, "random": _random}
DEFAULT_SAMPLER = next(iter(SAMPLERS))


def check_sampler(name: str) -> None:
    from lens.errors import UserError

    if name not in SAMPLERS:
        raise UserError(f"--sampler {name!r} is unknown: use one of {', '.join(SAMPLERS)}")


def make_sampler(name: str, seed: int, n_candidates: int) -> Any:
    check_sampler(name)
    return SAMPLERS[name](seed, n_candidates)


def n_candidates(space: SearchSpace) -> int:
    """How many candidates the space holds (bucket sets always keep the largest bucket)."""
    nb = 2 ** (len(space.buckets) - 1)
    return len(space.tp) * len(space.batch) * (nb if space.tie_buckets else nb * nb)


def distributions(space: SearchSpace) -> dict[str, Any]:
    """The Optuna distribution of each parameter that encodes a candidate."""
    from optuna.distributions import CategoricalDistribution

    choices = {"tp": list(space.tp), "batch": list(space.batch)}
    return {n: CategoricalDistribution(choices.get(n, [0, 1])) for n in param_names(space)}


@dataclass(frozen=True)
class TrialRecord:
    """One finished trial: the candidate it proposed and what became of it."""

    number: int
    #: "COMPLETE" (predicted) or "FAIL" (infeasible, or nothing to predict it from yet)
    state: str
    candidate: Candidate
    #: where its numbers came from at the time: "measured", "simulated" or "estimate:<prior>"
    source: str = ""
    infeasible: str = ""

    @classmethod
    def of(cls, trial: Any, space: SearchSpace) -> "TrialRecord":
        """The record of a finished Optuna trial of this store."""
        attrs = trial.user_attrs
        cand = Candidate.from_dict(attrs["candidate"]) if "candidate" in attrs else candidate_of(trial.params, space)
        return cls(trial.number, trial.state.name, cand, attrs.get("source", ""), attrs.get("infeasible", ""))


class _FileLock:
    """An exclusive ``flock`` on the journal itself (the lock object JournalFileBackend takes)."""

    def __init__(self, path: Path):
        self.path, self._fd = path, -1

    def acquire(self) -> bool:
        import fcntl

        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        return True

    def release(self) -> None:
        import fcntl

        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = -1


def _repair(path: Path) -> None:
    """Drop a last line a kill cut short; refuse a store damaged anywhere else."""
    from .results import ResultsError, results_error

    if not path.exists():
        return
    if not path.is_file():
        raise ResultsError(f"{path} is not a regular file (the trial store); move it away or pass --results DIR")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise results_error(path, exc) from None
    end = data.rfind(b"\n") + 1
    for n, line in enumerate(data[:end].splitlines(), 1):
        try:
            ok = isinstance(json.loads(line), dict)
        except (json.JSONDecodeError, UnicodeDecodeError):
            ok = False
        if not ok:
            raise ResultsError(f"{path}, line {n}: not an entry of the trial store; move the file away or pass "
                               f"--fresh to start the run over")
    if end < len(data):  # later appends must not land behind the broken line, where reading stops
        try:
            with path.open("r+b") as fh:
                fh.truncate(end)
        except OSError as exc:
            raise results_error(path, exc) from None


class TrialStore:
    """The finished trials of one run, in Optuna's journal storage on one file."""

    def __init__(self, path: Path, *, study_name: str, space: Space):
        import optuna
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        from .results import ResultsError, results_error

        self.path, self.space = path, space
        _repair(path)
        try:
            storage = JournalStorage(JournalFileBackend(str(path), lock_obj=_FileLock(path)))
            self.study = optuna.create_study(storage=storage, study_name=study_name, directions=list(DIRECTIONS),
                                             load_if_exists=True)
            if self.study.metric_names is None:
                with warnings.catch_warnings():  # experimental in Optuna, and what the dashboard labels axes with
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    self.study.set_metric_names([space.objectives.throughput, space.objectives.latency])
        except OSError as exc:
            raise results_error(path, exc) from None
        want = distributions(space.search)
        for t in self.study.get_trials(deepcopy=False):
            if set(t.distributions) - set(want) or t.distributions != {k: want[k] for k in t.distributions}:
                raise ResultsError(f"{path} holds the trials of another search space; pass --fresh to start the run "
                                   f"over, or --name for another run folder")

    def trials(self) -> list[Any]:
        """The stored trials (Optuna ``FrozenTrial``), in the order they finished."""
        return self.study.get_trials(deepcopy=False)

    def append(self, trial: Any) -> None:
        from .results import results_error

        try:
            self.study.add_trial(trial)
        except OSError as exc:
            raise results_error(self.path, exc) from None


class SearchStudy:
    """The sampler's study: asks candidates, tells their predictions, journals each trial."""

    def __init__(self, space: Space, store: TrialStore, *, sampler: str, study_name: str, seed: int = 0):
        import optuna

        self.space, self.store = space, store
        self.study = optuna.create_study(directions=list(DIRECTIONS), study_name=study_name,
                                         sampler=make_sampler(sampler, seed, n_candidates(space.search)))
        past = store.trials()
        self.study.add_trials(past)
        self.records = [TrialRecord.of(t, space.search) for t in past]

    def candidates(self) -> list[Candidate]:
        """Every candidate a trial proposed, once each, in the order first proposed."""
        return list(dict.fromkeys(r.candidate for r in self.records))

    def enqueue(self, candidate: Candidate) -> None:
        """Have the sampler's next trials propose ``candidate`` (e.g. once its unit is measured)."""
        self.study.enqueue_trial(params_of(candidate, self.space.search), skip_if_exists=False)

    def trial(self, evaluator: "Evaluator") -> TrialRecord:
        """Ask for a candidate, predict it, tell the prediction and journal the finished trial."""
        from optuna.trial import TrialState

        t = self.study.ask()
        cand = suggest(t, self.space.search)
        ev = evaluator.evaluate(cand)
        t.set_user_attr("candidate", cand.to_dict())
        t.set_user_attr("source", ev.source)
        if ev.infeasible or not ev.metrics:
            t.set_user_attr("infeasible", ev.infeasible or "no profile and no prior estimate for this unit yet")
            frozen = self.study.tell(t, state=TrialState.FAIL)
        else:
            for k, v in ev.violations(self.space).items():
                t.set_constraint(k, v)
            frozen = self.study.tell(t, list(ev.values(self.space)))
        self.store.append(frozen)
        rec = TrialRecord.of(frozen, self.space.search)
        self.records.append(rec)
        return rec
