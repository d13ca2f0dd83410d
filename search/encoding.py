"""Candidate encoding for Optuna: tp, batch, and one on/off switch per optional bucket.

A bucket set is a subset of the space's candidate boundaries that always contains the
largest (the longest length served), so only the smaller boundaries are switches.  With
``tie_buckets`` one set serves context encoding and token generation; otherwise each
phase has its own switches.
"""
from __future__ import annotations

import itertools
from typing import Any, Iterator

from lens.types import Candidate
from spaces import SearchSpace


def _switches(space: SearchSpace) -> list[int]:
    return list(space.buckets[:-1])


def param_names(space: SearchSpace) -> list[str]:
    names = ["tp", "batch"]
    if space.tie_buckets:
        names += [f"b{v}" for v in _switches(space)]
    else:
        names += [f"ctx{v}" for v in _switches(space)] + [f"tkg{v}" for v in _switches(space)]
    return names


def suggest(trial, space: SearchSpace) -> Candidate:
    """Ask an Optuna trial for a candidate."""
    tp = trial.suggest_categorical("tp", list(space.tp))
    batch = trial.suggest_categorical("batch", list(space.batch))
    if space.tie_buckets:
        on = {v: trial.suggest_categorical(f"b{v}", [0, 1]) for v in _switches(space)}
        ctx = tkg = _set(space, on)
    else:
        ctx = _set(space, {v: trial.suggest_categorical(f"ctx{v}", [0, 1]) for v in _switches(space)})
        tkg = _set(space, {v: trial.suggest_categorical(f"tkg{v}", [0, 1]) for v in _switches(space)})
    return Candidate(tp=tp, batch=batch, ctx_buckets=ctx, tkg_buckets=tkg)


def _set(space: SearchSpace, on: dict[int, int]) -> tuple[int, ...]:
    return tuple(v for v in _switches(space) if on[v]) + (space.buckets[-1],)


def params_of(candidate: Candidate, space: SearchSpace) -> dict[str, Any]:
    """The Optuna parameters that encode ``candidate`` (for enqueueing it)."""
    p: dict[str, Any] = {"tp": candidate.tp, "batch": candidate.batch}
    if space.tie_buckets:
        p.update({f"b{v}": int(v in candidate.ctx_buckets) for v in _switches(space)})
    else:
        p.update({f"ctx{v}": int(v in candidate.ctx_buckets) for v in _switches(space)})
        p.update({f"tkg{v}": int(v in candidate.tkg_buckets) for v in _switches(space)})
    return p


def candidate_of(params: dict[str, Any], space: SearchSpace) -> Candidate:
    if space.tie_buckets:
        ctx = tkg = _set(space, {v: params[f"b{v}"] for v in _switches(space)})
    else:
        ctx = _set(space, {v: params[f"ctx{v}"] for v in _switches(space)})
        tkg = _set(space, {v: params[f"tkg{v}"] for v in _switches(space)})
    return Candidate(tp=params["tp"], batch=params["batch"], ctx_buckets=ctx, tkg_buckets=tkg)


def bucket_count_ok(candidate: Candidate, space: SearchSpace) -> bool:
    m = space.max_buckets
    return m is None or (len(candidate.ctx_buckets) <= m and len(candidate.tkg_buckets) <= m)


def all_candidates(space: SearchSpace) -> Iterator[Candidate]:
    """Every candidate of the space (the exhaustive baseline)."""
    sw = _switches(space)
    sets = [tuple(v for v, on in zip(sw, bits) if on) + (space.buckets[-1],) for bits in itertools.product((0, 1), repeat=len(sw))]
    for tp in space.tp:
        for batch in space.batch:
            if space.tie_buckets:
                for s in sets:
                    c = Candidate(tp, batch, s, s)
                    if bucket_count_ok(c, space):
                        yield c
            else:
                for a in sets:
                    for b in sets:
                        c = Candidate(tp, batch, a, b)
                        if bucket_count_ok(c, space):
                            yield c
