"""The profile cache: storage, refusal of foreign files, export/import, concurrency, CLI."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import sqlite3
from pathlib import Path

import pandas as pd
import pytest

from lens.cache import (
    APPLICATION_ID,
    PROFILE_COLUMNS,
    ProfileCache,
    default_cache_path,
    resolve_cache_path,
)
from lens.errors import CacheError, UserError
from lens.types import BucketProfile

FP = "0123456789abcdef"


def _profile(bucket: int, **kw) -> BucketProfile:
    base = dict(
        bucket=bucket, ttft_s=0.1 + 0.2 + bucket * 1e-4, tbt_s=1 / 3 * 1e-2, input_len=bucket - 1,
        l1=4, l2=64, t1_s=0.123456789012345, t2_s=0.987654321, repeats=3, spread=0.0125,
        runner="sim", host="host-a", measured_at=1_700_000_000.123, simulated=True,
        raw_t1=(0.12, 0.123456789012345, 0.13), raw_t2=(0.98, 0.99, 1e-9), source="simulated",
    )
    base.update(kw)
    return BucketProfile(**base)


def _put(cache: ProfileCache, fp: str = FP, tp: int = 2, batch: int = 4, buckets=(128, 256, 512), **kw) -> None:
    args = dict(
        fingerprint=fp, tp=tp, batch=batch, profiles=[_profile(b) for b in buckets],
        target={"name": "t", "model": {"layers": 2}}, runner="sim", versions={"python": "3.11"},
        host="host-a", compile_s=10.0, run_s=5.0,
    )
    args.update(kw)
    cache.put_unit(**args)


@pytest.fixture
def cache(tmp_path):
    with ProfileCache.open(tmp_path / "c" / "profiles.sqlite") as c:
        yield c


# -- storage --------------------------------------------------------------------------
def test_round_trip_put_get(cache):
    _put(cache)
    got = cache.get_unit(FP, 2, 4)
    assert list(got) == [128, 256, 512]
    for b, p in got.items():
        assert p == _profile(b)
    assert cache.get_unit(FP, 2, 8) == {}


def test_file_is_marked_as_ours(tmp_path):
    path = tmp_path / "new" / "dir" / "p.sqlite"
    ProfileCache.open(path).close()
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert con.execute("PRAGMA user_version").fetchone()[0] == 1
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        meta = dict(con.execute("SELECT key, value FROM meta"))
    finally:
        con.close()
    assert meta["schema"] == "1" and "created_at" in meta and "lensopt_version" in meta
    # reopening an existing cache works and changes nothing of its identity
    ProfileCache.open(path).close()
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_missing_and_fingerprint_change(cache):
    _put(cache, buckets=(128, 512))
    assert cache.missing(FP, 2, 4, [128, 256, 512, 1024]) == [256, 1024]
    assert cache.missing(FP, 2, 4, [512, 128]) == []
    assert cache.missing(FP, 2, 4, []) == []
    # another fingerprint, tp or batch is another unit: all missing
    assert cache.missing("fedcba9876543210", 2, 4, [128, 512]) == [128, 512]
    assert cache.missing(FP, 4, 4, [128]) == [128]
    assert cache.missing(FP, 2, 8, [128]) == [128]
    assert cache.get_unit("fedcba9876543210", 2, 4) == {}


def test_put_again_accumulates_seconds_and_replaces_buckets(cache):
    _put(cache, buckets=(128, 256))
    cache.put_unit(
        fingerprint=FP, tp=2, batch=4, profiles=[_profile(256, ttft_s=9.0), _profile(1024)],
        target={}, runner="sim", versions={}, host="host-b", compile_s=1.5, run_s=0.5,
    )
    got = cache.get_unit(FP, 2, 4)
    assert list(got) == [128, 256, 1024]
    assert got[256].ttft_s == 9.0 and got[128] == _profile(128)
    units = cache.units()
    assert len(units) == 1
    row = units.iloc[0]
    assert row.compile_s == 11.5 and row.run_s == 5.5
    assert tuple(row.buckets) == (128, 256, 1024) and row.n_buckets == 3


def test_put_unit_is_atomic(cache):
    with pytest.raises((ValueError, TypeError)):
        cache.put_unit(
            fingerprint=FP, tp=2, batch=4,
            profiles=[_profile(128), _profile(256), _profile(None)],  # fails after two rows
            target={}, runner="sim", versions={}, host="h", compile_s=1.0, run_s=1.0,
        )
    assert cache.get_unit(FP, 2, 4) == {}
    assert cache.units().empty and cache.frame().empty
    # a failed re-profile of an existing unit leaves the unit as it was
    _put(cache, buckets=(128,))
    before = cache.frame()
    with pytest.raises(ValueError, match="ttft_s"):
        cache.put_unit(
            fingerprint=FP, tp=2, batch=4, profiles=[_profile(128, ttft_s=7.0), _profile(256, ttft_s=-1.0)],
            target={}, runner="sim", versions={}, host="h", compile_s=99.0, run_s=99.0,
        )
    pd.testing.assert_frame_equal(cache.frame(), before)
    assert cache.units().iloc[0].compile_s == 10.0


@pytest.mark.parametrize("bad", [{"ttft_s": float("nan")}, {"tbt_s": -0.1}, {"bucket": 0},
                                 {"l1": -1}, {"raw_t1": (0.1, float("inf"))}, {"source": "guessed"}])
def test_put_unit_rejects_values_import_would_reject(cache, bad):
    bad = dict(bad)
    with pytest.raises(ValueError):
        cache.put_unit(fingerprint=FP, tp=1, batch=1, profiles=[_profile(bad.pop("bucket", 128), **bad)], target={},
                       runner="sim", versions={}, host="h", compile_s=0.0, run_s=0.0)
    assert cache.frame().empty


def test_remove(cache):
    _put(cache, tp=1, buckets=(128, 256))
    _put(cache, tp=2, buckets=(128, 256))
    _put(cache, fp="ffff000011112222", tp=2, buckets=(128,))
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


# -- export / import ------------------------------------------------------------------
@pytest.mark.parametrize("ext", [".csv", ".parquet"])
def test_export_import_identical(tmp_path, cache, ext):
    _put(cache)
    _put(cache, fp="ffff000011112222", tp=1, batch=1, buckets=(64,))
    cache.put_unit(fingerprint=FP, tp=8, batch=1,
                   profiles=[_profile(32, runner="", host="", simulated=False, source="estimate:amali", raw_t1=(), raw_t2=())],
                   target={}, runner="", versions={}, host="", compile_s=0.0, run_s=0.0)
    out = tmp_path / f"export{ext}"
    assert cache.export(out) == 5
    with ProfileCache.open(tmp_path / "fresh.sqlite") as fresh:
        assert fresh.import_file(out) == {"inserted": 5, "skipped": 0, "replaced": 0}
        pd.testing.assert_frame_equal(fresh.frame(), cache.frame())
        assert fresh.get_unit(FP, 2, 4) == cache.get_unit(FP, 2, 4)
        assert fresh.get_unit(FP, 8, 1)[32].raw_t1 == ()
        # again: existing rows are kept, or replaced on request
        assert fresh.import_file(out) == {"inserted": 0, "skipped": 5, "replaced": 0}
        assert fresh.import_file(out, replace=True) == {"inserted": 0, "skipped": 0, "replaced": 5}
        pd.testing.assert_frame_equal(fresh.frame(), cache.frame())


def test_import_keeps_existing_unless_replace(tmp_path, cache):
    _put(cache, buckets=(128, 256))
    out = tmp_path / "e.csv"
    cache.export(out)
    cache.remove(bucket=256)
    _put(cache, buckets=(128,), profiles=[_profile(128, ttft_s=5.0)])
    assert cache.import_file(out) == {"inserted": 1, "skipped": 1, "replaced": 0}
    assert cache.get_unit(FP, 2, 4)[128].ttft_s == 5.0
    assert cache.import_file(out, replace=True) == {"inserted": 0, "skipped": 0, "replaced": 2}
    assert cache.get_unit(FP, 2, 4)[128] == _profile(128)


def _exported_csv(tmp_path, cache) -> pd.DataFrame:
    _put(cache)
    cache.export(tmp_path / "good.csv")
    return pd.read_csv(tmp_path / "good.csv", dtype=str, keep_default_na=False)


@pytest.mark.parametrize("column, value, problem", [
    ("ttft_s", "-0.5", "negative"),
    ("tbt_s", "nan", "NaN"),
    ("t1_s", "", "not a number"),
    ("l1", "abc", "not an integer"),
    ("tp", "2.5", "not an integer"),
    ("raw_t2", "[0.1, -2]", "negative"),
    ("simulated", "maybe", "0/1"),
])
def test_import_bad_value_names_row_and_column(tmp_path, cache, column, value, problem):
    df = _exported_csv(tmp_path, cache)
    df.loc[1, column] = value
    bad = tmp_path / "bad.csv"
    df.to_csv(bad, index=False)
    with ProfileCache.open(tmp_path / "fresh.sqlite") as fresh:
        with pytest.raises(UserError) as err:
            fresh.import_file(bad)
        msg = str(err.value)
        assert str(bad) in msg and "row 2" in msg and repr(column) in msg and problem in msg
        assert fresh.frame().empty  # nothing written, not even the good first row


@pytest.mark.parametrize("change, words", [
    (lambda df: df.drop(columns=["tbt_s"]), "missing columns ['tbt_s']"),
    (lambda df: df.assign(extra=1), "unexpected columns ['extra']"),
])
def test_import_bad_columns(tmp_path, cache, change, words):
    df = change(_exported_csv(tmp_path, cache))
    bad = tmp_path / "bad.csv"
    df.to_csv(bad, index=False)
    with pytest.raises(UserError, match=__import__("re").escape(words)):
        cache.import_file(bad)


def test_import_bad_parquet(tmp_path, cache):
    _put(cache)
    df = cache.frame()
    df.loc[2, "spread"] = float("nan")
    bad = tmp_path / "bad.parquet"
    df.to_parquet(bad, engine="pyarrow", index=False)
    with pytest.raises(UserError, match=r"row 3, column 'spread': missing value"):  # pandas wrote a null
        cache.import_file(bad)
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)  # NaN kept as a float NaN
    table = table.set_column(table.column_names.index("spread"), "spread",
                             pa.array([0.1, 0.2, float("nan")], type=pa.float64()))
    pq.write_table(table, bad)
    with pytest.raises(UserError, match=r"row 3, column 'spread': NaN"):
        cache.import_file(bad)
    df = cache.frame().astype({"tp": "float64"})
    df.to_parquet(bad, engine="pyarrow", index=False)
    with pytest.raises(UserError, match=r"column 'tp' has type double"):
        cache.import_file(bad)


def test_import_duplicate_key(tmp_path, cache):
    df = _exported_csv(tmp_path, cache)
    bad = tmp_path / "dup.csv"
    pd.concat([df, df.iloc[[0]]]).to_csv(bad, index=False)
    cache.remove()
    with pytest.raises(UserError, match="row 4 repeats the key"):
        cache.import_file(bad)
    assert cache.frame().empty


@pytest.mark.parametrize("name", ["x.json", "x", "x.csv.gz"])
def test_unknown_formats(tmp_path, cache, name):
    with pytest.raises(UserError, match=r"\.csv, \.parquet"):
        cache.export(tmp_path / name)
    (tmp_path / name).write_text("a,b\n")
    with pytest.raises(UserError, match=r"\.csv, \.parquet"):
        cache.import_file(tmp_path / name)


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
    con = sqlite3.connect(path)
    con.execute("PRAGMA user_version = 2")
    con.close()
    with pytest.raises(CacheError, match="upgrade lensopt"):
        ProfileCache.open(path)


def test_damaged_cache_gives_recovery_hint(tmp_path):
    path = tmp_path / "p.sqlite"
    with ProfileCache.open(path) as c:
        for i in range(200):
            _put(c, fp=f"{i:016x}", buckets=(128, 256, 512, 1024))
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 2 + 100)
    with pytest.raises(CacheError, match=r"damaged.*\.recover"):
        with ProfileCache.open(path) as c:
            c.frame()


# -- two processes at once --------------------------------------------------------------
def _writer(path: str, worker: int, n_units: int, start) -> None:
    start.wait(60)  # both begin together, so creation and writes really overlap
    with ProfileCache.open(path) as c:
        for u in range(n_units):
            c.put_unit(
                fingerprint=f"w{worker}-{u:04d}", tp=1 + u % 4, batch=1 + u % 3,
                profiles=[_profile(b) for b in (128, 256, 512)], target={"worker": worker},
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


# -- the command line -------------------------------------------------------------------
@pytest.fixture
def lensopt(monkeypatch, tmp_path):
    import search.cli

    monkeypatch.setattr(search.cli, "COMMAND_MODULES", ["search.cmd_cache"])
    monkeypatch.setenv("LENSOPT_CACHE", str(tmp_path / "env-cache.sqlite"))
    return lambda *argv: search.cli.main(list(argv))


def test_cli_round_trip(tmp_path, lensopt, capsys):
    db = tmp_path / "cli.sqlite"
    assert lensopt("cache", "ls", "--cache", str(db)) == 0
    assert "no profile cache" in capsys.readouterr().out
    assert not db.exists()  # ls does not create it
    assert lensopt("cache", "export", str(tmp_path / "x.csv"), "--cache", str(db)) == 2
    assert "nothing to export" in capsys.readouterr().err and not db.exists()

    with ProfileCache.open(tmp_path / "src.sqlite") as src:
        _put(src)
        _put(src, tp=4, buckets=(128,))
        src.export(tmp_path / "in.parquet")
    assert lensopt("cache", "import", str(tmp_path / "in.parquet"), "--cache", str(db)) == 0
    assert "imported 4 profiles" in capsys.readouterr().out
    assert lensopt("cache", "import", str(tmp_path / "in.parquet"), "--cache", str(db)) == 0
    assert "4 already cached" in capsys.readouterr().out

    assert lensopt("cache", "ls", "--cache", str(db)) == 0
    out = capsys.readouterr().out
    assert "fingerprint" in out and "128,256,512" in out and FP in out and "2 units, 4 profiles" in out
    assert lensopt("cache", "ls", "--json", "--cache", str(db)) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["tp"], r["buckets"]) for r in rows] == [(2, [128, 256, 512]), (4, [128])]

    assert lensopt("cache", "export", str(tmp_path / "out.csv"), "--cache", str(db)) == 0
    assert f"exported 4 profiles to {tmp_path / 'out.csv'}" in capsys.readouterr().out

    assert lensopt("cache", "rm", "--cache", str(db)) == 2
    assert "--all" in capsys.readouterr().err
    assert lensopt("cache", "rm", "--tp", "4", "--cache", str(db)) == 0
    assert "removed 1 profile " in capsys.readouterr().out
    assert lensopt("cache", "rm", "--all", "--cache", str(db)) == 0
    assert "removed 3 profiles" in capsys.readouterr().out
    assert lensopt("cache", "ls", "--cache", str(db)) == 0
    assert "is empty" in capsys.readouterr().out


def test_cli_user_mistakes_are_one_line(tmp_path, lensopt, capsys):
    foreign = tmp_path / "notes.txt"
    foreign.write_text("not a cache")
    assert lensopt("cache", "ls", "--cache", str(foreign)) == 2
    err = capsys.readouterr().err
    assert err.startswith("lensopt: error:") and "Traceback" not in err and err.count("\n") == 1
    assert foreign.read_text() == "not a cache"

    bad = tmp_path / "bad.csv"
    bad.write_text(",".join(PROFILE_COLUMNS) + "\n" + ",".join(["x"] * len(PROFILE_COLUMNS)) + "\n")
    assert lensopt("cache", "import", str(bad), "--cache", str(tmp_path / "c.sqlite")) == 2
    assert "row 1, column 'tp'" in capsys.readouterr().err
    assert lensopt("cache", "export", str(tmp_path / "x.txt"), "--cache", str(tmp_path / "c.sqlite")) == 2
    assert ".csv, .parquet" in capsys.readouterr().err


def test_cli_uses_env_cache(tmp_path, lensopt, capsys):
    with ProfileCache.open(tmp_path / "env-cache.sqlite") as c:
        _put(c)
    assert lensopt("cache", "ls") == 0
    assert "1 unit, 3 profiles" in capsys.readouterr().out


def test_closed_cache_copies_whole(tmp_path):
    # a copy of a closed cache is a complete cache (WAL is checkpointed on close)
    with ProfileCache.open(tmp_path / "a.sqlite") as c:
        _put(c)
    shutil.copy(tmp_path / "a.sqlite", tmp_path / "b.sqlite")
    with ProfileCache.open(tmp_path / "b.sqlite") as c:
        assert list(c.get_unit(FP, 2, 4)) == [128, 256, 512]


def test_lock_held_too_long_is_a_cache_error(tmp_path, monkeypatch):
    import lens.cache

    path = tmp_path / "p.sqlite"
    ProfileCache.open(path).close()
    monkeypatch.setattr(lens.cache, "BUSY_TIMEOUT_S", 0.2)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with ProfileCache.open(path) as c:
            assert c.frame().empty  # readers are not blocked by a writer (WAL)
            with pytest.raises(CacheError, match="locked by another process"):
                _put(c)
    finally:
        other.execute("ROLLBACK")
        other.close()
    with ProfileCache.open(path) as c:
        assert c.frame().empty
