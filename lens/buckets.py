"""Bucket sets and the two bucket-selection policies.

``exclusive`` (NxD Inference's default): a length l runs in the smallest bucket b with
l < b; the largest bucket also takes l == b.  ``inclusive`` (transformers-neuronx, TPU
padding): the smallest b with l <= b.
"""
from __future__ import annotations

from typing import Iterable, Iterator, Sequence

import numpy as np

from .errors import UserError
from .types import POLICIES


def validate_buckets(buckets: Iterable[int], *, what: str = "buckets") -> tuple[int, ...]:
    """Return the buckets as a tuple; raise ``UserError`` unless positive and strictly increasing."""
    b = tuple(buckets)
    if not b:
        raise UserError(f"{what}: empty bucket list; give at least one positive length")
    for x in b:
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
            raise UserError(f"{what}: {x!r} is not an integer token length")
        if x <= 0:
            raise UserError(f"{what}: {x} is not positive; bucket lengths are token counts >= 1")
    for a, c in zip(b, b[1:]):
        if c <= a:
            raise UserError(f"{what}: {list(b)} is not strictly increasing ({a} then {c}); sort them and drop repeats")
    return tuple(int(x) for x in b)


def check_policy(policy: str) -> str:
    if policy not in POLICIES:
        raise UserError(f"bucket_policy {policy!r} is unknown: use one of {', '.join(POLICIES)}")
    return policy


def auto_buckets(max_len: int, *, start: int = 128) -> tuple[int, ...]:
    """NxD Inference automatic bucketing: powers of two from ``start`` up to ``max_len``, then ``max_len``."""
    if max_len <= 0:
        raise UserError(f"max length {max_len} is not positive")
    out = []
    b = start
    while b < max_len:
        out.append(b)
        b *= 2
    out.append(max_len)
    return tuple(out)


def bucket_ranges(buckets: Sequence[int], policy: str) -> tuple[np.ndarray, np.ndarray]:
    """Inclusive integer length ranges [lo_k, hi_k] that run in bucket k under ``policy``.

    Lengths are >= 1.  Exclusive: [b_{k-1}, b_k - 1], the last bucket [b_{K-2}, b_K-1].
    Inclusive: [b_{k-1} + 1, b_k].  A range may be empty (lo > hi) for a degenerate set.
    """
    b = np.asarray(buckets, dtype=np.int64)
    prev = np.concatenate([[0], b[:-1]])
    if policy == "exclusive":
        lo = np.maximum(prev, 1)
        hi = b - 1
        hi[-1] = b[-1]
    elif policy == "inclusive":
        lo = prev + 1
        hi = b.copy()
    else:
        check_policy(policy)
        raise AssertionError("unreachable")
    return lo, hi


def select_index(lengths, buckets: Sequence[int], policy: str) -> np.ndarray:
    """Index into ``buckets`` of the bucket each length runs in; -1 where none holds it."""
    b = np.asarray(buckets, dtype=np.int64)
    ln = np.asarray(lengths, dtype=np.int64)
    if policy == "exclusive":
        idx = np.searchsorted(b, ln, side="right")  # first b with l < b
        idx = np.where((idx == len(b)) & (ln == b[-1]), len(b) - 1, idx)
    elif policy == "inclusive":
        idx = np.searchsorted(b, ln, side="left")  # first b with l <= b
    else:
        check_policy(policy)
        raise AssertionError("unreachable")
    return np.where((idx >= len(b)) | (ln < 1), -1, idx)


def select(length: int, buckets: Sequence[int], policy: str) -> int:
    """The bucket a single length runs in; ``UserError`` if it fits in none."""
    i = int(select_index([length], buckets, policy)[0])
    if i < 0:
        raise UserError(
            f"length {length} does not fit the bucket set {list(buckets)} under the {policy} policy; "
            f"add a larger bucket or shorten the request"
        )
    return int(buckets[i])


def decode_contexts(input_len, output_len) -> tuple[int, int] | None:
    """The range [lo, hi] of contexts the requests' decode steps run at (None: no request decodes).

    A request of prompt ``l`` and ``o`` output tokens decodes at contexts l + 1 .. l + o - 1.
    """
    lin, lout = np.asarray(input_len, dtype=np.int64), np.asarray(output_len, dtype=np.int64)
    dec = lout > 1
    if not dec.any():
        return None
    return int(lin[dec].min()) + 1, int((lin + lout - 1)[dec].max())


def used_buckets(ctx_buckets: Sequence[int], tkg_buckets: Sequence[int], input_len, *, policy: str,
                 contexts: tuple[int, int] | None) -> frozenset[int]:
    """The buckets whose numbers a prediction of these requests can depend on.

    A context-encoding bucket is used when some prompt runs in it; a token-generation bucket
    when its length range meets the decode ``contexts`` (``decode_contexts``: a superset,
    never a bucket in use left out).
    """
    ctx = np.asarray(ctx_buckets, dtype=np.int64)
    idx = select_index(input_len, ctx, policy)
    used = set(ctx[np.unique(idx[idx >= 0])].tolist())
    if contexts is not None:
        lo, hi = bucket_ranges(tkg_buckets, policy)
        used |= {b for b, a, z in zip(tkg_buckets, lo, hi) if a <= contexts[1] and z >= contexts[0]}
    return frozenset(int(b) for b in used)


def decode_windows(measured: Iterable[int], buckets: Sequence[int],
                   policy: str) -> Iterator[tuple[int, int, int, int]]:
    """(token-generation bucket, prompt, room, the prompt's context-encoding bucket) from the smallest bucket up,
    for a served measurement whose request must decode in one bucket from its first step to its last: the prompt
    at the bucket's window's start, ``room`` the decode steps the window holds after it. Only buckets
    ``measured``, whose prompt's context-encoding bucket is ``measured`` too."""
    have = set(measured)
    bk = sorted(buckets)
    lo, hi = bucket_ranges(bk, policy)
    for b, a, z in zip(bk, lo.tolist(), hi.tolist()):
        prompt = max(a - 1, 1)  # contexts prompt + 1 .. prompt + room, all in [a, z]
        ci = int(select_index([prompt], bk, policy)[0])
        if b in have and prompt + 1 >= a and ci >= 0 and bk[ci] in have:
            yield b, prompt, z - prompt, bk[ci]


def max_length(buckets: Sequence[int]) -> int:
    """The longest length a bucket set holds (under both policies, the largest bucket)."""
    return int(buckets[-1])
