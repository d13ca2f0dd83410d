"""Continuous batching on the simulated machine, one iteration at a time (docs/serving.md).

The unit's ``batch`` compiled rows are slots. Requests arrive on the device's clock into a
FIFO queue; each iteration admits waiting requests into free rows (the scheduler's
admission pass is one host launch: tokenize, pad, upload), prefills their prompts (one
graph call each, or one batched call with ``prefill = "batched"``), then runs one decode
step of every row in the bucket of the longest live context. Each graph call is costed
from the machine's state at that moment -- the real context of every row, the live rows'
host work, the KV-cache copy when the bucket changes -- with host drift at the clock's
time, rare stalls and the run's noise factor, exactly as ``machine.generate`` costs a
static batch. Written apart from the estimator: nothing here jumps between events or
reads a profile; it steps.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lens.types import PREFILLS

from .host import Host, rng_for
from .kernels import UnitGraphs
from .options import SimOptions
from .select import bucket_index


@dataclass(frozen=True, eq=False)
class ServeTimes:
    """Seconds from each request's arrival to its first and last token, and the run's duration."""

    ttft_s: np.ndarray
    e2e_s: np.ndarray
    total_s: float
    steps: int


def serve(graphs: UnitGraphs, host: Host, opts: SimOptions, *, input_len: np.ndarray, output_len: np.ndarray,
          arrival_s: np.ndarray, ctx_buckets: tuple[int, ...], tkg_buckets: tuple[int, ...], policy: str,
          key: tuple, clock_s: float, prefill: str = PREFILLS[0], max_prefills: int = 0,
          eager: bool = True) -> ServeTimes:
    """Serve the requests (lengths already checked against the buckets) from the clock time ``clock_s``
    (``prefill``: the target's)."""
    lin = [int(x) for x in input_len]
    lout = [int(x) for x in output_len]
    arr = np.asarray(arrival_s, float)
    arr = (arr - arr.min()).tolist()
    n, rows = len(lin), graphs.batch
    ctx, tkg = np.asarray(ctx_buckets, np.int64), np.asarray(tkg_buckets, np.int64)
    order = sorted(range(n), key=lambda i: (arr[i], i))
    stalls = rng_for("stall", *key)
    noise = float(rng_for("noise", *key).lognormal(0.0, opts.noise)) if opts.noise > 0 else 1.0
    relayout = opts.kv_relayout and graphs.stack.relayout
    first, finish = [0.0] * n, [0.0] * n
    row_of: dict[int, int] = {}  # live request -> its row
    done_steps: dict[int, int] = {}  # live request -> decode steps it has had
    free = list(range(rows - 1, -1, -1))
    context = np.zeros((1, rows), np.int64)  # each row's context at the next step; 0 = empty row
    t, q, done, steps = 0.0, 0, 0, 0
    last_bucket = -1

    def spend(dev: float, hst: float) -> float:
        """Clock after one graph call of ``dev`` device and ``hst`` host seconds, started at ``t``."""
        stall = opts.straggler_factor if opts.stragglers and stalls.random() < opts.straggler_rate else 1.0
        return t + (dev + hst * float(host.speed_factor(clock_s + t))) * stall * noise

    while done < n:
        # -- admission: free rows take the waiting requests, FIFO
        horizon, took = t, []
        while free and q < n and (max_prefills == 0 or len(took) < max_prefills) \
                and arr[order[q]] <= (t if eager and prefill == "sequential" else horizon):
            i = order[q]
            q += 1
            if not took:
                t += host.launch_s() * float(host.speed_factor(clock_s + t)) * noise
            took.append(i)
            if prefill == "sequential":
                b = ctx[bucket_index([lin[i]], ctx, policy)]
                t = spend(float(graphs.prefill_s([lin[i]], b)[0]), opts.host_overhead_s)
                first[i] = t
            if lout[i] == 1:
                first[i] = finish[i] = t
                done += 1
            else:
                row = free.pop()
                row_of[i], done_steps[i] = row, 0
                context[0, row] = lin[i] + 1
        if took and prefill == "batched":  # one call of shape (batch, bucket of the longest prompt)
            lengths = np.zeros(rows, np.int64)
            lengths[: len(took)] = [lin[i] for i in took]
            b = int(ctx[bucket_index([max(lengths)], ctx, policy)[0]])
            t = spend(graphs.batched_prefill_s(lengths, b), opts.host_overhead_s)
            for i in took:
                first[i] = t
                if lout[i] == 1:
                    finish[i] = t
        if not row_of:
            if q < n and arr[order[q]] > t:
                t = arr[order[q]]  # the device idles until the next arrival
            continue
        # -- one decode step of every row, in the bucket of the longest live context
        longest = int(context.max())
        bi = int(bucket_index([longest], tkg, policy)[0])
        dev = float(graphs.decode_s(context, tkg[bi:bi + 1])[0])
        hst = float(host.step_s(len(row_of)))
        if relayout and last_bucket >= 0 and bi != last_bucket:
            dev += float(graphs.relayout_s([tkg[last_bucket]])[0])
            hst += opts.host_overhead_s
        last_bucket = bi
        t = spend(dev, hst)
        steps += 1
        for i in list(row_of):
            done_steps[i] += 1
            row = row_of[i]
            if done_steps[i] == lout[i] - 1:
                finish[i] = t
                done += 1
                del row_of[i], done_steps[i]
                context[0, row] = 0
                free.append(row)
            else:
                context[0, row] += 1
    a = np.asarray(arr)
    return ServeTimes(ttft_s=np.asarray(first) - a, e2e_s=np.asarray(finish) - a, total_s=float(max(finish)),
                      steps=steps)
