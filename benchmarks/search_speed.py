"""Search-loop speed on cached profiles (no hardware involved).

Prints, as medians over repeated runs with their spread (min..max):
- trials per second of the search loop (Optuna NSGA-II ask/tell, candidate decoding,
  feasibility, LENS prediction of a 2,000-request workload, the trial appended to the
  run's trial store) on a space whose units are all profiled (goal >= 500/s);
- distinct-candidate predictions per second (memoisation off: every trial a new prediction);
- the time to predict one 10,000-request workload (goal <= 20 ms).

    python benchmarks/search_speed.py [--space spaces/sim-inf2.toml] [--trials 1000] [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import optuna  # noqa: E402

from lens.compose import UnitTable, predict  # noqa: E402
from lens.distributions import sample  # noqa: E402
from lens.metrics import summarize_prediction  # noqa: E402
from lens.types import Candidate  # noqa: E402
from lens.workload import fit_to  # noqa: E402
from runners import get_runner  # noqa: E402
from search.encoding import all_candidates  # noqa: E402
from search.evaluate import Evaluator  # noqa: E402
from search.profiler import measure_unit  # noqa: E402
from search.study import DEFAULT_SAMPLER, STORE_FILE, SearchStudy, TrialStore  # noqa: E402
from spaces import load_space  # noqa: E402


def med(xs):
    return statistics.median(xs), min(xs), max(xs)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--space", default=str(ROOT / "spaces" / "sim-inf2.toml"))
    ap.add_argument("--workload", default="sharegpt")
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    sp = load_space(args.space)
    runner = get_runner(sp.target)
    req2k, _ = fit_to(sample(args.workload, 2000, 0), sp.search.buckets[-1])
    req10k, _ = fit_to(sample(args.workload, 10_000, 1), sp.search.buckets[-1])
    tmp = Path(tempfile.mkdtemp())
    ev = Evaluator(sp, req2k)
    for tp in sp.search.tp:
        for b in sp.search.batch:
            try:
                m = measure_unit(sp.target, tp=tp, batch=b, buckets=sp.search.buckets, all_buckets=sp.search.buckets,
                                 profile=sp.profile, runner=runner)
            except Exception as exc:  # e.g. a unit that does not fit the device: infeasible in the search too
                ev.set_failed((tp, b), str(exc))
                continue
            ev.set_measured((tp, b), m.profiles)
    sim = " (profiles from a SIMULATED device)" if runner.simulated else ""
    print(f"space {args.space}{sim}: {len(ev.measured)} units profiled, "
          f"{sum(1 for _ in all_candidates(sp.search))} candidates; workload {args.workload}: "
          f"{len(req2k)} requests in the loop, {len(req10k)} in the single prediction")

    loop_rates, fresh_rates = [], []
    for r in range(args.repeats):
        run_dir = tmp / f"run{r}"
        run_dir.mkdir()
        study = SearchStudy(sp, TrialStore(run_dir / STORE_FILE, study_name=f"run{r}", space=sp),
                            sampler=DEFAULT_SAMPLER, study_name=f"run{r}", seed=r)
        ev.forget()
        t0 = time.perf_counter()
        for _ in range(args.trials):
            study.trial(ev)
        loop_rates.append(args.trials / (time.perf_counter() - t0))
        # every candidate predicted afresh (no memo): the cost of one LENS prediction per trial
        cands = list(all_candidates(sp.search))
        rng = np.random.default_rng(r)
        pick = [cands[i] for i in rng.choice(len(cands), size=min(300, len(cands)), replace=False)]
        t0 = time.perf_counter()
        for c in pick:
            ev.forget()
            ev.evaluate(c)
        fresh_rates.append(len(pick) / (time.perf_counter() - t0))

    unit = max(ev.measured, key=lambda u: u[1])
    c = Candidate(unit[0], unit[1], sp.search.buckets, sp.search.buckets)
    pred_ms = []
    for _ in range(max(20, args.repeats * 4)):
        t0 = time.perf_counter()
        tbl = UnitTable.build(c, ev.measured[unit], policy=sp.target.bucket_policy, prefill=sp.target.prefill)
        p = predict(tbl, req10k, mode=sp.target.batching)
        summarize_prediction(req10k, p, chips=c.tp)
        pred_ms.append((time.perf_counter() - t0) * 1e3)

    m, lo, hi = med(loop_rates)
    print(f"search loop: {m:.0f} trials/s (median of {args.repeats} runs of {args.trials} trials; "
          f"spread {lo:.0f}..{hi:.0f}); goal >= 500/s")
    m, lo, hi = med(fresh_rates)
    print(f"distinct-candidate predictions of the {len(req2k)}-request workload: {m:.0f}/s (spread {lo:.0f}..{hi:.0f})")
    m, lo, hi = med(pred_ms)
    print(f"one {len(req10k)}-request workload ({c.label()}): {m:.2f} ms to predict "
          f"(median of {len(pred_ms)}; spread {lo:.2f}..{hi:.2f} ms); goal <= 20 ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
