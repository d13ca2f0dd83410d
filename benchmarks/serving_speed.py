"""Speed of the continuous-batching prediction (lens.serving) and of the sustainable-rate search.

Profiles one unit on a simulated inf2 (every profile number is simulated; only the
prediction's speed is measured here), then times, repeated, with median and spread
(min..max):

- predicting a 10,000-request window of the Azure conversation trace at its own arrival
  times (goal: well under a second);
- the same requests arriving as a Poisson process at the unit's saturation rate (the
  heaviest case: the slots are always full, so every step boundary is an event);
- the bisection for the largest sustainable rate on 2,000 requests;
- with a prompt-TTFT tail (``lens.prefill_tail``): the trace prediction, which then runs the machine
  again with every prefill stretched by a draw (``replicas(n)`` runs: one for 10,000 requests, 16
  for the 120 of the accuracy benchmark), and the 120-request one; the sim's profiles measure no
  tail, so the tail here is a made-up 101-level one, whose values barely change the time;
- with a decode pace as well (``lens.decode_pace``): the same two, every decode run of the extra runs
  taking its wall time from a path of the pace; the sim measures no correlated wander, so the pace
  here is a made-up one of the jax runner's size (-20% to +30%, 80 ms cells, forgetting in 250 ms);
- the summary of the trace prediction (``summarize_serving_prediction``: percentiles, good fraction,
  goodput), as composed and read over the tail's runs.

    python benchmarks/serving_speed.py [--trace PATH] [--batch 32] [--requests 10000] [--repeats 7]
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lens import arrivals  # noqa: E402
from lens.capacity import max_sustainable_rate, saturation_rate  # noqa: E402
from lens.compose import UnitTable  # noqa: E402
from lens.prefill_tail import replicas  # noqa: E402
from lens.probes import plan_probes, solve  # noqa: E402
from lens.serving import Scheduler, predict_serving  # noqa: E402
from lens.serving_metrics import summarize_serving_prediction  # noqa: E402
from lens.types import Candidate, ModelShape, Requests, Target, Unit  # noqa: E402
from lens.workload import fit_to, read_trace, window  # noqa: E402
from runners import get_runner  # noqa: E402
from spaces import ProfileSettings  # noqa: E402
from trace_files import trace_path  # noqa: E402  (benchmarks/ is on sys.path when run as a script)

TRACE = trace_path("azure_conv_2023.csv")
BUCKETS = (128, 256, 512, 1024, 2048, 4096, 8192)
LLAMA_1B = ModelShape(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=128256)


def timed(fn, repeats: int) -> tuple[float, float, float]:
    xs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs), min(xs), max(xs)


def fmt(t: tuple[float, float, float]) -> str:
    return f"median {t[0] * 1e3:8.1f} ms   (min {t[1] * 1e3:.1f} .. max {t[2] * 1e3:.1f})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=str(TRACE), help="a trace with an arrival column (default: Azure conv 2023)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)

    target = Target(name="speed", runner="sim", hardware="inf2", bucket_policy="exclusive", dtype="bfloat16",
                    model=LLAMA_1B, options=(("noise", 0.01),))
    runner = get_runner(target)
    res = runner.profile(Unit(target, 1, args.batch), plan_probes(BUCKETS, policy="exclusive", repeats=1,
                                                                    max_output=ProfileSettings().max_output))
    profiles = solve(res.runs, batch=args.batch, simulated=res.simulated)
    table = UnitTable.build(Candidate(1, args.batch, BUCKETS, BUCKETS), profiles, policy="exclusive")

    trace = read_trace(args.trace)
    fitted, dropped = fit_to(trace, BUCKETS[-1])
    req = window(fitted, args.requests, seed=0)
    sched = Scheduler()
    sat = saturation_rate(table, req, scheduler=sched)
    poisson = Requests(req.input_len, req.output_len, arrivals.poisson(len(req), rate=sat, seed=0), req.name)
    pred = predict_serving(table, req, scheduler=sched)
    heavy = predict_serving(table, poisson, scheduler=sched)
    small = Requests(req.input_len[:2000], req.output_len[:2000])
    unit = arrivals.unit_gaps(len(small), seed=0)
    search = max_sustainable_rate(table, small, unit_arrival_s=unit, scheduler=sched, slo={"ttft_p90_s": 2.0})

    print(f"unit: inf2 (SIMULATED profiles), Llama-3.2-1B shape, tp 1, batch {args.batch}, buckets {list(BUCKETS)}")
    print(f"workload: {len(req)} consecutive requests of {Path(args.trace).name} ({dropped} longer than "
          f"{BUCKETS[-1]} dropped from the trace first); {args.repeats} repeats each")
    print(f"  trace arrivals ({req.arrival_s[-1]:.0f} s of trace, {pred.decode_steps} decode steps): "
          f"{fmt(timed(lambda: predict_serving(table, req, scheduler=sched), args.repeats))}")
    print(f"  Poisson at saturation ({sat:.2f} req/s, {heavy.decode_steps} decode steps): "
          f"{fmt(timed(lambda: predict_serving(table, poisson, scheduler=sched), args.repeats))}")
    # the composition of a paged decode kernel (lens.context_cost): each run of steps adds its live rows' reads,
    # and the step boundary after an arrival is bisected for; 20 ns per KV token, the simulated TPU's size
    paged = dataclasses.replace(table, kv_token_s=20e-9)
    print(f"  trace arrivals, a paged kernel's context cost composed (20 ns per KV token): "
          f"{fmt(timed(lambda: predict_serving(paged, req, scheduler=sched), args.repeats))}")
    print(f"  Poisson at saturation, the same: "
          f"{fmt(timed(lambda: predict_serving(paged, poisson, scheduler=sched), args.repeats))}")
    t = timed(lambda: max_sustainable_rate(table, small, unit_arrival_s=unit, scheduler=sched,
                                           slo={"ttft_p90_s": 2.0}), max(3, args.repeats // 2))
    print(f"  largest sustainable rate, {len(small)} requests, ttft_p90_s <= 2 s: {search.rate_req_s:.3f} req/s "
          f"after {search.evaluations} predictions: {fmt(t)}")
    with_tail = dataclasses.replace(table, prefill_tail=tuple(float(v) for v in np.linspace(-1e-3, 2e-3, 101)),
                                    prefill_tail_median_s=0.01)
    few = Requests(req.input_len[:120], req.output_len[:120], req.arrival_s[:120], req.name)
    print(f"  trace arrivals with a prompt tail ({replicas(len(req))} more run of the machine): "
          f"{fmt(timed(lambda: predict_serving(with_tail, req, scheduler=sched), args.repeats))}")
    print(f"  its first {len(few)} requests, as composed: "
          f"{fmt(timed(lambda: predict_serving(table, few, scheduler=sched), args.repeats))}")
    print(f"  the same with the tail ({replicas(len(few))} more runs): "
          f"{fmt(timed(lambda: predict_serving(with_tail, few, scheduler=sched), args.repeats))}")
    paced = dataclasses.replace(with_tail, decode_pace=tuple(float(v) for v in np.linspace(-0.2, 0.3, 101)),
                                decode_pace_window_s=0.08, decode_pace_tau_s=0.25)
    print(f"  trace arrivals with the tail and a decode pace: "
          f"{fmt(timed(lambda: predict_serving(paced, req, scheduler=sched), args.repeats))}")
    print(f"  its first {len(few)} requests with both: "
          f"{fmt(timed(lambda: predict_serving(paced, few, scheduler=sched), args.repeats))}")
    tailed = predict_serving(with_tail, req, scheduler=sched)
    print(f"  summary of the trace prediction, as composed: "
          f"{fmt(timed(lambda: summarize_serving_prediction(req, pred), args.repeats))}")
    print(f"  the same, read over the tail's run: "
          f"{fmt(timed(lambda: summarize_serving_prediction(req, tailed), args.repeats))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
