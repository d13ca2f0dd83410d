"""The host's cost per live row of a decode step, measured by a one-row batch against a full one.

``TBT_b`` is one decode step of the whole compiled batch: the device computes every row,
live or not. The host's share of a step -- sampling, stop checks, detokenizing and
streaming each live request's token -- follows the rows still generating. A static batch
whose requests end at different times, and a continuous batch with free slots, then pay
less per step than the full-batch probes measured: ``row_s`` for each row that is not
live. LENS's probes cannot see it (every row of a probe lives to its end), so a large
batch of mixed output lengths runs faster than they compose.

The measurement: one static workload of ``pairs`` pairs of batches in the unit's smallest
measured bucket, one after the other so that a slow minute of the host lands on both
alike:

- *full*: every row generates ``STEPS + 1`` tokens (its first from the prefill);
- *one row*: row 0 generates as many, every other row only its first token.

Both prefill the same prompts and decode over the same contexts, so their decode times
(a batch's last E2E minus its last TTFT, both from the batch's start) differ only by the
``batch - 1`` rows that are not live in the second: ``row_s = (D_full - D_one) /
((batch - 1) STEPS)``, from the median of each kind. Timing the decode part alone keeps
the prefills' noise out of it (a runner that reports no TTFT still gives an unbiased
difference: both batches make the same prefills).

``STEPS`` is short on purpose: a rare slow call (a straggler) lands on few of such short
runs, and a median ignores those; over long runs every run would carry some and the
median would no longer see past them. Measured on the simulated fleet with 1 call in 50
taking 4x (24 units, a 20 us cost; docs/noise.md): 8 steps and 24 pairs gave 21.3 +- 2.6
us, 32 steps 14 +- 39; the median of each pair's difference 21.7 +- 4.2 (a straggler in
either batch spoils the pair); 8 pairs 13 +- 37, too few for a median to see past them.
Its noise is bootstrapped over the pairs; it is kept only when it is beyond ``SIGMAS``
standard errors (else 0: the host shows none), and at most ``MAX_SHARE`` of the bucket's
``TBT_b`` over the batch (a step's host work for one row cannot be most of the step). A
batch of one has no row that could end early: none.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .noise import DRAWS, SEED, spread
from .types import BucketProfile, Requests

#: decode steps of each batch of the measurement
STEPS = 8
#: pairs of batches behind a row cost. On the simulated straggler fleet 24 measured its 20 us to +- 2.6 us
#: and 16 to +- 3.1, but a wider +- fails the significance test more often: of the 32 units of
#: benchmarks/stragglers.py, 16 pairs counted none for 8 (2 at batch 32, whose throughput then came out
#: up to 3.7% low), 24 for 2 (none at batch 32: within 2.2%). 24 cost the quickstart's batch-8 unit on
#: the jax runner 13% more profiling runs, for a cost that host does not have
PAIRS = 24
#: the most of TBT_b / batch a row's host cost may be taken for
MAX_SHARE = 0.5
#: a row cost is kept only beyond this many of its standard errors: a search measures dozens of units,
#: and at 2 one unit in 40 of a host with no such cost would count one (3: about one in 700)
SIGMAS = 3.0


@dataclass(frozen=True)
class RowCost:
    """Seconds per live row per decode step (``value``), as measured and as kept."""

    value: float
    #: one standard error of ``raw`` (bootstrapped over the pairs)
    err: float
    #: the estimate before the significance test and the cap
    raw: float
    #: why ``value`` is not ``raw`` ("" when it is)
    note: str = ""

    def said(self) -> str:
        """One line for the profile output: the value kept and, when it differs, why."""
        kept = f"{self.value * 1e6:.1f} us per live row per decode step"
        return f"{kept} ({self.note})" if self.note else f"{kept} (+- {self.err * 1e6:.1f})"


def unit_row_s(profiles: Sequence[BucketProfile]) -> float:
    """The row cost of a unit from its profiles: their median (one measurement gives them all the
    same; buckets measured at different times may differ); 0 without any."""
    return float(np.median([p.row_s for p in profiles])) if profiles else 0.0


def steps_for(p: BucketProfile) -> int:
    """Decode steps of the measurement's batches in bucket ``p``: ``STEPS``, fewer when its window is shorter."""
    return max(min(STEPS, p.l2 - 1), 0)


def measured_context(p: BucketProfile) -> float:
    """The mean context of a live row over the measurement's decode steps in bucket ``p``."""
    return p.input_len + (steps_for(p) + 1) / 2.0


def workload(p: BucketProfile, batch: int, pairs: int = PAIRS) -> Requests:
    """``pairs`` pairs of a full and a one-row batch of bucket ``p``'s prompt, one after the other."""
    full = np.full(batch, steps_for(p) + 1, dtype=np.int64)
    one = np.ones(batch, dtype=np.int64)
    one[0] = full[0]
    out = np.concatenate([full, one] * pairs)
    return Requests(np.full(len(out), p.input_len, dtype=np.int64), out, name=f"row-cost-{p.bucket}")


def decode_times(ttft_s: Sequence[float], e2e_s: Sequence[float], batch: int) -> tuple[np.ndarray, np.ndarray]:
    """The full and the one-row batches' decode seconds in ``workload``'s run (last E2E - last TTFT)."""
    e = np.asarray(e2e_s, dtype=float).reshape(-1, batch)
    t = np.asarray(ttft_s, dtype=float).reshape(-1, batch)
    d = e.max(axis=1) - t.max(axis=1)
    return d[0::2], d[1::2]


def median_difference(a: np.ndarray, b: np.ndarray, per: float, *, draws: int = DRAWS, seed: int = SEED
                      ) -> tuple[float, float]:
    """(median(a) - median(b)) / per for paired runs, and its standard error bootstrapped over the pairs (each
    pair drawn whole, so a slow minute that lands on both runs of a pair stays paired)."""
    raw = float(np.median(a) - np.median(b)) / per
    idx = np.random.default_rng(seed).integers(0, a.size, size=(draws, a.size))
    return raw, float(spread((np.median(a[idx], axis=1) - np.median(b[idx], axis=1)) / per))


def solve(full_s: Sequence[float], one_s: Sequence[float], *, p: BucketProfile, batch: int,
          draws: int = DRAWS, seed: int = SEED) -> RowCost:
    """``row_s`` from the decode seconds of the full and the one-row batches (one of each per pair)."""
    span = (batch - 1) * steps_for(p)
    if batch < 2 or span <= 0:
        return RowCost(0.0, 0.0, 0.0, "no row of the batch can end early")
    f, o = np.asarray(full_s, dtype=float), np.asarray(one_s, dtype=float)
    if f.size == 0 or f.size != o.size:
        return RowCost(0.0, 0.0, 0.0, "no whole pair was run")
    raw, err = median_difference(f, o, span, draws=draws, seed=seed)
    if raw <= SIGMAS * err:
        return RowCost(0.0, err, raw, f"{raw * 1e6:.1f} us +- {err * 1e6:.1f}: within {SIGMAS:g} standard errors "
                                      "of none, none counted")
    cap = MAX_SHARE * max(p.tbt_s, 0.0) / batch
    if raw > cap:
        return RowCost(cap, err, raw, f"{raw * 1e6:.1f} us, capped at {MAX_SHARE:g} TBT_b / batch")
    return RowCost(raw, err, raw)
