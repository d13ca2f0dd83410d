import dataclasses

import numpy as np
import pytest

from lens.buckets import auto_buckets, bucket_ranges, select, select_index, validate_buckets
from lens.compose import UnitTable, predict
from lens.errors import MissingProfiles, UserError
from lens.metrics import summarize_prediction
from lens.types import BucketProfile, Candidate, Requests

BUCKETS = (4, 8, 16)


def prof(b, ttft, tbt):
    return BucketProfile(bucket=b, ttft_s=ttft, tbt_s=tbt, input_len=1, l1=1, l2=2, t1_s=0, t2_s=0, repeats=1, spread=0)


PROFILES = {4: prof(4, 1.0, 0.1), 8: prof(8, 2.0, 0.2), 16: prof(16, 4.0, 0.4)}


def table(batch=1, policy="exclusive", buckets=BUCKETS, tkg=None, prefill="sequential", row_s=0.0, kv=0.0,
          row_context=0.0):
    cand = Candidate(tp=1, batch=batch, ctx_buckets=buckets, tkg_buckets=tkg or buckets)
    profiles = {b: dataclasses.replace(p, row_s=row_s, kv_token_s=kv, row_context=row_context)
                for b, p in PROFILES.items()}
    return UnitTable.build(cand, profiles, policy=policy, prefill=prefill)


# -- bucket selection -------------------------------------------------------------------

def test_exclusive_selection_at_and_past_boundaries():
    assert [select(n, BUCKETS, "exclusive") for n in (1, 3, 4, 7, 8, 15, 16)] == [4, 4, 8, 8, 16, 16, 16]
    assert select_index([17], BUCKETS, "exclusive")[0] == -1


def test_inclusive_selection_at_and_past_boundaries():
    assert [select(n, BUCKETS, "inclusive") for n in (1, 4, 5, 8, 9, 16)] == [4, 4, 8, 8, 16, 16]
    assert select_index([17, 0], BUCKETS, "inclusive").tolist() == [-1, -1]


def test_ranges_cover_every_length_once():
    for policy in ("exclusive", "inclusive"):
        lo, hi = bucket_ranges(BUCKETS, policy)
        covered = np.concatenate([np.arange(a, b + 1) for a, b in zip(lo, hi)])
        assert covered.tolist() == list(range(1, 17))
        for k, (a, b) in enumerate(zip(lo, hi)):
            assert set(select_index(np.arange(a, b + 1), BUCKETS, policy)) == {k}


def test_auto_buckets_nxd_rule():
    assert auto_buckets(1000) == (128, 256, 512, 1000)
    assert auto_buckets(1024) == (128, 256, 512, 1024)
    assert auto_buckets(100) == (100,)


@pytest.mark.parametrize("bad", [(), (8, 4), (4, 4), (0, 4), (-1,), (4.5,)])
def test_bad_buckets(bad):
    with pytest.raises(UserError):
        validate_buckets(bad)


# -- single request, hand-computed --------------------------------------------------------

def one(lin, lout, policy="exclusive"):
    p = predict(table(policy=policy), Requests([lin], [lout]))
    return p.ttft_s[0], p.e2e_s[0]


def test_single_request_inside_one_bucket():
    # prompt 2 -> bucket 4 (TTFT 1.0); decode contexts 3 -> bucket 4: one step of 0.1
    assert one(2, 2) == pytest.approx((1.0, 1.1))


def test_single_request_crossing_boundary_exclusive():
    # prompt 3 in 4; contexts 4,5,6 -> exclusive: 4 runs in bucket 8 -> 3 * 0.2
    assert one(3, 4) == pytest.approx((1.0, 1.6))


def test_single_request_crossing_boundary_inclusive():
    # contexts 4 -> bucket 4 (0.1), 5,6 -> bucket 8 (0.2 each)
    assert one(3, 4, "inclusive") == pytest.approx((1.0, 1.5))


def test_prompt_exactly_at_boundary():
    # exclusive: 4 runs in bucket 8; inclusive: in bucket 4
    assert one(4, 1)[0] == pytest.approx(2.0)
    assert one(4, 1, "inclusive")[0] == pytest.approx(1.0)
    # the largest bucket also takes l == b under exclusive
    assert one(16, 1)[0] == pytest.approx(4.0)


def test_too_long_request_is_a_user_error():
    with pytest.raises(UserError, match="request 0"):
        one(10, 8)  # last context 17 > 16
    with pytest.raises(UserError):
        one(0, 3)


# -- static batch ------------------------------------------------------------------------

def test_static_batch_hand_computed():
    # batch of 2: A (2 in, 3 out), B (6 in, 2 out), exclusive
    # prefill: A in 4 -> 1.0; B in 8 -> 2.0 -> TTFT A=1.0, B=3.0, prefill total 3.0
    # decode t=1: active A,B: max ctx = 6+1=7 -> bucket 8: 0.2.  B ends (E2E 3.2)
    # t=2: active A only: ctx 2+2=4 -> bucket 8 (exclusive): 0.2 -> A E2E 3.4
    p = predict(table(batch=2), Requests([2, 6], [3, 2]))
    assert p.ttft_s == pytest.approx([1.0, 3.0])
    assert p.e2e_s == pytest.approx([3.4, 3.2])
    assert p.batch_s == pytest.approx([3.4])
    assert p.tpot_s == pytest.approx([(3.4 - 1.0) / 2, 0.2])


def test_static_batch_splits_into_batches_and_pads():
    p = predict(table(batch=2), Requests([2, 2, 2], [2, 2, 2]))
    # batches: [r0, r1], [r2 + padding]
    assert p.ttft_s == pytest.approx([1.0, 2.0, 1.0])
    assert p.e2e_s == pytest.approx([2.1, 2.1, 1.1])
    assert p.batch_s == pytest.approx([2.1, 1.1])


def test_a_static_step_costs_less_by_the_host_work_of_rows_no_longer_generating():
    # the batch above with a host cost of 0.05 s per live row per step (counted in TBT_b for both rows):
    # t=2 has A alone, 0.2 - 0.05; B's steps are unchanged
    p = predict(table(batch=2, row_s=0.05), Requests([2, 6], [3, 2]))
    assert p.e2e_s == pytest.approx([3.35, 3.2]) and p.batch_s == pytest.approx([3.35])
    # a short last batch: its padding row never generates (r2's one step in bucket 4: 0.1 - 0.05)
    p = predict(table(batch=2, row_s=0.05), Requests([2, 2, 2], [2, 2, 2]))
    assert p.e2e_s == pytest.approx([2.1, 2.1, 1.05])
    assert table(batch=2, row_s=0.05).row_s == 0.05 and table(batch=2).row_s == 0.0


def test_ragged_batch_hand_computed():
    # same batch as the static case: each request pays its own bucket / B
    # A: contexts 3 (b4: .1), 4 (b8: .2); B: context 7 (b8: .2)
    # t=1 costs (.1 + .2)/2 = .15 ; t=2 costs .2/2 = .1
    p = predict(table(batch=2), Requests([2, 6], [3, 2]), mode="ragged")
    assert p.e2e_s == pytest.approx([3.0 + 0.25, 3.0 + 0.15])


def test_one_token_request_ends_at_its_first_token():
    p = predict(table(batch=2), Requests([2, 2], [1, 3]))
    assert p.e2e_s == pytest.approx([1.0, 2.0 + 0.1 + 0.2])  # contexts 3 (bucket 4), 4 (bucket 8)


# -- batched prefill: one call per batch, in the bucket of its longest prompt ----------------

def test_batched_prefill_hand_computed():
    # the static case above, prompts in one call: longest prompt 6 -> bucket 8 -> 2.0 for both
    # decode t=1: max ctx 7 -> bucket 8: 0.2 (B ends at 2.2); t=2: A ctx 4 -> bucket 8: 0.2 (A at 2.4)
    p = predict(table(batch=2, prefill="batched"), Requests([2, 6], [3, 2]))
    assert p.ttft_s == pytest.approx([2.0, 2.0])
    assert p.e2e_s == pytest.approx([2.4, 2.2])
    assert p.batch_s == pytest.approx([2.4])
    assert p.tpot_s == pytest.approx([0.2, 0.2])


def test_batched_prefill_short_last_batch_runs_the_whole_shape():
    # batches [r0, r1] and [r2 + a padding row]: each one call in bucket 4 (1.0), decode ctx 3 (0.1);
    # the padding row costs nothing extra (TTFT_4 is already the call of the whole compiled batch)
    p = predict(table(batch=2, prefill="batched"), Requests([2, 2, 2], [2, 2, 2]))
    assert p.ttft_s == pytest.approx([1.0, 1.0, 1.0])
    assert p.e2e_s == pytest.approx([1.1, 1.1, 1.1])
    assert p.batch_s == pytest.approx([1.1, 1.1])
    # the calls compute 2 batches x 2 rows x 4 tokens for 6 real ones; sequential pads only
    # each real prompt to its bucket (3 x 4 slots)
    assert p.prefill_padding == pytest.approx(1 - 6 / 16)
    assert predict(table(batch=2), Requests([2, 2, 2], [2, 2, 2])).prefill_padding == pytest.approx(1 - 6 / 12)


def test_batched_prefill_one_token_request_and_ragged_decode():
    # one call in bucket 8 (longest prompt 6): 2.0; r0 ends at its first token, r1 decodes
    # contexts 7 (bucket 8: 0.2) and 8 (exclusive -> bucket 16: 0.4)
    p = predict(table(batch=2, prefill="batched"), Requests([2, 6], [1, 3]))
    assert p.e2e_s == pytest.approx([2.0, 2.6])
    # ragged decode after one call: the static-case batch, each request paying its own bucket / B
    p = predict(table(batch=2, prefill="batched"), Requests([2, 6], [3, 2]), mode="ragged")
    assert p.e2e_s == pytest.approx([2.0 + 0.25, 2.0 + 0.15])


def test_batched_prefill_bucket_follows_the_longest_prompt_under_each_policy():
    # prompts 4 and 1: exclusive runs 4 in bucket 8 (2.0), inclusive in bucket 4 (1.0)
    req = Requests([1, 4], [1, 1])
    assert predict(table(batch=2, prefill="batched"), req).ttft_s == pytest.approx([2.0, 2.0])
    assert predict(table(batch=2, policy="inclusive", prefill="batched"), req).ttft_s == pytest.approx([1.0, 1.0])


def test_unknown_prefill_is_a_user_error():
    with pytest.raises(UserError, match="prefill"):
        table(prefill="chunked")


def test_separate_ctx_and_tkg_sets():
    t = table(batch=1, buckets=(8, 16), tkg=(16,))
    p = predict(t, Requests([2], [3]))
    assert p.e2e_s == pytest.approx([2.0 + 2 * 0.4])


def test_missing_profiles_are_reported():
    cand = Candidate(tp=1, batch=1, ctx_buckets=(4, 32), tkg_buckets=(4, 32))
    with pytest.raises(MissingProfiles) as e:
        UnitTable.build(cand, PROFILES, policy="exclusive")
    assert e.value.missing == {(1, 1): [32]}


# -- against a step-by-step reference ------------------------------------------------------

def reference(tbl_profiles, buckets, policy, batch, lin, lout, mode, prefill="sequential", row_s=0.0, kv=0.0,
              row_context=0.0):
    """Naive step-by-step composition, the definition written as loops (``row_s``, ``kv``: static only).

    ``kv``: a paged kernel's seconds per KV token a row holds (lens.context_cost): a step costs TBT_b less
    the probes' B rows' reads at their mean context, less the host's part of the row cost for each free row,
    plus what every request of the batch reads at its context (finished ones ride along, growing).
    """
    host = max(row_s - kv * row_context, 0.0)
    e2e, ttft = [], []
    for s in range(0, len(lin), batch):
        L, O = lin[s:s + batch], lout[s:s + batch]
        t = 0.0
        tt = []
        if prefill == "batched":  # one call in the bucket of the longest prompt, all first tokens at its end
            t = tbl_profiles[select(max(L), buckets, policy)].ttft_s
            tt = [t] * len(L)
        for l in L if prefill == "sequential" else ():
            t += tbl_profiles[select(l, buckets, policy)].ttft_s
            tt.append(t)
        done = [None] * len(L)
        for i, o in enumerate(O):
            if o == 1:
                done[i] = tt[i]  # a one-token request ends at its own first token
        step = 1
        while any(d is None for d in done):
            active = [i for i in range(len(L)) if O[i] - 1 >= step]
            if mode == "static":
                c = max(L[i] + step for i in active)
                p = tbl_profiles[select(c, buckets, policy)]
                probes_read = batch * kv * (p.input_len + (p.l1 + p.l2 - 1) / 2)
                # every request of the batch reads its KV, a finished one riding along as padding
                t += p.tbt_s - probes_read - (batch - len(active)) * host + kv * sum(l + step for l in L)
            else:
                t += sum(tbl_profiles[select(L[i] + step, buckets, policy)].tbt_s for i in active) / batch
            for i in active:
                if O[i] - 1 == step:
                    done[i] = t
            step += 1
        ttft += tt
        e2e += done
    return np.array(ttft), np.array(e2e)


@pytest.mark.parametrize("prefill", ["sequential", "batched"])
@pytest.mark.parametrize("mode", ["static", "ragged"])
@pytest.mark.parametrize("policy", ["exclusive", "inclusive"])
@pytest.mark.parametrize("batch", [1, 3, 4])
@pytest.mark.parametrize("row_s", [0.0, 0.01])
@pytest.mark.parametrize("kv", [0.0, 0.002])
def test_vectorised_matches_step_by_step(mode, policy, batch, prefill, row_s, kv):
    rng = np.random.default_rng(batch)
    n = 23
    lin = rng.integers(1, 12, n)
    lout = np.array([rng.integers(1, 16 - l + 2) for l in lin])
    lout = np.minimum(lout, 16 - lin + 1)
    static = mode == "static"
    profiles = {b: dataclasses.replace(p, row_s=row_s, kv_token_s=kv, row_context=3.0) for b, p in PROFILES.items()}
    ref_ttft, ref_e2e = reference(profiles, BUCKETS, policy, batch, lin.tolist(), lout.tolist(), mode, prefill,
                                  row_s if static else 0.0, kv if static else 0.0, 3.0)
    p = predict(table(batch=batch, policy=policy, prefill=prefill, row_s=row_s, kv=kv, row_context=3.0),
                Requests(lin, lout), mode=mode)  # ragged charges each row its own share: neither applies
    assert p.ttft_s == pytest.approx(ref_ttft)
    assert p.e2e_s == pytest.approx(ref_e2e)


def test_metrics_summary():
    req = Requests([2, 6], [3, 2])
    p = predict(table(batch=2), req)
    m = summarize_prediction(req, p, chips=2)
    assert m["throughput_tok_s"] == pytest.approx(5 / 3.4)
    assert m["throughput_tok_s_per_chip"] == pytest.approx(5 / 3.4 / 2)
    assert m["e2e_p50_s"] == pytest.approx(3.3)
    assert 0 < m["prefill_padding"] < 1


def test_ten_thousand_requests_vectorised():
    rng = np.random.default_rng(0)
    lin = rng.integers(1, 9, 10_000)
    lout = rng.integers(1, 8, 10_000)
    p = predict(table(batch=8), Requests(lin, lout))
    assert p.e2e_s.shape == (10_000,)
    assert np.all(p.e2e_s >= p.ttft_s)


def test_used_buckets_are_the_prompts_buckets_and_the_decode_contexts_ranges():
    from lens.buckets import decode_contexts, used_buckets

    ins, outs = [10, 70], [5, 1]  # decode contexts 11..14 (the second request emits one token: no decode)
    ctx = decode_contexts(ins, outs)
    assert ctx == (11, 14)
    assert used_buckets((64, 128, 256), (64, 128, 256), ins, policy="inclusive", contexts=ctx) == {64, 128}
    assert used_buckets((64, 128, 256), (32, 64, 128), ins, policy="exclusive", contexts=ctx) == {32, 64, 128}
    assert decode_contexts([5], [1]) is None
    assert used_buckets((64, 128), (64, 128), [5], policy="inclusive", contexts=None) == {64}
