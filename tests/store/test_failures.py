"""Failed units remembered in the cache, and caches of an older schema brought up to date."""
from __future__ import annotations

import sqlite3

import pytest

from storekit import FP, V1_PROFILE_COLUMNS, V1_SQL, profile, put

from lens.errors import CacheError
from store import SCHEMA_VERSION, ProfileCache, new_claimant_id
from store.rows import profile_row
from store.schema import APPLICATION_ID

OOM = "DeviceOutOfMemory: out of device memory: tp 1, batch 32 needs 41 GiB of 32 GiB"


def test_a_failure_is_remembered_with_its_reason_host_and_date(cache):
    assert cache.get_failure(FP, 1, 32) is None
    cache.put_failure(fingerprint=FP, tp=1, batch=32, reason=OOM, kind="DeviceOutOfMemory", host="npu-7")
    f = cache.get_failure(FP, 1, 32)
    assert f is not None and f.reason == OOM and f.kind == "DeviceOutOfMemory" and f.host == "npu-7"
    assert f.failed_at > 1.7e9 and f.when().startswith("20")
    assert "recorded in the profile cache on" in f.describe() and "--retry-failed" in f.describe()
    assert cache.get_failure(FP, 1, 16) is None and cache.get_failure("e" * 16, 1, 32) is None
    table = cache.failures()
    assert table[["fingerprint", "tp", "batch", "reason"]].values.tolist() == [[FP, 1, 32, OOM]]
    assert cache.units().empty  # a failure is not a unit with profiles


def test_recording_a_failure_ends_the_claim_and_profiles_end_the_failure(cache):
    owner = new_claimant_id()
    assert cache.claim_unit(fingerprint=FP, tp=2, batch=4, buckets=[128], owner=owner, lease_s=60).granted
    cache.put_failure(fingerprint=FP, tp=2, batch=4, reason=OOM, kind="DeviceOutOfMemory", host="h",
                      release_owner=owner)
    assert cache.claims().empty
    put(cache, FP, tp=2, batch=4)  # measured after all (a retry on a bigger device, a fixed driver)
    assert cache.get_failure(FP, 2, 4) is None and cache.failures().empty


def test_forget_failures_by_filter(cache):
    for tp, b in ((1, 8), (1, 16), (2, 16)):
        cache.put_failure(fingerprint=FP, tp=tp, batch=b, reason="x", kind="UnitRefused", host="h")
    assert cache.forget_failures(tp=1, batch=16) == 1
    assert cache.forget_failures(fingerprint="e" * 16) == 0
    assert sorted(map(tuple, cache.failures()[["tp", "batch"]].values.tolist())) == [(1, 8), (2, 16)]
    assert cache.forget_failures() == 2 and cache.failures().empty


def _v1_cache(path, buckets=(128, 256)) -> None:
    con = sqlite3.connect(path, isolation_level=None)
    con.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    con.execute("PRAGMA user_version = 1")
    con.executescript(V1_SQL)
    con.execute("INSERT INTO meta VALUES ('schema', '1'), ('application', 'lensopt profile cache')")
    con.execute("INSERT INTO units VALUES (?, 2, 4, '{}', 'sim', '{}', 'host-a', 10.0, 5.0, 1.7e9)", (FP,))
    for b in buckets:
        row = profile_row(FP, 2, 4, profile(b))[:len(V1_PROFILE_COLUMNS)]
        con.execute(f"INSERT INTO profiles VALUES ({', '.join('?' * len(V1_PROFILE_COLUMNS))})", row)
    con.execute("PRAGMA journal_mode = WAL")
    con.close()


def test_a_schema_1_cache_is_brought_up_to_date_with_its_profiles_intact(tmp_path):
    path = tmp_path / "old.sqlite"
    _v1_cache(path)
    with ProfileCache.open(path) as c:
        got = c.get_unit(FP, 2, 4)
        assert sorted(got) == [128, 256]
        for b, p in got.items():
            want = profile(b)
            assert (p.ttft_s, p.tbt_s, p.raw_t1, p.raw_t2, p.host) == (want.ttft_s, want.tbt_s, want.raw_t1,
                                                                      want.raw_t2, want.host)
        c.put_failure(fingerprint=FP, tp=1, batch=64, reason=OOM, kind="DeviceOutOfMemory", host="h")
        assert c.get_failure(FP, 1, 64).reason == OOM
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert con.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0] == str(SCHEMA_VERSION)
    finally:
        con.close()
    with ProfileCache.open(path) as c:  # a second open finds it current and changes nothing
        assert sorted(c.get_unit(FP, 2, 4)) == [128, 256]


def test_a_schema_1_file_that_is_not_whole_is_refused_and_left_as_it_was(tmp_path):
    path = tmp_path / "odd.sqlite"
    _v1_cache(path)
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("CREATE TABLE failures (x TEXT)")  # not what schema 1 had: the step to 2 cannot run
    con.close()
    before = path.read_bytes()
    with pytest.raises(CacheError, match="damaged.*schema version 1 could not be brought"):
        ProfileCache.open(path)
    assert path.read_bytes() == before
