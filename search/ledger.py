"""The ledger of one run: what it measured, reused, waited for and spent, and what it chose.

It is written to ``run.json`` (the keys the report and the tests read) at each checkpoint
and at the end, read back to resume a run, and read by ``lensopt confirm`` for the front.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from lens.types import Candidate, ModelShape, Scheduler, Target
from spaces import WorkloadDescription

if TYPE_CHECKING:
    from .confirm import Confirmation

Unit = tuple[int, int]


def unit_key(unit: Unit) -> str:
    """How run.json names a unit: ``"<tp>x<batch>"``."""
    return f"{unit[0]}x{unit[1]}"


def _unit_of(key: str) -> Unit:
    tp, batch = key.split("x")
    return int(tp), int(batch)


@dataclass(frozen=True)
class UnitTask:
    """One profiling task that came back with a unit: where and when it ran, what it cost."""

    tp: int
    batch: int
    buckets: tuple[int, ...]
    node_id: str
    started_at: float
    ended_at: float
    hardware_s: float
    attempts: int
    #: what each host cost measured with the unit came to (the row cost, the served admissions, a row's
    #: context, the resume), as its record says it, counted or not: (what, text) pairs
    host_costs: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"tp": self.tp, "batch": self.batch, "buckets": list(self.buckets), "node_id": self.node_id,
                "started_at": self.started_at, "ended_at": self.ended_at, "hardware_s": self.hardware_s,
                "attempts": self.attempts, "host_costs": dict(self.host_costs)}


@dataclass
class RunLedger:
    """Everything a run records about itself besides its trials (those are in the trial store)."""

    run: str = ""
    space: str = ""
    space_sha256: str = ""
    fingerprint: str = ""
    target: Target | None = None
    workload: WorkloadDescription | None = None
    sampler: str | None = None
    trials_requested: int | None = None
    simulated: bool = False
    versions: dict[str, str] = field(default_factory=dict)
    cache: str | None = None
    ray_address: str | None = None
    started_at: float | None = None
    #: units found in the cache / measured by this run (and the runs it resumed)
    units_reused: list[Unit] = field(default_factory=list)
    units_measured: list[Unit] = field(default_factory=list)
    units_failed: dict[Unit, str] = field(default_factory=dict)
    #: unit -> bucket -> why its repeats spread more than profile.max_spread
    units_noisy: dict[Unit, dict[int, str]] = field(default_factory=dict)
    #: units another search was profiling, whose profiles this one waited for
    units_waited: list[Unit] = field(default_factory=list)
    unit_tasks: list[UnitTask] = field(default_factory=list)
    profile_hardware_s: float = 0.0
    confirm_hardware_s: float = 0.0
    #: why profiling stopped (the evidence, or the budget)
    profile_stop: str = ""
    profile_tasks: int = 0
    confirm_tasks: int = 0
    profile_tasks_this_run: int = 0
    trials: int = 0
    #: "running", "interrupted" or "complete"
    state: str = "running"
    wall_s: float | None = None
    slo_met: bool | None = None
    #: the Pareto front, lowest latency first (None: not recorded, as in older run.json files),
    #: and the candidate chosen on it (its knee)
    front: list[Candidate] | None = None
    chosen: Candidate | None = None
    confirmed: list["Confirmation"] = field(default_factory=list)
    #: --estimate-only runs: every number comes from this analytical model of this GPU
    estimate_only: bool = False
    estimator: str | None = None
    gpu: str | None = None

    # -- bookkeeping ----------------------------------------------------------------------
    def note_reused(self, unit: Unit) -> None:
        self.units_failed.pop(unit, None)  # its profiles are here after all (another search measured it)
        if unit not in self.units_measured and unit not in self.units_reused:
            self.units_reused.append(unit)

    def note_measured(self, unit: Unit, task: UnitTask) -> None:
        self.units_failed.pop(unit, None)  # a retry succeeded: the unit is no longer a failed one
        if unit not in self.units_measured:
            self.units_measured.append(unit)
        self.unit_tasks.append(task)
        self.profile_hardware_s += task.hardware_s

    def note_noisy(self, unit: Unit, why: Mapping[int, str]) -> None:
        if why:
            self.units_noisy.setdefault(unit, {}).update(why)

    def resume_from(self, prev: "RunLedger") -> None:
        """Carry over what an earlier, interrupted run of the same target measured and spent."""
        self.units_measured = list(prev.units_measured)
        self.units_failed = dict(prev.units_failed)
        self.units_noisy = {u: dict(b) for u, b in prev.units_noisy.items()}
        self.profile_hardware_s, self.confirm_hardware_s = prev.profile_hardware_s, prev.confirm_hardware_s
        self.profile_tasks, self.confirm_tasks = prev.profile_tasks, prev.confirm_tasks
        self.confirmed = list(prev.confirmed)

    # -- run.json -------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "run": self.run, "space": self.space, "space_sha256": self.space_sha256, "fingerprint": self.fingerprint,
            "target": self.target.to_dict() if self.target else None,
            "workload": self.workload.to_json() if self.workload else None,
            "sampler": self.sampler, "trials_requested": self.trials_requested, "simulated": self.simulated,
            "versions": self.versions, "cache": self.cache, "ray_address": self.ray_address,
            "started_at": self.started_at,
            "units_reused": [list(u) for u in self.units_reused],
            "units_measured": [list(u) for u in self.units_measured],
            "units_failed": {unit_key(u): e for u, e in self.units_failed.items()},
            "units_noisy": {unit_key(u): {str(b): w for b, w in per.items()} for u, per in self.units_noisy.items()},
            "units_waited": [list(u) for u in self.units_waited],
            "unit_tasks": [t.to_json() for t in self.unit_tasks],
            "profile_hardware_s": self.profile_hardware_s, "confirm_hardware_s": self.confirm_hardware_s,
            "profile_stop": self.profile_stop or None, "profile_tasks": self.profile_tasks, "confirm_tasks": self.confirm_tasks,
            "profile_tasks_this_run": self.profile_tasks_this_run, "trials": self.trials, "state": self.state,
            "wall_s": self.wall_s, "slo_met": self.slo_met,
            "front": None if self.front is None else [c.to_dict() for c in self.front],
            "chosen": self.chosen.to_dict() if self.chosen else None,
            "confirmed": [c.to_json() for c in self.confirmed],
            "estimate_only": self.estimate_only or None, "estimator": self.estimator, "gpu": self.gpu,
        }
        return {k: v for k, v in d.items() if v is not None}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RunLedger":
        """The inverse of ``to_json``; ``ValueError`` when ``d`` is not a ledger."""
        from .confirm import Confirmation

        try:
            t = d.get("target")
            target = None if t is None else Target(
                name=t["name"], runner=t["runner"], hardware=t["hardware"], bucket_policy=t["bucket_policy"],
                dtype=t["dtype"], model=ModelShape(**t["model"]), options=tuple(sorted(t["options"].items())),
                seed=t["seed"], batching=t.get("batching", "static"), prefill=t.get("prefill", "sequential"),
                serving=t.get("serving", "static"), scheduler=Scheduler(**t.get("scheduler", {})))
            w = d.get("workload")
            chosen = d.get("chosen")
            return cls(
                run=d.get("run", ""), space=d.get("space", ""), space_sha256=d.get("space_sha256", ""),
                fingerprint=d.get("fingerprint", ""), target=target,
                workload=None if w is None else WorkloadDescription.from_json(w),
                sampler=d.get("sampler"), trials_requested=d.get("trials_requested"),
                simulated=bool(d.get("simulated", False)), versions=dict(d.get("versions", {})),
                cache=d.get("cache"), ray_address=d.get("ray_address"), started_at=d.get("started_at"),
                units_reused=[tuple(u) for u in d.get("units_reused", [])],
                units_measured=[tuple(u) for u in d.get("units_measured", [])],
                units_failed={_unit_of(k): v for k, v in d.get("units_failed", {}).items()},
                units_noisy={_unit_of(k): {int(b): w for b, w in per.items()}
                             for k, per in d.get("units_noisy", {}).items()},
                units_waited=[tuple(u) for u in d.get("units_waited", [])],
                unit_tasks=[UnitTask(**{**t, "buckets": tuple(t["buckets"]),
                                        "host_costs": tuple(t.get("host_costs", {}).items())})
                            for t in d.get("unit_tasks", [])],
                profile_hardware_s=float(d.get("profile_hardware_s", 0.0)),
                confirm_hardware_s=float(d.get("confirm_hardware_s", 0.0)),
                profile_stop=str(d.get("profile_stop", "")),
                profile_tasks=int(d.get("profile_tasks", 0)), confirm_tasks=int(d.get("confirm_tasks", 0)),
                profile_tasks_this_run=int(d.get("profile_tasks_this_run", 0)), trials=int(d.get("trials", 0)),
                state=d.get("state", "running"), wall_s=d.get("wall_s"), slo_met=d.get("slo_met"),
                front=None if d.get("front") is None else [Candidate.from_dict(c) for c in d["front"]],
                chosen=None if chosen is None else Candidate.from_dict(chosen),
                confirmed=[Confirmation.from_json(c) for c in d.get("confirmed", [])],
                estimate_only=bool(d.get("estimate_only", False)), estimator=d.get("estimator"), gpu=d.get("gpu"),
            )
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"not a run ledger: {exc}") from exc

    @classmethod
    def read(cls, path: Path) -> "RunLedger | None":
        """The ledger in ``path``; None when there is none or it cannot be read as one."""
        try:
            return cls.from_json(json.loads(path.read_text()))
        except (OSError, ValueError):
            return None


def software_versions(runner: Any) -> dict[str, str]:
    """Versions of lensopt, Python, the libraries and the runner's SDK, for run.json."""
    import platform

    import numpy as np
    import optuna
    import pandas as pd

    out = {"lensopt": _lensopt_version(), "python": platform.python_version(), "numpy": np.__version__,
           "pandas": pd.__version__, "optuna": optuna.__version__}
    try:
        import ray

        out["ray"] = ray.__version__
    except ImportError:
        pass
    out.update({f"runner.{k}": str(v) for k, v in runner.versions().items()})
    return out


def _lensopt_version() -> str:
    try:
        from importlib.metadata import version

        return version("lensopt")
    except Exception:
        return "0+unknown"
