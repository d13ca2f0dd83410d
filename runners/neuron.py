"""``neuron``: NxD Inference (neuronx-distributed-inference on torch-neuronx), Inferentia2 / Trainium.

One compiled unit per (tp, batch, bucket sets): ``NeuronConfig(tp_degree=tp,
batch_size=batch, seq_len=<largest bucket>, max_context_length=<largest context bucket>,
enable_bucketing=True, context_encoding_buckets=..., token_generation_buckets=...)``,
right padding, greedy on-device sampling.  The target's ``prefill`` sets how prompts are
encoded: ``sequential`` one request at a time (``ctx_batch_size=1`` with
``is_continuous_batching`` so each prompt fills its own KV row, in its own context
bucket), ``batched`` the whole batch in one call (``ctx_batch_size = batch``), as the
estimator composes each.

Compiled units live in ``<artifacts_dir>/<fingerprint>/tp<tp>_b<batch>_<config hash>``
(``artifacts_dir`` defaults to ``~/.cache/lensopt/neuron``).  A folder that holds a
finished compilation of exactly this configuration (the marker file
``lensopt-unit.json`` written after ``compile`` succeeds) is loaded without compiling:
``compile_s`` is then 0 and ``NeuronRunner.engine_log`` records the reuse.  Loading the
unit onto the NeuronCores is counted in ``run_s``.

Weights: ``[target.options] model`` is a Hugging Face checkpoint folder.  With
``random_weights = true`` and no ``model``, a checkpoint of ``[target.model]``'s shape
with random weights is written once under ``<artifacts_dir>/checkpoints/``
(``runners._model_dir``, numpy only): no download.

Buckets: NxD Inference runs a length l in the smallest bucket b with l < b (the largest
also takes l == b), the ``exclusive`` policy; a target with another ``bucket_policy`` is
refused when it is loaded.  A static batch is padded to its longest prompt and decoded
to its longest output, so the compiled length (the largest bucket) must hold the
longest prompt plus the longest output of every batch, not only of each request:
``run_workload`` refuses a batch that would overrun it, naming the batch and its requests.

Processes: each compiled unit is loaded in a child process of its own
(``one_unit_per_process``) and closing it ends that process, so the NeuronCores are free
before a unit of another tp loads.  (Until it is shown on hardware that NxD Inference
releases them within one process.)

Timing: generation goes through NxD Inference's ``HuggingFaceGenerationAdapter`` with a
stopping criterion that only records the host time after every generated token (it
never stops anything).  NxD Inference returns the first tokens of a batch together after
all its prompts are encoded, so every request's TTFT is the batch's prefill time
(``ttft_source = "batch-prefill"``); request i's E2E is the time of its l_out-th token.
The batch always decodes to its longest output and rows that are done keep their
context growing, so the token-generation bucket of a step follows the longest context of
*all* rows (the estimator's static mode follows the rows still generating).  No
end-of-sequence id stops a row: ``eos_token_id=[]`` (``None`` would let transformers
fill in the model's own, and rows would stop early).

Only ``_NxdEngine`` touches the Neuron SDK; everything else is pure and unit-tested.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from lens.buckets import validate_buckets
from lens.errors import RunnerUnavailable, UserError
from lens.types import Candidate, ModelShape, Requests, Target, Unit, WorkloadRun, stable_hash

from ._engine_timing import TimedBatch, times_from_steps
from ._llm_common import EngineRunner, check_requests
from ._llm_host import base_versions, dist_versions, llama_hf_config, neuron_driver_version

#: model family -> (module, InferenceConfig class, model class) in neuronx_distributed_inference.models
FAMILIES: dict[str, tuple[str, str, str]] = {
    "llama": ("neuronx_distributed_inference.models.llama.modeling_llama", "LlamaInferenceConfig", "NeuronLlamaForCausalLM"),
    "qwen2": ("neuronx_distributed_inference.models.qwen2.modeling_qwen2", "Qwen2InferenceConfig", "NeuronQwen2ForCausalLM"),
    "qwen3": ("neuronx_distributed_inference.models.qwen3.modeling_qwen3", "Qwen3InferenceConfig", "NeuronQwen3ForCausalLM"),
}

#: the distributions the runner needs, and the ones whose versions also shape a measurement
REQUIRED = ("neuronx-distributed-inference", "torch-neuronx", "neuronx-cc")
RECORDED = REQUIRED + ("neuronx-distributed", "libneuronxla", "torch", "transformers")

MARKER = "lensopt-unit.json"

_DTYPES = ("bfloat16", "float16", "float32")

_INSTALL_HINT = (
    "the Neuron packages come from AWS's Neuron package repository, not PyPI: on an Inferentia/Trainium "
    "host run  pip install --extra-index-url https://pip.repos.neuron.amazonaws.com \"lensopt[neuron]\"  "
    "or activate a Neuron DLAMI's NxD Inference virtual environment (see docs/neuron.md, "
    "\"Installing the neuron extra\")"
)


def neuron_config_kwargs(
    *, tp: int, batch: int, ctx: Sequence[int], tkg: Sequence[int], dtype: str,
    batched_prefill: bool = False, on_device_sampling: bool = True,
) -> dict[str, Any]:
    """The ``NeuronConfig`` arguments of one unit and bucket set (JSON-able)."""
    if dtype not in _DTYPES:
        raise UserError(f"neuron runner: dtype {dtype!r} is not supported: use one of {', '.join(_DTYPES)}")
    ctx, tkg = [int(x) for x in ctx], [int(x) for x in tkg]
    ctx_batch = int(batch) if batched_prefill else 1
    kw: dict[str, Any] = {
        "tp_degree": int(tp),
        "batch_size": int(batch),
        "ctx_batch_size": ctx_batch,
        "tkg_batch_size": int(batch),
        # a context-encoding batch smaller than the decode batch writes each prompt's KV
        # into its own row (seq_ids), which is NxD Inference's continuous-batching layout
        "is_continuous_batching": ctx_batch != int(batch),
        "seq_len": max(max(ctx), max(tkg)),
        "max_context_length": max(ctx),
        "torch_dtype": dtype,
        "padding_side": "right",
        "enable_bucketing": True,
        "context_encoding_buckets": ctx,
        "token_generation_buckets": tkg,
    }
    if on_device_sampling:
        kw["on_device_sampling_config"] = {"top_k": 1}  # greedy on the device
    return kw


def unit_dir(root: str | os.PathLike, fingerprint: str, tp: int, batch: int, config: Mapping[str, Any]) -> Path:
    """``<root>/<fingerprint>/tp<tp>_b<batch>_<hash of the NeuronConfig and model>``."""
    return Path(root) / fingerprint / f"tp{tp}_b{batch}_{stable_hash(config, n=12)}"


def artifacts_complete(folder: str | os.PathLike, config: Mapping[str, Any]) -> bool:
    """True when ``folder`` holds a finished compilation of exactly ``config``."""
    f = Path(folder) / MARKER
    if not f.is_file():
        return False
    try:
        return json.loads(f.read_text()).get("config") == json.loads(json.dumps(config))
    except ValueError:
        return False


def write_marker(folder: str | os.PathLike, config: Mapping[str, Any], *, compile_s: float, versions: Mapping[str, str]) -> None:
    """Record that ``folder`` holds a finished compilation of ``config`` (written last)."""
    p = Path(folder) / MARKER
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps({"config": config, "compile_s": compile_s, "versions": dict(versions),
                               "written_at": time.time()}, indent=2, sort_keys=True) + "\n")
    tmp.replace(p)


@dataclass(frozen=True, eq=False)
class NeuronUnitSpec:
    """Everything that compiles and loads one unit."""

    key: str
    tp: int
    batch: int
    family: str
    neuron_config: Mapping[str, Any]
    checkpoint: str
    random_weights: bool
    shape: ModelShape
    dtype: str
    seed: int
    artifacts: str
    versions: Mapping[str, str]


def sdk_versions() -> dict[str, str]:
    """Neuron SDK and compiler versions from package metadata; ``RunnerUnavailable`` when missing."""
    found = dist_versions(RECORDED)
    missing = [n for n in REQUIRED if n not in found]
    if missing:
        raise RunnerUnavailable(f"runner 'neuron' needs {', '.join(missing)}, not installed here: {_INSTALL_HINT}")
    v = base_versions()
    v.update(found)
    drv = neuron_driver_version()
    if drv:
        v["neuron_driver"] = drv
    return v


def deploy_config(target: Target, opts: Mapping[str, Any], candidate: Candidate) -> dict[str, Any]:
    """The ``neuron_config`` of a candidate, as NxD Inference's ``NeuronConfig`` takes it."""
    return neuron_config_kwargs(
        tp=candidate.tp, batch=candidate.batch, ctx=candidate.ctx_buckets, tkg=candidate.tkg_buckets,
        dtype=target.dtype, batched_prefill=target.prefill == "batched",
        on_device_sampling=bool(opts.get("on_device_sampling", True)),
    )


# -- the SDK boundary ---------------------------------------------------------------------------


def check_batches(input_len, output_len, *, batch: int, seq_len: int) -> None:
    """Every static batch's padded length fits the compiled one, or ``UserError`` naming it.

    NxD Inference pads a batch to its longest prompt and decodes it to its longest output,
    so its last context is max l_in + max l_out - 1, which must stay within ``seq_len`` (the
    largest bucket), even when each request alone fits (e.g. (2000, 10) beside (10, 2000)
    with 2048).
    """
    lin = np.asarray(input_len, np.int64)
    lout = np.asarray(output_len, np.int64)
    for s in range(0, lin.size, batch):
        e = min(s + batch, lin.size)
        i = s + int(np.argmax(lin[s:e]))
        j = s + int(np.argmax(lout[s:e]))
        last = int(lin[i] + lout[j] - 1)
        if last > seq_len:
            raise UserError(
                f"neuron runner: batch {s // batch} (requests {s}..{e - 1}): its longest prompt (request {i}, "
                f"{lin[i]} tokens) and longest output (request {j}, {lout[j]} tokens) reach context {last}, past the "
                f"compiled length {seq_len} (the largest bucket): NxD Inference pads a static batch to its longest "
                f"prompt and decodes it to its longest output; add a larger bucket or put such requests in "
                f"different batches"
            )


class _NxdEngine:
    """One compiled NxD Inference unit loaded onto the NeuronCores."""

    def __init__(self, spec: NeuronUnitSpec):
        import importlib

        from neuronx_distributed_inference.models.config import NeuronConfig
        from neuronx_distributed_inference.utils.hf_adapter import HuggingFaceGenerationAdapter, load_pretrained_config

        self.spec = spec
        module, config_cls, model_cls = FAMILIES[spec.family]
        mod = importlib.import_module(module)
        checkpoint = Path(spec.checkpoint)
        if spec.random_weights:
            from ._model_dir import write_random_checkpoint

            write_random_checkpoint(checkpoint, spec.shape, dtype=spec.dtype, seed=spec.seed,
                                    max_position=int(spec.neuron_config["seq_len"]))
        nc = NeuronConfig(**json.loads(json.dumps(dict(spec.neuron_config))))
        config = getattr(mod, config_cls)(nc, load_config=load_pretrained_config(str(checkpoint)))
        model = getattr(mod, model_cls)(str(checkpoint), config)
        self.artifacts = spec.artifacts
        self.reused_artifacts = artifacts_complete(spec.artifacts, spec.neuron_config)
        self.compile_s = 0.0
        if not self.reused_artifacts:
            Path(spec.artifacts).mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            model.compile(spec.artifacts)
            self.compile_s = time.perf_counter() - t0
            write_marker(spec.artifacts, spec.neuron_config, compile_s=self.compile_s, versions=spec.versions)
        t0 = time.perf_counter()
        model.load(spec.artifacts)
        self.load_s = time.perf_counter() - t0
        self.model = model
        self.adapter = HuggingFaceGenerationAdapter(model)

    def generate_timed(self, prompts: Sequence[Sequence[int]], output_lens: Sequence[int]) -> TimedBatch:
        import torch
        from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

        times: list[float] = []

        class _StepClock(StoppingCriteria):
            # called once after every generated token; records the time, stops nothing
            def __call__(self, input_ids, scores, **kwargs):
                times.append(time.perf_counter())
                return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

        width = max(len(p) for p in prompts)
        ids = torch.zeros((len(prompts), width), dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor([int(x) for x in p], dtype=torch.long)
            mask[i, : len(p)] = 1
        steps = max(int(n) for n in output_lens)
        # no end-of-sequence id at all ([], as NxD Inference's own benchmark does): with None,
        # transformers falls back to the model's, and rows would stop before `steps` tokens
        gen = GenerationConfig(do_sample=False, top_k=1, max_new_tokens=steps, eos_token_id=[], pad_token_id=0)
        t0 = time.perf_counter()
        self.adapter.generate(ids, attention_mask=mask, generation_config=gen,
                              stopping_criteria=StoppingCriteriaList([_StepClock()]))
        wall = time.perf_counter() - t0
        return times_from_steps(times, t0, output_lens, wall_s=wall)

    def close(self) -> None:
        self.adapter = None
        self.model = None
        import gc

        gc.collect()


# -- the runner -------------------------------------------------------------------------------


class NeuronRunner(EngineRunner):
    """NxD Inference on Inferentia2 / Trainium; see the module docstring."""

    name = "neuron"
    engine_class = _NxdEngine
    one_unit_per_process = True
    options_schema: dict[str, tuple[type, Any]] = {
        "model": (str, ""),  # Hugging Face checkpoint folder
        "random_weights": (bool, False),  # no model: a random checkpoint of [target.model]'s shape
        "family": (str, "llama"),  # NxD Inference model family: llama | qwen2 | qwen3
        "artifacts_dir": (str, ""),  # compiled units (default ~/.cache/lensopt/neuron)
        "warmup": (int, 1),  # untimed runs before the first timed one of each bucket / workload
        "on_device_sampling": (bool, True),  # greedy sampling on the NeuronCores
    }
    moved_options = {"batched_prefill": 'write prefill = "batched" (true) or "sequential" (false) under [target] '
                                        '(the estimator reads it there too)'}

    def __init__(self, target: Target):
        super().__init__(target)
        if target.bucket_policy != "exclusive":
            raise UserError(
                f"neuron runner: target.bucket_policy = {target.bucket_policy!r}, but NxD Inference runs a length l in "
                f"the smallest bucket b with l < b (the largest also takes l == b): set bucket_policy = \"exclusive\""
            )
        if self.opts["family"] not in FAMILIES:
            raise UserError(
                f"neuron runner: family = {self.opts['family']!r} is unknown: use one of {', '.join(FAMILIES)}"
            )
        if not self.opts["model"] and not self.opts["random_weights"]:
            raise UserError(
                f"neuron runner: target {target.name!r} needs [target.options] model (a Hugging Face checkpoint "
                f"folder) or random_weights = true (a random checkpoint of [target.model]'s shape)"
            )
        if self.opts["model"] and self.opts["random_weights"]:
            raise UserError("neuron runner: give either model or random_weights = true, not both")
        if self.opts["random_weights"] and self.opts["family"] != "llama":
            raise UserError("neuron runner: random_weights writes a Llama checkpoint: use family = \"llama\"")
        if target.dtype not in _DTYPES:
            raise UserError(f"neuron runner: dtype {target.dtype!r} is not supported: use one of {', '.join(_DTYPES)}")
        self._versions: dict[str, str] | None = None

    # -- identity --------------------------------------------------------------------------
    def versions(self) -> dict[str, str]:
        if self._versions is None:
            self._versions = sdk_versions()
        return dict(self._versions)

    def require_sdk(self) -> None:
        self.versions()

    def fingerprint_fields(self) -> dict[str, Any]:
        fields = super().fingerprint_fields()
        opts = {k: v for k, v in self.opts.items() if k != "artifacts_dir"}
        # the prefill was the option batched_prefill once: the digest keeps it, so a unit keeps its fingerprint
        opts["batched_prefill"] = self.prefill == "batched"
        fields["neuron_options"] = stable_hash(opts)
        return fields

    def artifacts_root(self) -> Path:
        return Path(os.path.expanduser(self.opts["artifacts_dir"] or os.path.join("~", ".cache", "lensopt", "neuron")))

    def checkpoint_dir(self) -> Path:
        if self.opts["model"]:
            return Path(os.path.expanduser(self.opts["model"]))
        t = self.target
        digest = stable_hash({"config": llama_hf_config(t.model, dtype=t.dtype), "seed": t.seed}, n=12)
        return self.artifacts_root() / "checkpoints" / f"llama_{digest}"

    # -- engines ---------------------------------------------------------------------------
    def engine_spec(self, tp: int, batch: int, ctx: Sequence[int], tkg: Sequence[int]) -> NeuronUnitSpec:
        t = self.target
        nc = neuron_config_kwargs(tp=tp, batch=batch, ctx=ctx, tkg=tkg, dtype=t.dtype,
                                  batched_prefill=self.prefill == "batched",
                                  on_device_sampling=self.opts["on_device_sampling"])
        ckpt = self.checkpoint_dir()
        ident = {"neuron_config": nc, "family": self.opts["family"], "checkpoint": str(ckpt)}
        folder = unit_dir(self.artifacts_root(), self.fingerprint(), tp, batch, ident)
        return NeuronUnitSpec(
            key=stable_hash(ident, n=20), tp=tp, batch=batch, family=self.opts["family"], neuron_config=nc,
            checkpoint=str(ckpt), random_weights=self.opts["random_weights"], shape=t.model, dtype=t.dtype,
            seed=t.seed, artifacts=str(folder), versions=self.versions(),
        )

    def run_workload(self, candidate: Candidate, requests: Requests, *, mode: str = "static") -> WorkloadRun:
        self.check_mode(mode, requests)
        ctx = validate_buckets(candidate.ctx_buckets, what="ctx_buckets")
        tkg = validate_buckets(candidate.tkg_buckets, what="tkg_buckets")
        self.check_unit(Unit(self.target, candidate.tp, candidate.batch))
        # each request alone first (its message names it), then each static batch as padded
        check_requests(self.name, requests.input_len, requests.output_len, ctx, tkg, self.target.bucket_policy)
        check_batches(requests.input_len, requests.output_len, batch=candidate.batch,
                      seq_len=max(max(ctx), max(tkg)))
        return super().run_workload(candidate, requests, mode=mode)

    def deploy_snippets(self, candidate: Candidate) -> dict[str, str]:
        files = super().deploy_snippets(candidate)
        files["neuron_config.json"] = json.dumps(deploy_config(self.target, self.opts, candidate),
                                                 indent=2, sort_keys=True) + "\n"
        return files


__all__ = [
    "FAMILIES",
    "MARKER",
    "NeuronRunner",
    "NeuronUnitSpec",
    "artifacts_complete",
    "check_batches",
    "deploy_config",
    "neuron_config_kwargs",
    "sdk_versions",
    "unit_dir",
    "write_marker",
]
