"""``sim``: simulated NPUs, the ground truth of lensopt's experiments.

A compiled-shape accelerator simulated step by step and request by request, written apart
from ``lens``' composition code (it shares only the bucket-selection function, which is
the machine's own rule). What it models, none of it visible to the estimator:

- padded compute: a prefill runs the whole context bucket, a decode step attends over the
  whole token-generation bucket; each graph costs a roofline of its FLOPs and bytes on
  one device (public figures in ``runners.sim_devices``) at hidden efficiencies;
- tensor parallelism: weights and KV heads split over ``tp`` devices, two ring
  all-reduces per layer over the interconnect (latency per hop plus bytes/bandwidth);
- compiler quirks: every compiled graph (kind, bucket, tp, batch) gets an off-trend cost
  factor in about 0.85-1.3, drawn from ``quirk_seed``; graphs of non-power-of-two buckets
  tend to be slower (tiling);
- host overhead per graph call, per generate call, and per request still generating at a
  decode step (sampling, stop checks, streaming: a probe keeps every row busy, a real
  batch thins out as its outputs end);
- run-to-run lognormal noise (``noise``, seeded by ``target.seed``);
- device-memory capacity: weights/tp plus the KV cache of batch x longest bucket must fit
  (``runners.sim_devices.fits_memory``), else a ``RunnerError`` like a real OOM;
- compile time per graph, a function of model size and bucket, reported in ``compile_s``
  as hardware seconds and never slept.

Machine semantics (the same as the real runners'): a request (l_in, l_out) yields l_out
tokens, the first from its prefill, then l_out - 1 decode steps; step k has context
l_in + k. A static batch first encodes its prompts one request at a time (each in ctx
bucket sel(l_in); padding rows of a short last batch are not encoded), then decodes as
one shape: at step k the tkg bucket is sel(max of l_in + k over the batch's requests
still generating), and every row advances until the longest output ends (finished and
padding rows ride along without setting the bucket). TTFT of a request is measured from
its batch's start to the end of its own prefill, E2E to its last token.
"""
from __future__ import annotations

import hashlib
from typing import Any, Sequence

import numpy as np

from lens.buckets import check_policy, select_index, validate_buckets
from lens.errors import DeviceOutOfMemory, RunnerError, UserError
from lens.types import Candidate, Probe, ProbeRun, ProfileResult, Requests, Target, Unit, WorkloadRun, stable_hash

from .base import Runner
from .sim_devices import (
    DEVICES,
    USABLE_MEMORY,
    DeviceSpec,
    device_info,
    device_spec,
    dtype_bytes,
    fits_memory,
    hardware_names,
    kv_bytes_per_token,
    memory_need_bytes,
    memory_need_gib,
)

SIM_VERSION = "lensopt-sim 1.0"

__all__ = [
    "SIM_VERSION",
    "SimRunner",
    "device_info",
    "fits_memory",
    "hardware_names",
    "memory_need_gib",
]

# Hidden per-family behaviour: achieved fractions of peak (prefill MFU, decode MFU, HBM
# bandwidth), all-reduce latency per ring hop, and compile-time constants. Chosen so the
# simulated figures land near the published ones (the LENS paper: v6e Llama-3.1-8B TP4
# TTFT ~71 ms at 4096; Inferentia2 TBT ~8-11 ms; Neuron compiles of 10-60 min per model).
_HIDDEN: dict[str, dict[str, float]] = {
    "inf2": dict(mfu=0.45, mfu_decode=0.25, mbu=0.70, hop_s=6e-6, compile_base_s=20.0, compile_per_gparam_s=20.0),
    "trn1": dict(mfu=0.48, mfu_decode=0.27, mbu=0.72, hop_s=5e-6, compile_base_s=20.0, compile_per_gparam_s=18.0),
    "trn2": dict(mfu=0.42, mfu_decode=0.22, mbu=0.68, hop_s=4e-6, compile_base_s=18.0, compile_per_gparam_s=15.0),
    "tpu-v5e": dict(mfu=0.42, mfu_decode=0.25, mbu=0.78, hop_s=3e-6, compile_base_s=5.0, compile_per_gparam_s=4.0),
    "tpu-v6e": dict(mfu=0.36, mfu_decode=0.20, mbu=0.75, hop_s=3e-6, compile_base_s=5.0, compile_per_gparam_s=3.5),
    "tpu-v5p": dict(mfu=0.45, mfu_decode=0.25, mbu=0.78, hop_s=3e-6, compile_base_s=5.0, compile_per_gparam_s=4.0),
}
assert set(_HIDDEN) == set(DEVICES)

#: a roofline with imperfect overlap: time = max(compute, memory) + this share of the other
_OVERLAP_LOSS = 0.15
#: the band compiler quirk factors are clipped to
_QUIRK_RANGE = (0.85, 1.30)


def _unit_interval(*parts: Any) -> float:
    """A deterministic number in [0, 1) from ``parts`` (stable across processes)."""
    h = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2.0**64


def _rng(*parts: Any) -> np.random.Generator:
    h = hashlib.sha256(repr(parts).encode()).digest()
    return np.random.default_rng(int.from_bytes(h[:16], "big"))


class _Graphs:
    """Per-graph costs of one compiled unit (target, tp, batch): seconds per call."""

    def __init__(self, runner: "SimRunner", tp: int, batch: int):
        t = runner.target
        self.spec: DeviceSpec = runner.spec
        self.hid = _HIDDEN[t.hardware]
        self.tp, self.batch = tp, batch
        self.model = m = t.model
        self.bytes = dtype_bytes(t.dtype)
        peak = self.spec.peak_tflops_8bit if self.bytes == 1 else self.spec.peak_tflops
        if t.dtype == "float32":
            peak /= 4.0  # matmul engines run FP32 at about a quarter of the BF16 rate
        self.flops_s = peak * 1e12
        self.bw = self.spec.bandwidth_gbs * 1e9 * self.hid["mbu"]
        self.link = self.spec.link_gbs * 1e9
        self.dense = float(m.param_count() - 2 * m.vocab * m.hidden)  # per-layer weights
        self.head = float(m.vocab * m.hidden)  # LM head (logits of the last position)
        self.kv_token = kv_bytes_per_token(m, t.dtype)
        self.host_s = float(runner.opt("host_overhead_s"))
        self.quirk_strength = float(runner.opt("quirks"))
        self.quirk_key = (runner.opt("quirk_seed"), t.hardware, t.dtype, tuple(m.to_dict().values()), tp, batch)

    # -- the hidden pieces ---------------------------------------------------------------
    def _allreduce_s(self, nbytes: np.ndarray) -> np.ndarray:
        if self.tp == 1:
            return np.zeros_like(nbytes, dtype=float)
        p = self.tp
        return 2 * (p - 1) * self.hid["hop_s"] + 2.0 * (p - 1) / p * nbytes / self.link

    def _roofline(self, flops: np.ndarray, nbytes: np.ndarray, mfu: float) -> np.ndarray:
        c = flops / self.tp / (self.flops_s * mfu)
        m = nbytes / self.tp / self.bw
        return np.maximum(c, m) + _OVERLAP_LOSS * np.minimum(c, m)

    def quirk(self, kind: str, bucket: int) -> float:
        """The compiler's off-trend factor for one graph; 1.0 when quirks are off."""
        if self.quirk_strength == 0.0:
            return 1.0
        u = _unit_interval("class", kind, bucket, *self.quirk_key)
        v = _unit_interval("value", kind, bucket, *self.quirk_key)
        if u < 0.2:  # a shape the compiler handles unusually well
            f = 0.85 + 0.08 * v
        elif u > 0.8:  # one it handles badly
            f = 1.08 + 0.17 * v
        else:
            f = 0.97 + 0.06 * v
        if bucket & (bucket - 1):  # not a power of two: ragged tiles
            f *= 1.04 if kind == "ctx" else 1.08
        f = float(np.exp(self.quirk_strength * np.log(f)))
        return float(np.clip(f, *_QUIRK_RANGE))

    # -- graph costs ---------------------------------------------------------------------
    def prefill_s(self, buckets: Sequence[int]) -> np.ndarray:
        """One prompt encoded alone in each ctx bucket (padded to it), host step included."""
        s = np.asarray(buckets, dtype=float)
        m = self.model
        flops = 2.0 * self.dense * s + 4.0 * s * s * m.hidden * m.layers + 2.0 * self.head
        nbytes = (self.dense + self.head) * self.bytes + s * self.kv_token + 4.0 * s * m.hidden * self.bytes * m.layers
        dev = self._roofline(flops, nbytes, self.hid["mfu"])
        dev = dev + 2 * m.layers * self._allreduce_s(s * m.hidden * self.bytes)
        q = np.array([self.quirk("ctx", int(b)) for b in buckets])
        return dev * q + self.host_s

    def decode_s(self, buckets: Sequence[int]) -> np.ndarray:
        """One decode step of the whole batch with its KV context padded to each tkg bucket."""
        s = np.asarray(buckets, dtype=float)
        m, b = self.model, self.batch
        flops = 2.0 * (self.dense + self.head) * b + 4.0 * b * s * m.hidden * m.layers
        nbytes = (self.dense + self.head) * self.bytes + b * s * self.kv_token
        dev = self._roofline(flops, nbytes, self.hid["mfu_decode"])
        dev = dev + 2 * m.layers * self._allreduce_s(np.full_like(s, b * m.hidden * self.bytes))
        q = np.array([self.quirk("tkg", int(x)) for x in buckets])
        return dev * q + self.host_s

    def compile_s(self, kind: str, bucket: int) -> float:
        """Hardware seconds to compile one graph: grows with model size and bucket."""
        gparams = self.model.param_count() / 1e9
        size = (bucket / 1024.0) ** 0.25 * (1.5 if kind == "ctx" else 1.0)
        base = self.hid["compile_base_s"] + self.hid["compile_per_gparam_s"] * gparams * size
        jitter = 0.9 + 0.2 * _unit_interval("compile", kind, bucket, *self.quirk_key)
        return float(base * jitter * (1.0 + 0.05 * np.log2(self.tp)))


class SimRunner(Runner):
    """Simulated NPUs (``target.hardware`` in ``runners.sim_devices.DEVICES``); see the module docstring."""

    name = "sim"
    simulated = True
    options_schema: dict[str, tuple[type, Any]] = {
        "noise": (float, 0.01),  # sigma of the lognormal run-to-run factor
        "quirk_seed": (int, 0),  # which compiler quirks this simulated device has
        "quirks": (float, 1.0),  # strength of the quirks (0: none, 1: default band)
        "host_overhead_s": (float, 0.0008),  # host time per graph call (prefill or decode step)
        "batch_overhead_s": (float, 0.002),  # host time per generate call (one static batch)
        "row_overhead_s": (float, 1e-5),  # host time per request still generating, per decode step
        # real seconds slept per profile / run_workload call (default 0): lets tests watch a
        # scheduler place and overlap tasks; it never enters the simulated times
        "wall_delay_s": (float, 0.0),
    }

    def __init__(self, target: Target):
        super().__init__(target)
        self.spec = device_spec(target.hardware)
        check_policy(target.bucket_policy)
        dtype_bytes(target.dtype)
        known = self.options_schema
        self._opts: dict[str, Any] = {k: d for k, (_, d) in known.items()}
        for key, value in target.options:
            if key not in known:
                raise UserError(
                    f"sim runner: unknown option {key!r} in [target.options] of target {target.name!r}; "
                    f"accepted: {', '.join(sorted(known))}"
                )
            typ = known[key][0]
            ok = isinstance(value, typ) or (typ is float and isinstance(value, int))
            if isinstance(value, bool) or not ok:
                raise UserError(f"sim runner: option {key!r} must be a {typ.__name__}, got {value!r}")
            if typ is float and value < 0:
                raise UserError(f"sim runner: option {key!r} must be >= 0, got {value!r}")
            self._opts[key] = typ(value)

    def opt(self, key: str) -> Any:
        return self._opts[key]

    # -- identity ------------------------------------------------------------------------
    def versions(self) -> dict[str, str]:
        return {"simulator": SIM_VERSION}

    def fingerprint_fields(self) -> dict[str, Any]:
        fields = super().fingerprint_fields()
        # the options define the simulated device (its quirks, noise level, host costs);
        # only their digest goes in. target.seed only picks noise draws, like another day
        # on the same machine, so profiles stay shareable across seeds.
        fields["sim_config"] = stable_hash({"options": self._opts})
        return fields

    def host(self) -> str:  # type: ignore[override]
        return f"sim:{self.target.hardware}"

    # -- checks --------------------------------------------------------------------------
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

    # -- profile -------------------------------------------------------------------------
    def _wall_delay(self) -> None:
        delay = float(self._opts.get("wall_delay_s", 0.0))
        if delay > 0:
            import time

            time.sleep(delay)

    def profile(self, unit: Unit, probes: Sequence[Probe]) -> ProfileResult:
        self.check_unit(unit)
        self._wall_delay()
        probes = list(probes)
        if not probes:
            raise UserError("sim runner: profile needs at least one probe")
        buckets = validate_buckets(sorted({int(p.bucket) for p in probes}), what="probe buckets")
        self._check_memory(unit.tp, unit.batch, buckets[-1])
        g = _Graphs(self, unit.tp, unit.batch)
        pre_cost = g.prefill_s(buckets)
        dec_cost = g.decode_s(buckets)
        policy = self.target.bucket_policy
        noise = float(self.opt("noise"))
        seen: dict[tuple, int] = {}
        runs, run_s = [], 0.0
        for p in probes:
            if p.input_len < 1 or p.output_len < 1 or p.repeats < 1:
                raise UserError(f"sim runner: probe {p} needs input_len, output_len and repeats >= 1")
            ci = int(select_index([p.input_len], buckets, policy)[0])
            ctxs = p.input_len + np.arange(1, p.output_len, dtype=np.int64)
            ti = select_index(ctxs, buckets, policy)
            if ci < 0 or (ti < 0).any():
                raise UserError(
                    f"sim runner: probe {p} does not fit the compiled buckets {list(buckets)} "
                    f"under the {policy} policy"
                )
            # one generate call: B prompts encoded one by one, then B busy rows decode together
            t_once = (
                float(self.opt("batch_overhead_s"))
                + unit.batch * float(pre_cost[ci])
                + float(dec_cost[ti].sum())
                + (p.output_len - 1) * unit.batch * float(self.opt("row_overhead_s"))
            )
            key = (p.bucket, p.input_len, p.output_len)
            seen[key] = seen.get(key, -1) + 1
            rng = _rng("probe", self.target.seed, unit.tp, unit.batch, *key, seen[key])
            times = t_once * rng.lognormal(0.0, noise, size=p.repeats) if noise > 0 else np.full(p.repeats, t_once)
            runs.append(ProbeRun(p, tuple(float(x) for x in times)))
            run_s += float(times.sum())
        compile_s = sum(g.compile_s("ctx", b) + g.compile_s("tkg", b) for b in buckets)
        return ProfileResult(
            runs=tuple(runs),
            compile_s=float(compile_s),
            run_s=run_s,
            host=self.host(),
            versions=self.versions(),
            simulated=True,
        )

    # -- workload ------------------------------------------------------------------------
    def run_workload(self, candidate: Candidate, requests: Requests, *, mode: str = "static") -> WorkloadRun:
        self.check_mode(mode, requests)
        tp, B = candidate.tp, candidate.batch
        self.check_unit(Unit(self.target, tp, B))
        self._wall_delay()
        ctx = validate_buckets(candidate.ctx_buckets, what="ctx_buckets")
        tkg = validate_buckets(candidate.tkg_buckets, what="tkg_buckets")
        self._check_memory(tp, B, max(ctx[-1], tkg[-1]))
        policy = self.target.bucket_policy
        lin, lout = requests.input_len, requests.output_len
        n = len(requests)
        bad = np.flatnonzero((lin < 1) | (lout < 1))
        if bad.size:
            i = int(bad[0])
            raise UserError(f"sim runner: request {i} has input {lin[i]} / output {lout[i]}; both must be >= 1")
        ci = select_index(lin, ctx, policy)
        bad = np.flatnonzero(ci < 0)
        if bad.size:
            i = int(bad[0])
            raise UserError(
                f"sim runner: request {i}: input length {lin[i]} fits no ctx bucket of {list(ctx)} ({policy} policy)"
            )
        last = lin + lout - 1
        bad = np.flatnonzero((lout > 1) & (select_index(last, tkg, policy) < 0))
        if bad.size:
            i = int(bad[0])
            raise UserError(
                f"sim runner: request {i}: context {last[i]} of its last decode step fits no tkg bucket "
                f"of {list(tkg)} ({policy} policy)"
            )

        g = _Graphs(self, tp, B)
        pre_cost = g.prefill_s(ctx)
        dec_cost = g.decode_s(tkg)
        call_s = float(self.opt("batch_overhead_s"))
        row_s = float(self.opt("row_overhead_s"))
        noise = float(self.opt("noise"))
        n_batches = -(-n // B)
        digest = hashlib.sha256(lin.tobytes() + lout.tobytes()).hexdigest()[:16]
        rng = _rng("workload", self.target.seed, tp, B, ctx, tkg, digest)
        factors = rng.lognormal(0.0, noise, size=n_batches) if noise > 0 else np.ones(n_batches)

        ttft = np.empty(n)
        e2e = np.empty(n)
        total = 0.0
        for j in range(n_batches):
            sl = slice(j * B, min((j + 1) * B, n))
            f = factors[j]
            # prompts one by one: request i's first token lands when its own prefill ends
            pre = np.cumsum(pre_cost[ci[sl]]) * f + call_s * f
            ttft[sl] = pre
            # decode steps k = 1 .. max(l_out) - 1; at step k the bucket is set by the
            # longest prompt among the requests still generating (l_out - 1 >= k)
            o = lout[sl]
            steps = int(o.max()) - 1
            if steps > 0:
                longest = np.zeros(steps, dtype=np.int64)
                active = np.zeros(steps)
                for l_i, o_i in zip(lin[sl].tolist(), o.tolist()):
                    if o_i > 1:
                        np.maximum(longest[: o_i - 1], l_i, out=longest[: o_i - 1])
                        active[: o_i - 1] += 1.0
                ti = select_index(longest + np.arange(1, steps + 1), tkg, policy)
                dec = np.cumsum(dec_cost[ti] + row_s * active) * f
                e2e[sl] = np.where(o > 1, pre[-1] + dec[np.maximum(o - 2, 0)], pre)
                total += pre[-1] + dec[-1]
            else:
                e2e[sl] = pre
                total += pre[-1]
        compile_s = sum(g.compile_s("ctx", b) for b in ctx) + sum(g.compile_s("tkg", b) for b in tkg)
        return WorkloadRun(
            ttft_s=ttft,
            e2e_s=e2e,
            total_s=float(total),
            compile_s=float(compile_s),
            run_s=float(total),
            host=self.host(),
            simulated=True,
        )
