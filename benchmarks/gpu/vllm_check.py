#!/usr/bin/env python3
"""GPU check of the ``vllm`` runner: profile a random-weights model, then test LENS on it.

1. Writes a model folder holding only ``config.json`` for a Llama-3.2-1B-shaped decoder
   (vLLM fills it with random weights, ``load_format="dummy"``: no download).
2. Profiles a few (tp, batch) units through ``runners.vllm_runner.VllmRunner`` (two runs per
   bucket, the same probes a search uses) and prints each bucket's TTFT_b and TBT_b.
3. Runs held-out requests (prompts spread over every bucket, never a probe's lengths) in
   static batches of the unit's batch size on the same engine, and compares the measured
   per-request E2E and TTFT with the LENS prediction from the profiles, in both of the
   estimator's batching modes (``static``: the batch decodes as one shape; ``ragged``: each
   request walks its own buckets, closer to vLLM's paged attention).
4. Prints the error table (mean / median / p90 / max absolute error, share under 5%) and
   writes per-request rows to ``$OUT/vllm_check.csv`` (and the profiles to
   ``$OUT/vllm_check_profiles.csv``) when ``$OUT`` is set, or to ``--csv``.

Run on a machine with an NVIDIA GPU and vLLM installed, from the repository root:

    python3 benchmarks/gpu/vllm_check.py                      # tp 1, batch 1/4/8; stops starting units after --budget-s
    python3 benchmarks/gpu/vllm_check.py --units 1x8 --batches 4
    python3 benchmarks/gpu/vllm_check.py --write-model-dir models/llama-1b-random   # only write config.json

A GPU's latency is not a staircase of compiled buckets: LENS's per-bucket profile is a
piecewise-constant approximation there. vLLM prefills a batch's prompts together, and the
target says so (``prefill = "batched"``): the estimator gives every request of a batch its
first token at the end of one prefill call in the bucket of the batch's longest prompt.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT, Path(__file__).resolve().parent):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from lens.buckets import bucket_ranges, validate_buckets  # noqa: E402
from lens.compose import UnitTable, predict  # noqa: E402
from lens.errors import UserError  # noqa: E402
from lens.probes import plan_probes  # noqa: E402
from lens.types import BATCHING, Candidate, ModelShape, Requests, Target  # noqa: E402
from spaces import ProfileSettings  # noqa: E402

from gpu_check_tables import format_table, write_csv  # noqa: E402  (beside this script)

#: Llama-3.2-1B's shape (about 1.2 B parameters with its untied output layer)
LLAMA_1B = ModelShape(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=128256)
DEFAULT_BUCKETS = (128, 256, 512, 1024, 2048)
#: profiling as a space file leaves it by default
PROFILE = ProfileSettings()


def missing_vllm() -> str | None:
    """One line saying what is missing and where the check runs, or None when vLLM is importable."""
    import importlib.util

    if "vllm" in sys.modules or importlib.util.find_spec("vllm") is not None:
        return None
    return ("needs vLLM, which is not installed here: it runs on an NVIDIA GPU host with "
            "pip install \"lensopt[vllm]\" (see benchmarks/gpu/README.md); on a GPU host without vLLM, "
            "benchmarks/gpu/check.py checks LENS through the jax runner instead")


def parse_units(spec: str) -> list[tuple[int, int]]:
    """``"1x1,1x4,2x8"`` -> [(1, 1), (1, 4), (2, 8)] (tp x batch)."""
    out = []
    for part in spec.split(","):
        part = part.strip().lower()
        tp, sep, b = part.partition("x")
        if not sep or not tp.isdigit() or not b.isdigit() or int(tp) < 1 or int(b) < 1:
            raise UserError(f"--units: {part!r} is not TPxBATCH with positive integers (e.g. 1x8)")
        out.append((int(tp), int(b)))
    if not out:
        raise UserError("--units: give at least one TPxBATCH")
    return out


def parse_buckets(spec: str) -> tuple[int, ...]:
    try:
        vals = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--buckets {spec!r}: give comma-separated token lengths") from None
    return validate_buckets(vals, what="--buckets")


def make_target(model_dir: str, *, hardware: str = "gpu", dtype: str = "bfloat16", policy: str = "inclusive",
                shape: ModelShape = LLAMA_1B, seed: int = 0, cuda_graphs: str = "batch",
                gpu_memory_utilization: float = 0.85, warmup: int = 1) -> Target:
    """The vllm target of the check (random weights from ``model_dir``'s config.json)."""
    opts = {
        "model": str(model_dir),
        "load_format": "dummy",
        "platform": "gpu",
        "cuda_graphs": cuda_graphs,
        "gpu_memory_utilization": float(gpu_memory_utilization),
        "warmup": int(warmup),
    }
    # vLLM on a GPU encodes a batch's prompts in one step: the estimator composes it so
    return Target(name="vllm-gpu-check", runner="vllm", hardware=hardware, bucket_policy=policy, dtype=dtype,
                  model=shape, options=tuple(sorted(opts.items())), seed=seed, prefill="batched")


def held_out_requests(rng: np.random.Generator, buckets: Sequence[int], policy: str, n: int, *,
                      max_output: int, avoid: Iterable[tuple[int, int]] = ()) -> Requests:
    """``n`` requests: a bucket drawn uniformly, a prompt length uniform inside it, an output
    of 1..``max_output`` tokens that keeps the last context inside the largest bucket;
    never one of the ``avoid`` (input, output) pairs (the probes)."""
    b = validate_buckets(buckets)
    lo, hi = bucket_ranges(b, policy)
    top = b[-1]
    avoid = set(avoid)
    lin, lout = [], []
    tries = 0
    while len(lin) < n:
        tries += 1
        if tries > 100 * n + 1000:
            raise UserError("could not draw held-out requests that avoid the probes; widen the buckets")
        k = int(rng.integers(0, len(b)))
        if lo[k] > hi[k]:
            continue
        li = int(rng.integers(lo[k], hi[k] + 1))
        room = top - li + 1  # the last context li + lo - 1 stays <= top
        if room < 1:
            continue
        lo_ = int(rng.integers(1, min(max_output, room) + 1))
        if (li, lo_) in avoid:
            continue
        lin.append(li)
        lout.append(lo_)
    return Requests(np.asarray(lin), np.asarray(lout), name="held-out")


def error_stats(err: Sequence[float]) -> dict[str, float]:
    """Absolute relative errors (fractions in) as percentages: mean, median, p90, max, share < 5%."""
    a = np.abs(np.asarray(err, dtype=float)) * 100
    if a.size == 0:
        return {"mean": float("nan"), "median": float("nan"), "p90": float("nan"), "max": float("nan"),
                "under5": float("nan")}
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "max": float(a.max()), "under5": float((a < 5).mean() * 100)}


def summarize(rows: Sequence[dict]) -> list[dict]:
    """One line per (unit, mode) and one per mode over all units."""
    out = []
    keys = sorted({(r["tp"], r["batch"]) for r in rows})
    for mode in BATCHING:
        groups = [(f"tp{tp} b{b}", [r for r in rows if (r["tp"], r["batch"]) == (tp, b)]) for tp, b in keys]
        groups.append(("all", list(rows)))
        for label, g in groups:
            if not g:
                continue
            e = error_stats([r[f"e2e_err_{mode}"] for r in g])
            t = error_stats([r[f"ttft_err_{mode}"] for r in g])
            out.append({"unit": label, "mode": mode, "requests": len(g),
                        "E2E mean %": e["mean"], "E2E median %": e["median"], "E2E p90 %": e["p90"],
                        "E2E max %": e["max"], "E2E <5% share": e["under5"],
                        "TTFT mean %": t["mean"], "TTFT median %": t["median"],
                        "noise %": float(np.median([r["noise"] for r in g]) * 100)})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--units", default="1x1,1x4,1x8", help="tp x batch units, comma separated (default 1x1,1x4,1x8)")
    ap.add_argument("--buckets", default=",".join(map(str, DEFAULT_BUCKETS)))
    ap.add_argument("--policy", default="inclusive", choices=("inclusive", "exclusive"))
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "fp8"))
    ap.add_argument("--model-dir", help="where to write config.json (default: a temporary folder)")
    ap.add_argument("--write-model-dir", metavar="DIR", help="only write DIR/config.json for the check's model and exit")
    ap.add_argument("--repeats", type=int, default=PROFILE.repeats, help=f"runs per probe (default {PROFILE.repeats})")
    ap.add_argument("--max-output", type=int, default=PROFILE.max_output,
                    help=f"the longer probe's output cap (default {PROFILE.max_output})")
    ap.add_argument("--batches", type=int, default=6, help="held-out batches per unit (default 6)")
    ap.add_argument("--held-out-output", type=int, default=256, help="held-out outputs are 1..N tokens (default 256)")
    ap.add_argument("--runs", type=int, default=2, help="runs of the held-out requests; medians compared (default 2)")
    ap.add_argument("--cuda-graphs", default="batch", choices=("batch", "default", "off"))
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="start no new unit after this many seconds (default 420, so a run stays under 8 minutes)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--csv", help="per-request rows here (default $OUT/vllm_check.csv when $OUT is set)")
    args = ap.parse_args(argv)

    from runners._llm_host import write_llama_model_dir

    buckets = parse_buckets(args.buckets)
    if args.write_model_dir:
        d = write_llama_model_dir(args.write_model_dir, LLAMA_1B, dtype=args.dtype, max_position=max(buckets) + 1)
        print(f"wrote {d / 'config.json'}")
        return 0
    missing = missing_vllm()
    if missing:
        print(f"vllm_check: {missing}", file=sys.stderr)
        return 2  # as a missing runner extra (RunnerUnavailable) exits
    units = parse_units(args.units)
    for name in ("repeats", "batches", "runs", "held_out_output"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1")

    from runners.vllm_runner import VllmRunner
    from search.profiler import measure_unit

    t_start = time.perf_counter()
    tmp = tempfile.TemporaryDirectory(prefix="lensopt-vllm-check-")
    model_dir = write_llama_model_dir(args.model_dir or Path(tmp.name) / "llama-1b-random", LLAMA_1B,
                                      dtype=args.dtype, max_position=max(buckets) + 1)
    target = make_target(str(model_dir), dtype=args.dtype, policy=args.policy, seed=args.seed,
                         cuda_graphs=args.cuda_graphs, gpu_memory_utilization=args.gpu_memory_utilization)
    runner = VllmRunner(target)
    versions = runner.versions()
    print(f"vllm runner check: Llama-3.2-1B shape, random weights, {args.dtype}, buckets {list(buckets)} "
          f"({args.policy} policy), units {args.units}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())))
    rng = np.random.default_rng(args.seed)
    probes = plan_probes(buckets, policy=args.policy, max_output=args.max_output, repeats=args.repeats)
    avoid = {(p.input_len, p.output_len) for p in probes}
    rows: list[dict] = []
    prof_rows: list[dict] = []
    skipped = []
    try:
        for tp, b in units:
            if time.perf_counter() - t_start > args.budget_s:
                skipped.append(f"tp{tp} b{b}")
                continue
            t0 = time.perf_counter()
            m = measure_unit(target, tp=tp, batch=b, buckets=buckets, all_buckets=buckets,
                             profile=ProfileSettings(repeats=args.repeats, max_output=args.max_output), runner=runner)
            prof_wall = time.perf_counter() - t0
            print(f"\nunit tp={tp} batch={b}: profiled {len(m.profiles)} buckets in {prof_wall:.1f} s wall "
                  f"(engine start {m.compile_s:.1f} s + runs {m.run_s:.1f} s)")
            for bk, p in sorted(m.profiles.items()):
                print(f"  bucket {bk:>6}: TTFT_b {p.ttft_s * 1e3:8.3f} ms  TBT_b {p.tbt_s * 1e3:7.3f} ms  "
                      f"(l_in {p.input_len}, L {p.l1}/{p.l2}, spread {p.spread * 100:.1f}%)")
                prof_rows.append({"tp": tp, "batch": b, "bucket": bk, "ttft_s": p.ttft_s, "tbt_s": p.tbt_s,
                                  "input_len": p.input_len, "l1": p.l1, "l2": p.l2, "t1_s": p.t1_s, "t2_s": p.t2_s,
                                  "spread": p.spread})
            cand = Candidate(tp=tp, batch=b, ctx_buckets=buckets, tkg_buckets=buckets)
            table = UnitTable.build(cand, m.profiles, policy=args.policy, prefill=target.prefill)
            req = held_out_requests(rng, buckets, args.policy, args.batches * b, max_output=args.held_out_output,
                                    avoid=avoid)
            preds = {mode: predict(table, req, mode=mode) for mode in BATCHING}
            t0 = time.perf_counter()
            runs = [runner.run_workload(cand, req) for _ in range(args.runs)]
            e2e_all = np.stack([r.e2e_s for r in runs])
            ttft_all = np.stack([r.ttft_s for r in runs])
            e2e, ttft = np.median(e2e_all, axis=0), np.median(ttft_all, axis=0)
            noise = np.median(np.abs(e2e_all - e2e) / e2e, axis=0)
            print(f"  {len(req)} held-out requests x {args.runs} runs in {time.perf_counter() - t0:.1f} s "
                  f"(TTFT from: {', '.join(runner.last_ttft_sources)})")
            for i in range(len(req)):
                row = {"tp": tp, "batch": b, "input_len": int(req.input_len[i]), "output_len": int(req.output_len[i]),
                       "e2e_measured_s": float(e2e[i]), "ttft_measured_s": float(ttft[i]), "noise": float(noise[i])}
                for mode, pr in preds.items():
                    row[f"e2e_predicted_{mode}_s"] = float(pr.e2e_s[i])
                    row[f"ttft_predicted_{mode}_s"] = float(pr.ttft_s[i])
                    row[f"e2e_err_{mode}"] = float((pr.e2e_s[i] - e2e[i]) / e2e[i])
                    row[f"ttft_err_{mode}"] = float((pr.ttft_s[i] - ttft[i]) / ttft[i])
                rows.append(row)
    finally:
        runner.close()

    print()
    print(format_table(summarize(rows)))
    if skipped:
        print(f"\nskipped (time budget of {args.budget_s:.0f} s reached): {', '.join(skipped)}")
    print("\npaper, NPUs: mean 2.15%, median 1.69%, 89.9% under 5% (a GPU has no compiled buckets: see the docstring)")
    for rec in runner.engine_log:
        print(f"engine tp={rec.tp} batch={rec.batch}: started in {rec.compile_s:.1f} s")
    out_env = os.environ.get("OUT")
    csv_path = Path(args.csv) if args.csv else (Path(out_env) / "vllm_check.csv" if out_env else None)
    if csv_path is not None:
        write_csv(csv_path, rows)
        write_csv(csv_path.with_name(csv_path.stem + "_profiles.csv"), prof_rows)
        print(f"per-request rows written to {csv_path}")
    print(f"total wall time {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as exc:
        print(f"vllm_check: error: {exc}", file=sys.stderr)
        sys.exit(2)
