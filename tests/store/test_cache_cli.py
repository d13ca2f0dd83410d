"""``lensopt cache``: ls, export, import, rm, and one-line user mistakes."""
from __future__ import annotations

import json

import pytest

from storekit import FP, put

from store import PROFILE_COLUMNS, ProfileCache


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
        put(src)
        put(src, tp=4, buckets=(128,))
        src.export(tmp_path / "in.parquet")
    assert lensopt("cache", "import", str(tmp_path / "in.parquet"), "--cache", str(db)) == 0
    assert "imported 4 profiles" in capsys.readouterr().out
    assert lensopt("cache", "import", str(tmp_path / "in.parquet"), "--cache", str(db)) == 0
    assert "4 already cached" in capsys.readouterr().out

    assert lensopt("cache", "ls", "--cache", str(db)) == 0
    out = capsys.readouterr().out
    assert "fingerprint" in out and "128,256,512" in out and FP in out and "2 units, 4 profiles" in out
    assert out.splitlines()[0].split()[-1] == "method" and out.splitlines()[2].split()[-1] == "1"
    assert lensopt("cache", "ls", "--json", "--cache", str(db)) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["tp"], r["buckets"]) for r in rows] == [(2, [128, 256, 512]), (4, [128])]
    assert [r["host_costs_method"] for r in rows] == [1, 1]

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
        put(c)
    assert lensopt("cache", "ls") == 0
    assert "1 unit, 3 profiles" in capsys.readouterr().out
