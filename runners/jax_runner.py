"""The ``jax`` runner: real execution through XLA (the local CPU here, TPU on TPU hosts).

Static shapes per bucket, like NxD Inference: one prefill graph per context-encoding
bucket (batch 1, padded prompt, traced length and destination row; or, with the target's
``prefill = "batched"``, the whole batch of padded prompts in one call) and one decode
graph per token-generation bucket (the whole batch as one shape, attention over the first
b cache positions).  Graphs are compiled ahead of time once per (tp, batch) unit and kept
for the life of the runner; the KV cache is allocated once per unit and donated to every
call so it is updated in place.  The cache holds as many positions as the largest
token-generation bucket seen (or the ``cache_len`` option); a call with a larger bucket
reallocates it and recompiles that unit's graphs, so profile a unit's buckets in one call
or set ``cache_len``.

Generation semantics (the estimator composes the same machine): a request (l_in, l_out)
produces exactly l_out greedy tokens, the first from its prefill, then l_out - 1 decode
steps; step k has context l_in + k.  A static batch's prompts are encoded one after the
other, or in one call (``runners.jax_batch``), then the batch decodes together; the bucket
of step k is sel(max l_in_i + k over the requests still generating at step k).  Finished
rows and empty rows ride along as padding and never choose the bucket.
"""
from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from lens.buckets import check_policy, select, select_index, validate_buckets
from lens.errors import RunnerError, UserError
from lens.types import Candidate, Probe, ProbeRun, ProfileResult, Requests, Target, Unit, WorkloadRun

from .base import Runner

_DEVICE_FLAG = "--xla_force_host_platform_device_count"
_CPU_DEVICES = 8
#: XLA's CPU backend runs a graph's operations on a pool of threads unless this is false.
_THREADS_FLAG = "--xla_cpu_multi_thread_eigen"


def _ensure_host_flags() -> None:
    # Both flags are read when the CPU backend starts, so they must be in place before jax's
    # first device query; a flag the user already set is left as it is.  No effect on TPU/GPU.
    # - tp 1/2/4/8 run on one CPU host as that many devices;
    # - each graph runs on one thread: on a small shared host a step then waits on no
    #   straggling pool thread, and a served run's TTFT and TPOT keep the proportions its
    #   profile measured (docs/noise.md, "One XLA thread").
    flags = os.environ.get("XLA_FLAGS", "")
    if _DEVICE_FLAG not in flags:
        flags += f" {_DEVICE_FLAG}={_CPU_DEVICES}"
    if _THREADS_FLAG not in flags:
        flags += f" {_THREADS_FLAG}=false"
    os.environ["XLA_FLAGS"] = flags.strip()


def _cpu_threads(flags: str) -> str:
    """``"one"`` when XLA_FLAGS turns the CPU backend's thread pool off, else ``"many"``."""
    value = "true"
    for word in flags.split():
        if word.startswith(_THREADS_FLAG + "="):
            value = word.split("=", 1)[1]  # the last one wins, as XLA reads them
    return "one" if value.strip().lower() in ("false", "0") else "many"


_ensure_host_flags()

import jax  # noqa: E402  (after the XLA_FLAGS set-up above)
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from . import jax_model as jm  # noqa: E402
from .jax_batch import PREFILL_GRAPH, decode_buckets, execute, prepare, warm  # noqa: E402,F401 (decode_buckets: public here)
from .jax_serving import serve  # noqa: E402


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@dataclass
class _TpState:
    """Mesh and weights of one tp degree (shared by every batch size)."""

    mesh: Mesh
    params: Any
    param_sh: Any
    repl: NamedSharding
    cache_sh: NamedSharding


@dataclass
class _UnitState:
    """Compiled graphs, KV cache and reusable device scalars of one (tp, batch) unit."""

    tp: int
    batch: int
    cache_len: int
    ck: Any
    cv: Any
    tokens0: Any
    step1: Any
    graphs: dict[tuple[str, int], Any] = field(default_factory=dict)
    compile_s: dict[tuple[str, int], float] = field(default_factory=dict)


class JaxRunner(Runner):
    """Runs a random-weight Llama-architecture decoder through XLA; see the module docstring."""

    name = "jax"
    simulated = False
    modes = ("static", "continuous")
    #: warmup: untimed runs before timing (per distinct graph set in profile, per graph in
    #: run_workload); cache_len: KV-cache positions per row, 0 = the largest
    #: token-generation bucket seen so far (a larger bucket later rebuilds the unit's graphs)
    options_schema = {"warmup": (int, 1), "cache_len": (int, 0)}

    def __init__(self, target: Target):
        super().__init__(target)
        self._tp: dict[int, _TpState] = {}
        self._units: dict[tuple[int, int], _UnitState] = {}

    # -- identity ---------------------------------------------------------------------------
    def versions(self) -> dict[str, str]:
        import jaxlib

        return {
            "python": platform.python_version(),
            "jax": jax.__version__,
            "jaxlib": jaxlib.__version__,
            "cpu": _cpu_model(),
            "platform": jax.default_backend(),
            # profiles measured with XLA's thread pool (before it was turned off) keep their
            # fingerprint under XLA_FLAGS=--xla_cpu_multi_thread_eigen=true, and are not
            # reused by a one-thread run
            **({"xla_cpu_threads": "one"}
               if jax.default_backend() == "cpu" and _cpu_threads(os.environ.get("XLA_FLAGS", "")) == "one" else {}),
        }

    def check_unit(self, unit: Unit) -> None:
        s = unit.target.model
        tp, batch = unit.tp, unit.batch
        if isinstance(tp, bool) or not isinstance(tp, (int, np.integer)) or tp < 1:
            raise UserError(f"tp = {tp!r}: tensor parallelism must be an integer >= 1")
        if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
            raise UserError(f"batch = {batch!r}: batch size must be an integer >= 1")
        for fld in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab"):
            if getattr(s, fld) < 1:
                raise UserError(f"model.{fld} = {getattr(s, fld)} must be >= 1")
        if s.hidden % s.heads:
            raise UserError(f"model.hidden = {s.hidden} is not a multiple of model.heads = {s.heads}")
        if s.head_dim % 2:
            raise UserError(f"model head_dim = hidden / heads = {s.head_dim} is odd; rotary embeddings need it even")
        if s.heads % s.kv_heads:
            raise UserError(f"model.heads = {s.heads} is not a multiple of model.kv_heads = {s.kv_heads}")
        for fld in ("heads", "kv_heads", "intermediate"):
            v = getattr(s, fld)
            if v % tp:
                raise UserError(f"tp = {tp} does not divide model.{fld} = {v}; choose a tp that divides it")
        if unit.target.dtype not in jm.DTYPES:
            raise UserError(f"dtype {unit.target.dtype!r} is not supported by the jax runner: use one of {', '.join(jm.DTYPES)}")
        check_policy(unit.target.bucket_policy)
        n = len(jax.devices())
        if tp > n:
            if jax.default_backend() == "cpu":
                raise RunnerError(
                    f"tp = {tp} needs {tp} devices but jax started with {n} CPU device(s): jax was initialised "
                    f"before the jax runner could set XLA_FLAGS; start the process with "
                    f"XLA_FLAGS={_DEVICE_FLAG}={max(tp, _CPU_DEVICES)}"
                )
            raise UserError(f"tp = {tp} exceeds the {n} available {jax.default_backend()} device(s)")

    # -- graphs -----------------------------------------------------------------------------
    def compiled_graphs(self, tp: int, batch: int) -> list[tuple[str, int]]:
        """The graphs compiled for unit (tp, batch): ``[("prefill", b), ("decode", b), ...]``."""
        st = self._units.get((tp, batch))
        return sorted(st.graphs) if st else []

    def compile_seconds(self, tp: int, batch: int) -> dict[tuple[str, int], float]:
        """Seconds spent lowering and compiling each graph of unit (tp, batch)."""
        st = self._units.get((tp, batch))
        return dict(st.compile_s) if st else {}

    def _tp_state(self, tp: int) -> _TpState:
        st = self._tp.get(tp)
        if st is None:
            t = self.target
            mesh = Mesh(np.asarray(jax.devices()[:tp]), (jm.TP_AXIS,))
            specs = jm.param_specs(t.model)
            param_sh = jax.tree.map(lambda sp: NamedSharding(mesh, sp), specs, is_leaf=lambda x: isinstance(x, P))
            params = jm.init_params(t.model, seed=t.seed, dtype=jm.jnp_dtype(t.dtype), shardings=param_sh)
            jax.block_until_ready(params)
            st = _TpState(mesh, params, param_sh, NamedSharding(mesh, P()), NamedSharding(mesh, jm.cache_spec()))
            self._tp[tp] = st
        return st

    def _unit_state(self, tp: int, batch: int, cache_len: int) -> _UnitState:
        """The unit's state with a cache of at least ``cache_len`` positions.

        The cache is sized by the largest token-generation bucket seen; decode graphs read
        a static slice of it, so a larger cache serves smaller bucket sets unchanged.  Only
        when a larger bucket arrives are the cache and its graphs rebuilt.
        """
        key = (tp, batch)
        st = self._units.get(key)
        if st is not None and st.cache_len >= cache_len:
            return st
        ts = self._tp_state(tp)
        dtype = jm.jnp_dtype(self.target.dtype)
        shp = jm.cache_shape(self.target.model, batch, cache_len)
        zeros = jax.jit(lambda: jnp.zeros(shp, dtype), out_shardings=ts.cache_sh)
        if st is not None:  # drop the old cache before allocating the larger one
            st.ck = st.cv = None
        st = _UnitState(
            tp=tp,
            batch=batch,
            cache_len=cache_len,
            ck=zeros(),
            cv=zeros(),
            tokens0=jax.device_put(np.zeros(batch, np.int32), ts.repl),
            step1=jax.device_put(np.int32(1), ts.repl),
        )
        self._units[key] = st
        return st

    def _graph(self, st: _UnitState, kind: str, bucket: int) -> float:
        """Compile graph (kind, bucket) for the unit if missing; return the seconds it took."""
        if (kind, bucket) in st.graphs:
            return 0.0
        t = self.target
        ts = self._tp_state(st.tp)
        dtype = jm.jnp_dtype(t.dtype)
        rep, csh = ts.repl, ts.cache_sh
        cache = jax.ShapeDtypeStruct(jm.cache_shape(t.model, st.batch, st.cache_len), dtype, sharding=csh)
        params = jm.param_structs(t.model, dtype, ts.param_sh)

        def i32(*shape):
            return jax.ShapeDtypeStruct(shape, jnp.int32, sharding=rep)

        t0 = time.perf_counter()
        if kind == "prefill":
            fn = jm.prefill_fn(t.model, bucket, st.cache_len)
            args = (params, cache, cache, i32(st.batch), i32(1, bucket), i32(), i32())
            outs = (rep, csh, csh)
        elif kind == "prefill-batched":
            fn = jm.prefill_batch_fn(t.model, bucket, st.cache_len)
            args = (params, cache, cache, i32(st.batch), i32(st.batch, bucket), i32(st.batch))
            outs = (rep, csh, csh)
        else:
            fn = jm.decode_fn(t.model, bucket)
            args = (params, cache, cache, i32(st.batch), i32(st.batch), i32(st.batch), i32())
            outs = (rep, csh, csh, rep)
        ins = (ts.param_sh, csh, csh) + (rep,) * (len(args) - 3)
        try:
            compiled = jax.jit(fn, in_shardings=ins, out_shardings=outs, donate_argnums=(1, 2)).lower(*args).compile()
        except Exception as exc:  # an XLA failure is a runner failure, with its cause chained
            raise RunnerError(f"jax: compiling the {kind} graph of bucket {bucket} (tp {st.tp}, batch {st.batch}) failed: {exc}") from exc
        dt = time.perf_counter() - t0
        st.graphs[(kind, bucket)] = compiled
        st.compile_s[(kind, bucket)] = dt
        return dt

    def _ensure(self, tp: int, batch: int, ctx: Sequence[int], tkg: Sequence[int]) -> tuple[_UnitState, float]:
        need = max(tkg)
        fixed = self._options()["cache_len"]
        if fixed:
            if fixed < need:
                raise UserError(f"target option cache_len = {fixed} is smaller than the largest token-generation bucket {need}")
            need = fixed
        t0 = time.perf_counter()
        st = self._unit_state(tp, batch, need)  # weights and cache: counted with compiling
        setup = time.perf_counter() - t0
        pre = PREFILL_GRAPH[self.target.prefill]
        comp = sum(self._graph(st, pre, b) for b in ctx) + sum(self._graph(st, "decode", b) for b in tkg)
        return st, setup + comp

    # -- one static batch (runners.jax_batch) ------------------------------------------------
    def _prepare(self, st: _UnitState, prompts: Sequence[np.ndarray], out_len: Sequence[int],
                 ctx: Sequence[int], tkg: Sequence[int]):
        ts = self._tp_state(st.tp)
        return prepare(st, lambda a: jax.device_put(a, ts.repl), prompts, out_len, ctx, tkg,
                       policy=self.target.bucket_policy, prefill=self.target.prefill)

    def _run(self, st: _UnitState, bt, *, record: bool = False):
        return execute(st, self._tp_state(st.tp).params, bt, record=record)

    def _warm_graphs(self, st: _UnitState, ctx: Sequence[int], tkg: Sequence[int], times: int) -> None:
        ts = self._tp_state(st.tp)
        warm(st, ts.params, lambda a: jax.device_put(a, ts.repl), ctx, tkg, times, prefill=self.target.prefill)

    # -- validation -------------------------------------------------------------------------
    def _check_request(self, what: str, l_in: int, l_out: int, ctx: Sequence[int], tkg: Sequence[int]) -> None:
        pol = self.target.bucket_policy
        if l_in < 1 or l_out < 1:
            raise UserError(f"{what}: input_len = {l_in}, output_len = {l_out}; both must be >= 1")
        if select_index([l_in], ctx, pol)[0] < 0:
            raise UserError(
                f"{what}: input_len = {l_in} fits no context-encoding bucket {list(ctx)} under the {pol} policy; "
                f"add a larger bucket or shorten the prompt"
            )
        last = l_in + l_out - 1  # with l_out = 1 the prompt itself must fit the cache
        if select_index([last], tkg, pol)[0] < 0:
            raise UserError(
                f"{what}: input_len = {l_in}, output_len = {l_out} reaches context {last}, which fits no "
                f"token-generation bucket {list(tkg)} under the {pol} policy; add a larger bucket or shorten it"
            )

    def _options(self) -> dict[str, int]:
        """The target's options checked against ``options_schema`` (defaults filled in)."""
        out = {}
        for key, _ in self.target.options:
            if key not in self.options_schema:
                raise UserError(f"target option {key!r} is unknown to the jax runner: use one of {', '.join(self.options_schema)}")
        for key, (typ, default) in self.options_schema.items():
            v = self.target.option(key, default)
            if isinstance(v, bool) or not isinstance(v, (typ, np.integer)) or v < 0:
                raise UserError(f"target option {key} = {v!r}: give a whole number >= 0")
            out[key] = int(v)
        return out

    # -- the runner interface ---------------------------------------------------------------
    def profile(self, unit: Unit, probes: Sequence[Probe]) -> ProfileResult:
        """Compile the unit for the probes' buckets (ctx and tkg alike), run every probe."""
        self.check_unit(unit)
        warm = self._options()["warmup"]
        if not probes:
            raise UserError("profile: no probes given")
        buckets = validate_buckets(sorted({int(p.bucket) for p in probes}), what="probe buckets")
        pol = self.target.bucket_policy
        for i, p in enumerate(probes):
            what = f"probe {i} (bucket {p.bucket})"
            if p.repeats < 1:
                raise UserError(f"{what}: repeats = {p.repeats}; give at least 1")
            self._check_request(what, p.input_len, p.output_len, buckets, buckets)
            if select(p.input_len, buckets, pol) != p.bucket:
                raise UserError(
                    f"{what}: input_len = {p.input_len} runs in bucket {select(p.input_len, buckets, pol)}, "
                    f"not {p.bucket}, under the {pol} policy"
                )
        st, compile_s = self._ensure(unit.tp, unit.batch, buckets, buckets)
        rng = np.random.default_rng(self.target.seed)
        vocab = self.target.model.vocab
        run_s = 0.0
        batches = []
        for p in probes:
            prompt = rng.integers(0, vocab, size=p.input_len, dtype=np.int32)
            batches.append(self._prepare(st, [prompt] * unit.batch, [p.output_len] * unit.batch, buckets, buckets))
        # warm every graph set before timing anything, then take the repeats round-robin over
        # the probes: drift on a busy host (clock, caches, other processes) then hits the two
        # runs of a bucket alike instead of biasing one of them
        warmed: set[tuple] = set()
        for bt in batches:
            if bt.graph_set not in warmed:
                for _ in range(warm):
                    run_s += self._run(st, bt)[2]
                warmed.add(bt.graph_set)
        times: list[list[float]] = [[] for _ in probes]
        for r in range(max(p.repeats for p in probes)):
            for i, (p, bt) in enumerate(zip(probes, batches)):
                if r < p.repeats:
                    wall = self._run(st, bt)[2]
                    times[i].append(wall)
                    run_s += wall
        runs = [ProbeRun(p, tuple(t)) for p, t in zip(probes, times)]
        return ProfileResult(
            runs=tuple(runs), compile_s=compile_s, run_s=run_s, host=self.host(),
            versions=self.versions(), simulated=False,
        )

    def run_workload(self, candidate: Candidate, requests: Requests, *, mode: str = "static") -> WorkloadRun:
        """Run ``requests`` in static batches of ``candidate.batch``, or served by continuous batching."""
        self.check_mode(mode, requests)
        if mode == "continuous":
            self._check_serving_prefill()
        ctx = validate_buckets(candidate.ctx_buckets, what="ctx_buckets")
        tkg = validate_buckets(candidate.tkg_buckets, what="tkg_buckets")
        self.check_unit(Unit(self.target, candidate.tp, candidate.batch))
        warm = self._options()["warmup"]
        lin, lout = requests.input_len, requests.output_len
        for i in range(len(requests)):
            self._check_request(f"request {i}", int(lin[i]), int(lout[i]), ctx, tkg)
        st, compile_s = self._ensure(candidate.tp, candidate.batch, ctx, tkg)
        t0 = time.perf_counter()
        self._warm_graphs(st, ctx, tkg, warm)
        run_s = time.perf_counter() - t0
        if mode == "continuous":
            return self._serve(st, requests, ctx, tkg, compile_s=compile_s, run_s=run_s)
        rng = np.random.default_rng(self.target.seed)
        vocab = self.target.model.vocab
        n = len(requests)
        ttft = np.zeros(n)
        e2e = np.zeros(n)
        total = 0.0
        for s in range(0, n, candidate.batch):
            e = min(s + candidate.batch, n)
            prompts = [rng.integers(0, vocab, size=int(lin[i]), dtype=np.int32) for i in range(s, e)]
            bt = self._prepare(st, prompts, lout[s:e], ctx, tkg)
            t_ttft, t_e2e, wall, _ = self._run(st, bt)
            ttft[s:e], e2e[s:e] = t_ttft, t_e2e
            total += wall
        run_s += total
        return WorkloadRun(ttft_s=ttft, e2e_s=e2e, total_s=total, compile_s=compile_s, run_s=run_s,
                           host=self.host(), simulated=False)

    def _check_serving_prefill(self) -> None:
        if self.target.prefill != "sequential":
            raise UserError(
                f"jax runner: continuous batching here prefills one admitted prompt per call (runners.jax_serving); "
                f"[target] prefill = \"{self.target.prefill}\" runs static batches only: set prefill = \"sequential\" "
                f"for continuous mode"
            )

    def _serve(self, st: _UnitState, requests: Requests, ctx, tkg, *, compile_s: float, run_s: float,
               record: bool = False, prompts: Sequence[np.ndarray] | None = None):
        """Continuous batching (runners.jax_serving) of ``requests``, released at their arrival times."""
        ts = self._tp_state(st.tp)
        pol = self.target.bucket_policy
        if prompts is None:
            rng = np.random.default_rng(self.target.seed)
            prompts = [rng.integers(0, self.target.model.vocab, size=int(x), dtype=np.int32) for x in requests.input_len]
        dev = []
        for p in prompts:  # on the device before the clock starts, like a static batch's inputs
            padded = np.zeros((1, select(len(p), ctx, pol)), np.int32)
            padded[0, : len(p)] = p
            dev.append(jax.device_put(padded, ts.repl))
        arrival = np.asarray(requests.arrival_s, np.float64)
        arrival = arrival - arrival.min()
        sched = self.target.scheduler
        out = serve(params=ts.params, state=st, put=lambda a: jax.device_put(a, ts.repl), prompts=dev,
                    input_len=requests.input_len, output_len=requests.output_len, arrival_s=arrival, ctx=ctx,
                    tkg=tkg, policy=pol, max_prefills=sched.max_prefills, eager=sched.prefill_priority == "prefill",
                    record=record)
        if record:
            return out
        return WorkloadRun(ttft_s=out.first_s - arrival, e2e_s=out.finish_s - arrival,
                           total_s=float(out.finish_s.max()), compile_s=compile_s, run_s=run_s + out.wall_s,
                           host=self.host(), simulated=False, mode="continuous")

    def generate(self, *, tp: int, batch: int, ctx_buckets: Sequence[int], tkg_buckets: Sequence[int],
                 prompts: Sequence[Sequence[int]], output_len: Sequence[int]) -> list[np.ndarray]:
        """Greedy tokens of one static batch (at most ``batch`` prompts), for checking numerics."""
        ctx = validate_buckets(ctx_buckets, what="ctx_buckets")
        tkg = validate_buckets(tkg_buckets, what="tkg_buckets")
        self.check_unit(Unit(self.target, tp, batch))
        if not 1 <= len(prompts) <= batch or len(prompts) != len(output_len):
            raise UserError(f"generate: give 1..{batch} prompts and one output length per prompt")
        for i, (p, lo) in enumerate(zip(prompts, output_len)):
            self._check_request(f"prompt {i}", len(p), int(lo), ctx, tkg)
        st, _ = self._ensure(tp, batch, ctx, tkg)
        bt = self._prepare(st, [np.asarray(p, np.int32) for p in prompts], output_len, ctx, tkg)
        return self._run(st, bt, record=True)[3]

    def serve_tokens(self, *, tp: int, batch: int, ctx_buckets: Sequence[int], tkg_buckets: Sequence[int],
                     prompts: Sequence[Sequence[int]], output_len: Sequence[int], arrival_s: Sequence[float]):
        """Continuous batching of the given prompts, recording every request's greedy tokens (for
        checking the slot machinery: a request's tokens must not depend on its neighbours)."""
        self._check_serving_prefill()
        ctx = validate_buckets(ctx_buckets, what="ctx_buckets")
        tkg = validate_buckets(tkg_buckets, what="tkg_buckets")
        self.check_unit(Unit(self.target, tp, batch))
        req = Requests(np.asarray([len(p) for p in prompts]), np.asarray(output_len), np.asarray(arrival_s, float))
        for i in range(len(req)):
            self._check_request(f"prompt {i}", int(req.input_len[i]), int(req.output_len[i]), ctx, tkg)
        st, _ = self._ensure(tp, batch, ctx, tkg)
        return self._serve(st, req, ctx, tkg, compile_s=0.0, run_s=0.0, record=True,
                           prompts=[np.asarray(p, np.int32) for p in prompts])

    def close(self) -> None:
        self._units.clear()
        self._tp.clear()
