"""Units whose profiling failed for good: the cache remembers them so that no search tries again.

A failure is remembered only when the runner says it would come back the same on every
try (``lens.errors.UnitCannotRun``: out of device memory, a refusal); a timeout, a lost
worker or a noisy host may pass, and is reported by the run that met it only. A search
skips a remembered unit (``lensopt run --retry-failed`` measures it again); profiles
stored for the unit later end its record, in the same transaction.

The functions here take an open connection inside a write (or read) transaction;
``ProfileCache.put_failure`` / ``get_failure`` / ``failures`` / ``forget_failures`` wrap them.
"""
from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Iterable

import pandas as pd

from .schema import FAILURE_COLUMNS

UnitKey = tuple[str, int, int]


@dataclass(frozen=True)
class UnitFailure:
    """Why a unit could not be profiled, where and when (seconds since the epoch)."""

    reason: str
    kind: str
    host: str
    failed_at: float

    def when(self) -> str:
        return datetime.fromtimestamp(self.failed_at, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")

    def describe(self) -> str:
        """One line for a log or a report: the reason, then where the record came from."""
        return (f"{self.reason} (recorded in the profile cache on {self.when()} by {self.host}; "
                f"--retry-failed measures it again)")


def record(con: sqlite3.Connection, key: UnitKey, *, reason: str, kind: str, host: str) -> None:
    """Remember that unit ``key`` failed (replacing an older record of it)."""
    con.execute(
        f"INSERT OR REPLACE INTO failures ({', '.join(FAILURE_COLUMNS)}) VALUES ({', '.join('?' * len(FAILURE_COLUMNS))})",
        (*key, str(reason), str(kind), str(host), time.time()),
    )


def get(con: sqlite3.Connection, key: UnitKey) -> UnitFailure | None:
    row = con.execute("SELECT reason, kind, host, failed_at FROM failures WHERE fingerprint = ? AND tp = ? AND batch = ?",
                      key).fetchone()
    return None if row is None else UnitFailure(reason=str(row[0]), kind=str(row[1]), host=str(row[2]),
                                                failed_at=float(row[3]))


def forget(con: sqlite3.Connection, keys: Iterable[UnitKey] | None = None, *, where: str = "",
           params: tuple = ()) -> int:
    """End the records of ``keys`` (or of every unit matching the SQL ``where``); how many ended."""
    if keys is None:
        return int(con.execute("DELETE FROM failures" + (f" WHERE {where}" if where else ""), params).rowcount)
    return sum(con.execute("DELETE FROM failures WHERE fingerprint = ? AND tp = ? AND batch = ?", k).rowcount
               for k in keys)


def listed(con: sqlite3.Connection, fingerprint: str | None = None) -> pd.DataFrame:
    """The remembered failures (all, or of one fingerprint), one row per unit, with :data:`FAILURE_COLUMNS`."""
    sql = f"SELECT {', '.join(FAILURE_COLUMNS)} FROM failures"
    params: tuple = ()
    if fingerprint is not None:
        sql += " WHERE fingerprint = ?"
        params = (fingerprint,)
    rows = con.execute(sql + " ORDER BY fingerprint, tp, batch", params).fetchall()
    return pd.DataFrame.from_records(rows, columns=list(FAILURE_COLUMNS))
