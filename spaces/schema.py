"""The schema of a space file: one frozen dataclass per TOML table.

Each setting is declared once, here (or, for ``[target]``, on ``lens.types.Target``): its
dataclass field carries the default, the type, the bounds and the help text. The loader
validates a file from that metadata (``check``), the command line's help and checks read
it (``flag_help``, ``check``), and the code reads the values from the ``Space``.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import MISSING, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from lens.arrivals import MAX_RATE
from lens.capacity import MAX_QUEUE_GROWTH
from lens.drift import DRIFT_CHECKS
from lens.errors import UserError
from lens.types import Scheduler, Target
from lens.workload import DEFAULT_REQUESTS, MAX_REQUESTS

#: metrics an objective or SLO may name (lens.metrics.summarize keys)
LATENCY_METRICS = tuple(f"{k}_{s}_s" for k in ("ttft", "tpot", "e2e") for s in ("mean", "p50", "p90", "p99"))
#: throughputs of continuous serving (lens.serving_metrics keys; the sustainable rate from lens.capacity)
SERVING_THROUGHPUT_METRICS = ("request_throughput_req_s_per_chip", "goodput_req_s_per_chip",
                              "sustainable_rate_req_s_per_chip")
THROUGHPUT_METRICS = ("throughput_tok_s_per_chip", "throughput_tok_s") + SERVING_THROUGHPUT_METRICS
#: most timed repeats of one probe, and most measurements of a noisy bucket
MAX_REPEATS = 10_000
MAX_ATTEMPTS = 8


def setting(default: Any, typ: type, *, help: str, min: float | None = None, max: float | None = None,
            above: float | None = None, below: float | None = None, choices: tuple | None = None,
            hint: str = "", infinite: str = "") -> Any:
    """A dataclass field for one space-file setting: default, type, bounds and help in one place.

    ``min``/``max`` are inclusive bounds, ``above``/``below`` exclusive ones; ``hint`` closes
    the message a value out of bounds gets, ``infinite`` the one an infinite value over ``max``
    gets instead (what to give in its place).
    """
    meta = {"type": typ, "help": help, "min": min, "max": max, "above": above, "below": below, "choices": choices,
            "hint": hint, "infinite": infinite}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class SearchSpace:
    tp: tuple[int, ...] = field(metadata={"help": "tensor-parallel degrees to search"})
    batch: tuple[int, ...] = field(metadata={"help": "batch sizes to search"})
    buckets: tuple[int, ...] = field(metadata={
        "help": "candidate bucket boundaries; a bucket set is a subset holding the largest"})
    max_buckets: int | None = setting(None, int, min=1, help="most buckets a candidate set may hold (unset: any number)")
    tie_buckets: bool = setting(True, bool, help="one bucket set for context encoding and token generation "
                                                 "(false: the two are searched apart)")


@dataclass(frozen=True)
class WorkloadSpec:
    trace: Path | None = setting(None, str, help="a trace file (CSV or JSONL), relative to the space file")
    distribution: str | None = setting(None, str, help="a built-in workload name")
    requests: int = setting(DEFAULT_REQUESTS, int, min=1, max=MAX_REQUESTS, hint="the number of requests sampled",
                            help="workload sample size")
    seed: int = setting(0, int, min=0, help="workload sampling seed")
    input_column: str | None = setting(None, str, help="a trace's input-length column (auto-detected when unset)")
    output_column: str | None = setting(None, str, help="a trace's output-length column")
    arrival_column: str | None = setting(None, str, help="a trace's arrival-time column")
    length_scale: float = setting(1.0, float, above=0, max=1000, hint="it multiplies every request length",
                                  help="multiply every input and output length (a trace's shape for a small model)")
    drop_longer: bool = setting(False, bool, help="drop sampled requests longer than the largest bucket "
                                                  "instead of stopping with an error")
    arrival_rate: float | None = setting(None, float, above=0, max=MAX_RATE, hint="requests per second",
                                         infinite="for every request at once (vllm bench's inf) give a rate far "
                                                  "above what the unit serves, e.g. 1e6 requests per second",
                                         help="requests per second arriving (continuous serving): a seeded Poisson "
                                              "process, or a trace's own arrivals rescaled to this mean rate; unset: "
                                              "the trace's arrival times as they are")
    burstiness: float = setting(1.0, float, above=0, max=1000, hint="1 is a Poisson process",
                                help="shape of the Gamma-distributed gaps between arrivals at arrival_rate (1: Poisson, "
                                     "below 1 burstier; vllm bench serve's --burstiness)")


@dataclass(frozen=True)
class Objectives:
    throughput: str = setting("throughput_tok_s_per_chip", str, choices=THROUGHPUT_METRICS,
                              help="the throughput to maximise")
    latency: str = setting("e2e_p90_s", str, choices=LATENCY_METRICS, help="the latency to minimise")
    max_queue_growth: float = setting(MAX_QUEUE_GROWTH, float, min=0, max=10, hint="seconds of waiting per second",
                                      help="continuous serving: a rate is sustainable while the queue grows by at most "
                                           "this many seconds of waiting per second of trace (and every SLO holds)")


@dataclass(frozen=True)
class Hosts:
    #: Ray resources one unit needs: name -> number or an expression of tp ("tp", "2*tp", "tp/2")
    resources: tuple[tuple[str, Any], ...] = setting((("CPU", 1),), dict,
                                                     help="Ray resources one unit needs (numbers or 'tp', '2*tp', 'tp/2')")
    chips_per_host: int | None = setting(None, int, min=1, help="chips per host (prunes tp > chips per host)")
    memory_gib_per_chip: float | None = setting(None, float, above=0, help="device memory per chip, GiB (prunes "
                                                                           "units whose weights and KV cache do not fit)")

    def resources_for(self, tp: int) -> dict[str, float]:
        return {name: eval_tp(expr, tp) for name, expr in self.resources}


_TP_EXPR = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*\*\s*)?tp\s*(?:/\s*(\d+(?:\.\d+)?))?\s*$")


def eval_tp(expr: Any, tp: int) -> float:
    """A resource amount: a number, or an expression of tp ("tp", "2*tp", "tp/2")."""
    if isinstance(expr, (int, float)) and not isinstance(expr, bool):
        return float(expr)
    m = _TP_EXPR.match(str(expr))
    if not m:
        raise UserError(f"resource amount {expr!r}: use a number or an expression like 'tp', '2*tp' or 'tp/2'")
    mul = float(m.group(1) or 1)
    div = float(m.group(2) or 1)
    return mul * tp / div


@dataclass(frozen=True)
class Budget:
    profile_s: float | None = setting(None, float, above=0, help="most hardware seconds spent profiling")
    confirm_s: float | None = setting(None, float, above=0, help="most hardware seconds spent confirming")
    confirm_timeout_s: float | None = setting(None, float, above=0, help="most seconds one confirmation task (the "
                                                                         "candidate's compile, warm-up and workload) "
                                                                         "may run; unset: no limit")
    stop_gain: float = setting(0.002, float, min=0, below=1, hint="a fraction such as 0.002",
                               help="profiling stops when no unit's buckets are expected to add this fraction of "
                                    "the measured front's hypervolume")
    top_k: int = setting(3, int, min=1, help="candidates confirmed on the hardware")
    confirm_repeats: int = setting(3, int, min=1, max=100,
                                   help="passes of the workload in each confirmation; each request's median over "
                                        "them is judged (one pass on a shared host scatters by about the tolerance)")
    trials: int = setting(200, int, min=1, help="Optuna trials")
    tolerance: float = setting(0.10, float, above=0, below=10, hint="a fraction such as 0.1",
                               help="confirmation disagreement flagged above this fraction")
    drift_tolerance: float = setting(0.05, float, above=0, below=1, hint="a fraction such as 0.05",
                                     help="host drift (a reference probe now vs in the profile) beyond which, and "
                                          "beyond twice its own noise, the drift counts: with drift_check = "
                                          "\"reference\", a confirmation's prediction is then corrected for it "
                                          "before it is judged")
    drift_reprofile: float = setting(0.10, float, min=0, below=10, hint="a fraction such as 0.1",
                                     help="drift_check = \"reference\": host drift beyond which (and beyond "
                                          "drift_tolerance) the buckets the requests use are profiled again after "
                                          "a measurement or confirmation before it is judged, instead of re-scaling "
                                          "the prediction (0: at any drift worth correcting); the default is the "
                                          "confirmation tolerance, since a drift that large would decide the "
                                          "verdict by itself")
    drift_check: str = setting(DRIFT_CHECKS[0], str, choices=DRIFT_CHECKS,
                               help="how a measurement or confirmation tells the host's drift from model error: "
                                    "\"side-by-side\" runs the probes of every bucket the requests use in rounds "
                                    "before, between and after the runs and judges the runs on the prediction from "
                                    "them (the host as it was during the runs; the as-is error is kept beside it); "
                                    "\"reference\" runs only the reference probe before and after them (cheaper) "
                                    "and acts on its drift (drift_tolerance, drift_reprofile)")


@dataclass(frozen=True)
class ProfileSettings:
    repeats: int = setting(3, int, min=1, max=MAX_REPEATS, help="timed repeats of each probe run (the median is kept)")
    max_output: int = setting(128, int, min=2, hint="two output lengths per bucket",
                              help="output of the first longer probe run (a bucket whose TBT_b is not tight is "
                                   "measured again with a longer one, up to the bucket's window)")
    timeout_s: float | None = setting(None, float, above=0, help="most seconds one profiling task (compile and runs "
                                                                 "of a unit) may run; unset: no limit")
    attempts: int = setting(3, int, min=1, max=MAX_ATTEMPTS, hint="each attempt doubles the repeats",
                            help="measurements of a bucket whose runs are impossible (T2 <= T1) or too noisy, at most")
    max_spread: float = setting(0.05, float, above=0, hint="a fraction such as 0.05",
                                help="largest accepted relative spread (+-, one standard error bootstrapped over the "
                                     "repeats) of a bucket's derived TTFT_b and TBT_b before it is measured again")
    lease_s: float = setting(120.0, float, above=0, help="seconds a claim on a unit lasts unless renewed (renewed every "
                                                         "third of it while the task runs); another process waits at "
                                                         "most this long for a claimant that died")


@dataclass(frozen=True)
class Space:
    path: Path
    sha256: str
    target: Target
    search: SearchSpace
    workload: WorkloadSpec | None = None
    objectives: Objectives = field(default_factory=Objectives)
    slo: tuple[tuple[str, float], ...] = ()
    hosts: Hosts = field(default_factory=Hosts)
    budget: Budget = field(default_factory=Budget)
    profile: ProfileSettings = field(default_factory=ProfileSettings)


#: the TOML table of each schema class
TABLES: dict[type, str] = {Target: "target", Scheduler: "target.scheduler", SearchSpace: "space",
                           WorkloadSpec: "workload", Objectives: "objectives", Hosts: "hosts", Budget: "budget",
                           ProfileSettings: "profile"}


def _field(cls: type, name: str) -> dataclasses.Field:
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f
    raise KeyError(f"{cls.__name__} has no setting {name!r}")


def keys(cls: type) -> set[str]:
    """The TOML keys of a table: the fields of its class."""
    return {f.name for f in dataclasses.fields(cls)}


def meta(cls: type, name: str) -> Mapping[str, Any]:
    return _field(cls, name).metadata


def default(cls: type, name: str) -> Any:
    """The value a space file gets when it leaves the key out (``...``: the key is required)."""
    f = _field(cls, name)
    if f.default is not MISSING:
        return f.default
    return f.metadata.get("default", ...)


def check(cls: type, name: str, value: Any) -> str | None:
    """What is wrong with ``value`` for this setting (its bounds and choices), or None."""
    m = meta(cls, name)
    if value is None:
        return None
    choices = m.get("choices")
    if choices is not None and value not in choices:
        return f"is not one of {', '.join(map(str, choices))}"
    why = None
    lo, hi, above, below = m.get("min"), m.get("max"), m.get("above"), m.get("below")
    if lo is not None and value < lo:
        why = {1: "must be a positive integer", 0: "must be an integer >= 0"}.get(lo, f"must be at least {lo:g}")
    elif above is not None and not value > above:
        why = "must be a positive number" if above == 0 else f"must be more than {above:g}"
    elif hi is not None and value > hi and value == float("inf") and m.get("infinite"):
        return f"is not a finite number: {m['infinite']}"
    elif hi is not None and value > hi:
        why = f"is more than {hi:,}"
    elif below is not None and not value < below:
        why = f"must be less than {below:g}"
    if why and m.get("hint"):
        why += f" ({m['hint']})"
    return why


def flag_help(cls: type, name: str, text: str | None = None) -> str:
    """Help of a command-line flag that overrides a space-file setting, read from its schema."""
    d = default(cls, name)
    key = f"{TABLES[cls]}.{name}"
    shown = "unset" if d is None else str(d)
    return f"{text or meta(cls, name)['help']} (default: the space's {key}, {shown} if the file leaves it out)"
