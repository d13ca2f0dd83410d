"""AMALI: an analytical model of LLM inference kernels on GPUs, built from kernel shapes.

The project's second method (Cao et al., "AMALI: An Analytical Model for Accurately Modeling
LLM Inference on Modern GPUs", ISCA 2025, doi 10.1145/3695053.3731064). It
predicts the cycles of every kernel of a Llama-architecture prefill or decode step on a
GPU from the kernel's shape alone -- no SASS traces, no profiling -- and turns them into
per-bucket TTFT_b / TBT_b estimates of the same shape as LENS profiles.

- ``specs``: GPU specs as data, each number with its source (``gpu_spec``, ``known_gpus``).
- ``kernels``: the kernel list of one prefill step and one decode step.
- ``model``: per-kernel cycles (tiling, occupancy, waves, tensor-core issue, L2/DRAM,
  latency, KLL launch term, divergence) with every term kept.
- ``estimator``: ``estimate_unit`` (dict[int, BucketProfile]), ``breakdown`` (a per-kernel
  DataFrame), ``request_seconds``.

Every number it produces is an estimate, marked ``source="estimate:amali"``.
"""
from __future__ import annotations

from .estimator import (
    LABEL,
    SOURCE,
    breakdown,
    decode_seconds,
    estimate_for,
    estimate_unit,
    prefill_seconds,
    request_seconds,
)
from .kernels import AllReduce, FusedAttention, Gemm, RowOp, decode_kernels, prefill_kernels, shard
from .model import KernelCost, kernel_cost, kll_cycles, occupancy, step_costs, step_seconds, waves
from .specs import GPUS, GpuSpec, canonical_dtype, gpu_spec, is_known_gpu, known_gpus

__all__ = [
    "GPUS", "LABEL", "SOURCE", "AllReduce", "FusedAttention", "Gemm", "GpuSpec", "KernelCost", "RowOp",
    "breakdown", "canonical_dtype", "decode_kernels", "decode_seconds", "estimate_for", "estimate_unit",
    "gpu_spec", "is_known_gpu", "kernel_cost", "kll_cycles", "known_gpus", "occupancy", "prefill_kernels",
    "prefill_seconds", "request_seconds", "shard", "step_costs", "step_seconds", "waves",
]
