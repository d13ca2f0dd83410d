"""The pure engine configuration of the ``vllm`` runner: platform, token padding, engine
arguments and the ``vllm serve`` deployment script (no vLLM import; see ``runners.vllm_runner``)."""
from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from lens.errors import UserError
from lens.types import Candidate, Scheduler, Target, stable_hash

PLATFORMS = ("gpu", "tpu", "neuron")
CUDA_GRAPH_MODES = ("batch", "default", "off")

#: the smallest token padding vLLM uses on TPU, and the smallest request-count padding
TPU_MIN_TOKENS = 16
TPU_MIN_SEQS = 8

#: the bucket policy each platform's padding follows (gpu: none, buckets only shape LENS)
PLATFORM_POLICY = {"neuron": "exclusive", "tpu": "inclusive"}
POLICY_WHY = {
    "neuron": "NxD Inference runs a length l in the smallest bucket b with l < b",
    "tpu": "a step's token count is padded to the smallest ladder point >= it",
}

#: what each platform's scheduler does with a batch's prompts (``runners.vllm_runner``'s docstring)
PLATFORM_PREFILL = {"gpu": "batched", "tpu": "batched", "neuron": "sequential"}
PREFILL_WHY = {
    "gpu": "in one scheduler step (the whole batch's prompts in one forward pass)",
    "tpu": "in one scheduler step (the whole batch's prompts in one forward pass)",
    "neuron": "one per scheduler step (the Neuron plugin's scheduler; NxD Inference compiles context encoding "
              "for one request)",
}

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


@dataclass(frozen=True)
class RandomCheckpoint:
    """A random-weights checkpoint the engine writes before it starts (see ``runners._model_dir``)."""

    folder: str
    shape: Any
    dtype: str
    seed: int
    max_position: int


@dataclass(frozen=True, eq=False)
class VllmEngineSpec:
    """Everything that starts one vLLM engine: ``vllm.LLM(**llm_kwargs)`` under ``env``."""

    platform: str
    llm_kwargs: Mapping[str, Any]
    #: how the platform's scheduler encodes a batch's prompts (``PLATFORM_PREFILL``)
    prefill: str
    env: Mapping[str, str] = field(default_factory=dict)
    key: str = ""
    notes: tuple[str, ...] = ()
    checkpoint: RandomCheckpoint | None = None


#: the platforms whose vLLM scheduler serves arrivals as the machine of docs/serving.md does,
#: with the target scheduler settings that machine needs there (None: any, the unit has one slot)
SERVING_SCHEDULER: dict[str, Scheduler | None] = {
    # the vllm-neuron plugin's scheduler: one whole prompt per step ahead of the running decodes,
    # the waiting queue re-read at every step
    "neuron": Scheduler(max_prefills=0, prefill_priority="prefill"),
    # batch 1 only (check_unit): a prompt waits for the one slot, so no step mixes it with a decode
    "tpu": None,
}
SERVING_WHY = {
    "gpu": "vLLM V1 on a GPU schedules an arriving prompt into the same step as the running decodes (chunked "
           "prefill is always on there), a mixed step that a bucket profile of separate prefill and decode graphs "
           "does not describe (docs/serving.md)",
}


def serving_refusal(platform: str, target: Target) -> str | None:
    """Why vLLM on ``platform`` cannot serve ``target``'s continuous machine (None when it can)."""
    if platform not in SERVING_SCHEDULER:
        return (f"vllm runner ({platform}): continuous mode is not measured here: {SERVING_WHY[platform]}; "
                f"set [target] serving = \"static\" (`lensopt predict --mode continuous` still predicts it)")
    want = SERVING_SCHEDULER[platform]
    if want is None:
        return None
    for key in ("max_prefills", "prefill_priority"):
        got, need = getattr(target.scheduler, key), getattr(want, key)
        if got != need:
            return (f"vllm runner ({platform}): [target.scheduler] {key} = {json.dumps(got)}, but the vLLM Neuron "
                    f"plugin's scheduler prefills every waiting prompt, one per step, before the running decodes, "
                    f"re-reading its queue at every step: set {key} = {json.dumps(need)} (or leave it out)")
    return None


_VLLM_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "fp8": "bfloat16"}


def writes_checkpoint(platform: str, opts: Mapping[str, Any]) -> bool:
    """True where random weights need a checkpoint on disk: the Neuron plugin ignores ``dummy``."""
    return platform == "neuron" and opts.get("load_format", "dummy") == "dummy"


def check_model_option(target: Target, platform: str, opts: Mapping[str, Any]) -> None:
    """``model`` is required, except on neuron with random weights, where it must be left out."""
    model = opts.get("model")
    if writes_checkpoint(platform, opts):
        if model:
            raise UserError(
                f"vllm runner: target {target.name!r}: on the neuron platform load_format = \"dummy\" writes a random "
                f"checkpoint of [target.model] (the Neuron plugin loads weights from the folder itself): leave "
                f"[target.options] model out, or set load_format = \"auto\" to load {model!r}"
            )
    elif not model:
        raise UserError(
            f"vllm runner: target {target.name!r} has no [target.options] model: give a Hugging Face model id or a "
            f"local folder (a folder with only config.json is enough with load_format = \"dummy\")"
        )


def token_budget(opts: Mapping[str, Any], *, batch: int, ctx: Sequence[int]) -> int:
    """``max_num_batched_tokens``: at least batch x the largest context bucket, so a batch's
    prompts are encoded in one step (chunked prefill would split them otherwise)."""
    need = int(batch) * int(max(ctx))
    given = int(opts.get("max_num_batched_tokens", 0) or 0)
    if given and given < need:
        raise UserError(
            f"vllm runner: [target.options] max_num_batched_tokens = {given} is less than batch {batch} x the largest "
            f"context bucket {max(ctx)} = {need}: a batch's prompts would be split over steps; raise it or leave it out"
        )
    return max(given, need)


def build_engine_spec(
    target: Target,
    opts: Mapping[str, Any],
    *,
    tp: int,
    batch: int,
    ctx: Sequence[int],
    tkg: Sequence[int],
    artifacts_root: str | os.PathLike | None = None,
    checkpoint: str | os.PathLike | None = None,
) -> VllmEngineSpec:
    """The engine arguments and environment of one (tp, batch, bucket sets) configuration.

    ``checkpoint``: the folder of the random checkpoint on neuron with ``load_format = "dummy"``.
    """
    plat = resolve_platform(target.hardware, opts.get("platform", ""))
    check_model_option(target, plat, opts)
    ctx, tkg = tuple(int(x) for x in ctx), tuple(int(x) for x in tkg)
    longest = max(max(ctx), max(tkg))
    if target.dtype not in _VLLM_DTYPES:
        raise UserError(f"vllm runner: dtype {target.dtype!r} is unknown: use one of {', '.join(_VLLM_DTYPES)}")
    rand = None
    if writes_checkpoint(plat, opts):
        folder = str(checkpoint) if checkpoint is not None else "<random checkpoint of [target.model]>"
        rand = RandomCheckpoint(folder=folder, shape=target.model, dtype=target.dtype, seed=int(target.seed),
                                max_position=longest + 1)
        kw: dict[str, Any] = {"model": folder}
    else:
        kw = {"model": opts["model"], "load_format": opts.get("load_format", "dummy")}
    kw.update({
        "skip_tokenizer_init": True,
        "tensor_parallel_size": int(tp),
        "max_num_seqs": int(batch),
        "max_model_len": longest + 1,
        "max_num_batched_tokens": token_budget(opts, batch=batch, ctx=ctx),
        "dtype": _VLLM_DTYPES[target.dtype],
        "seed": int(target.seed),
        "enable_prefix_caching": False,
        "disable_log_stats": True,
    })
    env: dict[str, str] = {}
    notes = [
        f"--max-model-len is the largest bucket + 1 ({longest} + 1): vLLM counts the last generated token too",
        f"--max-num-batched-tokens {kw['max_num_batched_tokens']}: a batch's prompts are encoded in one step",
    ]
    if target.dtype == "fp8":
        if plat != "gpu":
            raise UserError(f"vllm runner: dtype fp8 is supported on the gpu platform only, not {plat}")
        kw["quantization"] = "fp8"  # FP8 weights and activations quantized on load

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
        lad = tpu_ladder(gap, kw["max_num_batched_tokens"])
        notes.append(
            f"TPU token padding ladder {list(lad)} (VLLM_TPU_BUCKET_PADDING_GAP={gap}); request counts pad to "
            f"powers of two from {TPU_MIN_SEQS} up to --max-num-seqs"
        )
    else:  # neuron
        kw["additional_config"] = {"override_neuron_config": neuron_overrides(ctx, tkg)}
        # NxD Inference keeps one contiguous KV row per sequence
        kw["num_gpu_blocks_override"] = int(batch)
        notes.append("NxD Inference compiles one graph per context-encoding and per token-generation bucket; "
                     "the Neuron plugin encodes one prompt per step")
    key = stable_hash({"platform": plat, "kw": kw, "env": env}, n=20)
    if plat == "neuron" and artifacts_root is not None:
        env["NEURON_COMPILED_ARTIFACTS"] = str(Path(artifacts_root) / f"tp{tp}_b{batch}_{key[:12]}")
    return VllmEngineSpec(platform=plat, llm_kwargs=kw, env=env, key=key, notes=tuple(notes),
                          prefill=PLATFORM_PREFILL[plat], checkpoint=rand)


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
