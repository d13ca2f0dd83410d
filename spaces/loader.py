"""Space files (TOML): schema, loading and validation.

Every error names the file, the key and the fix; unknown keys are errors, never ignored.
"""
from __future__ import annotations

import hashlib
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from lens.buckets import validate_buckets
from lens.errors import RunnerUnavailable, SpaceError, UserError
from lens.types import BATCHING, POLICIES, ModelShape, Target

DTYPES = ("float32", "bfloat16", "float16", "fp8")
#: metrics an objective or SLO may name (lens.metrics.summarize keys)
LATENCY_METRICS = tuple(f"{k}_{s}_s" for k in ("ttft", "tpot", "e2e") for s in ("mean", "p50", "p90", "p99"))
THROUGHPUT_METRICS = ("throughput_tok_s_per_chip", "throughput_tok_s")
_INT64_MAX = 2**63 - 1
#: most timed repeats of one probe, and most measurements of a noisy bucket
MAX_REPEATS = 10_000
MAX_ATTEMPTS = 8


@dataclass(frozen=True)
class SearchSpace:
    tp: tuple[int, ...]
    batch: tuple[int, ...]
    buckets: tuple[int, ...]
    #: most buckets a candidate set may hold (None: any number)
    max_buckets: int | None = None
    #: True: one bucket set for context encoding and token generation; False: searched apart
    tie_buckets: bool = True


@dataclass(frozen=True)
class WorkloadSpec:
    trace: Path | None = None
    distribution: str | None = None
    requests: int = 200
    seed: int = 0
    input_column: str | None = None
    output_column: str | None = None
    arrival_column: str | None = None
    #: multiply every input and output length (a trace's shape for a small model)
    length_scale: float = 1.0
    #: drop sampled requests longer than the largest bucket instead of stopping with an error
    drop_longer: bool = False


@dataclass(frozen=True)
class Objectives:
    throughput: str = "throughput_tok_s_per_chip"
    latency: str = "e2e_p90_s"


@dataclass(frozen=True)
class Hosts:
    #: Ray resources one unit needs: name -> number or an expression of tp ("tp", "2*tp", "tp/2")
    resources: tuple[tuple[str, Any], ...] = (("CPU", 1),)
    chips_per_host: int | None = None
    memory_gib_per_chip: float | None = None

    def resources_for(self, tp: int) -> dict[str, float]:
        return {name: _eval_tp(expr, tp) for name, expr in self.resources}


@dataclass(frozen=True)
class Budget:
    profile_s: float | None = None
    confirm_s: float | None = None
    top_k: int = 3
    trials: int = 200
    tolerance: float = 0.10


@dataclass(frozen=True)
class ProfileSettings:
    repeats: int = 3
    max_output: int = 128
    #: most seconds one profiling task may run (compile and runs of a unit); None: no limit
    timeout_s: float | None = None
    #: measurements of a bucket whose runs are impossible (T2 <= T1) or too noisy, at most
    attempts: int = 3
    #: largest accepted spread (max - min) / median of a probe's repeats before measuring again
    max_spread: float = 0.5
    #: seconds a claim on a unit lasts unless renewed (renewed every third of it while the
    #: task runs); another process waits at most this long for a claimant that died
    lease_s: float = 120.0


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


_TP_EXPR = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*\*\s*)?tp\s*(?:/\s*(\d+(?:\.\d+)?))?\s*$")


def _eval_tp(expr: Any, tp: int) -> float:
    if isinstance(expr, (int, float)) and not isinstance(expr, bool):
        return float(expr)
    m = _TP_EXPR.match(str(expr))
    if not m:
        raise UserError(f"resource amount {expr!r}: use a number or an expression like 'tp', '2*tp' or 'tp/2'")
    mul = float(m.group(1) or 1)
    div = float(m.group(2) or 1)
    return mul * tp / div


class _Section:
    """Typed access to one TOML table that remembers the file and the key path."""

    def __init__(self, path: Path, name: str, data: Any, allowed: set[str]):
        self.path, self.name = path, name
        where = f"[{name}]" if name else "the top level"
        if not isinstance(data, dict):
            self.fail(f"{where} must be a table")
        unknown = sorted(set(data) - allowed)
        if unknown:
            self.fail(
                f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(allowed))}"
            )
        self.data = data

    def fail(self, msg: str):
        raise SpaceError(f"{self.path}: {msg}")

    def key(self, k: str) -> str:
        return f"{self.name}.{k}"

    def get(self, k: str, typ, default=..., *, choices=None):
        if k not in self.data:
            if default is ...:
                self.fail(f"missing required key {self.key(k)}")
            return default
        v = self.data[k]
        if typ is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if isinstance(v, bool) and typ is not bool or not isinstance(v, typ):
            self.fail(f"{self.key(k)} = {v!r} must be {_typename(typ)}")
        if typ is float and not math.isfinite(v):
            self.fail(f"{self.key(k)} = {v!r} must be a finite number")
        if typ is int and abs(v) > _INT64_MAX:
            self.fail(f"{self.key(k)} = {v} is too large")
        if choices is not None and v not in choices:
            self.fail(f"{self.key(k)} = {v!r} is not one of {', '.join(map(str, choices))}")
        return v

    def positive_int(self, k: str, default=...) -> int:
        v = self.get(k, int, default)
        if v is not None and v < 1:
            self.fail(f"{self.key(k)} = {v} must be a positive integer")
        return v

    def int_list(self, k: str, default=...) -> tuple[int, ...]:
        v = self.get(k, list, default)
        if not v:
            self.fail(f"{self.key(k)} must be a non-empty list of positive integers")
        for x in v:
            if isinstance(x, bool) or not isinstance(x, int) or x < 1:
                self.fail(f"{self.key(k)} = {v!r}: {x!r} is not a positive integer")
            if x > _INT64_MAX:
                self.fail(f"{self.key(k)} = {v!r}: {x} is too large")
        if len(set(v)) != len(v):
            self.fail(f"{self.key(k)} = {v!r} has repeated values; list each once")
        return tuple(v)


def _typename(t) -> str:
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list", dict: "a table"}.get(
        t, getattr(t, "__name__", str(t))
    )


def load_space(path: str | Path) -> Space:
    """Read and validate a space file; raise ``SpaceError`` naming file, key and fix."""
    if not str(path).strip():
        raise SpaceError("SPACE is empty: give a space file (TOML), e.g. spaces/quickstart.toml")
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise SpaceError(f"{p}: no such space file (see spaces/quickstart.toml for an example)") from None
    except IsADirectoryError:
        raise SpaceError(f"{p}: is a directory; give a space file (TOML), e.g. spaces/quickstart.toml") from None
    except OSError as exc:
        raise SpaceError(f"{p}: cannot read the space file: {exc.strerror}") from None
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise SpaceError(f"{p}: not a UTF-8 text file; a space file is TOML") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpaceError(f"{p}: malformed TOML: {exc}") from None
    return parse_space(doc, path=p, sha256=hashlib.sha256(raw).hexdigest())


def parse_space(doc: Mapping[str, Any], *, path: Path, sha256: str = "") -> Space:
    top = _Section(path, "", doc, {"target", "space", "workload", "objectives", "slo", "hosts", "budget", "profile"})
    top.name = "file"
    if "target" not in doc:
        top.fail("missing the [target] table")
    if "space" not in doc:
        top.fail("missing the [space] table")
    target = _target(path, doc["target"])
    return Space(
        path=path,
        sha256=sha256,
        target=target,
        search=_space(path, doc["space"], target),
        workload=_workload(path, doc["workload"]) if "workload" in doc else None,
        objectives=_objectives(path, doc.get("objectives", {})),
        slo=_slo(path, doc.get("slo", {})),
        hosts=_hosts(path, doc.get("hosts", {}), target),
        budget=_budget(path, doc.get("budget", {})),
        profile=_profile(path, doc.get("profile", {})),
    )


def _target(path: Path, data) -> Target:
    s = _Section(path, "target", data, {"name", "runner", "hardware", "bucket_policy", "dtype", "seed", "model", "options", "batching"})
    m = _Section(path, "target.model", s.get("model", dict), {"layers", "hidden", "heads", "kv_heads", "intermediate", "vocab"})
    model = ModelShape(**{k: m.positive_int(k) for k in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab")})
    if model.hidden % model.heads:
        m.fail(f"target.model.hidden = {model.hidden} is not a multiple of heads = {model.heads}")
    if model.heads % model.kv_heads:
        m.fail(f"target.model.heads = {model.heads} is not a multiple of kv_heads = {model.kv_heads}")
    options = s.get("options", dict, {})
    from runners import available, runner_class

    runner = s.get("runner", str)
    if runner not in available():
        s.fail(f"target.runner = {runner!r} is unknown: use one of {', '.join(available())}")
    target = Target(
        name=s.get("name", str),
        runner=runner,
        hardware=s.get("hardware", str),
        bucket_policy=s.get("bucket_policy", str, "exclusive", choices=POLICIES),
        dtype=s.get("dtype", str, "bfloat16", choices=DTYPES),
        model=model,
        options=tuple(sorted(options.items())),
        seed=_seed(s, "seed"),
        batching=s.get("batching", str, "static", choices=BATCHING),
    )
    try:
        schema = runner_class(runner).options_schema
    except RunnerUnavailable:
        schema = None  # validated when the runner is installed and chosen
    if schema is not None:
        o = _Section(path, "target.options", options, set(schema))
        for k, (typ, default) in schema.items():
            o.get(k, typ, default)
        # the runner checks its values too (ranges, the device kind): say which file they came from
        try:
            runner_class(runner)(target)
        except RunnerUnavailable:
            pass
        except UserError as exc:
            s.fail(f"[target] / [target.options]: {exc}")
    return target


def _space(path: Path, data, target: Target) -> SearchSpace:
    from lens.workload import MAX_TOKENS

    s = _Section(path, "space", data, {"tp", "batch", "buckets", "max_buckets", "tie_buckets"})
    tp = s.int_list("tp")
    batch = s.int_list("batch")
    raw_buckets = s.get("buckets", list)
    if any(isinstance(b, int) and not isinstance(b, bool) and b > MAX_TOKENS for b in raw_buckets):
        s.fail(f"space.buckets = {raw_buckets!r}: a bucket longer than {MAX_TOKENS:,} tokens is not a sequence length")
    try:
        buckets = validate_buckets(raw_buckets, what=f"{path}: space.buckets")
    except UserError as exc:
        raise SpaceError(str(exc)) from None
    m = target.model
    ok = [t for t in tp if m.heads % t == 0 and m.kv_heads % t == 0]
    if not ok:
        s.fail(
            f"space.tp = {list(tp)}: no value divides both heads = {m.heads} and kv_heads = {m.kv_heads}; "
            f"use divisors of {m.kv_heads}"
        )
    max_b = s.get("max_buckets", int, None)
    if max_b is not None and max_b < 1:
        s.fail(f"space.max_buckets = {max_b} must be at least 1")
    return SearchSpace(
        tp=tuple(sorted(tp)),
        batch=tuple(sorted(batch)),
        buckets=buckets,
        max_buckets=max_b,
        tie_buckets=s.get("tie_buckets", bool, True),
    )


def _workload(path: Path, data) -> WorkloadSpec:
    s = _Section(path, "workload", data, {"trace", "distribution", "requests", "seed", "input_column", "output_column", "arrival_column",
                                           "length_scale", "drop_longer"})
    trace = s.get("trace", str, None)
    dist = s.get("distribution", str, None)
    if (trace is None) == (dist is None):
        s.fail("[workload] needs exactly one of trace = \"FILE\" or distribution = \"NAME\"")
    from lens.workload import MAX_REQUESTS

    requests = s.positive_int("requests", 200)
    if requests > MAX_REQUESTS:
        s.fail(f"workload.requests = {requests} is more than {MAX_REQUESTS:,}; sample fewer requests")
    seed = s.get("seed", int, 0)
    if seed < 0:
        s.fail(f"workload.seed = {seed} must be an integer >= 0")
    return WorkloadSpec(
        trace=(path.parent / trace) if trace is not None else None,
        distribution=dist,
        requests=requests,
        seed=seed,
        input_column=s.get("input_column", str, None),
        output_column=s.get("output_column", str, None),
        arrival_column=s.get("arrival_column", str, None),
        length_scale=_length_scale(s),
        drop_longer=s.get("drop_longer", bool, False),
    )


def _length_scale(s: "_Section") -> float:
    v = _positive(s, "length_scale", 1.0)
    if v > 1000:
        s.fail(f"workload.length_scale = {v} is more than 1000; it multiplies every request length")
    return v


def _seed(s: "_Section", k: str) -> int:
    v = s.get(k, int, 0)
    if v < 0:
        s.fail(f"{s.key(k)} = {v} must be an integer >= 0")
    return v


def _positive(s: "_Section", k: str, default: float) -> float:
    v = s.get(k, float, default)
    if not v > 0:
        s.fail(f"{s.key(k)} = {v} must be a positive number")
    return v


def _objectives(path: Path, data) -> Objectives:
    s = _Section(path, "objectives", data, {"throughput", "latency"})
    return Objectives(
        throughput=s.get("throughput", str, "throughput_tok_s_per_chip", choices=THROUGHPUT_METRICS),
        latency=s.get("latency", str, "e2e_p90_s", choices=LATENCY_METRICS),
    )


def _slo(path: Path, data) -> tuple[tuple[str, float], ...]:
    s = _Section(path, "slo", data, set(LATENCY_METRICS))
    out = []
    for k in sorted(data):
        v = s.get(k, float)
        if v <= 0:
            s.fail(f"slo.{k} = {v} must be a positive number of seconds")
        out.append((k, v))
    return tuple(out)


def _hosts(path: Path, data, target: Target) -> Hosts:
    s = _Section(path, "hosts", data, {"resources", "chips_per_host", "memory_gib_per_chip"})
    res = s.get("resources", dict, {"CPU": 1})
    for name, expr in res.items():
        try:
            _eval_tp(expr, 1)
        except UserError as exc:
            s.fail(f"hosts.resources.{name}: {exc}")
    mem = s.get("memory_gib_per_chip", float, None)
    if mem is not None and mem <= 0:
        s.fail(f"hosts.memory_gib_per_chip = {mem} must be positive")
    return Hosts(
        resources=tuple(sorted(res.items())),
        chips_per_host=s.positive_int("chips_per_host", None),
        memory_gib_per_chip=mem,
    )


def _budget(path: Path, data) -> Budget:
    s = _Section(path, "budget", data, {"profile_s", "confirm_s", "top_k", "trials", "tolerance"})
    for k in ("profile_s", "confirm_s"):
        v = s.get(k, float, None)
        if v is not None and v <= 0:
            s.fail(f"budget.{k} = {v} must be a positive number of seconds")
    tol = s.get("tolerance", float, 0.10)
    if not 0 < tol < 10:
        s.fail(f"budget.tolerance = {tol} must be a fraction such as 0.1")
    return Budget(
        profile_s=s.get("profile_s", float, None),
        confirm_s=s.get("confirm_s", float, None),
        top_k=s.positive_int("top_k", 3),
        trials=s.positive_int("trials", 200),
        tolerance=tol,
    )


def _profile(path: Path, data) -> ProfileSettings:
    s = _Section(path, "profile", data, {"repeats", "max_output", "timeout_s", "attempts", "max_spread", "lease_s"})
    mo = s.positive_int("max_output", 128)
    if mo < 2:
        s.fail("profile.max_output must be at least 2 (two output lengths per bucket)")
    timeout = s.get("timeout_s", float, None)
    if timeout is not None:
        timeout = _positive(s, "timeout_s", 1.0)
    repeats = s.positive_int("repeats", 3)
    if repeats > MAX_REPEATS:
        s.fail(f"profile.repeats = {repeats} is more than {MAX_REPEATS:,}")
    attempts = s.positive_int("attempts", 3)
    if attempts > MAX_ATTEMPTS:
        s.fail(f"profile.attempts = {attempts} is more than {MAX_ATTEMPTS} (each attempt doubles the repeats)")
    return ProfileSettings(
        repeats=repeats,
        max_output=mo,
        timeout_s=timeout,
        attempts=attempts,
        max_spread=_positive(s, "max_spread", 0.5),
        lease_s=_positive(s, "lease_s", 120.0),
    )
