"""Continuous batching with arrivals, composed from the bucket profiles (docs/serving.md).

A unit compiled for batch B is B slots. Requests arrive into a FIFO queue; each iteration
admits waiting requests into free slots (their prompts prefilled one at a time, each
emitting its first token; with the target's ``prefill = "batched"``, those waiting when the
iteration begins in one call in the bucket of their longest prompt, every first token at
its end), then runs one decode step of the whole batch in the
token-generation bucket of the longest live context, at TBT_b whatever the number of live
slots, less the host's per-row work for the free ones (``UnitTable.row_s``, ``lens.rows``).
A slot frees when its request ends; an idle device waits for the next arrival. A pass's
first prompt costs TTFT_b + ``admit_first_s`` when the device waited idle for it, TTFT_b +
``admit_busy_s`` when the pass stops a running decode (or follows its end with a request
waiting), and each further one TTFT_b + ``admit_next_s`` (what the unit's server was measured
to cost against its static profile: ``lens.admission``).
On a unit whose decode kernel reads only the rows' own KV (``kv_token_s`` > 0,
``lens.context_cost``) a step costs TBT_b less what the probes' rows read, plus what the
live rows read at their contexts. The first decode run after a pass that leaves a live row
costs what resuming the decode after a prefill costs: after a pass that found the device
busy, the cost at the seconds of the pass's largest prefill (``lens.busy_resume``); after
one that found it idle, the cost at the idle spell before it (``lens.resume``), or the busy
one at its prefill when that is more (a cold host and a large prefill, neither measured with
the other: the larger counts). A unit without the busy measurement prices a busy pass at the
shortest measured spell, and one without spells ``resume_s`` after any pass.

With the unit's measured prefill tail (``lens.prefill_tail``) or decode pace
(``lens.decode_pace``) the machine runs again ``replicas(n)`` times, each prefill stretched by
its own draw from the tail and every decode run taking the wall time its run's pace path
gives it: a slow prefill delays the queue behind it and the decode of the live rows, a slow
spell of the host every row decoding in it, and the latencies are read over those runs
(``lens.serving_metrics``).

Between two events (an admission, a completion) the live set is fixed and the longest
context grows by one per step, so a run of k steps costs C(c + k) - C(c) with C the prefix
sum of TBT over contexts (and the live rows' contexts, a sum that grows by their number per
step, add an arithmetic series): the loop jumps from event to event (O(n log B) for n requests)
and never steps decode iterations one by one.
"""
from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from . import decode_pace, prefill_tail
from .buckets import select_index
from .compose import UnitTable, check_fit
from .decode_pace import Pace
from .errors import UserError
from .resume import after_idle, curve, split
from .types import Requests, Scheduler

#: slack when comparing the device clock with an arrival (the clock is a sum of floats)
_EPS = 1e-9


@dataclass(frozen=True, eq=False)
class TailRuns:
    """Each request's admission, first token and last token in the runs whose prefills a measured tail stretched
    (``lens.prefill_tail``) and whose decode a measured pace wandered (``lens.decode_pace``), one column per run:
    shape (requests, runs), seconds on the prediction's clock."""

    admit_s: np.ndarray
    first_s: np.ndarray
    finish_s: np.ndarray


@dataclass(frozen=True, eq=False)
class ServingPrediction:
    """Per-request times of one continuous-batching run (seconds on the run's clock)."""

    arrival_s: np.ndarray
    admit_s: np.ndarray  # start of the request's prefill
    first_s: np.ndarray  # its first token
    finish_s: np.ndarray  # its last token
    output_len: np.ndarray
    decode_steps: int
    busy_s: float  # device time spent prefilling and decoding
    prefill_padding: float
    decode_padding: float
    mode: str = "continuous"
    #: the runs with the measured prefill tail and decode pace: the latency percentiles are read over them
    #: (``lens.serving_metrics``); None (neither measured): over the times as composed
    tail_runs: TailRuns | None = None

    @property
    def ttft_s(self) -> np.ndarray:
        return self.first_s - self.arrival_s

    @property
    def e2e_s(self) -> np.ndarray:
        return self.finish_s - self.arrival_s

    @property
    def queue_s(self) -> np.ndarray:
        return self.admit_s - self.arrival_s

    @property
    def prefill_s(self) -> np.ndarray:
        """Each request's own prefill: its admission to its first token (a batched call's, for its rows)."""
        return self.first_s - self.admit_s

    @property
    def tpot_s(self) -> np.ndarray:
        steps = self.output_len - 1
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(steps > 0, (self.finish_s - self.first_s) / steps, np.nan)

    @property
    def total_s(self) -> float:
        """The run's duration: first arrival to last completion (vLLM's benchmark duration)."""
        return float(self.finish_s.max() - self.arrival_s.min())


def _context_prefix(table: UnitTable, values: np.ndarray) -> np.ndarray:
    """P[x] = sum of ``values`` (one per token-generation bucket) over contexts 1..x, x = 0..max."""
    top = int(table.tkg_hi[-1])
    per = np.zeros(top + 1, dtype=np.float64)
    idx = select_index(np.arange(1, top + 1), table.tkg_buckets, table.policy)
    per[1:] = np.where(idx >= 0, values[np.maximum(idx, 0)], 0.0)
    return np.cumsum(per)


def predict_serving(table: UnitTable, requests: Requests, *, scheduler: Scheduler = Scheduler(),
                    tail: bool = True) -> ServingPrediction:
    """Predict ``requests`` (with arrival times) served by continuous batching on ``table``'s unit.

    With the unit's measured prefill tail or decode pace (and ``tail``), the machine also runs
    ``prefill_tail.replicas(n)`` times with every prefill stretched by a draw from the tail and the decode along a
    path of the pace (``tail_runs``); the times as composed are the run without."""
    n = len(requests)
    if n == 0:
        raise UserError("the workload has no requests")
    if requests.arrival_s is None:
        raise UserError("continuous batching needs arrival times: give an arrival rate, or a trace with an "
                        "arrival column")
    arr = np.asarray(requests.arrival_s, dtype=np.float64)
    if arr.shape != (n,) or not np.isfinite(arr).all() or (arr < 0).any():
        raise UserError("arrival times must be one finite number >= 0 per request")
    check_fit(requests, table)
    lin, lout = requests.input_len, requests.output_len
    ci = select_index(lin, table.ctx_buckets, table.policy)
    kv, step_s, row_s = table.decode_costs()  # on a paged kernel a step costs what its live rows read
    cum = _context_prefix(table, step_s)
    order = np.argsort(arr, kind="stable")
    loop = partial(
        _event_loop, arr[order], lin[order], lout[order], ci[order], table.ttft_s, cum,
        _context_prefix(table, table.tkg_buckets.astype(float)),
        batch=table.batch, cap=scheduler.max_prefills, eager=scheduler.prefill_priority == "prefill",
        batched=table.prefill == "batched", row_s=row_s,
        admit=(table.admit_first_s, table.admit_next_s, table.admit_busy_s), kv=kv,
        resume=curve(table.resume_s, table.resume_idle), busy_resume=split(table.resume_busy),
    )
    start, first, finish, steps, busy, slot_tokens, calls = loop()
    out = [np.empty(n) for _ in range(3)]
    for dst, src in zip(out, (start, first, finish)):
        dst[order] = src
    tail_runs = None
    stretched, paced = len(table.prefill_tail) >= 2, len(table.decode_pace) >= 2
    if tail and (stretched or paced):
        runs = prefill_tail.replicas(n)
        stretch = prefill_tail.stretches(table.ttft_s[ci[order]], table.prefill_tail, table.prefill_tail_median_s,
                                         n=runs) if stretched else None
        # the paths reach past the composed run's end: a slow spell pushes it back (and past their end, they repeat)
        paths = decode_pace.paths(table.decode_pace, table.decode_pace_window_s, table.decode_pace_tau_s,
                                  2.0 * float(out[2].max()) + 1.0, runs) if paced else []
        tail_runs = TailRuns(*(np.empty((n, runs)) for _ in range(3)))
        for j in range(runs):
            times = loop(stretch=None if stretch is None else stretch[:, j].tolist(),
                         pace=paths[j] if paths else None)[:3]
            for dst, src in zip((tail_runs.admit_s, tail_runs.first_s, tail_runs.finish_s), times):
                dst[order, j] = src
    used_pre = float(lin.sum())
    # a batched call computes every row of its compiled shape; a sequential prefill one prompt
    slots_pre = float(table.ctx_buckets[calls].sum() * table.batch if table.prefill == "batched"
                      else table.ctx_buckets[ci].sum())
    dsteps = np.maximum(lout - 1, 0)
    useful_dec = float((dsteps * lin + dsteps * (dsteps + 1) // 2).sum())
    return ServingPrediction(
        arrival_s=arr, admit_s=out[0], first_s=out[1], finish_s=out[2], output_len=lout.copy(),
        decode_steps=steps, busy_s=busy,
        prefill_padding=1 - used_pre / slots_pre if slots_pre else 0.0,
        decode_padding=1 - useful_dec / slot_tokens if slot_tokens else 0.0,
        tail_runs=tail_runs,
    )


def predict_band(table: UnitTable, requests: Requests, *,
                 scheduler: Scheduler = Scheduler()) -> tuple[ServingPrediction, ServingPrediction]:
    """``predict_serving`` on the table one standard error below and above (every bucket's TTFT_b and TBT_b
    together, ``UnitTable.shifted``): what a band about the prediction is read from. Near the knee the queue
    makes a small change of the costs a large one of the latencies, and the band shows how large (a search's
    front reads its band the same way, with its sustainable rate bisected on each table: ``search.evaluate``)."""
    low, high = (predict_serving(table.shifted(s), requests, scheduler=scheduler) for s in (-1.0, 1.0))
    return low, high


def _event_loop(arr, lin, lout, ci, ttft, cum, cum_slots, *, batch: int, cap: int, eager: bool, batched: bool,
                row_s: float = 0.0, admit: tuple[float, float, float] = (0.0, 0.0, 0.0), kv: float = 0.0,
                resume: tuple[list[float], list[float]] = ([0.0], [0.0]),
                busy_resume: tuple[list[float], list[float]] = ([], []), stretch: list[float] | None = None,
                pace: Pace | None = None):
    """The machine of docs/serving.md over requests sorted by arrival (FIFO order).

    ``ci``: each request's context-encoding bucket index; ``ttft``: TTFT_b per bucket (one
    request's prefill, or with ``batched`` one call of the whole compiled batch); ``row_s``: the
    host's cost per live row of a step, counted in TBT_b, not paid for a free slot; ``admit``: seconds
    added to the first prompt of a pass that finds the device idle, to each further one, and to the first
    of a pass that does not (``lens.admission``; a batched pass is one call: a first only); ``kv``: seconds
    per context token of each live row per step (``lens.context_cost``; ``cum`` then holds TBT_b less the
    probes' reads, and ``row_s`` the host's part of the row cost); ``resume``: (idle spells, seconds) the first decode
    run after a pass costs beyond its steps by the idle spell before the pass (``lens.resume.curve``);
    ``busy_resume``: (passes' seconds, what each costs) by the pass's largest prefill (``lens.busy_resume``'s pairs
    split, interpolated as ``after_pass`` does; empty: a busy pass costs the shortest spell's); ``stretch``: per
    request, the fraction its prefill takes beyond TTFT_b (``lens.prefill_tail``; a batched call takes its first
    row's); ``pace``: the device's pace over the run's clock: a decode run (its resume cost included) takes the wall
    time in which the path does its composed seconds (``lens.decode_pace``).
    Returns per-request admission, first-token and last-token times, the number of decode
    steps, the busy seconds, the KV positions the decode steps computed (for padding) and
    the bucket index of every batched prefill call.
    """
    n = len(arr)
    arr_l, lin_l, lout_l, ci_l = arr.tolist(), lin.tolist(), lout.tolist(), ci.tolist()
    ttft_l = ttft.tolist()
    cum, cum_slots = cum.tolist(), cum_slots.tolist()  # (the same float64 sums: scalar reads of a list are cheaper)
    grow = stretch if stretch is not None else [0.0] * n
    pre_l = [ttft_l[c] * (1.0 + x) for c, x in zip(ci_l, grow)]
    calls: list[int] = []
    start, first, finish = [0.0] * n, [0.0] * n, [0.0] * n
    # a request admitted when G decode steps have run has context base + s at global step s
    # (base = l_in - G) and takes its last step at end = G + l_out - 1
    ends: list[tuple[int, int]] = []  # min-heap of (end step, request)
    bases: list[tuple[int, int]] = []  # max-heap of (-base, request); lazy deletion
    live = [False] * n
    t, g, qi, free, nlive, done = 0.0, 0, 0, batch, 0, 0
    sb = 0  # sum of the live requests' bases: their contexts at global step s sum to sb + nlive s
    busy = slot_tokens = 0.0
    pending = 0.0  # the resume cost the next decode run pays (a pass has stopped the decode since the last one)
    # the idle seconds the device has waited for an arrival since its last pass (0: none; a run starts idle)
    spell = math.inf

    def run_s(c: int, k: int, g: int, free: int, nlive: int, sb: int) -> float:
        """Seconds of k steps from global step g with a fixed live set (longest context c)."""
        reads = k * (sb + nlive * g) + nlive * k * (k + 1) // 2  # context tokens the live rows hold over them
        return cum[c + k] - cum[c] - k * free * row_s + kv * reads

    while done < n:
        # -- admission: free slots take waiting requests (FIFO)
        if free and qi < n and arr_l[qi] <= t + _EPS:
            horizon, took = t, []
            if batched:  # those waiting now, one row each of ONE call in the bucket of their longest prompt
                j = qi
                while j < n and j - qi < free and (cap == 0 or j - qi < cap) and arr_l[j] <= horizon + _EPS:
                    j += 1
                took, qi = list(range(qi, j)), j
                call = max(ci_l[i] for i in took)
                calls.append(call)
                call_s = ttft_l[call] * (1.0 + grow[took[0]])
                dt = max(call_s + admit[0 if spell else 2], 0.0)
                t += dt
                busy += dt
                for i in took:
                    start[i], first[i] = horizon, t
            else:  # prompts prefilled one at a time, each emitting its first token
                seats = free
                while seats and qi < n and (cap == 0 or len(took) < cap) \
                        and arr_l[qi] <= (t if eager else horizon) + _EPS:
                    i = qi
                    qi += 1
                    start[i] = t
                    dt = max(pre_l[i] + admit[1 if took else 0 if spell else 2], 0.0)
                    t += dt
                    busy += dt
                    first[i] = t
                    seats -= lout_l[i] > 1
                    took.append(i)
            for i in took:
                if lout_l[i] == 1:  # done at its first token; its slot is free again at once
                    finish[i] = first[i]
                    done += 1
                    continue
                free -= 1
                nlive += 1
                live[i] = True
                heapq.heappush(ends, (g + lout_l[i] - 1, i))
                heapq.heappush(bases, (g - lin_l[i], i))
                sb += lin_l[i] - g
            # the decode resumes after this pass (no live row: no decode, and it is dropped below)
            if busy_resume[0]:
                largest = call_s if batched else max(pre_l[i] for i in took)
                by_pass = after_idle(largest + admit[2], *busy_resume)
                pending = max(after_idle(spell, *resume), by_pass) if spell else by_pass
            else:
                pending = after_idle(spell, *resume)
            spell = 0.0
        if not nlive:
            pending = 0.0
            if qi < n and arr_l[qi] > t:
                if qi:  # (before the first pass the device has waited for as long as it likes)
                    spell = arr_l[qi] - t
                t = arr_l[qi]  # idle until the next arrival
            continue
        # -- a run of decode steps with a fixed live set, up to the next event
        while not live[bases[0][1]]:
            heapq.heappop(bases)
        c = g - bases[0][0]  # longest live context after g steps (the next step has c + 1)
        k = ends[0][0] - g  # steps until the next completion
        w0 = pace.work(t) if pace is not None else 0.0  # the composed seconds a paced device has done by now
        if free and qi < n:  # a free slot: the next admission is an event too
            # composed seconds until the arrival (a paced device does them in its own wall time)
            wait = (arr_l[qi] - t if pace is None else pace.work(arr_l[qi]) - w0) - pending
            if wait <= _EPS:
                k = 1
            elif kv:  # the steps' cost grows with their contexts: the fewest steps that reach the arrival
                lo_k, hi_k = 1, k
                while lo_k < hi_k:
                    mid = (lo_k + hi_k) // 2
                    if run_s(c, mid, g, free, nlive, sb) >= wait:
                        hi_k = mid
                    else:
                        lo_k = mid + 1
                k = lo_k
            else:
                # (steps made cheaper by the free slots' row cost take more of them to reach the
                # arrival: the next pass of the loop runs the rest)
                x = bisect_left(cum, cum[c] + wait)
                k = max(1, min(k, x - c))
        dt = (run_s(c, k, g, free, nlive, sb) if kv else cum[c + k] - cum[c] - k * free * row_s) + pending
        if pace is not None:
            dt = pace.wall(w0 + dt) - t
        pending = 0.0
        t += dt
        busy += dt
        slot_tokens += cum_slots[c + k] - cum_slots[c]
        g += k
        while ends and ends[0][0] == g:
            _, i = heapq.heappop(ends)
            finish[i] = t
            live[i] = False
            sb -= lin_l[i] - (g - (lout_l[i] - 1))
            free += 1
            nlive -= 1
            done += 1
    return start, first, finish, g, busy, slot_tokens * batch, np.asarray(calls, dtype=np.int64)
