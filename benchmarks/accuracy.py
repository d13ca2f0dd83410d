"""LENS on real XLA execution (the jax runner, this machine's CPU), quiet and under a competing load.

For each model shape, bucket policy and batch size below, a unit is profiled twice -- with
lensopt's profiling (``search.measure.measure_unit``: derived-value judgement, longer runs,
the expected cost of slow calls) and with the profiling from before it
(``benchmarks/profiling_before.py``: medians of 3, L2 <= 128, raw-spread retries) -- then
held-out requests of random lengths over every bucket (never a probe) are run as
``lensopt measure`` runs them (``search.drift_check.checked``: ``--repeats`` passes over the
requests, the median of each request's runs measured, with rounds of the probes of every
bucket the requests use before, between and after the passes). The error of a request is
|predicted E2E - measured E2E| / measured E2E, for four predictions:

- ``before`` / ``now``: from the cached profile of each profiling, as is;
- ``rescaled``: ``now`` times ``host_drift`` (the reference probe's time in the rounds over
  its time in the profile) where the drift counts (beyond the tolerance and twice its
  noise), as ``budget.drift_check = "reference"`` corrects it;
- ``side``: from the probes run side by side with the passes (``budget.drift_check =
  "side-by-side"``, the default): the model on the host as it was during the runs, the
  drift-corrected prediction lensopt judges on.

Beside them, the measurement's own noise: ``median se``, the standard error of each
request's median over the passes (bootstrapped; a prediction cannot be judged closer than
that), and ``host jitter``, the run-to-run spread of a fixed computation
(``busy.host_jitter``). ``side beyond noise`` is the rms error of the side-by-side
prediction that the measurement's noise does not explain (sqrt(mean e^2 - mean se^2), at
least 0): an estimate of the model's own error on this host.

All of it is done twice: **quiet** (nothing started by this script; other processes of the
host run as they do) and **loaded** (one busy process, started here before the unit's
profiling and stopped after its held-out runs, competes for a core the whole time).

Targets (3 layers / hidden 192 is the shape of the question that motivated this; none of
them is a shape the repository's space files use):

    A  3 layers, hidden 192, 6 heads (2 KV), inclusive buckets 48/112/240/400
    B  4 layers, hidden 256, 4 heads (2 KV), exclusive buckets 64/128/256/512
    C  4 layers, hidden 512, 8 heads (4 KV), inclusive buckets 64/160/320/512

each at batch 1 and 4, tp 1 (float32). The profiling cost is in hardware seconds: the
timed runs of each method (the graphs compile once per unit and serve both; that compile
time is shown apart), and the side-by-side probes' runs (``check s``).

    .venv/bin/python benchmarks/accuracy.py [--quick] [--targets A,B,C] [--batches 1,4]
                                            [--held-out 6] [--repeats 20] [--csv out.csv]

20 passes, because on a shared host a request's median over 5 passes is itself uncertain
by about 6% (docs/noise.md): a 3% error cannot be seen through that. ``--quick``: targets
A and B, 4 held-out batches, 5 passes (a smoke test of the figures, not a verdict).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.busy import host_jitter, load_of  # noqa: E402
from benchmarks.profiling_before import measure_before  # noqa: E402
from lens.compose import UnitTable, predict  # noqa: E402
from lens.noise import median_se  # noqa: E402
from lens.probes import plan_probes  # noqa: E402
from lens.types import Candidate, ModelShape, Requests, Target, Unit  # noqa: E402
from runners import get_runner  # noqa: E402
from search.drift_check import DriftCheck, checked  # noqa: E402
from search.measure import measure_unit  # noqa: E402
from spaces import Budget, ProfileSettings  # noqa: E402


@dataclass(frozen=True)
class Case:
    name: str
    model: ModelShape
    policy: str
    buckets: tuple[int, ...]


CASES = {
    "A": Case("A", ModelShape(layers=3, hidden=192, heads=6, kv_heads=2, intermediate=512, vocab=2048), "inclusive",
              (48, 112, 240, 400)),
    "B": Case("B", ModelShape(layers=4, hidden=256, heads=4, kv_heads=2, intermediate=688, vocab=4096), "exclusive",
              (64, 128, 256, 512)),
    "C": Case("C", ModelShape(layers=4, hidden=512, heads=8, kv_heads=4, intermediate=1376, vocab=4096), "inclusive",
              (64, 160, 320, 512)),
}


def target_of(case: Case) -> Target:
    return Target(name=f"bench-{case.name}", runner="jax", hardware="cpu", bucket_policy=case.policy,
                  dtype="float32", model=case.model)


def held_out(case: Case, n: int, seed: int, batch: int) -> Requests:
    """``n`` requests whose prompts and last contexts spread over every bucket, none a probe."""
    rng = np.random.default_rng(seed)
    probes = {(p.input_len, p.output_len) for p in plan_probes(case.buckets, policy=case.policy, max_output=10_000,
                                                               repeats=1)}
    top = case.buckets[-1]
    out: list[tuple[int, int]] = []
    while len(out) < n:
        lin = int(rng.integers(1, top))
        lout = int(rng.integers(1, top - lin + 2))
        if (lin, lout) in probes or lin + lout - 1 > top:
            continue
        out.append((lin, lout))
    return Requests(np.array([a for a, _ in out]), np.array([b for _, b in out]))


def stats(err: np.ndarray) -> dict:
    a = np.abs(err) * 100
    return {"mean": a.mean(), "p90": np.percentile(a, 90), "max": a.max()}


def one_unit(runner, case: Case, batch: int, args, log) -> dict:
    target = runner.target
    cand = Candidate(1, batch, case.buckets, case.buckets)
    settings = ProfileSettings()
    budget = Budget()
    t0 = time.perf_counter()
    now = measure_unit(target, tp=1, batch=batch, buckets=case.buckets, all_buckets=case.buckets, profile=settings,
                       runner=runner)
    t_now = time.perf_counter() - t0
    t0 = time.perf_counter()
    before = measure_before(target, tp=1, batch=batch, buckets=case.buckets, runner=runner)
    t_before = time.perf_counter() - t0
    req = held_out(case, args.held_out * batch, seed=100 + batch, batch=batch)
    unit = Unit(target, 1, batch)
    check = DriftCheck.build(target, cand, req, now.profiles, budget=budget, profile=settings,
                             all_buckets=case.buckets)
    runner.run_workload(cand, req.head(batch))  # warm the candidate's graphs
    runs, dr = checked(runner, unit, check, [lambda: runner.run_workload(cand, req)] * args.repeats)
    d = dr.drift
    applied = d.value if d.significant(budget.drift_tolerance) else 1.0  # as drift_check = "reference" re-scales
    e2e_all = np.stack([r.e2e_s for r in runs])
    e2e = np.median(e2e_all, axis=0)
    pol = case.policy
    pred = {name: predict(UnitTable.build(cand, prof, policy=pol), req).e2e_s
            for name, prof in (("before", before.profiles), ("now", now.profiles),
                               ("side", {**now.profiles, **dr.profiles} if dr.profiles else {}))
            if prof}
    pred["rescaled"] = pred["now"] * applied
    noise = np.median(np.abs(e2e_all - e2e) / e2e)  # how far one run sits from the median
    se = median_se(e2e_all)
    row = {"target": case.name, "policy": pol, "batch": batch, "requests": len(req), "host_drift": d.value,
           "drift +-": d.err, "rescaled": applied != 1.0, "median se %": float(np.mean(se) * 100),
           "run noise %": noise * 100, "host jitter %": host_jitter(), "now run s": now.run_s,
           "before run s": before.run_s, "check s": dr.hardware_s, "now wall s": t_now, "before wall s": t_before,
           "compile s": now.compile_s + before.compile_s, "now attempts": now.attempts,
           "now not accepted": sum(not p.accepted for p in now.profiles.values()),
           "side note": dr.note}
    for name in ("before", "now", "rescaled", "side"):
        if name in pred:
            err = (pred[name] - e2e) / e2e
            s = stats(err)
            row.update({f"{name} mean %": s["mean"], f"{name} p90 %": s["p90"], f"{name} max %": s["max"],
                        f"{name} bias %": float(np.mean(err) * 100),
                        # the rms error the measurement's own noise does not explain: E[e^2] = model^2 + se^2
                        f"{name} beyond noise %": float(np.sqrt(max(np.mean(err ** 2) - np.mean(se ** 2), 0.0)) * 100)})
    log(f"    {case.name} ({pol}) batch {batch}: {len(req)} held-out requests; E2E mean error before "
        f"{row['before mean %']:.1f}%, now {row['now mean %']:.1f}% as is, {row['rescaled mean %']:.1f}% re-scaled "
        f"(host_drift {d.value:.3f} +- {d.err:.3f}{'' if applied != 1.0 else ', not applied'}), "
        f"{row.get('side mean %', float('nan')):.1f}% side by side; median se {row['median se %']:.1f}%; "
        f"profiling runs {before.run_s:.1f} s before, {now.run_s:.1f} s now; check {dr.hardware_s:.1f} s"
        + (f" ({dr.note})" if dr.note else ""))
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="targets A and B, 4 held-out batches and 5 passes per unit")
    ap.add_argument("--targets", help="comma-separated, of A, B, C (default all; --quick: A,B)")
    ap.add_argument("--batches", default="1,4")
    ap.add_argument("--held-out", type=int, help="held-out batches per unit (default 6; --quick 4)")
    ap.add_argument("--repeats", type=int, help="passes over the held-out requests, each request's median measured "
                                                "(default 20; --quick 5)")
    ap.add_argument("--conditions", default="quiet,loaded")
    ap.add_argument("--csv", help="write the per-unit rows here")
    args = ap.parse_args(argv)
    args.held_out = args.held_out or (4 if args.quick else 6)
    args.repeats = args.repeats or (5 if args.quick else 20)
    names = (args.targets or ("A,B" if args.quick else "A,B,C")).split(",")
    batches = [int(b) for b in args.batches.split(",")]
    log = lambda m: print(m, flush=True)  # noqa: E731
    t_start = time.perf_counter()
    runners = {n: get_runner(target_of(CASES[n])) for n in names}  # one per target: graphs compile once
    rows = []
    print(__doc__.split("\n\n")[0])
    for cond in args.conditions.split(","):
        log(f"\n== {cond}: " + ("one busy process competes for a core while each unit is profiled and measured"
                               if cond == "loaded" else "no load started by this benchmark"))
        for n in names:
            for b in batches:
                with load_of(cond == "loaded") as pids:
                    if pids:
                        log(f"    (busy process {pids[0]} started)")
                    row = one_unit(runners[n], CASES[n], b, args, log)
                rows.append({"condition": cond, **row})
    df = pd.DataFrame(rows)
    pd.set_option("display.width", 250)
    f2 = lambda x: f"{x:.2f}"  # noqa: E731
    print("\nPer unit: per-request E2E error (|predicted - measured| / measured), held-out requests, mean / p90 %")
    for name in ("before", "now", "rescaled", "side"):
        df[name] = [f"{m:.1f} / {p:.1f}" for m, p in zip(df[f"{name} mean %"], df[f"{name} p90 %"])]
    cols = ["condition", "target", "policy", "batch", "requests", "before", "now", "rescaled", "side", "side bias %",
            "side beyond noise %", "host_drift", "drift +-", "median se %", "run noise %", "host jitter %"]
    print(df[cols].to_string(index=False, float_format=f2))
    print("\nPer condition (mean over units of the per-unit figures):")
    num = [f"{n} {k} %" for n in ("before", "now", "rescaled", "side") for k in ("mean", "p90")]
    agg = df.groupby("condition", sort=False)[num + ["side beyond noise %", "median se %", "run noise %",
                                                     "host jitter %"]].mean()
    print(agg.to_string(float_format=f2))
    print("\nProfiling cost, hardware seconds of timed runs (the compile is shared and shown apart):")
    cost = df.groupby("condition", sort=False)[["before run s", "now run s", "check s", "compile s"]].sum()
    cost["now / before"] = cost["now run s"] / cost["before run s"]
    print(cost.to_string(float_format=f2))
    print(f"\n'before': profiling as it was (medians of 3 repeats, L2 <= 128); 'now': lensopt's profiling now, as "
          f"is; 'rescaled': 'now' times host_drift where the drift is beyond {Budget().drift_tolerance:.0%} and "
          f"twice its noise; 'side': predicted from the probes run side by side with the passes (lensopt's "
          f"drift-corrected prediction); 'side beyond noise': its rms error less the measurement's noise. Median se: the standard error of each request's median over "
          f"{args.repeats} passes (the measurement's own noise); run noise: the median deviation of one pass from "
          f"that median. Host jitter: the run-to-run robust spread (1 sigma, % of the median) of a fixed 40 ms "
          f"computation, in the same condition. Real execution on "
          f"{runners[names[0]].versions().get('cpu', 'this CPU')}; {time.perf_counter() - t_start:.0f} s wall.")
    if args.csv:
        df.to_csv(args.csv, index=False)
        print(f"per-unit rows written to {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
