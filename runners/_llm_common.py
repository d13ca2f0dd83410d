"""Pure pieces shared by the runners that drive a real LLM engine (``vllm``, ``neuron``).

Everything here is plain Python and numpy: option parsing, unit and request checks,
random token-id prompts, and the execution of probes and workloads against an *engine*
(the bookkeeping that turns engine steps into per-request times is in ``_engine_timing``,
the model directory and version look-ups in ``_llm_host``).  The SDK calls themselves sit behind a thin
engine boundary in each runner:

    engine = EngineClass(spec)            # compile / load; may set compile_s and load_s
    engine.generate_timed(prompts, output_lens) -> TimedBatch
    engine.serve_timed(prompts, output_lens, arrival_s) -> TimedBatch   # runners serving continuous mode
    engine.close()

so :class:`EngineRunner` (the shared ``profile`` / ``run_workload`` flow) is exercised in
tests with a fake engine.

Timing convention (the same as the jax and sim runners): a request (l_in, l_out) yields
exactly l_out tokens; its TTFT is measured from the start of its batch (the first request
handed to the engine) to its first token, its E2E to its last token; a probe's time is
the wall time of one whole batch.  Served by continuous batching (``serve_timed``),
request i is handed to the engine once the wall clock passes its arrival time, and its
TTFT and E2E count from that arrival (docs/serving.md).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

import numpy as np

from lens.buckets import check_policy, select, select_index, validate_buckets
from lens.errors import LensoptError, RunnerError, UserError
from lens.types import Candidate, Probe, ProbeRun, ProfileResult, Requests, Target, Unit, WorkloadRun

from ._engine_timing import TimedBatch
from .base import Runner

# -- options ---------------------------------------------------------------------------------


def parse_options(runner: str, target: Target, schema: Mapping[str, tuple[type, Any]],
                  moved: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``[target.options]`` checked against ``schema`` (key -> (type, default)); defaults filled in.

    ``moved``: keys that are no longer options -> what to write instead (``Runner.moved_options``).
    """
    out = {k: d for k, (_, d) in schema.items()}
    for key, value in target.options:
        if key in (moved or {}):
            raise UserError(f"{runner} runner: [target.options] {key} of target {target.name!r} is no longer an "
                            f"option: {moved[key]}")
        if key not in schema:
            raise UserError(
                f"{runner} runner: unknown option {key!r} in [target.options] of target {target.name!r}; "
                f"accepted: {', '.join(sorted(schema))}"
            )
        typ = schema[key][0]
        ok = isinstance(value, typ) or (typ is float and isinstance(value, int))
        if (isinstance(value, bool) and typ is not bool) or not ok:
            raise UserError(
                f"{runner} runner: [target.options] {key} = {value!r} must be {_TYPE_WORDS.get(typ, typ.__name__)}"
            )
        out[key] = float(value) if typ is float else value
    return out


_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list"}


# -- checks ----------------------------------------------------------------------------------


def _positive_int(x: Any) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, np.integer)) and x >= 1


def check_llm_unit(runner: str, unit: Unit) -> None:
    """tp and batch positive; tp must split the model's attention heads and MLP evenly.

    KV heads may be fewer than tp when tp is a multiple of them: vLLM and NxD Inference
    then replicate each KV head over tp / kv_heads ranks.
    """
    m, tp, b = unit.target.model, unit.tp, unit.batch
    if not _positive_int(tp):
        raise UserError(f"{runner} runner: tp = {tp!r} must be a positive integer")
    if not _positive_int(b):
        raise UserError(f"{runner} runner: batch = {b!r} must be a positive integer")
    if m.hidden % m.heads:
        raise UserError(f"{runner} runner: model.hidden = {m.hidden} is not a multiple of model.heads = {m.heads}")
    if m.heads % tp:
        raise UserError(
            f"{runner} runner: tp = {tp} does not divide model.heads = {m.heads}; choose a tp that divides it"
        )
    if m.kv_heads % tp and tp % m.kv_heads:
        raise UserError(
            f"{runner} runner: tp = {tp} and model.kv_heads = {m.kv_heads}: one must divide the other "
            f"(KV heads are split over tp ranks, or replicated when there are fewer of them than ranks)"
        )
    if m.intermediate % tp:
        raise UserError(
            f"{runner} runner: tp = {tp} does not divide model.intermediate = {m.intermediate}; "
            f"choose a tp that divides it"
        )


def check_requests(runner: str, input_len, output_len, ctx: Sequence[int], tkg: Sequence[int], policy: str,
                   *, labels: Sequence[str] | None = None) -> None:
    """Every request's prompt fits a context bucket and its last decode context a generation bucket.

    ``labels`` names the requests in messages (default "request <i>").
    """
    def name(i: int) -> str:
        return labels[i] if labels is not None else f"request {i}"

    lin = np.asarray(input_len, np.int64)
    lout = np.asarray(output_len, np.int64)
    bad = np.flatnonzero((lin < 1) | (lout < 1))
    if bad.size:
        i = int(bad[0])
        raise UserError(f"{runner} runner: {name(i)} has input {lin[i]} / output {lout[i]} tokens; both must be >= 1")
    bad = np.flatnonzero(select_index(lin, ctx, policy) < 0)
    if bad.size:
        i = int(bad[0])
        raise UserError(
            f"{runner} runner: {name(i)}: input of {lin[i]} tokens fits no context-encoding bucket of "
            f"{list(ctx)} ({policy} policy); add a larger bucket or shorten the prompt"
        )
    last = lin + lout - 1
    bad = np.flatnonzero((lout > 1) & (select_index(last, tkg, policy) < 0))
    if bad.size:
        i = int(bad[0])
        raise UserError(
            f"{runner} runner: {name(i)}: input {lin[i]} + output {lout[i]} reaches context {last[i]}, which fits "
            f"no token-generation bucket of {list(tkg)} ({policy} policy); add a larger bucket or shorten it"
        )


def validate_probes(runner: str, probes: Sequence[Probe], policy: str) -> tuple[int, ...]:
    """The sorted buckets of ``probes``; each probe must run wholly inside its own bucket."""
    probes = list(probes)
    if not probes:
        raise UserError(f"{runner} runner: profile needs at least one probe")
    buckets = validate_buckets(sorted({int(p.bucket) for p in probes}), what="probe buckets")
    for i, p in enumerate(probes):
        if not _positive_int(p.repeats):
            raise UserError(f"{runner} runner: probe {i} (bucket {p.bucket}): repeats = {p.repeats}; give at least 1")
        check_requests(runner, [p.input_len], [p.output_len], buckets, buckets, policy,
                       labels=[f"probe {i} (bucket {p.bucket})"])
        got = select(p.input_len, buckets, policy)
        if got != p.bucket:
            raise UserError(
                f"{runner} runner: probe {i}: input_len = {p.input_len} runs in bucket {got}, not {p.bucket}, "
                f"under the {policy} policy"
            )
    return buckets


# -- prompts ---------------------------------------------------------------------------------


def random_prompts(rng: np.random.Generator, lengths: Iterable[int], vocab: int) -> list[list[int]]:
    """One list of random token ids per length, drawn from [1, vocab).

    Fresh ids for every request, so no engine can serve a prompt from a prefix cache.
    Id 0 is left out: it is the padding id of several tokenizers.
    """
    if vocab < 2:
        raise UserError(f"model.vocab = {vocab}: a vocabulary needs at least 2 tokens")
    return [rng.integers(1, vocab, size=int(n)).tolist() for n in lengths]


# -- probes and workloads against an engine ---------------------------------------------------


class Engine(Protocol):
    """The SDK boundary of one compiled unit (see the module docstring)."""

    def generate_timed(self, prompts: Sequence[Sequence[int]], output_lens: Sequence[int]) -> TimedBatch: ...

    # only the engines of runners that serve continuous mode (``Runner.modes``)
    def serve_timed(self, prompts: Sequence[Sequence[int]], output_lens: Sequence[int],
                    arrival_s: Sequence[float]) -> TimedBatch: ...

    def close(self) -> None: ...


PromptFn = Callable[[Sequence[int]], list[list[int]]]


def execute_probes(
    engine: Engine, probes: Sequence[Probe], *, batch: int, warmup: int, prompts: PromptFn, warmed: set | None = None
) -> tuple[list[ProbeRun], float]:
    """Run every probe as ``batch`` identical-shape requests submitted together, ``repeats`` times.

    Before the first probe of each bucket, ``warmup`` untimed runs of that probe (their
    seconds count in the returned hardware time, not in the probe's times).  ``warmed``
    (buckets already warm on this engine) is updated in place. The repeats are taken
    round-robin over the probes, so a slow stretch of the host does not land on one bucket.
    """
    warmed = set() if warmed is None else warmed
    run_s = 0.0
    for p in probes:
        if p.bucket not in warmed:
            for _ in range(warmup):
                run_s += engine.generate_timed(prompts([p.input_len] * batch), [p.output_len] * batch).wall_s
            warmed.add(p.bucket)
    times: list[list[float]] = [[] for _ in probes]
    for r in range(max((p.repeats for p in probes), default=0)):
        for i, p in enumerate(probes):
            if r < p.repeats:
                tb = engine.generate_timed(prompts([p.input_len] * batch), [p.output_len] * batch)
                times[i].append(float(tb.wall_s))
                run_s += tb.wall_s
    return [ProbeRun(p, tuple(t)) for p, t in zip(probes, times)], run_s


@dataclass(frozen=True, eq=False)
class WorkloadTimes:
    ttft_s: np.ndarray
    e2e_s: np.ndarray
    total_s: float  # sum of the batches' wall times (served: the run's duration)
    run_s: float  # total_s plus untimed warm-up runs
    ttft_sources: tuple[str, ...]


def _warm_up(engine: Engine, requests: Requests, *, batch: int, warmup: int, prompts: PromptFn) -> float:
    """``warmup`` untimed static runs of the first ``batch`` requests; their wall seconds."""
    if not len(requests):
        return 0.0
    first = slice(0, min(batch, len(requests)))
    lin, lout = requests.input_len[first].tolist(), requests.output_len[first].tolist()
    return float(sum(engine.generate_timed(prompts(lin), lout).wall_s for _ in range(warmup)))


def execute_workload(
    engine: Engine, requests: Requests, *, batch: int, warmup: int, prompts: PromptFn
) -> WorkloadTimes:
    """Requests in order, in batches of ``batch`` submitted together; one batch at a time.

    ``warmup`` untimed runs of the first batch come first (pass 0 on a warm engine).
    """
    n = len(requests)
    lin, lout = requests.input_len, requests.output_len
    ttft = np.zeros(n)
    e2e = np.zeros(n)
    total = 0.0
    run_s = _warm_up(engine, requests, batch=batch, warmup=warmup, prompts=prompts)
    sources: set[str] = set()
    for s in range(0, n, batch):
        sl = slice(s, min(s + batch, n))
        tb = engine.generate_timed(prompts(lin[sl].tolist()), lout[sl].tolist())
        if tb.ttft_s.shape != (sl.stop - sl.start,) or tb.e2e_s.shape != tb.ttft_s.shape:
            raise RunnerError(f"the engine returned times for {tb.ttft_s.shape} requests, the batch had {sl.stop - sl.start}")
        ttft[sl], e2e[sl] = tb.ttft_s, tb.e2e_s
        total += tb.wall_s
        sources.add(tb.ttft_source)
    return WorkloadTimes(ttft, e2e, float(total), float(total + run_s), tuple(sorted(sources)))


def execute_serving(engine: Engine, requests: Requests, *, batch: int, warmup: int, prompts: PromptFn) -> WorkloadTimes:
    """Serve ``requests`` by continuous batching from their arrival times (shifted to start at 0).

    ``warmup`` untimed static runs of the first ``batch`` requests come first (pass 0 on a
    warm engine).  TTFT and E2E count from each arrival; the total is the run's duration.
    """
    n = len(requests)
    lin, lout = requests.input_len, requests.output_len
    run_s = _warm_up(engine, requests, batch=batch, warmup=warmup, prompts=prompts)
    arr = np.asarray(requests.arrival_s, dtype=float)
    arr = arr - arr.min() if n else arr
    tb = engine.serve_timed(prompts(lin.tolist()), lout.tolist(), arr.tolist())
    if tb.ttft_s.shape != (n,) or tb.e2e_s.shape != (n,):
        raise RunnerError(f"the engine returned times for {tb.ttft_s.shape} requests, {n} were served")
    return WorkloadTimes(tb.ttft_s, tb.e2e_s, float(tb.wall_s), float(tb.wall_s + run_s), (tb.ttft_source,))


# -- the shared runner flow --------------------------------------------------------------------


@dataclass(frozen=True)
class EngineRecord:
    """One engine start: what it was for and what it cost."""

    key: str
    tp: int
    batch: int
    compile_s: float
    load_s: float
    reused_artifacts: bool = False
    artifacts: str = ""


class EngineRunner(Runner):
    """``profile`` / ``run_workload`` over one engine per configuration, one engine alive at a time.

    Subclasses set ``engine_class`` (the SDK boundary), ``options_schema``, and implement
    ``require_sdk``, ``engine_spec`` (pure: returns an object with a ``key`` attribute) and
    ``versions``.  An engine is kept while consecutive calls need the same configuration
    and closed before another one starts (accelerator memory holds one at a time).
    With ``one_unit_per_process`` each engine lives in a child process of its own
    (``runners._engine_host``), ended when the engine is closed.
    """

    simulated = False
    engine_class: Any = None
    #: start every engine in a child process of its own, so closing it frees the device
    one_unit_per_process: bool = False
    def __init__(self, target: Target):
        super().__init__(target)
        check_policy(target.bucket_policy)
        self.opts = parse_options(self.name, target, self.options_schema, self.moved_options)
        self._engine: Any = None
        self._engine_key: str | None = None
        self._warmed: set = set()
        self.engine_log: list[EngineRecord] = []
        #: how the TTFTs of the last run_workload were obtained (see TimedBatch.ttft_source)
        self.last_ttft_sources: tuple[str, ...] = ()

    @property
    def prefill(self) -> str:
        """How the engine encodes a batch's prompts: the target's ``prefill`` ("sequential": one
        request after another; "batched": the whole batch in one call), which a runner whose
        engine cannot run it refuses when it is constructed."""
        return self.target.prefill

    # -- hooks ---------------------------------------------------------------------------
    def require_sdk(self) -> None:
        """Raise ``RunnerUnavailable`` (naming the extra to install) when the SDK is missing."""
        raise NotImplementedError

    def engine_spec(self, tp: int, batch: int, ctx: Sequence[int], tkg: Sequence[int]) -> Any:
        raise NotImplementedError

    def warmup_runs(self) -> int:
        w = self.opts.get("warmup", 1)
        if not isinstance(w, int) or isinstance(w, bool) or w < 0:
            raise UserError(f"{self.name} runner: option warmup = {w!r}: give a whole number of untimed runs >= 0")
        return w

    def check_unit(self, unit: Unit) -> None:
        check_llm_unit(self.name, unit)

    # -- engines -------------------------------------------------------------------------
    def _engine_for(self, spec: Any, tp: int, batch: int) -> tuple[Any, float, float]:
        """The engine for ``spec`` (started if needed) and the compile / load seconds it cost now."""
        if self._engine is not None and self._engine_key == spec.key:
            return self._engine, 0.0, 0.0
        self._close_engine()
        t0 = time.perf_counter()
        try:
            if self.one_unit_per_process:
                from ._engine_host import EngineProcess

                engine = EngineProcess(self.engine_class, spec)
            else:
                engine = self.engine_class(spec)
        except LensoptError:
            raise
        except Exception as exc:  # an SDK failure is a runner failure, with its cause chained
            raise RunnerError(f"{self.name} runner: starting the engine for tp {tp}, batch {batch} failed: "
                              f"{type(exc).__name__}: {exc}") from exc
        elapsed = time.perf_counter() - t0
        compile_s = getattr(engine, "compile_s", None)
        load_s = float(getattr(engine, "load_s", 0.0) or 0.0)
        if compile_s is None:  # an engine that cannot tell compiling from loading
            compile_s, load_s = elapsed, 0.0
        self._engine, self._engine_key = engine, spec.key
        self._warmed = set()
        self.engine_log.append(EngineRecord(
            key=spec.key, tp=tp, batch=batch, compile_s=float(compile_s), load_s=load_s,
            reused_artifacts=bool(getattr(engine, "reused_artifacts", False)),
            artifacts=str(getattr(engine, "artifacts", "") or ""),
        ))
        return engine, float(compile_s), load_s

    def _close_engine(self) -> None:
        engine, self._engine, self._engine_key = self._engine, None, None
        self._warmed = set()
        if engine is not None:
            engine.close()

    def _generate(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except LensoptError:
            raise
        except Exception as exc:
            raise RunnerError(f"{self.name} runner: generation failed: {type(exc).__name__}: {exc}") from exc

    def _prompt_fn(self, *salt: int) -> PromptFn:
        rng = np.random.default_rng([int(self.target.seed), *map(int, salt)])
        vocab = self.target.model.vocab
        return lambda lengths: random_prompts(rng, lengths, vocab)

    # -- the runner interface --------------------------------------------------------------
    def profile(self, unit: Unit, probes: Sequence[Probe]) -> ProfileResult:
        self.require_sdk()
        self.check_unit(unit)
        buckets = validate_probes(self.name, probes, self.target.bucket_policy)
        warm = self.warmup_runs()
        spec = self.engine_spec(unit.tp, unit.batch, buckets, buckets)
        versions = self.versions()
        engine, compile_s, load_s = self._engine_for(spec, unit.tp, unit.batch)
        prompts = self._prompt_fn(unit.tp, unit.batch)
        runs, run_s = self._generate(lambda: execute_probes(
            engine, list(probes), batch=unit.batch, warmup=warm, prompts=prompts, warmed=self._warmed))
        return ProfileResult(runs=tuple(runs), compile_s=compile_s, run_s=run_s + load_s, host=self.host(),
                             versions=versions, simulated=False)

    def run_workload(self, candidate: Candidate, requests: Requests, *, mode: str = "static") -> WorkloadRun:
        self.check_mode(mode, requests)
        self.require_sdk()
        ctx = validate_buckets(candidate.ctx_buckets, what="ctx_buckets")
        tkg = validate_buckets(candidate.tkg_buckets, what="tkg_buckets")
        self.check_unit(Unit(self.target, candidate.tp, candidate.batch))
        check_requests(self.name, requests.input_len, requests.output_len, ctx, tkg, self.target.bucket_policy)
        spec = self.engine_spec(candidate.tp, candidate.batch, ctx, tkg)
        engine, compile_s, load_s = self._engine_for(spec, candidate.tp, candidate.batch)
        # a fresh engine is warmed on the first batch; a warm one is not warmed again
        warm = self.warmup_runs() if "workload" not in self._warmed else 0
        self._warmed.add("workload")
        prompts = self._prompt_fn(candidate.tp, candidate.batch, len(requests))
        execute = execute_serving if mode == "continuous" else execute_workload
        wt = self._generate(lambda: execute(engine, requests, batch=candidate.batch, warmup=warm, prompts=prompts))
        self.last_ttft_sources = wt.ttft_sources
        return WorkloadRun(ttft_s=wt.ttft_s, e2e_s=wt.e2e_s, total_s=wt.total_s, compile_s=compile_s,
                           run_s=wt.run_s + load_s, host=self.host(), simulated=False, mode=mode)

    def close(self) -> None:
        self._close_engine()
