"""The profile cache's schema: how a file is marked as ours, its tables and their columns.

A file is recognised as a lensopt cache by ``PRAGMA application_id`` (read straight from
the 100-byte SQLite header), then by ``PRAGMA user_version`` (:data:`SCHEMA_VERSION`) and
the ``meta`` table. The ``claims`` table is an optional part of schema 1: files written
before it existed get it on their first read-write open.

A file of an older schema is brought to :data:`SCHEMA_VERSION` on open by the steps of
:data:`MIGRATIONS`, one transaction for all of them: its profiles stay as they were.

- schema 2: the ``failures`` table (units whose profiling failed in a way that would
  repeat: out of device memory, a runner's refusal).
- schema 3: each profile's derived spreads (``ttft_err_s``, ``tbt_err_s``: one standard
  error bootstrapped over its repeats), the unit's expected slow-down counted in it
  (``excess``) and whether it was ``accepted``; older profiles get their spreads from the
  raw repeats they kept (``store.migrate``).
- schema 4: the unit's host seconds per live row of a decode step (``row_s``, ``lens.rows``);
  older profiles get 0 (none seen).
- schema 5: what the unit's served admissions cost against ``ttft_s`` (``admit_first_s``,
  ``admit_next_s``, ``lens.admission``); older profiles get 0 (as the profile says).
- schema 6: what a live row's context costs a decode step (``kv_token_s``,
  ``lens.context_cost``) and the mean context of the row cost's measured row
  (``row_context``); older profiles get 0 (a decode kernel of the bucket's shape: TBT_b
  whatever the rows hold).
- schema 7: what a decode run costs after a served admission beyond its steps
  (``resume_s``, ``lens.resume``); older profiles get 0 (the decode resumes at its steady
  pace).
- schema 8: what a served pass that stops a running decode costs its first prompt
  (``admit_busy_s``, ``lens.admission``); older profiles get their ``admit_first_s`` (one
  offset priced both passes).
- schema 9: what the first decode run after a served admission costs at each idle spell
  before the pass (``resume_idle``, a JSON list of [idle seconds, seconds] pairs,
  ``lens.resume``); older profiles get an empty list (``resume_s`` after any pass, as they
  were composed).
- schema 10: what the first decode run after a served pass that stops a running decode
  costs, by the pass's seconds (``resume_busy``, a JSON list of [pass seconds, seconds]
  pairs, ``lens.busy_resume``); older profiles get an empty list (the shortest idle spell's
  cost prices such a pass, as they were composed).
- schema 11: a lone served prompt's TTFT quantiles about its median (``prefill_tail``, a
  JSON list of seconds, non-decreasing, ``lens.prefill_tail``); older profiles get an empty
  list (every prefill takes its composed time, as they were composed).
- schema 12: the median the tail lies about (``prefill_tail_median_s``: each prompt's draws
  are scaled by its own prefill over it); older profiles get 0 (their tail's seconds are read
  as they are, whatever the prompt, as they were composed).
- schema 13: how a lone served decode's pace wanders (``decode_pace``, a JSON list of its
  seconds over its call's mean less one, non-decreasing; ``decode_pace_window_s``, the
  decode seconds each averages over; ``decode_pace_tau_s``, how fast the pace forgets,
  ``lens.decode_pace``); older profiles get an empty list and 0 (every decode step takes its
  composed time, as they were composed).
- schema 14: the version of the host-cost measurements that measured each profile
  (``host_costs_method``, ``lens.methods``); older profiles get 0 (stored before versions
  were recorded: their method is not known).
"""
from __future__ import annotations

import sqlite3
import time
from typing import Callable

#: "LENS" in ASCII: marks an SQLite file as a lensopt profile cache
APPLICATION_ID = 0x4C454E53
#: the schema this code reads and writes (``PRAGMA user_version``)
SCHEMA_VERSION = 14
#: the first 16 bytes of every SQLite database file
SQLITE_MAGIC = b"SQLite format 3\x00"

UNIT_COLUMNS = (
    "fingerprint", "tp", "batch", "target_json", "runner", "versions_json", "host",
    "compile_s", "run_s", "created_at",
)
#: the columns of the ``profiles`` table, of ``ProfileCache.frame()``, and of export/import files.
#: ``ttft_s`` is one prefill call in the bucket as the target runs it (``lens.types.BucketProfile``):
#: one request's prompt under ``prefill = "sequential"``, the whole batch's under ``"batched"``; a
#: batched target has a fingerprint of its own, so one fingerprint's rows all mean the same
PROFILE_COLUMNS = (
    "fingerprint", "tp", "batch", "bucket", "ttft_s", "tbt_s", "input_len", "l1", "l2",
    "t1_s", "t2_s", "raw_t1", "raw_t2", "repeats", "spread", "runner", "host",
    "measured_at", "simulated", "source", "ttft_err_s", "tbt_err_s", "excess", "accepted", "row_s",
    "admit_first_s", "admit_next_s", "kv_token_s", "row_context", "resume_s", "admit_busy_s",
    "resume_idle", "resume_busy", "prefill_tail", "prefill_tail_median_s", "decode_pace", "decode_pace_window_s",
    "decode_pace_tau_s", "host_costs_method",
)
#: the columns each schema version added at the end of ``profiles`` (its migration adds them)
ADDED_PROFILE_COLUMNS = {3: ("ttft_err_s", "tbt_err_s", "excess", "accepted"), 4: ("row_s",),
                         5: ("admit_first_s", "admit_next_s"), 6: ("kv_token_s", "row_context"),
                         7: ("resume_s",), 8: ("admit_busy_s",), 9: ("resume_idle",),
                         10: ("resume_busy",), 11: ("prefill_tail",),
                         12: ("prefill_tail_median_s",),
                         13: ("decode_pace", "decode_pace_window_s", "decode_pace_tau_s"),
                         14: ("host_costs_method",)}
#: the primary key of a profile: the first columns of :data:`PROFILE_COLUMNS`
PROFILE_KEY = ("fingerprint", "tp", "batch", "bucket")
#: integer and real columns of ``profiles``; ``simulated`` is 0/1, the rest text
#: (``raw_t1``/``raw_t2`` are JSON lists of seconds, ``resume_idle`` and ``resume_busy`` lists of [seconds, seconds] pairs,
#: ``prefill_tail`` one of seconds of either sign, ``decode_pace`` one of fractions of either sign)
INT_COLUMNS = ("tp", "batch", "bucket", "input_len", "l1", "l2", "repeats", "host_costs_method")
FLOAT_COLUMNS = ("ttft_s", "tbt_s", "t1_s", "t2_s", "spread", "measured_at", "ttft_err_s", "tbt_err_s", "excess",
                 "row_s", "admit_first_s", "admit_next_s", "kv_token_s", "row_context", "resume_s", "admit_busy_s",
                 "prefill_tail_median_s", "decode_pace_window_s", "decode_pace_tau_s")
#: 0/1 columns
BOOL_COLUMNS = ("simulated", "accepted")
CLAIM_COLUMNS = ("fingerprint", "tp", "batch", "buckets", "owner", "claimed_at", "expires_at")
#: a unit whose profiling failed for good: why (``kind``: the error's class name), where and when
FAILURE_COLUMNS = ("fingerprint", "tp", "batch", "reason", "kind", "host", "failed_at")

SCHEMA_SQL = """
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
    ttft_err_s  REAL    NOT NULL DEFAULT 0,
    tbt_err_s   REAL    NOT NULL DEFAULT 0,
    excess      REAL    NOT NULL DEFAULT 0,
    accepted    INTEGER NOT NULL DEFAULT 1,
    row_s       REAL    NOT NULL DEFAULT 0,
    admit_first_s REAL  NOT NULL DEFAULT 0,
    admit_next_s  REAL  NOT NULL DEFAULT 0,
    kv_token_s  REAL    NOT NULL DEFAULT 0,
    row_context REAL    NOT NULL DEFAULT 0,
    resume_s    REAL    NOT NULL DEFAULT 0,
    admit_busy_s REAL   NOT NULL DEFAULT 0,
    resume_idle TEXT    NOT NULL DEFAULT '[]',
    resume_busy TEXT    NOT NULL DEFAULT '[]',
    prefill_tail TEXT   NOT NULL DEFAULT '[]',
    prefill_tail_median_s REAL NOT NULL DEFAULT 0,
    decode_pace TEXT    NOT NULL DEFAULT '[]',
    decode_pace_window_s REAL NOT NULL DEFAULT 0,
    decode_pace_tau_s REAL NOT NULL DEFAULT 0,
    host_costs_method INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (fingerprint, tp, batch, bucket)
);
"""
FAILURES_SQL = """
CREATE TABLE failures (
    fingerprint TEXT    NOT NULL,
    tp          INTEGER NOT NULL,
    batch       INTEGER NOT NULL,
    reason      TEXT    NOT NULL,
    kind        TEXT    NOT NULL,
    host        TEXT    NOT NULL,
    failed_at   REAL    NOT NULL,
    PRIMARY KEY (fingerprint, tp, batch)
)
"""
#: table -> columns that every cache of :data:`SCHEMA_VERSION` has
TABLES = {"meta": ("key", "value"), "units": UNIT_COLUMNS, "profiles": PROFILE_COLUMNS, "failures": FAILURE_COLUMNS}


def _spreads_from_raw(con: sqlite3.Connection) -> None:
    from .migrate import spreads_from_raw  # it bootstraps with lens: loaded only when a cache needs it

    spreads_from_raw(con)


#: version v -> the steps (SQL statements, or functions of the connection) that bring a cache of
#: version v - 1 to v; each step keeps every row
MIGRATIONS: dict[int, tuple[str | Callable[[sqlite3.Connection], None], ...]] = {
    2: (FAILURES_SQL,),
    3: ("ALTER TABLE profiles ADD COLUMN ttft_err_s REAL NOT NULL DEFAULT 0",
        "ALTER TABLE profiles ADD COLUMN tbt_err_s REAL NOT NULL DEFAULT 0",
        "ALTER TABLE profiles ADD COLUMN excess REAL NOT NULL DEFAULT 0",
        "ALTER TABLE profiles ADD COLUMN accepted INTEGER NOT NULL DEFAULT 1",
        _spreads_from_raw),
    4: ("ALTER TABLE profiles ADD COLUMN row_s REAL NOT NULL DEFAULT 0",),
    5: ("ALTER TABLE profiles ADD COLUMN admit_first_s REAL NOT NULL DEFAULT 0",
        "ALTER TABLE profiles ADD COLUMN admit_next_s REAL NOT NULL DEFAULT 0"),
    6: ("ALTER TABLE profiles ADD COLUMN kv_token_s REAL NOT NULL DEFAULT 0",
        "ALTER TABLE profiles ADD COLUMN row_context REAL NOT NULL DEFAULT 0"),
    7: ("ALTER TABLE profiles ADD COLUMN resume_s REAL NOT NULL DEFAULT 0",),
    8: ("ALTER TABLE profiles ADD COLUMN admit_busy_s REAL NOT NULL DEFAULT 0",
        "UPDATE profiles SET admit_busy_s = admit_first_s"),
    9: ("ALTER TABLE profiles ADD COLUMN resume_idle TEXT NOT NULL DEFAULT '[]'",),
    10: ("ALTER TABLE profiles ADD COLUMN resume_busy TEXT NOT NULL DEFAULT '[]'",),
    11: ("ALTER TABLE profiles ADD COLUMN prefill_tail TEXT NOT NULL DEFAULT '[]'",),
    12: ("ALTER TABLE profiles ADD COLUMN prefill_tail_median_s REAL NOT NULL DEFAULT 0",),
    13: ("ALTER TABLE profiles ADD COLUMN decode_pace TEXT NOT NULL DEFAULT '[]'",
         "ALTER TABLE profiles ADD COLUMN decode_pace_window_s REAL NOT NULL DEFAULT 0",
         "ALTER TABLE profiles ADD COLUMN decode_pace_tau_s REAL NOT NULL DEFAULT 0"),
    14: ("ALTER TABLE profiles ADD COLUMN host_costs_method INTEGER NOT NULL DEFAULT 0",),
}
#: the oldest schema a cache may have and still be opened (brought up to date)
OLDEST_VERSION = 1

#: added to schema 1 later: created on open when missing, so older files stay readable
CLAIMS_SQL = """
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
#: table -> columns of the tables a cache may lack
OPTIONAL_TABLES = {"claims": CLAIM_COLUMNS}


def lensopt_version() -> str:
    """The installed lensopt distribution's version, or ``"unknown"`` when run from a checkout."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lensopt")
    except PackageNotFoundError:
        return "unknown"


def initialise(con: sqlite3.Connection) -> None:
    """Turn the empty database behind ``con`` (autocommit mode) into a cache of this schema."""
    con.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    con.execute("BEGIN")
    for stmt in SCHEMA_SQL.split(";"):
        if stmt.strip():
            con.execute(stmt)
    con.execute(FAILURES_SQL)
    con.execute(CLAIMS_SQL)
    con.executemany(
        "INSERT INTO meta (key, value) VALUES (?, ?)",
        [("schema", str(SCHEMA_VERSION)), ("created_at", repr(time.time())),
         ("lensopt_version", lensopt_version()), ("application", "lensopt profile cache")],
    )
    con.execute("COMMIT")
    # persistent in the header: every later connection opens in WAL mode
    con.execute("PRAGMA journal_mode = WAL")


def migrate(con: sqlite3.Connection) -> int:
    """Bring the cache behind ``con`` (autocommit mode) to :data:`SCHEMA_VERSION`; the version it had.

    One ``BEGIN IMMEDIATE`` transaction: the version is read again under the write lock (a
    process that opened the file at the same time may have migrated it already), and a step
    that fails leaves the file exactly as it was.
    """
    con.execute("BEGIN IMMEDIATE")
    try:
        was = int(con.execute("PRAGMA user_version").fetchone()[0])
        for v in range(was + 1, SCHEMA_VERSION + 1):
            for step in MIGRATIONS[v]:
                step(con) if callable(step) else con.execute(step)
        if was < SCHEMA_VERSION:
            con.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (str(SCHEMA_VERSION),))
            con.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                        (f"migrated_from_{was}_at", repr(time.time())))
            con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        con.execute("COMMIT")
    except BaseException:
        if con.in_transaction:
            con.rollback()
        raise
    return was
