"""``sim``: simulated NPUs, the ground truth of lensopt's experiments.

A compiled-shape accelerator executed request by request and step by step, written apart
from the estimator (it imports ``lens.types`` and ``lens.errors`` only: no selection,
composition or probe code), so that grading an estimator on it does not grade the
estimator against itself. Every number it returns is labelled simulated
(``ProfileResult.simulated``, ``WorkloadRun.simulated``, ``versions()``, the fingerprint).

One concern per module:

- ``devices``: public spec figures (inf2, trn1, trn2, TPU v5e/v5p/v6e) and the memory rule;
- ``stacks``: the hidden behaviour of each family's stack (NxD Inference, vLLM TPU):
  efficiencies, attention kernels, KV-cache layout, compile constants;
- ``kernels``: device seconds of every graph of a unit (padded linear layers, attention
  that follows the real context where the stack's kernels do, all-reduces, KV-cache
  copies, per-bucket compiler quirks) and compile seconds;
- ``host``: the host's costs per graph call, per live row and per generate call, rare
  stalls, slow drift of its speed, and the clock that drives the drift;
- ``select``: the machine's own bucket selection (exclusive and inclusive policies);
- ``machine``: one generate call step by step (sequential or batched prefill, as the
  target's ``prefill`` says; static decode with finished rows riding along, cache copies
  when the bucket changes);
- ``options``: every ``[target.options]`` setting, declared once;
- ``runner``: ``SimRunner``, the runner interface over all of it.

Each effect of a real stack can be switched off on its own (``options.EFFECTS``;
``[target.options] stragglers = false``), so an evaluation can show what each one costs.
"""
from .devices import device_info, fits_memory, hardware_names, memory_need_gib
from .options import EFFECTS, SimOptions
from .runner import SIM_VERSION, SimRunner

__all__ = [
    "EFFECTS",
    "SIM_VERSION",
    "SimOptions",
    "SimRunner",
    "device_info",
    "fits_memory",
    "hardware_names",
    "memory_need_gib",
]
