"""Export and import of profiles: CSV or Parquet files with exactly the columns of ``profiles``.

``raw_t1``/``raw_t2`` are JSON lists. Every row of a file is checked (columns, types, no
NaN, no negative times, no repeated key) before anything is written, and nothing is ever
unpickled.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Callable

import pandas as pd

from lens.errors import UserError

from .rows import CHECK_TEXT, CHECK_VALUES, BadValue
from .migrate import fill_added
from .schema import ADDED_PROFILE_COLUMNS, BOOL_COLUMNS, FLOAT_COLUMNS, INT_COLUMNS, PROFILE_COLUMNS, PROFILE_KEY

#: file extensions ``export``/``import_file`` understand
EXPORT_FORMATS = (".csv", ".parquet")


def check_format(path: Path) -> str:
    """The format of ``path`` by its extension (``.csv`` or ``.parquet``); UserError for any other."""
    ext = path.suffix.lower()
    if ext not in EXPORT_FORMATS:
        raise UserError(
            f"{path}: unknown file type {path.suffix or '(no extension)'!r}; "
            f"use one of {', '.join(EXPORT_FORMATS)}"
        )
    return ext


def _pyarrow(path: Path):
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise UserError(f"{path}: reading and writing Parquet needs pyarrow: pip install pyarrow (or use .csv)") from None
    return pa, pq


def check_destination(path: Path) -> None:
    """Refuse an export file of an unknown format or in a directory that does not exist."""
    check_format(path)
    if not path.parent.is_dir():
        raise UserError(f"cannot write {path}: directory {path.parent} does not exist")


def write_profiles(df: pd.DataFrame, path: Path) -> None:
    """Write a frame of :data:`PROFILE_COLUMNS` to ``path`` under a temporary name, renamed into place."""
    fmt = check_format(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        if fmt == ".csv":
            df.to_csv(tmp, index=False)
        else:
            pa, pq = _pyarrow(path)
            types = {c: (pa.int64() if c in INT_COLUMNS or c in BOOL_COLUMNS
                         else pa.float64() if c in FLOAT_COLUMNS else pa.string())
                     for c in PROFILE_COLUMNS}
            schema = pa.schema([(c, types[c]) for c in PROFILE_COLUMNS])
            table = pa.Table.from_pydict({c: df[c].tolist() for c in PROFILE_COLUMNS}, schema=schema)
            pq.write_table(table, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)


def read_profiles(path: Path) -> list[tuple]:
    """Read and check every row of an export file; ``UserError`` naming the row and column of the first problem."""
    fmt = check_format(path)
    if not path.exists():
        raise UserError(f"{path}: no such file")
    if path.is_dir():
        raise UserError(f"{path}: is a directory, not a .csv or .parquet file")
    if fmt == ".csv":
        columns, data, check = _read_csv(path)
    else:
        columns, data, check = _read_parquet(path)
    missing = [c for c in PROFILE_COLUMNS if c not in columns]
    # a file exported by an older lensopt lacks the columns later schemas added: they are
    # filled in as the cache's migration fills them
    later = [c for cols in ADDED_PROFILE_COLUMNS.values() for c in cols]
    legacy = [c for c in missing if c in later]
    if legacy and len(legacy) == len(missing):
        missing = []
    extra = [c for c in columns if c not in PROFILE_COLUMNS]
    dup = sorted({c for c in columns if columns.count(c) > 1})
    if missing or extra or dup:
        parts = []
        if missing:
            parts.append(f"missing columns {missing}")
        if extra:
            parts.append(f"unexpected columns {extra}")
        if dup:
            parts.append(f"repeated columns {dup}")
        raise UserError(
            f"{path}: {'; '.join(parts)}; a profile file has exactly the columns {list(PROFILE_COLUMNS)} "
            f"(as written by `lensopt cache export`)"
        )
    n = len(data[PROFILE_COLUMNS[0]])
    rows: list[tuple] = []
    seen: dict[tuple, int] = {}
    for i in range(n):
        got = {}
        for col in PROFILE_COLUMNS:
            if col in legacy:
                continue
            try:
                got[col] = check[col](data[col][i])
            except BadValue as exc:
                raise UserError(f"{path}: data row {i + 1}, column {col!r}: {exc}") from None
        if legacy:
            got.update({c: CHECK_VALUES[c](v) for c, v in fill_added(got).items() if c in legacy})
        row = [got[c] for c in PROFILE_COLUMNS]
        key = tuple(row[:len(PROFILE_KEY)])
        if key in seen:
            raise UserError(
                f"{path}: data row {i + 1} repeats the key (fingerprint, tp, batch, bucket) = {key} "
                f"of data row {seen[key]}; keep one of them"
            )
        seen[key] = i + 1
        rows.append(tuple(row))
    return rows


def _read_csv(path: Path) -> tuple[list[str], dict[str, list], dict[str, Callable]]:
    try:
        # every cell as text: the checks parse numbers strictly (no NaN from blanks)
        df = pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False, encoding="utf-8-sig")
    except pd.errors.EmptyDataError:
        raise UserError(f"{path}: empty file; expected a header line with the columns {list(PROFILE_COLUMNS)}") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"{path}: not a readable CSV file: {exc}") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    columns = [str(c) for c in df.columns]
    data = {c: df[c].tolist() for c in columns if c in PROFILE_COLUMNS and columns.count(c) == 1}
    return columns, data, CHECK_TEXT


def _read_parquet(path: Path) -> tuple[list[str], dict[str, list], dict[str, Callable]]:
    pa, pq = _pyarrow(path)
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, ValueError) as exc:
        raise UserError(f"{path}: not a readable Parquet file: {exc}") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    columns = list(table.column_names)
    for col in PROFILE_COLUMNS:
        if columns.count(col) != 1:
            continue  # reported with the column check
        t = table.schema.field(col).type
        if col in INT_COLUMNS:
            ok = pa.types.is_integer(t)
            want = "an integer type"
        elif col in FLOAT_COLUMNS:
            ok = pa.types.is_floating(t) or pa.types.is_integer(t)
            want = "a numeric type"
        elif col in BOOL_COLUMNS:
            ok = pa.types.is_boolean(t) or pa.types.is_integer(t)
            want = "boolean or integer"
        else:
            ok = pa.types.is_string(t) or pa.types.is_large_string(t)
            want = "text"
        if not ok:
            raise UserError(f"{path}: column {col!r} has type {t}, expected {want}")
    data = {c: table.column(c).to_pylist() for c in PROFILE_COLUMNS if columns.count(c) == 1}
    return columns, data, CHECK_VALUES
