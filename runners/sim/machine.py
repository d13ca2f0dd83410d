"""One generate call on the simulated machine, step by step.

A call runs one static batch (at most the unit's batch size of real requests; the rest
of the compiled rows are padding): the host launches it, the prompts are encoded, then
the batch decodes as one shape until its longest output ends. Every graph call of it --
each prefill, each decode step, each cache copy -- is costed from the machine's state at
that step (which rows are live, every row's real context, the bucket in use), then host
drift, stalls and the call's run-to-run factor are applied, and the timeline is summed.

Semantics (the same as the real runners'): a request (l_in, l_out) yields l_out tokens,
the first from its prefill, then l_out - 1 decode steps; step k has context l_in + k.

- ``sequential`` prefill (NxD Inference's default): prompts one at a time, each padded to
  its own context-encoding bucket; request i's first token lands when its prefill ends;
  padding rows are not encoded.
- ``batched`` prefill (NxD Inference's ``ctx_batch_size``, vLLM): one call of shape
  (batch, bucket of the longest prompt); every first token lands when it ends.
- decode: at step k the token-generation bucket is the one of the longest context among
  the rows still generating; finished rows ride along (their context keeps growing as
  padding) until the longest output ends. When the bucket changes, stacks whose KV cache
  has a per-bucket layout (NxD Inference, transformers-neuronx: each bucket's graph owns a
  cache of its shape) first copy the live cache into the new shape (``kv_relayout``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .host import Host, rng_for
from .kernels import UnitGraphs
from .options import SimOptions
from .select import bucket_index


@dataclass(frozen=True, eq=False)
class CallTimes:
    """Seconds from a call's start to each real row's first and last token, and to its end."""

    ttft_s: np.ndarray
    e2e_s: np.ndarray
    total_s: float


def generate(graphs: UnitGraphs, host: Host, opts: SimOptions, *, input_len: np.ndarray, output_len: np.ndarray,
             ctx_buckets: tuple[int, ...], tkg_buckets: tuple[int, ...], policy: str, prefill: str, key: tuple,
             clock_s: float) -> CallTimes:
    """Run one static batch; lengths must already fit the buckets (the runner checks them).

    ``prefill`` is the stack's (the target's): "sequential" or "batched".
    """
    lin = np.asarray(input_len, np.int64)
    lout = np.asarray(output_len, np.int64)
    n, rows = len(lin), graphs.batch
    ctx = np.asarray(ctx_buckets, np.int64)
    tkg = np.asarray(tkg_buckets, np.int64)

    # -- prefill: device and host seconds of each prefill call
    if prefill == "batched":
        b = int(ctx[bucket_index([int(lin.max())], ctx, policy)[0]])
        padded = np.concatenate([lin, np.zeros(rows - n, np.int64)])
        pre_dev = np.array([graphs.batched_prefill_s(padded, b)])
    else:
        pre_dev = graphs.prefill_s(lin, ctx[bucket_index(lin, ctx, policy)])
    pre_host = np.full(len(pre_dev), opts.host_overhead_s)

    # -- decode: every step's device and host seconds from the rows' real contexts
    steps = int(lout.max()) - 1
    k = np.arange(1, steps + 1, dtype=np.int64)[:, None]
    live = (lout - 1)[None, :] >= k  # (steps, n): rows still generating at step k
    context = lin[None, :] + k
    longest = np.where(live, context, 0).max(axis=1) if steps else np.zeros(0, np.int64)
    ti = bucket_index(longest, tkg, policy)
    bucket = tkg[ti]
    all_rows = np.concatenate([context, np.zeros((steps, rows - n), np.int64)], axis=1)  # padding rows: no context
    dec_dev = graphs.decode_s(all_rows, bucket) if steps else np.zeros(0)
    dec_host = host.step_s(live.sum(axis=1))
    if opts.kv_relayout and graphs.stack.relayout and steps > 1:
        moved = np.flatnonzero(ti[1:] != ti[:-1]) + 1  # the cache leaves bucket[j - 1] before step j
        dec_dev[moved] += graphs.relayout_s(bucket[moved - 1])
        dec_host[moved] += opts.host_overhead_s  # the copy is a graph call of its own

    # -- the timeline: launch, prefills, steps; host drift at each call's clock time, stalls
    dev = np.concatenate([[0.0], pre_dev, dec_dev])
    hst = np.concatenate([[host.launch_s()], pre_host, dec_host])
    at = clock_s + np.cumsum(dev + hst) - (dev + hst)  # start of each call, before drift and stalls
    stall = np.concatenate([[1.0], host.stall_factors(rng_for("stall", *key), len(dev) - 1)])
    noise = rng_for("noise", *key).lognormal(0.0, opts.noise) if opts.noise > 0 else 1.0
    end = np.cumsum((dev + hst * host.speed_factor(at)) * stall) * noise

    pre_end = end[1 : 1 + len(pre_dev)]
    ttft = np.full(n, pre_end[-1]) if prefill == "batched" else pre_end
    dec_end = end[1 + len(pre_dev):]
    e2e = np.where(lout > 1, dec_end[np.maximum(lout - 2, 0)] if steps else ttft, ttft)
    return CallTimes(ttft_s=ttft, e2e_s=e2e, total_s=float(end[-1]))
