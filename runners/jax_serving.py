"""Continuous batching on the jax runner: slots are KV-cache rows, requests released by the wall clock.

The machine of docs/serving.md, executed for real with the graphs the unit compiled for
static batches (so the profiles describe exactly what runs here):

- a prefill writes one request's prompt into a free row (the prefill graph traces the
  destination row) and puts its first token in that row of the token vector;
- a decode step runs the whole batch with per-row positions: the decode graph places row r
  at ``l_in[r] + step - 1`` while ``step <= last_step[r]``, so a request admitted after G
  steps gets ``l_in[r] = its prompt length - G`` and ``last_step[r] = G + l_out - 1``, and a
  free row (``last_step = 0``) rides along at position 0 of its own row. The host changes
  these two vectors only when a request is admitted;
- the step's token-generation bucket is the one of the longest live context.

Requests are released at ``t0 + arrival_s`` by ``time.perf_counter``; TTFT and E2E are
measured from each release. The host synchronises with the device after every prefill (the
first token), at every step where a request ends, and at every step while a free slot
waits for an arrival (so an admission happens at the first step boundary after its
arrival, not behind steps the host queued ahead); with every slot busy it queues steps
ahead like the static-batch runs the profiles come from.
"""
from __future__ import annotations

import gc
import heapq
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from lens.buckets import select, select_index

#: below this many seconds before a release the host spins instead of sleeping
_SPIN_S = 2e-3


@dataclass
class Served:
    """Per-request wall times of one continuous run, seconds from the run's origin."""

    admit_s: np.ndarray
    first_s: np.ndarray
    finish_s: np.ndarray
    decode_steps: int
    wall_s: float
    tokens: list[np.ndarray] | None = None  # greedy tokens per request, when recorded


def wait_until(deadline: float) -> None:
    """Sleep, then spin the last couple of milliseconds, until ``perf_counter() >= deadline``."""
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            return
        if left > _SPIN_S:
            time.sleep(left - _SPIN_S)


def serve(
    *,
    params: Any,
    state: Any,
    put,
    prompts: Sequence[Any],
    input_len: np.ndarray,
    output_len: np.ndarray,
    arrival_s: np.ndarray,
    ctx: Sequence[int],
    tkg: Sequence[int],
    policy: str,
    max_prefills: int = 0,
    eager: bool = True,
    record: bool = False,
) -> Served:
    """Serve the requests on a unit's compiled graphs (``state``: the runner's unit state).

    ``prompts[i]`` is request i's prompt already on the device, padded to its bucket;
    ``put`` places a host array on the device (replicated).
    """
    n = len(input_len)
    B = state.batch
    lin = [int(x) for x in input_len]
    lout = [int(x) for x in output_len]
    arr = np.asarray(arrival_s, dtype=np.float64)
    order = np.argsort(arr, kind="stable").tolist()
    arr_sorted = arr[order].tolist()
    pre_graph = [state.graphs[("prefill", select(lin[i], ctx, policy))] for i in range(n)]
    lens_dev = [put(np.int32(lin[i])) for i in range(n)]
    rows_dev = [put(np.int32(r)) for r in range(B)]
    tkg_arr = np.asarray(tkg, np.int64)
    dec_graph = [state.graphs[("decode", b)] for b in tkg]
    # the decode bucket of every possible longest context, looked up per step
    top = int(tkg[-1])
    bucket_of = select_index(np.arange(top + 2), tkg_arr, policy).tolist()

    admit, first, finish = np.zeros(n), np.zeros(n), np.zeros(n)
    l_eff = np.ones(B, np.int32)  # l_in - G at admission; free rows: anything (inactive)
    last = np.zeros(B, np.int32)  # the global step of a row's last token; 0 = free
    free = list(range(B - 1, -1, -1))
    row_req = [-1] * B
    ends: list[tuple[int, int]] = []  # (last step, row)
    bases: list[tuple[int, int]] = []  # (-(l_in - G), row), lazy: stale when row_req changed
    rec_first: dict[int, Any] = {}  # request -> token vector after its prefill
    rec_steps: list[Any] = []  # token vector after each decode step
    placed: dict[int, tuple[int, int]] = {}  # request -> (row, decode steps done at its admission)
    g = qi = done = 0
    tok, ck, cv = state.tokens0, state.ck, state.cv
    state.ck = state.cv = None  # donated below; never reuse a donated buffer
    step = state.step1
    l_dev = last_dev = None
    dirty = True
    gc_was_on = gc.isenabled()
    gc.disable()  # a collection inside the timed loop is host noise, not device time
    t0 = time.perf_counter()
    try:
        while done < n:
            now = time.perf_counter() - t0
            if free and qi < n and arr_sorted[qi] <= now:
                horizon, k = now, 0
                while free and qi < n and (max_prefills == 0 or k < max_prefills) \
                        and arr_sorted[qi] <= (now if eager else horizon):
                    i = order[qi]
                    qi += 1
                    k += 1
                    row = free.pop()
                    admit[i] = now
                    tok, ck, cv = pre_graph[i](params, ck, cv, tok, prompts[i], lens_dev[i], rows_dev[row])
                    tok.block_until_ready()
                    now = time.perf_counter() - t0
                    first[i] = now
                    if record:
                        rec_first[i] = tok
                        placed[i] = (row, g)
                    if lout[i] == 1:
                        finish[i] = now
                        free.append(row)
                        done += 1
                        continue
                    row_req[row] = i
                    l_eff[row] = lin[i] - g
                    last[row] = g + lout[i] - 1
                    heapq.heappush(ends, (g + lout[i] - 1, row))
                    heapq.heappush(bases, (g - lin[i], row))
                    dirty = True
            if len(free) == B:  # nothing live: wait for the next release
                if qi < n:
                    wait_until(t0 + arr_sorted[qi])
                continue
            if dirty:
                l_dev, last_dev = put(l_eff.copy()), put(last.copy())
                dirty = False
            while row_req[bases[0][1]] < 0 or bases[0][0] != -int(l_eff[bases[0][1]]):
                heapq.heappop(bases)  # stale: its row was freed (or holds another request since)
            longest = g + 1 - bases[0][0]  # context of the longest live request at step g + 1
            tok, ck, cv, step = dec_graph[bucket_of[longest]](params, ck, cv, tok, l_dev, last_dev, step)
            g += 1
            if record:
                rec_steps.append(tok)
            if ends[0][0] == g:
                tok.block_until_ready()
                now = time.perf_counter() - t0
                while ends and ends[0][0] == g:
                    _, row = heapq.heappop(ends)
                    finish[row_req[row]] = now
                    row_req[row] = -1
                    free.append(row)
                    done += 1
            elif free and qi < n:
                tok.block_until_ready()  # keep the host at the device's step boundary while a slot waits
        wall = time.perf_counter() - t0
    finally:
        state.ck, state.cv = ck, cv
        if gc_was_on:
            gc.enable()
    tokens = _tokens(rec_first, rec_steps, placed, lout) if record else None
    return Served(admit, first, finish, g, wall, tokens)


def _tokens(rec_first, rec_steps, placed, lout) -> list[np.ndarray]:
    """Each request's greedy tokens: its row after its prefill, then after each of its decode steps."""
    steps = [np.asarray(t) for t in rec_steps]
    out = []
    for i in range(len(lout)):
        row, g0 = placed[i]
        seq = [int(np.asarray(rec_first[i])[row])] + [int(steps[g0 + k][row]) for k in range(lout[i] - 1)]
        out.append(np.asarray(seq, np.int64))
    return out
