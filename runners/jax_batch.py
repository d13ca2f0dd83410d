"""One static batch on the jax runner: its plan on the device, and its timed execution.

Imported by ``runners.jax_runner`` after it has set up the host's devices (``XLA_FLAGS``).

A batch's prompts are encoded as the target's ``prefill`` says (the estimator composes the
same machine, ``lens.compose``):

- ``sequential``: one request after the other, each by the prefill graph of its own
  context-encoding bucket (batch 1, the destination row traced); request i's first token
  is out when its own prefill ends;
- ``batched``: all of them by ONE call of the batched prefill graph in the bucket of the
  batch's longest prompt (shape (batch, bucket), the padding rows of a short batch
  included); every first token is out when that call ends.

Then the batch decodes as one shape: step k runs in sel(max l_in_i + k over the requests
still generating at step k); finished and empty rows ride along as padding and never
choose the bucket.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import numpy as np

from lens.buckets import select, select_index
from lens.errors import UserError

#: the prefill graph kind of each prefill mode (``Target.prefill``)
PREFILL_GRAPH = {"sequential": "prefill", "batched": "prefill-batched"}


def decode_buckets(input_len, output_len, tkg_buckets: Sequence[int], policy: str) -> np.ndarray:
    """The token-generation bucket of every decode step of one static batch.

    Step k (1 <= k < max output_len) runs in sel(max l_in_i + k over the requests with
    k <= output_len_i - 1): requests that have finished, like empty rows, ride along as
    padding and do not choose the bucket.  Returns an int array of length
    ``max(output_len) - 1``; ``UserError`` if a step's context fits no bucket.
    """
    l_in = np.asarray(input_len, np.int64)
    last = np.asarray(output_len, np.int64) - 1
    kmax = int(last.max()) if last.size else 0
    if kmax <= 0:
        return np.zeros(0, np.int64)
    k = np.arange(1, kmax + 1)
    live = k[:, None] <= last[None, :]  # [K, n]
    cmax = np.where(live, l_in[None, :] + k[:, None], 0).max(axis=1)
    idx = select_index(cmax, tkg_buckets, policy)
    if (idx < 0).any():
        bad = int(np.argmax(idx < 0))
        raise UserError(
            f"decode step {bad + 1} reaches context {int(cmax[bad])}, which fits no token-generation bucket "
            f"{list(tkg_buckets)} under the {policy} policy"
        )
    return np.asarray(tkg_buckets, np.int64)[idx]


@dataclass
class Batch:
    """One static batch, prepared on the device before its clock starts."""

    prefills: list  # (graph, device arguments, indices of the requests whose first token it yields)
    steps: list  # (graph, request indices finishing at this step) per decode step
    l_in: Any
    last_step: Any
    n: int  # real requests
    out_len: np.ndarray
    graph_set: tuple  # (prefill buckets, decode buckets) this batch executes


def prepare(st, put: Callable, prompts: Sequence[np.ndarray], out_len: Sequence[int], ctx: Sequence[int],
            tkg: Sequence[int], *, policy: str, prefill: str) -> Batch:
    """Device inputs and the step plan of one batch (validated by the caller) on unit ``st``."""
    n = len(prompts)
    l_in = np.array([len(p) for p in prompts], np.int64)
    lo = np.asarray(out_len, np.int64)
    kind = PREFILL_GRAPH[prefill]
    prefills = []
    if prefill == "batched":
        b = select(int(l_in.max()), ctx, policy)
        padded = np.zeros((st.batch, b), np.int32)
        lengths = np.zeros(st.batch, np.int32)  # padding rows: length 0
        for r, p in enumerate(prompts):
            padded[r, : len(p)] = p
            lengths[r] = len(p)
        prefills.append((st.graphs[(kind, b)], (put(padded), put(lengths)), list(range(n))))
        pre_b = [b]
    else:
        pre_b = []
        for r, p in enumerate(prompts):
            b = select(len(p), ctx, policy)
            pre_b.append(b)
            padded = np.zeros((1, b), np.int32)
            padded[0, : len(p)] = p
            prefills.append((st.graphs[(kind, b)], (put(padded), put(np.int32(len(p))), put(np.int32(r))), [r]))
    last = lo - 1  # decode steps per request
    dec_b = decode_buckets(l_in, lo, tkg, policy).tolist()
    steps = []
    for j, b in enumerate(dec_b):
        fin = np.nonzero(last == j + 1)[0]
        steps.append((st.graphs[("decode", b)], fin if len(fin) else None))
    pad_l = np.ones(st.batch, np.int32)
    pad_l[:n] = l_in
    pad_last = np.zeros(st.batch, np.int32)  # empty rows never generate
    pad_last[:n] = last
    return Batch(prefills, steps, put(pad_l), put(pad_last), n, lo,
                 (tuple(sorted(set(pre_b))), tuple(sorted(set(dec_b)))))


def execute(st, params, bt: Batch, *, record: bool = False):
    """Execute one prepared batch; returns (ttft, e2e, wall seconds, tokens or None).

    Synchronises only after each prefill call (TTFT) and at steps where a request ends.
    """
    ttft = np.zeros(bt.n)
    e2e = np.zeros(bt.n)
    outs = [] if record else None
    tok = st.tokens0
    ck, cv = st.ck, st.cv
    st.ck = st.cv = None  # donated below; never reuse a donated buffer
    gc_was_on = gc.isenabled()
    gc.disable()  # a collection inside the timed loop is host noise, not device time
    t0 = time.perf_counter()
    try:
        for g, args, rows in bt.prefills:
            tok, ck, cv = g(params, ck, cv, tok, *args)
            tok.block_until_ready()
            ttft[rows] = time.perf_counter() - t0
            if record:
                outs.append(tok)
        e2e[:] = ttft
        step = st.step1
        for g, fin in bt.steps:
            tok, ck, cv, step = g(params, ck, cv, tok, bt.l_in, bt.last_step, step)
            if record:
                outs.append(tok)
            if fin is not None:
                tok.block_until_ready()
                e2e[fin] = time.perf_counter() - t0
        wall = time.perf_counter() - t0
    finally:
        st.ck, st.cv = ck, cv
        if gc_was_on:
            gc.enable()
    tokens = None
    if record:
        host = [np.asarray(o) for o in outs]
        first = {r: i for i, (_, _, rows) in enumerate(bt.prefills) for r in rows}  # the call of r's first token
        dec0 = len(bt.prefills)
        tokens = []
        for r in range(bt.n):
            seq = [int(host[first[r]][r])] + [int(host[dec0 + j][r]) for j in range(int(bt.out_len[r]) - 1)]
            tokens.append(np.asarray(seq, np.int64))
    return ttft, e2e, wall, tokens


def warm(st, params, put: Callable, ctx: Sequence[int], tkg: Sequence[int], times: int, *, prefill: str) -> None:
    """Execute every listed graph of unit ``st`` ``times`` times on dummy inputs (results discarded)."""
    if times <= 0:
        return
    kind = PREFILL_GRAPH[prefill]
    one, zero = put(np.int32(1)), put(np.int32(0))
    ones = put(np.ones(st.batch, np.int32))
    ck, cv = st.ck, st.cv
    st.ck = st.cv = None
    tok = st.tokens0
    try:
        for _ in range(times):
            for b in ctx:
                if prefill == "batched":
                    args = (put(np.zeros((st.batch, b), np.int32)), ones)
                else:
                    args = (put(np.zeros((1, b), np.int32)), one, zero)
                tok, ck, cv = st.graphs[(kind, b)](params, ck, cv, tok, *args)
            for b in tkg:
                tok, ck, cv, _ = st.graphs[("decode", b)](params, ck, cv, tok, ones, ones, st.step1)
        jax.block_until_ready((tok, ck, cv))
    finally:
        st.ck, st.cv = ck, cv
