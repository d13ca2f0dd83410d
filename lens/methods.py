"""Which way of measuring a unit's host costs a profile's values come from, so that a cache can tell an old one.

A profile cache outlives the lensopt that filled it. When the way a host cost is measured
(steps 6-12 of ``search.measure``) changes what its value means, :data:`HOST_COSTS` grows by
one and :data:`CHANGES` says which costs changed and how an older value reads. Every profile
records the version that measured it (``BucketProfile.host_costs_method``); 0 is a profile
stored before versions were recorded (a cache of schema 13 or older, or an export file of
one), whose method is not known.

``outdated`` names, for a unit's profiles, the changes since their version that touch a
cost they hold: an offset of 0 was not measured, so no change can make it wrong.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from .types import BucketProfile


@dataclass(frozen=True)
class Change:
    """A change of method: the costs it touched, how a value of before reads, and whether a profile holds them."""

    costs: str
    before: str
    holds: Callable[[BucketProfile], bool]
    #: whether only continuous serving reads these costs (a static prediction is the same either way)
    serving_only: bool = True


def _admission(p: BucketProfile) -> bool:
    return any((p.admit_first_s, p.admit_next_s, p.admit_busy_s))


#: the version of the host-cost measurements this lensopt makes
HOST_COSTS = 1
#: version -> what it changed, against the version before it
CHANGES: dict[int, Change] = {
    1: Change("served-admission offsets (lens.admission)",
              "hold the first decode step's start-up over TBT_b, a share per prompt (on the jax runner, bucket 64: "
              "about 0.15 ms at batch 4, 0.1 ms at batch 8), so a served prompt's TTFT comes out that much high",
              _admission),
}


def outdated(profiles: Mapping[int, BucketProfile], *, serving: bool = True) -> tuple[Change, ...]:
    """The changes of method since the oldest of ``profiles`` was measured that touch a cost one of them holds
    (``serving`` False: only those a static prediction reads)."""
    found = []
    for version in range(min((p.host_costs_method for p in profiles.values()), default=HOST_COSTS) + 1,
                         HOST_COSTS + 1):
        change = CHANGES[version]
        if (serving or not change.serving_only) and any(
                change.holds(p) for p in profiles.values() if p.host_costs_method < version):
            found.append(change)
    return tuple(found)


def advice(profiles: Mapping[int, BucketProfile], unit: str, remeasure: str, *, serving: bool = True) -> str | None:
    """One line saying which of a unit's host costs an older method measured, what that does, and how to measure
    them anew; None when none did. ``unit`` names it ("tp1 b4"), ``remeasure`` says how to measure it anew."""
    changes = outdated(profiles, serving=serving)
    if not changes:
        return None
    costs = " and ".join(c.costs for c in changes)
    effects = (f"they {changes[0].before}" if len(changes) == 1
               else "; ".join(f"the {c.costs} {c.before}" for c in changes))
    if min(p.host_costs_method for p in profiles.values()) == 0:
        said = (f"were stored before lensopt recorded how it measures host costs; if an older lensopt measured "
                f"them, {effects}")
    else:
        said = f"were measured by an older method: {effects}"
    return f"the cached {unit}'s {costs} {said}; to measure them anew: {remeasure}"
