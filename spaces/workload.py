"""The workload sample of a space: its ``[workload]`` (or a ``--workload`` override), fitted
to the space's largest bucket.

It lives here rather than in ``lens.workload`` because every choice it makes and every
error it raises is about a space file's keys (``workload.drop_longer``, ``space.buckets``)
or a command-line flag; the pieces that know nothing of spaces (``load_workload``,
``scale_lengths``, ``fit_to``) are in ``lens.workload``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

from lens import arrivals
from lens.errors import TraceError, UserError
from lens.types import Requests
from lens.workload import fit_to, load_workload, scale_lengths

from .schema import Space, WorkloadSpec, check


@dataclass(frozen=True)
class WorkloadDescription:
    """Where a search's requests came from and what they look like (run.json's ``workload``)."""

    source: str
    requests: int
    seed: int
    input_mean: float
    output_mean: float
    input_max: int
    output_max: int
    #: set when the space scales lengths / drops requests longer than the largest bucket
    length_scale: float | None = None
    dropped_longer: int | None = None
    #: True when ``source`` came from ``--workload`` rather than the space's [workload]
    #: (None: a run.json written before this was recorded)
    override: bool | None = None
    #: continuous serving: where the arrival times came from ("poisson", "trace", "trace, rescaled")
    #: and the rate they run at (requests/s: the one asked for, or the trace's own mean rate)
    arrivals: str | None = None
    arrival_rate: float | None = None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        head = {k: d.pop(k) for k in ("source", "requests", "seed")}
        extra = {k: d.pop(k) for k in ("length_scale", "dropped_longer", "override", "arrivals", "arrival_rate")}
        return {**head, **{k: v for k, v in extra.items() if v is not None}, **d}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "WorkloadDescription":
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})


def _check_flag(flag: str, name: str, value: float | None) -> None:
    why = None if value is None else check(WorkloadSpec, name, value)
    if why:
        raise UserError(f"{flag} {value:g} {why}" if isinstance(value, float) else f"{flag} {value} {why}")


def check_arrival_flags(arrival_rate: float | None, burstiness: float | None) -> None:
    """Refuse a ``--request-rate`` or ``--burstiness`` outside its [workload] setting's bounds, naming the flag."""
    _check_flag("--request-rate", "arrival_rate", arrival_rate)
    _check_flag("--burstiness", "burstiness", burstiness)


def load_requests(space: Space, *, workload: str | None = None, requests: int | None = None,
                  seed: int | None = None, length_scale: float | None = None, drop_longer: bool | None = None,
                  max_len: int | None = None, serving: str | None = None, arrival_rate: float | None = None,
                  burstiness: float | None = None) -> tuple[Requests, WorkloadDescription]:
    """The workload sample of a search, fitted to the space's largest bucket (or ``max_len``).

    ``workload`` overrides the space's source (its length_scale and drop_longer still
    apply); ``requests``, ``seed``, ``length_scale`` and ``drop_longer`` override the
    space's settings (the command line's flags). Under continuous serving (``serving``, by
    default the target's) a trace is sampled as consecutive rows and the requests get
    arrival times: ``arrival_rate``/``burstiness`` or the space's, else the trace's own
    (``lens.arrivals.assign``).
    """
    spec = space.workload
    if workload is None and spec is None:
        raise UserError(f"{space.path}: no [workload] table; add one (trace = \"FILE\" or distribution = \"NAME\") "
                        f"or pass --workload FILE|NAME")
    _check_flag("--requests", "requests", requests)
    _check_flag("--seed", "seed", seed)
    _check_flag("--length-scale", "length_scale", length_scale)
    check_arrival_flags(arrival_rate, burstiness)
    given = spec or WorkloadSpec()
    scale_by = length_scale if length_scale is not None else given.length_scale
    drop = drop_longer if drop_longer is not None else given.drop_longer
    n = requests if requests is not None else given.requests
    s = seed if seed is not None else given.seed
    continuous = (serving or space.target.serving) == "continuous"
    if workload is not None:
        src = workload
        try:
            req = load_workload(workload, requests=n, seed=s, consecutive=continuous)
        except TraceError:
            raise  # names the trace file and line
        except UserError as exc:
            raise UserError(f"--workload {workload}: {exc}") from None
    else:
        src = spec.trace if spec.trace is not None else spec.distribution
        try:
            req = load_workload(src, requests=n, seed=s, input_column=spec.input_column,
                                output_column=spec.output_column, arrival_column=spec.arrival_column,
                                consecutive=continuous)
        except TraceError:
            raise
        except UserError as exc:
            raise UserError(f"{space.path}: [workload]: {exc}") from None
    scale = None
    if scale_by != 1.0:
        try:
            req = scale_lengths(req, scale_by)
        except UserError as exc:
            where = "--length-scale" if length_scale is not None else f"{space.path}: workload."
            raise UserError(f"{where}{exc}") from None
        scale = scale_by
    largest = space.search.buckets[-1] if max_len is None else max_len
    what = f"the largest bucket {largest} of {'space.buckets' if max_len is None else '--buckets'}"
    fitted, dropped = fit_to(req, largest)
    if dropped:  # the space file leads: its workload settings are what the fix changes
        if not drop:
            raise UserError(
                f"{space.path}: {dropped} of {len(req)} sampled requests of {src} are longer than {what}; add a "
                f"larger bucket, or set workload.drop_longer = true (or pass --drop-longer)"
            )
        if len(fitted) == 0:
            raise UserError(f"{space.path}: every sampled request of {src} is longer than {what}; add a larger "
                            f"bucket, or lower workload.length_scale (or pass --length-scale)")
    how = rate = None
    if continuous:
        rate = arrival_rate if arrival_rate is not None else given.arrival_rate
        try:
            fitted, how, rate = arrivals.assign(fitted, rate=rate, seed=s,
                                                burstiness=burstiness if burstiness is not None else given.burstiness)
        except UserError as exc:
            raise UserError(f"{space.path}: [workload] {src}: {exc}") from None
    return fitted, WorkloadDescription(
        source=str(src), requests=n, seed=s, length_scale=scale, dropped_longer=dropped or None,
        override=workload is not None, arrivals=how, arrival_rate=rate,
        input_mean=float(fitted.input_len.mean()), output_mean=float(fitted.output_len.mean()),
        input_max=int(fitted.input_len.max()), output_max=int(fitted.output_len.max()))


def requests_again(space: Space, desc: WorkloadDescription) -> tuple[Requests, WorkloadDescription]:
    """The same workload sample a run drew (``desc`` from its run.json), for ``lensopt confirm``."""
    override = desc.override
    if override is None:  # an older run.json: the source says whether it was the space's own
        spec = space.workload
        own = None if spec is None else str(spec.trace if spec.trace is not None else spec.distribution)
        override = desc.source != own
    return load_requests(space, workload=desc.source if override else None, requests=desc.requests, seed=desc.seed)
