"""A cache (and an export) written by schema 1 keeps working: migrated on open (every step), its profiles intact."""
from __future__ import annotations

import json
import sqlite3
import time

import pandas as pd
import pytest

from storekit import FP, V1_PROFILE_COLUMNS, V1_SQL, profile, put

from store import APPLICATION_ID, SCHEMA_VERSION, ProfileCache
from store.migrate import legacy_spreads

def _v1_row(bucket: int, raw1=(0.101, 0.100, 0.104), raw2=(0.352, 0.350, 0.349)) -> tuple:
    t1, t2 = sorted(raw1)[len(raw1) // 2], sorted(raw2)[len(raw2) // 2]
    tbt = (t2 - t1) / (64 - 2)
    ttft = (t1 - tbt) / 4
    return (FP, 2, 4, bucket, ttft, tbt, bucket - 1, 2, 64, t1, t2, json.dumps(list(raw1)), json.dumps(list(raw2)),
            3, 0.04, "sim", "host-a", 1_700_000_000.0, 1, "simulated")


def _v1_cache(path, rows, *, claims: bool = True) -> None:
    con = sqlite3.connect(path, isolation_level=None)
    con.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    con.execute("PRAGMA user_version = 1")
    con.executescript(V1_SQL)
    if not claims:  # schema 1 files from before claims existed
        con.execute("DROP TABLE claims")
    con.executemany("INSERT INTO meta VALUES (?, ?)", [("schema", "1"), ("created_at", repr(time.time())),
                                                       ("lensopt_version", "0.1"), ("application", "lensopt profile cache")])
    con.execute("INSERT INTO units VALUES (?, 2, 4, '{}', 'sim', '{}', 'host-a', 10.0, 5.0, 1700000000.0)", (FP,))
    con.executemany(f"INSERT INTO profiles ({', '.join(V1_PROFILE_COLUMNS)}) VALUES ({', '.join('?' * len(V1_PROFILE_COLUMNS))})", rows)
    con.close()


@pytest.mark.parametrize("claims", [True, False])
def test_a_schema_1_cache_is_migrated_on_open_with_its_profiles_intact(tmp_path, claims):
    path = tmp_path / "old.sqlite"
    rows = [_v1_row(128), _v1_row(256, raw1=(0.2,), raw2=(0.5,))]
    _v1_cache(path, rows, claims=claims)
    with ProfileCache.open(path, create=False) as c:
        got = c.get_unit(FP, 2, 4)
        frame = c.frame()
    assert SCHEMA_VERSION >= 2
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert dict(con.execute("SELECT key, value FROM meta"))["schema"] == str(SCHEMA_VERSION)
    con.close()
    # every value schema 1 stored is read back unchanged
    for row in rows:
        p = got[row[3]]
        old = dict(zip(V1_PROFILE_COLUMNS, row))
        assert (p.ttft_s, p.tbt_s, p.t1_s, p.t2_s, p.l1, p.l2, p.repeats, p.spread) == \
            (old["ttft_s"], old["tbt_s"], old["t1_s"], old["t2_s"], old["l1"], old["l2"], old["repeats"], old["spread"])
        assert p.raw_t1 == tuple(json.loads(old["raw_t1"])) and p.source == "simulated"
        assert p.accepted and p.excess == 0.0 and p.row_s == 0.0  # schema 4: no row cost seen
        assert p.admit_first_s == p.admit_next_s == 0.0  # schema 5: admissions as the profile says
        assert p.kv_token_s == p.row_context == 0.0  # schema 6: TBT_b whatever the rows hold
        assert p.host_costs_method == 0  # schema 14: the host costs' method is not known
        assert p.resume_s == 0.0  # schema 7: the decode resumes at its steady pace
        assert p.admit_busy_s == p.admit_first_s  # schema 8: one offset for both passes, as before
        assert p.resume_idle == ()  # schema 9: one resume cost after any pass, as before
        assert p.resume_busy == ()  # schema 10: a busy pass's resume at the shortest spell's, as before
        assert p.prefill_tail == ()  # schema 11: every prefill takes its composed time, as before
        assert p.prefill_tail_median_s == 0.0  # schema 12: a tail's seconds as they are
        assert p.decode_pace == () and p.decode_pace_window_s == p.decode_pace_tau_s == 0.0  # schema 13: no wander
    # the spreads schema 2 adds are bootstrapped from the raw repeats kept by schema 1
    e1, e2 = legacy_spreads((0.101, 0.100, 0.104), (0.352, 0.350, 0.349), l1=2, l2=64, batch=4)
    assert e1 > 0 and e2 > 0
    assert got[128].ttft_err_s == pytest.approx(e1) and got[128].tbt_err_s == pytest.approx(e2)
    assert got[256].ttft_err_s == 0.0 and got[256].tbt_err_s == 0.0  # one repeat: no spread to tell
    assert len(frame) == 2
    # a second open finds it migrated and leaves it as it is
    with ProfileCache.open(path, create=False) as c:
        assert c.get_unit(FP, 2, 4) == got


def test_a_schema_1_export_still_imports(tmp_path, cache):
    """A CSV exported by schema 1 lacks the new columns; they are filled as the migration fills them."""
    path = tmp_path / "old.sqlite"
    _v1_cache(path, [_v1_row(128)])
    con = sqlite3.connect(path)
    df = pd.read_sql_query(f"SELECT {', '.join(V1_PROFILE_COLUMNS)} FROM profiles", con)
    con.close()
    df.to_csv(tmp_path / "old.csv", index=False)
    assert cache.import_file(tmp_path / "old.csv") == {"inserted": 1, "skipped": 0, "replaced": 0}
    with ProfileCache.open(path, create=False) as migrated:
        assert cache.get_unit(FP, 2, 4) == migrated.get_unit(FP, 2, 4)


def test_a_schema_2_cache_keeps_its_failures_and_its_profiles_gain_their_spreads(tmp_path):
    """Schema 2 (schema 1 plus the failures table) takes only the last step, and keeps what it remembered."""
    from store.schema import FAILURES_SQL

    path = tmp_path / "v2.sqlite"
    _v1_cache(path, [_v1_row(128)])
    con = sqlite3.connect(path, isolation_level=None)
    con.execute(FAILURES_SQL)
    con.execute("INSERT INTO failures VALUES (?, 1, 64, 'out of device memory', 'DeviceOutOfMemory', 'h', 1.7e9)",
                (FP,))
    con.execute("UPDATE meta SET value = '2' WHERE key = 'schema'")
    con.execute("PRAGMA user_version = 2")
    con.close()
    with ProfileCache.open(path, create=False) as c:
        p = c.get_unit(FP, 2, 4)[128]
        failure = c.get_failure(FP, 1, 64)
    assert failure is not None and failure.reason == "out of device memory" and failure.kind == "DeviceOutOfMemory"
    e1, e2 = legacy_spreads((0.101, 0.100, 0.104), (0.352, 0.350, 0.349), l1=2, l2=64, batch=4)
    assert (p.ttft_err_s, p.tbt_err_s) == (pytest.approx(e1), pytest.approx(e2)) and p.accepted
    assert p.ttft_s == _v1_row(128)[4] and p.tbt_s == _v1_row(128)[5]
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 14
    con.close()


def _older(path, version, profiles, dropped):
    """A cache at ``path`` of schema ``version``: ``profiles`` written now, then the later ``dropped`` columns
    taken out; the unit as it reads once brought up to date."""
    with ProfileCache.open(path) as c:
        put(c, profiles=profiles)
    con = sqlite3.connect(path, isolation_level=None)
    for col in dropped:
        con.execute(f"ALTER TABLE profiles DROP COLUMN {col}")
    con.execute(f"PRAGMA user_version = {version}")
    con.execute(f"UPDATE meta SET value = '{version}' WHERE key = 'schema'")
    con.close()
    with ProfileCache.open(path, create=False) as c:
        return c.get_unit(FP, 2, 4)


def test_a_schema_7_cache_prices_a_busy_pass_as_its_idle_one(tmp_path):
    # schema 8 added admit_busy_s: a cache of before gets each profile's admit_first_s (one offset priced both)
    got = _older(tmp_path / "v7.sqlite", 7,
                 [profile(b, admit_first_s=0.002, admit_next_s=-0.001) for b in (128, 256)],
                 ("host_costs_method", "decode_pace_tau_s", "decode_pace_window_s", "decode_pace", "prefill_tail_median_s", "prefill_tail", "resume_busy", "resume_idle", "admit_busy_s"))
    assert sorted(got) == [128, 256]
    assert all(p.admit_busy_s == 0.002 and p.admit_next_s == -0.001 for p in got.values())


def test_a_schema_8_cache_pays_one_resume_cost_after_any_pass(tmp_path):
    # schema 9 added resume_idle: a cache of before gets none (resume_s after any pass, whatever the idle spell)
    got = _older(tmp_path / "v8.sqlite", 8,
                 [profile(b, resume_s=0.004, resume_idle=((0.001, 0.002), (0.03, 0.004))) for b in (128, 256)],
                 ("host_costs_method", "decode_pace_tau_s", "decode_pace_window_s", "decode_pace", "prefill_tail_median_s", "prefill_tail", "resume_busy", "resume_idle"))
    assert sorted(got) == [128, 256]
    assert all(p.resume_s == 0.004 and p.resume_idle == () for p in got.values())
    # and a cache of this schema keeps what it was given
    with ProfileCache.open(tmp_path / "v9.sqlite") as c:
        put(c, profiles=[profile(128, resume_s=0.004, resume_idle=((0.001, 0.002), (0.03, 0.004)))])
        assert c.get_unit(FP, 2, 4)[128].resume_idle == ((0.001, 0.002), (0.03, 0.004))


def test_a_schema_9_cache_prices_a_busy_pass_at_the_shortest_idle_spell(tmp_path):
    # schema 10 added resume_busy: a cache of before gets none (a busy pass pays the shortest spell's cost)
    got = _older(tmp_path / "v9b.sqlite", 9, [profile(b, resume_busy=((0.005, 0.001), (0.04, 0.009)))
                                              for b in (128, 256)], ("host_costs_method", "decode_pace_tau_s", "decode_pace_window_s", "decode_pace", "prefill_tail_median_s", "prefill_tail", "resume_busy"))
    assert sorted(got) == [128, 256]
    assert all(p.resume_busy == () and p.resume_idle == ((0.004, 0.001), (0.1, 0.005)) for p in got.values())
    # and a cache of this schema keeps what it was given
    with ProfileCache.open(tmp_path / "v10.sqlite") as c:
        put(c, profiles=[profile(128, resume_busy=((0.005, 0.001), (0.04, 0.009)))])
        assert c.get_unit(FP, 2, 4)[128].resume_busy == ((0.005, 0.001), (0.04, 0.009))


def test_a_schema_10_cache_gives_every_prefill_its_composed_time(tmp_path):
    # schema 11 added prefill_tail: a cache of before gets none (every prefill takes the time the profile composes)
    tail = (-0.002, -0.0005, 0.0, 0.0, 0.003)
    got = _older(tmp_path / "v10b.sqlite", 10, [profile(b, prefill_tail=tail) for b in (128, 256)],
                 ("host_costs_method", "decode_pace_tau_s", "decode_pace_window_s", "decode_pace", "prefill_tail_median_s", "prefill_tail"))
    assert sorted(got) == [128, 256]
    assert all(p.prefill_tail == () and p == profile(p.bucket, prefill_tail=(), prefill_tail_median_s=0.0,
                                                     host_costs_method=0,
                                                     decode_pace=(), decode_pace_window_s=0.0, decode_pace_tau_s=0.0)
               for p in got.values())
    con = sqlite3.connect(tmp_path / "v10b.sqlite")
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 14
    assert {r[0] for r in con.execute("SELECT prefill_tail FROM profiles")} == {"[]"}
    con.close()
    # and a cache of this schema keeps what it was given
    with ProfileCache.open(tmp_path / "v11.sqlite") as c:
        put(c, profiles=[profile(128, prefill_tail=tail)])
        assert c.get_unit(FP, 2, 4)[128].prefill_tail == tail


def test_a_schema_11_cache_reads_its_tail_in_seconds_whatever_the_prompt(tmp_path):
    # schema 12 added prefill_tail_median_s: a cache of before keeps its tail and gets 0 (its seconds read as they
    # are, as they were composed)
    tail = (-0.002, -0.0005, 0.0, 0.0, 0.003)
    got = _older(tmp_path / "v11b.sqlite", 11, [profile(b, prefill_tail=tail) for b in (128, 256)],
                 ("host_costs_method", "decode_pace_tau_s", "decode_pace_window_s", "decode_pace", "prefill_tail_median_s",))
    assert all(p.prefill_tail == tail and p.prefill_tail_median_s == 0.0 for p in got.values())
    # and a cache of this schema keeps what it was given
    with ProfileCache.open(tmp_path / "v12.sqlite") as c:
        put(c, profiles=[profile(128, prefill_tail=tail, prefill_tail_median_s=0.0066)])
        assert c.get_unit(FP, 2, 4)[128].prefill_tail_median_s == 0.0066


def test_a_schema_12_cache_gives_every_decode_step_its_composed_time(tmp_path):
    # schema 13 added decode_pace and its window and tau: a cache of before keeps everything else and gets no
    # wander (every decode step takes its composed time, as it was composed)
    pace = (-0.2, -0.05, 0.0, 0.1, 0.4)
    got = _older(tmp_path / "v12b.sqlite", 12, [profile(b, decode_pace=pace) for b in (128, 256)],
                 ("host_costs_method", "decode_pace_tau_s", "decode_pace_window_s", "decode_pace"))
    assert sorted(got) == [128, 256]
    assert all(p == profile(p.bucket, decode_pace=(), decode_pace_window_s=0.0, decode_pace_tau_s=0.0,
                            host_costs_method=0)
               for p in got.values())
    con = sqlite3.connect(tmp_path / "v12b.sqlite")
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 14
    assert {r[0] for r in con.execute("SELECT decode_pace FROM profiles")} == {"[]"}
    con.close()
    # and a cache of this schema keeps what it was given
    with ProfileCache.open(tmp_path / "v13.sqlite") as c:
        put(c, profiles=[profile(128, decode_pace=pace, decode_pace_window_s=0.08, decode_pace_tau_s=0.0)])
        got = c.get_unit(FP, 2, 4)[128]
        assert (got.decode_pace, got.decode_pace_window_s, got.decode_pace_tau_s) == (pace, 0.08, 0.0)


def test_a_schema_13_cache_does_not_know_how_its_host_costs_were_measured(tmp_path):
    # schema 14 added host_costs_method: a cache of before keeps every value and gets 0 (its method not known),
    # which lens.methods reads as older than any version
    got = _older(tmp_path / "v13b.sqlite", 13, [profile(b, admit_first_s=0.002) for b in (128, 256)],
                 ("host_costs_method",))
    assert sorted(got) == [128, 256]
    assert all(p == profile(p.bucket, admit_first_s=0.002, host_costs_method=0) for p in got.values())
    con = sqlite3.connect(tmp_path / "v13b.sqlite")
    assert con.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 14
    assert {r[0] for r in con.execute("SELECT host_costs_method FROM profiles")} == {0}
    con.close()
    # and a cache of this schema keeps what it was given
    with ProfileCache.open(tmp_path / "v14.sqlite") as c:
        put(c, profiles=[profile(128, host_costs_method=3)])
        assert c.get_unit(FP, 2, 4)[128].host_costs_method == 3
