"""Finding, recognising, creating and opening the cache file, and what an SQLite failure says about it.

A file is checked before SQLite touches it (the application id in its header), then its
schema (a whole cache of an older schema is brought up to date first, in one transaction) and, with ``PRAGMA quick_check`` on every open (milliseconds for a cache of
thousands of profiles), its pages: a truncated file or a page of garbage is refused with
the ``lensopt cache recover`` command before anything reads or writes it. Anything at the
path that is not a whole cache of our schema is refused and left untouched.

WAL journal mode lets readers run beside a writer; a writer waits up to
:data:`BUSY_TIMEOUT_S` for another process's write lock.
"""
from __future__ import annotations

import errno
import os
import secrets
import shlex
import sqlite3
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from lens.errors import CacheError

from .schema import (
    APPLICATION_ID, CLAIMS_SQL, OLDEST_VERSION, OPTIONAL_TABLES, SCHEMA_VERSION, SQLITE_MAGIC, TABLES, initialise,
    migrate,
)

#: seconds a writer waits for another process's write lock before giving up
BUSY_TIMEOUT_S = 60.0
#: environment variable naming the cache file
ENV_VAR = "LENSOPT_CACHE"

# SQLite primary result codes (https://sqlite.org/rescode.html)
_PERM, _BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _AUTH, _NOTADB = (
    3, 5, 6, 8, 10, 11, 13, 14, 23, 26)
_FIX = "pass --cache PATH to use another file, or move it away"


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


# -- what a failure says about the file ---------------------------------------------------
def damaged(path: Path, why: str) -> CacheError:
    """The error for a damaged cache file: how to salvage its profiles, or start afresh."""
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
        return damaged(path, str(exc))
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
def sql_errors(path: Path) -> Iterator[None]:
    """Raise an SQLite failure about the file at ``path`` as a CacheError saying what to do."""
    try:
        yield
    except sqlite3.Error as exc:
        mapped = _sqlite_error(path, exc)
        if mapped is None:
            raise
        raise mapped from exc


# -- recognising the file before SQLite touches it ----------------------------------------
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
    if not head.startswith(SQLITE_MAGIC):
        raise CacheError(f"{path} is not a lensopt profile cache (not an SQLite database); {_FIX}")
    if len(head) < 100:
        raise CacheError(f"{path} is a truncated SQLite file ({len(head)} bytes), not a usable profile cache; {_FIX}")
    app_id = int.from_bytes(head[68:72], "big", signed=True)
    if app_id != APPLICATION_ID:
        raise CacheError(
            f"{path} is an SQLite database of another application (application_id {app_id & 0xFFFFFFFF:#010x}), "
            f"not a lensopt profile cache; {_FIX}"
        )


def _schema_version(con: sqlite3.Connection, path: Path) -> int:
    """The file's schema version; refuse one newer than this code or older than any it migrates."""
    version = con.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise CacheError(
            f"profile cache {path} has schema version {version}, written by a newer lensopt; this lensopt "
            f"reads schema {SCHEMA_VERSION}: upgrade lensopt (pip install -U lensopt), or pass --cache PATH "
            f"to use another file"
        )
    if version < OLDEST_VERSION:
        raise damaged(path, f"schema version {version}, expected {SCHEMA_VERSION}")
    return version


def _check_pages(con: sqlite3.Connection, path: Path) -> None:
    # every page of every table and index, structurally: catches a file cut short or a
    # page of garbage now, before a query stumbles on it or a write makes it worse
    verdict = [r[0] for r in con.execute("PRAGMA quick_check(5)")]
    if verdict != ["ok"]:
        raise damaged(path, "integrity check: " + "; ".join(verdict))


def _migrate(path: Path, version: int) -> None:
    """Bring a whole cache of an older schema up to date, in one transaction (see ``schema.migrate``)."""
    con = _connect(path, "rw")
    try:
        migrate(con)
    except sqlite3.OperationalError as exc:  # a step met a table it did not expect: not a cache of that version
        if _sqlite_error(path, exc) is not None:
            raise
        raise damaged(path, f"schema version {version} could not be brought to {SCHEMA_VERSION} ({exc})") from None
    finally:
        con.close()


def _check_schema(con: sqlite3.Connection, path: Path) -> bool:
    """Refuse a file that is not a whole cache of our schema; True when it has ``claims``."""
    version = _schema_version(con, path)
    if version != SCHEMA_VERSION:
        raise damaged(path, f"schema version {version}, expected {SCHEMA_VERSION}")
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
             if not r[0].startswith("sqlite_")}
    if names - set(OPTIONAL_TABLES) != set(TABLES):
        raise damaged(path, f"tables {sorted(names)}, expected {sorted(TABLES)} (and optionally {sorted(OPTIONAL_TABLES)})")
    for table, cols in {**TABLES, **OPTIONAL_TABLES}.items():
        if table not in names:
            continue
        actual = tuple(r[1] for r in con.execute(f"PRAGMA table_info({table})"))
        if actual != cols:
            raise damaged(path, f"table {table} has columns {list(actual)}")
    meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
    if meta.get("schema") != str(SCHEMA_VERSION):
        raise damaged(path, f"meta schema {meta.get('schema')!r}, expected {SCHEMA_VERSION}")
    _check_pages(con, path)
    return "claims" in names


def _connect(path: Path, mode: str) -> sqlite3.Connection:
    # isolation_level=None: no implicit BEGINs; writes open their own BEGIN IMMEDIATE
    return sqlite3.connect(f"{path.absolute().as_uri()}?mode={mode}", uri=True, timeout=BUSY_TIMEOUT_S,
                           isolation_level=None)


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
        with sql_errors(path):
            con = sqlite3.connect(str(tmp), isolation_level=None)
            try:
                initialise(con)
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


def open_connection(path: Path, *, create: bool) -> sqlite3.Connection:
    """A read-write connection to the checked cache at ``path``, created there when missing and ``create``.

    Raises ``CacheError`` when the path holds anything but a lensopt cache of a schema
    this version reads; such a file is left exactly as it was.
    """
    if not os.path.lexists(path):
        if not create:
            raise CacheError(f"no profile cache at {path}; profile something first, or pass --cache PATH")
        _create(path)
    _check_header(path)
    with sql_errors(path):
        ro = _connect(path, "ro")
        try:
            version = _schema_version(ro, path)
            if version < SCHEMA_VERSION:
                _check_pages(ro, path)  # a damaged file is never written to, not even to migrate it
        finally:
            ro.close()
        if version < SCHEMA_VERSION:
            _migrate(path, version)
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
                    con.execute(CLAIMS_SQL)
                    con.execute("COMMIT")
                except BaseException:
                    if con.in_transaction:
                        con.rollback()
                    raise
        except BaseException:
            con.close()
            raise
    return con
