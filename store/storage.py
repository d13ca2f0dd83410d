"""The profile cache: bucket profiles keyed by (fingerprint, tp, batch, bucket) in one SQLite file.

One file is shared by every search on a host (and by several processes at once): WAL
journal mode lets readers run beside a writer, ``BEGIN IMMEDIATE`` takes the write lock up
front so two writers queue on the busy timeout instead of failing half-way, and every
write (a unit with all its buckets, an import, a claim) is one transaction. A row that
fails to decode is reported as damage, with the ``lensopt cache recover`` command; a
damaged file is never written to.
"""
from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from contextlib import contextmanager
from itertools import groupby
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import pandas as pd

from lens.types import BucketProfile

from . import claims as _claims
from . import failures as _failures
from .claims import Claim
from .failures import UnitFailure
from .opening import damaged, open_connection, sql_errors
from .rows import BadValue, as_int, as_seconds, as_str, empty_profiles_frame, profile_row, to_profile
from .schema import PROFILE_COLUMNS, UNIT_COLUMNS
from .transfer import check_destination, read_profiles, write_profiles

_PROFILE_INSERT = f"INTO profiles ({', '.join(PROFILE_COLUMNS)}) VALUES ({', '.join('?' * len(PROFILE_COLUMNS))})"
_UNIT_INSERT = f"INTO units ({', '.join(UNIT_COLUMNS)}) VALUES ({', '.join('?' * len(UNIT_COLUMNS))})"


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
        return cls(path, open_connection(path, create=create))

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
        with sql_errors(self._path):
            yield con

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: all of it commits, or none of it."""
        con = self._conn()
        with sql_errors(self._path):
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
            return {int(r[3]): to_profile(r) for r in rows}
        except (TypeError, ValueError) as exc:  # a value SQLite returned but we cannot read
            raise damaged(self._path, f"unreadable profile of unit ({fingerprint}, tp={tp}, batch={batch}): {exc}") from None

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
        """Profile rows (all, or of one fingerprint) with ``PROFILE_COLUMNS``, sorted by key.

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
        empty = empty_profiles_frame()
        if not rows:
            return empty
        df = pd.DataFrame.from_records(rows, columns=list(PROFILE_COLUMNS))
        try:
            return df.astype(empty.dtypes.to_dict())
        except (TypeError, ValueError) as exc:
            raise damaged(self._path, f"unreadable profile rows: {exc}") from None

    def units(self) -> pd.DataFrame:
        """One row per unit holding profiles: its buckets, who measured them, when, the oldest version of the
        host-cost measurements among them (``host_costs_method``, ``lens.methods``; 0: not known) and the
        hardware seconds spent on it (``compile_s``/``run_s``; NaN for imported profiles)."""
        with self._read() as con:
            prof = con.execute(
                "SELECT fingerprint, tp, batch, bucket, runner, host, measured_at, simulated, host_costs_method "
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
                "host_costs_method": min(int(r[8]) for r in g),
                "compile_s": float(compile_s), "run_s": float(run_s), "created_at": float(created_at),
            })
        cols = ["fingerprint", "tp", "batch", "n_buckets", "buckets", "runner", "host", "measured_at",
                "simulated", "host_costs_method", "compile_s", "run_s", "created_at"]
        if not out:
            return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in zip(cols, [
                "object", "int64", "int64", "int64", "object", "object", "object", "float64",
                "bool", "int64", "float64", "float64", "float64"])})
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
        on it over time); a bucket profiled again replaces its old profile; a remembered
        failure of the unit ends (it ran after all). Raises ``ValueError`` for an invalid
        value (negative or NaN time, bucket < 1, ...), in which case nothing of the unit is
        written. ``release_owner``: the claim that owner holds on the unit ends in the same
        transaction.
        """
        if not profiles:
            raise ValueError(f"put_unit({fingerprint}, tp={tp}, batch={batch}): no profiles to store")
        try:
            fp = as_str(fingerprint, nonempty=True)
            tp_i = as_int(tp, lo=1, text=False)
            batch_i = as_int(batch, lo=1, text=False)
            comp = as_seconds(compile_s, text=False)
            run = as_seconds(run_s, text=False)
        except BadValue as exc:
            raise ValueError(f"put_unit({fingerprint!r}, tp={tp!r}, batch={batch!r}): {exc}") from None
        target_json = json.dumps(dict(target), sort_keys=True)
        versions_json = json.dumps(dict(versions), sort_keys=True)
        now = time.time()
        with self._write() as con:
            con.execute(
                f"INSERT {_UNIT_INSERT} "
                "ON CONFLICT (fingerprint, tp, batch) DO UPDATE SET "
                "compile_s = units.compile_s + excluded.compile_s, run_s = units.run_s + excluded.run_s, "
                "target_json = excluded.target_json, runner = excluded.runner, "
                "versions_json = excluded.versions_json, host = excluded.host",
                (fp, tp_i, batch_i, target_json, str(runner), versions_json, str(host), comp, run, now),
            )
            # rows are checked one by one inside the transaction: a bad one rolls back all
            for p in profiles:
                con.execute(f"INSERT OR REPLACE {_PROFILE_INSERT}", profile_row(fp, tp_i, batch_i, p))
            _failures.forget(con, [(fp, tp_i, batch_i)])
            if release_owner is not None:
                _claims.release(con, [(fp, tp_i, batch_i)], owner=release_owner)

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
        where, params = _unit_filter(fingerprint=fingerprint, tp=tp, batch=batch, bucket=bucket)
        sql = "DELETE FROM profiles" + (" WHERE " + " AND ".join(where) if where else "")
        with self._write() as con:
            n = con.execute(sql, params).rowcount
            con.execute(
                "DELETE FROM units WHERE NOT EXISTS (SELECT 1 FROM profiles p WHERE "
                "p.fingerprint = units.fingerprint AND p.tp = units.tp AND p.batch = units.batch)"
            )
        return int(n)

    # -- failures -----------------------------------------------------------------------
    def put_failure(self, *, fingerprint: str, tp: int, batch: int, reason: str, kind: str, host: str,
                    release_owner: str | None = None) -> None:
        """Remember that a unit failed in a way that would repeat (see :mod:`store.failures`).

        ``release_owner``: the claim that owner holds on the unit ends in the same transaction.
        """
        key = (str(fingerprint), int(tp), int(batch))
        with self._write() as con:
            _failures.record(con, key, reason=reason, kind=kind, host=host)
            if release_owner is not None:
                _claims.release(con, [key], owner=release_owner)

    def get_failure(self, fingerprint: str, tp: int, batch: int) -> UnitFailure | None:
        """The remembered failure of a unit, or None."""
        with self._read() as con:
            return _failures.get(con, (str(fingerprint), int(tp), int(batch)))

    def failures(self, fingerprint: str | None = None) -> pd.DataFrame:
        """The remembered failures: one row per unit, with ``store.schema.FAILURE_COLUMNS``."""
        with self._read() as con:
            return _failures.listed(con, fingerprint)

    def forget_failures(self, *, fingerprint: str | None = None, tp: int | None = None,
                        batch: int | None = None) -> int:
        """End the failure records matching every filter given (no filter: all); how many ended."""
        where, params = _unit_filter(fingerprint=fingerprint, tp=tp, batch=batch)
        with self._write() as con:
            return _failures.forget(con, where=" AND ".join(where), params=tuple(params))

    def _restore(self, *, units: Sequence[tuple], profiles: Sequence[tuple]) -> None:
        """Write rows already checked by :mod:`store.rows` (salvaged ones), replacing equal keys; one transaction."""
        with self._write() as con:
            con.executemany(f"INSERT OR REPLACE {_UNIT_INSERT}", units)
            con.executemany(f"INSERT OR REPLACE {_PROFILE_INSERT}", profiles)

    # -- claims -------------------------------------------------------------------------
    def claim_unit(
        self,
        *,
        fingerprint: str,
        tp: int,
        batch: int,
        buckets: Iterable[int],
        owner: str,
        lease_s: float,
    ) -> Claim:
        """Claim a unit for profiling the buckets of ``buckets`` that the cache lacks.

        One transaction: when nothing is missing, nothing is claimed; when another live
        owner holds an unexpired claim, the answer names it (wait, then ask again);
        otherwise the caller holds the unit for ``lease_s`` seconds, until ``expires_at``
        (renew it with :meth:`renew_claims`), and must store it with
        ``put_unit(release_owner=owner)`` or give it back with :meth:`release_claims`.
        """
        if not lease_s > 0:
            raise ValueError(f"lease_s {lease_s!r} must be positive")
        key = (str(fingerprint), int(tp), int(batch))
        with self._write() as con:
            return _claims.claim(con, key, buckets=buckets, owner=owner, lease_s=lease_s)

    def renew_claims(self, *, owner: str, units: Iterable[tuple[str, int, int]], lease_s: float) -> int:
        """Push the lease of ``owner``'s claims on ``units`` (fingerprint, tp, batch) to now + ``lease_s``.

        Returns how many were renewed (a claim that expired and was taken over is not).
        """
        keys = [(str(f), int(t), int(b)) for f, t, b in units]
        if not keys:
            return 0
        with self._write() as con:
            return _claims.renew(con, keys, owner=owner, lease_s=lease_s)

    def release_claims(self, *, owner: str, units: Iterable[tuple[str, int, int]] | None = None) -> int:
        """End ``owner``'s claims on ``units`` (all of its claims when None); returns how many."""
        with self._write() as con:
            return _claims.release(con, units, owner=owner)

    def claims(self) -> pd.DataFrame:
        """The claims held now (live or expired): one row per unit being profiled somewhere."""
        with self._read() as con:
            return _claims.held(con)

    # -- export / import ----------------------------------------------------------------
    def export(self, path: str | os.PathLike) -> int:
        """Write every profile to ``path`` (.csv or .parquet, by extension); returns the count.

        The file is written under a temporary name and renamed into place.
        """
        path = Path(path).expanduser()
        check_destination(path)
        df = self.frame()
        write_profiles(df, path)
        return len(df)

    def import_file(self, path: str | os.PathLike, *, replace: bool = False) -> dict[str, int]:
        """Add the profiles of a file written by :meth:`export` (.csv or .parquet).

        Every row is checked first (columns, types, no NaN, no negative times, no repeated
        key); any problem raises ``UserError`` naming the file, row and column, and nothing
        is written. Profiles already in the cache are kept unless ``replace``. Returns the
        counts ``{"inserted", "skipped", "replaced"}``.
        """
        rows = read_profiles(Path(path).expanduser())
        counts = {"inserted": 0, "skipped": 0, "replaced": 0}
        with self._write() as con:
            for row in rows:
                if con.execute(f"INSERT OR IGNORE {_PROFILE_INSERT}", row).rowcount:
                    counts["inserted"] += 1
                elif replace:
                    con.execute(f"INSERT OR REPLACE {_PROFILE_INSERT}", row)
                    counts["replaced"] += 1
                else:
                    counts["skipped"] += 1
        return counts


def _unit_filter(**filters: Any) -> tuple[list[str], list[Any]]:
    """SQL conditions (and their parameters) for the filters given (None: no condition)."""
    where, params = [], []
    for col, val in filters.items():
        if val is not None:
            where.append(f"{col} = ?")
            params.append(val if col == "fingerprint" else int(val))
    return where, params
