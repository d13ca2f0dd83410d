"""What a runner driving a real LLM engine (``vllm``, ``neuron``) writes and reads on its host,
never importing an SDK: a Llama model directory (``config.json`` for random weights), and
the versions of installed packages, drivers and devices (package metadata, procfs/sysfs).
"""
from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import platform
from pathlib import Path
from typing import Any, Iterable

from lens.errors import UserError
from lens.types import ModelShape


# -- model directories -------------------------------------------------------------------------

#: dtype names of the space files -> the ``torch_dtype`` string of a Hugging Face config
_HF_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16", "fp8": "bfloat16"}


def llama_hf_config(shape: ModelShape, *, dtype: str = "bfloat16", max_position: int = 8192,
                    rope_theta: float = 500000.0) -> dict[str, Any]:
    """A Hugging Face ``config.json`` (LlamaForCausalLM) for ``shape``.

    Enough for engines that build the model from its config and fill it with random
    weights (vLLM ``load_format="dummy"``); no tokenizer files are needed when prompts are
    token ids.  No eos/bos ids: generation of a fixed length never stops on them.
    """
    if shape.hidden % shape.heads:
        raise UserError(f"model.hidden = {shape.hidden} is not a multiple of model.heads = {shape.heads}")
    if dtype not in _HF_DTYPES:
        raise UserError(f"dtype {dtype!r} is unknown: use one of {', '.join(_HF_DTYPES)}")
    if max_position < 1:
        raise UserError(f"max_position = {max_position} must be positive")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab,
        "max_position_embeddings": int(max_position),
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": float(rope_theta),
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "use_cache": True,
        "torch_dtype": _HF_DTYPES[dtype],
    }


def write_llama_model_dir(path: str | os.PathLike, shape: ModelShape, *, dtype: str = "bfloat16",
                          max_position: int = 8192) -> Path:
    """Write ``config.json`` for ``shape`` into ``path`` (created); returns the folder.

    An existing ``config.json`` with other content is an error, never overwritten.
    """
    p = Path(path)
    cfg = llama_hf_config(shape, dtype=dtype, max_position=max_position)
    text = json.dumps(cfg, indent=2, sort_keys=True) + "\n"
    f = p / "config.json"
    if f.exists():
        if json.loads(f.read_text()) != cfg:
            raise UserError(f"{f} exists with another model configuration; choose an empty folder")
        return p
    p.mkdir(parents=True, exist_ok=True)
    f.write_text(text)
    return p


# -- versions (read without importing an SDK) -----------------------------------------------


def dist_version(name: str) -> str | None:
    """The installed version of distribution ``name`` (from its metadata), or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def dist_versions(names: Iterable[str]) -> dict[str, str]:
    out = {}
    for n in names:
        v = dist_version(n)
        if v is not None:
            out[n] = v
    return out


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def nvidia_info(root: str = "/proc/driver/nvidia") -> dict[str, str]:
    """NVIDIA driver version and GPU models, read from procfs (no CUDA context is created)."""
    out: dict[str, str] = {}
    text = _read_text(os.path.join(root, "version"))
    if text:
        for tok in text.split():
            parts = tok.split(".")
            if len(parts) >= 2 and all(x.isdigit() for x in parts):
                out["nvidia_driver"] = tok
                break
    models = []
    for info in sorted(glob.glob(os.path.join(root, "gpus", "*", "information"))):
        t = _read_text(info) or ""
        for line in t.splitlines():
            if line.lower().startswith("model:"):
                models.append(line.split(":", 1)[1].strip())
    if models:
        out["gpus"] = f"{len(models)} x {models[0]}" if len(set(models)) == 1 else "; ".join(models)
    return out


def neuron_driver_version(path: str = "/sys/module/neuron/version") -> str | None:
    text = _read_text(path)
    return text.strip() if text else None


def base_versions() -> dict[str, str]:
    return {"python": platform.python_version()}
