"""Engine steps as per-request times: shared by the runners that drive a real LLM engine.

A request (l_in, l_out) yields exactly l_out tokens. In a static batch its TTFT is measured
from the start of its batch (the first request handed to the engine) to the return of the
step carrying its first token, its E2E to the step carrying its last; served by continuous
batching (``drive_arrivals``), both count from the request's arrival.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from lens.errors import RunnerError

from ._clock import wait_until


@dataclass(frozen=True, eq=False)
class TimedBatch:
    """Per-request times (seconds from the batch's start) of one batch, and its wall time."""

    ttft_s: np.ndarray
    e2e_s: np.ndarray
    wall_s: float
    #: how TTFT was obtained: "step" (the host clock when the step carrying the first token
    #: returned) or "batch-prefill" (an engine that returns every first token of a batch at once)
    ttft_source: str = "step"


@dataclass(frozen=True)
class StepObservation:
    """What one engine step says about one request."""

    request_id: str
    n_tokens: int  # tokens generated so far (cumulative)
    finished: bool


class RequestClock:
    """Turns step observations into per-request first-token and finish times.

    ``t0`` is the ``time.perf_counter`` value taken just before the first request was
    handed to the engine.  A request's first token is timed when the step that carries it
    returns (engines that keep their own first-token timestamps no longer expose them).
    """

    def __init__(self, request_ids: Sequence[str], output_lens: Sequence[int], *, t0: float):
        if len(request_ids) != len(output_lens):
            raise ValueError("one output length per request id")
        self.ids = list(request_ids)
        self.index = {rid: i for i, rid in enumerate(self.ids)}
        if len(self.index) != len(self.ids):
            raise ValueError("request ids must be unique")
        self.expected = np.asarray(output_lens, np.int64)
        self.t0 = t0
        n = len(self.ids)
        self.first = np.full(n, np.nan)
        self.done = np.full(n, np.nan)
        self.tokens = np.zeros(n, np.int64)

    def observe(self, now: float, observations: Iterable[StepObservation]) -> None:
        for ob in observations:
            i = self.index.get(ob.request_id)
            if i is None:
                raise RunnerError(f"the engine returned output for request {ob.request_id!r}, which this batch did not submit")
            if ob.n_tokens > 0 and np.isnan(self.first[i]):
                self.first[i] = now
            self.tokens[i] = max(self.tokens[i], int(ob.n_tokens))
            if ob.finished and np.isnan(self.done[i]):
                self.done[i] = now

    @property
    def pending(self) -> bool:
        return bool(np.isnan(self.done).any())

    def result(self) -> TimedBatch:
        unfinished = np.flatnonzero(np.isnan(self.done))
        if unfinished.size:
            raise RunnerError(f"the engine stopped with {unfinished.size} request(s) of the batch unfinished")
        wrong = np.flatnonzero(self.tokens != self.expected)
        if wrong.size:
            i = int(wrong[0])
            raise RunnerError(
                f"request {self.ids[i]} produced {self.tokens[i]} tokens, {self.expected[i]} were asked for: "
                f"the engine stopped early (end-of-sequence not ignored, or max_model_len too small)"
            )
        e2e = self.done - self.t0
        return TimedBatch(ttft_s=self.first - self.t0, e2e_s=e2e, wall_s=float(e2e.max()) if e2e.size else 0.0,
                          ttft_source="step")

    def served(self, arrival_s: Sequence[float]) -> TimedBatch:
        """The times of a served run whose ``t0`` is its origin: TTFT and E2E from each request's
        arrival (``arrival_s[i]`` seconds after ``t0``), the wall time from the first arrival to
        the last completion."""
        tb = self.result()
        arr = np.asarray(arrival_s, dtype=float)
        if arr.shape != tb.e2e_s.shape:
            raise ValueError("one arrival time per request id")
        wall = float(tb.e2e_s.max() - arr.min()) if arr.size else 0.0
        return TimedBatch(ttft_s=tb.ttft_s - arr, e2e_s=tb.e2e_s - arr, wall_s=wall, ttft_source="step")

    def first_token_steps(self) -> int:
        """In how many distinct engine steps the batch's first tokens came out."""
        seen = self.first[np.isfinite(self.first)]
        return int(np.unique(seen).size)


def drive_steps(
    step: Callable[[], Sequence[Any]],
    has_unfinished: Callable[[], bool],
    clock: RequestClock,
    adapt: Callable[[Any], StepObservation],
    *,
    now: Callable[[], float] = time.perf_counter,
    max_steps: int,
) -> None:
    """Call ``step`` until the engine has nothing left, feeding each step's outputs to ``clock``."""
    steps = 0
    while has_unfinished():
        outs = step()
        t = now()
        clock.observe(t, [adapt(o) for o in outs])
        steps += 1
        if steps > max_steps:
            raise RunnerError(f"the engine did not finish the batch within {max_steps} steps")


def drive_arrivals(
    add: Callable[[int], None],
    step: Callable[[], Sequence[Any]],
    has_unfinished: Callable[[], bool],
    clock: RequestClock,
    adapt: Callable[[Any], StepObservation],
    arrival_s: Sequence[float],
    *,
    now: Callable[[], float] = time.perf_counter,
    wait: Callable[[float], None] = wait_until,
    max_steps: int,
) -> None:
    """Serve requests released by the wall clock: ``add(i)`` hands request i to the engine once
    ``now()`` has passed ``clock.t0 + arrival_s[i]`` (in arrival order, ties in index order).

    Before every step the host hands over each request that has arrived, so a request that
    arrives during a step is in the engine's queue when its scheduler next looks, which is
    the machine's admission (docs/serving.md; the scheduler decides what it runs first).  An
    engine with nothing to do waits for the next release.  ``step`` blocks until its outputs
    are out (an engine core in this process), and each step's outputs go to ``clock`` at the
    moment it returns.
    """
    arr = np.asarray(arrival_s, dtype=float)
    order = np.argsort(arr, kind="stable").tolist()
    release = [clock.t0 + float(arr[i]) for i in order]
    n, qi, steps = len(order), 0, 0
    while qi < n or has_unfinished():
        t = now()
        while qi < n and release[qi] <= t:
            add(order[qi])
            qi += 1
        if not has_unfinished():
            if qi < n:
                wait(release[qi])
            continue
        outs = step()
        clock.observe(now(), [adapt(o) for o in outs])
        steps += 1
        if steps > max_steps:
            raise RunnerError(f"the engine did not finish the served requests within {max_steps} steps")


def times_from_steps(step_times: Sequence[float], t0: float, output_lens: Sequence[int], *, wall_s: float) -> TimedBatch:
    """Per-request times of a static batch whose engine reports one host time per generated token.

    ``step_times[k]`` is when the (k+1)-th token of every row was out (the batch decodes as
    one shape, so all rows advance together); request i ends at ``step_times[l_out_i - 1]``.
    Every first token comes out at once, after the whole batch's prefill.
    """
    lo = np.asarray(output_lens, np.int64)
    st = np.asarray(step_times, dtype=float)
    need = int(lo.max()) if lo.size else 0
    if st.size < need:
        raise RunnerError(f"the engine generated {st.size} tokens per row, {need} were asked for: it stopped early")
    if st.size and (np.diff(st) < 0).any():
        raise RunnerError("the engine's step times go backwards")
    if not lo.size:
        return TimedBatch(np.zeros(0), np.zeros(0), float(wall_s), "batch-prefill")
    rel = st - t0
    return TimedBatch(
        ttft_s=np.full(lo.size, rel[0]),
        e2e_s=rel[lo - 1],
        wall_s=float(wall_s),
        ttft_source="batch-prefill",
    )
