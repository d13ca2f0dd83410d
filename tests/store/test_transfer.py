"""Export and import of profiles as CSV or Parquet: identical round trips, every bad file refused whole."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from storekit import FP, profile, put

from lens.errors import UserError
from store import ProfileCache


@pytest.mark.parametrize("ext", [".csv", ".parquet"])
def test_export_import_identical(tmp_path, cache, ext):
    put(cache)
    put(cache, fp="ffff000011112222", tp=1, batch=1, buckets=(64,))
    cache.put_unit(fingerprint=FP, tp=8, batch=1,
                   profiles=[profile(32, runner="", host="", simulated=False, source="estimate:amali", raw_t1=(), raw_t2=())],
                   target={}, runner="", versions={}, host="", compile_s=0.0, run_s=0.0)
    out = tmp_path / f"export{ext}"
    assert cache.export(out) == 5
    with ProfileCache.open(tmp_path / "fresh.sqlite") as fresh:
        assert fresh.import_file(out) == {"inserted": 5, "skipped": 0, "replaced": 0}
        pd.testing.assert_frame_equal(fresh.frame(), cache.frame())
        assert fresh.get_unit(FP, 2, 4) == cache.get_unit(FP, 2, 4)
        assert fresh.get_unit(FP, 8, 1)[32].raw_t1 == ()
        # again: existing rows are kept, or replaced on request
        assert fresh.import_file(out) == {"inserted": 0, "skipped": 5, "replaced": 0}
        assert fresh.import_file(out, replace=True) == {"inserted": 0, "skipped": 0, "replaced": 5}
        pd.testing.assert_frame_equal(fresh.frame(), cache.frame())


def test_import_keeps_existing_unless_replace(tmp_path, cache):
    put(cache, buckets=(128, 256))
    out = tmp_path / "e.csv"
    cache.export(out)
    cache.remove(bucket=256)
    put(cache, buckets=(128,), profiles=[profile(128, ttft_s=5.0)])
    assert cache.import_file(out) == {"inserted": 1, "skipped": 1, "replaced": 0}
    assert cache.get_unit(FP, 2, 4)[128].ttft_s == 5.0
    assert cache.import_file(out, replace=True) == {"inserted": 0, "skipped": 0, "replaced": 2}
    assert cache.get_unit(FP, 2, 4)[128] == profile(128)


def _exported_csv(tmp_path, cache) -> pd.DataFrame:
    put(cache)
    cache.export(tmp_path / "good.csv")
    return pd.read_csv(tmp_path / "good.csv", dtype=str, keep_default_na=False)


@pytest.mark.parametrize("column, value, problem", [
    ("ttft_s", "-0.5", "negative"),
    ("tbt_s", "nan", "NaN"),
    ("t1_s", "", "not a number"),
    ("l1", "abc", "not an integer"),
    ("tp", "2.5", "not an integer"),
    ("raw_t2", "[0.1, -2]", "negative"),
    ("simulated", "maybe", "0/1"),
    ("resume_idle", "[[0.001, 0.002], [0.001, 0.004]]", "the idle seconds must increase"),
    ("resume_idle", "[[-0.001, 0.002]]", "negative"),
    ("resume_idle", "[0.001, 0.002]", "not an [idle seconds, seconds] pair"),
    ("resume_busy", "[[0.02, 0.002], [0.01, 0.004]]", "the pass seconds must increase"),
    ("resume_busy", "[[0.01, \"x\"]]", "not a number"),
    ("prefill_tail", "[-0.001, 0.002, 0.001]", "the quantiles must not decrease"),
    ("prefill_tail", "[-0.001, \"x\"]", "not a number"),
    ("prefill_tail", "[-0.001, NaN]", "not finite"),
    ("prefill_tail", "[-Infinity, 0.001]", "not finite"),
    ("prefill_tail", "[0.001]", "at least 2"),
    ("prefill_tail", "{\"p50\": 0.0}", "not a JSON list"),
    ("prefill_tail", json.dumps([0.0] * 1002), "at most 1001"),
    ("prefill_tail_median_s", "-0.006", "negative"),
    ("decode_pace", "[-1.0, 0.2]", "over -1"),
    ("decode_pace", "[0.1, -0.1]", "the quantiles must not decrease"),
    ("decode_pace_window_s", "-0.08", "negative"),
    ("decode_pace_tau_s", "inf", "not finite"),
    ("host_costs_method", "-1", "below the minimum 0"),
    ("host_costs_method", "1.5", "not an integer"),
])
def test_import_bad_value_names_row_and_column(tmp_path, cache, column, value, problem):
    df = _exported_csv(tmp_path, cache)
    df.loc[1, column] = value
    bad = tmp_path / "bad.csv"
    df.to_csv(bad, index=False)
    with ProfileCache.open(tmp_path / "fresh.sqlite") as fresh:
        with pytest.raises(UserError) as err:
            fresh.import_file(bad)
        msg = str(err.value)
        assert str(bad) in msg and "row 2" in msg and repr(column) in msg and problem in msg
        assert fresh.frame().empty  # nothing written, not even the good first row


@pytest.mark.parametrize("change, words", [
    (lambda df: df.drop(columns=["tbt_s"]), "missing columns ['tbt_s']"),
    (lambda df: df.assign(extra=1), "unexpected columns ['extra']"),
])
def test_import_bad_columns(tmp_path, cache, change, words):
    df = change(_exported_csv(tmp_path, cache))
    bad = tmp_path / "bad.csv"
    df.to_csv(bad, index=False)
    with pytest.raises(UserError, match=__import__("re").escape(words)):
        cache.import_file(bad)


def test_import_bad_parquet(tmp_path, cache):
    put(cache)
    df = cache.frame()
    df.loc[2, "spread"] = float("nan")
    bad = tmp_path / "bad.parquet"
    df.to_parquet(bad, engine="pyarrow", index=False)
    with pytest.raises(UserError, match=r"row 3, column 'spread': missing value"):  # pandas wrote a null
        cache.import_file(bad)
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)  # NaN kept as a float NaN
    table = table.set_column(table.column_names.index("spread"), "spread",
                             pa.array([0.1, 0.2, float("nan")], type=pa.float64()))
    pq.write_table(table, bad)
    with pytest.raises(UserError, match=r"row 3, column 'spread': NaN"):
        cache.import_file(bad)
    df = cache.frame().astype({"tp": "float64"})
    df.to_parquet(bad, engine="pyarrow", index=False)
    with pytest.raises(UserError, match=r"column 'tp' has type double"):
        cache.import_file(bad)


def test_import_duplicate_key(tmp_path, cache):
    df = _exported_csv(tmp_path, cache)
    bad = tmp_path / "dup.csv"
    pd.concat([df, df.iloc[[0]]]).to_csv(bad, index=False)
    cache.remove()
    with pytest.raises(UserError, match="row 4 repeats the key"):
        cache.import_file(bad)
    assert cache.frame().empty


@pytest.mark.parametrize("name", ["x.json", "x", "x.csv.gz"])
def test_unknown_formats(tmp_path, cache, name):
    with pytest.raises(UserError, match=r"\.csv, \.parquet"):
        cache.export(tmp_path / name)
    (tmp_path / name).write_text("a,b\n")
    with pytest.raises(UserError, match=r"\.csv, \.parquet"):
        cache.import_file(tmp_path / name)
