"""Opening the cache file: creating and marking it, refusing what is not ours, damage, locks, the path."""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from storekit import put, tamper

from lens.errors import CacheError
from store import APPLICATION_ID, SCHEMA_VERSION, ProfileCache, default_cache_path, resolve_cache_path


def test_file_is_marked_as_ours(tmp_path):
    path = tmp_path / "new" / "dir" / "p.sqlite"
    ProfileCache.open(path).close()
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        meta = dict(con.execute("SELECT key, value FROM meta"))
    finally:
        con.close()
    assert meta["schema"] == str(SCHEMA_VERSION) and "created_at" in meta and "lensopt_version" in meta
    # reopening an existing cache works and changes nothing of its identity
    ProfileCache.open(path).close()
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_open_missing_without_create(tmp_path):
    path = tmp_path / "none.sqlite"
    with pytest.raises(CacheError, match="no profile cache"):
        ProfileCache.open(path, create=False)
    assert not path.exists()


def test_cache_path_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("LENSOPT_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_path() == tmp_path / ".cache" / "lensopt" / "profiles.sqlite"
    monkeypatch.setenv("LENSOPT_CACHE", str(tmp_path / "env.sqlite"))
    assert default_cache_path() == tmp_path / "env.sqlite"
    assert resolve_cache_path(None) == tmp_path / "env.sqlite"
    assert resolve_cache_path(str(tmp_path / "flag.sqlite")) == tmp_path / "flag.sqlite"


# -- refusing what is not ours ----------------------------------------------------------
def _foreign_sqlite(path: Path, app_id: int) -> None:
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA application_id = {app_id}")
    con.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    con.execute("INSERT INTO notes (body) VALUES ('keep me')")
    con.commit()
    con.close()


@pytest.mark.parametrize("kind", ["text", "garbage", "empty", "sqlite-other-app", "sqlite-no-app-id", "directory"])
def test_foreign_files_refused_and_untouched(tmp_path, kind):
    path = tmp_path / "profiles.sqlite"
    if kind == "text":
        path.write_text("my precious notes\n" * 50)
    elif kind == "garbage":
        path.write_bytes(os.urandom(8192))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "sqlite-other-app":
        _foreign_sqlite(path, 0x12345678)
    elif kind == "sqlite-no-app-id":
        _foreign_sqlite(path, 0)
    else:
        path.mkdir()
    before = None if path.is_dir() else path.read_bytes()
    listing = sorted(os.listdir(tmp_path))
    with pytest.raises(CacheError) as err:
        ProfileCache.open(path)
    assert str(path) in str(err.value) and "--cache PATH" in str(err.value)
    if before is not None:
        assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == listing  # no -wal/-shm/-journal, no temporary files


def test_newer_schema_refused(tmp_path):
    path = tmp_path / "p.sqlite"
    ProfileCache.open(path).close()
    tamper(path, f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(CacheError, match="upgrade lensopt"):
        ProfileCache.open(path)


def test_damaged_cache_gives_recovery_hint(tmp_path):
    path = tmp_path / "p.sqlite"
    with ProfileCache.open(path) as c:
        for i in range(200):
            put(c, fp=f"{i:016x}", buckets=(128, 256, 512, 1024))
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2 + 100)
    with pytest.raises(CacheError, match=r"damaged.*\.recover"):
        with ProfileCache.open(path) as c:
            c.frame()


def test_lock_held_too_long_is_a_cache_error(tmp_path, monkeypatch):
    import store.opening

    path = tmp_path / "p.sqlite"
    ProfileCache.open(path).close()
    monkeypatch.setattr(store.opening, "BUSY_TIMEOUT_S", 0.2)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with ProfileCache.open(path) as c:
            assert c.frame().empty  # readers are not blocked by a writer (WAL)
            with pytest.raises(CacheError, match="locked by another process"):
                put(c)
    finally:
        other.execute("ROLLBACK")
        other.close()
    with ProfileCache.open(path) as c:
        assert c.frame().empty
