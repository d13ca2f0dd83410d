"""Damage found at open, and salvage of a damaged cache into a new file."""
from __future__ import annotations

import os

import pytest

from storekit import profile

from lens.errors import CacheError
from store import ProfileCache, recover


def _filled(path, n=80):
    with ProfileCache.open(path) as c:
        for i in range(n):
            c.put_unit(fingerprint=f"{i:016x}", tp=1, batch=1, profiles=[profile(b) for b in (128, 256, 512)],
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
