"""Measuring what a unit's host and server cost beyond its profiles (steps 6-12 of ``search.measure``).

Each ``measure_*`` runs its workloads on the unit's runner after the probes, solves them with
its ``lens`` module and returns the cost with its (compile, run) seconds. A runner that fails
one leaves the profiles as they stand, with the reason in the cost's note (``NOT_MEASURED``).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from lens import admission as admission_cost
from lens import busy_resume
from lens import context_cost
from lens import decode_pace
from lens import prefill_tail
from lens import resume as resume_cost
from lens import rows as row_cost
from lens.buckets import select_index
from lens.errors import RunnerError, UserError, one_line
from lens.types import BucketProfile, Candidate, Requests, Target, WorkloadRun
from runners import Runner

#: how the note of a host cost whose workload the runner failed begins (the profiles stand without it)
NOT_MEASURED = "not measured"


def _not_measured(exc: BaseException) -> str:
    """The note of a host cost whose workload failed with ``exc``."""
    return f"{NOT_MEASURED} ({one_line(exc)})"


def measure_row_cost(runner: Runner, target: Target, tp: int, batch: int, p: BucketProfile,
                     buckets: Sequence[int]) -> tuple[row_cost.RowCost | None, tuple[float, float]]:
    """The unit's row cost measured in bucket ``p`` (lens.rows), and its (compile, run) seconds.

    ``buckets``: those the unit was just profiled with, so that the workload runs on what the
    probes ran on (a vLLM engine is sized by its largest bucket: another set starts another).
    None (nothing measured) for a batch of one, a ragged-batching target (each request pays its
    own share of a step already: not the static batch the cost is composed into) or a bucket
    whose window has no decode step.
    """
    if batch < 2 or target.batching != "static" or row_cost.steps_for(p) < 1:
        return None, (0.0, 0.0)
    try:
        bk = tuple(sorted(buckets))
        run = runner.run_workload(Candidate(tp, batch, bk, bk), row_cost.workload(p, batch))
    except RunnerError as exc:  # the profiles stand without it
        return row_cost.RowCost(0.0, 0.0, 0.0, _not_measured(exc)), (0.0, 0.0)
    full, one = row_cost.decode_times(run.ttft_s, run.e2e_s, batch)
    return row_cost.solve(full, one, p=p, batch=batch), (run.compile_s, run.run_s)


def measure_admission(runner: Runner, target: Target, tp: int, batch: int, profiles: dict[int, BucketProfile],
                      buckets: Sequence[int]) -> tuple[admission_cost.AdmissionCost | None, tuple[float, float]]:
    """What the unit's server costs per admission against TTFT_b, measured in the smallest bucket of ``profiles``
    (lens.admission; a busy pass's carriers decode in the smallest window that holds one with a lone arrival), and
    its (compile, run) seconds.

    None (nothing measured) for a ragged-batching target or a runner that does not serve
    continuous mode: its units are never served here, and a prediction of continuous serving
    from their profiles composes TTFT_b as it is. A runner that fails it (or refuses the
    target's settings for serving) leaves 0, with the reason in the note.
    """
    if target.batching != "static" or "continuous" not in runner.modes:
        return None, (0.0, 0.0)
    p = profiles[min(profiles)]
    m = admission_cost.burst_size(batch, max_prefills=target.scheduler.max_prefills, prefill=target.prefill)
    bk = tuple(sorted(buckets))
    cand = Candidate(tp, batch, bk, bk)
    busy = admission_cost.busy_plan(p, profiles, bk, target.bucket_policy, batch=batch)
    rounds, spent, notes = [], [0.0, 0.0], []

    def timed(requests, mode="static"):
        run = runner.run_workload(cand, requests, mode=mode)
        spent[0] += run.compile_s
        spent[1] += run.run_s
        return run

    def run_rounds(n: int) -> None:
        nonlocal busy
        for _ in range(n):
            static = timed(admission_cost.static_workload(p, batch))
            served = timed(admission_cost.served_workload(p, m), "continuous")
            times = (admission_cost.static_times(static.e2e_s, batch, target.prefill, p=p),
                     *admission_cost.burst_times(served.ttft_s, m))
            if busy is not None:
                try:
                    times += (admission_cost.busy_times(timed(busy.requests, "continuous").ttft_s, busy),)
                except (RunnerError, UserError) as exc:  # the idle offsets stand without it: one for both passes
                    busy = None
                    notes.append(f"a pass during a decode not measured ({one_line(exc)})")
            rounds.append(times)

    try:
        run_rounds(admission_cost.ROUNDS)
        # a round without busy times leaves the busy offset unmeasured (solve: the idle one prices both)
        cost = admission_cost.solve(rounds, p=p, burst=m)
    except (RunnerError, UserError) as exc:  # the profiles stand without it
        return admission_cost.AdmissionCost(0.0, 0.0, burst=m, note=_not_measured(exc)), tuple(spent)
    if admission_cost.undecided(cost):
        first = len(rounds)
        try:
            run_rounds(admission_cost.MORE_ROUNDS)
            notes.append(f"{len(rounds)} rounds (an offset was undecided after {first})")
        except (RunnerError, UserError) as exc:  # the first rounds' offsets stand
            del rounds[first:]
            notes.append(f"the rounds run again for an undecided offset failed ({one_line(exc)})")
        cost = admission_cost.solve(rounds, p=p, burst=m)
    return dataclasses.replace(cost, note="; ".join(x for x in (cost.note, *notes) if x)), tuple(spent)


def measure_context_cost(runner: Runner, target: Target, tp: int, batch: int, profiles: dict[int, BucketProfile],
                         buckets: Sequence[int]) -> tuple[context_cost.ContextCost | None, tuple[float, float]]:
    """What a live row's context costs a decode step (lens.context_cost), measured in the widest window of the
    unit's measured buckets, and its (compile, run) seconds.

    None (nothing measured) where ``measure_admission`` measures nothing (only served steps compose it) or no
    window spans ``context_cost.MIN_SPAN`` tokens. A runner that fails it leaves 0, with the reason in the note.
    """
    if target.batching != "static" or "continuous" not in runner.modes:
        return None, (0.0, 0.0)
    bk = tuple(sorted(buckets))
    chosen = context_cost.pick(profiles, bk, target.bucket_policy)
    if chosen is None:
        return None, (0.0, 0.0)
    p, short, long_ = chosen
    try:
        run = runner.run_workload(Candidate(tp, batch, bk, bk), context_cost.workload(short, long_, batch))
    except (RunnerError, UserError) as exc:  # the profiles stand without it
        return (context_cost.ContextCost(0.0, 0.0, 0.0, p.bucket, short, long_, _not_measured(exc)),
                (0.0, 0.0))
    return (context_cost.solve(run.ttft_s, run.e2e_s, p=p, short=short, long_=long_, batch=batch),
            (run.compile_s, run.run_s))


def _served_continuously(runner: Runner, target: Target) -> bool:
    """Whether the unit's target is served continuously by a runner that serves it (static batches only): the
    measurements only such a target's serving uses run for it alone."""
    return target.batching == "static" and "continuous" in runner.modes and target.serving == "continuous"


def measure_resume(runner: Runner, target: Target, tp: int, batch: int, profiles: dict[int, BucketProfile],
                   buckets: Sequence[int]) -> tuple[resume_cost.ResumeCost | None, tuple[float, float]]:
    """What a decode run costs after a served admission beyond its steps (lens.resume), measured in the smallest
    token-generation bucket that holds its requests, and its (compile, run) seconds.

    None (nothing measured) where ``measure_admission`` measures nothing (only served runs compose it), for a
    target that is not served continuously (its lone requests run one after another, each finding the device
    idle: on the simulated fleet at batch 2 that costs about as much device time as the buckets' probes, which
    a static search would pay for nothing) or where no bucket's window holds ``resume_cost.LONG`` decode steps.
    A runner that fails it leaves 0, with the reason.
    """
    if not _served_continuously(runner, target):
        return None, (0.0, 0.0)
    bk = tuple(sorted(buckets))
    chosen = resume_cost.pick(profiles, bk, target.bucket_policy)
    if chosen is None:
        return None, (0.0, 0.0)
    p, prompt = chosen
    ctx = profiles[bk[int(select_index([prompt], bk, target.bucket_policy)[0])]]
    cand = Candidate(tp, batch, bk, bk)
    rounds, spent = [], [0.0, 0.0]
    try:
        for _ in range(resume_cost.ROUNDS):
            lone = resume_cost.workload(prompt, ttft_s=ctx.ttft_s, tbt_s=p.tbt_s)
            run = runner.run_workload(cand, lone, mode="continuous")
            spent[0] += run.compile_s
            spent[1] += run.run_s
            rounds.append(resume_cost.lone_runs(lone, run.ttft_s, run.e2e_s))
    except (RunnerError, UserError) as exc:  # the profiles stand without it
        return (resume_cost.ResumeCost(0.0, 0.0, 0.0, p.bucket, prompt, note=_not_measured(exc)),
                tuple(spent))
    return resume_cost.solve(rounds, p=p, prompt=prompt), tuple(spent)


def measure_busy_resume(runner: Runner, target: Target, tp: int, batch: int, profiles: dict[int, BucketProfile],
                        buckets: Sequence[int]) -> tuple[busy_resume.BusyResume | None, tuple[float, float]]:
    """What a served pass that stops a running decode costs the decode after it, by its prefill
    (lens.busy_resume), measured with carriers in the smallest token-generation window that holds them, and its
    (compile, run) seconds.

    None (nothing measured) where ``measure_resume`` measures nothing, for a batch of one (no slot is free while
    a carrier decodes) or where no window holds a carrier. A runner that fails it leaves none (the shortest idle
    spell's cost prices such a pass), with the reason.
    """
    if not _served_continuously(runner, target):
        return None, (0.0, 0.0)
    bk = tuple(sorted(buckets))
    plan = busy_resume.plan(profiles, bk, target.bucket_policy, batch=batch)
    if plan is None:
        return None, (0.0, 0.0)
    cand = Candidate(tp, batch, bk, bk)
    rounds, spent = [], [0.0, 0.0]
    try:
        for _ in range(busy_resume.ROUNDS):
            run = runner.run_workload(cand, plan.requests, mode="continuous")
            spent[0] += run.compile_s
            spent[1] += run.run_s
            rounds.append(busy_resume.read(plan, run.ttft_s, run.e2e_s))
    except (RunnerError, UserError) as exc:  # the profiles stand without it
        return busy_resume.BusyResume(bucket=plan.bucket, note=_not_measured(exc)), tuple(spent)
    return busy_resume.solve(rounds, plan), tuple(spent)


def _lone_prompt(runner: Runner, target: Target, profiles: dict[int, BucketProfile],
                 buckets: Sequence[int]) -> tuple[BucketProfile, tuple[int, ...]] | None:
    """The profile whose prompt a served measurement of lone requests takes (the smallest measured bucket's,
    ``lens.prefill_tail.pick``) and the sorted buckets; None where it is not run (as ``measure_resume``)."""
    if not _served_continuously(runner, target):
        return None
    want = set(buckets)
    measured = {b: p for b, p in profiles.items() if b in want}
    return (prefill_tail.pick(measured), tuple(sorted(buckets))) if measured else None


def _served_calls(runner: Runner, cand: Candidate, req: Requests,
                  rounds: int) -> tuple[list[WorkloadRun], tuple[float, float], BaseException | None]:
    """``rounds`` served calls of ``req``, their (compile, run) seconds, and the runner's error that stopped them
    (None: all ran)."""
    runs, spent = [], [0.0, 0.0]
    try:
        for _ in range(rounds):
            run = runner.run_workload(cand, req, mode="continuous")
            spent[0] += run.compile_s
            spent[1] += run.run_s
            runs.append(run)
    except (RunnerError, UserError) as exc:
        return runs, (spent[0], spent[1]), exc
    return runs, (spent[0], spent[1]), None


def measure_prefill_tail(runner: Runner, target: Target, tp: int, batch: int, profiles: dict[int, BucketProfile],
                         buckets: Sequence[int]) -> tuple[prefill_tail.PrefillTail | None, tuple[float, float]]:
    """How far a lone served prompt's TTFT strays from its median (lens.prefill_tail), in the smallest measured
    bucket, and its (compile, run) seconds.

    None (nothing measured) where ``measure_resume`` measures nothing. A runner that fails it leaves none (the
    percentiles are read over the times as composed), with the reason.
    """
    lone = _lone_prompt(runner, target, profiles, buckets)
    if lone is None:
        return None, (0.0, 0.0)
    p, bk = lone
    req = prefill_tail.workload(p)
    runs, spent, exc = _served_calls(runner, Candidate(tp, batch, bk, bk), req, prefill_tail.ROUNDS)
    if exc is not None:  # the profiles stand without it
        return prefill_tail.PrefillTail(bucket=p.bucket, note=_not_measured(exc)), spent
    return prefill_tail.solve([prefill_tail.read(req, r.ttft_s) for r in runs], p=p,
                              medians=[float(np.median(r.ttft_s)) for r in runs]), spent


def measure_decode_pace(runner: Runner, target: Target, tp: int, batch: int, profiles: dict[int, BucketProfile],
                        buckets: Sequence[int]) -> tuple[decode_pace.DecodePace | None, tuple[float, float]]:
    """How a lone served decode's pace wanders (lens.decode_pace), its requests with the smallest measured
    bucket's prompt, and its (compile, run) seconds.

    None (nothing measured) where ``measure_resume`` measures nothing, or where no bucket holds the prompt and
    ``decode_pace.FEWEST`` steps after it. A runner that fails it leaves none (every decode step at its composed
    time), with the reason.
    """
    lone = _lone_prompt(runner, target, profiles, buckets)
    if lone is None or (steps := decode_pace.steps_for(lone[0], lone[1])) is None:
        return None, (0.0, 0.0)
    p, bk = lone
    req = decode_pace.workload(p, steps=steps)
    runs, spent, exc = _served_calls(runner, Candidate(tp, batch, bk, bk), req, decode_pace.ROUNDS)
    if exc is not None:  # the profiles stand without it
        return decode_pace.DecodePace(bucket=p.bucket, note=_not_measured(exc)), spent
    return decode_pace.solve([decode_pace.read(req, r.ttft_s, r.e2e_s) for r in runs], p=p), spent
