"""``lensopt run --estimate-only``: a search with no hardware at all, on analytical estimates.

For GPU targets the analytical model (``lens.amali``) gives TTFT_b / TBT_b for every unit,
so every candidate of the space is evaluated (exhaustively: it costs no hardware) and the
front is computed on those estimates. Nothing is profiled or confirmed; every number in
the results is an estimate and says so.
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from lens.errors import UserError
from spaces import Space, load_space
from spaces import load_requests

from .encoding import all_candidates
from .evaluate import Evaluator
from .prior import AmaliPrior
from .ledger import RunLedger
from .results import (
    SearchResult, candidate_cells, default_run_name, eval_row, prepare_dir, results_error, write_front, write_ledger,
)
from .selection import by_latency, distinct, front_of, knee

#: more candidates than this are sampled at random instead of enumerated
MAX_CANDIDATES = 50_000


def estimate_run(
    space: Space | str | Path,
    *,
    results_dir: str | Path = "results",
    name: str | None = None,
    workload: str | None = None,
    requests: int | None = None,
    seed: int | None = None,
    log: Callable[[str], None] = print,
):
    from .report import write_report

    sp = space if isinstance(space, Space) else load_space(space)
    t = sp.target
    prior = AmaliPrior.for_hardware(t.model, t.dtype, t.hardware, t.prefill)
    if prior is None:
        from lens.amali import known_gpus

        raise UserError(
            f"{sp.path}: --estimate-only needs an analytical model of target.hardware = {t.hardware!r}; "
            f"known GPUs: {', '.join(known_gpus())} (NPUs have no analytical model: profile them instead)"
        )
    reqs, wdesc = load_requests(sp, workload=workload, requests=requests, seed=seed)
    if sp.hosts.memory_gib_per_chip is None:
        from lens.amali import gpu_spec

        mem = gpu_spec(t.hardware).memory_gb * 1e9 / 2**30
        sp = dataclasses.replace(sp, hosts=dataclasses.replace(sp.hosts, memory_gib_per_chip=mem))
    run_dir = Path(results_dir) / (name or default_run_name(sp, ["estimate", workload, requests, seed]))
    prepare_dir(run_dir, fresh=True)
    t0 = time.time()
    ev = Evaluator(sp, reqs)
    ev.priors.append(_UnitCachedPrior(prior, sp.search.buckets))
    cands = list(all_candidates(sp.search))
    if len(cands) > MAX_CANDIDATES:
        rng = np.random.default_rng(0)
        cands = [cands[i] for i in sorted(rng.choice(len(cands), MAX_CANDIDATES, replace=False))]
    log(f"{t.name}: estimating {len(cands)} candidates with the AMALI analytical model of {t.hardware} "
        f"(no hardware used: every number is an estimate)")
    evals = [ev.evaluate(c) for c in cands]
    rows = []
    for e in evals:
        c = e.candidate
        row = {"trial": len(rows), "state": "COMPLETE" if e.metrics else "FAIL", **candidate_cells(c),
               "source_at_trial": e.source, "source_now": e.source, "infeasible": e.infeasible or ""}
        if e.metrics:
            row.update(eval_row(e, sp))
            row["meets_slo"] = e.meets_slo(sp)
        rows.append(row)
    trials = pd.DataFrame(rows)
    front_evals = by_latency(front_of([e for e in evals if e.metrics and not e.infeasible], sp), sp)
    chosen = knee(distinct(front_evals, sp), sp).candidate if front_evals else None
    ledger = RunLedger(run=run_dir.name, space=str(sp.path), space_sha256=sp.sha256, estimate_only=True,
                       estimator=prior.name, gpu=t.hardware, target=t, workload=wdesc, trials=len(cands),
                       state="complete", wall_s=time.time() - t0, slo_met=bool(front_evals) or not sp.slo,
                       front=[e.candidate for e in front_evals], chosen=chosen)
    try:
        trials.to_csv(run_dir / "trials.csv", index=False)
    except OSError as exc:
        raise results_error(run_dir / "trials.csv", exc) from None
    front = write_front(run_dir, front_evals, sp)
    stair = prior.estimate(chosen.tp, chosen.batch, sp.search.buckets) if chosen else {}
    write_ledger(run_dir, ledger)
    write_report(run_dir, space=sp, front=front, trials=trials, confirm=None, ledger=ledger, chosen=chosen,
                 staircase=stair, nearest=[])
    return SearchResult(run_dir, front, trials, None, ledger)


class _UnitCachedPrior:
    """The analytical prior computed once per unit for all the space's buckets."""

    def __init__(self, prior, buckets):
        self.prior, self.buckets, self._cache = prior, list(buckets), {}
        self.name = prior.name

    def estimate(self, tp, batch, buckets, measured=None):
        key = (tp, batch)
        if key not in self._cache:
            self._cache[key] = self.prior.estimate(tp, batch, self.buckets)
        full = self._cache[key]
        return {b: full[b] for b in buckets}
