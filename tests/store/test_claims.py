"""Claims on units in the shared cache: exclusive until stored, leases, dead owners, older files."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from storekit import put, tamper

from lens.errors import CacheError
from store import ProfileCache, claimant_alive, new_claimant_id

FP = "c" * 16
#: a lease long enough that no claim in these tests runs out unless the test shortens it
LEASE_S = 60.0


def _put(c: ProfileCache, buckets=(128, 256), owner=None):
    put(c, FP, tp=1, batch=1, buckets=buckets, release_owner=owner)


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
    assert cache.claim_unit(fingerprint=FP, tp=1, batch=1, buckets=[128], owner=a, lease_s=LEASE_S).granted
    assert cache.claim_unit(fingerprint=FP, tp=1, batch=2, buckets=[128], owner=b, lease_s=LEASE_S).granted
    assert cache.claim_unit(fingerprint="d" * 16, tp=1, batch=1, buckets=[128], owner=b,
                            lease_s=LEASE_S).granted


class Clock:
    """The claims' clock, moved by the test: leases run out exactly when it says."""

    def __init__(self, now: float = 1_700_000_000.0):
        self.now = now

    def time(self) -> float:
        return self.now


def test_expired_claims_are_taken_over_and_renewal_keeps_them(cache, monkeypatch):
    import store.claims

    clock = Clock()
    monkeypatch.setattr(store.claims, "time", clock)
    a, b = "elsewhere:1:aa", new_claimant_id()
    assert cache.claim_unit(fingerprint=FP, tp=1, batch=1, buckets=[128], owner=a, lease_s=10).granted
    clock.now += 5
    assert cache.renew_claims(owner=a, units=[(FP, 1, 1)], lease_s=10) == 1  # now until +15
    clock.now += 9  # +14: past the first lease, inside the renewed one
    assert not cache.claim_unit(fingerprint=FP, tp=1, batch=1, buckets=[128], owner=b, lease_s=5).granted  # renewed
    clock.now += 1  # +15: the renewed lease has run out
    got = cache.claim_unit(fingerprint=FP, tp=1, batch=1, buckets=[128], owner=b, lease_s=5)
    assert got.granted and got.expires_at == clock.now + 5  # taken over
    assert cache.renew_claims(owner=a, units=[(FP, 1, 1)], lease_s=LEASE_S) == 0  # a's claim is gone
    assert cache.release_claims(owner=b) == 1 and cache.claims().empty


def test_a_dead_process_of_this_host_loses_its_claim_at_once(cache):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    dead = f"{socket.gethostname()}:{proc.pid}:00"
    assert not claimant_alive(dead) and claimant_alive(new_claimant_id()) and claimant_alive("other-host:1:00")
    assert cache.claim_unit(fingerprint=FP, tp=1, batch=1, buckets=[128], owner=dead, lease_s=600).granted
    assert cache.claim_unit(fingerprint=FP, tp=1, batch=1, buckets=[128], owner=new_claimant_id(),
                            lease_s=LEASE_S).granted


def test_a_cache_from_before_claims_gets_the_table(tmp_path):
    path = tmp_path / "old.sqlite"
    with ProfileCache.open(path) as c:
        _put(c)
    tamper(path, "DROP TABLE claims")
    with ProfileCache.open(path) as c:
        assert len(c.frame()) == 2 and c.claims().empty
        assert c.claim_unit(fingerprint=FP, tp=1, batch=1, buckets=[512], owner="x:1:1", lease_s=LEASE_S).granted


def test_an_unexpected_table_is_still_refused(tmp_path):
    path = tmp_path / "odd.sqlite"
    ProfileCache.open(path).close()
    tamper(path, "CREATE TABLE claims2 (x)")
    with pytest.raises(CacheError, match="damaged"):
        ProfileCache.open(path)
