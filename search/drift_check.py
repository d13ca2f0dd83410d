"""The host-drift check around a measurement: the reference probe on both sides, and what is done about it.

``lensopt measure`` and each confirmation task run the same steps where the hardware is
(``bracketed``): half the reference probe's repeats before the work, the work, the other
half after it (``lens.drift``); then, when the drift is beyond ``budget.drift_reprofile``
(``lens.drift.action``), the buckets the requests use are profiled again on the spot, with
the unit's graphs still loaded and under the same profiling discipline as ``lensopt
profile`` (``search.measure.measure_unit``). The fresh profiles are returned, not stored:
the cache keeps the profile it had, since a host that is slow now may not be slow later;
the caller predicts from them to judge the model apart from the host's drift.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, TypeVar

from lens.buckets import decode_contexts, used_buckets
from lens.drift import REPROFILED, Drift, Reference, action, drift_of, halves, reference_probe
from lens.errors import one_line
from lens.probes import NoisyMeasurement
from lens.types import BucketProfile, Candidate, Requests, Unit
from runners import Runner
from spaces import ProfileSettings, Space

from .measure import measure_unit

T = TypeVar("T")


@dataclass(frozen=True)
class DriftCheck:
    """What a measurement does about the host's drift: the reference probe, and what to re-profile."""

    reference: Reference
    tolerance: float
    reprofile_above: float
    #: whether re-scaling the prediction by the drift is meaningful (not under continuous serving)
    rescalable: bool
    #: the buckets re-profiled when the drift is large: those the requests use
    buckets: tuple[int, ...]
    all_buckets: tuple[int, ...]
    profile: ProfileSettings

    @classmethod
    def of(cls, space: Space, cand: Candidate, requests: Requests,
           profiles: Mapping[int, BucketProfile]) -> "DriftCheck | None":
        """The check of ``cand`` on ``requests`` against its unit's cached ``profiles`` (None: nothing to compare)."""
        policy = space.target.bucket_policy
        ref = reference_probe(profiles, requests.input_len, cand.ctx_buckets, policy=policy,
                              repeats=space.profile.repeats)
        if ref is None:
            return None
        used = used_buckets(cand.ctx_buckets, cand.tkg_buckets, requests.input_len, policy=policy,
                            contexts=decode_contexts(requests.input_len, requests.output_len))
        return cls(ref, space.budget.drift_tolerance, space.budget.drift_reprofile,
                   space.target.serving != "continuous", tuple(sorted(used)), tuple(space.search.buckets),
                   space.profile)


@dataclass(frozen=True)
class DriftOutcome:
    """The reference probe's runs around the work, the drift they give, and what was done about it."""

    drift: Drift
    #: ``lens.drift.action``'s verdict, as carried out ("none", "rescaled", "reprofiled")
    action: str
    times_before_s: tuple[float, ...]
    times_after_s: tuple[float, ...]
    #: the hardware seconds of the reference runs and of any re-profiling
    hardware_s: float
    #: the re-profiled buckets (action "reprofiled")
    profiles: dict[int, BucketProfile] = field(default_factory=dict)
    reprofile_s: float = 0.0
    #: why a re-profile that was due did not replace the cached profiles ("" when none failed)
    note: str = ""

    @property
    def times_s(self) -> tuple[float, ...]:
        return self.times_before_s + self.times_after_s


def bracketed(runner: Runner, unit: Unit, check: DriftCheck | None,
              work: Callable[[], T]) -> tuple[T, DriftOutcome | None]:
    """Run ``work`` between the two halves of the reference probe; re-profile when the drift says so."""
    if check is None:
        return work(), None
    first, second = halves(check.reference.probe)
    res = runner.profile(unit, [first])
    before, hw = tuple(res.runs[0].times_s), res.compile_s + res.run_s
    out = work()
    res = runner.profile(unit, [second])
    after, hw = tuple(res.runs[0].times_s), hw + res.compile_s + res.run_s
    d = drift_of(check.reference, before + after)
    what = action(d, tolerance=check.tolerance, reprofile_above=check.reprofile_above, rescalable=check.rescalable)
    if what != REPROFILED:
        return out, DriftOutcome(d, what, before, after, hw)
    try:
        m = measure_unit(unit.target, tp=unit.tp, batch=unit.batch, buckets=check.buckets,
                         all_buckets=check.all_buckets, profile=check.profile, runner=runner)
    except NoisyMeasurement as exc:  # judged as a smaller drift would be, and the reason kept
        fallback = action(d, tolerance=check.tolerance, reprofile_above=float("inf"), rescalable=check.rescalable)
        return out, DriftOutcome(d, fallback, before, after, hw, note=f"re-profiling failed: {one_line(exc)}")
    spent = m.compile_s + m.run_s
    return out, DriftOutcome(d, REPROFILED, before, after, hw + spent, dict(m.profiles), spent)
