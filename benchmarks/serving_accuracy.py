"""Continuous batching: predicted (LENS profiles + lens.serving) against measured, at three arrival rates.

For each unit, the buckets are profiled on the runner (two runs per bucket, as a search
does); then, per workload and rate, the same requests with the same arrivals are predicted
and served several times on the runner in continuous mode. The table compares request
throughput and p50/p90 of TTFT, TPOT and E2E: the measured median over the repeats, its
spread ((max - min) / median), and the prediction's error against the median. The prediction
reads its latency percentiles over several runs of the machine, each with the host's jitter
drawn into it (``lens.prefill_tail``, ``lens.decode_pace``); the ``pooled`` column reads the
measurement the same way, over every repeat's requests together, and gives the corrected
prediction's error against that (``lensopt measure`` and a confirmation read the median of
the passes' own figures, as the headline column does).

Repeats: ``--repeats`` at the lightest rate; a busier rate repeats until it has served
about as long (``--repeats`` x its rate over the lightest, rounded), at most
``--max-repeats``. A busier rate's run is shorter, and near the knee the queue amplifies
the host's noise, so a median of three runs there moves by tens of percent from one
measurement to the next; ``--max-repeats`` equal to ``--repeats`` serves every rate the same
number of times.

A host that is busier (or quieter) when it serves than when it profiled is drift, not a
model error (``lens.drift``): each rate's repeats run as a confirmation runs them
(``search.drift_check.checked``, ``budget.drift_check = "side-by-side"``), with rounds of
the probes of every bucket the requests use before, between and after them; ``drift`` is
the reference probe's time in the rounds over its time in the profile. The ``corr``
column is the error of the same machine predicted from those side-by-side profiles (the
queueing responds to the host's speed through the machine, not linearly), the
drift-corrected prediction a confirmation is judged on. Both errors are printed.

Rates are fractions of the unit's predicted saturation rate (every request arriving at
once): light (0.15), about half (0.5) and near the knee (0.8), where queueing starts to
dominate and small cost errors are amplified.

Runners (``--runner``):
- ``jax``: real XLA execution on this CPU (the quickstart model); requests released by the
  wall clock, so a busy host shows up in the measurements; with ``--gpu``, on the GPU JAX
  sees instead (a Llama-3.2-1B-shaped model in bfloat16, buckets 128-2048, the workloads'
  lengths as they are), needing only numpy and JAX there (no optuna, no ray);
- ``command``: the example program examples/command_runner/toy_npu.py through the command
  protocol; its device is SIMULATED (its own cost model and host effects, not lens');
- ``sim``: the simulated fleet (runners.sim, ``--hardware`` picks the devices), SIMULATED
  with the effects real stacks have (real-context attention, KV copies, host costs,
  stragglers, drift), stepped by its own continuous-batching machine;
- ``--space FILE`` instead: the target of a space file (its runner, model, bucket policy,
  ``[target.scheduler]``, ``[budget]`` drift settings), with the space's buckets and the
  workloads' lengths as they are. This is the table on an accelerator host, for example a
  ``vllm`` target on the neuron platform (docs/vllm.md), whose runner serves continuous
  mode there.

    python benchmarks/serving_accuracy.py [--runner jax|command|sim | --space FILE] [--units 1x4,1x8]
                                          [--hardware inf2,tpu-v6e] [--requests 120] [--repeats 3]
                                          [--max-repeats 9]
                                          [--rates 0.15,0.5,0.8] [--csv FILE] [--gpu] [--budget-s S]

``--budget-s``: start no unit or workload past that many seconds (the first always runs) and
list what was skipped; the CSV is rewritten after every rate, so a run stopped from outside
keeps what it finished.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import Mapping
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lens import arrivals, prefill_tail  # noqa: E402
from lens.capacity import saturation_rate  # noqa: E402
from lens.compose import UnitTable  # noqa: E402
from lens.distributions import sample  # noqa: E402
from lens.probes import plan_probes, solve  # noqa: E402
from lens.rows import measured_context  # noqa: E402
from lens.errors import LensoptError  # noqa: E402
from lens.serving import TailRuns, predict_serving  # noqa: E402
from lens.metrics import latency_stats, tpot_of  # noqa: E402
from lens.serving_metrics import (median_interval, median_summary, range_share, summarize_serving,  # noqa: E402
                                  summarize_serving_prediction, summarized_band)
from lens.types import BucketProfile, Candidate, ModelShape, Requests, Target, Unit  # noqa: E402
from lens.workload import fit_to, read_trace, scale_lengths, window  # noqa: E402
from runners import get_runner  # noqa: E402
from search.drift_check import DriftCheck, checked  # noqa: E402
from search.host_costs import (measure_admission, measure_busy_resume, measure_context_cost,  # noqa: E402
                            measure_decode_pace, measure_prefill_tail, measure_resume, measure_row_cost)
from spaces import Budget, ProfileSettings  # noqa: E402
from trace_files import trace_path  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

METRICS = ("request_throughput_req_s", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "e2e_p50_s",
           "e2e_p90_s")
SHORT = {"request_throughput_req_s": "throughput", "ttft_p50_s": "TTFT p50", "ttft_p90_s": "TTFT p90",
         "tpot_p50_s": "TPOT p50", "tpot_p90_s": "TPOT p90", "e2e_p50_s": "E2E p50", "e2e_p90_s": "E2E p90"}
QUICKSTART = ModelShape(layers=4, hidden=256, heads=4, kv_heads=2, intermediate=688, vocab=4096)
LLAMA_1B = ModelShape(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=128256)
TOY = ROOT / "examples" / "command_runner" / "toy_npu.py"


def setup(kind: str, hardware: str, gpu: bool = False) -> tuple[Target, tuple[int, ...], float]:
    """The target, its bucket set and the length scale that fits the workloads into it."""
    if kind == "jax" and gpu:
        return (Target(name="serving-jax-gpu", runner="jax", hardware="gpu", bucket_policy="exclusive",
                       dtype="bfloat16", model=LLAMA_1B), (128, 256, 512, 1024, 2048), 1.0)
    if kind == "sim":
        policy = "inclusive" if hardware.startswith("tpu") else "exclusive"
        return (Target(name=f"serving-sim-{hardware}", runner="sim", hardware=hardware, bucket_policy=policy,
                       dtype="bfloat16", model=LLAMA_1B), (256, 512, 1024, 2048, 4096), 1.0)
    if kind == "jax":
        return (Target(name="serving-jax", runner="jax", hardware="cpu", bucket_policy="exclusive",
                       dtype="float32", model=QUICKSTART), (64, 128, 256, 512), 0.2)
    if kind == "command":
        return (Target(name="serving-toy", runner="command", hardware="toy-npu", bucket_policy="exclusive",
                       dtype="bfloat16", model=LLAMA_1B,
                       options=(("argv", ["{python}", str(TOY)]), ("timeout_s", 600.0))),
                (256, 512, 1024, 2048, 4096), 1.0)
    raise SystemExit(f"--runner {kind!r}: use jax, command or sim")


def workloads(n: int, scale: float, top: int, seed: int) -> dict[str, tuple[Requests, np.ndarray]]:
    """name -> (requests, arrival pattern at rate 1): Poisson for ShareGPT, the trace's own for Azure."""
    share, _ = fit_to(scale_lengths(sample("sharegpt", 4 * n, seed), scale), top)
    share = share.head(n)
    azure, _ = fit_to(scale_lengths(read_trace(trace_path("azure_conv_2023.csv")), scale), top)
    azure = window(azure, n, seed=seed)
    unit_azure = arrivals.rescale(azure.arrival_s, 1.0)
    return {
        "sharegpt (Poisson)": (Requests(share.input_len, share.output_len, name="sharegpt"),
                               arrivals.unit_gaps(len(share), seed=seed)),
        "azure-conv (trace arrivals)": (Requests(azure.input_len, azure.output_len, name="azure_conv"), unit_azure),
    }


def err(pred: float, meas: float) -> float:
    return (pred - meas) / meas * 100 if meas else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runner", default="jax", choices=("jax", "command", "sim"))
    ap.add_argument("--space", help="measure the target of this space file (its buckets, scheduler and budget) "
                                    "instead of --runner's")
    ap.add_argument("--hardware", default="inf2,tpu-v6e", help="sim: the simulated devices, comma separated")
    ap.add_argument("--units", default="1x4,1x8", help="tp x batch units, comma separated")
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--repeats", type=int, default=3, help="serves at the lightest rate (default 3)")
    ap.add_argument("--max-repeats", type=int, default=9,
                    help="a busier rate serves about as long as the lightest: --repeats x its rate over the lightest, "
                         "at most this many (default 9; equal to --repeats: every rate alike)")
    ap.add_argument("--rates", default="0.15,0.5,0.8", help="fractions of the predicted saturation rate")
    ap.add_argument("--profile-repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--csv", help="write the table here too (rewritten after every rate)")
    ap.add_argument("--gpu", action="store_true",
                    help="jax: serve on the GPU JAX sees (Llama-3.2-1B shape, bfloat16) instead of this CPU")
    ap.add_argument("--budget-s", type=float, default=float("inf"),
                    help="start no unit or workload past this many seconds (the first always runs)")
    ap.add_argument("--xla-threads", choices=("one", "many"), default="one",
                    help="jax: one XLA CPU thread per graph (the runner's default) or XLA's thread pool")
    args = ap.parse_args(argv)
    # read when jax starts (get_runner imports it); the last one in XLA_FLAGS wins
    pool = "true" if args.xla_threads == "many" else "false"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_cpu_multi_thread_eigen={pool}").strip()
    if args.gpu:
        if args.runner != "jax" or args.space:
            ap.error("--gpu is for --runner jax")
        # allocate on demand (the default claims 75% of the GPU at the first array)
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

    try:
        fracs = [float(x) for x in args.rates.split(",")]
    except ValueError:
        ap.error(f"--rates {args.rates}: comma-separated fractions of the saturation rate, e.g. 0.15,0.5,0.8")
    if args.repeats < 1 or args.max_repeats < 1:
        ap.error("--repeats and --max-repeats: at least 1")
    if min(fracs) <= 0:
        ap.error(f"--rates {args.rates}: fractions of the saturation rate above 0, e.g. 0.15,0.5,0.8")
    rows = []
    t_start = time.perf_counter()
    budget_end = t_start + args.budget_s
    skipped: list[str] = []
    try:
        if args.space:
            from spaces import load_space

            space = load_space(args.space)
            setups = [(space.target, tuple(space.search.buckets), 1.0)]
            budget = space.budget
        else:
            setups = [setup(args.runner, hw, args.gpu)
                      for hw in (args.hardware.split(",") if args.runner == "sim" else [""])]
            budget = Budget()
        for target, buckets, scale in setups:
            runner = get_runner(target)
            if args.gpu:
                import jax

                if jax.default_backend() != "gpu":
                    raise LensoptError(f"--gpu: JAX sees no GPU here (backend {jax.default_backend()!r}); run it on "
                                       f"the GPU host with JAX's CUDA plugin, or leave --gpu out for this CPU")
                print(f"on {jax.devices()[0].device_kind} (jax {jax.__version__})", file=sys.stderr)
            sim = " (SIMULATED device)" if runner.simulated else ""
            runner.check_mode("continuous")  # a runner that does not serve it says so before anything runs
            loads = workloads(args.requests, scale, buckets[-1], args.seed)
            rows += measure(args, runner, target, buckets, loads, fracs, target.scheduler, budget,
                            Clock(budget_end, skipped))
    except LensoptError as exc:
        print(f"serving_accuracy: {exc}", file=sys.stderr)
        return 2
    if not rows:
        print("serving_accuracy: nothing was measured", file=sys.stderr)
        return 2
    print(f"Continuous batching on {setups[0][0].runner}{sim}: {', '.join(s[0].name for s in setups)}, "
          f"buckets {list(buckets)}, {args.requests} requests per run, "
          f"{said_repeats(fracs, args.repeats, args.max_repeats)} (median; spread = (max - min) / median), {time.perf_counter() - t_start:.0f} s")
    if skipped:
        print(f"skipped (time budget of {args.budget_s:g} s): {', '.join(skipped)}")
    report(rows, fracs, args.csv)
    return 0


def repeats_at(frac: float, fracs: list[float], repeats: int, most: int) -> int:
    """How many times a rate serves: ``repeats`` at the lightest of ``fracs``, about as long a time at a busier one
    (its share of the lightest rate, rounded), at most ``most`` (never fewer than ``repeats``)."""
    return min(max(repeats, most), max(repeats, round(repeats * frac / min(fracs))))


def at_rates(fracs: list[float]) -> str:
    """'0.15 / 0.5 / 0.8 x saturation': the rates a summary's ' / '-joined figures belong to."""
    return f"{' / '.join(f'{f:g}' for f in fracs)} x saturation"


def said_repeats(fracs: list[float], repeats: int, most: int) -> str:
    """'3 / 9 / 9 repeats at 0.15 / 0.5 / 0.8 x saturation', or '3 repeats' where every rate serves alike."""
    counts = [repeats_at(f, fracs, repeats, most) for f in fracs]
    if len(set(counts)) == 1:
        return f"{counts[0]} repeats"
    return (f"{' / '.join(map(str, counts))} repeats at {at_rates(fracs)} "
            f"(about as long served at each)")


@dataclasses.dataclass
class Clock:
    """The time budget: once past ``end``, what would start next is listed in ``skipped`` instead."""

    end: float
    skipped: list[str]
    started: bool = False

    def allows(self, what: str) -> bool:
        if self.started and time.perf_counter() > self.end:
            self.skipped.append(what)
            return False
        self.started = True
        return True


def probed(runner, target, tp: int, batch: int, buckets, repeats: int):
    """A unit's profiles as lensopt's profiling measures them first: the probes, then the host's cost per live
    row (lens.rows: free slots pay none), kept in every profile; and that cost (None where not measured)."""
    res = runner.profile(Unit(target, tp, batch), plan_probes(buckets, policy=target.bucket_policy,
                                                              max_output=128, repeats=repeats))
    profiles = solve(res.runs, batch=batch, simulated=res.simulated)
    row, _ = measure_row_cost(runner, target, tp, batch, profiles[min(profiles)], buckets)
    if row is not None:
        at = measured_context(profiles[min(profiles)])
        profiles = {b: dataclasses.replace(p, row_s=row.value, row_context=at) for b, p in profiles.items()}
    return profiles, row


def profiles_said(profiles) -> str:
    """The solved TTFT_b and TBT_b of each bucket with their spreads, in ms: what every prediction below composes."""
    return "TTFT_b / TBT_b: " + ", ".join(
        f"bucket {b} {p.ttft_s * 1e3:.2f} (+- {p.ttft_err_s * 1e3:.2f}) / {p.tbt_s * 1e3:.3f} (+- {p.tbt_err_s * 1e3:.3f}) ms"
        for b, p in sorted(profiles.items()))


def measure(args, runner, target, buckets, loads, fracs, sched, budget, clock: Clock) -> list[dict]:
    """Profile each unit, then predict and serve every workload at every rate."""
    rows = []
    for spec in args.units.split(","):
        tp, batch = (int(x) for x in spec.split("x"))
        if not clock.allows(f"tp{tp} b{batch}"):
            continue
        profiles, row = probed(runner, target, tp, batch, buckets, args.profile_repeats)
        print(f"{target.hardware} tp{tp} b{batch}: profiles {profiles_said(profiles)}", file=sys.stderr)
        if row is not None:
            print(f"{target.hardware} tp{tp} b{batch}: host cost of a row {row.said()}", file=sys.stderr)
        # what the server's admissions cost against TTFT_b (lens.admission), as lensopt's profiling measures it
        adm, _ = measure_admission(runner, target, tp, batch, profiles, buckets)
        if adm is not None:
            profiles = {b: dataclasses.replace(p, admit_first_s=adm.first_s, admit_next_s=adm.next_s,
                                               admit_busy_s=adm.busy_s) for b, p in profiles.items()}
            print(f"{target.hardware} tp{tp} b{batch}: admissions {adm.said()}", file=sys.stderr)
        # what a live row's context costs a decode step (lens.context_cost), as lensopt's profiling measures it
        kv, _ = measure_context_cost(runner, target, tp, batch, profiles, buckets)
        if kv is not None:
            profiles = {b: dataclasses.replace(p, kv_token_s=kv.value) for b, p in profiles.items()}
            print(f"{target.hardware} tp{tp} b{batch}: a row's context {kv.said()}", file=sys.stderr)
        # what a decode run costs after a served admission (lens.resume), as lensopt's profiling measures it
        resume, _ = measure_resume(runner, dataclasses.replace(target, serving="continuous"), tp, batch, profiles,
                                   buckets)
        if resume is not None:
            profiles = {b: dataclasses.replace(p, resume_s=resume.value, resume_idle=resume.by_idle)
                        for b, p in profiles.items()}
            print(f"{target.hardware} tp{tp} b{batch}: resuming the decode: {resume.said()}", file=sys.stderr)
        # what a pass that stops a running decode costs the decode after it (lens.busy_resume), as profiling does
        busy, _ = measure_busy_resume(runner, dataclasses.replace(target, serving="continuous"), tp, batch,
                                      profiles, buckets)
        if busy is not None:
            profiles = {b: dataclasses.replace(p, resume_busy=busy.by_pass) for b, p in profiles.items()}
            print(f"{target.hardware} tp{tp} b{batch}: resuming the decode {busy.said()}", file=sys.stderr)
        # how far a lone served prompt's TTFT strays from its median (lens.prefill_tail), as profiling measures it
        tail, _ = measure_prefill_tail(runner, dataclasses.replace(target, serving="continuous"), tp, batch,
                                       profiles, buckets)
        if tail is not None:
            profiles = {b: dataclasses.replace(p, prefill_tail=tail.quantiles, prefill_tail_median_s=tail.median_s)
                        for b, p in profiles.items()}
            print(f"{target.hardware} tp{tp} b{batch}: {tail.said()}", file=sys.stderr)
        # how a lone served decode's pace wanders (lens.decode_pace), as lensopt's profiling measures it
        pace, _ = measure_decode_pace(runner, dataclasses.replace(target, serving="continuous"), tp, batch,
                                      profiles, buckets)
        if pace is not None:
            profiles = {b: dataclasses.replace(p, decode_pace=pace.quantiles, decode_pace_window_s=pace.window_s,
                                               decode_pace_tau_s=pace.tau_s) for b, p in profiles.items()}
            print(f"{target.hardware} tp{tp} b{batch}: {pace.said()}", file=sys.stderr)
        loose = dropped_costs(row, adm, kv, resume, busy)
        if loose:
            print(f"{target.hardware} tp{tp} b{batch}: within 3 standard errors of none, not counted: "
                  f"{', '.join(f'{k} {v:.3g}' for k, v in loose.items() if isinstance(v, float))}", file=sys.stderr)
        cand = Candidate(tp, batch, buckets, buckets)
        table = UnitTable.build(cand, profiles, policy=target.bucket_policy)
        serving = dataclasses.replace(target, serving="continuous")
        settings = ProfileSettings(repeats=args.profile_repeats)
        for k, (wname, (req, unit_arr)) in enumerate(loads.items()):
            if k and not clock.allows(f"tp{tp} b{batch} {wname}"):
                continue
            sat = saturation_rate(table, req, scheduler=sched)
            for frac in fracs:
                rate = frac * sat
                timed = Requests(req.input_len, req.output_len, unit_arr / rate, req.name)
                pred = summarize_serving_prediction(timed, predict_serving(table, timed, scheduler=sched), chips=tp)
                # as a confirmation does it (search.drift_check, budget.drift_check = "side-by-side"): the
                # probes of the buckets the requests use in rounds around and between the repeats
                check = DriftCheck.build(serving, cand, timed, profiles, budget=budget, profile=settings,
                                         all_buckets=buckets)
                runs, dr = checked(runner, Unit(serving, tp, batch), check,
                                   [lambda: runner.run_workload(cand, timed, mode="continuous")]
                                   * repeats_at(frac, fracs, args.repeats, args.max_repeats))
                drift = dr.drift.value
                moved = rounds_moved(dr.rounds_s, check.reference.cached_s)
                side = UnitTable.build(cand, {**profiles, **dr.profiles}, policy=target.bucket_policy)
                corr = summarize_serving_prediction(timed, predict_serving(side, timed, scheduler=sched), chips=tp)
                # each repeat predicted at the host's speed in the rounds either side of it (lens.drift.round_speeds),
                # the passes' figures read as the measured ones are (their median)
                at_pass = per_pass(timed, side, sched, tp, dr.round_speeds, len(runs))
                # the cached table slowed by one factor for the whole host: the side-by-side probes' solved costs
                # over the cached ones, their median (a bucket's few side-by-side runs move its own cost alone)
                factor = one_factor(profiles, dr.profiles, drift)
                common = summarize_serving_prediction(
                    timed, predict_serving(table.slowed(factor), timed, scheduler=sched), chips=tp)
                # how far the side-by-side profiles' own +- moves it (lens.serving.predict_band)
                corr_band = summarized_band(timed, corr, side, scheduler=sched, chips=tp)
                # the same without the resume cost: what it changes, measured on the same runs
                bare = summarize_serving_prediction(
                    timed, predict_serving(dataclasses.replace(side, resume_s=0.0, resume_idle=()), timed,
                                           scheduler=sched), chips=tp)
                # the longest idle spell's resume cost after every pass, as before the idle spells were read
                whole = summarize_serving_prediction(
                    timed, predict_serving(dataclasses.replace(side, resume_idle=()), timed, scheduler=sched),
                    chips=tp)
                # and with a busy pass's resume priced at the shortest idle spell, whatever its prefill
                flat = summarize_serving_prediction(
                    timed, predict_serving(dataclasses.replace(side, resume_busy=()), timed, scheduler=sched),
                    chips=tp)
                # and with every prompt at its composed TTFT, the percentiles read without the tail
                no_tail = summarize_serving_prediction(
                    timed, predict_serving(dataclasses.replace(side, prefill_tail=()), timed, scheduler=sched),
                    chips=tp)
                # and with every decode step at its composed time, the percentiles read without the pace's wander
                no_pace = summarize_serving_prediction(
                    timed, predict_serving(dataclasses.replace(side, decode_pace=()), timed, scheduler=sched),
                    chips=tp)
                # and with the tail's draws added to each request's own times, not pushing back the queue behind it
                added = added_tail(timed, side, sched, tp)
                # and with the tail's seconds added to every prompt alike, whatever its prefill
                flat_tail = summarize_serving_prediction(
                    timed, predict_serving(dataclasses.replace(side, prefill_tail_median_s=0.0), timed,
                                           scheduler=sched), chips=tp)
                # and with one admission offset for every pass, idle or not (lens.admission before admit_busy_s)
                one = summarize_serving_prediction(
                    timed, predict_serving(dataclasses.replace(side, admit_busy_s=side.admit_first_s), timed,
                                           scheduler=sched), chips=tp)
                # and with every host cost that the significance test dropped at its (positive) estimate
                # (none dropped: the corrected prediction itself)
                counted = corr if not loose else summarize_serving_prediction(
                    timed, predict_serving(UnitTable.build(cand, {b: dataclasses.replace(p, **loose) for b, p in
                                                                  {**profiles, **dr.profiles}.items()},
                                                           policy=target.bucket_policy), timed, scheduler=sched),
                    chips=tp)
                meas = [summarize_serving(timed, ttft_s=run.ttft_s, e2e_s=run.e2e_s, total_s=run.total_s, chips=tp)
                        for run in runs]
                medians = median_summary(meas)  # as lensopt measure reads served passes
                pooled = pooled_latencies(timed, runs)
                together = read_together(pooled, medians)
                for m in METRICS:
                    vals = [x[m] for x in meas]
                    med = medians[m]
                    low, high, cover = median_interval(vals)
                    rows.append({"unit": f"{target.hardware} tp{tp} b{batch}", "workload": wname,
                                 "rate_req_s": rate, "x_sat": frac, "metric": SHORT[m], "predicted": pred[m], "measured": med,
                                 "repeats": len(vals), "spread_%": range_share(vals) * 100,
                                 "measured_low": low, "measured_high": high, "measured_coverage_%": cover * 100,
                                 "error_%": err(pred[m], med), "drift": drift, "drift_rounds_moved_%": moved,
                                 "corrected_predicted": corr[m], "corrected_error_%": err(corr[m], med),
                                 "one_factor": factor, "corrected_one_factor_%": err(common[m], med),
                                 "corrected_per_pass_%": err(at_pass[m], med),
                                 "measured_pooled": together[m],
                                 "corrected_pooled_error_%": err(corr[m], together[m]),
                                 "corrected_low": corr_band[m][0], "corrected_high": corr_band[m][1],
                                 "corrected_at_level": level_of(pooled, m, corr[m]),
                                 "target_level": target_level(m),
                                 "corrected_no_resume_%": err(bare[m], med),
                                 "corrected_one_resume_%": err(whole[m], med),
                                 "corrected_one_admission_%": err(one[m], med),
                                 "corrected_no_busy_resume_%": err(flat[m], med),
                                 "corrected_no_tail_%": err(no_tail[m], med),
                                 "corrected_no_pace_%": err(no_pace[m], med),
                                 "corrected_flat_tail_%": err(flat_tail[m], med),
                                 "corrected_added_tail_%": err(added[m], med),
                                 "corrected_dropped_counted_%": err(counted[m], med)})
                print(f"  done: tp{tp} b{batch} {wname} at {rate:.2f} req/s ({frac:g} x saturation {sat:.2f})",
                      file=sys.stderr, flush=True)
                if args.csv:
                    write_csv(rows, args.csv)
    return rows


def per_pass(timed: Requests, table: UnitTable, sched, chips: int, speeds: tuple[float, ...], passes: int) -> dict:
    """The median of the repeats' predictions, each at the host's speed around it: the geometric mean of the drift
    rounds before and after it (``search.drift_check`` runs one round before each repeat and one after the last).
    The side-by-side table is the host at the rounds' whole speed, so a repeat that served while the host was 10%
    slower is predicted on the table 10% slower, queueing included. All nan when the rounds do not bracket the
    repeats."""
    if len(speeds) != passes + 1 or not all(np.isfinite(speeds)):
        return {m: float("nan") for m in METRICS}
    return median_summary([summarize_serving_prediction(
        timed, predict_serving(table.slowed(float(np.sqrt(speeds[i] * speeds[i + 1]))), timed, scheduler=sched),
        chips=chips) for i in range(passes)])


def one_factor(cached: Mapping[int, BucketProfile], side: Mapping[int, BucketProfile], fallback: float) -> float:
    """How much slower the host ran beside the repeats than when it profiled, as one factor: the median over the
    buckets probed side by side of their solved TTFT_b and TBT_b over the cached ones. ``fallback`` (the reference
    probe's drift) where no bucket has both."""
    ratios = [now / then for b, p in side.items() if b in cached
              for now, then in ((p.ttft_s, cached[b].ttft_s), (p.tbt_s, cached[b].tbt_s)) if now > 0 and then > 0]
    return float(np.median(ratios)) if ratios else fallback


def added_tail(timed: Requests, table: UnitTable, sched, chips: int) -> dict:
    """The tail read as before it was run through the machine: one composition, each request's first and last
    token moved by its own draws (``lens.prefill_tail.draws``), nothing queued behind it pushed back."""
    pred = predict_serving(table, timed, scheduler=sched, tail=False)
    if len(table.prefill_tail) >= 2:
        d = prefill_tail.draws(pred.prefill_s, table.prefill_tail, table.prefill_tail_median_s)
        pred = dataclasses.replace(pred, tail_runs=TailRuns(np.broadcast_to(pred.admit_s[:, None], d.shape),
                                                            pred.first_s[:, None] + d, pred.finish_s[:, None] + d))
    return summarize_serving_prediction(timed, pred, chips=chips)


def pooled_latencies(timed: Requests, runs) -> dict[str, np.ndarray]:
    """Every request of every repeat, per latency ("ttft", "tpot", "e2e"), in seconds."""
    ttft = np.concatenate([r.ttft_s for r in runs])
    e2e = np.concatenate([r.e2e_s for r in runs])
    out_len = np.tile(np.asarray(timed.output_len), len(runs))
    return {"ttft": ttft, "tpot": tpot_of(ttft, e2e, out_len), "e2e": e2e}


def read_together(pooled: dict[str, np.ndarray], medians: dict) -> dict[str, float]:
    """The measurement read as the prediction reads its runs: each latency's percentiles over every repeat's
    requests pooled (``pooled_latencies``); the request throughput the repeats' median (``medians``)."""
    out = {"request_throughput_req_s": medians["request_throughput_req_s"]}
    for kind, x in pooled.items():
        out.update(latency_stats(kind, x))
    return out


def level_of(pooled: dict[str, np.ndarray], metric: str, value: float) -> float:
    """The percentile of the measured requests (all repeats) at which ``value`` lies, for a
    latency percentile metric (nan for throughput).

    A latency staircase (one TTFT step per context bucket) makes a percentile that falls on
    a riser swing by a bucket's prefill when one request crosses it: the error in percent
    says how far the value is, this says how many requests it is off by.
    """
    kind = metric.split("_")[0]
    if kind not in pooled:
        return float("nan")
    x = pooled[kind][np.isfinite(pooled[kind])]
    if not x.size:
        return float("nan")
    return float((np.count_nonzero(x < value) + np.count_nonzero(x <= value)) / (2 * x.size) * 100)


def target_level(metric: str) -> float:
    """50 for a ``*_p50_s`` metric, 90 for ``*_p90_s``, nan otherwise."""
    tail = metric.rsplit("_p", 1)
    return float(tail[1].removesuffix("_s")) if len(tail) == 2 and tail[1].endswith("_s") else float("nan")


def dropped_costs(row, adm, kv, resume, after_busy=None) -> dict[str, object]:
    """Profile fields for each host cost that the 3-standard-error test left at 0 though its estimate was positive."""
    out: dict[str, object] = {}
    if row is not None and row.value == 0 and row.raw > 0:
        out["row_s"] = row.raw
    if adm is not None:
        first = adm.raw_first_s if adm.first_s == 0 and adm.raw_first_s > 0 else adm.first_s
        if first != adm.first_s:
            out["admit_first_s"] = first
        if adm.next_s == 0 and adm.raw_next_s > 0:
            out["admit_next_s"] = adm.raw_next_s
        busy = adm.raw_busy_s if adm.busy_measured else first
        if adm.busy_s == 0 and busy > 0:
            out["admit_busy_s"] = busy
    if kv is not None and kv.value == 0 and kv.raw > 0:
        out["kv_token_s"] = kv.raw
    if resume is not None and resume.value == 0 and resume.raw > 0:
        out["resume_s"], out["resume_idle"] = resume.raw, ()
    if after_busy is not None and after_busy.levels and after_busy.ratio == 0 and after_busy.raw > 0:
        out["resume_busy"] = dataclasses.replace(after_busy, ratio=after_busy.raw).by_pass
    return out


def report(rows: list[dict], fracs: list[float], csv_path: str | None) -> None:
    print("(throughput in requests/s, latencies in ms; rate in requests/s and as a fraction of saturation)")
    print(f"{'unit':14} {'workload':28} {'rate':>7} {'xsat':>5} {'metric':10} {'predicted':>10} {'measured':>10} "
          f"{'runs':>4} {'spread':>7} {'error':>7} {'drift':>6} {'corr':>7} {'corr at':>7} {'pooled':>7}")
    for r in rows:
        k = 1.0 if r["metric"] == "throughput" else 1e3
        at = "" if np.isnan(r["corrected_at_level"]) else f"p{r['corrected_at_level']:.1f}"
        print(f"{r['unit']:14} {r['workload']:28} {r['rate_req_s']:7.2f} {r['x_sat']:5.2f} {r['metric']:10} "
              f"{r['predicted'] * k:10.2f} {r['measured'] * k:10.2f} {r['repeats']:4d} {r['spread_%']:6.1f}% {r['error_%']:+6.1f}% "
              f"{r['drift']:6.3f} {r['corrected_error_%']:+6.1f}% {at:>7} {r['corrected_pooled_error_%']:+6.1f}%")
    print("(corr at: the percentile of the measured requests, all repeats pooled, at which the corrected "
          "prediction lies; pooled: the corrected error against the percentile of those requests, which is how "
          "the prediction reads its own runs)")
    print(host_said(rows, fracs))
    for key, what in (("error_%", "|error|"), ("corrected_error_%", "|error| corrected for drift"),
                      ("corrected_per_pass_%", "|error| corrected for drift, each repeat predicted at the host's speed "
                                               "in the drift rounds either side of it"),
                      ("corrected_one_factor_%", "|error| corrected for drift by one factor for the whole host "
                                                 "(the side-by-side probes' solved costs over the cached ones, "
                                                 "their median), not bucket by bucket"),
                      ("corrected_pooled_error_%", "|error| corrected for drift, against every repeat's requests "
                                                   "read together (the throughput: the median repeat's)"),
                      ("corrected_no_resume_%", "|error| corrected for drift, without the resume cost (lens.resume)"),
                      ("corrected_one_resume_%", "|error| corrected for drift, one resume cost after every pass "
                                                 "(the longest idle spell's)"),
                      ("corrected_one_admission_%", "|error| corrected for drift, one admission offset for idle and "
                                                    "busy passes"),
                      ("corrected_no_busy_resume_%", "|error| corrected for drift, a busy pass's resume cost at the "
                                                     "shortest idle spell's whatever its prefill (lens.busy_resume)"),
                      ("corrected_no_tail_%", "|error| corrected for drift, every prompt at its composed TTFT "
                                              "(no lone-prompt tail, lens.prefill_tail)"),
                      ("corrected_no_pace_%", "|error| corrected for drift, every decode step at its composed "
                                              "time (no wander of the decode's pace, lens.decode_pace)"),
                      ("corrected_flat_tail_%", "|error| corrected for drift, the tail's seconds added to every prompt "
                                                "alike, not scaled by its prefill"),
                      ("corrected_added_tail_%", "|error| corrected for drift, the tail's draws added to each "
                                                 "request's own times, the queue behind it not pushed back"),
                      ("corrected_dropped_counted_%", "|error| corrected for drift, every host cost within 3 standard "
                                                      "errors of none counted at its positive estimate")):
        errs = np.abs([r[key] for r in rows])
        print(f"{what}: median {np.median(errs):.1f}%, p90 {np.percentile(errs, 90):.1f}%, max {errs.max():.1f}%; "
              f"within 10%: {(errs <= 10).sum()}/{len(errs)}")
        for frac in fracs:
            e = np.abs([r[key] for r in rows if r["x_sat"] == frac])
            print(f"  at {frac:g} x saturation: median {np.median(e):.1f}%, max {e.max():.1f}%, within 10%: "
                  f"{(e <= 10).sum()}/{len(e)}")
        for metric in SHORT.values():
            e = np.abs([r[key] for r in rows if r["metric"] == metric])
            print(f"  {metric:10}: median {np.median(e):.1f}%, max {e.max():.1f}%, within 10%: {(e <= 10).sum()}/{len(e)}")
    off = [(r, r["corrected_at_level"] - r["target_level"]) for r in rows
           if abs(r["corrected_error_%"]) > 10 and not np.isnan(r["target_level"])]
    if off:
        pts = np.abs([d for _, d in off])
        print(f"latency rows outside 10% corrected: {len(off)}; their corrected prediction lies {np.median(pts):.1f} "
              f"percentile points (median; max {pts.max():.1f}) from the measured percentile it predicts: "
              + ", ".join(f"{r['metric']} at {r['x_sat']:g} x sat: p{r['corrected_at_level']:.1f}" for r, _ in off))
    print(band_said(rows))
    print(measured_said(rows))
    print(moved_said(rows))
    if csv_path:
        write_csv(rows, csv_path)


def band_said(rows: list[dict]) -> str:
    """How many rows outside 10% corrected have their measured median inside the corrected prediction's band (every
    bucket's TTFT_b and TBT_b of the side-by-side profiles one standard error lower, then higher): a miss the
    profiles' own +- accounts for, where the queue makes that +- a large share of the latency."""
    out = [r for r in rows if abs(r["corrected_error_%"]) > 10]
    inside = [r for r in out if r["corrected_low"] <= r["measured"] <= r["corrected_high"]]
    by_rate = sorted({r["x_sat"] for r in inside})
    return (f"rows outside 10% corrected whose measured median lies in the corrected prediction's band (the "
            f"side-by-side profiles' +- one standard error): {len(inside)} of {len(out)}"
            + (f" (at {', '.join(f'{f:g}' for f in by_rate)} x saturation)" if inside else ""))


def measured_said(rows: list[dict]) -> str:
    """How well the repeats pin their median: the latency rows whose median's interval (``median_interval``: 96% from
    nine repeats, 75% from three) reaches past 10% of it either side, where a 10% test of the prediction cannot be
    read; and the rows outside 10% corrected whose corrected prediction lies inside that interval, a miss the
    measurement cannot tell from its own noise."""
    lat = [r for r in rows if r["metric"] != SHORT["request_throughput_req_s"]]
    loose = [r for r in lat if r["measured_low"] < 0.9 * r["measured"] or r["measured_high"] > 1.1 * r["measured"]]
    out = [r for r in rows if abs(r["corrected_error_%"]) > 10]
    inside = [r for r in out
              if r["measured_low"] <= r["corrected_predicted"] <= r["measured_high"]]
    covers = sorted({round(r["measured_coverage_%"]) for r in lat})
    return (f"latency rows whose measured median's interval (order statistics, "
            f"{' / '.join(f'{c}%' for c in covers)} coverage) reaches past 10% of it: {len(loose)}/{len(lat)}; "
            f"rows outside 10% corrected whose corrected prediction lies in that interval: {len(inside)} of {len(out)}")


def rounds_moved(rounds_s, cached_s: float) -> float:
    """How far the host moved while a rate served, in percent: the range of the drift probe rounds' medians (before,
    between and after the repeats) over the profile's reference time. Each round holds one or a few runs, so a
    steady host still shows a few percent; nan with fewer than two rounds."""
    drifts = [float(np.median(r)) / cached_s for r in rounds_s if len(r)]
    return (max(drifts) - min(drifts)) * 100 if len(drifts) >= 2 else float("nan")


def moved_said(rows: list[dict]) -> str:
    """Whether the misses are where the host moved: the latency rows within 10% corrected, apart for the rates whose
    drift rounds ranged over at most 10% (the host held) and over more (it moved while serving)."""
    lat = [r for r in rows if r["metric"] != SHORT["request_throughput_req_s"]
           and not np.isnan(r.get("drift_rounds_moved_%", float("nan")))]
    if not lat:
        return "the host's motion between the drift rounds: not measured"

    def hits(rs):
        if not rs:
            return "none"
        within = sum(abs(r["corrected_error_%"]) <= 10 for r in rs)
        return (f"{within}/{len(rs)} within 10% corrected (rounds' range median "
                f"{np.median([r['drift_rounds_moved_%'] for r in rs]):.1f}%)")
    held = [r for r in lat if r["drift_rounds_moved_%"] <= 10]
    moved = [r for r in lat if r["drift_rounds_moved_%"] > 10]
    return (f"latency rows by the host's motion while they served (the range of the reference probe's rounds before, "
            f"between and after the repeats, over its profile time): held within 10%: {hits(held)}; "
            f"moved more: {hits(moved)}")


def host_said(rows: list[dict], fracs: list[float]) -> str:
    """How steady the host was: the drift's range and the latency rows' spread over their repeats, by rate.

    A row is graded against the median of its repeats; where those repeats spread by far more than 10%, the
    median itself moves by about that much from one measurement to the next, so the count within 10% says more
    of the host than of the prediction."""
    lat = [r for r in rows if r["metric"] != SHORT["request_throughput_req_s"]]
    drifts = [r["drift"] for r in rows if not np.isnan(r["drift"])]
    drift = f"drift {min(drifts):.2f}-{max(drifts):.2f}" if drifts else "drift not measured"
    ran = [f for f in fracs if any(r["x_sat"] == f for r in lat)]
    by_rate = " / ".join(f"{np.median([r['spread_%'] for r in lat if r['x_sat'] == f]):.1f}%" for f in ran)
    return (f"the host: {drift} (the reference probe's time beside the repeats over its time in the profile); "
            f"the latency rows' repeats spread a median {np.median([r['spread_%'] for r in lat]):.1f}% "
            f"({by_rate} at {at_rates(ran)})")


def write_csv(rows: list[dict], path: str) -> None:
    import csv

    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    sys.exit(main())
