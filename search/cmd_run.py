"""``lensopt run SPACE`` and ``lensopt confirm RESULTS_DIR``."""
from __future__ import annotations

import sys

import pandas as pd

from spaces.schema import Budget, WorkloadSpec, flag_help

from .cli_common import add_cache_arg, add_space_arg, fmt_s, int_arg, print_json, table
from .selection import NEAR_DUPLICATE
from .study import DEFAULT_SAMPLER, SAMPLERS


def register(sub) -> None:
    p = sub.add_parser("run", help="search tp x batch x bucket sets; profile what is missing; confirm; report",
                       description="Search the space's deployments on LENS predictions, profiling only units missing "
                                   "from the cache, confirm the best on the hardware, and write results/<run>/.")
    add_space_arg(p)
    add_cache_arg(p)
    p.add_argument("--results", default="results", metavar="DIR", help="parent folder of the run folder (default results)")
    p.add_argument("--name", help="run folder name (default: the space file's name and a hash of its content and options)")
    p.add_argument("--ray-address", metavar="HOST:PORT", help="join this Ray cluster instead of starting a local one")
    p.add_argument("--workload", metavar="FILE|NAME", help="override the space's [workload]")
    p.add_argument("--requests", type=int_arg, help=flag_help(WorkloadSpec, "requests"))
    p.add_argument("--seed", type=int_arg, help=flag_help(WorkloadSpec, "seed"))
    p.add_argument("--trials", type=int_arg, help=flag_help(Budget, "trials"))
    p.add_argument("--sampler", default=DEFAULT_SAMPLER, choices=tuple(SAMPLERS),
                   help=f"Optuna sampler (default {DEFAULT_SAMPLER})")
    p.add_argument("--top", type=int_arg, dest="top_k", help=flag_help(Budget, "top_k"))
    p.add_argument("--no-confirm", action="store_true", help="skip the confirmation on the hardware")
    p.add_argument("--fresh", action="store_true", help="start the run over instead of resuming it")
    p.add_argument("--estimate-only", action="store_true",
                   help="no hardware at all: evaluate every candidate on the analytical GPU model (GPU targets)")
    p.add_argument("--profile-all", action="store_true",
                   help="profile every feasible unit up front (exhaustive; for small spaces or to fill a shared cache)")
    p.add_argument("--retry-failed", action="store_true",
                   help="measure again the units whose profiling failed for good (out of memory, refused), which the "
                        "cache remembers and searches otherwise skip (see `lensopt cache ls`)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print the front and run summary as JSON")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("confirm", help="rerun the hardware confirmation of a finished search",
                       description="Run the top-k Pareto candidates of RESULTS_DIR on the hardware again.")
    p.add_argument("run_dir", metavar="RESULTS_DIR", help="a results/<run> folder")
    p.add_argument("--top", type=int_arg, dest="top_k", help=flag_help(Budget, "top_k"))
    p.add_argument("--ray-address", metavar="HOST:PORT")
    add_cache_arg(p)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_confirm)


def _quiet(args):
    return (lambda msg: print(msg, file=sys.stderr)) if args.json else print


def _num(v) -> str:
    return "" if v is None or pd.isna(v) else f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def _cell(v) -> str:
    return "" if v is None or pd.isna(v) else fmt_s(v)


#: the front's columns under static batches, and under continuous serving (requests per second
#: at the operator's rate, what the SLOs judge, and the largest rate the unit sustains): the
#: metric, its header and how its cells read (a rate as a plain number, a latency in s or ms)
STATIC_COLUMNS = (("throughput_tok_s", "tok/s", _num), ("throughput_tok_s_per_chip", "tok/s/chip", _num),
                  ("ttft_p50_s", "TTFT p50", _cell), ("tpot_p50_s", "TPOT p50", _cell), ("e2e_p90_s", "E2E p90", _cell))
SERVING_COLUMNS = (("request_throughput_req_s_per_chip", "req/s/chip", _num),
                   ("goodput_req_s_per_chip", "goodput/chip", _num),
                   ("sustainable_rate_req_s_per_chip", "max rate/chip", _num), ("ttft_p90_s", "TTFT p90", _cell),
                   ("tpot_p90_s", "TPOT p90", _cell), ("e2e_p90_s", "E2E p90", _cell))


def _serving(ledger) -> bool:
    return ledger.target is not None and ledger.target.serving == "continuous"


def _confirm_columns(ledger, confirm: pd.DataFrame) -> tuple:
    """The confirmation's printed metrics: tok/s and E2E p90 under static batches; under continuous serving the
    front's own columns as confirmed at the workload's rate (search.confirm measures no sustainable rate: tok/s
    stands in when that is the throughput objective)."""
    tok, e2e = ("throughput_tok_s", "tok/s", _num), ("e2e_p90_s", "E2E p90", _cell)
    if not _serving(ledger):
        return tok, e2e
    have = [col for col in SERVING_COLUMNS if f"{col[0]}_predicted" in confirm]
    rates = [col for col in have if col[0].endswith("_req_s_per_chip")]
    return (*(rates or [tok]), *(col for col in have if col not in rates))


def _as_is_and_corrected(r: dict, as_is: str, corrected: str, spec: str) -> str:
    """A confirmation's error in column ``as_is`` and, when there is one, in ``corrected``: ``+11.5% / +2.0%``."""
    fixed = r.get(corrected)
    return f"{r[as_is]:{spec}}%" + ("" if fixed is None or pd.isna(fixed) else f" / {fixed:{spec}}%")


def _errs(r: dict, metric: str) -> str:
    """The error on ``metric``, as is and drift-corrected."""
    return _as_is_and_corrected(r, f"{metric}_err_%", f"{metric}_err_drift_corrected_%", "+.1f")


def _mape_cell(r: dict) -> str:
    """The per-request E2E error, as is and drift-corrected."""
    return _as_is_and_corrected(r, "e2e_request_mape_%", "e2e_request_mape_drift_corrected_%", ".1f")


def _verdict(r: dict) -> str:
    """``ok``, or ``FLAGGED`` with what was past the tolerance."""
    if not r["flagged"]:
        return "ok"
    why = r.get("flagged_on")
    return "FLAGGED" + (f": {why}" if isinstance(why, str) and why else "")


def print_front(res) -> None:
    f = res.front
    ledger = res.ledger
    sim = " (SIMULATED device)" if ledger.simulated else ""
    if ledger.estimate_only:
        sim = f" (ESTIMATES from the {ledger.estimator} model, nothing measured)"
    if f.empty:
        print("no Pareto front: no candidate predicted from measured profiles meets the constraints; see report.md")
    else:
        rows = []
        hidden = f["collapsed_into"].notna() if "collapsed_into" in f else pd.Series(False, index=f.index)
        cols = SERVING_COLUMNS if _serving(ledger) else STATIC_COLUMNS
        for r in f[~hidden].itertuples():
            d = r._asdict()
            rows.append([d["rank"], d["tp"], d["batch"], d["ctx_buckets"] if d["ctx_buckets"] == d["tkg_buckets"]
                         else f"ctx {d['ctx_buckets']} / tkg {d['tkg_buckets']}",
                         *(cell(d.get(k)) for k, _, cell in cols),
                         ("yes" + (" FLAGGED" if d.get("flagged") is True else "")) if d.get("confirmed") is True else ""])
        how = "estimated" if ledger.estimate_only else "predicted from measured profiles"
        if _serving(ledger):
            how += ", continuous batching at the workload's arrival rate"
        print(f"\nPareto front{sim}: throughput vs latency, {how}")
        print(table(rows, ["#", "tp", "batch", "buckets", *(h for _, h, _ in cols), "confirmed"]))
        if hidden.any():
            print(f"({int(hidden.sum())} more row(s) of the same tp and batch within {NEAR_DUPLICATE:.0%} on both "
                  f"objectives, with more buckets, are in pareto.csv, marked collapsed_into)")
    c = res.confirm
    if c is not None and len(c):
        print("\nconfirmation" + sim + ": predicted vs measured on the workload sample")
        cols = _confirm_columns(ledger, c)
        rows = []
        for r in c.to_dict("records"):
            if r.get("error") and isinstance(r.get("error"), str):
                rows.append([r["tp"], r["batch"], r["ctx_buckets"], "failed: " + r["error"], *[""] * len(cols)])
                continue
            rows.append([r["tp"], r["batch"], r["ctx_buckets"],
                         *(f"{cell(r[f'{m}_predicted'])} / {cell(r[f'{m}_measured'])} ({_errs(r, m)})"
                           for m, _, cell in cols),
                         _mape_cell(r), _verdict(r)])
        print(table(rows, ["tp", "batch", "buckets", *(f"{h} pred / meas (err as is / corrected)" for _, h, _ in cols),
                           "per-request E2E err (as is / corrected)", "verdict"]))
    print(f"\nunits: {len(ledger.units_measured)} measured this run, {len(ledger.units_reused)} reused; "
          f"profiling tasks this run: {ledger.profile_tasks_this_run}; hardware seconds{sim}: profiling "
          f"{ledger.profile_hardware_s:.1f}, confirmation {ledger.confirm_hardware_s:.1f}")
    names = ["report.md", "report.html", "pareto.csv", "trials.csv", "confirm.csv", "run.json", "deploy"]
    have = [n + ("/" if n == "deploy" else "") for n in names if (res.run_dir / n).exists()]
    print(f"results: {res.run_dir}/ ({', '.join(have)})")


def cmd_run(args) -> int:
    from .run import run

    if args.estimate_only:
        from .estimate import estimate_run

        res = estimate_run(args.space, results_dir=args.results, name=args.name, workload=args.workload,
                           requests=args.requests, seed=args.seed, log=_quiet(args))
        if args.json:
            print_json({"run_dir": str(res.run_dir), "front": res.front.to_dict("records"), "info": res.info})
        else:
            print_front(res)
        return 0
    try:
        res = run(args.space, results_dir=args.results, name=args.name, cache=args.cache, ray_address=args.ray_address,
                  workload=args.workload, requests=args.requests, seed=args.seed, trials=args.trials, sampler=args.sampler,
                  confirm=not args.no_confirm, top_k=args.top_k, fresh=args.fresh, profile_all=args.profile_all,
                  retry_failed=args.retry_failed,
                  progress=not args.no_progress and sys.stderr.isatty(), log=_quiet(args))
    except KeyboardInterrupt:
        print("lensopt: interrupted; every measured unit is in the cache and every trial in the run folder: "
              "rerun the same command to resume", file=sys.stderr)
        return 130
    if args.json:
        print_json({"run_dir": str(res.run_dir), "front": res.front.to_dict("records"),
                    "confirm": None if res.confirm is None else res.confirm.to_dict("records"), "info": res.info})
    else:
        print_front(res)
    return 0


def cmd_confirm(args) -> int:
    from .run import confirm_run

    res = confirm_run(args.run_dir, top_k=args.top_k, cache=args.cache, ray_address=args.ray_address,
                      progress=not args.no_progress and sys.stderr.isatty(), log=_quiet(args))
    if args.json:
        print_json({"run_dir": str(res.run_dir), "confirm": None if res.confirm is None else res.confirm.to_dict("records")})
    else:
        print_front(res)
    return 0
