"""Frozen value types shared by every package: lensopt's vocabulary (Target, Unit, BucketProfile, ...)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

import numpy as np

from .errors import UserError

POLICIES = ("exclusive", "inclusive")
#: how a batch decodes: one shape for the whole batch, or each request in its own buckets
BATCHING = ("static", "ragged")
#: how a batch's prompts are encoded: one request at a time, or the whole batch in one call;
#: the first is ``Target.prefill``'s default, which code that takes a prefill mode defaults to
PREFILLS = ("sequential", "batched")
#: bytes per element of each dtype a target may name
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}
DTYPES = tuple(DTYPE_BYTES)
#: how a deployment takes requests: static batches, or continuous batching (docs/serving.md)
SERVING_MODES = ("static", "continuous")
PRIORITIES = ("prefill", "decode")


@dataclass(frozen=True)
class ModelShape:
    """Llama-architecture decoder shape."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def param_count(self) -> int:
        """Parameters of the decoder (embeddings and untied LM head included)."""
        h, i, hd = self.hidden, self.intermediate, self.head_dim
        attn = h * (self.heads * hd) + 2 * h * (self.kv_heads * hd) + (self.heads * hd) * h
        mlp = 3 * h * i
        per_layer = attn + mlp + 2 * h
        return self.layers * per_layer + 2 * self.vocab * h + h

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class Scheduler:
    """The continuous-batching choices real stacks differ on (docs/serving.md); the defaults are
    NxD Inference's under vLLM (the vllm-neuron scheduler)."""

    max_prefills: int = field(default=0, metadata={
        "type": int, "min": 0,
        "help": "prompts prefilled between two decode steps (0: no cap; vLLM on Neuron: 0, JetStream: 1)"})
    prefill_priority: str = field(default="prefill", metadata={
        "type": str, "choices": PRIORITIES,
        "help": "prefill: arrivals during an iteration's prefills are admitted before its decode step (vLLM V0, "
                "vLLM on Neuron); decode: only those waiting when the iteration began (vLLM V1)"})

    def __post_init__(self) -> None:
        if isinstance(self.max_prefills, bool) or not isinstance(self.max_prefills, (int, np.integer)) \
                or self.max_prefills < 0:
            raise UserError(f"max_prefills = {self.max_prefills!r}: give a whole number >= 0 (0: no cap)")
        if self.prefill_priority not in PRIORITIES:
            raise UserError(f"prefill_priority = {self.prefill_priority!r}: use one of {', '.join(PRIORITIES)}")

    def __str__(self) -> str:
        """As the space file's [target.scheduler] reads: ``max_prefills 0 (no cap), prefill_priority prefill``."""
        cap = " (no cap)" if self.max_prefills == 0 else ""
        return f"max_prefills {self.max_prefills}{cap}, prefill_priority {self.prefill_priority}"


@dataclass(frozen=True)
class Target:
    """What is deployed where: model, hardware, runner, bucket policy, dtype."""

    # The metadata is the space file's [target] schema (spaces.schema reads it): "default" is
    # the value a space file may leave out, for fields the constructor still requires.
    name: str = field(metadata={"type": str, "help": "a name for the target (shown in reports)"})
    runner: str = field(metadata={"type": str, "help": "the backend that measures: jax, sim, command, vllm or neuron"})
    hardware: str = field(metadata={"type": str, "help": "the device kind (sim: inf2, trn1, trn2, tpu-v5e, tpu-v5p, tpu-v6e)"})
    bucket_policy: str = field(metadata={
        "type": str, "default": "exclusive", "choices": POLICIES,
        "help": "the bucket a length runs in: exclusive (smallest b > l) or inclusive (smallest b >= l)"})
    dtype: str = field(metadata={"type": str, "default": "bfloat16", "choices": DTYPES, "help": "weights and KV cache dtype"})
    model: ModelShape = field(metadata={"help": "the Llama-architecture decoder shape ([target.model])"})
    options: tuple[tuple[str, Any], ...] = field(default=(), metadata={"help": "runner options ([target.options])"})
    seed: int = field(default=0, metadata={"type": int, "min": 0, "help": "random weights and noise"})
    batching: str = field(default="static", metadata={
        "type": str, "choices": BATCHING,
        "help": "static (the batch decodes as one shape) or ragged (each request in its own bucket)"})
    prefill: str = field(default=PREFILLS[0], metadata={
        "type": str, "choices": PREFILLS,
        "help": "sequential (a batch's prompts encoded one at a time: NxD Inference's ctx_batch_size = 1) or "
                "batched (in one call of shape (batch, bucket of the longest prompt): vLLM, NxD ctx_batch_size = batch)"})
    serving: str = field(default="static", metadata={
        "type": str, "choices": SERVING_MODES,
        "help": "static (requests run in fixed batches) or continuous (requests take free slots as they arrive, "
                "docs/serving.md)"})
    scheduler: Scheduler = field(default_factory=Scheduler, metadata={
        "help": "the continuous-batching choices of the deployed stack ([target.scheduler], docs/serving.md)"})

    def option(self, key: str, default: Any = None) -> Any:
        for k, v in self.options:
            if k == key:
                return v
        return default

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "runner": self.runner,
            "hardware": self.hardware,
            "bucket_policy": self.bucket_policy,
            "dtype": self.dtype,
            "model": self.model.to_dict(),
            "options": dict(self.options),
            "seed": self.seed,
            "batching": self.batching,
            "prefill": self.prefill,
            "serving": self.serving,
            "scheduler": asdict(self.scheduler),
        }


@dataclass(frozen=True)
class Unit:
    """One compiled configuration on one target: compiles once, profiles many buckets."""

    target: Target
    tp: int
    batch: int


@dataclass(frozen=True)
class Candidate:
    """A deployable configuration: tp, batch size and the two bucket sets."""

    tp: int
    batch: int
    ctx_buckets: tuple[int, ...]
    tkg_buckets: tuple[int, ...]

    @property
    def all_buckets(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.ctx_buckets) | set(self.tkg_buckets)))

    def to_dict(self) -> dict[str, Any]:
        return {"tp": self.tp, "batch": self.batch, "ctx_buckets": list(self.ctx_buckets),
                "tkg_buckets": list(self.tkg_buckets)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Candidate":
        """The inverse of ``to_dict``; ``ValueError`` when ``d`` is not one."""
        try:
            tp, batch = d["tp"], d["batch"]
            ctx, tkg = tuple(d["ctx_buckets"]), tuple(d["tkg_buckets"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a candidate: {d!r}") from exc
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (tp, batch, *ctx, *tkg)):
            raise ValueError(f"not a candidate (tp, batch and buckets are integers): {d!r}")
        return cls(tp, batch, ctx, tkg)

    def label(self) -> str:
        ctx = ",".join(map(str, self.ctx_buckets))
        if self.ctx_buckets == self.tkg_buckets:
            return f"tp{self.tp} b{self.batch} [{ctx}]"
        tkg = ",".join(map(str, self.tkg_buckets))
        return f"tp{self.tp} b{self.batch} ctx[{ctx}] tkg[{tkg}]"


@dataclass(frozen=True)
class Probe:
    """One end-to-end profiling run: a full batch of identical requests in one bucket."""

    bucket: int
    input_len: int
    output_len: int
    repeats: int


@dataclass(frozen=True)
class ProbeRun:
    """The raw times (seconds, one per repeat) of one probe."""

    probe: Probe
    times_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return float(np.median(self.times_s))

    @property
    def spread(self) -> float:
        """(max - min) / median of the repeats: the run-to-run noise of this probe."""
        t = np.asarray(self.times_s)
        med = float(np.median(t))
        return float((t.max() - t.min()) / med) if med > 0 and len(t) > 1 else 0.0


@dataclass(frozen=True)
class ProfileResult:
    """What a runner returns from ``profile``: raw runs plus hardware-seconds accounting."""

    runs: tuple[ProbeRun, ...]
    compile_s: float
    run_s: float
    host: str
    versions: Mapping[str, str] = field(default_factory=dict)
    simulated: bool = False


@dataclass(frozen=True)
class BucketProfile:
    """TTFT_b and TBT_b of one bucket of one unit, with the raw runs and provenance.

    ``ttft_s`` is one prefill call in the bucket, as the target's ``prefill`` runs it
    (lens.probes): one request's prompt when ``sequential``; the unit's whole batch of
    prompts in one call of shape (batch, bucket) when ``batched``. The two never meet in
    one cache: a batched target's fingerprint differs (runners.base).
    """

    bucket: int
    ttft_s: float
    tbt_s: float
    input_len: int
    l1: int
    l2: int
    t1_s: float
    t2_s: float
    repeats: int
    spread: float
    runner: str = ""
    host: str = ""
    measured_at: float = 0.0
    simulated: bool = False
    raw_t1: tuple[float, ...] = ()
    raw_t2: tuple[float, ...] = ()
    #: "measured" (hardware), "simulated" (a sim runner) or "estimate:<model>" (never measured)
    source: str = "measured"
    #: the +- of TTFT_b and TBT_b (one standard error, from a bootstrap over the repeats; 0: unknown)
    ttft_err_s: float = 0.0
    tbt_err_s: float = 0.0
    #: the unit's expected slow-down from slow calls (stragglers), counted in ttft_s and tbt_s
    excess: float = 0.0
    #: False when the derived spreads stayed over profile.max_spread after every attempt
    accepted: bool = True
    #: the unit's host seconds per live row per decode step, counted in tbt_s for a full batch (lens.rows; 0: none seen)
    row_s: float = 0.0
    #: the unit's served admissions against ``ttft_s`` (lens.admission; 0: as the profile says): seconds added to
    #: the first prompt a scheduler pass admits, and to each further one in the same pass
    admit_first_s: float = 0.0
    admit_next_s: float = 0.0
    #: the unit's seconds per KV token a decode step reads (lens.context_cost; 0: a kernel of the bucket's shape),
    #: and the mean context of a row in the row cost's measurement (``row_s`` holds that row's reads too)
    kv_token_s: float = 0.0
    row_context: float = 0.0
    #: the unit's seconds a decode run costs after a served admission beyond its steps (lens.resume; 0: none seen)
    resume_s: float = 0.0
    #: the unit's served admissions against ``ttft_s`` (lens.admission): seconds added to the first prompt of a pass
    #: that stops a running decode (``admit_first_s`` prices a pass that finds the device idle)
    admit_busy_s: float = 0.0
    #: (idle seconds before a served pass, seconds the first decode run after it costs beyond its steps) at each
    #: idle spell measured, shortest first (lens.resume; empty: ``resume_s`` after any pass)
    resume_idle: tuple[tuple[float, float], ...] = ()
    #: (a served pass's seconds, seconds the first decode run after it costs beyond its steps) for a pass that stops
    #: a running decode, per prefill size measured, shortest first (lens.busy_resume; empty: ``resume_idle``'s
    #: shortest spell prices such a pass)
    resume_busy: tuple[tuple[float, float], ...] = ()
    #: seconds a lone served prompt's TTFT lies from the median of its kind, at the quantile levels 0, 1/(n-1), ...
    #: 1, non-decreasing (lens.prefill_tail; empty: every prefill takes the time the profile composes)
    prefill_tail: tuple[float, ...] = ()
    #: the lone prompts' median TTFT the tail lies about (seconds): a prompt's own prefill over it scales its draws
    #: (a prefill's spread grows with its length); 0: the tail's seconds are read as they are, whatever the prompt
    prefill_tail_median_s: float = 0.0
    #: a lone served decode's seconds over the mean of its kind, less one, at the quantile levels 0, 1/(n-1), ... 1,
    #: non-decreasing (lens.decode_pace; empty: every decode step takes the time the profile composes)
    decode_pace: tuple[float, ...] = ()
    #: the seconds of decode each of those averages the pace over, and how fast the pace forgets (seconds in
    #: exp(-lag / tau); 0: no correlation seen)
    decode_pace_window_s: float = 0.0
    decode_pace_tau_s: float = 0.0
    #: the version of the host-cost measurements (row_s onwards) that measured this profile (lens.methods; 0: stored
    #: before versions were recorded, its method unknown)
    host_costs_method: int = 0

    @property
    def rel_err(self) -> float:
        """The larger relative +- of TTFT_b and TBT_b."""
        return max(self.ttft_err_s / self.ttft_s if self.ttft_s > 0 else 0.0,
                   self.tbt_err_s / self.tbt_s if self.tbt_s > 0 else 0.0)


@dataclass(frozen=True, eq=False)
class Requests:
    """A list of requests as numpy arrays (input and output token counts, optional arrival)."""

    input_len: np.ndarray
    output_len: np.ndarray
    arrival_s: np.ndarray | None = None
    name: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_len", np.asarray(self.input_len, dtype=np.int64))
        object.__setattr__(self, "output_len", np.asarray(self.output_len, dtype=np.int64))
        if self.input_len.shape != self.output_len.shape or self.input_len.ndim != 1:
            raise ValueError("input_len and output_len must be 1-D arrays of one length")

    def __len__(self) -> int:
        return int(self.input_len.shape[0])

    def head(self, n: int) -> "Requests":
        arr = None if self.arrival_s is None else self.arrival_s[:n]
        return Requests(self.input_len[:n], self.output_len[:n], arr, self.name)


@dataclass(frozen=True, eq=False)
class WorkloadRun:
    """A real (or simulated) run of requests on a runner, per request and in total.

    ``mode`` "static": TTFT and E2E from the start of each request's batch, ``total_s`` the
    sum of the batches' times. "continuous": from each request's arrival, ``total_s`` the
    run's duration (first arrival to last completion).
    """

    ttft_s: np.ndarray
    e2e_s: np.ndarray
    total_s: float
    compile_s: float
    run_s: float
    host: str = ""
    simulated: bool = False
    mode: str = "static"

    @classmethod
    def median_of(cls, runs: "list[WorkloadRun] | tuple[WorkloadRun, ...]") -> "WorkloadRun":
        """Passes of one workload as one run: each request's median TTFT and E2E, the median
        ``total_s``, the passes' compile and run seconds summed (what the hardware spent).

        The median and not the mean: a pass that met a slow second of a shared host moves a
        mean by a share of the passes, the median not at all once most passes are clean.
        """
        if not runs:
            raise ValueError("median_of: no runs")
        if len({len(r.e2e_s) for r in runs}) != 1 or len({r.mode for r in runs}) != 1:
            raise ValueError("median_of: the runs are not passes of one workload in one mode")
        return cls(ttft_s=np.median(np.stack([r.ttft_s for r in runs]), axis=0),
                   e2e_s=np.median(np.stack([r.e2e_s for r in runs]), axis=0),
                   total_s=float(np.median([r.total_s for r in runs])),
                   compile_s=float(sum(r.compile_s for r in runs)), run_s=float(sum(r.run_s for r in runs)),
                   host=runs[0].host, simulated=any(r.simulated for r in runs), mode=runs[0].mode)


def stable_hash(obj: Any, n: int = 16) -> str:
    """A short, stable hash of a JSON-able object (sorted keys)."""
    data = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(data.encode()).hexdigest()[:n]
