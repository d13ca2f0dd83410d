"""How each simulated family's software stack runs a compiled unit: hidden from the estimator.

The public figures of a device are in ``runners.sim.devices``; here is what a user cannot
read off a spec sheet and an estimator never sees: achieved efficiencies, which attention
kernels the stack uses, whether its KV cache has a per-bucket layout, and how long it
compiles. Neuron families stand for NxD Inference on Inferentia2/Trainium; TPU families for
vLLM TPU (ragged paged attention; its scheduler encodes a batch's prompts in one step, so the
shipped TPU space files set ``[target] prefill = "batched"``: the device runs whichever
prefill its target says). The efficiencies put the simulated figures near
published ones (TPU v6e, Llama-3.1-8B, TP4: TTFT about 71 ms at 4096 tokens; Inferentia2
TBT about 8-11 ms; Neuron compiles of 10-60 min per model) and were never tuned against
any estimator.
"""
from __future__ import annotations

from dataclasses import dataclass

from .devices import DEVICES

#: prefill attention kernels: NxD's flash attention masks the padding keys and skips tiles
#: masked entirely (padded query rows still attend over the real keys); ragged kernels see
#: only the prompt's real tokens
PREFILL_KERNELS = ("key_padding", "ragged")
#: decode attention kernels: NxD's token-generation kernel takes the bucket's whole cache
#: (the cache's shape is what sets the bucket); paged kernels read a row's own pages
DECODE_KERNELS = ("bucket", "paged")


@dataclass(frozen=True)
class Stack:
    """Hidden behaviour of one device family's serving stack."""

    software: str
    mfu: float  # achieved share of peak FLOP/s, prefill
    mfu_decode: float  # achieved share of peak FLOP/s, decode
    mbu: float  # achieved share of HBM bandwidth
    hop_s: float  # all-reduce latency per ring hop
    prefill_kernel: str
    decode_kernel: str
    tile: int  # tokens per attention tile (prefill)
    page: int  # tokens per KV page (paged decode); 0 where the cache is not paged
    #: cost of a page slot a paged kernel skips, relative to one it reads: the compiled grid
    #: still steps over the bucket's page slots, each skipped one a short loop iteration
    skipped_page: float
    relayout: bool  # whether a change of decode bucket copies the KV cache into a new shape
    compile_unit_s: float  # fixed compile work per unit (trace, shard and lay out weights, load)
    compile_graph_s: float  # fixed compile work per graph
    compile_per_gparam_s: float  # per graph and billion parameters, at a 1024-token bucket


def _neuron(**eff) -> Stack:
    return Stack(software="NxD Inference", prefill_kernel="key_padding", decode_kernel="bucket", tile=128, page=0,
                 skipped_page=1.0, relayout=True, **eff)


def _tpu(**eff) -> Stack:
    return Stack(software="vLLM TPU", prefill_kernel="ragged", decode_kernel="paged", tile=128, page=64,
                 skipped_page=0.05, relayout=False, **eff)


STACKS: dict[str, Stack] = {
    "inf2": _neuron(mfu=0.45, mfu_decode=0.25, mbu=0.70, hop_s=6e-6, compile_unit_s=90.0, compile_graph_s=12.0,
                    compile_per_gparam_s=20.0),
    "trn1": _neuron(mfu=0.48, mfu_decode=0.27, mbu=0.72, hop_s=5e-6, compile_unit_s=90.0, compile_graph_s=12.0,
                    compile_per_gparam_s=18.0),
    "trn2": _neuron(mfu=0.42, mfu_decode=0.22, mbu=0.68, hop_s=4e-6, compile_unit_s=80.0, compile_graph_s=10.0,
                    compile_per_gparam_s=15.0),
    "tpu-v5e": _tpu(mfu=0.42, mfu_decode=0.25, mbu=0.78, hop_s=3e-6, compile_unit_s=25.0, compile_graph_s=3.0,
                    compile_per_gparam_s=4.0),
    "tpu-v6e": _tpu(mfu=0.36, mfu_decode=0.20, mbu=0.75, hop_s=3e-6, compile_unit_s=25.0, compile_graph_s=3.0,
                    compile_per_gparam_s=3.5),
    "tpu-v5p": _tpu(mfu=0.45, mfu_decode=0.25, mbu=0.78, hop_s=3e-6, compile_unit_s=25.0, compile_graph_s=3.0,
                    compile_per_gparam_s=4.0),
}
assert set(STACKS) == set(DEVICES)
