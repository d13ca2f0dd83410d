"""Measuring one unit: plan the probes, run them, judge the derived values, measure again where needed.

``measure_unit`` runs where the hardware is (in-process for the CLI, inside a Ray task
for the search); the caller stores what it returns, whole, in one transaction.

1. Two probes per bucket (``lens.probes.plan_probes``), ``profile.repeats`` repeats each,
   taken round-robin over the buckets by the runner.
2. Every bucket is judged by the spread of what is derived from its runs -- TTFT_b and
   TBT_b, bootstrapped over the repeats through the unit's estimator (``lens.probes.fit``)
   -- not by the spread of the raw times: T2 - T1 can be small against T1, and 8% on T1
   is then 50% on the slope.
3. A bucket whose derived values spread more than ``profile.max_spread`` is measured
   again, interleaved with the other such buckets: when its slope is the problem and its
   window leaves room, the long run grows (``sized_l2``) so that (L2 - L1) TBT_b is a
   healthy multiple of the noise of T1; otherwise both probes get as many repeats again,
   pooled with the earlier ones. Up to ``profile.attempts`` measurements in all.
4. The staircase has a shape: within a unit a bigger bucket costs at least about what a
   smaller one does. A bucket that breaks it by more than its own noise (and more than a
   compiler quirk's few percent) is measured once more; what it then shows is kept, never
   "fixed" (compilers do have quirks).
5. A bucket that stays impossible to solve fails the unit (``NoisyMeasurement``: never a
   negative TBT_b stored); one that stays noisy is kept with ``accepted = False`` and
   its spreads, so that predictions from it carry a wide interval.
6. The host's cost per live row of a decode step (``lens.rows``): one workload of pairs of
   a full and a one-row batch in the smallest bucket measured; kept in every profile of the
   measurement (``row_s``). A runner that cannot run it leaves 0, with the reason in the
   cost's note (``UnitMeasurement.rows``).
7. What the unit's server costs per admission against TTFT_b (``lens.admission``): rounds of
   a static call and a served call of one-token requests in the same bucket, and a served call
   of one-token requests arriving while a carrier request decodes; kept in every profile
   (``admit_first_s``, ``admit_next_s``, ``admit_busy_s``). Only for a runner that serves continuous
   mode; one that cannot leaves 0, with the reason (``UnitMeasurement.admission``).
8. What a live row's context costs a decode step (``lens.context_cost``): pairs of full
   batches at the shortest and the longest prompt of the widest token-generation window;
   kept in every profile (``kv_token_s``, with the row cost's measured context,
   ``row_context``). Only where the unit may be served continuously, as 7.
9. What a decode run costs after a served admission beyond its steps (``lens.resume``):
   served calls of lone requests of two output lengths after three idle spells, in the
   smallest token-generation bucket that holds them; kept in every profile (``resume_s``, the
   longest spell's, and ``resume_idle``, the cost at each spell). Only as 7, and only for a
   target served continuously (``[target] serving``): it costs device time a static search
   would never use.
10. What a served pass that stops a running decode costs the decode after it, by the size of
    its prefill (``lens.busy_resume``): served calls of carrier requests, some stopped by
    one-token requests of each measured context-encoding bucket; kept in every profile
    (``resume_busy``). Only as 9.
11. How far a lone served prompt's TTFT strays from its median (``lens.prefill_tail``): served
    calls of one-token requests after idle spells; kept in every profile (``prefill_tail``),
    the spread continuous serving reads its latency percentiles over. Only as 9.
12. How a lone served decode's pace wanders in time (``lens.decode_pace``): served calls of
    requests decoding one after another; kept in every profile (``decode_pace``, its window and
    correlation time), the wander continuous serving's TPOT and E2E percentiles are read over.
    Only as 9.

Steps 6-12 are ``search.host_costs``. Every profile records the version of their method
(``host_costs_method``, ``lens.methods``), so that a cache can tell values an older one measured.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Sequence

from lens import admission as admission_cost
from lens import busy_resume
from lens import context_cost
from lens import decode_pace
from lens import methods
from lens import prefill_tail
from lens import resume as resume_cost
from lens import rows as row_cost
from lens.errors import RunnerError, UserError
from lens.noise import ESTIMATOR
from lens.probes import BucketFit, NoisyMeasurement, assess, check_probe, fit, plan_probes, probe_window, to_profile
from lens.types import BucketProfile, Probe, ProbeRun, Target, Unit
from runners import Runner, get_runner
from spaces import ProfileSettings

from .host_costs import (NOT_MEASURED, measure_admission, measure_busy_resume, measure_context_cost,
                         measure_decode_pace, measure_prefill_tail, measure_resume, measure_row_cost)

#: a dip of the staircase smaller than this share of the value is a compiler quirk, not a suspect
SHAPE_TOLERANCE = 0.03
#: a dip is suspect when it exceeds this many standard errors of the difference too
SHAPE_SIGMAS = 2.0
#: the long run grows only when the new L2 is at least this much longer (else: more repeats)
GROW_MIN = 1.25
@dataclass(frozen=True)
class UnitMeasurement:
    """The solved profiles of one unit plus the hardware seconds they cost."""

    tp: int
    batch: int
    profiles: dict[int, BucketProfile]
    compile_s: float
    run_s: float
    host: str
    versions: dict = field(default_factory=dict)
    simulated: bool = False
    #: where and when it ran (the Ray node, wall-clock seconds since the epoch)
    node_id: str = ""
    started_at: float = 0.0
    ended_at: float = 0.0
    #: buckets kept although their derived values spread more than ``max_spread``: bucket -> why
    noisy: dict = field(default_factory=dict)
    #: measurements made of the worst bucket (1 when the first one was good)
    attempts: int = 1
    #: timed seconds of each bucket's runs (every attempt, the discarded ones included)
    bucket_s: dict = field(default_factory=dict)
    #: bucket -> what was done beyond the first measurement, and why
    notes: dict = field(default_factory=dict)
    #: the host's cost per live row of a decode step (lens.rows), measured in the smallest bucket; None when
    #: not measured (a batch of one, ragged batching), and its timed run seconds (in run_s, as bucket_s are)
    rows: row_cost.RowCost | None = None
    rows_s: float = 0.0
    #: what a served admission costs against TTFT_b (lens.admission); None when not measured (a runner that
    #: does not serve continuous mode, ragged batching), and its timed run seconds (in run_s)
    admission: admission_cost.AdmissionCost | None = None
    admission_s: float = 0.0
    #: what a live row's context costs a decode step (lens.context_cost); None when not measured (as admission),
    #: and its timed run seconds (in run_s)
    context: context_cost.ContextCost | None = None
    context_s: float = 0.0
    #: what a decode run costs after a served admission (lens.resume); None when not measured (as admission),
    #: and its timed run seconds (in run_s)
    resume: resume_cost.ResumeCost | None = None
    resume_s: float = 0.0
    #: what a served pass that stops a running decode costs the decode after it (lens.busy_resume); None when
    #: not measured (as resume), and its timed run seconds (in run_s)
    busy_resume: busy_resume.BusyResume | None = None
    busy_resume_s: float = 0.0
    #: how far a lone served prompt's TTFT strays from its median (lens.prefill_tail); None when not measured
    #: (as resume), and its timed run seconds (in run_s)
    tail: prefill_tail.PrefillTail | None = None
    tail_s: float = 0.0
    #: how a lone served decode's pace wanders (lens.decode_pace); None when not measured (as resume), and its
    #: timed run seconds (in run_s)
    pace: decode_pace.DecodePace | None = None
    pace_s: float = 0.0

    @property
    def hardware_s(self) -> float:
        return self.compile_s + self.run_s

    def _costs(self) -> dict[str, object]:
        return {what: c for what, c in (("the row cost", self.rows), ("the served admissions", self.admission),
                                        ("a row's context cost", self.context), ("the resume cost", self.resume),
                                        ("the resume cost after a busy pass", self.busy_resume),
                                        ("a lone prompt's TTFT tail", self.tail),
                                        ("a lone decode's pace", self.pace))
                if c is not None}

    def host_costs(self) -> dict[str, str]:
        """What each host cost the unit's workloads measured came to, as its record says it: what -> text."""
        return {what: c.said() for what, c in self._costs().items()}

    def unmeasured(self) -> dict[str, str]:
        """The host costs whose workload the runner failed (each left at 0): what -> why."""
        return {what: c.note for what, c in self._costs().items() if c.note.startswith(NOT_MEASURED)}


class _Runs:
    """The runs of each bucket so far: repeats of the same probe pooled, a replaced long run dropped."""

    def __init__(self) -> None:
        self.t1: dict[int, ProbeRun] = {}
        self.t2: dict[int, ProbeRun] = {}
        self.cost: dict[int, float] = {}

    def add(self, runs: Sequence[ProbeRun]) -> None:
        by_bucket: dict[int, list[ProbeRun]] = {}
        for r in runs:
            by_bucket.setdefault(r.probe.bucket, []).append(r)
        for b, rs in by_bucket.items():
            self.cost[b] = self.cost.get(b, 0.0) + float(sum(sum(r.times_s) for r in rs))
            l1 = self.t1[b].probe.output_len if b in self.t1 else min(r.probe.output_len for r in rs)
            for r in rs:
                slot = self.t1 if r.probe.output_len == l1 else self.t2
                old = slot.get(b)
                # repeats of the same probe pool; a long run at a new L2 replaces the old one
                times = old.times_s + r.times_s if old is not None and old.probe.output_len == r.probe.output_len \
                    else r.times_s
                slot[b] = ProbeRun(Probe(b, r.probe.input_len, r.probe.output_len, len(times)), tuple(times))

    def drop(self, bucket: int) -> None:
        """Forget a bucket's runs (their cost stays counted): the next ones replace them."""
        self.t1.pop(bucket, None)
        self.t2.pop(bucket, None)

    def all(self) -> list[ProbeRun]:
        return [r for b in sorted(self.t1) for r in (self.t1[b], self.t2[b])]


def sized_l2(f: BucketFit, *, window: int, target: float) -> int:
    """The shortest L2 (up to ``window``) at which TBT_b's spread is expected to be ``target`` of it.

    The noise of T1 is what its repeats so far show; that of the long run is taken as the
    same share of its time as now (jitter and stragglers grow with the run). The slope's
    spread is their combination over the decode span (L2 - L1) TBT_b, which is what grows.
    """
    l1, l2 = f.r1.probe.output_len, f.r2.probe.output_len
    if not (f.tbt_s > 0 and f.t2_s > 0):
        return window
    rel2 = f.t2_err_s / f.t2_s
    for length in range(l2, window + 1):
        span = (length - l1) * f.tbt_s
        if math.hypot(f.t1_err_s, rel2 * (f.t1_s + span)) <= target * span:
            return length
    return window


def _shape_suspects(fits: dict[int, BucketFit]) -> dict[int, str]:
    """Buckets where a bigger bucket's TTFT_b or TBT_b dips below a smaller one's by more than the noise."""
    out: dict[int, str] = {}
    bs = sorted(fits)
    for a, b in zip(bs, bs[1:]):
        fa, fb = fits[a], fits[b]
        for name, va, vb, ea, eb in (("TTFT_b", fa.ttft_s, fb.ttft_s, fa.ttft_err_s, fb.ttft_err_s),
                                     ("TBT_b", fa.tbt_s, fb.tbt_s, fa.tbt_err_s, fb.tbt_err_s)):
            dip = va - vb
            if dip > SHAPE_TOLERANCE * va and dip > SHAPE_SIGMAS * math.hypot(ea, eb):
                why = (f"{name} of bucket {b} ({vb * 1e3:.4g} ms) is {dip / va:.1%} below that of bucket {a} "
                       f"({va * 1e3:.4g} ms), more than their noise")
                out.setdefault(a, why)
                out.setdefault(b, why)
    return out


def measure_unit(
    target: Target,
    *,
    tp: int,
    batch: int,
    buckets: Sequence[int],
    all_buckets: Sequence[int],
    profile: ProfileSettings,
    runner: Runner | None = None,
    estimator: str = ESTIMATOR,
) -> UnitMeasurement:
    """Compile ``(tp, batch)`` once and measure two runs per bucket of ``buckets`` (see the module doc).

    Raises ``NoisyMeasurement`` when a bucket stays impossible to solve. ``estimator``
    (``lens.noise.ESTIMATORS``) is there for the benchmark that chose it.
    """
    runner = runner or get_runner(target)
    unit = Unit(target=target, tp=tp, batch=batch)
    runner.check_unit(unit)
    policy = target.bucket_policy
    if profile.attempts < 1:
        raise UserError(f"profile.attempts {profile.attempts}: needs at least 1")
    want = sorted(set(buckets))
    if not want:
        raise UserError(f"unit tp={tp} batch={batch}: no bucket to profile")
    probes = plan_probes(all_buckets, policy=policy, profile=want, max_output=profile.max_output,
                         repeats=profile.repeats)
    for p in probes:
        check_probe(p, want, policy)
    window = {b: probe_window(b, all_buckets, policy) for b in want}
    window = {b: hi - lo + 1 for b, (lo, hi) in window.items()}
    started = time.time()
    runs = _Runs()
    compile_s = run_s = 0.0
    notes: dict[int, list[str]] = {}
    result = None

    def run(ps: list[Probe]) -> dict[int, BucketFit]:
        nonlocal compile_s, run_s, result
        result = runner.profile(unit, ps)
        compile_s += result.compile_s
        run_s += result.run_s
        runs.add(result.runs)
        missing = [b for b in want if b not in runs.t1 or b not in runs.t2]
        if missing:
            raise RunnerError(f"runner {runner.name}: no runs came back for bucket(s) {missing} of tp={tp} batch={batch}")
        return fit(runs.all(), batch=batch, prefill=target.prefill, estimator=estimator)

    fits = run(probes)
    verdict = {b: assess(fits[b], max_spread=profile.max_spread) for b in want}
    attempt, shape_checked = 1, False
    history = [profile.repeats]

    def again(todo: list[int]) -> None:
        """Measure ``todo`` again, interleaved: a longer long run where the slope needs it, else more repeats."""
        nonlocal fits, verdict, attempt
        attempt += 1
        ps = []
        for b in todo:
            f, t1, t2 = fits[b], runs.t1[b], runs.t2[b]
            reps = t1.probe.repeats
            l2 = t2.probe.output_len
            grow = sized_l2(f, window=window[b], target=profile.max_spread / 2)
            if verdict[b] is not None and f.tbt_rel >= f.ttft_rel and grow >= GROW_MIN * l2:
                notes.setdefault(b, []).append(f"TBT_b +-{f.tbt_rel:.1%}: long run grown from L2 = {l2} to {grow} "
                                               f"(the bucket's window: {window[b]})")
                l2, reps2 = grow, t2.probe.repeats
            else:
                if verdict[b] is not None:
                    notes.setdefault(b, []).append(
                        f"TTFT_b +-{f.ttft_rel:.1%}, TBT_b +-{f.tbt_rel:.1%}: measured again with {reps} more repeats")
                reps2 = t2.probe.repeats
            if verdict[b] is not None and verdict[b][0] == "impossible":
                # runs that cannot be solved say nothing about the bucket (a transient fault): replaced by twice
                # as many, not pooled
                runs.drop(b)
                reps, reps2 = 2 * reps, 2 * reps2
            ps += [Probe(b, t1.probe.input_len, t1.probe.output_len, reps), Probe(b, t2.probe.input_len, l2, reps2)]
        fits = run(ps)
        verdict = {b: assess(fits[b], max_spread=profile.max_spread) for b in want}
        history.append(max(runs.t1[b].probe.repeats for b in todo))

    while True:
        todo = [b for b in want if verdict[b] is not None]
        if todo and attempt < profile.attempts:
            again(todo)
            continue
        if shape_checked:
            break
        # once the noise allows: a staircase that breaks its shape is measured once more
        shape_checked = True
        suspects = _shape_suspects({b: fits[b] for b in want})
        if not suspects:
            break
        for b, why in suspects.items():
            notes.setdefault(b, []).append(f"re-measured: {why}")
        again(sorted(suspects))
        for b, f in _shape_suspects({b: fits[b] for b in want}).items():
            if b in suspects:
                notes[b].append("kept as measured again (a compiler quirk, or noise the repeats do not show)")
    impossible = {b: v[1] for b, v in verdict.items() if v and v[0] == "impossible"}
    if impossible:
        raise NoisyMeasurement(
            f"noisy measurement: {'; '.join(impossible.values())} (after {attempt} attempt(s) with "
            f"{', '.join(map(str, history))} repeats; the unit is left out)"
        )
    now = time.time()
    profiles = {b: dataclasses.replace(to_profile(fits[b], accepted=verdict[b] is None, runner=runner.name,
                                                  host=result.host, simulated=result.simulated, measured_at=now),
                                       host_costs_method=methods.HOST_COSTS) for b in want}
    rows, rows_spent = measure_row_cost(runner, target, tp, batch, profiles[want[0]], want)
    compile_s, run_s = compile_s + rows_spent[0], run_s + rows_spent[1]
    if rows is not None:
        at = row_cost.measured_context(profiles[want[0]])
        profiles = {b: dataclasses.replace(p, row_s=rows.value, row_context=at) for b, p in profiles.items()}
    admission, admission_spent = measure_admission(runner, target, tp, batch, profiles, want)
    compile_s, run_s = compile_s + admission_spent[0], run_s + admission_spent[1]
    if admission is not None:
        profiles = {b: dataclasses.replace(p, admit_first_s=admission.first_s, admit_next_s=admission.next_s,
                                           admit_busy_s=admission.busy_s) for b, p in profiles.items()}
    context, context_spent = measure_context_cost(runner, target, tp, batch, profiles, want)
    compile_s, run_s = compile_s + context_spent[0], run_s + context_spent[1]
    if context is not None:
        profiles = {b: dataclasses.replace(p, kv_token_s=context.value) for b, p in profiles.items()}
    resume, resume_spent = measure_resume(runner, target, tp, batch, profiles, want)
    compile_s, run_s = compile_s + resume_spent[0], run_s + resume_spent[1]
    if resume is not None:
        profiles = {b: dataclasses.replace(p, resume_s=resume.value, resume_idle=resume.by_idle)
                    for b, p in profiles.items()}
    busy, busy_spent = measure_busy_resume(runner, target, tp, batch, profiles, want)
    compile_s, run_s = compile_s + busy_spent[0], run_s + busy_spent[1]
    if busy is not None:
        profiles = {b: dataclasses.replace(p, resume_busy=busy.by_pass) for b, p in profiles.items()}
    tail, tail_spent = measure_prefill_tail(runner, target, tp, batch, profiles, want)
    compile_s, run_s = compile_s + tail_spent[0], run_s + tail_spent[1]
    if tail is not None:
        profiles = {b: dataclasses.replace(p, prefill_tail=tail.quantiles, prefill_tail_median_s=tail.median_s)
                    for b, p in profiles.items()}
    pace, pace_spent = measure_decode_pace(runner, target, tp, batch, profiles, want)
    compile_s, run_s = compile_s + pace_spent[0], run_s + pace_spent[1]
    if pace is not None:
        profiles = {b: dataclasses.replace(p, decode_pace=pace.quantiles, decode_pace_window_s=pace.window_s,
                                           decode_pace_tau_s=pace.tau_s) for b, p in profiles.items()}
    noisy = {b: verdict[b][1] + f" after {attempt} attempt(s)" for b in want if verdict[b]}
    return UnitMeasurement(
        tp=tp, batch=batch, profiles=profiles, compile_s=compile_s, run_s=run_s, host=result.host,
        versions=dict(result.versions), simulated=result.simulated, started_at=started, ended_at=time.time(),
        noisy=noisy, attempts=attempt, bucket_s={b: runs.cost.get(b, 0.0) for b in want},
        notes={b: "; ".join(v) for b, v in notes.items()}, rows=rows, rows_s=rows_spent[1],
        admission=admission, admission_s=admission_spent[1], context=context, context_s=context_spent[1],
        resume=resume, resume_s=resume_spent[1], busy_resume=busy, busy_resume_s=busy_spent[1],
        tail=tail, tail_s=tail_spent[1], pace=pace, pace_s=pace_spent[1],
    )
