"""How many passes ``lensopt measure`` runs, and what their own noise lets a measurement say.

A measurement has an error bar of its own: on a host whose identical runs jitter by a
share sigma, the median of n passes is uncertain by about sqrt(pi / 2) sigma / sqrt(n).
Three passes are enough on a quiet device and far too few on a busy shared host (a 3-pass
check read 6-14% there, its medians uncertain by 14%: docs/noise.md). So with
``--repeats auto`` (the default) the drift check's reference probe -- the cheapest probe
that covers the requests' buckets -- is timed ``PILOT_RUNS`` times first, and its jitter
*now* sets the passes: as many as bring the medians to ``TARGET``, at least ``LEAST``, at
most ``MOST``, and no more than fit ``BUDGET_S`` seconds of passes as the cached profiles
predict one. With nothing cached there is no reference probe: ``LEAST`` passes.

``MOST`` is 100, not 30: on this 2-core VM's jax drift check (a host whose reference probe
jittered by 16%), 30 passes left the medians uncertain by 4.5% and read 3.7% drift-corrected;
90 passes left 3.0% and read 1.9% (docs/noise.md). The time budget, not the count, is what
keeps a busy host's check short.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from lens.noise import passes_for, spread
from lens.serving_metrics import median_interval, range_share
from lens.types import Unit
from runners import Runner

from .cli_common import fmt_s
from .drift_check import DriftCheck
from .report import metric_label

#: most end-to-end runs of one ``measure`` (each runs the whole request list)
MAX_MEASURE_REPEATS = 1000
#: --repeats auto: the fewest and the most passes, the medians' noise aimed at, the predicted
#: seconds of passes allowed, and the runs of the reference probe that time the host's jitter
LEAST, MOST, TARGET, BUDGET_S, PILOT_RUNS = 3, 100, 0.01, 300.0, 10
#: the most passes the measurement-noise hint suggests
NOISE_HINT_REPEATS = 100


def repeats_arg(text: str) -> int | str:
    """argparse ``type`` of ``measure --repeats``: ``auto`` or a whole number of passes."""
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of passes or auto") from None
    if not 1 <= n <= MAX_MEASURE_REPEATS:
        raise argparse.ArgumentTypeError(f"{text}: must be between 1 and {MAX_MEASURE_REPEATS} (or auto)")
    return n


@dataclass(frozen=True)
class Passes:
    """The passes a measurement runs and, chosen automatically, why that many."""

    n: int
    auto: bool = False
    jitter: float | None = None  # the reference probe's runs now: robust sd / median (None: not timed)
    wanted: int | None = None  # the passes TARGET asks for on that jitter
    limit: str = ""  # what held the passes below ``wanted`` (or why nothing was timed)
    pilot_s: float = 0.0  # hardware seconds of the timing runs

    def to_json(self) -> dict[str, Any]:
        return {"jitter_pct": None if self.jitter is None else self.jitter * 100, "wanted": self.wanted,
                "limit": self.limit, "pilot_s": self.pilot_s, "target_pct": TARGET * 100}

    def said(self) -> str:
        if not self.auto:
            return f"passes: {self.n} (--repeats {self.n})"
        if self.jitter is None:
            return f"passes: {self.n} (auto: {self.limit})"
        line = (f"passes: {self.n} (auto: the reference probe's runs jitter by {self.jitter:.1%} now; medians "
                f"within {TARGET:.0%} take about {self.wanted}")
        return line + (f", held to {self.n} by {self.limit})" if self.limit else ")")


def choose(runner: Runner, unit: Unit, check: DriftCheck | None, pass_s: float | None) -> Passes:
    """``--repeats auto``: the passes the host's jitter now asks for (see the module docstring)."""
    if check is None:
        return Passes(LEAST, True, limit="nothing cached to time the host on (no reference probe)")
    probe = check.reference.probe
    res = runner.profile(unit, [dataclasses.replace(probe, repeats=PILOT_RUNS)])
    times = np.asarray(res.runs[0].times_s, dtype=float)
    jitter = float(spread(times) / np.median(times))
    wanted = passes_for(jitter, target=TARGET, least=LEAST, most=MAX_MEASURE_REPEATS)
    n, limit = min(wanted, MOST), f"at most {MOST} passes" if wanted > MOST else ""
    if pass_s and pass_s > 0:
        fits = max(LEAST, int(BUDGET_S // pass_s))
        if fits < n:
            n, limit = fits, f"a {BUDGET_S:.0f} s budget of passes ({pass_s:.3g} s each, predicted)"
    return Passes(n, True, jitter, wanted, limit, res.compile_s + res.run_s)


def noise_line(se: float | None, repeats: int) -> str:
    """What the measurement's own noise (``se``, % of each request's median; None from one pass) lets its
    error say."""
    if se is None:
        return ("measurement noise: unknown with one pass (--repeats 3 or more gives each request's median and "
                "how far it can be trusted)")
    line = (f"measurement noise: each request's median over {repeats} passes is uncertain by about {se:.1f}% "
            f"(bootstrapped over the passes): prediction errors of that size are the measurement's own")
    if se > 1.0:  # the standard error of a median goes as 1/sqrt(passes)
        more = int(math.ceil(repeats * se ** 2))
        if more <= NOISE_HINT_REPEATS:
            line += f"; about --repeats {more} would bring it near 1%"
        elif repeats < NOISE_HINT_REPEATS:
            line += (f"; on a host this noisy even --repeats {NOISE_HINT_REPEATS} would leave about "
                     f"{se * math.sqrt(repeats / NOISE_HINT_REPEATS):.1f}%")
    return line


#: the serving metrics whose readings a continuous measurement compares pass by pass
PASS_METRICS = ("request_throughput_req_s", "ttft_p50_s", "ttft_p90_s", "tpot_p50_s", "tpot_p90_s", "e2e_p50_s",
                "e2e_p90_s")
#: a latency whose passes spread more than this is queueing that amplifies the host's noise
KNEE_SPREAD = 0.25


def pass_spreads(summaries: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Each of :data:`PASS_METRICS`'s spread over the passes' own summaries ((max - min) / median, a fraction)."""
    return {m: range_share([s[m] for s in summaries]) for m in PASS_METRICS}


def pass_intervals(summaries: Sequence[Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Where the true median of each of :data:`PASS_METRICS` lies about the passes' median: the distribution-free
    interval of the order statistics (``lens.serving_metrics.median_interval``), as shares of the passes' median
    below and above it, with the probability it holds (75% from three passes, their range; 96% from nine)."""
    out = {}
    for m in PASS_METRICS:
        vals = [s[m] for s in summaries]
        low, high, cover = median_interval(vals)
        med = float(np.median(vals))
        out[m] = {"below": (med - low) / med if med else math.nan, "above": (high - med) / med if med else math.nan,
                  "coverage": cover}
    return out


def pass_spread_line(summaries: Sequence[Mapping[str, float]]) -> str:
    """What each pass read of the serving metrics, and what a wide spread of the latencies means."""
    spreads = pass_spreads(summaries)
    parts = []
    for m in PASS_METRICS:
        vals = [s[m] for s in summaries]
        lo, hi = min(vals), max(vals)
        shown = f"{lo:.3g} to {hi:.3g} req/s" if m.endswith("_req_s") else f"{fmt_s(lo)} to {fmt_s(hi)}"
        parts.append(f"{metric_label(m)} {shown} ({spreads[m]:.0%})")
    line = f"over the {len(summaries)} passes: " + ", ".join(parts)
    wide = [m for m in PASS_METRICS if not m.endswith("_req_s") and spreads[m] > KNEE_SPREAD]
    if wide:
        at = pass_intervals(summaries)
        cover = at[wide[0]]["coverage"]
        where = ", ".join(f"{metric_label(m)} -{at[m]['below']:.0%} to +{at[m]['above']:.0%}" for m in wide)
        line += (f"; {', '.join(metric_label(m) for m in wide)} spread over {KNEE_SPREAD:.0%}: at this rate the "
                 f"queue amplifies the host's noise (near the knee), and the true median lies, with {cover:.0%} "
                 f"confidence whatever the noise's shape, within {where} of these passes' median: a prediction's "
                 f"error inside that cannot be told from the measurement's own noise")
    return line
