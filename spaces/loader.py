"""Space files (TOML): loading and validation against the schema (``spaces.schema``).

Every error names the file, the key and the fix; unknown keys are errors, never ignored.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import tomllib
from pathlib import Path
from typing import Any, Mapping

from lens.buckets import validate_buckets
from lens.errors import RunnerUnavailable, SpaceError, UserError
from lens.types import ModelShape, Scheduler, Target

from . import schema
from .schema import Budget, Hosts, Objectives, ProfileSettings, SearchSpace, Space, WorkloadSpec, eval_tp

_INT64_MAX = 2**63 - 1


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

    def setting(self, cls: type, k: str):
        """The value of key ``k``, typed, defaulted and bounded by its schema field (see spaces.schema)."""
        m = schema.meta(cls, k)
        if self.data.get(k) == math.inf and m.get("infinite"):  # what to give instead, where the schema says
            self.fail(f"{self.key(k)} = inf {schema.check(cls, k, math.inf)}")
        v = self.get(k, m["type"], schema.default(cls, k))
        if k in self.data:
            why = schema.check(cls, k, v)
            if why:
                self.fail(f"{self.key(k)} = {v!r} {why}")
        return v

    def settings(self, cls: type, *names: str) -> dict[str, Any]:
        return {k: self.setting(cls, k) for k in names}

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
    top = _Section(path, "", doc, {t for t in schema.TABLES.values() if "." not in t} | {"slo"})
    top.name = "file"
    if "target" not in doc:
        top.fail("missing the [target] table")
    if "space" not in doc:
        top.fail("missing the [space] table")
    target = _target(path, doc["target"])
    space = Space(
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
    _check_serving(space)
    return space


def _check_serving(sp: Space) -> None:
    """The settings that only continuous serving reads, against target.serving (docs/serving.md)."""
    w, where = sp.workload, sp.path
    if sp.target.serving == "continuous":
        if w is not None and w.distribution is not None and w.arrival_rate is None:
            raise SpaceError(f"{where}: [target] serving = \"continuous\" needs arrivals: set workload.arrival_rate "
                             f"(requests per second), or use a trace with an arrival column")
        return
    if w is not None and w.arrival_rate is not None:
        raise SpaceError(f"{where}: workload.arrival_rate = {w.arrival_rate:g} is read by continuous serving only; "
                         f"set [target] serving = \"continuous\" or remove it")
    if sp.objectives.throughput in schema.SERVING_THROUGHPUT_METRICS:
        raise SpaceError(f"{where}: objectives.throughput = {sp.objectives.throughput!r} is a continuous-serving "
                         f"metric; set [target] serving = \"continuous\" or choose one of "
                         f"{', '.join(m for m in schema.THROUGHPUT_METRICS if m not in schema.SERVING_THROUGHPUT_METRICS)}")


def _table(s: _Section, cls: type):
    """Every key of a table that is a plain setting, read and checked by its schema field."""
    return cls(**{f.name: s.setting(cls, f.name) for f in dataclasses.fields(cls)})


def _target(path: Path, data) -> Target:
    s = _Section(path, "target", data, schema.keys(Target))
    m = _Section(path, "target.model", s.get("model", dict), schema.keys(ModelShape))
    model = ModelShape(**{f.name: m.positive_int(f.name) for f in dataclasses.fields(ModelShape)})
    if model.hidden % model.heads:
        m.fail(f"target.model.hidden = {model.hidden} is not a multiple of heads = {model.heads}")
    if model.heads % model.kv_heads:
        m.fail(f"target.model.heads = {model.heads} is not a multiple of kv_heads = {model.kv_heads}")
    options = s.get("options", dict, {})
    from runners import available, runner_class

    runner = s.setting(Target, "runner")
    if runner not in available():
        s.fail(f"target.runner = {runner!r} is unknown: use one of {', '.join(available())}")
    scheduler = _table(_Section(path, "target.scheduler", s.get("scheduler", dict, {}), schema.keys(Scheduler)),
                       Scheduler)
    target = Target(
        model=model,
        options=tuple(sorted(options.items())),
        scheduler=scheduler,
        **s.settings(Target, "name", "runner", "hardware", "bucket_policy", "dtype", "seed", "batching", "prefill",
                     "serving"),
    )
    try:
        cls = runner_class(runner)
    except RunnerUnavailable:
        cls = None  # validated when the runner is installed and chosen
    if cls is not None and cls.refuses_batching(target):
        s.fail(cls.refuses_batching(target))
    options_schema = cls.options_schema if cls is not None else None
    if options_schema is not None:
        for k in sorted(set(options) & set(cls.moved_options)):
            s.fail(f"target.options.{k} = {json.dumps(options[k])} is no longer an option: {cls.moved_options[k]}")
        o = _Section(path, "target.options", options, set(options_schema))
        for k, (typ, default) in options_schema.items():
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

    s = _Section(path, "space", data, schema.keys(SearchSpace))
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
    return SearchSpace(tp=tuple(sorted(tp)), batch=tuple(sorted(batch)), buckets=buckets,
                       **s.settings(SearchSpace, "max_buckets", "tie_buckets"))


def _workload(path: Path, data) -> WorkloadSpec:
    s = _Section(path, "workload", data, schema.keys(WorkloadSpec))
    w = _table(s, WorkloadSpec)
    if (w.trace is None) == (w.distribution is None):
        s.fail("[workload] needs exactly one of trace = \"FILE\" or distribution = \"NAME\"")
    return dataclasses.replace(w, trace=path.parent / w.trace) if w.trace is not None else w


def _objectives(path: Path, data) -> Objectives:
    return _table(_Section(path, "objectives", data, schema.keys(Objectives)), Objectives)


def _slo(path: Path, data) -> tuple[tuple[str, float], ...]:
    s = _Section(path, "slo", data, set(schema.LATENCY_METRICS))
    out = []
    for k in sorted(data):
        v = s.get(k, float)
        if v <= 0:
            s.fail(f"slo.{k} = {v} must be a positive number of seconds")
        out.append((k, v))
    return tuple(out)


def _hosts(path: Path, data, target: Target) -> Hosts:
    s = _Section(path, "hosts", data, schema.keys(Hosts))
    res = s.get("resources", dict, dict(schema.default(Hosts, "resources")))
    for name, expr in res.items():
        try:
            eval_tp(expr, 1)
        except UserError as exc:
            s.fail(f"hosts.resources.{name}: {exc}")
    return Hosts(resources=tuple(sorted(res.items())), **s.settings(Hosts, "chips_per_host", "memory_gib_per_chip"))


def _budget(path: Path, data) -> Budget:
    return _table(_Section(path, "budget", data, schema.keys(Budget)), Budget)


def _profile(path: Path, data) -> ProfileSettings:
    return _table(_Section(path, "profile", data, schema.keys(ProfileSettings)), ProfileSettings)
