"""The LENS paper's two use cases, reproduced on SIMULATED NPUs (runner ``sim``).

(a) Throughput-maximising batch size per dataset. TPU v6e, Mistral-7B shape, tp 4,
    buckets 128 ... 8192, batch 1-32, 512 requests of each dataset. For every batch size:
    the LENS prediction (one ``measure_unit`` profile per batch size) and the simulated
    measurement (``run_workload``) of the per-chip throughput and the p90 TPOT. The
    condition: the largest per-chip throughput among batch sizes whose p90 TPOT meets an
    interactive SLO of ``--tpot-slo`` ms (default 15 ms, about 67 tokens/s per user);
    the unconstrained maximum is printed beside it.

(b) Bucket-set refinement that makes things slower (the paper: ArXiv on Inferentia2 TP2,
    Llama-3.2-1B, 512-token buckets between 4096 and 8192 were 7% slower than
    {4096, 8192}). Here: inf2, tp 2, Llama-3.2-1B shape, batch 1, arxiv, coarse set
    {1024, 2048, 4096, 8192} vs the fine set with every 512-token step from 4096 to 8192.
    Whether the fine set is slower depends on the simulated compiler's quirks (target
    option ``quirk_seed``), as it depends on the real compiler on real hardware; the full
    run scans seeds 0-39 and prints how often it happens. The quirk seed used (18) is one
    where it does. Then ``search.run.run`` searches the 1024 bucket sets of a small space
    (one unit; candidate boundaries 1024, 2048 and every 512-token step from 4096 to
    8192) and the script checks that it does not pick the fine set.

    .venv/bin/python benchmarks/eval_use_cases.py [--quick] [--out DIR] [--tpot-slo MS]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.accuracy_fleet import MODELS, sim_target  # noqa: E402
from lens import distributions  # noqa: E402
from lens.compose import UnitTable, predict  # noqa: E402
from lens.metrics import summarize, summarize_prediction  # noqa: E402
from lens.types import Candidate  # noqa: E402
from runners import get_runner  # noqa: E402
from search.profiler import measure_unit  # noqa: E402
from spaces import ProfileSettings  # noqa: E402

BUCKETS = (128, 256, 512, 1024, 2048, 4096, 8192)
BATCHES = (1, 2, 4, 8, 16, 32)
DATASETS = ("sharegpt", "cnn_dailymail", "arxiv", "writing_prompts")
COARSE = (1024, 2048, 4096, 8192)
FINE = (1024, 2048) + tuple(range(4096, 8193, 512))
QUIRK_SEED = 18
#: profiling as a space file leaves it by default
SETTINGS = ProfileSettings()


# -- (a) ------------------------------------------------------------------------------------
def batch_per_dataset(args, log) -> pd.DataFrame:
    target = sim_target("tpu-v6e", "mistral-7b")
    runner = get_runner(target)
    tp = 4
    rows = []
    for batch in BATCHES:
        mu = measure_unit(target, tp=tp, batch=batch, buckets=BUCKETS, all_buckets=BUCKETS, profile=SETTINGS,
                          runner=runner)
        cand = Candidate(tp, batch, BUCKETS, BUCKETS)
        table = UnitTable.build(cand, mu.profiles, policy=target.bucket_policy, prefill=target.prefill)
        for ds in DATASETS:
            req = distributions.sample(ds, args.requests_a, seed=1)
            p = summarize_prediction(req, predict(table, req, mode="static"), chips=tp)
            w = runner.run_workload(cand, req)
            m = summarize(req, ttft_s=w.ttft_s, e2e_s=w.e2e_s, total_s=w.total_s, chips=tp)
            rows.append({"device": "tpu-v6e (simulated)", "model": "mistral-7b", "tp": tp, "dataset": ds, "batch": batch,
                         "thr_pred": p["throughput_tok_s_per_chip"], "thr_meas": m["throughput_tok_s_per_chip"],
                         "thr_err_%": (p["throughput_tok_s_per_chip"] / m["throughput_tok_s_per_chip"] - 1) * 100,
                         "tpot_p90_ms_pred": p["tpot_p90_s"] * 1e3, "tpot_p90_ms_meas": m["tpot_p90_s"] * 1e3,
                         "simulated": True})
    df = pd.DataFrame(rows)
    df["slo_ok_pred"] = df["tpot_p90_ms_pred"] <= args.tpot_slo
    df["slo_ok_meas"] = df["tpot_p90_ms_meas"] <= args.tpot_slo
    return df


def best_batches(df: pd.DataFrame, slo: float) -> pd.DataFrame:
    out = []
    for ds, g in df.groupby("dataset", sort=False):
        row = {"dataset": ds}
        for src in ("pred", "meas"):
            ok = g[g[f"slo_ok_{src}"]]
            row[f"best_batch_slo_{src}"] = int(ok.loc[ok[f"thr_{src}"].idxmax(), "batch"]) if len(ok) else None
            row[f"thr_at_best_{src}"] = float(ok[f"thr_{src}"].max()) if len(ok) else float("nan")
            row[f"best_batch_unconstrained_{src}"] = int(g.loc[g[f"thr_{src}"].idxmax(), "batch"])
        out.append(row)
    return pd.DataFrame(out)


# -- (b) ------------------------------------------------------------------------------------
def arxiv_requests(n: int):
    return distributions.sample("arxiv", n, seed=1)


def refinement_scan(args, log) -> pd.DataFrame:
    """How often the fine set is slower, over quirk seeds and batch sizes (measured, simulated)."""
    req = arxiv_requests(args.requests_b)
    rows = []
    for batch in (1, 4, 8):
        for qs in range(args.scan_seeds):
            runner = get_runner(sim_target("inf2", "llama3.2-1b", quirk_seed=qs))
            tc = runner.run_workload(Candidate(2, batch, COARSE, COARSE), req).total_s
            tf = runner.run_workload(Candidate(2, batch, FINE, FINE), req).total_s
            rows.append({"batch": batch, "quirk_seed": qs, "fine_vs_coarse_throughput_%": (tc / tf - 1) * 100})
    return pd.DataFrame(rows)


def refinement_case(args, log) -> tuple[pd.DataFrame, dict]:
    target = sim_target("inf2", "llama3.2-1b", quirk_seed=QUIRK_SEED)
    runner = get_runner(target)
    tp, batch = 2, 1
    req = arxiv_requests(args.requests_b)
    mu = measure_unit(target, tp=tp, batch=batch, buckets=FINE, all_buckets=FINE, profile=SETTINGS,
                      runner=runner)
    rows = []
    for name, b in (("coarse {1024,2048,4096,8192}", COARSE), ("fine (512-token steps 4096-8192)", FINE)):
        cand = Candidate(tp, batch, b, b)
        p = summarize_prediction(req, predict(UnitTable.build(cand, mu.profiles, policy=target.bucket_policy, prefill=target.prefill), req), chips=tp)
        w = runner.run_workload(cand, req)
        m = summarize(req, ttft_s=w.ttft_s, e2e_s=w.e2e_s, total_s=w.total_s, chips=tp)
        # what the set costs to compile on a fresh host (this runner has compiled its graphs already)
        compile_s = get_runner(target).run_workload(cand, req.head(1)).compile_s
        rows.append({"bucket set": name, "buckets": " ".join(map(str, b)), "thr_pred": p["throughput_tok_s_per_chip"],
                     "thr_meas": m["throughput_tok_s_per_chip"], "e2e_p90_pred_s": p["e2e_p90_s"],
                     "e2e_p90_meas_s": m["e2e_p90_s"], "compile_s": compile_s, "simulated": True})
    df = pd.DataFrame(rows)
    info = search_bucket_sets(args, target, req, runner, log)
    return df, info


def _space_toml(path: Path, target, requests: int) -> None:
    m = target.model
    opts = "\n".join(f"{k} = {json.dumps(v)}" for k, v in target.options)  # TOML spells these like JSON
    path.write_text(f"""# the bucket-refinement use case (SIMULATED inf2): one unit, every subset of the candidate boundaries
[target]
name = "{target.name}-refine"
runner = "sim"
hardware = "{target.hardware}"
bucket_policy = "{target.bucket_policy}"
dtype = "{target.dtype}"
seed = {target.seed}

[target.model]
layers = {m.layers}
hidden = {m.hidden}
heads = {m.heads}
kv_heads = {m.kv_heads}
intermediate = {m.intermediate}
vocab = {m.vocab}

[target.options]
{opts}

[space]
tp = [2]
batch = [1]
buckets = [{", ".join(map(str, FINE))}]

[workload]
distribution = "arxiv"
requests = {requests}
seed = 1

[budget]
trials = 300
""")


def search_bucket_sets(args, target, req, runner, log) -> dict:
    import ray

    from search.run import run

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started = False
    if not ray.is_initialized():
        # address="local": always a private cluster, never one another process on this host started
        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, logging_level=logging.ERROR,
                 log_to_driver=False)
        started = True
    try:
        with tempfile.TemporaryDirectory(prefix="lensopt-bench-") as tmp:
            space = Path(tmp) / "refine.toml"
            _space_toml(space, target, args.requests_b)
            t0 = time.perf_counter()
            res = run(space, results_dir=Path(tmp) / "results", cache=Path(tmp) / "profiles.sqlite", confirm=False,
                      progress=False, log=lambda s: None, fresh=True)
            wall = time.perf_counter() - t0
    finally:
        if started:
            ray.shutdown()
    front = res.front
    thr = "throughput_tok_s_per_chip"
    top = front.loc[front[thr].idxmax()]
    chosen = res.info.get("chosen") or {}
    picks = {"max-throughput front member": tuple(int(x) for x in str(top["ctx_buckets"]).split()),
             "chosen (knee)": tuple(chosen.get("ctx_buckets", ()))}
    out = {"search_wall_s": wall, "trials": res.info["trials"], "front_size": len(front),
           "fine_on_front": bool((front["ctx_buckets"] == " ".join(map(str, FINE))).any())}
    for label, b in picks.items():
        w = runner.run_workload(Candidate(2, 1, b, b), req)
        m = summarize(req, ttft_s=w.ttft_s, e2e_s=w.e2e_s, total_s=w.total_s, chips=2)
        out[label] = {"buckets": " ".join(map(str, b)), "is_fine_set": b == FINE,
                      "thr_pred": float(front.loc[front["ctx_buckets"] == " ".join(map(str, b)), thr].iloc[0]),
                      "thr_meas": m[thr]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer requests, no quirk-seed scan")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench"), help="folder for the CSV files")
    ap.add_argument("--tpot-slo", type=float, default=15.0, help="p90 TPOT SLO of use case (a), ms (default 15)")
    args = ap.parse_args(argv)
    args.requests_a = 256 if args.quick else 512
    args.requests_b = 128 if args.quick else 256
    args.scan_seeds = 0 if args.quick else 40
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = lambda s: print(s, flush=True)  # noqa: E731
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 30)
    fmt = lambda x: f"{x:.2f}"  # noqa: E731
    t_start = time.perf_counter()

    # (a)
    df = batch_per_dataset(args, log)
    df.to_csv(out / "use_case_batch.csv", index=False)
    best = best_batches(df, args.tpot_slo)
    best.insert(0, "tpot_p90_slo_ms", args.tpot_slo)
    best.to_csv(out / "use_case_batch_best.csv", index=False)
    log(f"(a) per-chip throughput (tok/s) and p90 TPOT (ms) by batch size -- SIMULATED tpu-v6e, Mistral-7B shape, tp 4, "
        f"{args.requests_a} requests per dataset; pred = LENS, meas = simulated run")
    grid = df.pivot(index="batch", columns="dataset", values=["thr_pred", "thr_meas", "tpot_p90_ms_pred", "tpot_p90_ms_meas"])
    for metric in ("thr", "tpot_p90_ms"):
        g = pd.DataFrame({f"{ds} {src}": grid[(f"{metric}_{src}", ds)] for ds in DATASETS for src in ("pred", "meas")})
        log(f"\n{metric}:")
        log(g.to_string(float_format=lambda x: f"{x:.1f}"))
    log(f"\nthroughput-maximising batch per dataset under p90 TPOT <= {args.tpot_slo:g} ms (SIMULATED), and unconstrained:")
    log(best.drop(columns=["tpot_p90_slo_ms"]).to_string(index=False, float_format=lambda x: f"{x:.1f}"))
    bp, bm = best["best_batch_slo_pred"], best["best_batch_slo_meas"]
    log(f"  LENS picks the measured best batch for {int((bp == bm).sum())}/{len(best)} datasets; the best batch "
        f"{'differs' if bm.nunique() > 1 else 'does NOT differ'} between datasets ({dict(zip(best['dataset'], bm))}); "
        f"mean |throughput error| {df['thr_err_%'].abs().mean():.2f}%")
    unc = best["best_batch_unconstrained_meas"]
    if unc.nunique() == 1:
        log(f"  without the SLO every dataset's measured throughput peaks at batch {int(unc.iloc[0])} (the largest "
            f"here); the paper's unconstrained peaks at 8/16 do not appear")

    # (b)
    log(f"\n(b) bucket refinement -- SIMULATED inf2, Llama-3.2-1B shape, tp 2, batch 1, arxiv ({args.requests_b} requests), "
        f"simulated compiler quirk_seed {QUIRK_SEED}")
    if args.scan_seeds:
        scan = refinement_scan(args, log)
        scan.to_csv(out / "use_case_refine_scan.csv", index=False)
        for batch, g in scan.groupby("batch"):
            v = g["fine_vs_coarse_throughput_%"].to_numpy()
            slower = g.loc[v < 0, "quirk_seed"].tolist()
            log(f"  scan, batch {batch}: fine set slower for {len(slower)}/{len(v)} quirk seeds "
                f"(measured throughput change median {np.median(v):+.1f}%, range {v.min():+.1f}% .. {v.max():+.1f}%)"
                + (f"; seeds {slower}" if slower else ""))
    case, info = refinement_case(args, log)
    case.to_csv(out / "use_case_refine.csv", index=False)
    log(case.drop(columns=["buckets", "simulated"]).to_string(index=False, float_format=fmt))
    c, f = case.iloc[0], case.iloc[1]
    log(f"  fine vs coarse throughput: predicted {(f['thr_pred'] / c['thr_pred'] - 1) * 100:+.1f}%, "
        f"measured {(f['thr_meas'] / c['thr_meas'] - 1) * 100:+.1f}% (paper: -7%)")
    log(f"  search over {2 ** (len(FINE) - 1)} bucket sets (search.run.run, {info['trials']} trials, "
        f"{info['search_wall_s']:.1f} s wall): front of {info['front_size']}, fine set on the front: {info['fine_on_front']}")
    rows = []
    for label in ("max-throughput front member", "chosen (knee)"):
        d = info[label]
        rows.append({"search pick": label, "buckets": d["buckets"], "is fine set": d["is_fine_set"],
                     "thr_pred": d["thr_pred"], "thr_meas": d["thr_meas"],
                     "vs fine (meas) %": (d["thr_meas"] / f["thr_meas"] - 1) * 100,
                     "vs coarse (meas) %": (d["thr_meas"] / c["thr_meas"] - 1) * 100})
    picks = pd.DataFrame(rows)
    picks.to_csv(out / "use_case_refine_search.csv", index=False)
    log(picks.to_string(index=False, float_format=fmt))
    slower = f["thr_meas"] < c["thr_meas"]
    picked_fine = any(info[k]["is_fine_set"] for k in ("max-throughput front member", "chosen (knee)"))
    log(f"  result: the fine set is {'slower' if slower else 'NOT slower'} than the coarse set here, and the search "
        f"{'picked it' if picked_fine else 'did not pick it'}")
    log(f"tables: {out}/use_case_*.csv; {time.perf_counter() - t_start:.0f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
