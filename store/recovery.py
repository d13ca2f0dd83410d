"""Salvage of a damaged cache: copy every profile SQLite can still read, and that passes the
row checks, into a new cache. The damaged file is only read, never written."""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any, Sequence

from lens.errors import CacheError, UserError

from .migrate import fill_added
from .rows import BadValue, checked_profile_row, checked_unit_row
from .schema import PROFILE_COLUMNS, PROFILE_KEY, SQLITE_MAGIC, UNIT_COLUMNS
from .storage import ProfileCache

#: rows read per query while salvaging; a window that fails is read again row by row
_SALVAGE_WINDOW = 64


def _salvage_rows(con: sqlite3.Connection, table: str, columns: Sequence[str], upper: int) -> tuple[list[tuple], int]:
    """Every row of ``table`` SQLite can still read, by rowid windows; and how many windows failed."""
    cols = ", ".join(columns)
    out: list[tuple] = []
    bad = 0
    dead_run = 0  # consecutive windows that failed whole: past the end of a cut file, stop trying rows
    lo = 1
    while lo <= upper:
        hi = lo + _SALVAGE_WINDOW - 1
        try:
            out.extend(con.execute(f"SELECT {cols} FROM {table} WHERE rowid BETWEEN ? AND ?", (lo, hi)).fetchall())
            dead_run = 0
        except sqlite3.DatabaseError:
            bad += 1
            got = 0
            if dead_run < 16:
                for rid in range(lo, hi + 1):
                    try:
                        rows = con.execute(f"SELECT {cols} FROM {table} WHERE rowid = ?", (rid,)).fetchall()
                    except sqlite3.DatabaseError:
                        continue
                    out.extend(rows)
                    got += len(rows)
            dead_run = 0 if got else dead_run + 1
        lo = hi + 1
    return out, bad


def _columns(con: sqlite3.Connection, table: str) -> list[str]:
    try:
        return [r[1] for r in con.execute(f"PRAGMA table_info({table})")]
    except sqlite3.DatabaseError:
        return []


def _filled(row: dict) -> tuple:
    try:
        row = {**fill_added(row), **row}
    except (KeyError, TypeError, ValueError):
        pass  # a row the checks refuse anyway
    return tuple(row.get(c) for c in PROFILE_COLUMNS)


def recover(src: str | os.PathLike, dst: str | os.PathLike | None = None) -> dict[str, Any]:
    """Copy every readable, valid profile of a damaged cache ``src`` into a new cache ``dst``.

    ``src`` is only read (never written); ``dst`` (default ``src`` + ``.recovered``) must not
    exist. Rows SQLite can no longer read, or whose values fail the import checks, are
    left out and counted. Returns ``{"path", "profiles", "units", "skipped_rows", "unreadable_parts"}``.
    """
    src = Path(src).expanduser()
    dst = Path(dst).expanduser() if dst is not None else src.with_name(src.name + ".recovered")
    if not src.is_file():
        raise UserError(f"{src}: no such cache file to recover")
    if os.path.lexists(dst):
        raise UserError(f"{dst} already exists; move it away or name another file with --to (nothing is overwritten)")
    with open(src, "rb") as f:
        head = f.read(100)
    if not head.startswith(SQLITE_MAGIC):
        raise UserError(f"{src} is not an SQLite file: there is nothing to recover from it")
    size = src.stat().st_size
    try:
        con = sqlite3.connect(f"{src.absolute().as_uri()}?mode=ro", uri=True, isolation_level=None)
        # a file cut short: read what is there instead of refusing it whole (as SQLite's .recover does)
        con.execute("PRAGMA writable_schema = ON")
    except sqlite3.Error as exc:
        raise CacheError(f"cannot read {src}: {exc}") from None
    profiles: list[tuple] = []
    units: list[tuple] = []
    bad = skipped = 0
    try:
        # a damaged cache of an older schema lacks the columns later ones added: read what it
        # has, and fill the rest as its migration would
        have = [c for c in PROFILE_COLUMNS if c in _columns(con, "profiles")] or list(PROFILE_COLUMNS)
        for table, columns, sink in (("profiles", have, profiles), ("units", UNIT_COLUMNS, units)):
            try:
                upper = int(con.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0] or 0)
            except sqlite3.DatabaseError:
                upper = max(1, size // 64)  # the rightmost page is lost: bound by the file size
            rows, n_bad = _salvage_rows(con, table, columns, upper)
            bad += n_bad
            sink.extend(rows)
    except sqlite3.DatabaseError as exc:  # the schema itself is unreadable
        raise CacheError(f"{src}: nothing can be read from it ({exc}); move it away and start a fresh cache") from None
    finally:
        con.close()
    if len(have) < len(PROFILE_COLUMNS):
        profiles = [_filled(dict(zip(have, r))) for r in profiles]
    good: dict[tuple, tuple] = {}
    for row in profiles:
        try:
            checked = checked_profile_row(row)
        except BadValue:
            skipped += 1
            continue
        good[checked[:len(PROFILE_KEY)]] = checked
    keep_units = []
    for row in units:
        try:
            unit = checked_unit_row(row)
        except BadValue:
            skipped += 1
            continue
        if any(k[:3] == unit[:3] for k in good):
            keep_units.append(unit)
    with ProfileCache.open(dst) as out:
        out._restore(units=keep_units, profiles=list(good.values()))
    return {"path": dst, "profiles": len(good), "units": len({k[:3] for k in good}), "skipped_rows": skipped,
            "unreadable_parts": bad}
