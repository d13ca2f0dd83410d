"""The host-drift check around a measurement: probes in rounds around the work, and what is done about it.

``lensopt measure`` and each confirmation task run the same steps where the hardware is
(``checked``). The work comes in chunks (``measure``: one per pass over the requests; a
confirmation: its one run), and *rounds* of probes run before the first chunk, between
chunks and after the last, so that what the probes see is the host over the work's own
window (``lens.drift``):

- ``budget.drift_check = "side-by-side"`` (the default): each round runs the two probes of
  every bucket the requests use (the reference probe is one of them). The reference
  probe's times give ``host_drift``; all of the rounds' runs, solved as one profile
  (``lens.probes.fit``), are the buckets' profiles *on the host as it was during the
  work*, and the work is judged on the prediction from them (``"reprofiled"``): like is
  compared with like, and the as-is error beside it tells how stale the cache is. On a
  shared host the speed wanders over seconds, and not alike for every bucket, so neither a
  profile taken minutes apart nor one factor (a reference probe's drift) stands for the
  host during the work (docs/noise.md, measured). A bucket whose runs are not tight (derived
  spreads over ``profile.max_spread``) is run again right after the work, as profiling
  does, once: as many runs again as its rounds gave, so that the runs of the work's own
  window stay at least half of them (``DriftOutcome.run_again``). Only when those runs
  cannot be solved is
  the drift acted on as under ``"reference"`` (re-scaled when it counts), with the reason.
- ``"reference"``: the rounds run the reference probe alone (cheaper); past
  ``budget.drift_reprofile`` the buckets are profiled again after the work
  (``search.measure.measure_unit``), below it the prediction is re-scaled.

Fresh profiles are returned, never stored: the cache keeps the profile it had, since a
host that is slow now may not be slow later; the caller predicts from them to judge the
model apart from the host's drift.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence, TypeVar

import numpy as np

from lens.admission import unit_admission
from lens.buckets import decode_contexts, used_buckets
from lens.context_cost import unit_context_cost
from lens.drift import (REFERENCE_REPEATS, REPROFILED, SIDE_BY_SIDE, Drift, Reference, action, drift_of, round_speeds,
                        reference_probe)
from lens.errors import one_line
from lens.decode_pace import unit_pace
from lens.prefill_tail import unit_tail
from lens.probes import BucketFit, NoisyMeasurement, assess, fit, plan_probes, to_profile
from lens.resume import unit_by_idle, unit_by_pass, unit_resume
from lens.rows import unit_row_s
from lens.types import BucketProfile, Candidate, Probe, Requests, Target, Unit
from runners import Runner
from spaces import Budget, ProfileSettings, Space

from .measure import measure_unit

T = TypeVar("T")


@dataclass(frozen=True)
class DriftCheck:
    """What a measurement does about the host's drift: the probes around the work, and what to re-profile."""

    reference: Reference
    tolerance: float
    reprofile_above: float
    #: whether re-scaling the prediction by the drift is meaningful (not under continuous serving)
    rescalable: bool
    #: the buckets the requests use: probed side by side, or re-profiled when the drift is large
    buckets: tuple[int, ...]
    all_buckets: tuple[int, ...]
    profile: ProfileSettings
    #: ``budget.drift_check``: the probes of every bucket in ``buckets`` in each round, or the reference alone
    side_by_side: bool = True
    #: the probes the rounds run, each with its timed runs over all rounds (the reference probe among them)
    probes: tuple[Probe, ...] = ()
    #: the unit's host cost per live row from its cached profiles (``lens.rows``): the rounds' probes keep
    #: every row live and cannot see it, so the profiles taken side by side carry it over
    row_s: float = 0.0
    #: the unit's served admissions against TTFT_b from its cached profiles (``lens.admission``): the rounds run
    #: static probes, so the profiles taken side by side carry them over too
    admit_first_s: float = 0.0
    admit_next_s: float = 0.0
    #: what a live row's context costs a decode step, and the row cost's measured context (``lens.context_cost``):
    #: the rounds' probes hold one context per row and cannot see it either
    kv_token_s: float = 0.0
    row_context: float = 0.0
    #: what a decode run costs after a served admission (``lens.resume``): the rounds run static probes only
    resume_s: float = 0.0
    resume_idle: tuple[tuple[float, float], ...] = ()
    resume_busy: tuple[tuple[float, float], ...] = ()
    prefill_tail: tuple[float, ...] = ()
    prefill_tail_median_s: float = 0.0
    #: how a lone served decode's pace wanders (``lens.decode_pace``): the rounds run static probes only
    decode_pace: tuple[float, ...] = ()
    decode_pace_window_s: float = 0.0
    decode_pace_tau_s: float = 0.0
    #: a served pass's first prompt when it stops a running decode (``lens.admission``), carried over as the others
    admit_busy_s: float = 0.0
    #: the version of the host-cost measurements the carried costs come from (``lens.methods``): their oldest
    host_costs_method: int = 0

    @classmethod
    def of(cls, space: Space, cand: Candidate, requests: Requests,
           profiles: Mapping[int, BucketProfile]) -> "DriftCheck | None":
        """The check of ``cand`` on ``requests`` against its unit's cached ``profiles`` (None: nothing to compare)."""
        return cls.build(space.target, cand, requests, profiles, budget=space.budget, profile=space.profile,
                         all_buckets=tuple(space.search.buckets))

    @classmethod
    def build(cls, target: Target, cand: Candidate, requests: Requests, profiles: Mapping[int, BucketProfile], *,
              budget: Budget, profile: ProfileSettings, all_buckets: tuple[int, ...]) -> "DriftCheck | None":
        """``of`` from its parts: the target, the budget's drift settings, the profile settings and the
        search's full bucket set (which places each probe's prompt)."""
        policy = target.bucket_policy
        ref = reference_probe(profiles, requests.input_len, cand.ctx_buckets, policy=policy, repeats=profile.repeats)
        if ref is None:
            return None
        used = tuple(sorted(used_buckets(cand.ctx_buckets, cand.tkg_buckets, requests.input_len, policy=policy,
                                         contexts=decode_contexts(requests.input_len, requests.output_len))))
        side = budget.drift_check == SIDE_BY_SIDE
        least = max(ref.probe.repeats, REFERENCE_REPEATS)
        probes = _bucket_probes(used, profiles, all_buckets, policy, profile.max_output, least) if side \
            else (dataclasses.replace(ref.probe, repeats=least),)
        cached = [profiles[b] for b in used if b in profiles]
        first, nxt, busy = unit_admission(cached)
        kv, row_context = unit_context_cost(cached)
        tail, tail_median = unit_tail(cached)
        pace, window, tau = unit_pace(cached)
        return cls(ref, budget.drift_tolerance, budget.drift_reprofile, target.serving != "continuous", used,
                   all_buckets, profile, side, probes, unit_row_s(cached), admit_first_s=first, admit_next_s=nxt,
                   kv_token_s=kv, row_context=row_context, resume_s=unit_resume(cached), admit_busy_s=busy,
                   resume_idle=unit_by_idle(cached), resume_busy=unit_by_pass(cached),
                   prefill_tail=tail, prefill_tail_median_s=tail_median, decode_pace=pace,
                   decode_pace_window_s=window, decode_pace_tau_s=tau,
                   host_costs_method=min((p.host_costs_method for p in cached), default=0))


def _bucket_probes(used: Sequence[int], profiles: Mapping[int, BucketProfile], all_buckets: tuple[int, ...],
                   policy: str, max_output: int, least: int) -> tuple[Probe, ...]:
    """The two probes of each used bucket as the cached profile ran them, with as many runs as it needed
    (``least`` at the fewest: a noisy bucket was measured again until tight); planned afresh where none is cached."""
    out: list[Probe] = []
    missing = [b for b in used if b not in profiles]
    planned = plan_probes(all_buckets, policy=policy, profile=missing, max_output=max_output, repeats=least) \
        if missing else []
    for b in used:
        p = profiles.get(b)
        if p is not None:
            n = max(p.repeats, least)
            out += [Probe(b, p.input_len, p.l1, n), Probe(b, p.input_len, p.l2, n)]
    return tuple(sorted(out + planned, key=lambda p: (p.bucket, p.output_len)))


@dataclass(frozen=True)
class DriftOutcome:
    """The probes' runs around the work, the drift they give, and what was done about it."""

    drift: Drift
    #: ``lens.drift.action``'s verdict, as carried out ("none", "rescaled", "reprofiled")
    action: str
    #: the reference probe's times in each round (before the work, between its chunks, after it)
    rounds_s: tuple[tuple[float, ...], ...]
    #: the hardware seconds of every probe run and of any re-profiling
    hardware_s: float
    #: the buckets' profiles on the host as it was during the work (side by side, or re-profiled after
    #: it: action "reprofiled"); empty when none were taken or they could not be solved
    profiles: dict[int, BucketProfile] = field(default_factory=dict)
    #: the hardware seconds those profiles cost
    reprofile_s: float = 0.0
    #: why a re-profile that was due did not replace the cached profiles ("" when none failed)
    note: str = ""
    #: whether ``profiles`` were taken side by side with the work (else after it)
    side_by_side: bool = False
    #: buckets whose side-by-side runs were not tight and were run again right after the work
    run_again: tuple[int, ...] = ()
    #: the host's speed in each round, over the rounds' whole (``lens.drift.round_speeds``; every probe's runs)
    round_speeds: tuple[float, ...] = ()

    @property
    def run_again_said(self) -> str:
        """The buckets run again, for a log line ("" when none were)."""
        return (f"bucket(s) {', '.join(map(str, self.run_again))} run again after the work, not being tight"
                if self.run_again else "")

    #: from this many rounds on, how far the host moved is read between the rounds' 10th and 90th percentiles: one
    #: round of a few runs that straggled is not the host moving
    MANY_ROUNDS = 10

    def _moved_span(self) -> tuple[float, float, int]:
        v = np.asarray([x for x in self.round_speeds if np.isfinite(x)])
        if v.size < 2:
            return float("nan"), float("nan"), int(v.size)
        if v.size >= self.MANY_ROUNDS:
            return float(np.percentile(v, 10)), float(np.percentile(v, 90)), int(v.size)
        return float(v.min()), float(v.max()), int(v.size)

    @property
    def moved(self) -> float:
        """How far the host's speed moved during the work: the range of ``round_speeds`` (0.3: by 30% of its
        speed over all the rounds; between their 10th and 90th percentiles from ``MANY_ROUNDS`` rounds on); nan
        with fewer than two rounds measured."""
        lo, hi, _ = self._moved_span()
        return hi - lo

    def moved_said(self, tolerance: float) -> str:
        """A clause for a log line when the host moved by more than twice ``tolerance`` during the work ("" when it
        held): the work's figures then carry the host's moves, which a prediction at its average speed does not."""
        lo, hi, n = self._moved_span()
        if not hi - lo > 2 * tolerance:
            return ""
        which = f"the middle 80% of the {n} rounds" if n >= self.MANY_ROUNDS else f"the {n} rounds"
        return (f"over {which} the host's speed ranged {lo:.2f}-{hi:.2f}x its speed over all of them: the runs "
                f"carry the host's moves, which a prediction at that average does not, so part of any error is "
                f"the host's")

    @property
    def times_before_s(self) -> tuple[float, ...]:
        return self.rounds_s[0] if self.rounds_s else ()

    @property
    def times_after_s(self) -> tuple[float, ...]:
        return self.rounds_s[-1] if len(self.rounds_s) > 1 else ()


def spread_repeats(total: int, rounds: int) -> list[int]:
    """``total`` timed runs spread over ``rounds`` rounds, the first ones taking the remainder; at least one each."""
    base, extra = divmod(max(total, rounds), rounds)
    return [base + (1 if i < extra else 0) for i in range(rounds)]


def checked(runner: Runner, unit: Unit, check: DriftCheck | None,
            chunks: Sequence[Callable[[], T]]) -> tuple[list[T], DriftOutcome | None]:
    """Run the ``chunks`` of work with rounds of the check's probes around and between them; act on the drift."""
    if check is None:
        return [c() for c in chunks], None
    rounds_n = len(chunks) + 1
    counts = {p: spread_repeats(p.repeats, rounds_n) for p in check.probes}
    key = lambda p: (p.bucket, p.input_len, p.output_len)  # noqa: E731
    times: dict[tuple, list[float]] = {key(p): [] for p in check.probes}
    ref_key = key(check.reference.probe)
    each_round: list[dict[tuple, tuple[float, ...]]] = []  # per round: probe -> its times in it
    hw = 0.0
    last = None

    def probe_round(i: int) -> None:
        nonlocal hw, last
        res = runner.profile(unit, [dataclasses.replace(p, repeats=counts[p][i]) for p in check.probes])
        hw += res.compile_s + res.run_s
        last = res
        for r in res.runs:
            times[key(r.probe)].extend(r.times_s)
        each_round.append({key(r.probe): tuple(r.times_s) for r in res.runs})

    out: list[T] = []
    for i, work in enumerate(chunks):
        probe_round(i)
        out.append(work())
    probe_round(rounds_n - 1)
    rounds = [r[ref_key] for r in each_round]  # the reference probe's times, round by round
    d = drift_of(check.reference, times[ref_key])
    speeds = round_speeds(each_round)
    if check.side_by_side:
        def pooled():
            return [dataclasses.replace(r, probe=dataclasses.replace(r.probe, repeats=len(times[key(r.probe)])),
                                        times_s=tuple(times[key(r.probe)])) for r in last.runs]

        # a bucket whose runs are not tight (a straggler among a few) is run again right after the work, its
        # runs doubled, as profiling measures such a bucket again (unless profile.attempts = 1): judged on a
        # few runs that straggled, the work would be judged on a slope 10-20% off. Once only: the runs from
        # after the work describe a later host, and stay no more than half of the bucket's
        fits = fit(pooled(), batch=unit.batch, prefill=unit.target.prefill)
        again: tuple[int, ...] = ()
        if check.profile.attempts > 1:
            again = tuple(sorted(b for b, f in fits.items()
                                 if (v := assess(f, max_spread=check.profile.max_spread)) and v[0] == "noisy"))
        if again:
            more = runner.profile(unit, [dataclasses.replace(p, repeats=len(times[key(p)])) for p in check.probes
                                         if p.bucket in again])
            hw += more.compile_s + more.run_s
            for r in more.runs:
                times[key(r.probe)].extend(r.times_s)
            fits = fit(pooled(), batch=unit.batch, prefill=unit.target.prefill)
        fresh, note = _solved(fits, check, runner.name, last)
        # judged on the profiles taken with the work; failing those, as the reference alone would be
        what = REPROFILED if fresh else action(d, tolerance=check.tolerance, reprofile_above=float("inf"),
                                                rescalable=check.rescalable)
        return out, DriftOutcome(d, what, tuple(rounds), hw, fresh, hw if fresh else 0.0, note, True, again, speeds)
    what = action(d, tolerance=check.tolerance, reprofile_above=check.reprofile_above, rescalable=check.rescalable)
    if what != REPROFILED:
        return out, DriftOutcome(d, what, tuple(rounds), hw, round_speeds=speeds)
    try:
        m = measure_unit(unit.target, tp=unit.tp, batch=unit.batch, buckets=check.buckets,
                         all_buckets=check.all_buckets, profile=check.profile, runner=runner)
    except NoisyMeasurement as exc:  # judged as a smaller drift would be, and the reason kept
        fallback = action(d, tolerance=check.tolerance, reprofile_above=float("inf"), rescalable=check.rescalable)
        return out, DriftOutcome(d, fallback, tuple(rounds), hw, note=f"re-profiling failed: {one_line(exc)}",
                                 round_speeds=speeds)
    spent = m.compile_s + m.run_s
    return out, DriftOutcome(d, REPROFILED, tuple(rounds), hw + spent, dict(m.profiles), spent, round_speeds=speeds)


def _solved(fits: Mapping[int, BucketFit], check: DriftCheck, name: str,
            res) -> tuple[dict[int, BucketProfile], str]:
    """The side-by-side fits as profiles, or none and why (a bucket whose runs cannot be solved)."""
    bad = [why for f in fits.values() if (why := f.impossible())]
    if bad:
        return {}, f"the side-by-side probes give no profile: {bad[0]}"
    return {b: dataclasses.replace(
        to_profile(f, accepted=assess(f, max_spread=check.profile.max_spread) is None, runner=name, host=res.host,
                   simulated=res.simulated), row_s=check.row_s, admit_first_s=check.admit_first_s,
        admit_next_s=check.admit_next_s, kv_token_s=check.kv_token_s, row_context=check.row_context,
        resume_s=check.resume_s, admit_busy_s=check.admit_busy_s, resume_idle=check.resume_idle,
        resume_busy=check.resume_busy, prefill_tail=check.prefill_tail,
        prefill_tail_median_s=check.prefill_tail_median_s, decode_pace=check.decode_pace,
        decode_pace_window_s=check.decode_pace_window_s, decode_pace_tau_s=check.decode_pace_tau_s,
        host_costs_method=check.host_costs_method)
        for b, f in fits.items()}, ""
