"""``vllm``: offline vLLM (``vllm.LLM``) on a GPU, TPU or Neuron platform.

One engine per compiled unit and bucket set: ``tensor_parallel_size = tp``,
``max_num_seqs = batch``, ``max_model_len`` = the largest bucket + 1 (vLLM counts every
generated token against it, the last one included, although that token never enters the
KV cache; the project's convention stops at context l_in + l_out - 1 <= largest bucket).
Prompts are random token ids of the exact length (``skip_tokenizer_init=True``), each
request generates exactly l_out tokens (``ignore_eos``, ``min_tokens = max_tokens = l_out``,
greedy), prefix caching is off so no prompt is served from cache.  The model is
``[target.options] model`` (a Hugging Face id or a local folder); with the default
``load_format = "dummy"`` vLLM fills it with random weights, so a folder holding only a
``config.json`` is enough (``runners._llm_host.write_llama_model_dir`` writes one).

**A batch is queued whole before the first step.**  vLLM's V1 engine core runs in a
process of its own by default and starts a step as soon as one request is queued, so
requests handed to it one after the other would mostly see request 0 prefilled alone.
The runner runs the engine core in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): every
``add_request`` of a batch lands in the scheduler's queue before ``step()`` is called.
The token budget of a step (``max_num_batched_tokens``, chunked prefill is always on) is
at least batch x the largest context bucket, so a batch's prompts are never split over
steps.  On the gpu and tpu platforms a batch whose first tokens still come out of more
than one step fails with ``RunnerError`` instead of being measured.

**Prefill mode**: ``"batched"`` on gpu and tpu (one step encodes every prompt of the batch,
then the batch decodes); ``"sequential"`` on neuron (the vLLM Neuron plugin's scheduler
encodes one prompt per step, ahead of any decode, as NxD Inference compiles its context
encoding for one request).  The target's ``prefill`` must say what the platform does, so
the probes are solved and composed the way vLLM runs them (every request of a batch gets
its first token at the end of the batch's prefill); a target that says otherwise is
refused when the runner is constructed (so when its space file is loaded).

What "bucket" means per platform (``[target.options] platform``, default from
``target.hardware``):

- ``neuron`` (NxD Inference under the vLLM Neuron plugin): the bucket sets go to NxD
  Inference as ``context_encoding_buckets`` / ``token_generation_buckets`` with
  ``enable_bucketing``, through ``additional_config={"override_neuron_config": ...}``;
  ``num_gpu_blocks_override = batch`` (one contiguous KV row per sequence), and
  ``NEURON_COMPILED_ARTIFACTS`` points at a folder per configuration, so a compiled unit
  is reused and never confused with another configuration's.  NxD Inference selects
  buckets with length < bucket: the target's ``bucket_policy`` must be ``exclusive``.  The
  plugin loads weights from the model folder itself (``load_format`` is not used), so
  with ``load_format = "dummy"`` the runner writes a random checkpoint of
  ``[target.model]`` (``runners._model_dir``) once under ``<artifacts_dir>/checkpoints/``.
- ``tpu``: vLLM pads the token count of every step to a fixed ladder: powers of two from
  16, or, with ``VLLM_TPU_BUCKET_PADDING_GAP = G``, powers of two up to G and then
  multiples of G, up to ``max_num_batched_tokens``; the first padding >= the count is
  taken, so ``bucket_policy`` must be ``inclusive``.  The candidate's buckets must lie on
  such a ladder; the runner sets G from them.  The padding applies to the tokens of a
  whole step, so a prompt's bucket is its compiled shape only when it is prefilled alone:
  units of batch > 1 are refused on TPU.
- ``gpu``: no compiled sequence buckets (attention kernels take any length), but CUDA
  graphs are captured for fixed batch sizes, which act as batch buckets: with
  ``cuda_graphs = "batch"`` (default) exactly one graph of the unit's batch size is
  captured, so every decode step runs the batch as one shape, like a static batch on an
  NPU; ``"default"`` keeps vLLM's own capture sizes, ``"off"`` runs eagerly.

Timing: a request's TTFT is the host clock when the engine step carrying its first token
returns, its E2E when the step carrying its last token returns, both from the moment the
first request of its batch was queued.

**Continuous batching** (docs/serving.md) where vLLM's scheduler is that machine: on
``neuron`` (the plugin prefills one waiting prompt per step into a free slot, ahead of the
running decodes; the target's scheduler must keep its defaults) and on ``tpu`` (batch 1:
one slot).  Request i is handed to the engine once the wall clock passes its arrival,
every arrived request before each step (``_engine_timing.drive_arrivals``); TTFT and E2E
count from each arrival.  Refused on ``gpu``, where V1 mixes an arriving prompt into the
running decodes' step, which the bucket profiles do not describe.

Versions: the runner was written against the V1 engine API of the ranges in
``TESTED_VLLM`` (per platform; the Neuron plugin pins vLLM 0.11).  Another vLLM is refused
on first use (a changed scheduler silently changes what a profile means), unless
``[target.options] allow_untested_vllm = true``; the version always goes into the
fingerprint.  None of this has run on a GPU, TPU or Inferentia yet.

Each engine lives in a child process of its own (``one_unit_per_process``), so closing it
frees the device.  Only ``_VllmEngine`` touches vLLM; everything else is pure and
unit-tested.
"""
from __future__ import annotations

import gc
import importlib.util
import os
import re
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from lens.errors import RunnerError, RunnerUnavailable, UserError
from lens.types import Candidate, Target, Unit, stable_hash

from ._engine_timing import RequestClock, StepObservation, TimedBatch, drive_arrivals, drive_steps
from ._llm_common import EngineRunner
from ._llm_host import base_versions, dist_version, dist_versions, llama_hf_config, neuron_driver_version, nvidia_info
from ._vllm_spec import (
    CUDA_GRAPH_MODES,
    PLATFORM_POLICY,
    PLATFORM_PREFILL,
    PREFILL_WHY,
    PLATFORMS,
    POLICY_WHY,
    SERVING_SCHEDULER,
    RandomCheckpoint,
    VllmEngineSpec,
    build_engine_spec,
    check_model_option,
    neuron_overrides,
    resolve_platform,
    serve_argv,
    serving_refusal,
    serve_script,
    token_budget,
    tpu_ladder,
    tpu_padding_gap,
    writes_checkpoint,
)

#: vLLM releases [lowest, first excluded) per platform the runner is written against: the
#: V1 engine API (LLMEngine.add_request / step, VLLM_ENABLE_V1_MULTIPROCESSING, always-on
#: chunked prefill) of 0.11 through 0.33; the Neuron plugin (vllm-neuron 0.2) pins 0.11
TESTED_VLLM: dict[str, tuple[str, str]] = {"gpu": ("0.11", "0.34"), "tpu": ("0.11", "0.34"), "neuron": ("0.11", "0.12")}

#: set in the engine's process: the engine core steps only when asked (see the docstring)
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}

_INSTALL_HINT = (
    'pip install "lensopt[vllm]" (NVIDIA GPUs); on a TPU VM pip install "lensopt[vllm-tpu]"; on an '
    "Inferentia/Trainium host the vLLM Neuron plugin (see docs/neuron.md)"
)

# -- versions ---------------------------------------------------------------------------------


_PLATFORM_PACKAGES = {
    "gpu": ("torch", "triton", "flashinfer-python", "xformers"),
    "tpu": ("vllm-tpu", "tpu-inference", "torch_xla", "torch-xla", "jax", "jaxlib", "libtpu", "libtpu-nightly"),
    "neuron": ("vllm-neuron", "neuronx-distributed-inference", "neuronx-distributed", "neuronx-cc", "torch-neuronx",
               "torch", "libneuronxla"),
}


def sdk_versions(platform: str) -> dict[str, str]:
    """Versions of vLLM and its platform stack, read lazily; ``RunnerUnavailable`` without vLLM."""
    if importlib.util.find_spec("vllm") is None:
        raise RunnerUnavailable(f"runner 'vllm' needs the vllm package, which is not installed: {_INSTALL_HINT}")
    v = base_versions()
    v["vllm"] = dist_version("vllm") or dist_version("vllm-tpu") or _module_version("vllm")
    v.update(dist_versions(_PLATFORM_PACKAGES[platform]))
    if platform == "gpu":
        import torch  # lazily, and without touching the GPU: no CUDA context is created

        v["cuda"] = str(torch.version.cuda or "none")
        v.update(nvidia_info())
    elif platform == "neuron":
        drv = neuron_driver_version()
        if drv:
            v["neuron_driver"] = drv
    return v


def _release(version: str) -> tuple[int, ...]:
    m = re.match(r"\d+(\.\d+)*", version.strip().lstrip("v"))
    return tuple(int(x) for x in m.group(0).split(".")) if m else ()


def check_tested(platform: str, versions: Mapping[str, str], *, allow_untested: bool) -> None:
    """``RunnerUnavailable`` when the installed vLLM (or its Neuron plugin) is outside what the runner
    was written against, unless ``allow_untested``."""
    if platform == "neuron" and "vllm-neuron" not in versions:
        raise RunnerUnavailable(
            "runner 'vllm' on the neuron platform needs the vLLM Neuron plugin (vllm-neuron 0.2), not installed "
            "here: see docs/neuron.md, \"vLLM on Neuron\"")
    lo, hi = TESTED_VLLM[platform]
    got = versions.get("vllm", "unknown")
    rel = _release(got)
    if rel and _release(lo) <= rel < _release(hi) or allow_untested:
        return
    raise RunnerUnavailable(
        f"runner 'vllm' on the {platform} platform is written against vLLM >={lo},<{hi}, and vLLM {got} is installed: "
        f"install one of those releases (docs/vllm.md), or set [target.options] allow_untested_vllm = true to "
        f"measure with this one (its profiles are kept apart by the version in the fingerprint)"
    )


def _module_version(name: str) -> str:
    import importlib

    return str(getattr(importlib.import_module(name), "__version__", "unknown"))


# -- the SDK boundary ---------------------------------------------------------------------------


def observe_request_output(out: Any) -> StepObservation:
    """A ``vllm.RequestOutput`` as a step observation (cumulative token count)."""
    comps = getattr(out, "outputs", None) or []
    n = len(comps[0].token_ids) if comps else 0
    return StepObservation(request_id=str(out.request_id), n_tokens=int(n), finished=bool(out.finished))


class _VllmEngine:
    """One ``vllm.LLM`` with its engine core in this process; requests go straight to its
    engine so a batch is queued whole before the first step, and each step can be timed."""

    def __init__(self, spec: VllmEngineSpec):
        self.spec = spec
        env = {**ENGINE_ENV, **spec.env}
        self._saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)  # read by vLLM and inherited by its worker processes
        try:
            if spec.checkpoint is not None:
                from ._model_dir import write_random_checkpoint

                c = spec.checkpoint
                write_random_checkpoint(c.folder, c.shape, dtype=c.dtype, seed=c.seed, max_position=c.max_position)
            import vllm
            from vllm import SamplingParams

            self._sampling = SamplingParams
            self.llm = vllm.LLM(**dict(spec.llm_kwargs))
        except BaseException:
            self._restore_env()
            raise
        self._engine = self.llm.llm_engine
        self._next = 0
        self.artifacts = spec.env.get("NEURON_COMPILED_ARTIFACTS", "")

    def _requests(self, prompts: Sequence[Sequence[int]], output_lens: Sequence[int]):
        """Fresh request ids, and per request the (prompt, sampling) pair ``add_request`` takes:
        greedy, exactly l_out tokens, nothing detokenized."""
        ids = [f"lensopt-{self._next + i}" for i in range(len(prompts))]
        self._next += len(prompts)
        args = [({"prompt_token_ids": [int(x) for x in p]},
                 self._sampling(temperature=0.0, max_tokens=int(n), min_tokens=int(n), ignore_eos=True,
                                detokenize=False)) for p, n in zip(prompts, output_lens)]
        return ids, args

    @staticmethod
    def _step_budget(prompts: Sequence[Sequence[int]], output_lens: Sequence[int]) -> int:
        return 4 * (sum(int(n) for n in output_lens) + sum(len(p) for p in prompts)) + 1000

    def generate_timed(self, prompts: Sequence[Sequence[int]], output_lens: Sequence[int]) -> TimedBatch:
        ids, args = self._requests(prompts, output_lens)
        t0 = time.perf_counter()
        for rid, (prompt, sp) in zip(ids, args):
            self._engine.add_request(rid, prompt, sp)
        clock = RequestClock(ids, output_lens, t0=t0)
        drive_steps(self._engine.step, self._engine.has_unfinished_requests, clock, observe_request_output,
                    max_steps=self._step_budget(prompts, output_lens))
        steps = clock.first_token_steps()
        if self.spec.prefill == "batched" and steps > 1:
            raise RunnerError(
                f"vllm runner: the {len(ids)} prompts of a batch were encoded over {steps} engine steps, not one: "
                f"vLLM started stepping before the batch was queued, or its token budget split the prompts "
                f"(max_num_batched_tokens {self.spec.llm_kwargs.get('max_num_batched_tokens')}); the batch is not "
                f"measured"
            )
        return clock.result()

    def serve_timed(self, prompts: Sequence[Sequence[int]], output_lens: Sequence[int],
                    arrival_s: Sequence[float]) -> TimedBatch:
        """Continuous batching as vLLM's scheduler runs it: request i is added once the wall clock
        passes ``arrival_s[i]`` (seconds from now), every arrived request before each step."""
        ids, args = self._requests(prompts, output_lens)
        clock = RequestClock(ids, output_lens, t0=time.perf_counter())
        drive_arrivals(lambda i: self._engine.add_request(ids[i], *args[i]), self._engine.step,
                       self._engine.has_unfinished_requests, clock, observe_request_output, arrival_s,
                       max_steps=self._step_budget(prompts, output_lens))
        return clock.served(arrival_s)

    def close(self) -> None:
        llm, self.llm, self._engine = getattr(self, "llm", None), None, None
        if llm is not None:
            core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()  # stops the executor's worker processes (tp > 1)
            del llm
            gc.collect()  # the process ends next (one_unit_per_process), which frees the device
        self._restore_env()

    def _restore_env(self) -> None:
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# -- the runner -------------------------------------------------------------------------------


class VllmRunner(EngineRunner):
    """Offline vLLM on a GPU, TPU or Neuron platform; see the module docstring."""

    name = "vllm"
    engine_class = _VllmEngine
    one_unit_per_process = True
    options_schema: dict[str, tuple[type, Any]] = {
        "model": (str, ""),  # Hugging Face id or local folder (not on neuron with load_format "dummy")
        "load_format": (str, "dummy"),  # "dummy": random weights, no download
        "platform": (str, ""),  # "gpu" | "tpu" | "neuron"; default from target.hardware
        "warmup": (int, 1),  # untimed runs before the first timed one of each bucket / workload
        "gpu_memory_utilization": (float, 0.9),  # gpu and tpu
        "cuda_graphs": (str, "batch"),  # gpu: "batch" | "default" | "off"
        "max_num_batched_tokens": (int, 0),  # 0: batch x the largest context bucket (the least allowed)
        "artifacts_dir": (str, ""),  # neuron: compiled units and random checkpoints (default ~/.cache/lensopt/vllm-neuron)
        "allow_untested_vllm": (bool, False),  # measure with a vLLM outside TESTED_VLLM
    }

    def __init__(self, target: Target):
        super().__init__(target)
        self.platform = resolve_platform(target.hardware, self.opts["platform"])
        want = PLATFORM_POLICY.get(self.platform)
        if want and target.bucket_policy != want:
            raise UserError(
                f"vllm runner: target.bucket_policy = {target.bucket_policy!r}, but vLLM on the {self.platform} platform "
                f"selects buckets by the {want} policy ({POLICY_WHY[self.platform]}): set bucket_policy = \"{want}\""
            )
        check_model_option(target, self.platform, self.opts)
        want = PLATFORM_PREFILL[self.platform]
        if target.prefill != want:
            raise UserError(
                f"vllm runner: [target] prefill = \"{target.prefill}\", but vLLM on the {self.platform} platform encodes "
                f"a batch's prompts {PREFILL_WHY[self.platform]}: set prefill = \"{want}\" under [target]"
            )
        if target.serving == "continuous" and (why := serving_refusal(self.platform, target)):
            raise UserError(why)
        self._versions: dict[str, str] | None = None

    @property
    def modes(self) -> tuple[str, ...]:  # type: ignore[override]
        """Static batches everywhere; continuous where vLLM's scheduler is the served machine (SERVING_SCHEDULER)."""
        return ("static", "continuous") if self.platform in SERVING_SCHEDULER else ("static",)

    def check_mode(self, mode: str, requests=None) -> None:
        why = serving_refusal(self.platform, self.target) if mode == "continuous" else None
        if why:
            raise UserError(why)
        super().check_mode(mode, requests)

    # -- identity --------------------------------------------------------------------------
    def versions(self) -> dict[str, str]:
        if self._versions is None:
            self._versions = sdk_versions(self.platform)
        return dict(self._versions)

    def require_sdk(self) -> None:
        check_tested(self.platform, self.versions(), allow_untested=self.opts["allow_untested_vllm"])

    def fingerprint_fields(self) -> dict[str, Any]:
        fields = super().fingerprint_fields()
        fields["platform"] = self.platform
        # every option that shapes the engine goes in; where artifacts are kept does not, nor
        # allowing an untested vLLM (the version itself is in the fingerprint)
        fields["vllm_options"] = stable_hash({k: v for k, v in self.opts.items()
                                              if k not in ("artifacts_dir", "allow_untested_vllm")})
        return fields

    def check_unit(self, unit: Unit) -> None:
        super().check_unit(unit)
        if self.platform == "tpu" and unit.batch > 1:
            raise UserError(
                f"vllm runner (tpu): batch = {unit.batch}: vLLM on TPU pads the tokens of a whole step, so a batch's "
                f"prompts run in a shape set by their sum, not each prompt's bucket; only batch 1 is measured as "
                f"LENS composes it (docs/vllm.md)"
            )

    # -- engines ---------------------------------------------------------------------------
    def _artifacts_base(self) -> Path:
        return Path(os.path.expanduser(self.opts["artifacts_dir"] or os.path.join("~", ".cache", "lensopt", "vllm-neuron")))

    def checkpoint_dir(self) -> Path | None:
        """Where the random checkpoint goes (neuron with load_format "dummy"), else None."""
        if not writes_checkpoint(self.platform, self.opts):
            return None
        t = self.target
        digest = stable_hash({"config": llama_hf_config(t.model, dtype=t.dtype), "seed": t.seed}, n=12)
        return self._artifacts_base() / "checkpoints" / f"llama_{digest}"

    def engine_spec(self, tp: int, batch: int, ctx: Sequence[int], tkg: Sequence[int]) -> VllmEngineSpec:
        root = self._artifacts_base() / self.fingerprint() if self.platform == "neuron" else None
        return build_engine_spec(self.target, self.opts, tp=tp, batch=batch, ctx=ctx, tkg=tkg, artifacts_root=root,
                                 checkpoint=self.checkpoint_dir())

    def deploy_snippets(self, candidate: Candidate) -> dict[str, str]:
        files = super().deploy_snippets(candidate)
        spec = build_engine_spec(self.target, self.opts, tp=candidate.tp, batch=candidate.batch,
                                 ctx=candidate.ctx_buckets, tkg=candidate.tkg_buckets,
                                 checkpoint=self.checkpoint_dir())
        files["vllm_serve.sh"] = serve_script(spec, target=self.target, candidate=candidate,
                                              load_format=self.opts["load_format"])
        return files


__all__ = [
    "CUDA_GRAPH_MODES",
    "PLATFORMS",
    "RandomCheckpoint",
    "TESTED_VLLM",
    "VllmEngineSpec",
    "VllmRunner",
    "build_engine_spec",
    "check_tested",
    "neuron_overrides",
    "observe_request_output",
    "resolve_platform",
    "sdk_versions",
    "serve_argv",
    "serve_script",
    "token_budget",
    "tpu_ladder",
    "tpu_padding_gap",
]
