"""Accuracy: LENS vs a MaverIQ-style baseline vs a calibrated operator sum, per request E2E.

Ground truth is the ``sim`` runner (every sim number is SIMULATED): a compiled-shape
machine run step by step with the effects real stacks have -- attention that follows the
real context where the stack's kernels do, KV-cache copies when the decode bucket
changes (Neuron), host work per live row and per generate call, rare host stragglers,
slow host drift, run-to-run noise and per-bucket compiler quirks (``runners/sim``). It
shares no selection or composition code with LENS.

Grid (``benchmarks/accuracy_fleet.py``): simulated inf2, trn1 (NxD Inference, exclusive
buckets) and tpu-v5e, tpu-v6e (vLLM TPU, inclusive) x models shaped like Llama-3.2-1B,
Mistral-7B, Qwen3-14B (bfloat16, smallest tp in 1/2/4/8 that fits batch 32 at 8192
tokens) x the paper workloads (sharegpt, cnn_dailymail, arxiv, writing_prompts) and the
trace-derived ones x batch 1-32, buckets 128 ... 8192. A *case* = (variant, fleet,
device, model, batch, workload); its error = mean over its held-out requests of
|predicted E2E - measured E2E| / measured E2E.

- LENS: ``search.profiler.measure_unit`` once per unit (2 probes x 7 buckets, 3 repeats,
  max output 128), then ``lens.compose.predict`` (static batches). One profile serves
  every workload.
- MaverIQ-style: per unit and workload, ``--cal-batches`` static batches of calibration
  requests of that workload (another seed) run end to end; E2E = a + b (l_out - 1) fitted
  by least squares (``benchmarks/baselines.py``). "MaverIQ-pd" is the same line fitted per
  device, model and workload on the calibration runs of every batch size pooled: the LENS
  paper's reading ("one TTFT constant + one TBT slope fitted per dataset").
- OpSum: the operator-sum roofline from kernel shapes at the requests' real lengths, with
  one prefill and one decode efficiency per unit fitted by least squares on the same
  probe runs LENS gets (fair: it sees what LENS sees). ``OpSum-peak`` (public peak
  figures, no calibration) is kept in the CSV and the workload-level view only.

Ablation (LENS and OpSum only; paper workloads; fleet 0): each effect alone switched on
over a clean device (``only <effect>``), each alone switched off from the shipped device
(``without <effect>``), the clean device, a noise-free one (noise, stragglers and drift
off) and the shipped device running batched prefill with targets that say so
(``prefill = "batched"``: LENS solves and composes it; LENS-seq is LENS's sequential
machine model on the same probe runs, for comparison).

Plus a row for the ``jax`` runner (real XLA execution on this CPU, spaces/quickstart.toml).

    .venv/bin/python benchmarks/eval_accuracy.py [--quick] [--out DIR] [--no-jax] [--ablation KINDS]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.accuracy_fleet import (  # noqa: E402
    BATCHES, CAL_SEED, DATASETS, DEVICES, EVAL_SEED, METHODS, MODELS, TRACES, Grid, case_errors, run_variant, variants,
)
from benchmarks.baselines import fit_maveriq  # noqa: E402
from lens.compose import UnitTable, predict  # noqa: E402
from lens.types import Candidate  # noqa: E402
from runners import get_runner  # noqa: E402
from search.profiler import measure_unit  # noqa: E402

GOAL_LENS_MEAN, GOAL_RATIO = 2.5, 6.0
#: the methods of the printed tables: the headline ones and the paper's reading of MaverIQ-style
SHOWN = (*METHODS, "MaverIQ-pd")
#: the jax row's workload (spaces/quickstart.toml's model and buckets, its own requests)
JAX_DATASET, JAX_SCALE = "sharegpt", 0.25


# -- the jax row ----------------------------------------------------------------------------
def run_jax(args, log) -> tuple[pd.DataFrame, str | None]:
    """LENS and MaverIQ-style on the jax runner; returns (rows, reason it was skipped)."""
    try:
        from runners import runner_class
        from spaces import load_requests
        from spaces import load_space

        runner_class("jax")
        sp = load_space(ROOT / "spaces" / "quickstart.toml")
        # The row's own workload, not the demo's: ShareGPT's spread of output lengths is what
        # the row has always been measured on, so its figures stay comparable across runs.
        sp = dataclasses.replace(sp, workload=dataclasses.replace(
            sp.workload, distribution=JAX_DATASET, trace=None, length_scale=JAX_SCALE))
        runner = get_runner(sp.target)
    except Exception as exc:  # the jax runner is optional here: say why the row is absent
        return pd.DataFrame(), f"jax runner unavailable ({type(exc).__name__}: {exc})"
    buckets = sp.search.buckets
    policy = sp.target.bucket_policy
    rows = []
    try:
        req, _ = load_requests(sp, requests=args.jax_requests, seed=EVAL_SEED)
        for tp, batch in args.jax_units:
            t0 = time.perf_counter()
            mu = measure_unit(sp.target, tp=tp, batch=batch, buckets=buckets, all_buckets=buckets,
                              profile=sp.profile, runner=runner)
            cand = Candidate(tp, batch, buckets, buckets)
            lens_pred = predict(UnitTable.build(cand, mu.profiles, policy=policy, prefill=sp.target.prefill), req,
                                mode=sp.target.batching).e2e_s
            runner.run_workload(cand, req.head(batch))  # compile and warm the candidate's graphs
            meas = np.median([runner.run_workload(cand, req).e2e_s for _ in range(3)], axis=0)
            cal, _ = load_requests(sp, requests=args.cal_batches * batch, seed=CAL_SEED)
            cal_run = runner.run_workload(cand, cal)
            mav_pred = fit_maveriq(cal.output_len, cal_run.e2e_s).predict_e2e(req.output_len)
            base = {"runner": "jax", "simulated": False, "device": sp.target.hardware, "model": sp.target.name,
                    "tp": tp, "batch": batch, "dataset": f"{JAX_DATASET} x{JAX_SCALE}", "requests": len(req)}
            rows.append({**base, "method": "LENS", **case_errors(lens_pred, meas)})
            rows.append({**base, "method": "MaverIQ", **case_errors(mav_pred, meas)})
            log(f"  jax tp{tp} b{batch}: {len(req)} requests, {time.perf_counter() - t0:.1f} s wall")
    except Exception as exc:  # a broken backend must not hide the simulated results
        return pd.DataFrame(rows), f"jax runner failed ({type(exc).__name__}: {exc})"
    finally:
        runner.close()
    return pd.DataFrame(rows), None


# -- tables ---------------------------------------------------------------------------------
def summary(errs: pd.Series) -> dict:
    a = errs.to_numpy(float)
    return {"cases": a.size, "mean": a.mean(), "median": np.median(a), "p90": np.percentile(a, 90), "max": a.max(),
            "<5%": (a < 5).mean() * 100}


def group_table(df: pd.DataFrame, kinds: list[str], methods=METHODS) -> pd.DataFrame:
    """One row per group, a block of stats per method (columns 'LENS mean', ...)."""
    out = []
    groups = [("all", "all", df)] + [(k, v, g) for k in kinds for v, g in df.groupby(k, sort=False)]
    for kind, value, g in groups:
        row = {"group": kind, "value": value}
        for method in methods:
            e = g.loc[g["method"] == method, "mape_%"]
            if e.empty:
                continue
            s = summary(e)
            row["cases"] = s["cases"]
            for k in ("mean", "median", "p90", "max", "<5%"):
                row[f"{method} {k}"] = s[k]
        out.append(row)
    return pd.DataFrame(out)


def long_table(df: pd.DataFrame, kinds: list[str]) -> pd.DataFrame:
    out = []
    groups = [("all", "all", df)] + [(k, v, g) for k in kinds for v, g in df.groupby(k, sort=False)]
    for kind, value, g in groups:
        for method, gm in g.groupby("method", sort=False):
            s = summary(gm["mape_%"])
            out.append({"group": kind, "value": value, "method": method, "cases": s["cases"],
                        "mean_%": s["mean"], "median_%": s["median"], "p90_%": s["p90"], "max_%": s["max"],
                        "share_under_5%": s["<5%"], "bias_mean_%": gm["bias_%"].mean(),
                        "abs_mean_e2e_err_mean_%": gm["mean_e2e_err_%"].abs().mean(),
                        "simulated": bool(g["simulated"].all())})
    return pd.DataFrame(out)


def ablation_table(df: pd.DataFrame, what: dict[str, str]) -> pd.DataFrame:
    """One row per variant: LENS's case errors and bias, the calibrated operator sum's mean."""
    out = []
    for name, g in df.groupby("variant", sort=False):
        lens = g[g["method"] == "LENS"]
        s = summary(lens["mape_%"])
        out.append({"variant": name, "cases": s["cases"], "LENS mean": s["mean"], "LENS median": s["median"],
                    "LENS p90": s["p90"], "LENS max": s["max"], "LENS <5%": s["<5%"],
                    "LENS bias": lens["bias_%"].mean(),
                    "LENS-seq mean": g.loc[g["method"] == "LENS-seq", "mape_%"].mean(),
                    "OpSum mean": g.loc[g["method"] == "OpSum", "mape_%"].mean(), "what": what[name]})
    return pd.DataFrame(out)


def per_rep(df: pd.DataFrame, method: str) -> np.ndarray:
    """The mean case error of ``method`` on each simulated fleet."""
    return df[df["method"] == method].groupby("rep")["mape_%"].mean().to_numpy()


def spread(a: np.ndarray) -> str:
    return f"median {np.median(a):.2f}% [{a.min():.2f}-{a.max():.2f}] over {a.size} fleet(s)"


def _show(df: pd.DataFrame) -> str:
    d = df.copy()
    d.columns = [c.replace("MaverIQ", "MavIQ") for c in d.columns]
    return d.to_string(index=False, float_format=lambda x: f"{x:.2f}")


# -- the run --------------------------------------------------------------------------------
def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="1 fleet, batches 1/4/16/32, 64 requests per case, one trace workload, ablation 'only' "
                         "on batches 4/32, one jax unit")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench"), help="folder for the CSV files")
    ap.add_argument("--fleets", type=int, help="simulated fleets of the main grid (quirk and noise seeds 0..N-1; "
                                               "default 2, quick 1)")
    ap.add_argument("--requests", type=int, help="held-out requests per case (default 192, quick 64)")
    ap.add_argument("--cal-batches", type=int, default=14, help="MaverIQ-style calibration batches per unit and dataset")
    ap.add_argument("--ablation", default=None, help="comma list of: only, without, extra, none "
                                                     "(default only,without,extra; quick only,extra)")
    ap.add_argument("--no-jax", action="store_true", help="leave out the jax (real CPU) row")
    args = ap.parse_args(argv)
    if args.cal_batches < 2:
        ap.error("--cal-batches must be at least 2")
    kinds = tuple((args.ablation or ("only,extra" if args.quick else "only,without,extra")).split(","))
    bad = sorted(set(kinds) - {"only", "without", "extra", "none"})
    if bad:
        ap.error(f"--ablation: unknown kind(s) {', '.join(bad)}; use only, without, extra or none")
    args.ablation_kinds = tuple(k for k in kinds if k != "none")
    args.requests = args.requests or (64 if args.quick else 192)
    args.main = Grid(batches=(1, 4, 16, 32) if args.quick else BATCHES,
                     datasets=DATASETS + (TRACES[:1] if args.quick else TRACES),
                     requests=args.requests, cal_batches=args.cal_batches, baselines=True)
    args.abl = Grid(batches=(4, 32) if args.quick else (1, 4, 16, 32), datasets=DATASETS,
                    requests=args.requests, cal_batches=args.cal_batches, baselines=False)
    args.fleets = args.fleets or (1 if args.quick else 2)
    args.jax_units = [(1, 4)] if args.quick else [(1, 1), (1, 4)]
    args.jax_requests = 30
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    log = lambda s: print(s, flush=True)  # noqa: E731
    quiet = lambda s: None  # noqa: E731
    g = args.main
    log(f"LENS accuracy on SIMULATED NPUs (runner sim): {len(DEVICES)} devices x {len(MODELS)} models x "
        f"{len(g.datasets)} workloads x batch {list(g.batches)} x {args.fleets} simulated fleet(s) "
        f"(quirk_seed = noise seed = 0..{args.fleets - 1}); {g.requests} requests per case; MaverIQ-style fit on "
        f"{g.cal_batches} calibration batches per unit and workload")
    parts, cost = [], {"LENS": 0.0, "MaverIQ": 0.0}
    (default,) = variants(("main",))
    for rep in range(args.fleets):
        df_r, c = run_variant(default, g, rep, quiet)
        parts.append(df_r)
        cost = {k: cost[k] + c[k] for k in cost}
        log(f"  fleet {rep}: {df_r[['device', 'model', 'batch', 'dataset']].drop_duplicates().shape[0]} cases, "
            f"{time.perf_counter() - t_start:.0f} s so far")
    sim_all = pd.concat(parts, ignore_index=True)

    abl_variants = variants(("main", *args.ablation_kinds)) if args.ablation_kinds else []
    abl_parts = []
    for v in abl_variants:
        abl_parts.append(run_variant(v, args.abl, 0, quiet)[0])
    if abl_variants:
        log(f"  ablation: {len(abl_variants)} variants, {time.perf_counter() - t_start:.0f} s so far")
    jax_df, skipped = (pd.DataFrame(), "--no-jax given") if args.no_jax else run_jax(args, log)
    abl_df = pd.concat(abl_parts, ignore_index=True) if abl_parts else pd.DataFrame()
    pd.concat([sim_all.assign(grid="main"), abl_df.assign(grid="ablation"), jax_df.assign(grid="jax")],
              ignore_index=True).to_csv(out / "accuracy_cases.csv", index=False)

    paper = sim_all[~sim_all["trace"]]
    main_df = paper[paper["method"].isin(SHOWN)]
    n_cases = int((main_df["method"] == "LENS").sum())
    kinds = ["device", "model", "dataset", "batch"]
    wide = group_table(main_df, kinds, SHOWN)
    longt = long_table(sim_all, kinds)
    if not jax_df.empty:
        jl = long_table(jax_df, [])
        jl["group"], jl["value"] = "runner", "jax (real CPU)"
        longt = pd.concat([longt, jl], ignore_index=True)
    wide.to_csv(out / "accuracy.csv", index=False)
    longt.to_csv(out / "accuracy_long.csv", index=False)

    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 40)
    log("\nE2E error per case, % (a case's error = mean over its requests of |pred - meas| / meas); the paper's four "
        "workloads; SIMULATED devices with every effect on (ground truth: the sim runner)")
    log(_show(wide))
    tr = sim_all[sim_all["trace"] & sim_all["method"].isin(SHOWN)]
    log("\ntrace-derived workloads (requests over 8192 tokens dropped), SIMULATED:")
    log(_show(group_table(tr, ["dataset"], SHOWN).iloc[1:]))

    log("\nWorkload-level view (paper workloads, SIMULATED): mean case error, mean over cases of |error of the "
        "workload's mean E2E|, and the mean signed per-request error (all %)")
    wl = (paper.groupby("method", sort=False)
          .agg(cases=("mape_%", "size"), mean_case_err=("mape_%", "mean"),
               abs_mean_e2e_err=("mean_e2e_err_%", lambda x: x.abs().mean()), signed_bias=("bias_%", "mean"))
          .reset_index())
    log(wl.to_string(index=False, float_format=lambda x: f"{x:.2f}"))
    log("  MaverIQ-2 = the MaverIQ-style fit on only its first 2 calibration batches; MaverIQ-pd = one fit per device, "
        "model and workload over every batch size (the LENS paper's reading); OpSum-peak = the operator sum at public "
        "peak figures, uncalibrated")

    if not abl_df.empty:
        what = {v.name: v.what for v in abl_variants}
        abl = ablation_table(abl_df, what)
        abl.to_csv(out / "accuracy_ablation.csv", index=False)
        a = args.abl
        log(f"\nAblation (SIMULATED, fleet 0, paper workloads, batch {list(a.batches)}, {a.requests} requests per "
            f"case): LENS per-request E2E error by device variant, %")
        log(_show(abl))

    log("\njax runner (REAL execution on this CPU, spaces/quickstart.toml, ground truth: median of 3 runs):")
    if jax_df.empty:
        log(f"  skipped: {skipped}")
    else:
        cols = ["device", "tp", "batch", "dataset", "requests", "method", "mape_%", "bias_%", "mean_e2e_err_%"]
        log(jax_df[cols].to_string(index=False, float_format=lambda x: f"{x:.2f}"))
        if skipped:
            log(f"  incomplete: {skipped}")

    lens_r, mav_r, op_r, pd_r = (per_rep(main_df, m) for m in SHOWN)
    ratios, pd_ratios = mav_r / lens_r, pd_r / lens_r
    log(f"\nprofiling hardware-s (SIMULATED, compile + run, main grid): LENS {cost['LENS']:.0f} s (one profile per "
        f"unit, shared by every workload); MaverIQ-style {cost['MaverIQ']:.0f} s (the unit's compile plus one "
        f"calibration per unit and workload); OpSum calibrated on LENS's probes (0 s more)")
    log(f"headline (SIMULATED, paper workloads, {n_cases} cases): mean case error per fleet:")
    log(f"  LENS             {spread(lens_r)}  (goal <= {GOAL_LENS_MEAN}%: "
        f"{'met' if np.median(lens_r) <= GOAL_LENS_MEAN else 'NOT met'})")
    log(f"  MaverIQ-style    {spread(mav_r)}  (per unit and workload)")
    log(f"  MaverIQ-pd       {spread(pd_r)}  (per device, model and workload over every batch size)")
    log(f"  OpSum calibrated {spread(op_r)}")
    log(f"  MaverIQ-style / LENS: median {np.median(ratios):.1f}x [{ratios.min():.1f}-{ratios.max():.1f}] "
        f"(goal >= {GOAL_RATIO:.0f}x: {'met' if np.median(ratios) >= GOAL_RATIO else 'NOT met'})")
    log(f"  MaverIQ-pd / LENS:    median {np.median(pd_ratios):.1f}x [{pd_ratios.min():.1f}-{pd_ratios.max():.1f}] "
        f"(the paper's wording read literally: one line per workload for every batch size; the goal is judged "
        f"on the per-unit baseline above)")
    every = sim_all[sim_all["method"].isin(SHOWN)]
    lens_a, mav_a, op_a, pd_a = (every.loc[every["method"] == m, "mape_%"].mean() for m in SHOWN)
    log(f"  all {every['dataset'].nunique()} workloads (paper + trace-derived, {int((every['method'] == 'LENS').sum())} "
        f"cases): LENS {lens_a:.2f}%, MaverIQ-style {mav_a:.2f}%, MaverIQ-pd {pd_a:.2f}%, OpSum calibrated "
        f"{op_a:.2f}%; MaverIQ-style / LENS {mav_a / lens_a:.1f}x, MaverIQ-pd / LENS {pd_a / lens_a:.1f}x")
    if not abl_df.empty:
        by_variant = abl_df.groupby(["variant", "method"], sort=False)["mape_%"].mean()
        for name in ("default", "without stragglers", "noise-free", "clean", "batched prefill"):
            if (name, "LENS") in by_variant:
                seq = (f" (LENS's sequential model on the same probes: {by_variant[(name, 'LENS-seq')]:.2f}%)"
                       if (name, "LENS-seq") in by_variant else "")
                log(f"  LENS, ablation grid, {name:18s} {by_variant[(name, 'LENS')]:.2f}%{seq}")
    log("paper: LENS 5.3% vs MaverIQ 33% (vLLM-TPU); LENS on NPUs mean 2.15%, median 1.69%, 89.9% under 5%")
    log(f"tables: {out / 'accuracy.csv'}, {out / 'accuracy_long.csv'}, {out / 'accuracy_ablation.csv'}, "
        f"{out / 'accuracy_cases.csv'}; {time.perf_counter() - t_start:.0f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
