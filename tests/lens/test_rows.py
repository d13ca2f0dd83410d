"""The host's cost per live row (lens.rows): the measurement's workload and its solve, by hand."""
import numpy as np
import pytest

from lens import rows
from lens.types import BucketProfile


def prof(l2=64, tbt=0.01, bucket=128):
    return BucketProfile(bucket=bucket, ttft_s=0.02, tbt_s=tbt, input_len=60, l1=2, l2=l2, t1_s=0, t2_s=0,
                         repeats=3, spread=0)


def test_the_workload_alternates_a_full_and_a_one_row_batch():
    w = rows.workload(prof(), batch=4, pairs=3)
    assert len(w) == 24 and (w.input_len == 60).all()
    out = w.output_len.reshape(-1, 4)
    assert (out[0::2] == rows.STEPS + 1).all()  # full: every row decodes STEPS steps
    assert (out[1::2, 0] == rows.STEPS + 1).all() and (out[1::2, 1:] == 1).all()  # one row: only row 0
    # a bucket whose window is shorter than STEPS decodes what it holds
    assert rows.steps_for(prof(l2=5)) == 4 and rows.workload(prof(l2=5), 2, 1).output_len.max() == 5


def test_decode_times_are_each_batch_s_last_token_after_its_last_first_token():
    ttft = np.array([1.0, 2.0, 1.5, 2.5])
    e2e = np.array([3.0, 4.0, 1.5, 3.5])  # batch 2: full (decode 4 - 2), one row (3.5 - 2.5)
    full, one = rows.decode_times(ttft, e2e, batch=2)
    assert full.tolist() == [2.0] and one.tolist() == [1.0]


def decode(batch, row_s, pairs, base=0.01, rng=None, jitter=0.0):
    s = rows.STEPS
    full = np.full(pairs, s * (base + batch * row_s))
    one = np.full(pairs, s * (base + row_s))
    if rng is not None:
        full = full * rng.lognormal(0, jitter, pairs)
        one = one * rng.lognormal(0, jitter, pairs)
    return full, one


def test_a_row_cost_is_recovered_exactly_from_clean_runs():
    full, one = decode(16, 2e-5, rows.PAIRS)
    got = rows.solve(full, one, p=prof(), batch=16)
    assert got.value == pytest.approx(2e-5, rel=1e-9) and got.note == "" and got.err == pytest.approx(0, abs=1e-12)


def test_stragglers_on_a_few_pairs_do_not_move_it():
    full, one = decode(32, 2e-5, rows.PAIRS)
    full[[0, 5]] += 4 * 0.01  # a 4x decode call in two full batches
    one[[3, 9, 17]] += 3 * 0.01  # and in three one-row batches
    got = rows.solve(full, one, p=prof(), batch=32)
    assert got.value == pytest.approx(2e-5, rel=1e-6)


def test_a_cost_within_its_noise_counts_as_none():
    full, one = decode(4, 2e-6, rows.PAIRS, rng=np.random.default_rng(0), jitter=0.05)
    got = rows.solve(full, one, p=prof(), batch=4)
    assert got.value == 0.0 and got.err > 0 and "standard errors" in got.note
    assert got.raw != 0.0  # what was measured is kept beside what is counted


def test_a_cost_larger_than_half_the_step_over_the_batch_is_capped():
    full, one = decode(8, 1e-3, rows.PAIRS)  # 8 rows of 1 ms: far over a 10 ms step
    got = rows.solve(full, one, p=prof(tbt=0.01), batch=8)
    assert got.value == pytest.approx(rows.MAX_SHARE * 0.01 / 8) and got.raw == pytest.approx(1e-3)
    assert "capped" in got.note


def test_a_batch_of_one_has_no_row_to_spare():
    got = rows.solve([1.0], [1.0], p=prof(), batch=1)
    assert got.value == 0.0 and "no row" in got.note
