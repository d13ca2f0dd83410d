"""Accuracy: LENS vs a MaverIQ-style baseline vs an operator-sum roofline, per request E2E.

Grid (simulated NPUs, runner ``sim``; every sim number is SIMULATED):
  devices   inf2, trn1, tpu-v5e, tpu-v6e (NxD-style exclusive buckets on Neuron, inclusive on TPU)
  models    shaped like Llama-3.2-1B, Mistral-7B, Qwen3-14B (bfloat16), each at the smallest
            tp in 1/2/4/8 whose weights plus a batch-32 KV cache at 8192 tokens fit the device
  datasets  sharegpt, cnn_dailymail, arxiv, writing_prompts (lens.distributions)
  batch     1, 2, 4, 8, 16, 32 (static batches, buckets 128 ... 8192)

One *case* = (device, model, batch, dataset). Its ground truth is ``runner.run_workload`` of
``--requests`` held-out requests of the dataset (the simulator with its run-to-run noise).
The case error is the mean over those requests of |predicted E2E - measured E2E| / measured.

- LENS: ``search.profiler.measure_unit`` once per unit (device, model, tp, batch): 2 probe
  runs per bucket x 7 buckets, 3 repeats each, max output 128; then ``lens.compose.predict``.
  The same profile serves all four datasets.
- MaverIQ-style: per unit *and* dataset, ``--cal-batches`` static batches of calibration
  requests of the dataset (another seed; default 14 batches, as many generate calls as
  LENS has probes per unit) are run end to end; E2E = a + b (l_out - 1) is fitted by least
  squares over those requests (benchmarks/baselines.py).
- Operator-sum: a per-operator roofline at actual lengths with the public peak figures
  (benchmarks/baselines.py); no measurement.

Plus a row for the ``jax`` runner (real XLA execution on this CPU, spaces/quickstart.toml):
LENS and MaverIQ-style on two units and ~30 requests, ground truth the median of 3 runs;
no operator-sum there (the project has no public peak figures for a host CPU).

    .venv/bin/python benchmarks/eval_accuracy.py [--quick] [--out DIR] [--no-jax]
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

from benchmarks.baselines import OperatorSum, Peak, fit_maveriq  # noqa: E402
from lens import distributions  # noqa: E402
from lens.compose import UnitTable, predict  # noqa: E402
from lens.types import Candidate, ModelShape, Requests, Target  # noqa: E402
from lens.workload import fit_to  # noqa: E402
from runners import get_runner  # noqa: E402
from runners.sim_devices import fits_memory  # noqa: E402
from search.profiler import measure_unit  # noqa: E402

DEVICES = ("inf2", "trn1", "tpu-v5e", "tpu-v6e")
POLICY = {"inf2": "exclusive", "trn1": "exclusive", "tpu-v5e": "inclusive", "tpu-v6e": "inclusive"}
MODELS = {
    "llama3.2-1b": ModelShape(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=128256),
    "mistral-7b": ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=32000),
    "qwen3-14b": ModelShape(layers=40, hidden=5120, heads=40, kv_heads=8, intermediate=17408, vocab=151936),
}
DATASETS = ("sharegpt", "cnn_dailymail", "arxiv", "writing_prompts")
#: trace-derived workloads, full run only (lens.distributions.TRACE_NAMES)
TRACES = tuple(distributions.TRACE_NAMES)
BATCHES = (1, 2, 4, 8, 16, 32)
BUCKETS = (128, 256, 512, 1024, 2048, 4096, 8192)
DTYPE = "bfloat16"
REPEATS, MAX_OUTPUT = 3, 128
EVAL_SEED, CAL_SEED = 1, 2
METHODS = ("LENS", "MaverIQ", "OpSum")


def sim_target(device: str, model: str, *, quirk_seed: int = 0, noise: float = 0.01, seed: int = 0) -> Target:
    return Target(
        name=f"sim-{device}-{model}", runner="sim", hardware=device, bucket_policy=POLICY[device], dtype=DTYPE,
        model=MODELS[model], options=(("noise", noise), ("quirk_seed", quirk_seed)), seed=seed,
    )


def pick_tp(device: str, model: ModelShape, max_batch: int) -> int | None:
    """Smallest tp that divides the heads and fits weights + a max_batch x 8192 KV cache."""
    for tp in (1, 2, 4, 8):
        if model.heads % tp or model.kv_heads % tp:
            continue
        if fits_memory(device, model, DTYPE, tp, max_batch, BUCKETS[-1]):
            return tp
    return None


def case_errors(pred: np.ndarray, meas: np.ndarray) -> dict:
    rel = (np.asarray(pred) - meas) / meas
    return {"mape_%": float(np.abs(rel).mean() * 100), "bias_%": float(rel.mean() * 100),
            "mean_e2e_err_%": float((np.mean(pred) - meas.mean()) / meas.mean() * 100)}


def summary(errs: pd.Series) -> dict:
    a = errs.to_numpy(float)
    return {"cases": a.size, "mean": a.mean(), "median": np.median(a), "p90": np.percentile(a, 90), "max": a.max(),
            "<5%": (a < 5).mean() * 100}


# -- the simulated grid ---------------------------------------------------------------------
def workload(name: str, n: int, seed: int) -> Requests:
    """``n`` requests of a built-in workload that fit the 8192-token bucket set."""
    req = distributions.sample(name, n, seed=seed)
    if distributions.max_total(name) > BUCKETS[-1]:  # trace-derived tables may hold longer requests
        req, _ = fit_to(distributions.sample(name, 4 * n, seed=seed), BUCKETS[-1])
        if len(req) < n:
            raise RuntimeError(f"{name}: fewer than {n} of {4 * n} sampled requests fit {BUCKETS[-1]} tokens")
        req = req.head(n)
    return req


def run_sim(args, rep: int, log) -> tuple[pd.DataFrame, dict]:
    """The grid on one simulated fleet: quirk_seed = target seed = ``rep``."""
    rows, cost = [], {m: 0.0 for m in METHODS}
    for device in args.devices:
        for mname in args.models:
            model = MODELS[mname]
            tp = pick_tp(device, model, max(args.batches))
            if tp is None:
                log(f"  {device} {mname}: no tp in 1/2/4/8 fits batch {max(args.batches)} at 8192 tokens; skipped")
                continue
            target = sim_target(device, mname, quirk_seed=rep, seed=rep)
            runner = get_runner(target)
            opsum = OperatorSum(model, Peak.for_sim_device(device, DTYPE), tp=tp, dtype=DTYPE)
            t0 = time.perf_counter()
            for batch in args.batches:
                mu = measure_unit(target, tp=tp, batch=batch, buckets=BUCKETS, all_buckets=BUCKETS, repeats=REPEATS,
                                  max_output=MAX_OUTPUT, runner=runner)
                cost["LENS"] += mu.hardware_s
                cand = Candidate(tp, batch, BUCKETS, BUCKETS)
                table = UnitTable.build(cand, mu.profiles, policy=target.bucket_policy)
                compiled = False
                for ds in args.datasets:
                    req = workload(ds, args.requests, EVAL_SEED + 10 * rep)
                    truth = runner.run_workload(cand, req)
                    meas = truth.e2e_s
                    lens_pred = predict(table, req, mode="static").e2e_s
                    cal = workload(ds, args.cal_batches * batch, CAL_SEED + 10 * rep)
                    cal_run = runner.run_workload(cand, cal)
                    fit = fit_maveriq(cal.output_len, cal_run.e2e_s)
                    cost["MaverIQ"] += cal_run.run_s + (0.0 if compiled else cal_run.compile_s)
                    compiled = True
                    mav_pred = fit.predict_e2e(req.output_len)
                    # the same baseline from "a handful" of runs: the first two calibration batches
                    small = cal.head(2 * batch)
                    mav2_pred = fit_maveriq(small.output_len, cal_run.e2e_s[: len(small)]).predict_e2e(req.output_len)
                    _, op_pred, _ = opsum.predict(req, batch=batch)
                    base = {"runner": "sim", "simulated": True, "rep": rep, "device": device, "model": mname, "tp": tp,
                            "batch": batch, "dataset": ds, "trace": ds not in DATASETS, "requests": len(req)}
                    for method, pred in (("LENS", lens_pred), ("MaverIQ", mav_pred), ("OpSum", op_pred),
                                         ("MaverIQ-2", mav2_pred)):
                        rows.append({**base, "method": method, **case_errors(pred, meas)})
            log(f"  fleet {rep} {device:8s} {mname:12s} tp{tp}: {len(args.batches)} units x {len(args.datasets)} "
                f"datasets in {time.perf_counter() - t0:.1f} s")
    return pd.DataFrame(rows), cost


# -- the jax row ----------------------------------------------------------------------------
def run_jax(args, log) -> tuple[pd.DataFrame, str | None]:
    """LENS and MaverIQ-style on the jax runner; returns (rows, reason it was skipped)."""
    try:
        from runners import runner_class
        from search.run import load_requests
        from spaces import load_space

        runner_class("jax")
        sp = load_space(ROOT / "spaces" / "quickstart.toml")
        runner = get_runner(sp.target)
    except Exception as exc:  # the jax runner is optional here: say why the row is absent
        return pd.DataFrame(), f"jax runner unavailable ({type(exc).__name__}: {exc})"
    buckets = sp.space.buckets
    policy = sp.target.bucket_policy
    rows = []
    try:
        req, _ = load_requests(sp, requests=args.jax_requests, seed=EVAL_SEED)
        for tp, batch in args.jax_units:
            t0 = time.perf_counter()
            mu = measure_unit(sp.target, tp=tp, batch=batch, buckets=buckets, all_buckets=buckets,
                              repeats=sp.profile.repeats, max_output=sp.profile.max_output, runner=runner)
            cand = Candidate(tp, batch, buckets, buckets)
            lens_pred = predict(UnitTable.build(cand, mu.profiles, policy=policy), req, mode=sp.batching).e2e_s
            runner.run_workload(cand, req.head(batch))  # compile and warm the candidate's graphs
            meas = np.median([runner.run_workload(cand, req).e2e_s for _ in range(3)], axis=0)
            cal, _ = load_requests(sp, requests=args.cal_batches * batch, seed=CAL_SEED)
            cal_run = runner.run_workload(cand, cal)
            mav_pred = fit_maveriq(cal.output_len, cal_run.e2e_s).predict_e2e(req.output_len)
            base = {"runner": "jax", "simulated": False, "device": sp.target.hardware, "model": sp.target.name,
                    "tp": tp, "batch": batch, "dataset": "sharegpt x0.25", "requests": len(req)}
            rows.append({**base, "method": "LENS", **case_errors(lens_pred, meas)})
            rows.append({**base, "method": "MaverIQ", **case_errors(mav_pred, meas)})
            log(f"  jax tp{tp} b{batch}: {len(req)} requests, {time.perf_counter() - t0:.1f} s wall")
    except Exception as exc:  # a broken backend must not hide the simulated results
        return pd.DataFrame(rows), f"jax runner failed ({type(exc).__name__}: {exc})"
    finally:
        runner.close()
    return pd.DataFrame(rows), None


# -- tables ---------------------------------------------------------------------------------
def group_table(df: pd.DataFrame, kinds: list[str]) -> pd.DataFrame:
    """One row per group, a block of stats per method (columns 'LENS mean', ...)."""
    out = []
    groups = [("all", "all", df)] + [(k, v, g) for k in kinds for v, g in df.groupby(k, sort=False)]
    for kind, value, g in groups:
        row = {"group": kind, "value": value}
        for method in METHODS:
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


def per_rep(df: pd.DataFrame, method: str) -> np.ndarray:
    """The mean case error of ``method`` on each simulated fleet."""
    return df[df["method"] == method].groupby("rep")["mape_%"].mean().to_numpy()


def spread(a: np.ndarray) -> str:
    return f"median {np.median(a):.2f}% [{a.min():.2f}-{a.max():.2f}] over {a.size} fleet(s)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="2 fleets, batches 1/4/16/32, 64 requests per case, no trace workloads, one jax unit")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench"), help="folder for the CSV files")
    ap.add_argument("--fleets", type=int, help="simulated fleets (quirk and noise seeds 0..N-1; default 5, quick 2)")
    ap.add_argument("--requests", type=int, help="held-out requests per case (default 256, quick 64)")
    ap.add_argument("--cal-batches", type=int, default=14, help="MaverIQ-style calibration batches per unit and dataset")
    ap.add_argument("--no-jax", action="store_true", help="leave out the jax (real CPU) row")
    args = ap.parse_args(argv)
    if args.cal_batches < 2:
        ap.error("--cal-batches must be at least 2")
    args.devices, args.models = DEVICES, tuple(MODELS)
    args.datasets = DATASETS if args.quick else DATASETS + TRACES
    args.batches = (1, 4, 16, 32) if args.quick else BATCHES
    args.requests = args.requests or (64 if args.quick else 256)
    args.fleets = args.fleets or (2 if args.quick else 5)
    args.jax_units = [(1, 4)] if args.quick else [(1, 1), (1, 4)]
    args.jax_requests = 30
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    log = lambda s: print(s, flush=True)  # noqa: E731

    log(f"LENS accuracy on SIMULATED NPUs (runner sim): {len(args.devices)} devices x {len(args.models)} models x "
        f"{len(args.datasets)} workloads x batch {list(args.batches)} x {args.fleets} simulated fleet(s) "
        f"(quirk_seed = noise seed = 0..{args.fleets - 1}); {args.requests} requests per case; MaverIQ-style fit on "
        f"{args.cal_batches} calibration batches per unit and dataset")
    parts, cost = [], {m: 0.0 for m in METHODS}
    for rep in range(args.fleets):
        df_r, c = run_sim(args, rep, lambda s: None)
        parts.append(df_r)
        for k in cost:
            cost[k] += c[k]
        log(f"  fleet {rep}: {len(df_r) // 4} cases, {time.perf_counter() - t_start:.1f} s so far")
    sim_all = pd.concat(parts, ignore_index=True)
    jax_df, skipped = (pd.DataFrame(), "--no-jax given") if args.no_jax else run_jax(args, log)
    pd.concat([sim_all, jax_df], ignore_index=True).to_csv(out / "accuracy_cases.csv", index=False)

    paper = sim_all[~sim_all["trace"]]
    main_df = paper[paper["method"].isin(METHODS)]
    kinds = ["device", "model", "dataset", "batch"]
    wide = group_table(main_df, kinds)
    longt = long_table(sim_all[sim_all["method"].isin(METHODS)].assign(
        dataset=lambda d: d["dataset"]), kinds)
    if not jax_df.empty:
        jl = long_table(jax_df, [])
        jl["group"], jl["value"] = "runner", "jax (real CPU)"
        longt = pd.concat([longt, jl], ignore_index=True)
    longt.insert(0, "datasets", "paper 4 + traces" if not args.quick else "paper 4")
    wide.insert(0, "datasets", "paper 4")
    wide.to_csv(out / "accuracy.csv", index=False)
    longt.to_csv(out / "accuracy_long.csv", index=False)

    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 40)
    fmt = lambda x: f"{x:.2f}"  # noqa: E731
    log("\nE2E error per case, % (a case's error = mean over its requests of |pred - meas| / meas); the paper's four "
        "datasets; SIMULATED devices (ground truth: the sim runner)")
    show = wide.drop(columns=["datasets"])
    show.columns = [c.replace("MaverIQ", "MavIQ") for c in show.columns]
    log(show.to_string(index=False, float_format=fmt))

    if not args.quick:
        tr = sim_all[sim_all["trace"] & sim_all["method"].isin(METHODS)]
        log("\ntrace-derived workloads (requests over 8192 tokens dropped), SIMULATED:")
        tw = group_table(tr, ["dataset"]).iloc[1:]
        tw.columns = [c.replace("MaverIQ", "MavIQ") for c in tw.columns]
        log(tw.to_string(index=False, float_format=fmt))

    log("\nWorkload-level view (paper datasets, SIMULATED): mean case error, mean over cases of |error of the "
        "workload's mean E2E|, and the mean signed per-request error (all %)")
    wl = (paper.groupby("method", sort=False)
          .agg(cases=("mape_%", "size"), mean_case_err=("mape_%", "mean"), abs_mean_e2e_err=("mean_e2e_err_%", lambda x: x.abs().mean()),
               signed_bias=("bias_%", "mean")).reset_index())
    log(wl.to_string(index=False, float_format=fmt))
    log("  MaverIQ-2 = the MaverIQ-style fit on only its first 2 calibration batches (a handful of requests)")

    log("\njax runner (REAL execution on this CPU, spaces/quickstart.toml, ground truth: median of 3 runs):")
    if jax_df.empty:
        log(f"  skipped: {skipped}")
    else:
        cols = ["device", "tp", "batch", "dataset", "requests", "method", "mape_%", "bias_%", "mean_e2e_err_%"]
        log(jax_df[cols].to_string(index=False, float_format=fmt))
        if skipped:
            log(f"  incomplete: {skipped}")

    lens_r, mav_r, op_r = (per_rep(main_df, m) for m in METHODS)
    ratios = mav_r / lens_r
    log(f"\nprofiling hardware-s (SIMULATED, compile + run, all fleets): LENS {cost['LENS']:.0f} s (one profile per unit, "
        f"shared by every workload); MaverIQ-style {cost['MaverIQ']:.0f} s (one calibration per unit and workload); "
        f"operator-sum 0 s")
    log(f"headline (SIMULATED, paper datasets, {len(main_df) // 3} cases): mean case error per fleet:")
    log(f"  LENS          {spread(lens_r)}")
    log(f"  MaverIQ-style {spread(mav_r)}")
    log(f"  operator-sum  {spread(op_r)}")
    log(f"  MaverIQ-style / LENS: median {np.median(ratios):.1f}x [{ratios.min():.1f}-{ratios.max():.1f}] "
        f"(goal >= 6x: {'met' if np.median(ratios) >= 6 else 'NOT met'})")
    log("paper: LENS 5.3% vs MaverIQ 33% (vLLM-TPU); LENS on NPUs mean 2.15%, median 1.69%, 89.9% under 5%")
    log(f"tables: {out / 'accuracy.csv'}, {out / 'accuracy_long.csv'}, {out / 'accuracy_cases.csv'}; "
        f"{time.perf_counter() - t_start:.0f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
