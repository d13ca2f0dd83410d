"""Search economy: lensopt's search vs exhaustive profiling, on SIMULATED NPUs.

For each case (simulated device x workload x workload seed):

- *search*: ``search.run.run`` with a fresh temporary profile cache and results folder, the
  space's own settings (``[budget] trials`` and ``stop_gain``), local Ray, no
  confirmation. Its hardware seconds are the simulated compile + run seconds of the
  profiling tasks it dispatched (a re-opened unit pays its compile again).
- *exhaustive*: every (tp, batch) unit of the space profiled with every bucket by
  ``search.profiler.measure_unit`` (a unit that does not fit device memory fails at once
  and costs nothing), then every candidate of ``search.encoding.all_candidates`` evaluated
  by ``search.evaluate.Evaluator`` on those profiles; its Pareto front is the *true* front.

Both fronts are scored on the simulator's measured numbers: the search's front candidates
are re-evaluated on the exhaustive profiles, so a profile the search measured does not
grade itself. Hypervolume with the reference point (throughput 0, latency = 1.1 x the
largest latency on the true front) in the space's objectives. Workloads: cnn_dailymail
(short output), arxiv (long input), writing_prompts (long output).

Last, the search loop's speed on cached profiles: the same search again on its warm cache
(it profiles nothing), trials per second of the whole loop, the profiling choice
included, repeated; median and spread.

    .venv/bin/python benchmarks/eval_search_economy.py [--quick] [--out DIR]
"""
from __future__ import annotations

import argparse
import dataclasses
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

from lens.errors import LensoptError  # noqa: E402
from lens.types import Candidate, Unit  # noqa: E402
from runners import get_runner  # noqa: E402
from search.encoding import all_candidates  # noqa: E402
from search.evaluate import Evaluator  # noqa: E402
from search.pareto import hypervolume, pareto_mask  # noqa: E402
from search.profiler import measure_unit  # noqa: E402
from search.run import run  # noqa: E402
from spaces import Space, load_requests, load_space  # noqa: E402

GOAL_HV, GOAL_COST = 0.99, 0.20
SPACES = ("sim-inf2", "sim-tpu-v6e", "sim-trn1")
#: short output, long input, long output
WORKLOADS = ("cnn_dailymail", "arxiv", "writing_prompts")


@dataclasses.dataclass
class Exhaustive:
    hardware_s: float
    units: int
    units_failed: int
    profiles: dict
    failed: dict


def profile_all(sp: Space) -> Exhaustive:
    """Every unit of the space measured once (independent of the workload)."""
    runner = get_runner(sp.target)
    b = sp.search.buckets
    hw, prof, failed = 0.0, {}, {}
    for tp in sp.search.tp:
        for batch in sp.search.batch:
            try:
                runner.check_unit(Unit(sp.target, tp, batch))
                m = measure_unit(sp.target, tp=tp, batch=batch, buckets=b, all_buckets=b, profile=sp.profile,
                                 runner=runner)
            except LensoptError as exc:  # e.g. the simulated OOM: fails before compiling, costs nothing
                failed[(tp, batch)] = str(exc)
                continue
            hw += m.hardware_s
            prof[(tp, batch)] = m.profiles
    return Exhaustive(hw, len(prof) + len(failed), len(failed), prof, failed)


def evaluator(sp: Space, reqs, ex: Exhaustive) -> Evaluator:
    ev = Evaluator(sp, reqs)
    for unit, p in ex.profiles.items():
        ev.set_measured(unit, p)
    for unit, why in ex.failed.items():
        ev.set_failed(unit, why)
    return ev


def true_front(sp: Space, ev: Evaluator) -> tuple[list[Candidate], np.ndarray, int]:
    cands, vals = [], []
    n = 0
    for c in all_candidates(sp.search):
        n += 1
        e = ev.evaluate(c)
        if e.infeasible or not e.metrics or not e.meets_slo(sp):
            continue
        cands.append(c)
        vals.append(e.values(sp))
    v = np.asarray(vals)
    mask = pareto_mask(v[:, 0], v[:, 1])
    return [c for c, m in zip(cands, mask) if m], v[mask], n


def floor_s(sp: Space, ev: Evaluator, tf: list[Candidate]) -> float:
    """Hardware seconds of profiling only the true front's units, each once with only the
    buckets its front candidates run in: what even a search that knew the front in advance
    would pay (measured on the simulator, a fresh runner per task as a Ray task has)."""
    need: dict[tuple[int, int], set[int]] = {}
    for c in tf:
        need.setdefault((c.tp, c.batch), set()).update(ev.used(c))
    total = 0.0
    for (tp, batch), buckets in need.items():
        m = measure_unit(sp.target, tp=tp, batch=batch, buckets=sorted(buckets), all_buckets=sp.search.buckets,
                         profile=sp.profile, runner=get_runner(sp.target))
        total += m.hardware_s
    return total


def front_candidates(front: pd.DataFrame) -> list[Candidate]:
    out = []
    for _, r in front.iterrows():
        ctx = tuple(int(x) for x in str(r["ctx_buckets"]).split())
        tkg = tuple(int(x) for x in str(r["tkg_buckets"]).split())
        out.append(Candidate(int(r["tp"]), int(r["batch"]), ctx, tkg))
    return out


def one_search(sp: Space, *, workload: str, requests: int, seed: int, ex: Exhaustive, ev: Evaluator,
               tf: list[Candidate], tv: np.ndarray, label: str, tmp: Path, floor: float) -> dict:
    t0 = time.perf_counter()
    res = run(sp, results_dir=tmp / "results", cache=tmp / "profiles.sqlite", workload=workload,
              requests=requests, seed=seed, confirm=False, progress=False, log=lambda s: None, fresh=True)
    wall = time.perf_counter() - t0
    found = front_candidates(res.front)
    fv = np.asarray([ev.evaluate(c).values(sp) for c in found]) if found else np.zeros((0, 2))
    ref_lat = 1.1 * float(tv[:, 1].max())
    hv_true = hypervolume(tv[:, 0], tv[:, 1], ref_latency=ref_lat)
    hv_found = hypervolume(fv[:, 0], fv[:, 1], ref_latency=ref_lat) if len(fv) else 0.0
    true_set = set(tf)
    # what the search's own units could give if every bucket set of them were evaluated
    units = {tuple(u) for u in res.info["units_measured"]} | {tuple(u) for u in res.info["units_reused"]}
    uv = [ev.evaluate(c) for c in all_candidates(sp.search) if (c.tp, c.batch) in units]
    uv = np.asarray([e.values(sp) for e in uv if e.metrics and not e.infeasible and e.meets_slo(sp)])
    hv_units = hypervolume(uv[:, 0], uv[:, 1], ref_latency=ref_lat) if len(uv) else 0.0
    hw = float(res.info["profile_hardware_s"]) + float(res.info.get("confirm_hardware_s", 0.0))
    return {
        "space": sp.path.stem, "search": label, "workload": workload, "seed": seed, "simulated": True,
        "search_hw_s": hw, "exhaustive_hw_s": ex.hardware_s, "hw_share_%": hw / ex.hardware_s * 100,
        "floor_%": floor / ex.hardware_s * 100,
        "units_profiled": len(res.info["units_measured"]), "units_total": ex.units,
        "tasks": int(res.info["profile_tasks_this_run"]), "stop": res.info.get("profile_stop", ""),
        "hv_ratio_%": hv_found / hv_true * 100 if hv_true > 0 else float("nan"),
        "hv_units_all_sets_%": hv_units / hv_true * 100 if hv_true > 0 else float("nan"),
        "found_on_true_front": sum(c in true_set for c in found), "search_front": len(found), "true_front": len(tf),
        "true_front_units_missed": " ".join(f"tp{t}xb{b}" for t, b in sorted({(c.tp, c.batch) for c in tf} - units)),
        "trials": int(res.info["trials"]), "search_wall_s": wall,
    }


def loop_speed(sp: Space, *, workload: str, requests: int, seed: int, tmp: Path, repeats: int) -> list[float]:
    """Trials per second of whole searches on the warm cache in ``tmp`` (nothing left to profile)."""
    rates = []
    for i in range(repeats):
        t0 = time.perf_counter()
        res = run(sp, results_dir=tmp / f"speed{i}", cache=tmp / "profiles.sqlite", workload=workload,
                  requests=requests, seed=seed, confirm=False, progress=False, log=lambda s: None, fresh=True)
        wall = time.perf_counter() - t0
        if res.info["profile_tasks_this_run"]:
            raise SystemExit("the warm-cache search profiled: its speed is not the loop's")
        rates.append(int(res.info["trials"]) / wall)
    return rates


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="two cases only")
    ap.add_argument("--stop-gain", type=float, help="[budget] stop_gain for every search (default: the space's)")
    ap.add_argument("--case", action="append", help="SPACE:WORKLOAD, e.g. sim-inf2:arxiv (repeatable; replaces the set)")
    ap.add_argument("--capped", action="store_true", help="also a search capped at profile_s = 20%% of exhaustive")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench"), help="folder for the CSV file")
    ap.add_argument("--requests", type=int, default=200, help="workload sample per search (default 200)")
    ap.add_argument("--seeds", type=int, default=1, help="workload seeds per case (default 1)")
    ap.add_argument("--speed-repeats", type=int, default=3, help="warm-cache searches timed (default 3)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = lambda s: print(s, flush=True)  # noqa: E731
    t_start = time.perf_counter()

    if args.case:
        cases = [tuple(c.split(":", 1)) for c in args.case]
    elif args.quick:
        cases = [("sim-inf2", "cnn_dailymail"), ("sim-tpu-v6e", "writing_prompts")]
    else:
        cases = [(s, w) for s in SPACES for w in WORKLOADS]
    seeds = tuple(range(args.seeds))

    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # address="local": always a private cluster, never one another process on this host started
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, logging_level=logging.ERROR,
             log_to_driver=False)
    log(f"search economy on SIMULATED NPUs (runner sim): {len(cases)} space x workload cases x {len(seeds)} workload "
        f"seed(s), {args.requests} requests each; Ray started once ({time.perf_counter() - t_start:.1f} s)")
    rows, rates = [], []
    try:
        exhaustive: dict[str, Exhaustive] = {}
        for space_name, wl in cases:
            sp = load_space(ROOT / "spaces" / f"{space_name}.toml")
            if args.stop_gain is not None:
                sp = dataclasses.replace(sp, budget=dataclasses.replace(sp.budget, stop_gain=args.stop_gain))
            if space_name not in exhaustive:
                t0 = time.perf_counter()
                exhaustive[space_name] = profile_all(sp)
                ex = exhaustive[space_name]
                log(f"  {space_name}: exhaustive profiling of {ex.units} units ({ex.units_failed} do not fit memory): "
                    f"{ex.hardware_s:.0f} SIMULATED hardware-s ({time.perf_counter() - t0:.1f} s wall)")
            ex = exhaustive[space_name]
            for seed in seeds:
                reqs, _ = load_requests(sp, workload=wl, requests=args.requests, seed=seed)
                ev = evaluator(sp, reqs, ex)
                t0 = time.perf_counter()
                tf, tv, n_cand = true_front(sp, ev)
                t_eval = time.perf_counter() - t0
                floor = floor_s(sp, ev, tf)
                variants = [("default", sp)]
                if args.capped:
                    capped = dataclasses.replace(sp, budget=dataclasses.replace(sp.budget, profile_s=GOAL_COST * ex.hardware_s))
                    variants.append((f"capped {GOAL_COST:.0%}", capped))
                for label, s in variants:
                    with tempfile.TemporaryDirectory(prefix="lensopt-bench-") as tmp:
                        r = one_search(s, workload=wl, requests=args.requests, seed=seed, ex=ex, ev=ev, tf=tf, tv=tv,
                                       label=label, tmp=Path(tmp), floor=floor)
                        if not rates and args.speed_repeats > 0:
                            rates = loop_speed(s, workload=wl, requests=args.requests, seed=seed, tmp=Path(tmp),
                                               repeats=args.speed_repeats)
                            speed_case = f"{space_name} {wl}, {args.requests} requests, {r['trials']} trials"
                    r.update({"candidates": n_cand, "exhaustive_eval_wall_s": t_eval})
                    rows.append(r)
                    log(f"  {space_name} {wl} seed {seed} [{label}]: HV {r['hv_ratio_%']:.2f}% at "
                        f"{r['hw_share_%']:.1f}% of exhaustive SIMULATED hardware-s (true front alone: {r['floor_%']:.1f}%; "
                        f"{r['tasks']} tasks on "
                        f"{r['units_profiled']}/{r['units_total']} units); true-front units not profiled: "
                        f"{r['true_front_units_missed'] or 'none'}; stop: {r['stop']}; {r['search_wall_s']:.1f} s wall")
    finally:
        ray.shutdown()

    df = pd.DataFrame(rows)
    df.to_csv(out / "search_economy.csv", index=False)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 30)
    fmt = lambda x: f"{x:.2f}"  # noqa: E731
    cols = ["space", "workload", "seed", "search", "search_hw_s", "exhaustive_hw_s", "hw_share_%", "floor_%", "tasks",
            "units_profiled", "units_total", "hv_ratio_%", "hv_units_all_sets_%", "found_on_true_front", "search_front", "true_front", "candidates"]
    log("\nSearch vs exhaustive -- SIMULATED hardware seconds (compile + run); hypervolume of the search's front / the "
        "true front, both on the exhaustive profiles")
    log(df[cols].to_string(index=False, float_format=fmt))
    log("  floor_% = hardware-s of profiling only the true front's units with only the buckets its candidates run in, "
        "one task each, over exhaustive: what a search that knew the whole front in advance would pay for all of it "
        "(99% of its hypervolume may cost less)")
    log("  hv_units_all_sets_% = hypervolume of the front of *every* bucket set of the units the search profiled "
        "(what the search could reach with the hardware it spent)")

    log("\nsummary per search variant (median [min-max] over cases and seeds), SIMULATED:")
    for label, g in df.groupby("search", sort=False):
        hv, cost = g["hv_ratio_%"].to_numpy(), g["hw_share_%"].to_numpy()
        met = ((hv >= GOAL_HV * 100) & (cost <= GOAL_COST * 100)).sum()
        log(f"  {label:12s} HV {np.median(hv):.2f}% [{hv.min():.2f}-{hv.max():.2f}], hardware-s share "
            f"{np.median(cost):.1f}% [{cost.min():.1f}-{cost.max():.1f}]; goal (HV >= {GOAL_HV:.0%} at <= {GOAL_COST:.0%} "
            f"of exhaustive) met in {met}/{len(g)} runs")
    worst = df.loc[df["hv_ratio_%"].idxmin()] if len(df) else None
    if worst is not None:
        log(f"  worst HV: {worst['space']} {worst['workload']} seed {worst['seed']} [{worst['search']}] "
            f"{worst['hv_ratio_%']:.2f}%; worst hardware share: {df['hw_share_%'].max():.1f}%")
    miss = df[(df["hv_ratio_%"] < GOAL_HV * 100) | (df["hw_share_%"] > GOAL_COST * 100)]
    for _, m in miss.iterrows():
        log(f"  misses the goal: {m['space']} {m['workload']} seed {m['seed']} [{m['search']}]: HV {m['hv_ratio_%']:.2f}% "
            f"at {m['hw_share_%']:.1f}%")
    if rates:
        md = float(np.median(rates))
        log(f"\nsearch loop on cached profiles ({speed_case}; nothing to profile; the profiling choice included): "
            f"{md:.1f} trials/s median [{min(rates):.1f}-{max(rates):.1f}] over {len(rates)} runs (whole run(): "
            f"study, selection, result files)")
    log(f"table: {out / 'search_economy.csv'}; {time.perf_counter() - t_start:.0f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
