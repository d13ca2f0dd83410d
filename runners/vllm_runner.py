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
``config.json`` is enough (``runners._llm_host.write_llama_model_dir`` writes one for a
Llama-shaped ``[target.model]``).

What "bucket" means per platform (``[target.options] platform``, default from
``target.hardware``):

- ``neuron`` (NxD Inference under vLLM): the bucket sets go to NxD Inference as
  ``context_encoding_buckets`` / ``token_generation_buckets`` with ``enable_bucketing``,
  through ``additional_config={"override_neuron_config": ...}`` (the vLLM Neuron plugin,
  ``neuron_integration = "plugin"``, the default) or the ``override_neuron_config``
  engine argument of the older in-tree Neuron support (``"legacy"``);
  ``num_gpu_blocks_override = batch`` (one contiguous KV row per sequence), and
  ``NEURON_COMPILED_ARTIFACTS`` points at a folder per configuration, so a compiled
  unit is reused and never confused with another configuration's.
- ``tpu``: vLLM pads the token count of every step to a fixed ladder: powers of two from
  16, or, with ``VLLM_TPU_BUCKET_PADDING_GAP = G``, powers of two up to G and then
  multiples of G, up to ``max_num_batched_tokens``; request counts pad to powers of two
  from 8 up to ``max_num_seqs``.  The candidate's buckets must lie on such a ladder; the
  runner sets G from them (0 when they are all powers of two) and
  ``max_num_batched_tokens`` to the largest bucket.  Ladder points below the smallest
  bucket are compiled too: vLLM always starts at 16.
- ``gpu``: no compiled sequence buckets (attention kernels take any length), but CUDA
  graphs are captured for fixed batch sizes, which act as batch buckets: with
  ``cuda_graphs = "batch"`` (default) exactly one graph of the unit's batch size is
  captured, so every decode step runs the batch as one shape, like a static batch on an
  NPU; ``"default"`` keeps vLLM's own capture sizes, ``"off"`` runs eagerly.

Timing: requests are handed to the engine (``LLMEngine.add_request``) together and the
engine is stepped until they finish.  A request's TTFT is taken from the engine's own
``RequestOutput.metrics.first_token_time`` when the engine keeps it (the V0 engine),
else (the V1 engine, vLLM's default since 0.8) from the host clock when the step carrying
its first token returns; ``VllmRunner.last_ttft_sources`` says which.  vLLM prefills the
prompts of a batch together, so every request of a batch sees its first token at about
the same time.

Only ``_VllmEngine`` touches vLLM; everything else is pure and unit-tested.
"""
from __future__ import annotations

import gc
import importlib.util
import json
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from lens.errors import RunnerUnavailable, UserError
from lens.types import Candidate, Target, stable_hash

from ._llm_common import EngineRunner, RequestClock, StepObservation, TimedBatch, drive_steps
from ._llm_host import base_versions, dist_version, dist_versions, neuron_driver_version, nvidia_info

PLATFORMS = ("gpu", "tpu", "neuron")
CUDA_GRAPH_MODES = ("batch", "default", "off")
NEURON_INTEGRATIONS = ("plugin", "legacy")

#: the smallest token padding vLLM uses on TPU, and the smallest request-count padding
TPU_MIN_TOKENS = 16
TPU_MIN_SEQS = 8

_INSTALL_HINT = (
    'pip install "lensopt[vllm]" (NVIDIA GPUs); on a TPU VM install vLLM\'s TPU build, on an '
    "Inferentia/Trainium host the vLLM Neuron plugin (see docs/neuron.md)"
)

_GPU_NAMES = ("gpu", "cuda", "nvidia", "h100", "h200", "h20", "gh200", "a100", "a10", "a30", "a40", "l4", "l40",
              "b100", "b200", "gb200", "v100", "t4", "rtx")


def resolve_platform(hardware: str, option: str = "") -> str:
    """The vLLM platform: ``[target.options] platform`` when given, else read from ``hardware``."""
    if option:
        if option not in PLATFORMS:
            raise UserError(f"vllm runner: platform = {option!r} is unknown: use one of {', '.join(PLATFORMS)}")
        return option
    h = hardware.lower()
    if h.startswith("tpu"):
        return "tpu"
    if h.startswith(("inf", "trn")) or "neuron" in h:
        return "neuron"
    if h.startswith(_GPU_NAMES):
        return "gpu"
    raise UserError(
        f"vllm runner: cannot tell the vLLM platform from hardware = {hardware!r}; "
        f"set [target.options] platform to one of {', '.join(PLATFORMS)}"
    )


# -- TPU token padding ------------------------------------------------------------------------


def tpu_ladder(gap: int, max_tokens: int, *, min_tokens: int = TPU_MIN_TOKENS) -> tuple[int, ...]:
    """The token counts vLLM on TPU compiles for: its padding ladder up to ``max_tokens``.

    ``gap == 0``: powers of two from ``min_tokens`` until one reaches ``max_tokens``.
    Otherwise powers of two while they are <= gap, then steps of ``gap`` from the last of
    them until ``max_tokens`` is reached (vLLM's ``VLLM_TPU_BUCKET_PADDING_GAP``).
    """
    if gap < 0 or max_tokens < 1:
        raise UserError(f"tpu ladder: gap {gap} must be >= 0 and max_tokens {max_tokens} >= 1")
    out = []
    num = min_tokens
    if gap == 0:
        while True:
            out.append(num)
            if num >= max_tokens:
                break
            num *= 2
        return tuple(out)
    while num <= gap:
        out.append(num)
        num *= 2
    num //= 2
    while num < max_tokens:
        num += gap
        out.append(num)
    return tuple(out)


def tpu_padding_gap(buckets: Sequence[int]) -> int:
    """``VLLM_TPU_BUCKET_PADDING_GAP`` whose ladder (up to the largest bucket) holds every bucket.

    0 (powers of two) when the buckets are all powers of two; else the largest power-of-two
    gap that works (the fewest extra compiled shapes).  ``UserError`` when none does.
    """
    b = sorted(set(int(x) for x in buckets))
    top = b[-1]
    cands = [0] + [1 << k for k in range(top.bit_length(), 3, -1) if (1 << k) >= TPU_MIN_TOKENS]
    for gap in cands:
        lad = tpu_ladder(gap, top)
        if lad[-1] == top and set(b) <= set(lad):
            return gap
    raise UserError(
        f"vllm runner (tpu): the buckets {b} are not points of vLLM's TPU padding ladder, which pads token "
        f"counts to powers of two from {TPU_MIN_TOKENS}, or to powers of two up to a gap G and multiples of G "
        f"above it (VLLM_TPU_BUCKET_PADDING_GAP); use such buckets, e.g. powers of two"
    )


# -- the engine configuration (pure) ------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class VllmEngineSpec:
    """Everything that starts one vLLM engine: ``vllm.LLM(**llm_kwargs)`` under ``env``."""

    platform: str
    llm_kwargs: Mapping[str, Any]
    env: Mapping[str, str] = field(default_factory=dict)
    key: str = ""
    notes: tuple[str, ...] = ()


_VLLM_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "fp8": "bfloat16"}


def build_engine_spec(
    target: Target,
    opts: Mapping[str, Any],
    *,
    tp: int,
    batch: int,
    ctx: Sequence[int],
    tkg: Sequence[int],
    artifacts_root: str | os.PathLike | None = None,
) -> VllmEngineSpec:
    """The engine arguments and environment of one (tp, batch, bucket sets) configuration."""
    plat = resolve_platform(target.hardware, opts.get("platform", ""))
    model = opts.get("model")
    if not model:
        raise UserError(
            f"vllm runner: target {target.name!r} has no [target.options] model: give a Hugging Face model id or a "
            f"local folder (a folder with only config.json is enough with load_format = \"dummy\")"
        )
    ctx, tkg = tuple(int(x) for x in ctx), tuple(int(x) for x in tkg)
    longest = max(max(ctx), max(tkg))
    if target.dtype not in _VLLM_DTYPES:
        raise UserError(f"vllm runner: dtype {target.dtype!r} is unknown: use one of {', '.join(_VLLM_DTYPES)}")
    kw: dict[str, Any] = {
        "model": model,
        "skip_tokenizer_init": True,
        "load_format": opts.get("load_format", "dummy"),
        "tensor_parallel_size": int(tp),
        "max_num_seqs": int(batch),
        "max_model_len": longest + 1,
        "dtype": _VLLM_DTYPES[target.dtype],
        "seed": int(target.seed),
        "enable_prefix_caching": False,
        "disable_log_stats": True,
    }
    env: dict[str, str] = {}
    notes = [
        f"--max-model-len is the largest bucket + 1 ({longest} + 1): vLLM counts the last generated token too",
    ]
    if target.dtype == "fp8":
        if plat != "gpu":
            raise UserError(f"vllm runner: dtype fp8 is supported on the gpu platform only, not {plat}")
        kw["quantization"] = "fp8"  # FP8 weights and activations quantized on load
    if opts.get("max_num_batched_tokens", 0):
        kw["max_num_batched_tokens"] = int(opts["max_num_batched_tokens"])

    if plat == "gpu":
        kw["gpu_memory_utilization"] = float(opts.get("gpu_memory_utilization", 0.9))
        mode = opts.get("cuda_graphs", "batch")
        if mode not in CUDA_GRAPH_MODES:
            raise UserError(f"vllm runner: cuda_graphs = {mode!r} is unknown: use one of {', '.join(CUDA_GRAPH_MODES)}")
        if mode == "batch":
            # one captured graph of exactly the batch size: a decode step with fewer
            # running requests is padded to it, as a static batch is on an NPU
            kw["compilation_config"] = {"cudagraph_capture_sizes": [int(batch)]}
            notes.append("CUDA graphs are captured for the batch size only: it acts as the decode batch bucket")
        elif mode == "off":
            kw["enforce_eager"] = True
    elif plat == "tpu":
        kw["gpu_memory_utilization"] = float(opts.get("gpu_memory_utilization", 0.9))
        gap = tpu_padding_gap(set(ctx) | set(tkg))
        env["VLLM_TPU_BUCKET_PADDING_GAP"] = str(gap)
        kw.setdefault("max_num_batched_tokens", max(longest, int(batch)))
        lad = tpu_ladder(gap, kw["max_num_batched_tokens"])
        notes.append(
            f"TPU token padding ladder {list(lad)} (VLLM_TPU_BUCKET_PADDING_GAP={gap}); request counts pad to "
            f"powers of two from {TPU_MIN_SEQS} up to --max-num-seqs"
        )
    else:  # neuron
        integ = opts.get("neuron_integration", "plugin")
        if integ not in NEURON_INTEGRATIONS:
            raise UserError(
                f"vllm runner: neuron_integration = {integ!r} is unknown: use one of {', '.join(NEURON_INTEGRATIONS)}"
            )
        nc = neuron_overrides(ctx, tkg)
        if integ == "plugin":
            kw["additional_config"] = {"override_neuron_config": nc}
        else:
            kw["override_neuron_config"] = nc
        # NxD Inference keeps one contiguous KV row per sequence
        kw["num_gpu_blocks_override"] = int(batch)
        notes.append("NxD Inference compiles one graph per context-encoding and per token-generation bucket")
    key = stable_hash({"platform": plat, "kw": kw, "env": env}, n=20)
    if plat == "neuron" and artifacts_root is not None:
        env["NEURON_COMPILED_ARTIFACTS"] = str(Path(artifacts_root) / f"tp{tp}_b{batch}_{key[:12]}")
    return VllmEngineSpec(platform=plat, llm_kwargs=kw, env=env, key=key, notes=tuple(notes))


def neuron_overrides(ctx: Sequence[int], tkg: Sequence[int]) -> dict[str, Any]:
    """The NxD Inference settings vLLM passes on: the bucket sets and the lengths they imply.

    ``seq_len`` is the largest bucket (vLLM's ``max_model_len`` is one more, see the module
    docstring), so NxD Inference compiles for the bucket set itself.
    """
    return {
        "enable_bucketing": True,
        "context_encoding_buckets": [int(x) for x in ctx],
        "token_generation_buckets": [int(x) for x in tkg],
        "max_context_length": int(max(ctx)),
        "seq_len": int(max(max(ctx), max(tkg))),
    }


#: engine argument -> ``vllm serve`` flag (arguments not listed stay out of a deployment)
_SERVE_FLAGS = (
    ("tensor_parallel_size", "--tensor-parallel-size"),
    ("max_num_seqs", "--max-num-seqs"),
    ("max_model_len", "--max-model-len"),
    ("dtype", "--dtype"),
    ("quantization", "--quantization"),
    ("max_num_batched_tokens", "--max-num-batched-tokens"),
    ("gpu_memory_utilization", "--gpu-memory-utilization"),
    ("num_gpu_blocks_override", "--num-gpu-blocks-override"),
    ("compilation_config", "--compilation-config"),
    ("additional_config", "--additional-config"),
    ("override_neuron_config", "--override-neuron-config"),
)


def serve_argv(spec: VllmEngineSpec) -> list[str]:
    """The ``vllm serve`` command line of ``spec`` (argv; JSON values compact)."""
    kw = spec.llm_kwargs
    argv = ["vllm", "serve", str(kw["model"])]
    for arg, flag in _SERVE_FLAGS:
        if arg not in kw:
            continue
        v = kw[arg]
        argv += [flag, json.dumps(v, separators=(",", ":"), sort_keys=True) if isinstance(v, (dict, list)) else str(v)]
    if kw.get("enforce_eager"):
        argv.append("--enforce-eager")
    return argv


def serve_script(spec: VllmEngineSpec, *, target: Target, candidate: Candidate, load_format: str) -> str:
    """A POSIX shell script that serves ``candidate`` the way it was measured."""
    lines = [
        "#!/bin/sh",
        f"# vllm serve for target {target.name!r} ({spec.platform}): tp={candidate.tp}, batch={candidate.batch},",
        f"# context-encoding buckets {list(candidate.ctx_buckets)}, token-generation buckets "
        f"{list(candidate.tkg_buckets)}.",
    ]
    if load_format == "dummy":
        lines.append("# Measured with random weights (load_format dummy): serve the real checkpoint of this "
                     "architecture in place of the model below.")
    lines += [f"# {n}" for n in spec.notes]
    lines.append("# Measured with prefix caching off; enabling it only speeds up repeated prefixes.")
    for k, v in spec.env.items():
        if k == "NEURON_COMPILED_ARTIFACTS":
            continue
        lines.append(f"export {k}={shlex.quote(v)}")
    if spec.platform == "neuron":
        lines.append("# export NEURON_COMPILED_ARTIFACTS=/path/to/keep/the/compiled/model  (reused on restart)")
    lines.append("exec " + shlex.join(serve_argv(spec)))
    return "\n".join(lines) + "\n"


# -- versions ---------------------------------------------------------------------------------


_PLATFORM_PACKAGES = {
    "gpu": ("torch", "triton", "flashinfer-python", "xformers"),
    "tpu": ("tpu-inference", "torch_xla", "torch-xla", "jax", "jaxlib", "libtpu", "libtpu-nightly"),
    "neuron": ("vllm-neuron", "neuronx-vllm-plugin", "neuronx-distributed-inference", "neuronx-distributed",
               "neuronx-cc", "torch-neuronx", "torch", "libneuronxla"),
}


def sdk_versions(platform: str) -> dict[str, str]:
    """Versions of vLLM and its platform stack, read lazily; ``RunnerUnavailable`` without vLLM."""
    if importlib.util.find_spec("vllm") is None:
        raise RunnerUnavailable(f"runner 'vllm' needs the vllm package, which is not installed: {_INSTALL_HINT}")
    v = base_versions()
    v["vllm"] = dist_version("vllm") or _module_version("vllm")
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


def _module_version(name: str) -> str:
    import importlib

    return str(getattr(importlib.import_module(name), "__version__", "unknown"))


# -- the SDK boundary ---------------------------------------------------------------------------


def observe_request_output(out: Any) -> StepObservation:
    """A ``vllm.RequestOutput`` as a step observation (cumulative token count)."""
    comps = getattr(out, "outputs", None) or []
    n = len(comps[0].token_ids) if comps else 0
    metrics = getattr(out, "metrics", None)
    ftt = getattr(metrics, "first_token_time", None) if metrics is not None else None
    return StepObservation(
        request_id=str(out.request_id),
        n_tokens=int(n),
        finished=bool(out.finished),
        first_token_wall=float(ftt) if isinstance(ftt, (int, float)) else None,
    )


class _VllmEngine:
    """One ``vllm.LLM``; requests go straight to its engine so each step can be timed."""

    def __init__(self, spec: VllmEngineSpec):
        self.spec = spec
        self._saved = {k: os.environ.get(k) for k in spec.env}
        os.environ.update(spec.env)  # read by vLLM and inherited by its worker processes
        try:
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

    def generate_timed(self, prompts: Sequence[Sequence[int]], output_lens: Sequence[int]) -> TimedBatch:
        ids = []
        t0_wall, t0 = time.time(), time.perf_counter()
        for p, n in zip(prompts, output_lens):
            rid = f"lensopt-{self._next}"
            self._next += 1
            params = self._sampling(temperature=0.0, max_tokens=int(n), min_tokens=int(n), ignore_eos=True,
                                    detokenize=False)
            self._engine.add_request(rid, {"prompt_token_ids": [int(x) for x in p]}, params)
            ids.append(rid)
        clock = RequestClock(ids, output_lens, t0=t0, t0_wall=t0_wall)
        budget = 4 * (sum(int(n) for n in output_lens) + sum(len(p) for p in prompts)) + 1000
        drive_steps(self._engine.step, self._engine.has_unfinished_requests, clock, observe_request_output,
                    max_steps=budget)
        return clock.result()

    def close(self) -> None:
        llm, self.llm, self._engine = getattr(self, "llm", None), None, None
        if llm is not None:
            core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()  # the V1 engine core runs in its own process
            del llm
            gc.collect()
            import vllm.distributed.parallel_state as ps

            for fn in ("destroy_model_parallel", "destroy_distributed_environment"):
                f = getattr(ps, fn, None)
                if f is not None:
                    f()
            if self.spec.platform == "gpu":
                import torch

                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
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
    options_schema: dict[str, tuple[type, Any]] = {
        "model": (str, None),  # Hugging Face id or local folder (required)
        "load_format": (str, "dummy"),  # "dummy": random weights, no download
        "platform": (str, ""),  # "gpu" | "tpu" | "neuron"; default from target.hardware
        "warmup": (int, 1),  # untimed runs before the first timed one of each bucket / workload
        "gpu_memory_utilization": (float, 0.9),  # gpu and tpu
        "cuda_graphs": (str, "batch"),  # gpu: "batch" | "default" | "off"
        "max_num_batched_tokens": (int, 0),  # 0: vLLM's default (tpu: the largest bucket)
        "neuron_integration": (str, "plugin"),  # neuron: "plugin" | "legacy"
        "artifacts_dir": (str, ""),  # neuron: where compiled units are kept (default ~/.cache/lensopt/vllm-neuron)
    }

    def __init__(self, target: Target):
        super().__init__(target)
        self.platform = resolve_platform(target.hardware, self.opts["platform"])
        if not self.opts["model"]:
            raise UserError(
                f"vllm runner: target {target.name!r} has no [target.options] model: give a Hugging Face model id "
                f"or a local folder (a folder with only config.json is enough with load_format = \"dummy\")"
            )
        self._versions: dict[str, str] | None = None

    # -- identity --------------------------------------------------------------------------
    def versions(self) -> dict[str, str]:
        if self._versions is None:
            self._versions = sdk_versions(self.platform)
        return dict(self._versions)

    def require_sdk(self) -> None:
        self.versions()

    def fingerprint_fields(self) -> dict[str, Any]:
        fields = super().fingerprint_fields()
        fields["platform"] = self.platform
        # every option that shapes the engine goes in; where artifacts are kept does not
        fields["vllm_options"] = stable_hash({k: v for k, v in self.opts.items() if k != "artifacts_dir"})
        return fields

    # -- engines ---------------------------------------------------------------------------
    def engine_spec(self, tp: int, batch: int, ctx: Sequence[int], tkg: Sequence[int]) -> VllmEngineSpec:
        root = None
        if self.platform == "neuron":
            base = self.opts["artifacts_dir"] or os.path.join("~", ".cache", "lensopt", "vllm-neuron")
            root = Path(os.path.expanduser(base)) / self.fingerprint()
        return build_engine_spec(self.target, self.opts, tp=tp, batch=batch, ctx=ctx, tkg=tkg, artifacts_root=root)

    def deploy_snippets(self, candidate: Candidate) -> dict[str, str]:
        files = super().deploy_snippets(candidate)
        spec = build_engine_spec(self.target, self.opts, tp=candidate.tp, batch=candidate.batch,
                                 ctx=candidate.ctx_buckets, tkg=candidate.tkg_buckets)
        files["vllm_serve.sh"] = serve_script(spec, target=self.target, candidate=candidate,
                                              load_format=self.opts["load_format"])
        return files


__all__ = [
    "PLATFORMS",
    "VllmEngineSpec",
    "VllmRunner",
    "build_engine_spec",
    "neuron_overrides",
    "observe_request_output",
    "resolve_platform",
    "sdk_versions",
    "serve_argv",
    "serve_script",
    "tpu_ladder",
    "tpu_padding_gap",
]
