#!/usr/bin/env python3
"""Real-accelerator check: LENS on the ``jax`` runner on an NVIDIA GPU (``--cpu``: this CPU).

Needs only numpy, JAX (with its CUDA plugin on a GPU host) and the project's source on
``PYTHONPATH`` (or run from the repository root): no pip install, no download, no optuna,
no ray.  For each case (bucket policy x batch size; in this order, while the time budget
lasts) it

1. profiles a Llama-3.2-1B-shaped decoder with random weights (bfloat16) through
   ``runners.jax_runner.JaxRunner``: one XLA graph per bucket, two probe runs per bucket
   (``lens.probes.plan_probes`` / ``solve``), and prints each bucket's TTFT_b and TBT_b
   beside AMALI's analytical estimate of the same shapes (``lens.amali``);
2. for each of two trace-shaped workloads (``azure_conv`` and ``arxiv_4k``, lengths
   scaled so 90% of the requests fit the largest bucket, the rest dropped), predicts the
   held-out requests with LENS, re-runs the cheapest probe of the buckets they use to
   measure host drift, then runs them and compares per-request E2E;
3. prints one table: per-request E2E error (mean, p90, share under 5%), host drift,
   compile and run seconds; and writes CSV rows to ``$OUT`` when it is set.

    python3 benchmarks/gpu/check.py                 # on the GPU host: about 6 minutes on an H200
    python3 benchmarks/gpu/check.py --cpu           # the same flow on this CPU with a small model
    python3 benchmarks/gpu/check.py --budget-s 120  # start no case after 120 s (the first always runs)

See benchmarks/gpu/README.md for what the figures mean.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT, Path(__file__).resolve().parent):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import numpy as np  # noqa: E402

from lens.errors import LensoptError, UserError  # noqa: E402
from lens.types import ModelShape  # noqa: E402

from gpu_check_tables import format_table, write_csv  # noqa: E402  (beside this script)

#: Llama-3.2-1B's shape (about 1.2 B parameters with its untied output layer)
LLAMA_1B = ModelShape(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=128256)
#: the CPU stand-in: the same architecture, small enough for a 2-core machine
CPU_MODEL = ModelShape(layers=2, hidden=128, heads=4, kv_heads=2, intermediate=256, vocab=512)
WORKLOADS = ("azure_conv", "arxiv_4k")
POLICIES = ("exclusive", "inclusive")


@dataclass(frozen=True)
class Setup:
    """What one run of the check measures (GPU or CPU defaults, overridden by flags)."""

    device: str
    model: ModelShape
    dtype: str
    buckets: tuple[int, ...]
    batches: tuple[int, ...]
    requests: int
    repeats: int
    max_output: int
    runs: int


GPU_SETUP = Setup("gpu", LLAMA_1B, "bfloat16", (128, 256, 512, 1024, 2048), (1, 8), requests=32, repeats=3,
                  max_output=128, runs=2)
CPU_SETUP = Setup("cpu", CPU_MODEL, "float32", (32, 64, 128, 256), (1, 4), requests=8, repeats=3, max_output=32,
                  runs=1)


def prepare_environment(device: str) -> None:
    """XLA settings that must be in place before JAX starts."""
    if device == "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"
    else:
        # allocate on demand: the working set is a few GiB, and a GPU shared with another
        # process must not be claimed whole (the default takes 75%); the allocator keeps
        # what it got, so timed runs after the warm-up do not allocate
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # every compile is real: the compile seconds are part of what the check reports
    os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"


def fitted_workload(name: str, n: int, top: int, seed: int):
    """``n`` requests of a built-in workload scaled so 90% fit ``top`` tokens, the rest dropped."""
    from lens import distributions
    from lens.workload import fit_to, scale_lengths

    pilot = distributions.sample(name, 4000, seed)
    total = pilot.input_len + pilot.output_len - 1
    factor = min(1.0, top / float(np.percentile(total, 90)))
    drawn = scale_lengths(distributions.sample(name, 8 * n + 64, seed + 1), factor)
    kept, _ = fit_to(drawn, top)
    if len(kept) < n:
        raise UserError(f"workload {name}: only {len(kept)} of {len(drawn)} requests fit {top} tokens")
    return kept.head(n), factor


def error_stats(pred: np.ndarray, meas: np.ndarray) -> dict[str, float]:
    """Absolute per-request errors in percent: mean, p90 and the share under 5%."""
    a = np.abs((np.asarray(pred) - np.asarray(meas)) / np.asarray(meas)) * 100
    return {"mean": float(a.mean()), "p90": float(np.percentile(a, 90)), "under5": float((a < 5).mean() * 100)}


def cheapest_probe(runs, buckets: Sequence[int], used: set[int]):
    """The probe run with the smallest median among those of the buckets in ``used``."""
    cands = [r for r in runs if r.probe.bucket in used]
    return min(cands or runs, key=lambda r: r.median_s)


def amali_rows(setup: Setup, batch: int, profiles, gpu: str | None) -> list[dict]:
    """AMALI's TTFT_b / TBT_b beside the measured ones (errors only when measured on that GPU)."""
    from lens.amali import estimate_unit

    est = estimate_unit(model=setup.model, gpu=gpu or "H200-SXM", tp=1, batch=batch, buckets=setup.buckets,
                        dtype=setup.dtype)
    rows = []
    for b in setup.buckets:
        m, e = profiles[b], est[b]
        comparable = setup.device == "gpu" and gpu is not None
        rows.append({
            "bucket": b, "ttft_ms": m.ttft_s * 1e3, "amali_ttft_ms": e.ttft_s * 1e3,
            "ttft_err_%": (e.ttft_s - m.ttft_s) / m.ttft_s * 100 if comparable else float("nan"),
            "tbt_ms": m.tbt_s * 1e3, "amali_tbt_ms": e.tbt_s * 1e3,
            "tbt_err_%": (e.tbt_s - m.tbt_s) / m.tbt_s * 100 if comparable else float("nan"),
        })
    return rows


def profile_case(runner, unit, setup: Setup, policy: str):
    """Profile every bucket; a bucket whose runs cannot be solved is measured once more, repeats doubled."""
    from lens.probes import plan_probes, solve

    probes = plan_probes(setup.buckets, policy=policy, max_output=setup.max_output, repeats=setup.repeats)
    res = runner.profile(unit, probes)
    try:
        return res, solve(res.runs, batch=unit.batch)
    except LensoptError as exc:
        print(f"  re-measuring with {2 * setup.repeats} repeats: {exc}")
        res = runner.profile(unit, [replace(p, repeats=2 * setup.repeats) for p in probes])
        return res, solve(res.runs, batch=unit.batch)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="run on this machine's CPU with a small model")
    ap.add_argument("--budget-s", type=float, default=270.0,
                    help="start no case (or workload) that would end past this many seconds; the first case "
                         "always runs (default 270: the whole run stays within 6 minutes on an H200)")
    ap.add_argument("--requests", type=int, help="held-out requests per workload (default 32 on a GPU, 8 on the CPU)")
    ap.add_argument("--runs", type=int, help="runs of the held-out requests, medians compared (default 2 / 1)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)

    setup = CPU_SETUP if args.cpu else GPU_SETUP
    setup = replace(setup, requests=args.requests or setup.requests, runs=args.runs or setup.runs)
    if setup.requests < 1 or setup.runs < 1:
        raise UserError("--requests and --runs must be at least 1")
    prepare_environment(setup.device)
    t_start = time.perf_counter()
    import jax

    try:
        jax.config.update("jax_enable_compilation_cache", False)
    except (AttributeError, KeyError) as exc:  # an older or newer JAX without the option: the env var stands
        print(f"note: jax_enable_compilation_cache not set ({exc}); JAX_ENABLE_COMPILATION_CACHE=false is")
    backend = jax.default_backend()
    if setup.device == "gpu" and backend != "gpu":
        raise UserError(f"JAX sees no GPU here (backend {backend!r}, devices {jax.devices()}): run it on the GPU host "
                        f"with JAX's CUDA plugin, or use --cpu for the CPU check")
    from lens.amali import is_known_gpu
    from lens.compose import UnitTable, predict
    from lens.buckets import select_index
    from lens.types import Candidate, Target, Unit
    from runners.jax_runner import JaxRunner

    dev = jax.devices()[0]
    gpu = dev.device_kind if setup.device == "gpu" and is_known_gpu(dev.device_kind) else None
    print(f"LENS check on {backend} ({dev.device_kind}; jax {jax.__version__}): Llama shape {setup.model.to_dict()}, "
          f"{setup.dtype}, random weights, buckets {list(setup.buckets)}, batches {list(setup.batches)}, "
          f"{setup.requests} held-out requests per workload x {setup.runs} run(s)")
    if setup.device == "gpu" and gpu is None:
        print(f"AMALI has no spec for {dev.device_kind!r}: its estimates below are for the H200 and not compared")

    rows: list[dict] = []
    amali: list[dict] = []
    skipped: list[str] = []
    last_case_s = 0.0
    cases = [(p, b) for p in POLICIES for b in setup.batches]
    base = Target(name=f"check-{setup.device}", runner="jax", hardware=setup.device, bucket_policy=POLICIES[0],
                  dtype=setup.dtype, model=setup.model, seed=args.seed)
    runner = JaxRunner(base)
    try:
        for k, (policy, batch) in enumerate(cases):
            elapsed = time.perf_counter() - t_start
            if k and elapsed + last_case_s > args.budget_s:
                skipped.append(f"{policy} b{batch}")
                continue
            # A policy only chooses which compiled graph a length runs in (the jax runner reads
            # it per call), so one runner serves both and each (batch, bucket) graph compiles
            # once: the second policy's cases report 0 compile seconds.
            runner.target = replace(base, bucket_policy=policy)
            t_case = time.perf_counter()
            unit = Unit(runner.target, 1, batch)
            res, profiles = profile_case(runner, unit, setup, policy)
            print(f"\n{policy} policy, batch {batch}: {len(setup.buckets)} prefill + {len(setup.buckets)} decode graphs "
                  f"compiled in {res.compile_s:.1f} s (0: compiled for the other policy), profiled in {res.run_s:.1f} s")
            for r in amali_rows(setup, batch, profiles, gpu):
                amali.append({"policy": policy, "batch": batch, **r})
            cand = Candidate(1, batch, setup.buckets, setup.buckets)
            table = UnitTable.build(cand, profiles, policy=policy)
            for j, name in enumerate(WORKLOADS):
                if k and j and time.perf_counter() - t_start > args.budget_s:
                    skipped.append(f"{policy} b{batch} {name}")
                    continue
                req, factor = fitted_workload(name, setup.requests, setup.buckets[-1], args.seed + j)
                pred = predict(table, req, mode="static")
                used = {setup.buckets[i] for i in select_index(req.input_len, setup.buckets, policy)}
                ref = cheapest_probe(res.runs, setup.buckets, used)
                again = runner.profile(unit, [replace(ref.probe, repeats=max(setup.repeats, 5))])
                drift = again.runs[0].median_s / ref.median_s
                t0 = time.perf_counter()
                runs = [runner.run_workload(cand, req) for _ in range(setup.runs)]
                e2e = np.median(np.stack([r.e2e_s for r in runs]), axis=0)
                ttft = np.median(np.stack([r.ttft_s for r in runs]), axis=0)
                st, tt = error_stats(pred.e2e_s, e2e), error_stats(pred.ttft_s, ttft)
                rows.append({
                    "policy": policy, "batch": batch, "workload": name, "scale": round(factor, 3),
                    "requests": len(req), "E2E err mean %": st["mean"], "E2E err p90 %": st["p90"],
                    "E2E <5% share": st["under5"], "TTFT err mean %": tt["mean"],
                    "bias %": float(np.mean((pred.e2e_s - e2e) / e2e) * 100), "drift": drift,
                    "compile s": res.compile_s, "run s": res.run_s + again.run_s + sum(r.run_s for r in runs),
                    "measure wall s": time.perf_counter() - t0,
                })
            last_case_s = time.perf_counter() - t_case
    finally:
        runner.close()

    print("\nper-request E2E error of LENS vs the measured runs (drift: reference probe now / at profiling)")
    print(format_table(rows, ["policy", "batch", "workload", "requests", "E2E err mean %", "E2E err p90 %",
                              "E2E <5% share", "TTFT err mean %", "bias %", "drift", "compile s", "run s"]))
    where = "measured on this GPU" if gpu else "H200-SXM spec, not comparable to this device"
    print(f"\nAMALI's analytical TTFT_b / TBT_b ({where}) beside the measured ones")
    print(format_table(amali, ["policy", "batch", "bucket", "ttft_ms", "amali_ttft_ms", "ttft_err_%", "tbt_ms",
                               "amali_tbt_ms", "tbt_err_%"]))
    if skipped:
        print(f"\nskipped (time budget of {args.budget_s:.0f} s): {', '.join(skipped)}")
    print("paper, NPUs: mean 2.15%, 89.9% of cases under 5%")
    out = os.environ.get("OUT")
    if out:
        write_csv(Path(out) / "check.csv", rows)
        write_csv(Path(out) / "check_amali.csv", amali)
        print(f"rows written to {out}/check.csv and {out}/check_amali.csv")
    print(f"total wall time {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as exc:
        print(f"check: error: {exc}", file=sys.stderr)
        sys.exit(2)
