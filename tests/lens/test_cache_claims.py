"""Claims on units in the shared cache, damage found at open, and salvage of a damaged file."""
from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
import time

import pytest

from lens.cache import ProfileCache, claimant_alive, new_claimant_id, recover
from lens.errors import CacheError
from lens.types import BucketProfile

FP = "c" * 16


def _profile(b: int) -> BucketProfile:
    return BucketProfile(bucket=b, ttft_s=0.01, tbt_s=0.001, input_len=b // 2, l1=2, l2=32, t1_s=0.1, t2_s=0.2,
                         repeats=3, spread=0.01, raw_t1=(0.1,) * 3, raw_t2=(0.2,) * 3, source="simulated", simulated=True)


def _put(c: ProfileCache, buckets=(128, 256), owner=None, tp=1, batch=1):
    c.put_unit(fingerprint=FP, tp=tp, batch=batch, profiles=[_profile(b) for b in buckets], target={}, runner="sim",
               versions={}, host="h", compile_s=1.0, run_s=1.0, release_owner=owner)


@pytest.fixture
def cache(tmp_path):
    with ProfileCache.open(tmp_path / "p.sqlite") as c:
        yield c


def test_a_claim_is_exclusive_until_stored(cache):
    a, b = new_claimant_id(), new_claimant_id()
    got = cache.claim_unit(fingerprint=FP, tp=1, batch=1, buckets=[256, 128], owner=a, lease_s=60)
    assert got.granted and got.missing == (128, 256)
    other = cache.claim_unit(fingerprint=FP, tp=1, batch=1, buckets=[128], owner=b, lease_s=60)
    assert not other.granted and other.holder == a and other.missing == (128,)
    assert cache.claim_unit(fingerprint=FP, tp=1, batch=1, buckets=[128], owner=a, lease_s=60).granted  # its own
    _put(cache, owner=a)  # stored: the claim ends in the same transaction
    assert cache.claims().empty
    done = cache.claim_unit(fingerprint=FP, tp=1, batch=1, buckets=[128, 256], owner=b, lease_s=60)
    assert not done.granted and done.missing == ()  # nothing left to measure: nothing claimed
    part = cache.claim_unit(fingerprint=FP, tp=1, batch=1, buckets=[128, 512], owner=b, lease_s=60)
    assert part.granted and part.missing == (512,)


def test_other_units_are_not_blocked(cache):
    a, b = new_claimant_id(), new_claimant_id()
    assert cache.claim_unit(fingerprint=FP, tp=1, batch=1, buckets=[128], owner=a).granted
    assert cache.claim_unit(fingerprint=FP, tp=1, batch=2, buckets=[128], owner=b).granted
    assert cache.claim_unit(fingerprint="d" * 16, tp=1, batch=1, buckets=[128], owner=b).granted


def test_expired_claims_are_taken_over_and_renewal_keeps_them(cache):
    a, b = "elsewhere:1:aa", new_claimant_id()
    assert cache.claim_unit(fingerprint=FP, tp=1, batch=1, buckets=[128], owner=a, lease_s=0.3).granted
    assert cache.renew_claims(owner=a, units=[(FP, 1, 1)], lease_s=0.6) == 1
    time.sleep(0.35)
    assert not cache.claim_unit(fingerprint=FP, tp=1, batch=1, buckets=[128], owner=b, lease_s=5).granted  # renewed
    time.sleep(0.4)
    got = cache.claim_unit(fingerprint=FP, tp=1, batch=1, buckets=[128], owner=b, lease_s=5)
    assert got.granted  # the lease ran out
    assert cache.renew_claims(owner=a, units=[(FP, 1, 1)]) == 0  # a's claim is gone
    assert cache.release_claims(owner=b) == 1 and cache.claims().empty


def test_a_dead_process_of_this_host_loses_its_claim_at_once(cache):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    dead = f"{socket.gethostname()}:{proc.pid}:00"
    assert not claimant_alive(dead) and claimant_alive(new_claimant_id()) and claimant_alive("other-host:1:00")
    assert cache.claim_unit(fingerprint=FP, tp=1, batch=1, buckets=[128], owner=dead, lease_s=600).granted
    assert cache.claim_unit(fingerprint=FP, tp=1, batch=1, buckets=[128], owner=new_claimant_id()).granted


def test_a_cache_from_before_claims_gets_the_table(tmp_path):
    path = tmp_path / "old.sqlite"
    with ProfileCache.open(path) as c:
        _put(c)
    con = sqlite3.connect(path)
    con.execute("DROP TABLE claims")
    con.commit()
    con.close()
    with ProfileCache.open(path) as c:
        assert len(c.frame()) == 2 and c.claims().empty
        assert c.claim_unit(fingerprint=FP, tp=1, batch=1, buckets=[512], owner="x:1:1").granted


def test_an_unexpected_table_is_still_refused(tmp_path):
    path = tmp_path / "odd.sqlite"
    ProfileCache.open(path).close()
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE claims2 (x)")
    con.commit()
    con.close()
    with pytest.raises(CacheError, match="damaged"):
        ProfileCache.open(path)


def _filled(path, n=80):
    with ProfileCache.open(path) as c:
        for i in range(n):
            c.put_unit(fingerprint=f"{i:016x}", tp=1, batch=1, profiles=[_profile(b) for b in (128, 256, 512)],
                       target={}, runner="sim", versions={}, host="h", compile_s=1.0, run_s=1.0)
    return 3 * n


def test_damage_is_found_at_open_and_salvaged(tmp_path):
    path = tmp_path / "p.sqlite"
    n = _filled(path)
    pages = path.stat().st_size // 4096
    with open(path, "r+b") as f:  # garbage over the last page
        f.seek((pages - 1) * 4096)
        f.write(os.urandom(4096))
    before = path.read_bytes()
    with pytest.raises(CacheError, match=r"damaged.*lensopt cache recover"):
        ProfileCache.open(path)
    assert path.read_bytes() == before
    r = recover(path)
    assert r["path"] == tmp_path / "p.sqlite.recovered" and 0 < r["profiles"] < n
    assert path.read_bytes() == before
    with ProfileCache.open(r["path"], create=False) as c:
        assert c.integrity_check() == "ok" and len(c.frame()) == r["profiles"]
        assert len(c.units()) == r["units"]
    with pytest.raises(Exception, match="already exists"):
        recover(path)


def test_recover_a_whole_file_copies_everything(tmp_path):
    path = tmp_path / "whole.sqlite"
    n = _filled(path, 10)
    r = recover(path, tmp_path / "copy.sqlite")
    assert r["profiles"] == n and r["units"] == 10 and r["skipped_rows"] == 0 and r["unreadable_parts"] == 0
