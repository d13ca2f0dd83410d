"""Which estimator turns a probe's repeats into its time: chosen on measured data.

Two views, each on the sources below.

**A. The whole measurement** (``search.measure.measure_unit`` with each estimator: bootstrap
judgement, re-measurement, longer runs, the staircase check), then the LENS prediction of
a held-out workload against that workload *run* on the same device (the mean of 3 runs,
so that one run's own stragglers do not hide the profile's error): per-request E2E error
(mean, p90) and the error of the total time (throughput), over units and seeds. This is
how lensopt uses the estimator, so it decides. ``before``: the profiling of
``benchmarks/profiling_before.py`` (medians, L2 <= 128, raw-spread retries) on the same
devices and seeds.

**B. Resampled pools**: every probe of a unit is run ``--pool`` times (sim 100, toy 60,
jax 20; repeats interleaved across the probes), giving a pool of times per probe. The *truth* of a unit is what the
pool means give: the expected time of each probe, slow calls included, hence the
expected TTFT_b and TBT_b. Then, many times over, ``R`` repeats of each probe are drawn
from its pool (without replacement), each estimator of ``lens.noise.ESTIMATORS`` turns
them into TTFT_b and TBT_b, and its error against the truth is recorded:

- ``TTFT``/``TBT`` columns: |relative error| of the derived values, mean and p90 over
  buckets and draws (how much the noise of T1 and T2 reaches the values);
- ``E2E``: mean |relative error| of the per-request E2E predicted for a held-out workload
  from those values, against the prediction from the truth;
- for the jax runner, ``E2E meas``: against the per-request E2E *measured* (median of 3
  runs) for held-out requests under the same load (what ``lensopt measure`` reports).

Sources (all under the conditions of the question, none quiet):

- ``sim``: the simulated fleet (``runners/sim``, SIMULATED) with 1 graph call in 50
  taking 4x (``straggler_rate = 0.02``, ``straggler_factor = 4``; drift off, every other
  effect as shipped): trn1 (exclusive) and tpu-v6e (inclusive), a Llama-3.1-8B shape at
  tp 4, batch 16 and 32, buckets 128 ... 4096, L2 capped at 128 as profiled today;
- ``toy``: the command example ``toy_npu.py --mode straggler`` (SIMULATED; 1 call in 50
  takes 4x), a Llama-3.2-1B shape, tp 1, batch 1 and 4, buckets 128 ... 1024;
- ``jax``: real XLA execution on this CPU while one busy process (started and stopped
  here) competes for a core: 3 layers, hidden 192, inclusive buckets 48/112/240/400,
  batch 1 and 4.

View A runs on the sim and toy sources (trn1 and inf2, seeds 0..``--seeds``-1, batch 16 and
32; toy batch 1 and 4), view B on all three.

    .venv/bin/python benchmarks/estimators.py [--quick] [--sources sim,toy,jax] [--seeds N] [--out DIR]
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

from benchmarks.busy import competing_load  # noqa: E402
from benchmarks.profiling_before import measure_before  # noqa: E402
from lens import distributions  # noqa: E402
from lens.compose import UnitTable, predict  # noqa: E402
from lens.noise import ESTIMATOR, ESTIMATORS  # noqa: E402
from lens.probes import derive, pair_runs, plan_probes  # noqa: E402
from lens.types import BucketProfile, Candidate, ModelShape, Requests, Target, Unit  # noqa: E402
from lens.workload import fit_to, scale_lengths  # noqa: E402
from runners import get_runner  # noqa: E402
from search.measure import measure_unit  # noqa: E402
from spaces import ProfileSettings  # noqa: E402

LLAMA8B = ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=128256)
LLAMA1B = ModelShape(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=128256)
TINY = ModelShape(layers=3, hidden=192, heads=6, kv_heads=2, intermediate=512, vocab=2048)
TOY = ROOT / "examples" / "command_runner" / "toy_npu.py"


def sources(quick: bool) -> list[dict]:
    sim_b = (128, 256, 512, 1024, 2048, 4096)
    out = []
    for dev, pol in (("trn1", "exclusive"), ("tpu-v6e", "inclusive")):
        t = Target(name=f"sim-{dev}", runner="sim", hardware=dev, bucket_policy=pol, dtype="bfloat16", model=LLAMA8B,
                   options=(("drift", False), ("straggler_factor", 4.0), ("straggler_rate", 0.02)), seed=3)
        for batch in ((32,) if quick else (16, 32)):
            out.append(dict(source="sim", label=f"sim {dev} b{batch} (SIMULATED)", target=t, tp=4, batch=batch,
                            buckets=sim_b, max_output=128, workload=("sharegpt", 1.0)))
    toy = Target(name="toy", runner="command", hardware="toy-npu", bucket_policy="exclusive", dtype="bfloat16",
                 model=LLAMA1B, options=(("argv", [sys.executable, str(TOY), "--mode", "straggler"]),), seed=3)
    for batch in ((4,) if quick else (1, 4)):
        out.append(dict(source="toy", label=f"toy straggler b{batch} (SIMULATED)", target=toy, tp=1, batch=batch,
                        buckets=(128, 256, 512, 1024), max_output=128, workload=("sharegpt", 0.25)))
    jt = Target(name="jax", runner="jax", hardware="cpu", bucket_policy="inclusive", dtype="float32", model=TINY)
    for batch in ((1,) if quick else (1, 4)):
        out.append(dict(source="jax", label=f"jax b{batch} under load", target=jt, tp=1, batch=batch,
                        buckets=(48, 112, 240, 400), max_output=128, workload=("sharegpt", 0.1)))
    return out


def profiles_of(buckets, ttft, tbt) -> dict[int, BucketProfile]:
    return {b: BucketProfile(bucket=b, ttft_s=float(a), tbt_s=float(c), input_len=1, l1=1, l2=2, t1_s=0.0, t2_s=0.0,
                             repeats=1, spread=0.0) for b, a, c in zip(buckets, ttft, tbt)}


def held_out(buckets, n, seed) -> Requests:
    """``n`` requests of random lengths spread over every bucket."""
    rng = np.random.default_rng(seed)
    top = buckets[-1]
    lin = rng.integers(1, top // 2, n)
    lout = np.array([rng.integers(1, top - a + 1) for a in lin])
    return Requests(lin, lout)


def collect(src: dict, pool: int, log) -> dict:
    t, buckets, batch = src["target"], src["buckets"], src["batch"]
    runner = get_runner(t)
    probes = plan_probes(buckets, policy=t.bucket_policy, max_output=src["max_output"], repeats=pool)
    t0 = time.perf_counter()
    res = runner.profile(Unit(t, src["tp"], batch), probes)
    pairs = pair_runs(res.runs)
    name, scale = src["workload"]
    req, _ = fit_to(scale_lengths(distributions.sample(name, 1200, seed=1), scale), buckets[-1])
    out = {"pairs": pairs, "requests": req.head(128), "measured": None}
    if src["source"] == "jax":  # held-out requests measured as `lensopt measure` does: median of 3 runs
        hold = held_out(buckets, 24 * batch, seed=5)
        cand = Candidate(src["tp"], batch, buckets, buckets)
        runner.run_workload(cand, hold.head(batch))
        runs = [runner.run_workload(cand, hold) for _ in range(3)]
        out["measured"] = (hold, np.median(np.stack([r.e2e_s for r in runs]), axis=0))
    log(f"  {src['label']}: {len(probes)} probes x {pool} repeats in {time.perf_counter() - t0:.0f} s wall")
    return out


def evaluate(src: dict, data: dict, repeats: tuple[int, ...], draws: int) -> list[dict]:
    pairs, batch, buckets = data["pairs"], src["batch"], src["buckets"]
    pol = src["target"].bucket_policy
    flat = [r for b in buckets for r in pairs[b]]
    pools = [np.asarray(r.times_s) for r in flat]
    classes = [r.probe.output_len for r in flat]
    ls = [(pairs[b][0].probe.output_len, pairs[b][1].probe.output_len) for b in buckets]
    cand = Candidate(src["tp"], batch, buckets, buckets)

    def values(times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # times (draws, probes)
        tt = np.stack([derive(times[:, 2 * i], times[:, 2 * i + 1], l1=l1, l2=l2, calls=batch)[0]
                       for i, (l1, l2) in enumerate(ls)], axis=1)
        tb = np.stack([derive(times[:, 2 * i], times[:, 2 * i + 1], l1=l1, l2=l2, calls=batch)[1]
                       for i, (l1, l2) in enumerate(ls)], axis=1)
        return tt, tb

    truth_tt, truth_tb = values(np.array([[p.mean() for p in pools]]))
    req = data["requests"]
    e2e_true = predict(UnitTable.build(cand, profiles_of(buckets, truth_tt[0], truth_tb[0]), policy=pol), req).e2e_s
    rng = np.random.default_rng(11)
    rows = []
    for r in repeats:
        picks = [np.argsort(rng.random((draws, len(p))), axis=1)[:, :r] for p in pools]
        sub = [p[i] for p, i in zip(pools, picks)]
        for name, est in ESTIMATORS.items():
            tt, tb = values(est(sub, classes)[0])
            e_tt = np.abs(tt / truth_tt - 1).ravel() * 100
            e_tb = np.abs(tb / truth_tb - 1).ravel() * 100
            e2e, meas = [], []
            for d in range(draws):
                if (tb[d] <= 0).any() or (tt[d] <= 0).any():
                    e2e.append(np.nan)
                    meas.append(np.nan)
                    continue
                tbl = UnitTable.build(cand, profiles_of(buckets, tt[d], tb[d]), policy=pol)
                e2e.append(np.mean(np.abs(predict(tbl, req).e2e_s / e2e_true - 1)) * 100)
                if data["measured"] is not None:
                    hold, m = data["measured"]
                    meas.append(np.mean(np.abs(predict(tbl, hold).e2e_s / m - 1)) * 100)
            rows.append({"source": src["source"], "unit": src["label"], "R": r, "estimator": name,
                         "TTFT mean %": e_tt.mean(), "TTFT p90 %": np.percentile(e_tt, 90),
                         "TBT mean %": e_tb.mean(), "TBT p90 %": np.percentile(e_tb, 90),
                         "unsolvable %": float(np.mean(np.isnan(e2e)) * 100),
                         "E2E mean %": np.nanmean(e2e), "E2E p90 %": np.nanpercentile(e2e, 90),
                         "E2E meas %": np.nanmedian(meas) if meas else np.nan})
    return rows


def procedure_cases(quick: bool, seeds: int, want: set[str]) -> list[dict]:
    """Units of view A: (label, target, tp, batch, buckets, workload)."""
    out = []
    sim_b = (128, 256, 512, 1024, 2048, 4096)
    if "sim" in want:
        for dev in (("trn1",) if quick else ("trn1", "inf2")):
            for seed in range(seeds):
                t = Target(name=f"sim-{dev}", runner="sim", hardware=dev, bucket_policy="exclusive", dtype="bfloat16",
                           model=LLAMA8B, seed=seed,
                           options=(("drift", False), ("straggler_factor", 4.0), ("straggler_rate", 0.02)))
                for batch in (16, 32):
                    out.append(dict(source="sim", label=f"sim {dev}", seed=seed, target=t, tp=4, batch=batch,
                                    buckets=sim_b, workload=("sharegpt", 1.0)))
    if "toy" in want:
        for seed in range(seeds):
            t = Target(name="toy", runner="command", hardware="toy-npu", bucket_policy="exclusive", dtype="bfloat16",
                       model=LLAMA1B, options=(("argv", [sys.executable, str(TOY), "--mode", "straggler"]),), seed=seed)
            for batch in (1, 4):
                out.append(dict(source="toy", label="toy straggler", seed=seed, target=t, tp=1, batch=batch,
                                buckets=(128, 256, 512, 1024), workload=("sharegpt", 0.25)))
    return out


def procedure(cases: list[dict], estimators: list[str], log) -> pd.DataFrame:
    rows = []
    for case in cases:
        t, b = case["target"], case["buckets"]
        cand = Candidate(case["tp"], case["batch"], b, b)
        name, scale = case["workload"]
        req = fit_to(scale_lengths(distributions.sample(name, 1200, seed=1 + case["seed"]), scale), b[-1])[0].head(256)
        runner = get_runner(t)
        measured = [runner.run_workload(cand, req) for _ in range(3)]
        e2e = np.mean([w.e2e_s for w in measured], axis=0)
        total = float(np.mean([w.total_s for w in measured]))
        for est in ["before", *estimators]:
            if est == "before":
                m = measure_before(t, tp=case["tp"], batch=case["batch"], buckets=b, runner=runner)
            else:
                m = measure_unit(t, tp=case["tp"], batch=case["batch"], buckets=b, all_buckets=b,
                                 profile=ProfileSettings(), runner=runner, estimator=est)
            pred = predict(UnitTable.build(cand, m.profiles, policy=t.bucket_policy), req)
            err = np.abs(pred.e2e_s / e2e - 1) * 100
            rows.append({"source": case["source"], "unit": f"{case['label']} b{case['batch']}", "seed": case["seed"],
                         "estimator": est, "E2E mean %": err.mean(), "E2E p90 %": np.percentile(err, 90),
                         "throughput err %": (total / pred.total_s - 1) * 100, "profile run s": m.run_s})
        log(f"  {case['label']} seed {case['seed']} b{case['batch']}: done")
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one unit per source, smaller pools")
    ap.add_argument("--sources", default="sim,toy,jax")
    ap.add_argument("--pool", type=int, help="repeats per probe in the pool (default: sim 100, toy 60, jax 20; "
                                             "--quick: 40, 30, 12)")
    ap.add_argument("--draws", type=int, default=150)
    ap.add_argument("--seeds", type=int, help="seeds per device in view A (default 8, --quick 2)")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench"))
    args = ap.parse_args(argv)
    want = set(args.sources.split(","))
    log = lambda m: print(m, flush=True)  # noqa: E731
    t0 = time.perf_counter()
    pd.set_option("display.width", 250)
    fmt = lambda x: f"{x:.2f}"  # noqa: E731
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = procedure_cases(args.quick, args.seeds or (2 if args.quick else 8), want)
    if cases:
        log("A. the whole measurement with each estimator, against the workload run on the device (SIMULATED)")
        proc = procedure(cases, list(ESTIMATORS), log)
        proc.to_csv(out / "estimators_procedure.csv", index=False)
        agg = proc.groupby(["source", "estimator"], sort=False).agg(
            cases=("seed", "size"), e2e_mean=("E2E mean %", "mean"), e2e_p90=("E2E p90 %", "mean"),
            thr_abs_mean=("throughput err %", lambda x: np.abs(x).mean()),
            thr_abs_max=("throughput err %", lambda x: np.abs(x).max()),
            thr_signed=("throughput err %", "mean"), run_s=("profile run s", "sum")).reset_index()
        agg.columns = ["source", "estimator", "cases", "E2E mean %", "E2E p90 %", "|thr err| mean %",
                       "|thr err| max %", "thr err signed %", "profiling run s"]
        print(agg.to_string(index=False, float_format=fmt))
        print("(throughput error > 0: the device was faster than predicted)\n")
    rows = []
    for src in sources(args.quick):
        if src["source"] not in want:
            continue
        pool = args.pool or {"jax": 12 if args.quick else 20, "toy": 30 if args.quick else 60}.get(
            src["source"], 40 if args.quick else 100)
        if src["source"] == "jax":
            with competing_load(1) as pids:
                log(f"  competing load: busy process {pids[0]} started")
                data = collect(src, pool, log)
            log("  competing load stopped")
        else:
            data = collect(src, pool, log)
        rows += evaluate(src, data, (3, 5), args.draws)
    df = pd.DataFrame(rows)
    df.to_csv(out / "estimators.csv", index=False)
    print("\nB. resampled pools, per unit (sim and toy numbers are SIMULATED):")
    print(df.to_string(index=False, float_format=fmt))
    print("\nMean over the units of each source:")
    agg = df.groupby(["source", "R", "estimator"], sort=False).mean(numeric_only=True).reset_index()
    print(agg.to_string(index=False, float_format=fmt))
    print(f"\nlensopt uses: {ESTIMATOR}. {time.perf_counter() - t0:.0f} s wall; rows in {out / 'estimators.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
