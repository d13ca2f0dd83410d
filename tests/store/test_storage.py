"""ProfileCache: storing and reading units and profiles, removal, two writer processes at once."""
from __future__ import annotations

import multiprocessing as mp
import shutil
import sqlite3

import pandas as pd
import pytest

from storekit import FP, profile, put

from store import ProfileCache


def test_round_trip_put_get(cache):
    put(cache)
    got = cache.get_unit(FP, 2, 4)
    assert list(got) == [128, 256, 512]
    for b, p in got.items():
        assert p == profile(b)
    assert cache.get_unit(FP, 2, 8) == {}


def test_missing_and_fingerprint_change(cache):
    put(cache, buckets=(128, 512))
    assert cache.missing(FP, 2, 4, [128, 256, 512, 1024]) == [256, 1024]
    assert cache.missing(FP, 2, 4, [512, 128]) == []
    assert cache.missing(FP, 2, 4, []) == []
    # another fingerprint, tp or batch is another unit: all missing
    assert cache.missing("fedcba9876543210", 2, 4, [128, 512]) == [128, 512]
    assert cache.missing(FP, 4, 4, [128]) == [128]
    assert cache.missing(FP, 2, 8, [128]) == [128]
    assert cache.get_unit("fedcba9876543210", 2, 4) == {}


def test_put_again_accumulates_seconds_and_replaces_buckets(cache):
    put(cache, buckets=(128, 256))
    cache.put_unit(
        fingerprint=FP, tp=2, batch=4, profiles=[profile(256, ttft_s=9.0), profile(1024)],
        target={}, runner="sim", versions={}, host="host-b", compile_s=1.5, run_s=0.5,
    )
    got = cache.get_unit(FP, 2, 4)
    assert list(got) == [128, 256, 1024]
    assert got[256].ttft_s == 9.0 and got[128] == profile(128)
    units = cache.units()
    assert len(units) == 1
    row = units.iloc[0]
    assert row.compile_s == 11.5 and row.run_s == 5.5
    assert tuple(row.buckets) == (128, 256, 1024) and row.n_buckets == 3
    assert row.host_costs_method == 1  # every profile's (storekit's)
    # a unit is as old as its oldest profile's host costs (lens.methods)
    cache.put_unit(fingerprint=FP, tp=2, batch=4, profiles=[profile(2048, host_costs_method=0)], target={},
                   runner="sim", versions={}, host="host-b", compile_s=0.0, run_s=0.0)
    assert cache.units().iloc[0].host_costs_method == 0


def test_put_unit_is_atomic(cache):
    with pytest.raises((ValueError, TypeError)):
        cache.put_unit(
            fingerprint=FP, tp=2, batch=4,
            profiles=[profile(128), profile(256), profile(None)],  # fails after two rows
            target={}, runner="sim", versions={}, host="h", compile_s=1.0, run_s=1.0,
        )
    assert cache.get_unit(FP, 2, 4) == {}
    assert cache.units().empty and cache.frame().empty
    # a failed re-profile of an existing unit leaves the unit as it was
    put(cache, buckets=(128,))
    before = cache.frame()
    with pytest.raises(ValueError, match="ttft_s"):
        cache.put_unit(
            fingerprint=FP, tp=2, batch=4, profiles=[profile(128, ttft_s=7.0), profile(256, ttft_s=-1.0)],
            target={}, runner="sim", versions={}, host="h", compile_s=99.0, run_s=99.0,
        )
    pd.testing.assert_frame_equal(cache.frame(), before)
    assert cache.units().iloc[0].compile_s == 10.0


@pytest.mark.parametrize("bad", [{"ttft_s": float("nan")}, {"tbt_s": -0.1}, {"bucket": 0},
                                 {"l1": -1}, {"raw_t1": (0.1, float("inf"))}, {"source": "guessed"}])
def test_put_unit_rejects_values_import_would_reject(cache, bad):
    bad = dict(bad)
    with pytest.raises(ValueError):
        cache.put_unit(fingerprint=FP, tp=1, batch=1, profiles=[profile(bad.pop("bucket", 128), **bad)], target={},
                       runner="sim", versions={}, host="h", compile_s=0.0, run_s=0.0)
    assert cache.frame().empty


def test_remove(cache):
    put(cache, tp=1, buckets=(128, 256))
    put(cache, tp=2, buckets=(128, 256))
    put(cache, fp="ffff000011112222", tp=2, buckets=(128,))
    assert cache.remove(fingerprint=FP, tp=1, bucket=128) == 1
    assert cache.missing(FP, 1, 4, [128, 256]) == [128]
    assert cache.remove(tp=1) == 1  # unit (FP, 1, 4) now has no profiles: its row goes too
    assert sorted(cache.units().tp) == [2, 2]
    con = sqlite3.connect(cache.path)
    try:
        assert con.execute("SELECT count(*) FROM units WHERE tp = 1").fetchone()[0] == 0
    finally:
        con.close()
    assert cache.remove(fingerprint="nope") == 0
    assert cache.remove() == 3
    assert cache.units().empty and cache.frame().empty


def test_closed_cache_copies_whole(tmp_path):
    # a copy of a closed cache is a complete cache (WAL is checkpointed on close)
    with ProfileCache.open(tmp_path / "a.sqlite") as c:
        put(c)
    shutil.copy(tmp_path / "a.sqlite", tmp_path / "b.sqlite")
    with ProfileCache.open(tmp_path / "b.sqlite") as c:
        assert list(c.get_unit(FP, 2, 4)) == [128, 256, 512]


# -- two processes at once --------------------------------------------------------------
def _writer(path: str, worker: int, n_units: int, start) -> None:
    start.wait(60)  # both begin together, so creation and writes really overlap
    with ProfileCache.open(path) as c:
        for u in range(n_units):
            c.put_unit(
                fingerprint=f"w{worker}-{u:04d}", tp=1 + u % 4, batch=1 + u % 3,
                profiles=[profile(b) for b in (128, 256, 512)], target={"worker": worker},
                runner="sim", versions={}, host=f"host-{worker}", compile_s=1.0, run_s=0.5,
            )
            c.get_unit(f"w{1 - worker}-{u:04d}", 1 + u % 4, 1 + u % 3)  # read beside the other writer


def test_two_writer_processes(tmp_path):
    path = str(tmp_path / "shared" / "p.sqlite")  # both processes race to create it too
    n = 60
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(2)
    procs = [ctx.Process(target=_writer, args=(path, w, n, start)) for w in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    with ProfileCache.open(path) as c:
        assert c.integrity_check() == "ok"
        units = c.units()
        assert len(units) == 2 * n and len(c.frame()) == 2 * n * 3
        for w in (0, 1):
            for u in range(n):
                assert c.missing(f"w{w}-{u:04d}", 1 + u % 4, 1 + u % 3, [128, 256, 512]) == []
        assert set(units.compile_s) == {1.0}
        # the two writers' transactions interleaved (else this test proves little)
        t = units.assign(worker=units.fingerprint.str[1]).groupby("worker").created_at.agg(["min", "max"])
        assert t.loc["0", "min"] < t.loc["1", "max"] and t.loc["1", "min"] < t.loc["0", "max"]
