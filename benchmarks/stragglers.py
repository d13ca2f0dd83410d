"""Profiles on a device with host stragglers: lensopt's profiling before and now, same device, same seeds.

Everything here is SIMULATED (``runners/sim``): a Llama-3.1-8B shape at tp 4 on the
simulated trn1 and inf2 (NxD Inference stacks), exactly as a space file would give them,
with one option changed -- ``straggler_rate = 0.02`` (about 1 graph call in 50 takes
``straggler_factor = 4`` times its time; the shipped device has 1 in 250). Every other
effect is as shipped, host drift included (its clock: the simulated seconds the device
spends). Buckets 128 ... 4096, batch 16 and 32, a ShareGPT sample fitted to 4096 tokens.

For each (device, seed, batch): the unit is profiled by the method from before
(``benchmarks/profiling_before.py``: medians of 3, L2 <= 128, raw-spread retries) and by
lensopt's ``measure_unit``, each on a device of its own with the same seed (so each starts
at the same point of the drift); then the workload runs once on that device, as a
confirmation runs it: with rounds of the probes of the buckets it uses before and after it
(``search.drift_check.checked``, ``budget.drift_check = "side-by-side"``; a bucket whose
runs are not tight is run again after it). ``corrected`` is the prediction of lensopt's
profiling from those probes, the one a confirmation is judged on. Errors: per-request E2E
|predicted - measured| / measured (mean, p90 over the requests) and the throughput (total
time) error, predicted vs measured.

``floor``: the same device and seed with no noise, no stragglers and no drift, profiled by
lensopt and run the same way: the error left is the LENS model's own on this simulated
stack (real-context attention, KV copies, a host cost per live row measured by
``lens.rows`` and composed, but linear in the rows as this stack's is), the part of each
row that no handling of noise can remove. ``hardware s now`` includes the row-cost
workload of every unit.

``--estimator NAME`` profiles ``now`` with another of ``lens.noise.ESTIMATORS`` than the
one lensopt uses (the side-by-side probes keep lensopt's): the comparison on this
benchmark behind the choice in docs/noise.md.

    .venv/bin/python benchmarks/stragglers.py [--quick] [--seeds 8] [--csv out.csv] [--estimator median]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.profiling_before import measure_before  # noqa: E402
from lens import distributions  # noqa: E402
from lens.compose import UnitTable, predict  # noqa: E402
from lens.noise import ESTIMATOR, ESTIMATORS  # noqa: E402
from lens.types import Candidate, ModelShape, Target, Unit  # noqa: E402
from lens.workload import fit_to  # noqa: E402
from runners import get_runner  # noqa: E402
from search.measure import measure_unit  # noqa: E402
from search.drift_check import DriftCheck, checked  # noqa: E402
from spaces import Budget, ProfileSettings  # noqa: E402

MODEL = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=128256)
BUCKETS = (128, 256, 512, 1024, 2048, 4096)
TP = 4


#: the device of the question: 1 graph call in 50 takes 4x
NOISY = (("noise", 0.01), ("quirk_seed", 0), ("straggler_factor", 4.0), ("straggler_rate", 0.02))
#: the same device without noise, stragglers or drift: the model's own error
CLEAN = (("drift", False), ("noise", 0.0), ("quirk_seed", 0), ("stragglers", False))


def target(device: str, seed: int, options=NOISY) -> Target:
    return Target(name=f"sim-{device}-llama3.1-8b", runner="sim", hardware=device, bucket_policy="exclusive",
                  dtype="bfloat16", model=MODEL, seed=seed, options=options)


def errors(pred, run) -> dict:
    """Per-request E2E error (mean, p90) and the throughput error: (predicted - measured) / measured."""
    err = np.abs(pred.e2e_s / run.e2e_s - 1) * 100
    return {"mean": err.mean(), "p90": np.percentile(err, 90), "thr": (run.total_s / pred.total_s - 1) * 100}


def case(device: str, seed: int, batch: int, requests: int, estimator: str = ESTIMATOR) -> dict:
    req = fit_to(distributions.sample("sharegpt", 4 * requests, seed=1 + seed), BUCKETS[-1])[0].head(requests)
    cand = Candidate(TP, batch, BUCKETS, BUCKETS)
    row = {"device": device, "seed": seed, "batch": batch, "requests": len(req)}
    clean = get_runner(target(device, seed, CLEAN))
    m = measure_unit(clean.target, tp=TP, batch=batch, buckets=BUCKETS, all_buckets=BUCKETS, profile=ProfileSettings(),
                     runner=clean)
    e = errors(predict(UnitTable.build(cand, m.profiles, policy="exclusive"), req), clean.run_workload(cand, req))
    row.update({"floor mean %": e["mean"], "floor thr err %": e["thr"]})
    for method in ("before", "now"):
        runner = get_runner(target(device, seed))  # a device of its own: the same drift phase for both methods
        if method == "before":
            m = measure_before(runner.target, tp=TP, batch=batch, buckets=BUCKETS, runner=runner)
        else:
            m = measure_unit(runner.target, tp=TP, batch=batch, buckets=BUCKETS, all_buckets=BUCKETS,
                             profile=ProfileSettings(), runner=runner, estimator=estimator)
        pred = predict(UnitTable.build(cand, m.profiles, policy="exclusive"), req)
        # as a confirmation runs it: the probes of the buckets it uses side by side with the run
        check = DriftCheck.build(runner.target, cand, req, m.profiles, budget=Budget(), profile=ProfileSettings(),
                                 all_buckets=BUCKETS)
        (run,), out = checked(runner, Unit(runner.target, TP, batch), check, [lambda: runner.run_workload(cand, req)])
        e = errors(pred, run)
        row.update({f"{method} mean %": e["mean"], f"{method} p90 %": e["p90"], f"{method} thr err %": e["thr"],
                    f"{method} hardware s": m.compile_s + m.run_s, f"{method} run s": m.run_s})
        if method == "now":
            fixed = errors(predict(UnitTable.build(cand, {**m.profiles, **out.profiles}, policy="exclusive"), req)
                           if out.profiles else pred_scaled(pred, out.drift.value), run)
            row.update({"host_drift": out.drift.value, "now corrected mean %": fixed["mean"],
                        "now corrected p90 %": fixed["p90"], "now corrected thr err %": fixed["thr"],
                        "now excess %": 100 * float(np.mean([p.excess for p in m.profiles.values()])),
                        "check hardware s": out.hardware_s, "buckets run again": len(out.run_again)})
    return row


def pred_scaled(pred, drift: float):
    """The prediction on a host ``drift`` times as slow."""
    import dataclasses

    return dataclasses.replace(pred, e2e_s=pred.e2e_s * drift, ttft_s=pred.ttft_s * drift,
                               batch_s=pred.batch_s * drift)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="trn1 only, 3 seeds")
    ap.add_argument("--seeds", type=int, help="seeds per device (default 8; --quick 3)")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--csv")
    ap.add_argument("--estimator", default=ESTIMATOR, choices=sorted(ESTIMATORS),
                    help=f"estimator of the 'now' profiles (default: lensopt's, {ESTIMATOR})")
    args = ap.parse_args(argv)
    seeds = args.seeds or (3 if args.quick else 8)
    devices = ("trn1",) if args.quick else ("trn1", "inf2")
    t0 = time.perf_counter()
    rows = []
    for device in devices:
        for seed in range(seeds):
            for batch in (16, 32):
                rows.append(case(device, seed, batch, args.requests, args.estimator))
    df = pd.DataFrame(rows)
    pd.set_option("display.width", 250)
    f2 = lambda x: f"{x:.2f}"  # noqa: E731
    print(__doc__.split("\n\n")[0] + f"  (SIMULATED; 'now' with estimator {args.estimator})\n")
    cols = ["device", "seed", "batch", "before mean %", "before p90 %", "before thr err %", "now mean %", "now p90 %",
            "now thr err %", "host_drift", "now corrected mean %", "now corrected thr err %", "now excess %",
            "floor mean %", "floor thr err %"]
    print(df[cols].to_string(index=False, float_format=f2))
    summary = []
    for (dev, b), g in list(df.groupby(["device", "batch"])) + [(("all", "all"), df)]:
        summary.append({
            "device": dev, "batch": b, "cases": len(g),
            "before: mean %": g["before mean %"].mean(), "p90 %": g["before p90 %"].mean(),
            "|thr| mean %": g["before thr err %"].abs().mean(), "|thr| max %": g["before thr err %"].abs().max(),
            "now: mean %": g["now mean %"].mean(), "p90 % ": g["now p90 %"].mean(),
            "|thr| mean % ": g["now thr err %"].abs().mean(), "|thr| max % ": g["now thr err %"].abs().max(),
            "corrected: mean %": g["now corrected mean %"].mean(), "p90 %  ": g["now corrected p90 %"].mean(),
            "|thr| mean %  ": g["now corrected thr err %"].abs().mean(),
            "|thr| max %  ": g["now corrected thr err %"].abs().max(),
            "floor: mean %": g["floor mean %"].mean(), "thr %": g["floor thr err %"].mean(),
            "hardware s before": g["before hardware s"].sum(), "hardware s now": g["now hardware s"].sum(),
            "check s": g["check hardware s"].sum(), "run again": g["buckets run again"].sum(),
        })
    print("\nSummary (means over the cases; throughput error = (predicted - measured) / measured throughput):")
    print(pd.DataFrame(summary).to_string(index=False, float_format=f2))
    print(f"\nSIMULATED device; every figure above is simulated. {time.perf_counter() - t0:.0f} s wall.")
    if args.csv:
        df.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
