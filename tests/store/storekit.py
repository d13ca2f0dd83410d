"""Profiles and units to store in the tests of the store package."""
from __future__ import annotations

import sqlite3
from pathlib import Path

from lens.types import BucketProfile
from store import ProfileCache

FP = "0123456789abcdef"


def profile(bucket: int, **kw) -> BucketProfile:
    """A valid profile of ``bucket`` whose values round-trip exactly (``kw`` overrides fields)."""
    base = dict(
        bucket=bucket, ttft_s=0.1 + 0.2 + bucket * 1e-4, tbt_s=1 / 3 * 1e-2, input_len=bucket - 1,
        l1=4, l2=64, t1_s=0.123456789012345, t2_s=0.987654321, repeats=3, spread=0.0125,
        runner="sim", host="host-a", measured_at=1_700_000_000.123, simulated=True,
        raw_t1=(0.12, 0.123456789012345, 0.13), raw_t2=(0.98, 0.99, 1e-9), source="simulated",
    )
    base.update(kw)
    return BucketProfile(**base)


def put(cache: ProfileCache, fp: str = FP, tp: int = 2, batch: int = 4, buckets=(128, 256, 512), **kw) -> None:
    """Store unit (fp, tp, batch) with a profile of each of ``buckets`` (``kw`` overrides put_unit's arguments)."""
    args = dict(
        fingerprint=fp, tp=tp, batch=batch, profiles=[profile(b) for b in buckets],
        target={"name": "t", "model": {"layers": 2}}, runner="sim", versions={"python": "3.11"},
        host="host-a", compile_s=10.0, run_s=5.0,
    )
    args.update(kw)
    cache.put_unit(**args)


def tamper(path: Path, *statements: str) -> None:
    """Change the cache file at ``path`` behind ProfileCache's back, with plain SQLite."""
    con = sqlite3.connect(path)
    try:
        for stmt in statements:
            con.execute(stmt)
        con.commit()
    finally:
        con.close()
