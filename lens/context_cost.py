"""What a live row's context costs a decode step: seconds per KV token the step's attention reads.

``TBT_b`` is one decode step of the whole compiled batch, measured by probes whose every
row holds the probe's prompt and grows with it. On a stack whose decode kernel has the
bucket's shape (NxD Inference's token generation, a masked attention over the whole
bucket) that is what every step in the bucket costs, whatever the rows hold. A paged
kernel (vLLM's ragged paged attention on TPU, GPU paged attention) reads only the pages
each row holds: a step then costs less for short contexts and free rows than the probes
measured, and more for long ones. Under continuous batching the live rows are a mix --
fewer of them at a light rate, at contexts the probes never held -- and a served TPOT
comes out below the profile by the attention the probes read and the served steps did
not (3-7 % on the simulated TPU fleet at batch 8).

The model: a step in bucket b whose live rows hold contexts c_1 .. c_r costs

    TBT_b - B (kv_token_s ref_b + h) + sum_i (kv_token_s c_i + h)

that is, ``TBT_b`` less what the probe's B rows cost at their mean context ``ref_b``
(``reference_context``), plus what the live rows cost at theirs; ``h`` is the host's
per-row work (``lens.rows``), which is measured at a short context and so holds that row's
reads too: ``host_row_s`` takes them out. With ``kv_token_s = 0`` this is the row cost's
TBT_b - (B - r) row_s. ``lens.serving`` composes it under continuous batching, and
``lens.compose`` for static batches, whose rows also hold contexts the probes did not
(short prompts in a wide bucket; rows that have finished).

The measurement, in the measured token-generation bucket with the widest window (``pick``):
``PAIRS`` pairs of two full batches of ``STEPS + 1``-token requests, one at the shortest
prompt whose decode steps run in that bucket, one at the longest; both decode in the same
compiled shape, so their decode times (last E2E - last first token, as ``lens.rows``)
differ only by what the longer contexts read: ``kv_token_s = (D_long - D_short) / (STEPS
B (long - short))``, from the median of each kind. It is kept only beyond ``SIGMAS``
standard errors (bootstrapped over the pairs), else 0 (a kernel of the bucket's shape),
and at most what makes the probes' reads the whole of TBT_b.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .buckets import bucket_ranges
from .noise import DRAWS, SEED
from .rows import decode_times, median_difference
from .types import BucketProfile, Requests

#: decode steps of each batch: long enough that the reads of 16 steps of a whole batch stand out of a step's
#: noise, short enough that a rare slow call lands on few batches (a median then sees past it)
STEPS = 16
#: pairs of batches (the row cost's 24 pairs of 8 steps, at half the pairs of twice the steps)
PAIRS = 12
#: the two prompts must differ by at least this many tokens for the difference to mean anything
MIN_SPAN = 32
#: kept only beyond this many standard errors (as lens.rows's row cost and lens.admission's offsets)
SIGMAS = 3.0


@dataclass(frozen=True)
class ContextCost:
    """Seconds per KV token a decode step reads (``value``), as measured and as kept."""

    value: float
    #: one standard error of ``raw`` (bootstrapped over the pairs)
    err: float
    #: the estimate before the significance test and the bound
    raw: float
    #: the bucket it was measured in, and the two prompts (0: not measured)
    bucket: int = 0
    short_len: int = 0
    long_len: int = 0
    #: why ``value`` is not ``raw`` ("" when it is)
    note: str = ""

    def said(self) -> str:
        """One line for the profile output."""
        per_k = f"{self.value * 1e9:.2f} ns per KV token per decode step"
        where = f" (bucket {self.bucket}, prompts {self.short_len} and {self.long_len})" if self.bucket else ""
        if self.note:
            return f"{per_k}{where}: {self.note}"
        return f"{per_k} (+- {self.err * 1e9:.2f}){where}"


def unit_context_cost(profiles: Sequence[BucketProfile]) -> tuple[float, float]:
    """A unit's (kv_token_s, row_context) from its profiles: their medians (one measurement gives them all the
    same); zeros without any."""
    if not profiles:
        return 0.0, 0.0
    return (float(np.median([p.kv_token_s for p in profiles])),
            float(np.median([p.row_context for p in profiles])))


def reference_context(p: BucketProfile) -> float:
    """The mean context of a row over the decode steps TBT_b is the slope of: L1 .. L2 - 1 steps past the prompt."""
    return p.input_len + (p.l1 + p.l2 - 1) / 2.0


def host_row_s(row_s: float, kv_token_s: float, row_context: float) -> float:
    """The host's part of the row cost ``row_s`` (lens.rows), measured on a row of mean context ``row_context``:
    what is left once that row's own reads are taken out; never below 0."""
    return max(row_s - kv_token_s * row_context, 0.0)


def unread_tbt_s(tbt_s: np.ndarray, ref: np.ndarray, batch: int, kv_token_s: float) -> np.ndarray:
    """Per token-generation bucket, TBT_b less what the probe's B rows read at their mean context ``ref``: a
    step then costs this, plus ``kv_token_s`` per context token of each live row, less the host's part of the
    row cost for each free row."""
    return np.asarray(tbt_s, dtype=np.float64) - batch * kv_token_s * np.asarray(ref, dtype=np.float64)


def pick(profiles: Mapping[int, BucketProfile], buckets: Sequence[int], policy: str
         ) -> tuple[BucketProfile, int, int] | None:
    """The bucket to measure in, with its short and long prompt: the measured token-generation bucket whose
    window leaves the widest span of prompts whose ``STEPS`` decode steps all run in it; None when no window
    spans ``MIN_SPAN``."""
    bk = sorted(buckets)
    lo, hi = bucket_ranges(bk, policy)
    best = None
    for b, a, z in zip(bk, lo.tolist(), hi.tolist()):
        short, long_ = max(a - 1, 1), z - STEPS  # contexts short + 1 .. long + STEPS, all in [a, z]
        if b in profiles and long_ - short >= MIN_SPAN and (best is None or long_ - short > best[2] - best[1]):
            best = (profiles[b], short, long_)
    return best


def workload(short: int, long_: int, batch: int, pairs: int = PAIRS) -> Requests:
    """``pairs`` pairs of a full batch of ``short``-token prompts and one of ``long_``-token ones, alternating."""
    lin = np.concatenate([np.full(batch, short), np.full(batch, long_)] * pairs)
    return Requests(lin.astype(np.int64), np.full(len(lin), STEPS + 1, dtype=np.int64), name="context-cost")


def solve(ttft_s: Sequence[float], e2e_s: Sequence[float], *, p: BucketProfile, short: int, long_: int, batch: int,
          draws: int = DRAWS, seed: int = SEED) -> ContextCost:
    """``kv_token_s`` from ``workload``'s run (its per-request TTFT and E2E) in bucket ``p``."""
    d_short, d_long = decode_times(ttft_s, e2e_s, batch)
    if d_short.size == 0 or d_short.size != d_long.size:
        return ContextCost(0.0, 0.0, 0.0, p.bucket, short, long_, "no whole pair was run")
    per = STEPS * batch * (long_ - short)
    raw, err = median_difference(d_long, d_short, per, draws=draws, seed=seed)
    if raw <= SIGMAS * err:
        return ContextCost(0.0, err, raw, p.bucket, short, long_,
                           f"{raw * 1e9:.2f} ns +- {err * 1e9:.2f}: within {SIGMAS:g} standard errors of none, "
                           "none counted: TBT_b whatever the rows hold")
    bound = p.tbt_s / (batch * max(reference_context(p), 1.0))
    if raw > bound:
        return ContextCost(bound, err, raw, p.bucket, short, long_,
                           f"measured {raw * 1e9:.2f} ns; bounded where the probes' reads are the whole of TBT_b")
    return ContextCost(raw, err, raw, p.bucket, short, long_)
