"""``lensopt profile | predict | measure``: one unit, by hand."""
from __future__ import annotations

import dataclasses
import shlex
import sys
import time

import numpy as np

from lens import methods
from lens.capacity import max_sustainable_rate
from lens.compose import UnitTable, predict
from lens.drift import REFERENCE_ONLY, REPROFILED, RESCALED, SIDE_BY_SIDE
from lens.errors import MissingProfiles
from lens.metrics import summarize, summarize_prediction, tpot_of
from lens.noise import median_se
from lens.serving import predict_serving
from lens.serving_metrics import median_summary, summarize_serving, summarize_serving_prediction, summarized_band
from runners import get_runner
from spaces import ProfileSettings
from spaces.schema import check, flag_help
from store import ProfileCache, resolve_cache_path

from .cli_common import (
    add_cache_arg, add_request_args, add_space_arg, add_unit_args, candidate_from_args, fmt_s, int_arg, int_list,
    mode_of, print_json, requests_for, space_and_unit, table,
)
from .cli_serving import (add_serving_args, band_said, capacity_of, check_serving_args, print_capacity, print_serving,
                          request_slo, with_arrivals)
from .cmd_cache import rm_unit_argv
from .drift_check import DriftCheck, DriftOutcome, checked
from .passes import (BUDGET_S, LEAST, MOST, TARGET, Passes, choose, noise_line, pass_intervals, pass_spread_line,
                     pass_spreads, repeats_arg)
from .profiler import check_subset, profile_missing


def register(sub) -> None:
    p = sub.add_parser("profile", help="measure the missing bucket profiles of one unit (tp, batch)",
                       description="Profile the buckets of one unit that the cache lacks: two end-to-end runs per bucket.")
    add_space_arg(p)
    add_unit_args(p, buckets_required=False)
    add_cache_arg(p)
    p.add_argument("--repeats", type=int_arg, help=flag_help(ProfileSettings, "repeats"))
    p.add_argument("--retry-failed", action="store_true",
                   help="measure the unit even if the cache remembers that it failed for good (out of memory, refused)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("predict", help="predict TTFT/TPOT/E2E of requests from cached profiles",
                       description="Predict request latencies with LENS from the cached bucket profiles of one unit.")
    add_space_arg(p)
    add_unit_args(p, buckets_required=True)
    add_request_args(p)
    add_serving_args(p)
    add_cache_arg(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("measure", help="run requests end to end on the runner (to check a prediction)",
                       description="Run the same requests on the target's runner and report measured TTFT/TPOT/E2E.")
    add_space_arg(p)
    add_unit_args(p, buckets_required=True)
    add_request_args(p)
    add_serving_args(p)
    add_cache_arg(p)
    p.add_argument("--repeats", type=repeats_arg, default="auto",
                   help="passes of the requests, each request's median reported; auto (default): as many as the "
                        f"host's jitter now asks for medians within {TARGET * 100:.0f}%%, {LEAST} to {MOST}, within "
                        f"{BUDGET_S:.0f} predicted s (search/passes.py)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_measure)


def _pm(value: float, err: float) -> str:
    rel = f" +-{err / value:.1%}" if value > 0 and err > 0 else ""
    return fmt_s(value) + rel


def _profiles_line(profiles, cost: dict) -> list[list[str]]:
    return [[b, p.source, _pm(p.ttft_s, p.ttft_err_s), _pm(p.tbt_s, p.tbt_err_s), f"{p.l1}/{p.l2}", p.repeats,
             f"{cost[b]:.2f} s" if b in cost else "-", "yes" if p.accepted else "NO"]
            for b, p in sorted(profiles.items())]


def cmd_profile(args) -> int:
    space, tp, batch = space_and_unit(args)
    buckets = int_list(args.buckets, flag="--buckets") if args.buckets else space.search.buckets
    check_subset(buckets, space.search.buckets, space.path)
    settings = space.profile
    if args.repeats is not None:
        why = check(ProfileSettings, "repeats", args.repeats)
        if why:
            from lens.errors import UserError

            raise UserError(f"--repeats {args.repeats} {why}")
        settings = dataclasses.replace(settings, repeats=args.repeats)
    runner = get_runner(space.target)
    fp = runner.fingerprint()
    with ProfileCache.open(resolve_cache_path(args.cache)) as cache:
        out = profile_missing(
            cache=cache, runner=runner, fingerprint=fp, tp=tp, batch=batch, buckets=sorted(buckets),
            all_buckets=space.search.buckets, profile=settings, log=lambda msg: print(msg, file=sys.stderr),
            retry_failed=args.retry_failed,
        )
        profiles = {b: p for b, p in cache.get_unit(fp, tp, batch).items() if b in buckets}
    if out.reused:  # measured before: maybe by an older way of measuring the host costs
        _note_outdated(args, space, tp, batch, fp, profiles, serving=space.target.serving == "continuous")
    sim = " (SIMULATED device)" if out.simulated or runner.simulated else ""
    if args.json:
        print_json({
            "fingerprint": fp, "tp": tp, "batch": batch, "measured": out.measured, "reused": out.reused,
            "compile_s": out.compile_s, "run_s": out.run_s, "hardware_s": out.compile_s + out.run_s,
            "simulated": bool(sim),
            "profiles": {str(b): {"ttft_s": p.ttft_s, "tbt_s": p.tbt_s, "ttft_err_s": p.ttft_err_s,
                                  "tbt_err_s": p.tbt_err_s, "excess": p.excess, "accepted": p.accepted,
                                  "l1": p.l1, "l2": p.l2, "repeats": p.repeats, "spread": p.spread,
                                  "source": p.source, "run_s": out.bucket_s.get(b), "row_s": p.row_s,
                                  "admit_first_s": p.admit_first_s, "admit_next_s": p.admit_next_s,
                                  "kv_token_s": p.kv_token_s, "row_context": p.row_context,
                                  "resume_s": p.resume_s, "admit_busy_s": p.admit_busy_s,
                                  "resume_idle": [list(x) for x in p.resume_idle],
                                  "resume_busy": [list(x) for x in p.resume_busy],
                                  "prefill_tail": list(p.prefill_tail),
                                  "prefill_tail_median_s": p.prefill_tail_median_s,
                                  "decode_pace": list(p.decode_pace),
                                  "decode_pace_window_s": p.decode_pace_window_s,
                                  "decode_pace_tau_s": p.decode_pace_tau_s,
                                  "host_costs_method": p.host_costs_method}
                         for b, p in profiles.items()},
            "row_cost": None if out.rows is None else {
                "row_s": out.rows.value, "err_s": out.rows.err, "raw_s": out.rows.raw, "note": out.rows.note,
                "run_s": out.rows_s},
            "admission": None if out.admission is None else {
                "first_s": out.admission.first_s, "next_s": out.admission.next_s,
                "first_err_s": out.admission.first_err_s, "next_err_s": out.admission.next_err_s,
                "raw_first_s": out.admission.raw_first_s, "raw_next_s": out.admission.raw_next_s,
                "busy_s": out.admission.busy_s, "busy_err_s": out.admission.busy_err_s,
                "raw_busy_s": out.admission.raw_busy_s, "busy_measured": out.admission.busy_measured,
                "burst": out.admission.burst, "note": out.admission.note, "run_s": out.admission_s},
            "context_cost": None if out.context is None else {
                "kv_token_s": out.context.value, "err_s": out.context.err, "raw_s": out.context.raw,
                "bucket": out.context.bucket, "short_len": out.context.short_len, "long_len": out.context.long_len,
                "note": out.context.note, "run_s": out.context_s},
            "resume_cost": None if out.resume is None else {
                "resume_s": out.resume.value, "err_s": out.resume.err, "raw_s": out.resume.raw,
                "bucket": out.resume.bucket, "prompt": out.resume.prompt, "step_s": out.resume.step_s,
                "by_idle": [{"idle_s": i, "resume_s": c} for i, c in out.resume.by_idle],
                "note": out.resume.note, "run_s": out.resume_s},
            "busy_resume_cost": None if out.busy_resume is None else {
                "ratio": out.busy_resume.ratio, "err": out.busy_resume.err, "raw": out.busy_resume.raw,
                "bucket": out.busy_resume.bucket, "step_s": out.busy_resume.step_s,
                "levels": [{"bucket": lv.bucket, "prompt": lv.prompt, "pass_s": lv.pass_s, "measured_s": lv.measured,
                            "err_s": lv.err} for lv in out.busy_resume.levels],
                "by_pass": [{"pass_s": x, "resume_s": c} for x, c in out.busy_resume.by_pass],
                "note": out.busy_resume.note, "run_s": out.busy_resume_s},
            "prefill_tail": None if out.tail is None else {
                "quantiles_s": list(out.tail.quantiles), "requests": out.tail.n, "median_s": out.tail.median_s,
                "bucket": out.tail.bucket, "note": out.tail.note, "run_s": out.tail_s},
            "decode_pace": None if out.pace is None else {
                "quantiles": list(out.pace.quantiles), "window_s": out.pace.window_s, "tau_s": out.pace.tau_s,
                "requests": out.pace.n, "rho": out.pace.rho, "spacing_s": out.pace.spacing_s,
                "bucket": out.pace.bucket, "note": out.pace.note, "run_s": out.pace_s},
            "noisy": {str(b): why for b, why in out.noisy.items()},
            "notes": {str(b): why for b, why in out.notes.items()},
        })
        return 0
    print(f"{space.target.name}: runner {space.target.runner} on {space.target.hardware}{sim}, tp={tp} batch={batch}, fingerprint {fp}")
    rows = [[b, "measured" if b in out.measured else "reused", *r[1:]]
            for b, r in zip(sorted(profiles), _profiles_line(profiles, out.bucket_s))]
    print(table(rows, ["bucket", "status", "source", "TTFT_b +-", "TBT_b +-", "L1/L2", "repeats", "run time",
                       "accepted"]))
    excess = {round(p.excess, 4) for b, p in profiles.items() if b in out.measured}
    if excess and max(excess) > 0:
        print(f"slow calls (stragglers, a busy host) added {max(excess):.1%} to the typical run; "
              f"TTFT_b and TBT_b count that expected cost")
    print(f"measured {len(out.measured)} bucket(s), reused {len(out.reused)} from the cache; "
          f"hardware seconds{sim}: compile {out.compile_s:.2f} s + run {out.run_s:.2f} s "
          f"(run time per bucket above: its timed runs, every attempt)")
    if out.rows is not None:
        print(f"host cost of a row: {out.rows.said()}; a step with fewer rows generating costs that much less "
              f"per row (measured in bucket {min(out.measured)}: {out.rows_s:.2f} s of runs{sim})")
    if out.admission is not None:
        print(f"served admissions against TTFT_b: {out.admission.said()} (measured in bucket {min(out.measured)}: "
              f"{out.admission_s:.2f} s of runs{sim})")
    if out.context is not None:
        print(f"a live row's context per decode step: {out.context.said()}; served steps cost what their rows "
              f"read ({out.context_s:.2f} s of runs{sim})")
    if out.resume is not None:
        print(f"resuming the decode: {out.resume.said()} ({out.resume_s:.2f} s of runs{sim})")
    if out.busy_resume is not None:
        print(f"resuming the decode {out.busy_resume.said()} ({out.busy_resume_s:.2f} s of runs{sim})")
    if out.tail is not None:
        print(f"{out.tail.said()} ({out.tail_s:.2f} s of runs{sim})")
    if out.pace is not None:
        print(f"{out.pace.said()} ({out.pace_s:.2f} s of runs{sim})")
    for b, why in sorted(out.notes.items()):
        print(f"bucket {b}: {why}")
    for why in out.noisy.values():
        print(f"NOISY: {why}; kept (not accepted), predictions from it carry a wide interval")
    return 0


def _load_table(args, space, cand, runner) -> tuple[UnitTable, dict]:
    """The unit's table, and the cached profiles it is built from."""
    fp = runner.fingerprint()
    path = resolve_cache_path(args.cache)
    profiles = {}
    if path.exists():
        with ProfileCache.open(path, create=False) as cache:
            profiles = cache.get_unit(fp, cand.tp, cand.batch)
    try:
        return UnitTable.build(cand, profiles, policy=space.target.bucket_policy,
                               prefill=space.target.prefill), profiles
    except MissingProfiles as exc:
        missing = sorted({b for v in exc.missing.values() for b in v})
        cmd = ["lensopt", "profile", str(space.path), "--tp", str(cand.tp), "--batch", str(cand.batch),
               "--buckets", ",".join(map(str, missing))]
        if args.cache:
            cmd += ["--cache", args.cache]
        raise MissingProfiles(
            f"the cache {path} has no profile for bucket(s) {missing} of tp={cand.tp} batch={cand.batch}; "
            f"run: {shlex.join(cmd)}",
            missing=exc.missing,
        ) from None


def _note_outdated(args, space, tp: int, batch: int, fp: str, profiles: dict, *, serving: bool) -> None:
    """Say (on stderr) when the unit's cached host costs come from an older way of measuring them, and how to
    measure them anew (``lens.methods``)."""
    cache = ["--cache", args.cache] if args.cache else []
    unit = ["--tp", str(tp), "--batch", str(batch)]
    rm = rm_unit_argv(fp, tp, batch, args.cache)
    again = ["lensopt", "profile", str(space.path), *unit, "--buckets", ",".join(map(str, sorted(profiles))), *cache]
    line = methods.advice(profiles, f"tp{tp} b{batch}", f"{shlex.join(rm)} && {shlex.join(again)}",
                          serving=serving)
    if line:
        print(f"note: {line}", file=sys.stderr)


def sample_line(desc, n: int) -> str:
    """What a workload sample is: its source, size and seed, the scaling, and what was dropped."""
    scale = f", lengths x{desc.length_scale:g}" if desc.length_scale is not None else ""
    dropped = (f"; {desc.dropped_longer} of {n + desc.dropped_longer} dropped as longer than the largest bucket "
               f"(workload.drop_longer)" if desc.dropped_longer else "; none dropped")
    return f"workload {desc.source}: {n} requests (seed {desc.seed}{scale}){dropped}"


def _report(kind: str, requests, ttft, tpot, e2e, summary: dict, extra: dict, as_json: bool, label: str,
            sample=None) -> None:
    if as_json:
        one = len(requests) == 1
        pick = (lambda a: float(a[0])) if one else (lambda a: a)
        wl = {} if sample is None else {"workload": sample.to_json()}
        print_json({"ttft_s": pick(ttft), "tpot_s": pick(tpot), "e2e_s": pick(e2e), **extra, **wl, "summary": summary})
        return
    print(label)
    if sample is not None:
        print(sample_line(sample, len(requests)))
    if len(requests) <= 32:
        rows = [[i, int(a), int(b), fmt_s(t), fmt_s(p), fmt_s(e)]
                for i, (a, b, t, p, e) in enumerate(zip(requests.input_len, requests.output_len, ttft, tpot, e2e))]
        print(table(rows, ["req", "input", "output", "TTFT", "TPOT", "E2E"]))
    print(
        f"{kind}: {summary['requests']} request(s), throughput {summary['throughput_tok_s']:.1f} tok/s, "
        f"TTFT p50 {fmt_s(summary['ttft_p50_s'])} p90 {fmt_s(summary['ttft_p90_s'])}, "
        f"TPOT p50 {fmt_s(summary['tpot_p50_s'])}, E2E p50 {fmt_s(summary['e2e_p50_s'])} p90 {fmt_s(summary['e2e_p90_s'])}"
        f" p99 {fmt_s(summary['e2e_p99_s'])}"
    )
    _print_extra(extra)


#: the measurement's drift figures, printed on a line of their own (``_drift_line``)
DRIFT_KEYS = ("host_drift", "host_drift_err", "drift_significant", "drift_action", "drift_note", "round_speeds",
              "host_moved")
#: figures of ``extra`` that are shares (0..1), printed as percentages
SHARES = ("spread", "spread_max", "prefill_padding", "decode_padding")


def _print_extra(extra: dict) -> None:
    """The figures beside the summary, one per line under their ``--json`` names, as a reader wants them:
    seconds with their unit, shares and errors in percent, counts as they are."""
    for k, v in extra.items():
        if k != "requests" and k not in DRIFT_KEYS and not isinstance(v, dict):  # the drift gets a line of its own
            print(f"  {k}: {_said(k, v)}")


def _said(key: str, v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if not isinstance(v, float):
        return str(v)
    if key.endswith("_pct"):
        return f"{v:.2f}%"
    if key in SHARES:
        return f"{v:.1%}"
    if key.endswith("_s"):
        return fmt_s(v)
    return f"{v:.4g}"


def _requests(args, space, cand):
    """The mode and the requests; under continuous mode with arrival times and the per-request SLOs
    (the serving record: where the arrivals came from, their rate, the SLOs)."""
    mode = mode_of(args, space)
    check_serving_args(args, mode)
    requests, sample = requests_for(args, space, cand, mode=mode)
    if mode != "continuous":
        return mode, requests, sample, None
    if sample is None:  # lengths from the command line: arrivals from the flags or the space
        requests, how, rate = with_arrivals(args, space, requests)
    else:
        how, rate = sample.arrivals, sample.arrival_rate
    return mode, requests, sample, (how, rate, request_slo(args, space))


def _serving_out(kind: str, args, requests, summary: dict, extra: dict, serving, label: str, sample,
                 ttft, tpot, e2e) -> None:
    how, rate, slo = serving
    if args.json:
        wl = {} if sample is None else {"workload": sample.to_json()}
        print_json({"ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e, "arrival_s": requests.arrival_s, **extra,
                    "arrivals": how, "request_rate": rate, **wl, "summary": summary})
        return
    if sample is not None:
        label += "\n" + sample_line(sample, len(requests))
    print_serving(kind, summary, arrivals_from=how, rate=rate, slo=slo, label=label)
    _print_extra(extra)


def cmd_predict(args) -> int:
    space, tp, batch = space_and_unit(args)
    cand = candidate_from_args(args, space)
    mode, requests, sample, serving = _requests(args, space, cand)
    runner = get_runner(space.target)
    tbl, profiles = _load_table(args, space, cand, runner)
    _note_outdated(args, space, cand.tp, cand.batch, runner.fingerprint(), profiles, serving=serving is not None)
    sources = ",".join(tbl.sources)
    label = f"prediction (LENS from {sources} profiles) for {cand.label()} on {space.target.name}"
    if serving is not None:
        spred = predict_serving(tbl, requests, scheduler=space.target.scheduler)
        summary = summarize_serving_prediction(requests, spred, chips=tp, slo=serving[2])
        # how far the profiles' own +- moves it: near the knee a small change of the costs is a large one of
        # the latencies (lens.serving.predict_band)
        rng = summarized_band(requests, summary, tbl, scheduler=space.target.scheduler, chips=tp, slo=serving[2])
        # the operator's question: the largest rate of this arrival pattern the unit serves within the space's SLOs
        growth = space.objectives.max_queue_growth
        cap = capacity_of(max_sustainable_rate(tbl, requests, unit_arrival_s=requests.arrival_s * serving[1],
                                               scheduler=space.target.scheduler, chips=tp, slo=dict(space.slo),
                                               max_queue_growth=growth),
                          chips=tp, slo=dict(space.slo), max_queue_growth=growth)
        extra = {"mode": mode, "scheduler": str(space.target.scheduler), "profile_source": sources,
                 "decode_steps": spred.decode_steps, "capacity": cap, "band": {k: list(v) for k, v in rng.items()}}
        _serving_out("predicted", args, requests, summary, extra, serving, label, sample, spred.ttft_s, spred.tpot_s,
                     spred.e2e_s)
        if not args.json:
            print(band_said(rng))
            print_capacity(cap)
        return 0
    pred = predict(tbl, requests, mode=mode)
    summary = summarize_prediction(requests, pred, chips=tp)
    extra = {"mode": mode, "profile_source": sources, "prefill_padding": round(pred.prefill_padding, 4),
             "decode_padding": round(pred.decode_padding, 4)}
    _report("predicted", requests, pred.ttft_s, pred.tpot_s, pred.e2e_s, summary, extra, args.json, label, sample)
    return 0


def cmd_measure(args) -> int:
    space, tp, batch = space_and_unit(args)
    cand = candidate_from_args(args, space)
    mode, requests, sample, serving = _requests(args, space, cand)
    runner = get_runner(space.target)
    from lens.types import Unit, WorkloadRun

    serve_mode = "continuous" if serving is not None else "static"
    runner.check_mode(serve_mode, requests)  # a runner that does not serve it says so before anything runs
    if args.mode and args.mode != "continuous" and args.mode != space.target.batching and runner.refuses_batching(
            dataclasses.replace(space.target, batching=args.mode)):
        from lens.errors import UserError

        raise UserError(f"--mode {args.mode}: runner {runner.name!r} executes {' and '.join(runner.batchings)} batches "
                        f"only; measure without --mode (`lensopt predict --mode {args.mode}` predicts it)")
    unit = Unit(target=space.target, tp=tp, batch=batch)
    runner.check_unit(unit)
    profiles = _cached(args, runner, cand)
    _note_outdated(args, space, cand.tp, cand.batch, runner.fingerprint(), profiles, serving=serving is not None)
    check = DriftCheck.of(space, cand, requests, profiles)
    t0 = time.perf_counter()
    # the cached profiles' prediction: what the passes are judged on, and how long one should take
    pred = _predicted(space, cand, profiles, requests, serving=serving is not None)
    if args.repeats == "auto":
        passes = choose(runner, unit, check, pred.total_s if pred is not None else None)
    else:
        passes = Passes(args.repeats)
    repeats = passes.n
    # rounds of probes before, between and after the passes (the drift over the measurement's own window),
    # and the requests' buckets profiled on the host as it was during them (search.drift_check)
    runs, dr = checked(runner, unit, check,
                       [lambda: runner.run_workload(cand, requests, mode=serve_mode)] * repeats)
    wall = time.perf_counter() - t0
    drift = dr.drift.value if dr is not None else None
    ref_extra = _drift_extra(dr, check, space.budget.drift_tolerance) if dr is not None else {}
    med = WorkloadRun.median_of(runs)
    ttft, e2e, total = med.ttft_s, med.e2e_s, med.total_s
    e2e_all = np.stack([r.e2e_s for r in runs])
    spread_each = (e2e_all.max(axis=0) - e2e_all.min(axis=0)) / e2e
    tpot = tpot_of(ttft, e2e, requests.output_len)
    # the measurement's own noise: each request's median's standard error over the passes (none from one)
    noise = float(np.mean(median_se(e2e_all)) * 100) if repeats > 1 else None
    per_pass = []
    if serving is not None:
        # each pass's own percentiles (how far a queue near the knee moves them), and their median: each pass
        # holds the host's jitter as the prediction's runs do (lens.serving_metrics.summarize_serving_passes)
        each = [summarize_serving(requests, ttft_s=r.ttft_s, e2e_s=r.e2e_s, total_s=r.total_s, chips=tp,
                                  slo=serving[2]) for r in runs]
        summary = median_summary(each)
        per_pass = each if repeats > 1 else []
    else:
        summary = summarize(requests, ttft_s=ttft, e2e_s=e2e, total_s=total, chips=tp)
    sim = med.simulated or runner.simulated
    extra = {
        "repeats": repeats,
        **({"repeats_auto": passes.to_json()} if passes.auto else {}),
        "spread": float(np.median(spread_each)),
        "spread_max": float(spread_each.max()),
        **({"measurement_noise_pct": noise} if noise is not None else {}),
        **({"pass_spread": pass_spreads(per_pass), "pass_median_interval": pass_intervals(per_pass)}
           if per_pass else {}),
        "compile_s": med.compile_s,
        "run_s": med.run_s,
        "wall_s": wall,
        "simulated": sim,
        # the reference probe's time now over its time in the cached profile (null: nothing cached to compare)
        "host_drift": drift,
        **ref_extra,
        **_prediction_error(space, cand, profiles, requests, e2e, drift, serving=serving is not None,
                            predicted=pred, reprofiled=dr.profiles if dr is not None else {}),
    }
    read = f"median of {repeats}" + (" passes' own figures" if serving is not None and repeats > 1 else "")
    label = (f"measurement ({'SIMULATED ' if sim else ''}{space.target.runner} on {space.target.hardware}, "
             f"{read}) for {cand.label()} on {space.target.name}")
    if serving is not None:
        _serving_out("measured", args, requests, summary, extra, serving, label, sample, ttft, tpot, e2e)
    else:
        _report("measured", requests, ttft, tpot, e2e, summary, extra, args.json, label, sample)
    if not args.json:
        print(_drift_line(dr, check, space.budget))
        print(passes.said())
        print(noise_line(noise, repeats))
        if per_pass:
            print(pass_spread_line(per_pass))
    return 0


def _cached(args, runner, cand) -> dict:
    """The cached profiles of the candidate's unit (empty when there is no cache or none of them)."""
    path = resolve_cache_path(args.cache)
    if not path.exists():
        return {}
    with ProfileCache.open(path, create=False) as cache:
        return cache.get_unit(runner.fingerprint(), cand.tp, cand.batch)


def _predicted(space, cand, profiles, requests, *, serving: bool):
    """The prediction of ``requests`` from ``profiles`` (None when they miss a bucket the candidate needs)."""
    try:
        tbl = UnitTable.build(cand, profiles, policy=space.target.bucket_policy, prefill=space.target.prefill)
    except MissingProfiles:
        return None
    return (predict_serving(tbl, requests, scheduler=space.target.scheduler) if serving
            else predict(tbl, requests, mode=space.target.batching))


def _predicted_e2e(space, cand, profiles, requests, *, serving: bool) -> np.ndarray | None:
    """Per-request E2E predicted from ``profiles`` (None when they miss a bucket the candidate needs)."""
    pred = _predicted(space, cand, profiles, requests, serving=serving)
    return None if pred is None else pred.e2e_s


def _prediction_error(space, cand, profiles, requests, e2e, drift, *, serving: bool, predicted, reprofiled) -> dict:
    """Per-request E2E error of the cached profiles' prediction, as is and corrected for the host's drift.

    ``_reprofiled_pct``: predicted from the ``reprofiled`` buckets (profiled side by side with the
    runs, or again after them); ``_rescaled_pct``: times the drift (static batches only: queueing
    does not scale with the host's speed). ``_drift_corrected_pct`` is the first of them there is:
    the prediction a drift that counts is judged on. ``serving``: the continuous-batching
    prediction at the same arrivals. ``predicted``: the prediction from ``profiles`` (None: they miss a
    bucket).
    """
    if predicted is None:
        return {}
    pred = predicted.e2e_s
    mape = lambda p: float(np.mean(np.abs(p - e2e) / e2e) * 100)  # noqa: E731
    out = {"prediction_e2e_mape_pct": mape(pred)}
    if drift is not None and not serving:
        out["prediction_e2e_mape_rescaled_pct"] = mape(pred * drift)
    again = _predicted_e2e(space, cand, {**profiles, **reprofiled}, requests, serving=serving) if reprofiled else None
    if again is not None:
        out["prediction_e2e_mape_reprofiled_pct"] = mape(again)
    fixed = out.get("prediction_e2e_mape_reprofiled_pct", out.get("prediction_e2e_mape_rescaled_pct"))
    if fixed is not None:
        out["prediction_e2e_mape_drift_corrected_pct"] = fixed
    return out


def _drift_extra(dr: DriftOutcome, check: DriftCheck, tolerance: float) -> dict:
    """The measurement's drift figures beside ``host_drift`` in ``--json``."""
    ref = check.reference
    out = {"host_drift_err": dr.drift.err, "drift_significant": dr.drift.significant(tolerance),
           "drift_action": dr.action, "drift_check": SIDE_BY_SIDE if check.side_by_side else REFERENCE_ONLY,
           "reference_probe": {"bucket": ref.probe.bucket, "input_len": ref.probe.input_len,
                               "output_len": ref.probe.output_len, "profiled_s": ref.cached_s,
                               "now_s": dr.drift.value * ref.cached_s, "times_before_s": list(dr.times_before_s),
                               "times_after_s": list(dr.times_after_s),
                               "times_by_round_s": [list(r) for r in dr.rounds_s]},
           "round_speeds": list(dr.round_speeds)}
    if np.isfinite(dr.moved):
        out["host_moved"] = dr.moved
    if dr.profiles:
        out["reprofiled"] = {"buckets": sorted(dr.profiles), "hardware_s": dr.reprofile_s,
                             "side_by_side": dr.side_by_side, "run_again": list(dr.run_again)}
    if dr.note:
        out["drift_note"] = dr.note
    return out


def _drift_line(dr: DriftOutcome | None, check: DriftCheck | None, budget) -> str:
    if dr is None:
        return ("host_drift: unknown (no cached profile of a bucket these requests use; `lensopt profile` the unit "
                "to compare)")
    p, ref, d = check.reference.probe, check.reference, dr.drift
    how = "slower" if d.value > 1 else "faster"
    fresh = ", ".join(map(str, sorted(dr.profiles)))
    if dr.action == REPROFILED and dr.side_by_side:
        again = f", {dr.run_again_said}" if dr.run_again else ""
        counts = ("beyond its noise and the tolerance" if d.significant(budget.drift_tolerance)
                  else f"within its noise or the {budget.drift_tolerance:.0%} tolerance")
        verdict = (f"{counts}; the runs are judged on the prediction from bucket(s) {fresh} profiled side by side "
                   f"with them ({dr.reprofile_s:.3g} hardware-s{again}; the cache keeps its profiles): the "
                   f"drift-corrected one")
    elif dr.action == REPROFILED:
        verdict = (f"beyond {budget.drift_reprofile:.0%}: bucket(s) {fresh} were "
                   f"profiled again ({dr.reprofile_s:.3g} hardware-s; the cache keeps its profiles) and the "
                   f"prediction from them is the drift-corrected one")
    elif dr.action == RESCALED:
        verdict = "beyond its noise and the tolerance: predictions times it are the drift-corrected ones"
    elif d.significant(budget.drift_tolerance):
        verdict = "beyond its noise and the tolerance, but queueing does not scale with it: read it beside the error"
    else:
        verdict = f"within its noise or the {budget.drift_tolerance:.0%} tolerance: read the prediction as is"
        if dr.profiles:
            verdict += f" (bucket(s) {fresh}, profiled side by side with the runs, give the reprofiled error)"
    where = (f"run in {len(dr.rounds_s)} rounds before, between and after the passes" if len(dr.rounds_s) > 2
             else "run before and after the workload")
    line = (f"host_drift: {d.value:.3f} +- {d.err:.3f} -- the reference probe (bucket {p.bucket}, {p.input_len} in, "
            f"{p.output_len} out; {where}) took {d.value * ref.cached_s:.4g} s now, "
            f"{ref.cached_s:.4g} s in the profile: the host is {abs(d.value - 1):.1%} {how}, {verdict}")
    moved = dr.moved_said(budget.drift_tolerance)
    return line + (f" ({dr.note})" if dr.note else "") + (f"; {moved}" if moved else "")
