"""Random weights for a Hugging Face Llama model folder, written with numpy alone.

``runners._llm_host.write_llama_model_dir`` writes a ``config.json`` of a ``[target.model]``
shape: enough for vLLM with ``load_format="dummy"``, which fills in random weights itself.
Engines that compile from a checkpoint folder (NxD Inference, and vLLM on the Neuron
platform, which ignores ``load_format``) need real weight files even when the weights do
not matter for timing: ``write_random_checkpoint`` adds one ``model.safetensors`` holding
every tensor of ``LlamaForCausalLM`` under its Hugging Face name, so no torch or
transformers is needed.

The safetensors format is small: an 8-byte little-endian header length, a JSON header
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``
(padded with spaces to 8 bytes), then the tensors' bytes back to back, little-endian,
row-major.  bfloat16 is float32 rounded to its upper 16 bits (to nearest, ties to even).
Weights are normal with std 0.02 (``initializer_range``), norms are ones.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Iterator

import numpy as np

from lens.errors import UserError
from lens.types import ModelShape

from ._llm_host import write_llama_model_dir

WEIGHTS = "model.safetensors"
INIT_STD = 0.02
#: elements generated at a time (bounds the memory a large embedding needs while written)
_CHUNK = 1 << 24

_FORMATS = {"bfloat16": ("BF16", 2), "float16": ("F16", 2), "float32": ("F32", 4)}


def llama_tensors(shape: ModelShape) -> list[tuple[str, tuple[int, ...]]]:
    """(Hugging Face name, shape) of every tensor of ``LlamaForCausalLM`` (untied head)."""
    h, hd, inter = shape.hidden, shape.head_dim, shape.intermediate
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (shape.vocab, h))]
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (shape.heads * hd, h)),
            (p + "self_attn.k_proj.weight", (shape.kv_heads * hd, h)),
            (p + "self_attn.v_proj.weight", (shape.kv_heads * hd, h)),
            (p + "self_attn.o_proj.weight", (h, shape.heads * hd)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (inter, h)),
            (p + "mlp.up_proj.weight", (inter, h)),
            (p + "mlp.down_proj.weight", (h, inter)),
        ]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (shape.vocab, h))]
    return out


def to_bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest, ties to even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def _encode(x: np.ndarray, dtype: str) -> bytes:
    if dtype == "bfloat16":
        return to_bfloat16_bits(x).astype("<u2").tobytes()
    return x.astype("<f2" if dtype == "float16" else "<f4").tobytes()


def _chunks(rng: np.random.Generator, name: str, shp: tuple[int, ...]) -> Iterator[np.ndarray]:
    n = int(np.prod(shp))
    if name.endswith("norm.weight"):
        yield np.ones(n, np.float32)
        return
    for s in range(0, n, _CHUNK):
        yield INIT_STD * rng.standard_normal(min(_CHUNK, n - s), dtype=np.float32)


def _header(shape: ModelShape, dtype: str, seed: int) -> tuple[bytes, int]:
    code, width = _FORMATS[dtype]
    head: dict = {"__metadata__": {"format": "pt", "written_by": "lensopt", "seed": str(seed)}}
    off = 0
    for name, shp in llama_tensors(shape):
        size = int(np.prod(shp)) * width
        head[name] = {"dtype": code, "shape": list(shp), "data_offsets": [off, off + size]}
        off += size
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return raw, off


def read_header(path: str | os.PathLike) -> dict:
    """The JSON header of a safetensors file; ``ValueError`` when the file is cut short or malformed."""
    p = Path(path)
    size = p.stat().st_size
    with open(p, "rb") as fh:
        first = fh.read(8)
        if len(first) < 8:
            raise ValueError(f"{p}: shorter than a safetensors header")
        (n,) = struct.unpack("<Q", first)
        if n > size - 8:
            raise ValueError(f"{p}: header of {n} bytes in a file of {size}")
        head = json.loads(fh.read(n))
    end = max((v["data_offsets"][1] for k, v in head.items() if k != "__metadata__"), default=0)
    if 8 + n + end != size:
        raise ValueError(f"{p}: {size} bytes, the header describes {8 + n + end}")
    return head


def write_random_checkpoint(folder: str | os.PathLike, shape: ModelShape, *, dtype: str, seed: int,
                            max_position: int) -> Path:
    """``config.json`` and a random ``model.safetensors`` for ``shape`` in ``folder``; returns it.

    Written once: a folder that already holds a complete ``model.safetensors`` of this
    shape, dtype and seed is kept.  The weights go to a temporary file renamed into place
    last, so an interrupted write is never taken for a checkpoint.
    """
    if dtype not in _FORMATS:
        raise UserError(f"random checkpoint: dtype {dtype!r} is not supported: use one of {', '.join(_FORMATS)}")
    p = write_llama_model_dir(folder, shape, dtype=dtype, max_position=max_position)
    head, total = _header(shape, dtype, seed)
    f = p / WEIGHTS
    if f.exists():
        try:
            same = read_header(f) == json.loads(head)
        except ValueError:
            same = False
        if same:
            return p
        raise UserError(f"{f} exists and is not this model's random checkpoint; choose an empty folder")
    rng = np.random.default_rng(seed)
    tmp = f.with_name(f.name + ".partial")
    with open(tmp, "wb") as fh:
        fh.write(struct.pack("<Q", len(head)))
        fh.write(head)
        for name, shp in llama_tensors(shape):
            for chunk in _chunks(rng, name, shp):
                fh.write(_encode(chunk, dtype))
    if tmp.stat().st_size != 8 + len(head) + total:
        raise UserError(f"{tmp}: wrote {tmp.stat().st_size} bytes, expected {8 + len(head) + total}; disk full?")
    tmp.replace(f)
    return p


__all__ = ["WEIGHTS", "llama_tensors", "read_header", "to_bfloat16_bits", "write_random_checkpoint"]
