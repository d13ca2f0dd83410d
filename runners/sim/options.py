"""The ``[target.options]`` of the sim runner: each declared once, with its default, bounds and help.

``SimOptions`` is the one declaration: the runner's ``options_schema`` (what the space
loader checks), the validation of values and the documentation all read its fields.
Every effect the simulated stacks carry can be switched off on its own (``EFFECTS``), so
an evaluation can show what each one costs an estimator; ``clean()`` switches them all off.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any

from lens.errors import UserError

CLOCKS = ("simulated", "wall")


def _opt(default: Any, help: str, *, lo: float | None = 0.0, hi: float | None = None,
         choices: tuple[str, ...] | None = None, lo_open: bool = False) -> Any:
    return field(default=default, metadata={"help": help, "lo": lo, "hi": hi, "choices": choices, "lo_open": lo_open})


@dataclass(frozen=True)
class SimOptions:
    """Every option of the sim runner (see each field's help)."""

    # -- run-to-run variation and the compiler ---------------------------------------------
    noise: float = _opt(0.01, "sigma of the lognormal run-to-run factor of one generate call (0: none)")
    quirk_seed: int = _opt(0, "which per-bucket compiler quirks this simulated device has", lo=None)
    quirks: float = _opt(1.0, "strength of the per-bucket compiler quirks (0: none, 1: the default band)")
    # -- effects of the real stacks, each switchable (see runners.sim.kernels / host / machine)
    context_attention: bool = _opt(True, "attention work follows the real context inside a bucket where the stack's kernels do")
    kv_relayout: bool = _opt(True, "the KV cache is copied into the new shape when the decode bucket changes (NxD)")
    row_host: bool = _opt(True, "host work per live row per decode step (sampling, stop checks, detokenize/stream)")
    launch: bool = _opt(True, "host work per generate call (tokenize, pad, upload, sampling set-up)")
    stragglers: bool = _opt(True, "rare host stalls: a graph call now and then takes several times as long")
    drift: bool = _opt(True, "host speed drifts slowly over minutes (deterministic for a seed)")
    # -- sizes of the effects ---------------------------------------------------------------
    host_overhead_s: float = _opt(0.0008, "host seconds per graph call (prefill, decode step, cache copy)")
    row_overhead_s: float = _opt(2e-5, "host seconds per live row per decode step (with row_host)")
    launch_s: float = _opt(0.003, "host seconds per generate call (with launch)")
    straggler_rate: float = _opt(0.004, "share of graph calls that straggle (with stragglers)", hi=1.0)
    straggler_factor: float = _opt(4.0, "how many times its usual time a straggling call takes", lo=1.0)
    drift_amplitude: float = _opt(0.05, "largest relative change of host speed (with drift)", hi=0.9)
    drift_period_s: float = _opt(900.0, "typical period of the drift, seconds", lo_open=True)
    clock: str = _opt("simulated", "drift clock: simulated seconds the device spent, or those offset by wall time "
                      "(runs minutes apart in other processes then see different host speeds)", choices=CLOCKS)
    # real seconds slept per profile / run_workload call: lets tests watch a scheduler place
    # and overlap tasks; it never enters the simulated times
    wall_delay_s: float = _opt(0.0, "real seconds slept per call (for scheduling tests; never in simulated times)")


#: options that moved out of [target.options]: name -> what to write instead. The stack's prefill
#: is the target's (``Target.prefill``), so the simulated device and the estimator read one setting.
MOVED = {"prefill": 'write prefill = "sequential" or "batched" under [target] (the estimator reads it there too)'}

#: the switchable effects (boolean options), in the order tables list them
EFFECTS: tuple[str, ...] = ("context_attention", "kv_relayout", "row_host", "launch", "stragglers", "drift")



def clean() -> dict[str, Any]:
    """Option values of a clean device: no noise and every effect off (the padded-bucket machine)."""
    return {"noise": 0.0, **{name: False for name in EFFECTS}}


_TYPES = typing.get_type_hints(SimOptions)
_FIELDS = {f.name: f for f in dataclasses.fields(SimOptions)}

#: what the space loader checks: name -> (type, default)
OPTIONS_SCHEMA: dict[str, tuple[type, Any]] = {name: (_TYPES[name], f.default) for name, f in _FIELDS.items()}


def describe(name: str) -> str:
    """The help text of one option."""
    return _FIELDS[name].metadata["help"]


def parse(options: tuple[tuple[str, Any], ...], *, target_name: str) -> SimOptions:
    """``target.options`` checked against ``SimOptions``: unknown names, types, bounds and choices."""
    values: dict[str, Any] = {}
    for key, value in options:
        if key in MOVED:
            raise UserError(f"sim runner: option {key!r} in [target.options] of target {target_name!r} is no longer "
                            f"an option: {MOVED[key]}")
        if key not in _FIELDS:
            raise UserError(
                f"sim runner: unknown option {key!r} in [target.options] of target {target_name!r}; "
                f"accepted: {', '.join(sorted(_FIELDS))}"
            )
        values[key] = _check(key, value)
    return SimOptions(**values)


def _check(key: str, value: Any) -> Any:
    typ, meta = _TYPES[key], _FIELDS[key].metadata
    if typ is bool:
        if not isinstance(value, bool):
            raise UserError(f"sim runner: option {key!r} must be true or false, got {value!r}")
        return value
    ok = isinstance(value, typ) or (typ is float and isinstance(value, int))
    if isinstance(value, bool) or not ok:
        raise UserError(f"sim runner: option {key!r} must be a {typ.__name__}, got {value!r}")
    if typ is str:
        if value not in meta["choices"]:
            raise UserError(f"sim runner: option {key!r} = {value!r} is not one of {', '.join(meta['choices'])}")
        return value
    value = typ(value)
    if typ is float and not math.isfinite(value):
        raise UserError(f"sim runner: option {key!r} must be a finite number, got {value!r}")
    lo, hi = meta["lo"], meta["hi"]
    if lo is not None and (value < lo or (meta["lo_open"] and value == lo)):
        raise UserError(f"sim runner: option {key!r} must be {'>' if meta['lo_open'] else '>='} {lo}, got {value!r}")
    if hi is not None and value > hi:
        raise UserError(f"sim runner: option {key!r} must be <= {hi}, got {value!r}")
    return value
