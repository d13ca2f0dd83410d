"""Which compiled bucket a length runs in: the simulated machine's own rule.

Written apart from the estimator's selection code on purpose: a bug in one must not hide
in the other. ``exclusive`` (NxD Inference's default): the smallest bucket b with l < b,
the largest bucket also taking l == b. ``inclusive`` (transformers-neuronx, TPU padding):
the smallest b with l <= b. A length that fits no bucket gets -1.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from lens.errors import UserError
from lens.types import POLICIES


def check_buckets(buckets: Sequence[int], *, what: str) -> tuple[int, ...]:
    """The buckets as a tuple of ints; ``UserError`` unless positive integers, strictly increasing."""
    out = []
    for x in buckets:
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
            raise UserError(f"sim runner: {what}: {x!r} is not a positive integer token length")
        out.append(int(x))
    if not out:
        raise UserError(f"sim runner: {what}: no bucket given")
    if any(b <= a for a, b in zip(out, out[1:])):
        raise UserError(f"sim runner: {what}: {out} is not strictly increasing; sort them and drop repeats")
    return tuple(out)


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise UserError(f"sim runner: bucket_policy {policy!r} is unknown: use one of {', '.join(POLICIES)}")
    return policy


def bucket_index(lengths, buckets: Sequence[int], policy: str) -> np.ndarray:
    """Index into ``buckets`` (sorted) of the bucket each length runs in; -1 where none holds it."""
    b = np.asarray(buckets, dtype=np.int64)
    ln = np.asarray(lengths, dtype=np.int64)
    # the number of buckets a length has outgrown: b <= l (exclusive) or b < l (inclusive)
    outgrown = (b <= ln[..., None]) if policy == "exclusive" else (b < ln[..., None])
    idx = outgrown.sum(axis=-1)
    if policy == "exclusive":
        idx = np.where(ln == b[-1], len(b) - 1, idx)  # the largest bucket also takes its own length
    elif policy != "inclusive":
        check_policy(policy)
    return np.where((idx >= len(b)) | (ln < 1), -1, idx)
