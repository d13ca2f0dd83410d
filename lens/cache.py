"""The profile cache: bucket profiles keyed by (fingerprint, tp, batch, bucket) in SQLite.

One file is shared by every search on a host (and by several processes at once): WAL
journal mode lets readers run beside a writer, ``BEGIN IMMEDIATE`` takes the write lock up
front so two writers queue on the busy timeout instead of failing half-way, and every
write (a unit with all its buckets, an import) is one transaction.

A file is recognised as ours by ``PRAGMA application_id`` (read straight from the
100-byte SQLite header, so a foreign file is never opened by SQLite at all), then by
``PRAGMA user_version`` (the schema version) and the ``meta`` table. Anything else at the
path is refused and left untouched.

Damage is caught at open: ``PRAGMA quick_check`` runs on every open (milliseconds for a
cache of thousands of profiles), so a truncated file or a page of garbage is refused with
the ``.recover`` command before anything reads or writes it; a row that still fails to
decode later is reported the same way. A damaged file is never written to.

Claims: before a process profiles a unit it claims it (``claims`` table, one row per
unit, taken in a ``BEGIN IMMEDIATE`` transaction with a lease that its owner renews while
the task runs). Another process that wants the unit meanwhile waits for the profiles
instead of measuring them a second time; a claim whose owner died expires with its lease,
or at once when the owner was a process of this host that no longer exists. The
``claims`` table is an optional part of schema 1: files written before it existed get it
on their first read-write open.

Export and import use CSV or Parquet with exactly the columns of the ``profiles`` table
(:data:`PROFILE_COLUMNS`); ``raw_t1``/``raw_t2`` are JSON lists. Nothing is ever unpickled.
"""
from __future__ import annotations

import errno
import json
import math
import os
import re
import secrets
import shlex
import socket
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from .errors import CacheError, UserError
from .types import BucketProfile

#: "LENS" in ASCII: marks an SQLite file as a lensopt profile cache
APPLICATION_ID = 0x4C454E53
#: the schema this code reads and writes (``PRAGMA user_version``)
SCHEMA_VERSION = 1
#: seconds a writer waits for another process's write lock before giving up
BUSY_TIMEOUT_S = 60.0
#: environment variable naming the cache file
ENV_VAR = "LENSOPT_CACHE"
#: file extensions ``export``/``import_file`` understand
EXPORT_FORMATS = (".csv", ".parquet")

_SQLITE_MAGIC = b"SQLite format 3\x00"
# SQLite primary result codes (https://sqlite.org/rescode.html)
_PERM, _BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _AUTH, _NOTADB = (
    3, 5, 6, 8, 10, 11, 13, 14, 23, 26)
_FIX = "pass --cache PATH to use another file, or move it away"

UNIT_COLUMNS = (
    "fingerprint", "tp", "batch", "target_json", "runner", "versions_json", "host",
    "compile_s", "run_s", "created_at",
)
#: the columns of the ``profiles`` table, of ``frame()``, and of export/import files
PROFILE_COLUMNS = (
    "fingerprint", "tp", "batch", "bucket", "ttft_s", "tbt_s", "input_len", "l1", "l2",
    "t1_s", "t2_s", "raw_t1", "raw_t2", "repeats", "spread", "runner", "host",
    "measured_at", "simulated", "source",
)
_KEY = ("fingerprint", "tp", "batch", "bucket")

_SCHEMA_SQL = """
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE units (
    fingerprint   TEXT    NOT NULL,
    tp            INTEGER NOT NULL,
    batch         INTEGER NOT NULL,
    target_json   TEXT    NOT NULL,
    runner        TEXT    NOT NULL,
    versions_json TEXT    NOT NULL,
    host          TEXT    NOT NULL,
    compile_s     REAL    NOT NULL,
    run_s         REAL    NOT NULL,
    created_at    REAL    NOT NULL,
    PRIMARY KEY (fingerprint, tp, batch)
);
CREATE TABLE profiles (
    fingerprint TEXT    NOT NULL,
    tp          INTEGER NOT NULL,
    batch       INTEGER NOT NULL,
    bucket      INTEGER NOT NULL,
    ttft_s      REAL    NOT NULL,
    tbt_s       REAL    NOT NULL,
    input_len   INTEGER NOT NULL,
    l1          INTEGER NOT NULL,
    l2          INTEGER NOT NULL,
    t1_s        REAL    NOT NULL,
    t2_s        REAL    NOT NULL,
    raw_t1      TEXT    NOT NULL,
    raw_t2      TEXT    NOT NULL,
    repeats     INTEGER NOT NULL,
    spread      REAL    NOT NULL,
    runner      TEXT    NOT NULL,
    host        TEXT    NOT NULL,
    measured_at REAL    NOT NULL,
    simulated   INTEGER NOT NULL,
    source      TEXT    NOT NULL,
    PRIMARY KEY (fingerprint, tp, batch, bucket)
);
"""
_TABLES = {"meta": ("key", "value"), "units": UNIT_COLUMNS, "profiles": PROFILE_COLUMNS}

CLAIM_COLUMNS = ("fingerprint", "tp", "batch", "buckets", "owner", "claimed_at", "expires_at")
#: added to schema 1 later: created on open when missing, so older files stay readable
_CLAIMS_SQL = """
CREATE TABLE IF NOT EXISTS claims (
    fingerprint TEXT    NOT NULL,
    tp          INTEGER NOT NULL,
    batch       INTEGER NOT NULL,
    buckets     TEXT    NOT NULL,
    owner       TEXT    NOT NULL,
    claimed_at  REAL    NOT NULL,
    expires_at  REAL    NOT NULL,
    PRIMARY KEY (fingerprint, tp, batch)
)
"""
_OPTIONAL_TABLES = {"claims": CLAIM_COLUMNS}
#: default lease of a claim: its owner renews it well before it runs out
DEFAULT_LEASE_S = 120.0


def new_claimant_id() -> str:
    """A claim owner id, unique per process and call: ``host:pid:random``."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def claimant_alive(owner: str) -> bool:
    """False only when ``owner`` names a process of this host that no longer exists.

    Owners on other hosts are presumed alive: their claims end with their lease.
    """
    host, sep, _ = owner.rpartition(":")
    host, sep2, pid = host.rpartition(":")
    if not (sep and sep2) or host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by another user
    return True


@dataclass(frozen=True)
class Claim:
    """The answer to :meth:`ProfileCache.claim_unit`."""

    #: True: the caller now holds the unit and must profile ``missing``, then store or release
    granted: bool
    #: buckets the cache still lacks (empty: nothing to do, nothing claimed)
    missing: tuple[int, ...]
    #: the live owner holding the unit, when not granted
    holder: str | None = None
    expires_at: float | None = None


def default_cache_path() -> Path:
    """``$LENSOPT_CACHE`` if set (and not empty), else ``~/.cache/lensopt/profiles.sqlite``."""
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "lensopt" / "profiles.sqlite"


def resolve_cache_path(arg: str | os.PathLike | None) -> Path:
    """The cache file to use: the ``--cache`` argument when given, else :func:`default_cache_path`."""
    if arg is not None and str(arg).strip():
        return Path(arg).expanduser()
    return default_cache_path()


def lensopt_version() -> str:
    """The installed lensopt distribution's version, or ``"unknown"`` when run from a checkout."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lensopt")
    except PackageNotFoundError:
        return "unknown"


# -- value checks shared by put_unit and import_file ------------------------------------
class _Bad(Exception):
    """One bad value; the caller adds where it was (a file row, a profile)."""


_INT_RE = re.compile(r"[+-]?[0-9]+")
_INT64_MAX = 2**63 - 1


def _int(v: Any, *, lo: int, text: bool) -> int:
    if text:
        s = v.strip()
        if not _INT_RE.fullmatch(s):
            raise _Bad(f"{v!r} is not an integer")
        out = int(s)
    else:
        if v is None:
            raise _Bad("missing value")
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise _Bad(f"{v!r} is not an integer")
        out = int(v)
    if out < lo:
        raise _Bad(f"{out} is below the minimum {lo}")
    if out > _INT64_MAX:
        raise _Bad(f"{out} is too large")
    return out


def _float(v: Any, *, text: bool) -> float:
    if text:
        try:
            out = float(v)
        except ValueError:
            raise _Bad(f"{v!r} is not a number") from None
    else:
        if v is None:
            raise _Bad("missing value")
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise _Bad(f"{v!r} is not a number")
        out = float(v)
    if math.isnan(out):
        raise _Bad("NaN is not a valid time")
    if math.isinf(out):
        raise _Bad(f"{out} is not finite")
    if out < 0:
        raise _Bad(f"{out} is negative; times and spreads are >= 0")
    return out


def _str(v: Any, *, nonempty: bool) -> str:
    if v is None:
        raise _Bad("missing value")
    if not isinstance(v, str):
        raise _Bad(f"{v!r} is not text")
    if nonempty and not v:
        raise _Bad("empty value")
    return v


def _bool(v: Any, *, text: bool) -> int:
    if text:
        s = v.strip().lower()
        if s in ("0", "false"):
            return 0
        if s in ("1", "true"):
            return 1
        raise _Bad(f"{v!r} is not 0/1 or true/false")
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    if isinstance(v, (int, np.integer)) and int(v) in (0, 1):
        return int(v)
    raise _Bad(f"{v!r} is not 0/1 or true/false")


def _times_json(v: Any, *, text: bool) -> str:
    """A JSON list of non-negative finite seconds, re-serialised canonically."""
    if v is None:
        raise _Bad("missing value")
    if text or isinstance(v, str):
        try:
            items = json.loads(v)
        except (TypeError, ValueError):
            raise _Bad(f"{v!r} is not a JSON list of seconds") from None
        if not isinstance(items, list):
            raise _Bad(f"{v!r} is not a JSON list of seconds")
    elif isinstance(v, (tuple, list)):
        items = list(v)
    else:
        raise _Bad(f"{v!r} is not a list of seconds")
    out = []
    for x in items:
        try:
            out.append(_float(x, text=False))
        except _Bad as exc:
            raise _Bad(f"element {x!r}: {exc}") from None
    return json.dumps(out)


def _source(v: Any) -> str:
    s = _str(v, nonempty=True)
    if s in ("measured", "simulated") or (s.startswith("estimate:") and len(s) > len("estimate:")):
        return s
    raise _Bad(f"{s!r} is not 'measured', 'simulated' or 'estimate:<model>'")


def _checkers(text: bool) -> dict[str, Callable[[Any], Any]]:
    def i(lo: int) -> Callable[[Any], int]:
        return lambda v: _int(v, lo=lo, text=text)

    f = lambda v: _float(v, text=text)  # noqa: E731
    s = lambda v: _str(v, nonempty=False)  # noqa: E731
    raw = lambda v: _times_json(v, text=text)  # noqa: E731
    return {
        "fingerprint": lambda v: _str(v, nonempty=True),
        "tp": i(1), "batch": i(1), "bucket": i(1),
        "ttft_s": f, "tbt_s": f,
        "input_len": i(0), "l1": i(0), "l2": i(0),
        "t1_s": f, "t2_s": f,
        "raw_t1": raw, "raw_t2": raw,
        "repeats": i(0), "spread": f,
        "runner": s, "host": s,
        "measured_at": f,
        "simulated": lambda v: _bool(v, text=text),
        "source": _source,
    }


_CHECK_VALUES = _checkers(text=False)
_CHECK_TEXT = _checkers(text=True)
_INT_COLS = ("tp", "batch", "bucket", "input_len", "l1", "l2", "repeats")
_FLOAT_COLS = ("ttft_s", "tbt_s", "t1_s", "t2_s", "spread", "measured_at")


def _profile_row(fingerprint: str, tp: int, batch: int, p: BucketProfile) -> tuple:
    values = {
        "fingerprint": fingerprint, "tp": tp, "batch": batch, "bucket": p.bucket,
        "ttft_s": p.ttft_s, "tbt_s": p.tbt_s, "input_len": p.input_len, "l1": p.l1, "l2": p.l2,
        "t1_s": p.t1_s, "t2_s": p.t2_s, "raw_t1": p.raw_t1, "raw_t2": p.raw_t2,
        "repeats": p.repeats, "spread": p.spread, "runner": p.runner, "host": p.host,
        "measured_at": p.measured_at, "simulated": p.simulated, "source": p.source,
    }
    out = []
    for col in PROFILE_COLUMNS:
        try:
            out.append(_CHECK_VALUES[col](values[col]))
        except _Bad as exc:
            raise ValueError(f"profile of bucket {p.bucket!r} of unit ({fingerprint}, tp={tp}, batch={batch}): {col}: {exc}") from None
    return tuple(out)


def _to_profile(row: Sequence[Any]) -> BucketProfile:
    r = dict(zip(PROFILE_COLUMNS, row))
    return BucketProfile(
        bucket=int(r["bucket"]), ttft_s=float(r["ttft_s"]), tbt_s=float(r["tbt_s"]),
        input_len=int(r["input_len"]), l1=int(r["l1"]), l2=int(r["l2"]),
        t1_s=float(r["t1_s"]), t2_s=float(r["t2_s"]), repeats=int(r["repeats"]),
        spread=float(r["spread"]), runner=r["runner"], host=r["host"],
        measured_at=float(r["measured_at"]), simulated=bool(r["simulated"]),
        raw_t1=tuple(float(x) for x in json.loads(r["raw_t1"])),
        raw_t2=tuple(float(x) for x in json.loads(r["raw_t2"])),
        source=r["source"],
    )


def _empty_profiles_frame() -> pd.DataFrame:
    dtypes = {c: ("int64" if c in _INT_COLS or c == "simulated" else "float64" if c in _FLOAT_COLS else "object")
              for c in PROFILE_COLUMNS}
    return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in dtypes.items()})


def _export_format(path: Path) -> str:
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


# -- opening: recognise the file before SQLite touches it --------------------------------
def _damaged(path: Path, why: str) -> CacheError:
    q = shlex.quote(str(path))
    rq = shlex.quote(str(path) + ".recovered")
    return CacheError(
        f"profile cache {path} is damaged ({why}); it was not changed. To salvage its profiles run "
        f"`lensopt cache recover {q}` (it writes {rq} with every readable profile; "
        f"`sqlite3 {q} .recover | sqlite3 {rq}` is the SQLite shell's way) and use --cache {rq} "
        f"(or move it into place); or move {path} away to start a fresh cache (missing profiles are measured again)"
    )


def _sqlite_error(path: Path, exc: sqlite3.Error) -> CacheError | None:
    """The CacheError for an SQLite failure that is about the file, not about our code."""
    code = getattr(exc, "sqlite_errorcode", None)
    primary = None if code is None else code & 0xFF
    if primary in (_CORRUPT, _NOTADB):
        return _damaged(path, str(exc))
    if primary in (_BUSY, _LOCKED):
        return CacheError(
            f"profile cache {path} stayed locked by another process for {BUSY_TIMEOUT_S:.0f} s ({exc}); "
            f"retry when it finishes, or pass --cache PATH to use another file"
        )
    if primary in (_READONLY, _IOERR, _FULL, _CANTOPEN, _PERM, _AUTH):
        return CacheError(
            f"profile cache {path}: {exc}; check the file and its directory are writable and "
            f"the disk has space, or pass --cache PATH to use another file"
        )
    return None


@contextmanager
def _sql_errors(path: Path) -> Iterator[None]:
    try:
        yield
    except sqlite3.Error as exc:
        mapped = _sqlite_error(path, exc)
        if mapped is None:
            raise
        raise mapped from exc


def _check_header(path: Path) -> None:
    """Refuse anything whose 100-byte SQLite header does not carry our application id."""
    try:
        with open(path, "rb") as f:
            head = f.read(100)
    except IsADirectoryError:
        raise CacheError(f"{path} is a directory, not a lensopt profile cache; {_FIX}") from None
    except OSError as exc:
        raise CacheError(f"cannot read profile cache {path}: {exc.strerror or exc}; {_FIX}") from None
    if not head:
        raise CacheError(
            f"{path} is an empty file, not a lensopt profile cache; {_FIX} "
            f"(lensopt then creates a fresh cache there)"
        )
    if not head.startswith(_SQLITE_MAGIC):
        raise CacheError(f"{path} is not a lensopt profile cache (not an SQLite database); {_FIX}")
    if len(head) < 100:
        raise CacheError(f"{path} is a truncated SQLite file ({len(head)} bytes), not a usable profile cache; {_FIX}")
    app_id = int.from_bytes(head[68:72], "big", signed=True)
    if app_id != APPLICATION_ID:
        raise CacheError(
            f"{path} is an SQLite database of another application (application_id {app_id & 0xFFFFFFFF:#010x}), "
            f"not a lensopt profile cache; {_FIX}"
        )


def _check_schema(con: sqlite3.Connection, path: Path) -> bool:
    """Refuse a file that is not a whole cache of our schema; True when it has ``claims``."""
    version = con.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise CacheError(
            f"profile cache {path} has schema version {version}, written by a newer lensopt; this lensopt "
            f"reads schema {SCHEMA_VERSION}: upgrade lensopt (pip install -U lensopt), or pass --cache PATH "
            f"to use another file"
        )
    if version != SCHEMA_VERSION:
        raise _damaged(path, f"schema version {version}, expected {SCHEMA_VERSION}")
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
             if not r[0].startswith("sqlite_")}
    if names - set(_OPTIONAL_TABLES) != set(_TABLES):
        raise _damaged(path, f"tables {sorted(names)}, expected {sorted(_TABLES)} (and optionally {sorted(_OPTIONAL_TABLES)})")
    for table, cols in {**_TABLES, **_OPTIONAL_TABLES}.items():
        if table not in names:
            continue
        actual = tuple(r[1] for r in con.execute(f"PRAGMA table_info({table})"))
        if actual != cols:
            raise _damaged(path, f"table {table} has columns {list(actual)}")
    meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
    if meta.get("schema") != str(SCHEMA_VERSION):
        raise _damaged(path, f"meta schema {meta.get('schema')!r}, expected {SCHEMA_VERSION}")
    # every page of every table and index, structurally: catches a file cut short or a
    # page of garbage now, before a query stumbles on it or a write makes it worse
    verdict = [r[0] for r in con.execute("PRAGMA quick_check(5)")]
    if verdict != ["ok"]:
        raise _damaged(path, "integrity check: " + "; ".join(verdict))
    return "claims" in names


def _uri(path: Path, mode: str) -> str:
    return f"{path.absolute().as_uri()}?mode={mode}"


def _connect(path: Path, mode: str) -> sqlite3.Connection:
    # isolation_level=None: no implicit BEGINs; writes open their own BEGIN IMMEDIATE
    return sqlite3.connect(_uri(path, mode), uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)


def _create(path: Path) -> None:
    """Create a fully initialised cache at ``path`` unless something appears there first.

    The database is built under a temporary name and hard-linked into place, which fails
    if the path exists: a concurrent opener never sees a half-initialised file, and two
    processes creating the same cache at once end up sharing one.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CacheError(f"cannot create the directory of profile cache {path}: {exc.strerror or exc}; {_FIX}") from None
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with _sql_errors(path):
            con = sqlite3.connect(str(tmp), isolation_level=None)
            try:
                con.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                con.execute("BEGIN")
                for stmt in _SCHEMA_SQL.split(";"):
                    if stmt.strip():
                        con.execute(stmt)
                con.execute(_CLAIMS_SQL)
                con.executemany(
                    "INSERT INTO meta (key, value) VALUES (?, ?)",
                    [("schema", str(SCHEMA_VERSION)), ("created_at", repr(time.time())),
                     ("lensopt_version", lensopt_version()), ("application", "lensopt profile cache")],
                )
                con.execute("COMMIT")
                # persistent in the header: every later connection opens in WAL mode
                con.execute("PRAGMA journal_mode = WAL")
            finally:
                con.close()
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # created by another process meanwhile (or a foreign file): the caller checks it
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EXDEV):
                raise CacheError(f"cannot create profile cache {path}: {exc.strerror or exc}; {_FIX}") from None
            # file systems without hard links: a rename cannot refuse an existing target,
            # so the window between this check and the rename is unprotected
            if not os.path.lexists(path):
                os.replace(tmp, path)
    except OSError as exc:
        raise CacheError(f"cannot create profile cache {path}: {exc.strerror or exc}; {_FIX}") from None
    finally:
        for p in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm"), Path(f"{tmp}-journal")):
            p.unlink(missing_ok=True)


# -- the cache ---------------------------------------------------------------------------
class ProfileCache:
    """Bucket profiles of units, in one SQLite file shared by processes. Use :meth:`open`."""

    def __init__(self, path: Path, connection: sqlite3.Connection):
        self._path = Path(path)
        self._con: sqlite3.Connection | None = connection

    # -- life cycle ---------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike, *, create: bool = True) -> "ProfileCache":
        """Open the cache at ``path``, creating it (and its directory) when missing and ``create``.

        Raises ``CacheError`` when the path holds anything but a lensopt cache of a schema
        this version reads; such a file is left exactly as it was.
        """
        path = Path(path).expanduser()
        if not os.path.lexists(path):
            if not create:
                raise CacheError(f"no profile cache at {path}; profile something first, or pass --cache PATH")
            _create(path)
        _check_header(path)
        with _sql_errors(path):
            ro = _connect(path, "ro")
            try:
                has_claims = _check_schema(ro, path)
            finally:
                ro.close()
            con = _connect(path, "rw")
            try:
                if con.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    con.execute("PRAGMA journal_mode = WAL")
                if not has_claims:  # a file from before claims existed
                    con.execute("BEGIN IMMEDIATE")
                    try:
                        con.execute(_CLAIMS_SQL)
                        con.execute("COMMIT")
                    except BaseException:
                        if con.in_transaction:
                            con.rollback()
                        raise
            except BaseException:
                con.close()
                raise
        return cls(path, con)

    @property
    def path(self) -> Path:
        return self._path

    def close(self) -> None:
        """Close the connection; further calls raise. Closing twice is harmless."""
        if self._con is not None:
            self._con.close()
            self._con = None

    def __enter__(self) -> "ProfileCache":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "open" if self._con is not None else "closed"
        return f"ProfileCache({str(self._path)!r}, {state})"

    def _conn(self) -> sqlite3.Connection:
        if self._con is None:
            raise ValueError(f"profile cache {self._path} is closed")
        return self._con

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        con = self._conn()
        with _sql_errors(self._path):
            yield con

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: all of it commits, or none of it."""
        con = self._conn()
        with _sql_errors(self._path):
            con.execute("BEGIN IMMEDIATE")
            try:
                yield con
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:
                    con.rollback()
                raise

    # -- reading ------------------------------------------------------------------------
    def get_unit(self, fingerprint: str, tp: int, batch: int) -> dict[int, BucketProfile]:
        """The cached profiles of one unit, by bucket (increasing); empty when none."""
        with self._read() as con:
            rows = con.execute(
                f"SELECT {', '.join(PROFILE_COLUMNS)} FROM profiles "
                "WHERE fingerprint = ? AND tp = ? AND batch = ? ORDER BY bucket",
                (fingerprint, int(tp), int(batch)),
            ).fetchall()
        try:
            return {int(r[3]): _to_profile(r) for r in rows}
        except (TypeError, ValueError) as exc:  # a value SQLite returned but we cannot read
            raise _damaged(self._path, f"unreadable profile of unit ({fingerprint}, tp={tp}, batch={batch}): {exc}") from None

    def missing(self, fingerprint: str, tp: int, batch: int, buckets: Iterable[int]) -> list[int]:
        """The buckets among ``buckets`` that the cache holds no profile for (sorted, unique)."""
        want = sorted({int(b) for b in buckets})
        if not want:
            return []
        with self._read() as con:
            have = {r[0] for r in con.execute(
                "SELECT bucket FROM profiles WHERE fingerprint = ? AND tp = ? AND batch = ?",
                (fingerprint, int(tp), int(batch)),
            )}
        return [b for b in want if b not in have]

    def frame(self, fingerprint: str | None = None) -> pd.DataFrame:
        """Profile rows (all, or of one fingerprint) with :data:`PROFILE_COLUMNS`, sorted by key.

        ``raw_t1``/``raw_t2`` are JSON lists as text; ``simulated`` is 0/1.
        """
        sql = f"SELECT {', '.join(PROFILE_COLUMNS)} FROM profiles"
        params: tuple = ()
        if fingerprint is not None:
            sql += " WHERE fingerprint = ?"
            params = (fingerprint,)
        sql += " ORDER BY fingerprint, tp, batch, bucket"
        with self._read() as con:
            rows = con.execute(sql, params).fetchall()
        empty = _empty_profiles_frame()
        if not rows:
            return empty
        df = pd.DataFrame.from_records(rows, columns=list(PROFILE_COLUMNS))
        try:
            return df.astype(empty.dtypes.to_dict())
        except (TypeError, ValueError) as exc:
            raise _damaged(self._path, f"unreadable profile rows: {exc}") from None

    def units(self) -> pd.DataFrame:
        """One row per unit holding profiles: its buckets, who measured them, when, and the
        hardware seconds spent on it (``compile_s``/``run_s``; NaN for imported profiles)."""
        with self._read() as con:
            prof = con.execute(
                "SELECT fingerprint, tp, batch, bucket, runner, host, measured_at, simulated "
                "FROM profiles ORDER BY fingerprint, tp, batch, bucket"
            ).fetchall()
            acct = {(r[0], r[1], r[2]): r[3:] for r in con.execute(
                "SELECT fingerprint, tp, batch, compile_s, run_s, created_at FROM units")}
        out = []
        for key, grp in groupby(prof, key=lambda r: (r[0], r[1], r[2])):
            g = list(grp)
            compile_s, run_s, created_at = acct.get(key, (math.nan, math.nan, math.nan))
            out.append({
                "fingerprint": key[0], "tp": int(key[1]), "batch": int(key[2]),
                "n_buckets": len(g),
                "buckets": tuple(int(r[3]) for r in g),
                "runner": ",".join(dict.fromkeys(r[4] for r in g)),
                "host": ",".join(dict.fromkeys(r[5] for r in g)),
                "measured_at": max(float(r[6]) for r in g),
                "simulated": any(bool(r[7]) for r in g),
                "compile_s": float(compile_s), "run_s": float(run_s), "created_at": float(created_at),
            })
        cols = ["fingerprint", "tp", "batch", "n_buckets", "buckets", "runner", "host", "measured_at",
                "simulated", "compile_s", "run_s", "created_at"]
        if not out:
            return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in zip(cols, [
                "object", "int64", "int64", "int64", "object", "object", "object", "float64",
                "bool", "float64", "float64", "float64"])})
        return pd.DataFrame(out, columns=cols)

    def integrity_check(self) -> str:
        """SQLite's ``PRAGMA integrity_check`` verdict: ``"ok"`` or the problems found."""
        with self._read() as con:
            return "\n".join(r[0] for r in con.execute("PRAGMA integrity_check"))

    # -- writing ------------------------------------------------------------------------
    def put_unit(
        self,
        *,
        fingerprint: str,
        tp: int,
        batch: int,
        profiles: Sequence[BucketProfile],
        target: Mapping[str, Any],
        runner: str,
        versions: Mapping[str, Any],
        host: str,
        compile_s: float,
        run_s: float,
        release_owner: str | None = None,
    ) -> None:
        """Store one profiled unit and its bucket profiles in one transaction.

        An existing unit row accumulates ``compile_s``/``run_s`` (the hardware seconds spent
        on it over time); a bucket profiled again replaces its old profile. Raises
        ``ValueError`` for an invalid value (negative or NaN time, bucket < 1, ...), in
        which case nothing of the unit is written. ``release_owner``: the claim that
        owner holds on the unit ends in the same transaction.
        """
        if not profiles:
            raise ValueError(f"put_unit({fingerprint}, tp={tp}, batch={batch}): no profiles to store")
        try:
            fp = _str(fingerprint, nonempty=True)
            tp_i = _int(tp, lo=1, text=False)
            batch_i = _int(batch, lo=1, text=False)
            comp = _float(compile_s, text=False)
            run = _float(run_s, text=False)
        except _Bad as exc:
            raise ValueError(f"put_unit({fingerprint!r}, tp={tp!r}, batch={batch!r}): {exc}") from None
        target_json = json.dumps(dict(target), sort_keys=True)
        versions_json = json.dumps(dict(versions), sort_keys=True)
        now = time.time()
        with self._write() as con:
            con.execute(
                f"INSERT INTO units ({', '.join(UNIT_COLUMNS)}) VALUES ({', '.join('?' * len(UNIT_COLUMNS))}) "
                "ON CONFLICT (fingerprint, tp, batch) DO UPDATE SET "
                "compile_s = units.compile_s + excluded.compile_s, run_s = units.run_s + excluded.run_s, "
                "target_json = excluded.target_json, runner = excluded.runner, "
                "versions_json = excluded.versions_json, host = excluded.host",
                (fp, tp_i, batch_i, target_json, str(runner), versions_json, str(host), comp, run, now),
            )
            insert = (f"INSERT OR REPLACE INTO profiles ({', '.join(PROFILE_COLUMNS)}) "
                      f"VALUES ({', '.join('?' * len(PROFILE_COLUMNS))})")
            # rows are checked one by one inside the transaction: a bad one rolls back all
            for p in profiles:
                con.execute(insert, _profile_row(fp, tp_i, batch_i, p))
            if release_owner is not None:
                con.execute("DELETE FROM claims WHERE fingerprint = ? AND tp = ? AND batch = ? AND owner = ?",
                            (fp, tp_i, batch_i, release_owner))

    # -- claims -------------------------------------------------------------------------
    def claim_unit(
        self,
        *,
        fingerprint: str,
        tp: int,
        batch: int,
        buckets: Iterable[int],
        owner: str,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> Claim:
        """Claim a unit for profiling the buckets of ``buckets`` that the cache lacks.

        One transaction: when nothing is missing, nothing is claimed; when another live
        owner holds an unexpired claim, the answer names it (wait, then ask again);
        otherwise the caller holds the unit until ``expires_at`` (renew it with
        :meth:`renew_claims`) and must store it with ``put_unit(release_owner=owner)``
        or give it back with :meth:`release_claims`.
        """
        if not lease_s > 0:
            raise ValueError(f"lease_s {lease_s!r} must be positive")
        want = sorted({int(b) for b in buckets})
        key = (str(fingerprint), int(tp), int(batch))
        with self._write() as con:
            have = {r[0] for r in con.execute(
                "SELECT bucket FROM profiles WHERE fingerprint = ? AND tp = ? AND batch = ?", key)}
            missing = tuple(b for b in want if b not in have)
            if not missing:
                return Claim(granted=False, missing=())
            now = time.time()
            row = con.execute("SELECT owner, expires_at FROM claims WHERE fingerprint = ? AND tp = ? AND batch = ?",
                              key).fetchone()
            if row is not None and row[0] != owner and float(row[1]) > now and claimant_alive(row[0]):
                return Claim(granted=False, missing=missing, holder=row[0], expires_at=float(row[1]))
            con.execute(
                f"INSERT OR REPLACE INTO claims ({', '.join(CLAIM_COLUMNS)}) VALUES ({', '.join('?' * len(CLAIM_COLUMNS))})",
                (*key, json.dumps(list(missing)), owner, now, now + float(lease_s)),
            )
        return Claim(granted=True, missing=missing, holder=owner, expires_at=now + float(lease_s))

    def renew_claims(self, *, owner: str, units: Iterable[tuple[str, int, int]], lease_s: float = DEFAULT_LEASE_S) -> int:
        """Push the lease of ``owner``'s claims on ``units`` (fingerprint, tp, batch) to now + ``lease_s``.

        Returns how many were renewed (a claim that expired and was taken over is not).
        """
        keys = [(str(f), int(t), int(b)) for f, t, b in units]
        if not keys:
            return 0
        until = time.time() + float(lease_s)
        n = 0
        with self._write() as con:
            for k in keys:
                n += con.execute("UPDATE claims SET expires_at = ? WHERE fingerprint = ? AND tp = ? AND batch = ? "
                                 "AND owner = ?", (until, *k, owner)).rowcount
        return n

    def release_claims(self, *, owner: str, units: Iterable[tuple[str, int, int]] | None = None) -> int:
        """End ``owner``'s claims on ``units`` (all of its claims when None); returns how many."""
        with self._write() as con:
            if units is None:
                return int(con.execute("DELETE FROM claims WHERE owner = ?", (owner,)).rowcount)
            n = 0
            for f, t, b in units:
                n += con.execute("DELETE FROM claims WHERE fingerprint = ? AND tp = ? AND batch = ? AND owner = ?",
                                 (str(f), int(t), int(b), owner)).rowcount
            return n

    def claims(self) -> pd.DataFrame:
        """The claims held now (live or expired): one row per unit being profiled somewhere."""
        with self._read() as con:
            rows = con.execute(f"SELECT {', '.join(CLAIM_COLUMNS)} FROM claims ORDER BY fingerprint, tp, batch").fetchall()
        return pd.DataFrame.from_records(rows, columns=list(CLAIM_COLUMNS))

    def remove(
        self,
        *,
        fingerprint: str | None = None,
        tp: int | None = None,
        batch: int | None = None,
        bucket: int | None = None,
    ) -> int:
        """Delete the profiles matching every filter given (no filter: all of them).

        Units left without profiles are dropped too. Returns the number of profiles removed.
        """
        where, params = [], []
        for col, val in (("fingerprint", fingerprint), ("tp", tp), ("batch", batch), ("bucket", bucket)):
            if val is not None:
                where.append(f"{col} = ?")
                params.append(val if col == "fingerprint" else int(val))
        sql = "DELETE FROM profiles" + (" WHERE " + " AND ".join(where) if where else "")
        with self._write() as con:
            n = con.execute(sql, params).rowcount
            con.execute(
                "DELETE FROM units WHERE NOT EXISTS (SELECT 1 FROM profiles p WHERE "
                "p.fingerprint = units.fingerprint AND p.tp = units.tp AND p.batch = units.batch)"
            )
        return int(n)

    # -- export / import ----------------------------------------------------------------
    def export(self, path: str | os.PathLike) -> int:
        """Write every profile to ``path`` (.csv or .parquet, by extension); returns the count.

        The file is written under a temporary name and renamed into place.
        """
        path = Path(path).expanduser()
        fmt = _export_format(path)
        if not path.parent.is_dir():
            raise UserError(f"cannot write {path}: directory {path.parent} does not exist")
        df = self.frame()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            if fmt == ".csv":
                df.to_csv(tmp, index=False)
            else:
                pa, pq = _pyarrow(path)
                types = {c: (pa.int64() if c in _INT_COLS or c == "simulated"
                             else pa.float64() if c in _FLOAT_COLS else pa.string())
                         for c in PROFILE_COLUMNS}
                schema = pa.schema([(c, types[c]) for c in PROFILE_COLUMNS])
                table = pa.Table.from_pydict({c: df[c].tolist() for c in PROFILE_COLUMNS}, schema=schema)
                pq.write_table(table, tmp)
            os.replace(tmp, path)
        except OSError as exc:
            raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
        finally:
            tmp.unlink(missing_ok=True)
        return len(df)

    def import_file(self, path: str | os.PathLike, *, replace: bool = False) -> dict[str, int]:
        """Add the profiles of a file written by :meth:`export` (.csv or .parquet).

        Every row is checked first (columns, types, no NaN, no negative times, no repeated
        key); any problem raises ``UserError`` naming the file, row and column, and nothing
        is written. Profiles already in the cache are kept unless ``replace``. Returns the
        counts ``{"inserted", "skipped", "replaced"}``.
        """
        path = Path(path).expanduser()
        rows = _read_import(path)
        counts = {"inserted": 0, "skipped": 0, "replaced": 0}
        cols, marks = ", ".join(PROFILE_COLUMNS), ", ".join("?" * len(PROFILE_COLUMNS))
        with self._write() as con:
            for row in rows:
                if con.execute(f"INSERT OR IGNORE INTO profiles ({cols}) VALUES ({marks})", row).rowcount:
                    counts["inserted"] += 1
                elif replace:
                    con.execute(f"INSERT OR REPLACE INTO profiles ({cols}) VALUES ({marks})", row)
                    counts["replaced"] += 1
                else:
                    counts["skipped"] += 1
        return counts


def _read_import(path: Path) -> list[tuple]:
    """Read and check every row of an export file; ``UserError`` on the first problem."""
    fmt = _export_format(path)
    if not path.exists():
        raise UserError(f"{path}: no such file")
    if path.is_dir():
        raise UserError(f"{path}: is a directory, not a .csv or .parquet file")
    if fmt == ".csv":
        columns, data, check = _read_csv(path)
    else:
        columns, data, check = _read_parquet(path)
    missing = [c for c in PROFILE_COLUMNS if c not in columns]
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
        row = []
        for col in PROFILE_COLUMNS:
            try:
                row.append(check[col](data[col][i]))
            except _Bad as exc:
                raise UserError(f"{path}: data row {i + 1}, column {col!r}: {exc}") from None
        key = tuple(row[:len(_KEY)])
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
        # every cell as text: the checks below parse numbers strictly (no NaN from blanks)
        df = pd.read_csv(path, dtype=str, keep_default_na=False, na_filter=False, encoding="utf-8-sig")
    except pd.errors.EmptyDataError:
        raise UserError(f"{path}: empty file; expected a header line with the columns {list(PROFILE_COLUMNS)}") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"{path}: not a readable CSV file: {exc}") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    columns = [str(c) for c in df.columns]
    data = {c: df[c].tolist() for c in columns if c in PROFILE_COLUMNS and columns.count(c) == 1}
    return columns, data, _CHECK_TEXT


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
        if col in _INT_COLS:
            ok = pa.types.is_integer(t)
            want = "an integer type"
        elif col in _FLOAT_COLS:
            ok = pa.types.is_floating(t) or pa.types.is_integer(t)
            want = "a numeric type"
        elif col == "simulated":
            ok = pa.types.is_boolean(t) or pa.types.is_integer(t)
            want = "boolean or integer"
        else:
            ok = pa.types.is_string(t) or pa.types.is_large_string(t)
            want = "text"
        if not ok:
            raise UserError(f"{path}: column {col!r} has type {t}, expected {want}")
    data = {c: table.column(c).to_pylist() for c in PROFILE_COLUMNS if columns.count(c) == 1}
    return columns, data, _CHECK_VALUES


# -- salvage -----------------------------------------------------------------------------
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
    if not head.startswith(_SQLITE_MAGIC):
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
        for table, columns, sink in (("profiles", PROFILE_COLUMNS, profiles), ("units", UNIT_COLUMNS, units)):
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
    good: dict[tuple, tuple] = {}
    for row in profiles:
        try:
            checked = tuple(_CHECK_VALUES[c](v) for c, v in zip(PROFILE_COLUMNS, row))
        except _Bad:
            skipped += 1
            continue
        good[checked[:len(_KEY)]] = checked
    keep_units = []
    for row in units:
        r = dict(zip(UNIT_COLUMNS, row))
        try:
            key = (_str(r["fingerprint"], nonempty=True), _int(r["tp"], lo=1, text=False), _int(r["batch"], lo=1, text=False))
            vals = (_str(r["target_json"], nonempty=False), _str(r["runner"], nonempty=False),
                    _str(r["versions_json"], nonempty=False), _str(r["host"], nonempty=False),
                    _float(r["compile_s"], text=False), _float(r["run_s"], text=False), _float(r["created_at"], text=False))
        except _Bad:
            skipped += 1
            continue
        if any(k[:3] == key for k in good):
            keep_units.append(key + vals)
    with ProfileCache.open(dst) as out:
        cols, marks = ", ".join(PROFILE_COLUMNS), ", ".join("?" * len(PROFILE_COLUMNS))
        ucols, umarks = ", ".join(UNIT_COLUMNS), ", ".join("?" * len(UNIT_COLUMNS))
        with out._write() as w:
            w.executemany(f"INSERT OR REPLACE INTO units ({ucols}) VALUES ({umarks})", keep_units)
            w.executemany(f"INSERT OR REPLACE INTO profiles ({cols}) VALUES ({marks})", list(good.values()))
    return {"path": dst, "profiles": len(good), "units": len({k[:3] for k in good}), "skipped_rows": skipped,
            "unreadable_parts": bad}
