"""The compiled graphs of one unit (target, tp, batch): device seconds per call, compile seconds.

A graph costs a roofline of its FLOPs and bytes on one tensor-parallel device (public
peak figures from ``runners.sim.devices`` at the stack's hidden efficiencies, with
imperfect overlap of compute and memory), plus two ring all-reduces per layer, times the
compiler's off-trend factor for that shape (its *quirk*). Linear layers always run the
compiled (padded) shape; attention follows the real context where the stack's kernels do
(``context_attention``):

- prefill, NxD Inference: the prompt is right-padded to the bucket and the padding keys
  are masked; the flash-attention kernel skips tiles masked entirely, so padded query
  rows still attend over the real keys while padded-by-padded tiles are skipped: about
  l b - l^2/2 token pairs instead of b^2/2 for a prompt of l tokens in bucket b;
- prefill, vLLM TPU: ragged paged attention sees only the prompt's tokens: about l^2/2;
- decode, NxD Inference: the token-generation kernel reads the bucket's whole cache (the
  cache's shape is what sets the bucket), so decode attention does not follow there;
- decode, vLLM TPU: ragged paged attention reads only the pages each row holds; the
  compiled grid still steps over the bucket's other page slots at a small cost each.

With ``context_attention`` off every kernel pays the whole bucket: the padded machine.
"""
from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from lens.types import ModelShape

from .devices import DeviceSpec, dtype_bytes, kv_bytes_per_token
from .stacks import Stack

#: a roofline with imperfect overlap: time = max(compute, memory) + this share of the other
OVERLAP_LOSS = 0.15
#: the band compiler quirk factors are clipped to
QUIRK_RANGE = (0.85, 1.30)


def unit_interval(*parts: Any) -> float:
    """A deterministic number in [0, 1) from ``parts`` (stable across processes)."""
    h = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2.0**64


class UnitGraphs:
    """Device seconds of every graph of one compiled unit; see the module docstring."""

    def __init__(self, *, spec: DeviceSpec, stack: Stack, model: ModelShape, dtype: str, tp: int, batch: int,
                 context_attention: bool, quirks: float, quirk_key: tuple):
        self.spec, self.stack, self.model = spec, stack, model
        self.tp, self.batch = tp, batch
        self.follow = context_attention
        self.quirk_strength = quirks
        self.quirk_key = (*quirk_key, tp, batch)
        self.e = dtype_bytes(dtype)
        peak = spec.peak_tflops_8bit if self.e == 1 else spec.peak_tflops
        if dtype == "float32":
            peak /= 4.0  # matmul engines run FP32 at about a quarter of the BF16 rate
        self.flops_s = peak * 1e12
        self.bw = spec.bandwidth_gbs * 1e9 * stack.mbu
        self.link = spec.link_gbs * 1e9
        self.dense = float(model.param_count() - 2 * model.vocab * model.hidden)  # per-layer weights
        self.head = float(model.vocab * model.hidden)  # LM head (logits of the last position)
        self.kv_token = kv_bytes_per_token(model, dtype)
        self.weight_bytes = (self.dense + self.head) * self.e
        self._quirks: dict[tuple[str, int], float] = {}

    # -- the pieces ------------------------------------------------------------------------
    def _roofline(self, flops, nbytes, mfu: float) -> np.ndarray:
        c = np.asarray(flops, float) / self.tp / (self.flops_s * mfu)
        m = np.asarray(nbytes, float) / self.tp / self.bw
        return np.maximum(c, m) + OVERLAP_LOSS * np.minimum(c, m)

    def _allreduces_s(self, rows_tokens) -> np.ndarray:
        """Two ring all-reduces per layer of ``rows_tokens`` hidden vectors."""
        x = np.asarray(rows_tokens, float)
        if self.tp == 1:
            return np.zeros_like(x)
        p, m = self.tp, self.model
        one = 2 * (p - 1) * self.stack.hop_s + 2.0 * (p - 1) / p * x * m.hidden * self.e / self.link
        return 2 * m.layers * one

    def quirk(self, kind: str, bucket: int) -> float:
        """The compiler's off-trend factor for one graph shape; 1.0 when quirks are off."""
        key = (kind, int(bucket))
        if key in self._quirks:
            return self._quirks[key]
        f = 1.0
        if self.quirk_strength > 0.0:
            u = unit_interval("class", kind, bucket, *self.quirk_key)
            v = unit_interval("value", kind, bucket, *self.quirk_key)
            if u < 0.2:  # a shape the compiler handles unusually well
                f = 0.85 + 0.08 * v
            elif u > 0.8:  # one it handles badly
                f = 1.08 + 0.17 * v
            else:
                f = 0.97 + 0.06 * v
            if bucket & (bucket - 1):  # not a power of two: ragged tiles
                f *= 1.04 if kind.startswith("ctx") else 1.08
            f = float(np.clip(np.exp(self.quirk_strength * np.log(f)), *QUIRK_RANGE))
        self._quirks[key] = f
        return f

    def _quirks_of(self, kind: str, buckets) -> np.ndarray:
        return np.array([self.quirk(kind, int(b)) for b in np.asarray(buckets).ravel()]).reshape(np.shape(buckets))

    # -- attention work ------------------------------------------------------------------------
    def prefill_pairs(self, lengths, buckets) -> np.ndarray:
        """Query-key token pairs the prefill attention computes, per layer (see the module doc)."""
        T = self.stack.tile
        nq = -(-np.asarray(buckets, np.int64) // T)
        padded = nq * (nq + 1) / 2.0
        if not self.follow:
            return padded * T * T
        nk = -(-np.asarray(lengths, np.int64) // T)
        if self.stack.prefill_kernel == "ragged":
            return nk * (nk + 1) / 2.0 * T * T
        return (nk * (nk + 1) / 2.0 + (nq - nk) * nk) * T * T

    def decode_tokens(self, contexts: np.ndarray, buckets: np.ndarray) -> np.ndarray:
        """KV tokens each decode step's attention pays for, summed over the batch's rows.

        ``contexts``: (steps, batch) real context of every row, 0 for a padding row;
        ``buckets``: (steps,) the token-generation bucket of each step.
        """
        b = np.asarray(buckets, float)
        rows = contexts.shape[1]
        if not self.follow or self.stack.decode_kernel == "bucket":
            return b * rows
        P = self.stack.page
        read = np.minimum(-(-contexts // P) * P, b[:, None])
        return read.sum(axis=1) + self.stack.skipped_page * (b * rows - read.sum(axis=1))

    # -- graph costs ---------------------------------------------------------------------------
    def prefill_s(self, lengths, buckets) -> np.ndarray:
        """Device seconds of encoding one prompt of each length alone, padded to its bucket."""
        s = np.asarray(buckets, float)
        m = self.model
        pairs = self.prefill_pairs(lengths, buckets)
        flops = 2.0 * self.dense * s + 2.0 * self.head + 4.0 * m.hidden * m.layers * pairs
        nbytes = self.weight_bytes + s * self.kv_token + 4.0 * s * m.hidden * self.e * m.layers
        dev = self._roofline(flops, nbytes, self.stack.mfu) + self._allreduces_s(s)
        return dev * self._quirks_of("ctx", buckets)

    def batched_prefill_s(self, lengths, bucket: int) -> float:
        """Device seconds of encoding a whole batch in one call of shape (batch, bucket).

        ``lengths`` has one entry per compiled row; padding rows of a short batch are 0 and
        still run the padded shape (NxD Inference's ``ctx_batch_size``, vLLM's prefill).
        """
        ln = np.asarray(lengths, np.int64)
        rows, s, m = len(ln), float(bucket), self.model
        pairs = float(self.prefill_pairs(ln, np.full_like(ln, bucket)).sum())
        flops = rows * (2.0 * self.dense * s + 2.0 * self.head) + 4.0 * m.hidden * m.layers * pairs
        nbytes = self.weight_bytes + rows * (s * self.kv_token + 4.0 * s * m.hidden * self.e * m.layers)
        dev = self._roofline(flops, nbytes, self.stack.mfu) + self._allreduces_s(rows * s)
        return float(dev) * self.quirk("ctx-batched", bucket)

    def decode_s(self, contexts: np.ndarray, buckets: np.ndarray) -> np.ndarray:
        """Device seconds of each decode step of the whole batch (see ``decode_tokens``)."""
        rows, m = contexts.shape[1], self.model
        tokens = self.decode_tokens(contexts, buckets)
        flops = 2.0 * (self.dense + self.head) * rows + 4.0 * m.hidden * m.layers * tokens
        nbytes = self.weight_bytes + tokens * self.kv_token
        dev = self._roofline(flops, nbytes, self.stack.mfu_decode) + self._allreduces_s(np.full(len(buckets), rows))
        return dev * self._quirks_of("tkg", buckets)

    def relayout_s(self, old_buckets) -> np.ndarray:
        """Device seconds of copying the batch's KV cache out of a bucket's shape (one read, one write)."""
        nbytes = 2.0 * self.batch * np.asarray(old_buckets, float) * self.kv_token
        return nbytes / self.tp / self.bw

    # -- compile ---------------------------------------------------------------------------------
    def compile_unit_s(self) -> float:
        """Fixed hardware seconds of a unit: trace, shard and lay out the weights, load the graphs."""
        gparams = self.model.param_count() / 1e9
        return float(self.stack.compile_unit_s * (1.0 + 0.1 * gparams) * (1.0 + 0.05 * np.log2(self.tp)))

    def compile_graph_s(self, kind: str, bucket: int) -> float:
        """Hardware seconds to compile one graph: grows with model size, bucket and batch."""
        gparams = self.model.param_count() / 1e9
        size = (bucket / 1024.0) ** 0.25 * (1.5 if kind.startswith("ctx") else 1.0)
        size *= 1.0 + 0.05 * np.log2(self.batch)
        base = self.stack.compile_graph_s + self.stack.compile_per_gparam_s * gparams * size
        jitter = 0.9 + 0.2 * unit_interval("compile", kind, bucket, *self.quirk_key)
        return float(base * jitter * (1.0 + 0.05 * np.log2(self.tp)))
