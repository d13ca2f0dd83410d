"""The Optuna glue of a search: samplers, the study, and the trial store.

Optuna is imported inside the functions that use it, so the command line (which lists
the sampler names) and ``lensopt profile | predict | measure`` run without it.
"""
from __future__ import annotations

from typing import Any, Callable


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
