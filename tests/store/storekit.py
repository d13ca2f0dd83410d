"""Profiles and units to store in the tests of the store package."""
from __future__ import annotations

import sqlite3
from pathlib import Path

from lens.types import BucketProfile
from store import ProfileCache

FP = "0123456789abcdef"

#: schema 1 exactly as lensopt wrote it: tests build such a file from scratch, so every
#: migration step to the current schema runs on it
V1_SQL = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE units (
    fingerprint TEXT NOT NULL, tp INTEGER NOT NULL, batch INTEGER NOT NULL, target_json TEXT NOT NULL,
    runner TEXT NOT NULL, versions_json TEXT NOT NULL, host TEXT NOT NULL, compile_s REAL NOT NULL,
    run_s REAL NOT NULL, created_at REAL NOT NULL, PRIMARY KEY (fingerprint, tp, batch));
CREATE TABLE profiles (
    fingerprint TEXT NOT NULL, tp INTEGER NOT NULL, batch INTEGER NOT NULL, bucket INTEGER NOT NULL,
    ttft_s REAL NOT NULL, tbt_s REAL NOT NULL, input_len INTEGER NOT NULL, l1 INTEGER NOT NULL,
    l2 INTEGER NOT NULL, t1_s REAL NOT NULL, t2_s REAL NOT NULL, raw_t1 TEXT NOT NULL, raw_t2 TEXT NOT NULL,
    repeats INTEGER NOT NULL, spread REAL NOT NULL, runner TEXT NOT NULL, host TEXT NOT NULL,
    measured_at REAL NOT NULL, simulated INTEGER NOT NULL, source TEXT NOT NULL,
    PRIMARY KEY (fingerprint, tp, batch, bucket));
CREATE TABLE claims (
    fingerprint TEXT NOT NULL, tp INTEGER NOT NULL, batch INTEGER NOT NULL, buckets TEXT NOT NULL,
    owner TEXT NOT NULL, claimed_at REAL NOT NULL, expires_at REAL NOT NULL, PRIMARY KEY (fingerprint, tp, batch));
"""
V1_PROFILE_COLUMNS = ("fingerprint", "tp", "batch", "bucket", "ttft_s", "tbt_s", "input_len", "l1", "l2", "t1_s",
                      "t2_s", "raw_t1", "raw_t2", "repeats", "spread", "runner", "host", "measured_at", "simulated",
                      "source")


def profile(bucket: int, **kw) -> BucketProfile:
    """A valid profile of ``bucket`` whose values round-trip exactly (``kw`` overrides fields)."""
    base = dict(
        bucket=bucket, ttft_s=0.1 + 0.2 + bucket * 1e-4, tbt_s=1 / 3 * 1e-2, input_len=bucket - 1,
        l1=4, l2=64, t1_s=0.123456789012345, t2_s=0.987654321, repeats=3, spread=0.0125,
        runner="sim", host="host-a", measured_at=1_700_000_000.123, simulated=True,
        raw_t1=(0.12, 0.123456789012345, 0.13), raw_t2=(0.98, 0.99, 1e-9), source="simulated",
        resume_s=0.005, resume_idle=((0.004, 0.001), (0.1, 0.005)), resume_busy=((0.005, 0.001), (0.04, 0.008)),
        prefill_tail=(-0.001, 0.0, 0.0005, 0.004), prefill_tail_median_s=0.0065,
        decode_pace=(-0.15, -0.02, 0.0, 0.125, 0.5), decode_pace_window_s=0.0875, decode_pace_tau_s=0.25,
        host_costs_method=1,
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
