"""Claims on units: who is profiling what, for how long (the cache's leases).

Before a process profiles a unit it claims it: one row per unit in the ``claims`` table,
taken inside the caller's ``BEGIN IMMEDIATE`` transaction with a lease that its owner
renews while the task runs. Another process that wants the unit meanwhile waits for the
profiles instead of measuring them a second time; a claim whose owner died expires with
its lease, or at once when the owner was a process of this host that no longer exists.

The functions here take an open connection inside a write transaction;
``ProfileCache.claim_unit`` / ``renew_claims`` / ``release_claims`` / ``claims`` wrap them.
The length of a lease is a setting of the space file (``[profile] lease_s``): callers pass it.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import sqlite3
import time
from dataclasses import dataclass
from typing import Iterable

import pandas as pd

from .schema import CLAIM_COLUMNS

UnitKey = tuple[str, int, int]


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
    """The answer to ``ProfileCache.claim_unit``."""

    #: True: the caller now holds the unit and must profile ``missing``, then store or release
    granted: bool
    #: buckets the cache still lacks (empty: nothing to do, nothing claimed)
    missing: tuple[int, ...]
    #: the live owner holding the unit, when not granted
    holder: str | None = None
    expires_at: float | None = None


def claim(con: sqlite3.Connection, key: UnitKey, *, buckets: Iterable[int], owner: str, lease_s: float) -> Claim:
    """Claim unit ``key`` for the buckets of ``buckets`` it lacks (see ``ProfileCache.claim_unit``)."""
    want = sorted({int(b) for b in buckets})
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


def renew(con: sqlite3.Connection, keys: Iterable[UnitKey], *, owner: str, lease_s: float) -> int:
    """Push the lease of ``owner``'s claims on ``keys`` to now + ``lease_s``; how many were renewed."""
    until = time.time() + float(lease_s)
    n = 0
    for k in keys:
        n += con.execute("UPDATE claims SET expires_at = ? WHERE fingerprint = ? AND tp = ? AND batch = ? "
                         "AND owner = ?", (until, *k, owner)).rowcount
    return n


def release(con: sqlite3.Connection, keys: Iterable[UnitKey] | None, *, owner: str) -> int:
    """End ``owner``'s claims on ``keys`` (all of its claims when None); how many ended."""
    if keys is None:
        return int(con.execute("DELETE FROM claims WHERE owner = ?", (owner,)).rowcount)
    n = 0
    for f, t, b in keys:
        n += con.execute("DELETE FROM claims WHERE fingerprint = ? AND tp = ? AND batch = ? AND owner = ?",
                         (str(f), int(t), int(b), owner)).rowcount
    return n


def held(con: sqlite3.Connection) -> pd.DataFrame:
    """The claims held now (live or expired), one row per unit, with :data:`CLAIM_COLUMNS`."""
    rows = con.execute(f"SELECT {', '.join(CLAIM_COLUMNS)} FROM claims ORDER BY fingerprint, tp, batch").fetchall()
    return pd.DataFrame.from_records(rows, columns=list(CLAIM_COLUMNS))
