"""``SimRunner``: the runner interface over the simulated machine (profile, run_workload).

It checks what a real stack would refuse (tp vs heads and host size, lengths that fit no
bucket, units that do not fit device memory), compiles each graph once per runner (a
warm compile cache, as Neuron's and XLA's persistent caches give a real host) and runs
every probe and every static batch as a generate call on ``runners.sim.machine``. The
device's clock advances by every simulated second it spends, compiling included, so host
drift separates a profile from a measurement made later. Nothing here sleeps (except
the opt-in ``wall_delay_s`` for scheduling tests) and everything returned says simulated.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import numpy as np

from lens.errors import DeviceOutOfMemory, UserError
from lens.types import Candidate, Probe, ProbeRun, ProfileResult, Requests, Target, Unit, WorkloadRun, stable_hash

from ..base import Runner
from .devices import USABLE_MEMORY, device_spec, dtype_bytes, memory_need_bytes
from .host import Host, SimClock
from .kernels import UnitGraphs
from .machine import generate
from .options import MOVED, OPTIONS_SCHEMA, SimOptions, parse
from .select import bucket_index, check_buckets, check_policy
from .serving import serve
from .stacks import STACKS

SIM_VERSION = "lensopt-sim 2.0"


class SimRunner(Runner):
    """Simulated NPUs (``target.hardware`` in ``runners.sim.devices.DEVICES``); see ``runners.sim``."""

    name = "sim"
    simulated = True
    modes = ("static", "continuous")
    options_schema: dict[str, tuple[type, Any]] = OPTIONS_SCHEMA
    moved_options = MOVED

    def __init__(self, target: Target, *, clock: SimClock | None = None):
        super().__init__(target)
        self.spec = device_spec(target.hardware)
        self.stack = STACKS[target.hardware]
        check_policy(target.bucket_policy)
        dtype_bytes(target.dtype)
        self.options: SimOptions = parse(target.options, target_name=target.name)
        self.clock = clock if clock is not None else SimClock.for_option(self.options.clock)
        self._host = Host(self.options, seed=target.seed)
        self._compiled: set[tuple] = set()
        self._calls = 0

    # -- identity ----------------------------------------------------------------------------
    def versions(self) -> dict[str, str]:
        return {"simulator": SIM_VERSION}

    def fingerprint_fields(self) -> dict[str, Any]:
        fields = super().fingerprint_fields()
        # the options define the simulated device (its quirks, effects, noise level, host
        # costs); only their digest goes in. target.seed only picks noise, stalls and the
        # drift's phase, like another day on the same machine, so profiles stay shareable
        # across seeds; wall_delay_s never enters a simulated time.
        opts = {k: v for k, v in dataclasses.asdict(self.options).items() if k != "wall_delay_s"}
        # the stack's prefill was an option once: its digest keeps it, so a device keeps its fingerprint
        opts["prefill"] = self.target.prefill
        fields["sim_config"] = stable_hash({"options": opts})
        return fields

    def host(self) -> str:  # type: ignore[override]
        return f"sim:{self.target.hardware}"

    # -- checks ------------------------------------------------------------------------------
    def check_unit(self, unit: Unit) -> None:
        m, tp, s = self.target.model, unit.tp, self.spec
        if isinstance(tp, bool) or not isinstance(tp, (int, np.integer)) or tp < 1:
            raise UserError(f"sim runner: tp {tp!r} must be a positive integer")
        if isinstance(unit.batch, bool) or not isinstance(unit.batch, (int, np.integer)) or unit.batch < 1:
            raise UserError(f"sim runner: batch {unit.batch!r} must be a positive integer")
        if m.heads % tp or m.kv_heads % tp:
            raise UserError(
                f"sim runner: tp {tp} must divide the model's heads ({m.heads}) and kv_heads ({m.kv_heads})"
            )
        if tp > s.devices_per_host:
            raise UserError(
                f"sim runner: tp {tp} exceeds the {s.devices_per_host} {s.device} devices of one "
                f"{s.instance} host ({self.target.hardware})"
            )

    def _check_memory(self, tp: int, batch: int, max_len: int) -> None:
        """Weights/tp plus a KV cache of batch x longest bucket must fit one device, as on a real one."""
        t, s = self.target, self.spec
        need = memory_need_bytes(t.model, t.dtype, tp, batch, max_len)
        usable = s.memory_bytes * USABLE_MEMORY
        if need > usable:
            gib = 1024**3
            raise DeviceOutOfMemory(
                f"sim:{t.hardware}: out of device memory: tp {tp}, batch {batch}, longest bucket {max_len} "
                f"needs {need / gib:.2f} GiB per {s.device} (weights/tp + KV cache), "
                f"{usable / gib:.2f} GiB usable of {s.memory_gib:.2f} GiB; raise tp or lower batch or buckets"
            )

    # -- the machine -------------------------------------------------------------------------
    def _graphs(self, tp: int, batch: int) -> UnitGraphs:
        t, o = self.target, self.options
        return UnitGraphs(
            spec=self.spec, stack=self.stack, model=t.model, dtype=t.dtype, tp=tp, batch=batch,
            context_attention=o.context_attention, quirks=o.quirks,
            quirk_key=(o.quirk_seed, t.hardware, t.dtype, tuple(t.model.to_dict().values())),
        )

    def _compile(self, g: UnitGraphs, ctx: Sequence[int], tkg: Sequence[int]) -> float:
        """Hardware seconds to compile what this runner has not compiled yet; the clock moves on."""
        kind = "ctx-batched" if self.target.prefill == "batched" else "ctx"
        want = [("unit",)] + [(kind, b) for b in ctx] + [("tkg", b) for b in tkg]
        seconds = 0.0
        for graph in want:
            key = (g.tp, g.batch, *graph)
            if key in self._compiled:
                continue
            self._compiled.add(key)
            seconds += g.compile_unit_s() if graph == ("unit",) else g.compile_graph_s(*graph)
        self.clock.advance(seconds)
        return seconds

    def _call(self, g: UnitGraphs, lin: np.ndarray, lout: np.ndarray, ctx: tuple[int, ...], tkg: tuple[int, ...]):
        """One generate call at the clock's time; the clock moves on by its length."""
        self._calls += 1
        key = (self.target.seed, g.tp, g.batch, self._calls)
        out = generate(g, self._host, self.options, input_len=lin, output_len=lout, ctx_buckets=ctx,
                       tkg_buckets=tkg, policy=self.target.bucket_policy, prefill=self.target.prefill, key=key,
                       clock_s=self.clock.now())
        self.clock.advance(out.total_s)
        return out

    def _wall_delay(self) -> None:
        if self.options.wall_delay_s > 0:
            time.sleep(self.options.wall_delay_s)

    # -- profile -----------------------------------------------------------------------------
    def profile(self, unit: Unit, probes: Sequence[Probe]) -> ProfileResult:
        self.check_unit(unit)
        self._wall_delay()
        probes = list(probes)
        if not probes:
            raise UserError("sim runner: profile needs at least one probe")
        buckets = check_buckets(sorted({int(p.bucket) for p in probes}), what="probe buckets")
        policy = self.target.bucket_policy
        for p in probes:
            if p.input_len < 1 or p.output_len < 1 or p.repeats < 1:
                raise UserError(f"sim runner: probe {p} needs input_len, output_len and repeats >= 1")
            contexts = p.input_len + np.arange(0, p.output_len, dtype=np.int64)  # the prompt, then each step
            if (bucket_index(contexts, buckets, policy) < 0).any():
                raise UserError(
                    f"sim runner: probe {p} does not fit the compiled buckets {list(buckets)} "
                    f"under the {policy} policy"
                )
        self._check_memory(unit.tp, unit.batch, buckets[-1])
        g = self._graphs(unit.tp, unit.batch)
        compile_s = self._compile(g, buckets, buckets)
        # one generate call per repeat (a full batch of identical requests), the repeats taken
        # round-robin over the probes, as the runner contract asks: a slow stretch of the host
        # then lands on every bucket a little instead of on one bucket's runs
        times: list[list[float]] = [[] for _ in probes]
        for r in range(max(p.repeats for p in probes)):
            for i, p in enumerate(probes):
                if r < p.repeats:
                    lin = np.full(unit.batch, p.input_len, np.int64)
                    lout = np.full(unit.batch, p.output_len, np.int64)
                    times[i].append(float(self._call(g, lin, lout, buckets, buckets).total_s))
        runs = [ProbeRun(p, tuple(t)) for p, t in zip(probes, times)]
        run_s = float(sum(sum(t) for t in times))
        return ProfileResult(runs=tuple(runs), compile_s=compile_s, run_s=run_s, host=self.host(),
                             versions=self.versions(), simulated=True)

    # -- workload ----------------------------------------------------------------------------
    def _check_requests(self, requests: Requests, ctx: tuple[int, ...], tkg: tuple[int, ...]) -> None:
        """Name the first request a real stack would refuse: empty, or longer than the buckets."""
        policy = self.target.bucket_policy
        lin, lout = requests.input_len, requests.output_len
        last = lin + lout - 1
        checks = (
            ((lin < 1) | (lout < 1), lambda i: f"has input {lin[i]} / output {lout[i]}; both must be >= 1"),
            (bucket_index(lin, ctx, policy) < 0,
             lambda i: f"input length {lin[i]} fits no ctx bucket of {list(ctx)} ({policy} policy)"),
            ((lout > 1) & (bucket_index(last, tkg, policy) < 0),
             lambda i: f"context {last[i]} of its last decode step fits no tkg bucket of {list(tkg)} ({policy} policy)"),
        )
        for bad, why in checks:
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise UserError(f"sim runner: request {i}: {why(i)}; add a larger bucket or shorten the request")

    def run_workload(self, candidate: Candidate, requests: Requests, *, mode: str = "static") -> WorkloadRun:
        self.check_mode(mode, requests)
        tp, B = candidate.tp, candidate.batch
        self.check_unit(Unit(self.target, tp, B))
        self._wall_delay()
        ctx = check_buckets(candidate.ctx_buckets, what="ctx_buckets")
        tkg = check_buckets(candidate.tkg_buckets, what="tkg_buckets")
        n = len(requests)
        if n == 0:
            raise UserError("sim runner: the workload has no requests")
        self._check_memory(tp, B, max(ctx[-1], tkg[-1]))
        self._check_requests(requests, ctx, tkg)
        g = self._graphs(tp, B)
        compile_s = self._compile(g, ctx, tkg)
        if mode == "continuous":
            return self._serve(g, requests, ctx, tkg, compile_s)
        ttft, e2e, total = np.empty(n), np.empty(n), 0.0
        for start in range(0, n, B):  # static batches, one after another, in order
            sl = slice(start, min(start + B, n))
            out = self._call(g, requests.input_len[sl], requests.output_len[sl], ctx, tkg)
            ttft[sl], e2e[sl] = out.ttft_s, out.e2e_s
            total += out.total_s
        return WorkloadRun(ttft_s=ttft, e2e_s=e2e, total_s=float(total), compile_s=float(compile_s),
                           run_s=float(total), host=self.host(), simulated=True)

    def _serve(self, g: UnitGraphs, requests: Requests, ctx: tuple[int, ...], tkg: tuple[int, ...],
               compile_s: float) -> WorkloadRun:
        """Continuous batching (``runners.sim.serving``) from the clock's time; the clock moves on."""
        self._calls += 1
        sched = self.target.scheduler
        out = serve(g, self._host, self.options, input_len=requests.input_len, output_len=requests.output_len,
                    arrival_s=requests.arrival_s, ctx_buckets=ctx, tkg_buckets=tkg,
                    policy=self.target.bucket_policy, key=(self.target.seed, g.tp, g.batch, self._calls),
                    clock_s=self.clock.now(), prefill=self.target.prefill, max_prefills=sched.max_prefills,
                    eager=sched.prefill_priority == "prefill")
        self.clock.advance(out.total_s)
        return WorkloadRun(ttft_s=out.ttft_s, e2e_s=out.e2e_s, total_s=out.total_s, compile_s=float(compile_s),
                           run_s=out.total_s, host=self.host(), simulated=True, mode="continuous")

