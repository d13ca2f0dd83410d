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
measured from each release. The host waits for the device after every prefill (the first
token) and at every step where a request ends. Otherwise it queues decode steps ahead of
the device, as the static-batch runs the profiles come from do (waiting on every step
costs about 8% per step on a busy 2-core host), except when a free slot may take an
arrival before the next step would end: then it waits, so the admission lands on the first
step boundary after the arrival instead of behind steps queued ahead. Where the device is
is estimated from the last wait and a running mean of the step time.
"""
from __future__ import annotations

import gc
import heapq
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from lens.buckets import select, select_index

from ._clock import wait_until

#: most decode steps the host queues ahead of the device while a slot waits for an arrival
_MAX_AHEAD = 8


@dataclass
class Served:
    """Per-request wall times of one continuous run, seconds from the run's origin."""

    admit_s: np.ndarray
    first_s: np.ndarray
    finish_s: np.ndarray
    decode_steps: int
    wall_s: float
    tokens: list[np.ndarray] | None = None  # greedy tokens per request, when recorded


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
    queued = 0  # decode steps dispatched since the host last waited for the device
    t_sync = 0.0  # when it last did (seconds from t0)
    step_s = 0.0  # recent device seconds per decode step (0: not known yet)
    gc_was_on = gc.isenabled()
    gc.disable()  # a collection inside the timed loop is host noise, not device time
    t0 = time.perf_counter()
    try:
        while done < n:
            if queued and free and qi < n and arr_sorted[qi] <= time.perf_counter() - t0:
                tok.block_until_ready()  # never queue a prefill behind steps the device has not run
                t_sync, queued = time.perf_counter() - t0, 0
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
                    t_sync = first[i] = now
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
            queued += 1
            if record:
                rec_steps.append(tok)
            finishing = ends[0][0] == g
            # Wait for the device only when it matters: a request ends (its E2E), or a free slot
            # may take an arrival before the next step would end (the step is then not queued
            # ahead, so the admission lands on the first boundary after the arrival). Otherwise
            # the host queues steps ahead, as in the static-batch runs the profiles come from.
            due = free and qi < n and (not step_s or queued >= _MAX_AHEAD
                                       or arr_sorted[qi] <= t_sync + (queued + 1.5) * step_s)
            if finishing or due:
                tok.block_until_ready()
                now = time.perf_counter() - t0
                sample = (now - t_sync) / queued
                step_s = sample if not step_s else 0.7 * step_s + 0.3 * sample
                t_sync, queued = now, 0
            while ends and ends[0][0] == g:
                _, row = heapq.heappop(ends)
                finish[row_req[row]] = now
                row_req[row] = -1
                free.append(row)
                done += 1
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
