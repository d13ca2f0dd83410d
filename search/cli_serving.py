"""The serving side of ``lensopt predict`` / ``measure``: arrivals, per-request SLOs and the summary.

Flag names follow ``vllm bench serve`` where it has one: ``--request-rate`` (requests per
second; ``--arrival-rate`` is accepted as the same flag), ``--burstiness`` (the Gamma shape
of the gaps, 1 = Poisson) and ``--goodput ttft:MS tpot:MS e2el:MS`` (per-request SLOs in
milliseconds); the summary prints vLLM's metric names (request throughput, request goodput,
output token throughput, TTFT/TPOT/E2EL). GuideLLM's ``--rate-type poisson --rate R``
describes the same process.
"""
from __future__ import annotations

import argparse
import math
from typing import Any, Mapping

from lens import arrivals
from lens.capacity import RateSearch
from lens.errors import UserError
from lens.serving_metrics import RequestSLO
from lens.types import Requests
from spaces import Space, WorkloadSpec
from spaces.workload import check_arrival_flags
from spaces.schema import flag_help

from .cli_common import fmt_s

#: vLLM's --goodput keys -> RequestSLO fields
GOODPUT_KEYS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2el": "e2e_s"}


def add_serving_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--request-rate", "--arrival-rate", dest="request_rate", type=float, metavar="R",
                   help="--mode continuous: " + flag_help(WorkloadSpec, "arrival_rate"))
    p.add_argument("--burstiness", type=float, metavar="K", help=flag_help(WorkloadSpec, "burstiness"))
    p.add_argument("--goodput", nargs="+", metavar="KEY:MS",
                   help="--mode continuous: per-request SLOs counted by goodput, in milliseconds, e.g. "
                        "--goodput ttft:500 tpot:50 e2el:3000 (vllm bench serve's form; default: the thresholds "
                        "of the space's [slo])")


def check_serving_args(args, mode: str) -> None:
    """Refuse serving flags outside continuous mode (they would be silently unused)."""
    if mode == "continuous":
        return
    for flag, v in (("--request-rate", args.request_rate), ("--burstiness", args.burstiness),
                    ("--goodput", args.goodput)):
        if v is not None:
            raise UserError(f"{flag} is read by --mode continuous only (this run is {mode}); add --mode continuous "
                            f"or drop {flag}")


def with_arrivals(args, space: Space, requests: Requests) -> tuple[Requests, str, float]:
    """``requests`` with arrival times from the flags, the space's [workload], or the trace's own."""
    w = space.workload or WorkloadSpec()
    rate = args.request_rate if args.request_rate is not None else w.arrival_rate
    burst = args.burstiness if args.burstiness is not None else w.burstiness
    check_arrival_flags(args.request_rate, args.burstiness)  # the space's own were checked as it loaded
    try:
        seed = args.seed if args.seed is not None else w.seed
        return arrivals.assign(requests, rate=rate, burstiness=burst, seed=seed)
    except UserError as exc:
        raise UserError(f"--mode continuous: {exc} (--request-rate R, or --workload TRACE with arrival times)") from None


def request_slo(args, space: Space) -> RequestSLO:
    """Per-request SLOs: ``--goodput KEY:MS ...``, else the space's [slo] thresholds."""
    if not args.goodput:
        return RequestSLO.from_constraints(dict(space.slo))
    out: dict[str, float] = {}
    for item in args.goodput:
        key, _, ms = item.partition(":")
        if key not in GOODPUT_KEYS or not ms:
            raise UserError(f"--goodput {item!r}: give KEY:MILLISECONDS with KEY one of {', '.join(GOODPUT_KEYS)} "
                            f"(e.g. --goodput ttft:500 tpot:50)")
        try:
            v = float(ms)
        except ValueError:
            raise UserError(f"--goodput {item!r}: {ms!r} is not a number of milliseconds") from None
        if not (math.isfinite(v) and v > 0):
            raise UserError(f"--goodput {item!r}: the threshold must be a positive number of milliseconds")
        out[GOODPUT_KEYS[key]] = v / 1e3
    return RequestSLO(**out)


def print_serving(kind: str, summary: Mapping[str, Any], *, arrivals_from: str, rate: float, slo: RequestSLO,
                  label: str) -> None:
    """The summary in ``vllm bench serve``'s layout and names (latencies in ms)."""
    line = "{:<40} {}".format
    print(label)
    print(f"{'=' * 14} Serving Benchmark Result ({kind}) {'=' * 14}")
    print(line("Successful requests:", summary["requests"]))
    print(line("Arrivals:", f"{arrivals_from}, {rate:.4g} req/s"))
    print(line("Benchmark duration (s):", f"{summary['total_s']:.2f}"))
    print(line("Total generated tokens:", summary["output_tokens"]))
    print(line("Request throughput (req/s):", f"{summary['request_throughput_req_s']:.2f}"))
    print(line("Request goodput (req/s):", f"{summary['request_goodput_req_s']:.2f}   (SLO: {slo.label()})"))
    print(line("Output token throughput (tok/s):", f"{summary['throughput_tok_s']:.2f}"))
    print(line("Output token throughput per chip (tok/s):", f"{summary['throughput_tok_s_per_chip']:.2f}"))
    for key, name in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2EL")):
        print(f"{'-' * 20} {name} {'-' * 20}")
        for stat, shown in (("mean", "Mean"), ("p50", "Median"), ("p90", "P90"), ("p99", "P99")):
            print(line(f"{shown} {name} (ms):", f"{summary[f'{key}_{stat}_s'] * 1e3:.2f}"))
    print(line("Queue growth (s/s):", f"{summary['queue_growth']:.4f}"))
    print("=" * 62)
    for k in ("queue_mean_s", "queue_p90_s"):
        if k in summary:
            print(f"  {k}: {fmt_s(summary[k])}")


def band_said(rng: Mapping[str, tuple[float, float]]) -> str:
    """The prediction's band (``lens.metrics.band``) in ``vllm bench serve``'s names: one line."""
    shown = [("request_throughput_req_s", "request throughput", 1.0, "req/s")] + [
        (f"{key}_{stat}_s", f"{'Median' if stat == 'p50' else 'P90'} {name}", 1e3, "ms")
        for key, name in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2EL")) for stat in ("p50", "p90")]
    parts = [f"{name} {rng[k][0] * k_:.2f}-{rng[k][1] * k_:.2f} {unit}" for k, name, k_, unit in shown
             if k in rng and all(math.isfinite(v) for v in rng[k])]
    return ("Band (every bucket's TTFT_b and TBT_b one standard error lower, then higher): "
            + (", ".join(parts) or "none (the profiles carry no +-)"))


def capacity_of(rs: RateSearch, *, chips: int, slo: Mapping[str, float], max_queue_growth: float) -> dict[str, Any]:
    """The bisection's answer as ``predict --json`` gives it (``capacity``)."""
    return {"sustainable_rate_req_s": rs.rate_req_s, "sustainable_rate_req_s_per_chip": rs.rate_req_s / chips,
            "unsustainable_above_req_s": rs.upper_req_s, "limited_by": rs.why_not,
            "saturation_req_s": rs.saturation_req_s, "predictions": rs.evaluations, "slo": dict(slo),
            "max_queue_growth": max_queue_growth}


def print_capacity(cap: Mapping[str, Any]) -> None:
    """The largest sustainable rate, what it is judged on, and what stops a higher one."""
    judged = ", ".join(f"{k} <= {fmt_s(v)}" for k, v in sorted(cap["slo"].items()))
    rate, per_chip = cap["sustainable_rate_req_s"], cap["sustainable_rate_req_s_per_chip"]
    said = (f"{rate:.4g} req/s{f' ({per_chip:.4g} per chip)' if per_chip != rate else ''} of this arrival pattern: "
            f"{'[slo] ' + judged + ' met and ' if judged else ''}the queue growing by at most "
            f"{cap['max_queue_growth']:g} s/s (objectives.max_queue_growth; a bisection on {cap['predictions']} "
            f"predictions)")
    if cap["limited_by"]:
        said += f"; above it: {cap['limited_by']}"
    print(f"Max sustainable rate: {said}")
