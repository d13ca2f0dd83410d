"""Continuous batching (lens.serving) against traces worked out by hand and a step-by-step reference."""
import math

import numpy as np
import pytest

from lens.buckets import select
from lens.errors import UserError
from lens.serving import Scheduler, predict_serving
from lens.types import Requests

from servingkit import REF, TBT, TTFT, busy, table  # tests/lens is on sys.path (pytest rootdir imports)


def run(batch, lin, lout, arr, prefill="sequential", **sched):
    return predict_serving(table(batch, prefill=prefill), Requests(lin, lout, np.asarray(arr, float)),
                           scheduler=Scheduler(**sched))


def close(a, b):
    np.testing.assert_allclose(np.asarray(a, float), np.asarray(b, float), rtol=0, atol=1e-12)


def test_queueing_and_slot_reuse_by_hand():
    # B = 2. t=0: r0 prefills (1.0) -> t=1; r1 arrived at 0.05, prefills -> t=2 (slots full).
    # step 1: contexts 4, 6 -> bucket 8, 0.1 -> t=2.1; r1 (one step) ends, its slot frees.
    # r2 (arrived 0.1) takes that slot: prefill -> t=3.1. step 2: contexts r0 5, r2 3 -> 3.2, r0 ends.
    # steps 3, 4 (r2 contexts 4, 5) -> 3.3, 3.4: r2 ends.
    p = run(2, [3, 5, 2], [3, 2, 4], [0.0, 0.05, 0.1])
    close(p.admit_s, [0.0, 1.0, 2.1])
    close(p.first_s, [1.0, 2.0, 3.1])
    close(p.finish_s, [3.2, 2.1, 3.4])
    close(p.ttft_s, [1.0, 1.95, 3.0])
    close(p.queue_s, [0.0, 0.95, 2.0])
    close(p.e2e_s, [3.2, 2.05, 3.3])
    close(p.tpot_s, [1.1, 0.1, 0.1])
    assert p.decode_steps == 4
    close([p.total_s], [3.4])
    close([p.busy_s], [3.4])


def test_bucket_follows_the_longest_live_context():
    # r0 (6 in, 4 out): decode contexts 7, 8, 9; r1 (1 in, 3 out): 2, 3.
    # step 1: max 7 -> bucket 8 (0.1); step 2: max 8 -> bucket 16 (0.3), r1 ends riding in 16;
    # step 3: r0 alone at 9 -> 0.3.
    p = run(2, [6, 1], [4, 3], [0.0, 0.0])
    close(p.first_s, [1.0, 2.0])
    close(p.finish_s, [2.7, 2.4])
    # once the long request leaves, the bucket drops back: r1 (1 in, 5 out) alone after r0 ends
    p = run(2, [7, 1], [2, 5], [0.0, 0.0])  # step 1: max(8, 2) -> 16; steps 2-4: r1 at 3, 4, 5 -> 8
    close(p.finish_s, [2.3, 2.6])


def test_idle_device_waits_for_the_next_arrival():
    p = run(1, [2, 2], [2, 1], [0.0, 10.0])
    close(p.finish_s, [1.1, 11.0])
    close(p.ttft_s, [1.0, 1.0])
    close(p.e2e_s, [1.1, 1.0])
    assert math.isnan(p.tpot_s[1])


def test_one_slot_serves_in_arrival_order_and_reuses_the_slot():
    # arrivals given out of order: FIFO follows arrival time, ties keep the workload's order
    p = run(1, [2, 2, 2], [2, 2, 2], [0.5, 0.0, 0.5])
    close(p.admit_s, [1.1, 0.0, 2.2])
    close(p.finish_s, [2.2, 1.1, 3.3])


def test_one_token_request_frees_its_slot_at_once():
    # B = 1: r0 (one token) ends at its first token; r1 takes the slot in the same admission
    p = run(1, [2, 2], [1, 3], [0.0, 0.0])
    close(p.first_s, [1.0, 2.0])
    close(p.finish_s, [1.0, 2.2])


def test_max_prefills_caps_the_prompts_between_two_decode_steps():
    # cap 1: r0 prefills, one decode step, then r1 prefills
    p = run(2, [3, 3], [3, 3], [0.0, 0.0], max_prefills=1)
    close(p.first_s, [1.0, 2.1])
    close(p.finish_s, [2.2, 2.3])
    # no cap: both prefill before the first step
    p = run(2, [3, 3], [3, 3], [0.0, 0.0])
    close(p.first_s, [1.0, 2.0])
    close(p.finish_s, [2.2, 2.2])


def test_prefill_priority_decides_arrivals_during_prefills():
    # r1 arrives at 0.5, during r0's prefill (0 -> 1)
    eager = run(2, [3, 3], [2, 2], [0.0, 0.5])
    close(eager.first_s, [1.0, 2.0])
    close(eager.finish_s, [2.1, 2.1])
    lazy = run(2, [3, 3], [2, 2], [0.0, 0.5], prefill_priority="decode")
    close(lazy.first_s, [1.0, 2.1])
    close(lazy.finish_s, [1.1, 2.2])


def test_padding_fractions():
    # prompt 3 in bucket 8; decode: one step of a 1-slot batch at bucket 8 holds context 4
    p = run(1, [3], [2], [0.0])
    close([p.prefill_padding, p.decode_padding], [1 - 3 / 8, 1 - 4 / 8])


# -- batched prefill: the requests waiting when an iteration begins share one call -------------

def test_batched_admission_by_hand():
    # B = 2. t=0: only r0 waits: one call in bucket 8 (1.0). Step 1 (context 4, 0.1) -> 1.1.
    # r1 (arrived 0.05) gets the free slot: its own call (prompt 5, bucket 8) -> 2.1; r2 waits (no slot).
    # step 2: contexts r0 5, r1 6 -> 0.1 -> 2.2, both end. r2: call -> 3.2, steps 3, 4, 5 -> 3.5.
    p = run(2, [3, 5, 2], [3, 2, 4], [0.0, 0.05, 0.1], prefill="batched")
    close(p.admit_s, [0.0, 1.1, 2.2])
    close(p.first_s, [1.0, 2.1, 3.2])
    close(p.finish_s, [2.2, 2.2, 3.5])


def test_batched_admission_shares_one_call_in_the_bucket_of_the_longest_prompt():
    # both wait at 0: one call in bucket 16 (prompt 9): 2.0, both first tokens then;
    # one step at context 10 (bucket 16): 0.3. Sequential: 1.0 then 2.0 more.
    p = run(2, [3, 9], [2, 2], [0.0, 0.0], prefill="batched")
    close(p.first_s, [2.0, 2.0])
    close(p.finish_s, [2.3, 2.3])
    close([p.prefill_padding], [1 - 12 / 32])  # one call of 2 rows x 16 tokens for 12 real ones
    close(run(2, [3, 9], [2, 2], [0.0, 0.0]).first_s, [1.0, 3.0])


def test_batched_admission_takes_only_those_waiting_when_it_begins():
    # r1 arrives during r0's call: it waits for the next iteration even with prefill_priority "prefill"
    p = run(2, [3, 3], [2, 2], [0.0, 0.5], prefill="batched")
    close(p.first_s, [1.0, 2.1])
    close(p.finish_s, [1.1, 2.2])


def test_batched_admission_respects_free_slots_and_max_prefills():
    # B = 3, three waiting, cap 2: one call for r0 and r1, a decode step, then r2's call
    p = run(3, [3, 3, 3], [3, 3, 3], [0.0, 0.0, 0.0], prefill="batched", max_prefills=2)
    close(p.first_s, [1.0, 1.0, 2.1])
    close(p.finish_s, [2.2, 2.2, 2.3])
    # B = 1: a one-token request takes the call's one row; the next waits for its own call
    p = run(1, [2, 2], [1, 3], [0.0, 0.0], prefill="batched")
    close(p.first_s, [1.0, 2.0])
    close(p.finish_s, [1.0, 2.2])


# -- what the server's admissions cost against TTFT_b (lens.admission) ----------------------------------

def test_a_pass_charges_its_first_prompt_and_each_further_one_their_own_offsets():
    # B = 2, +0.3 for a pass's first prompt, -0.1 for each further one. t=0: r0 and r1 wait: r0's prefill
    # 1.0 + 0.3 -> 1.3, r1's 1.0 - 0.1 -> 2.2; a step (contexts 4, 4: 0.1) -> 2.3, both end (l_out 2).
    # r2 arrives at 5 to an idle device: a pass of its own, 1.0 + 0.3 -> 6.3 (TTFT 1.3, not 1.0).
    p = predict_serving(table(2, admit=(0.3, -0.1)), Requests([3, 3, 3], [2, 2, 2], np.array([0.0, 0.0, 5.0])))
    close(p.first_s, [1.3, 2.2, 6.3])
    close(p.finish_s, [2.3, 2.3, 6.4])
    close(p.ttft_s, [1.3, 2.2, 1.3])
    # batched: one call whatever it holds, charged the first offset once
    p = predict_serving(table(2, prefill="batched", admit=(0.3, -0.1)), Requests([3, 3], [2, 2], np.zeros(2)))
    close(p.first_s, [1.3, 1.3])
    # none measured (a cache from before the measurement): TTFT_b as it is
    close(run(2, [3, 3, 3], [2, 2, 2], [0.0, 0.0, 5.0]).first_s, [1.0, 2.0, 6.0])


def test_a_pass_that_stops_a_running_decode_charges_its_first_prompt_the_busy_offset():
    # B = 2, +0.3 after an idle spell, +0.05 during a decode. r0 (3 in, 4 out) at 0 finds the device idle:
    # 1.0 + 0.3 -> 1.3; steps 0.1 each. r1 (3 in, 2 out) arrives at 1.35: the step under way ends at 1.4, the
    # pass stops the decode: 1.0 + 0.05 -> 2.45; one step for both -> 2.55 (r1 ends), r0's last -> 2.65.
    # r2 arrives at 9 to an idle device again: +0.3 (TTFT 1.3).
    p = predict_serving(table(2, admit=(0.3, 0.0, 0.05)), Requests([3, 3, 3], [4, 2, 2], np.array([0.0, 1.35, 9.0])))
    close(p.first_s, [1.3, 2.45, 10.3])
    close(p.finish_s, [2.65, 2.55, 10.4])
    # a request waiting when the last live one ends is not an idle spell: r1 (at 0.5) waits for r0's slot (B = 1)
    p = predict_serving(table(1, admit=(0.3, 0.0, 0.05)), Requests([3, 3], [2, 2], np.array([0.0, 0.5])))
    close(p.first_s, [1.3, 1.4 + 1.05])
    # batched: the call is charged the offset of its pass
    p = predict_serving(table(2, prefill="batched", admit=(0.3, 0.0, 0.05)),
                        Requests([3, 3], [4, 2], np.array([0.0, 1.35])))
    close(p.first_s, [1.3, 2.45])


# -- what resuming the decode after a pass costs (lens.resume) ------------------------------------------------

def test_each_pass_that_stops_the_decode_makes_its_next_decode_run_pay_the_resume_cost():
    # B = 2, resume 0.5. r0 (3 in, 3 out) at 0: prefill 1.0 -> 1.0; the decode resumes: 0.5 + a step (0.1) ->
    # 1.6. r1 (3 in, 2 out) arrives at 1.55, admitted at 1.6: prefill -> 2.6; the run after it pays 0.5 again:
    # one step for both (contexts 5 and 4, bucket 8) -> 3.2, r0 (its 2nd step) and r1 (its 1st) end there.
    p = predict_serving(table(2, resume=0.5), Requests([3, 3], [3, 2], np.array([0.0, 1.55])))
    close(p.first_s, [1.0, 2.6])
    close(p.finish_s, [3.2, 3.2])
    # a one-token request decodes nothing: no resume after its pass
    close(predict_serving(table(2, resume=0.5), Requests([3], [1], np.zeros(1))).finish_s, [1.0])
    # none measured: the steps alone (r0 ends at 1.2, before r1 arrives; r1 at 1.55 + 1.0 + 0.1)
    close(run(2, [3, 3], [3, 2], [0.0, 1.55]).finish_s, [1.2, 2.65])


def test_the_resume_cost_follows_the_idle_spell_before_the_pass():
    # resume 0.5 after a long wait, 0.1 after 0.2 s or less, linear between 0.2 and 1.0 s. r0 (3 in, 3 out) at 0
    # (a run starts idle: the longest spell's 0.5): prefill -> 1.0; 0.5 + 2 steps (0.1) -> 1.7
    by_idle = ((0.2, 0.1), (1.0, 0.5))
    p = predict_serving(table(2, resume=0.5, by_idle=by_idle), Requests([3, 3], [3, 3], np.array([0.0, 2.3])))
    # r1 arrives 0.6 s after r0 ended: 0.1 + (0.6 - 0.2) / 0.8 x 0.4 = 0.3; prefill -> 3.3, 0.3 + 2 steps -> 3.8
    close(p.finish_s, [1.7, 3.8])
    # r1 arriving while r0 decodes: a busy pass pays the shortest spell's 0.1. r0's first run (0.5 + a step)
    # ends at 1.6 (r1 arrived at 1.05); r1's prefill -> 2.6; 0.1 + a step for both (contexts 5 and 4) -> 2.8
    p = predict_serving(table(2, resume=0.5, by_idle=by_idle), Requests([3, 3], [3, 2], np.array([0.0, 1.05])))
    close(p.first_s, [1.0, 2.6])
    close(p.finish_s, [2.8, 2.8])
    # without the spells: 0.5 after any pass (r0's run 1.0 + 0.5 + 0.1, r1's prefill -> 2.6, 0.5 + a step)
    p = predict_serving(table(2, resume=0.5), Requests([3, 3], [3, 2], np.array([0.0, 1.05])))
    close(p.finish_s, [3.2, 3.2])


def test_a_busy_pass_pays_the_resume_cost_of_its_largest_prefill():
    # by pass seconds: 0.2 after a 1.0 s prefill, 0.6 after a 2.0 s one; by idle spell as above. r0 (3 in, 3 out)
    # at 0 finds the device idle: prefill -> 1.0, the larger of the spell's 0.5 and the prefill's 0.2 + a step ->
    # 1.6. r1 (10 in: bucket 16, prefill 2.0; 2 out) arrived at 1.05 and stops the decode: -> 3.6; its prefill's
    # 0.6 + a step for both (longest context 11: bucket 16, 0.3) -> 4.5
    by_idle, by_pass = ((0.2, 0.1), (1.0, 0.5)), ((1.0, 0.2), (2.0, 0.6))
    req = Requests([3, 10], [3, 2], np.array([0.0, 1.05]))
    p = predict_serving(table(2, resume=0.5, by_idle=by_idle, by_pass=by_pass), req)
    close(p.first_s, [1.0, 3.6])
    close(p.finish_s, [4.5, 4.5])
    # without it, the shortest spell's 0.1 whatever the prefill
    close(predict_serving(table(2, resume=0.5, by_idle=by_idle), req).finish_s, [4.0, 4.0])
    # a cold device and a small prefill: the spell's cost is the larger (r0 alone: 1.0 + 0.5 + 2 steps)
    close(predict_serving(table(2, resume=0.5, by_idle=by_idle, by_pass=by_pass),
                          Requests([3], [3], np.zeros(1))).finish_s, [1.7])


def reference(batch, lin, lout, arr, *, cap=0, eager=True, policy="exclusive", prefill="sequential", row_s=0.0,
              admit=(0.0, 0.0), kv=0.0, row_context=0.0, resume=0.0, by_idle=(), by_pass=()):
    """The machine of docs/serving.md stepped one decode iteration at a time (no jumps); a free slot
    saves ``row_s`` of every step; a pass's first prompt costs ``admit[0]`` more after the device idled (a run
    starts idle) and ``admit[2]`` (``admit[0]`` when not given) otherwise, each further one ``admit[1]``;
    with ``kv`` a step costs TBT less the probes' B rows' reads at context REF, plus each live row's at its own,
    and a free slot saves only the host's part of ``row_s`` (what is left beyond a row's reads at ``row_context``);
    the first step after an iteration that prefilled anything costs ``resume`` more, or with ``by_idle`` what its
    (idle seconds, cost) pairs give, linear between, flat beyond, for the seconds the device waited idle before
    that iteration (0 when it did not; a run starts idle for longer than any); with ``by_pass``, after an iteration
    that did not idle what its (pass seconds, cost) pairs give at its largest prompt's TTFT plus the busy offset,
    and after one that did the larger of that and the spell's."""

    def resume_after(spell):
        if not by_idle:
            return resume
        xs, ys = [x for x, _ in by_idle], [y for _, y in by_idle]
        return float(np.interp(spell, xs, ys))

    def resume_by(spell, largest):
        if not by_pass:
            return resume_after(spell)
        cost = float(np.interp(largest + busy(admit), [x for x, _ in by_pass], [y for _, y in by_pass]))
        return max(resume_after(spell), cost) if spell else cost

    n = len(lin)
    order = sorted(range(n), key=lambda i: (arr[i], i))
    first, finish = [None] * n, [None] * n
    slots = {}  # request -> decode steps done
    t, q, idled, spell = 0.0, 0, True, math.inf
    first_cost = (admit[0], busy(admit))  # after an idle spell, and not
    while any(f is None for f in finish):
        horizon, k = t, 0
        took = []  # batched: the requests waiting now, one row each of one call
        while prefill == "batched" and len(slots) + len(took) < batch and q < n and (cap == 0 or len(took) < cap) \
                and arr[order[q]] <= horizon + 1e-9:
            took.append(order[q])
            q += 1
        largest = 0.0  # the TTFT of the iteration's largest prompt
        if took:
            largest = TTFT[select(max(lin[i] for i in took), (8, 16), policy)]
            t += largest + first_cost[not idled]
            for i in took:
                first[i] = t
                if lout[i] == 1:
                    finish[i] = t
                else:
                    slots[i] = 0
        while prefill == "sequential" and len(slots) < batch and q < n and (cap == 0 or k < cap) \
                and arr[order[q]] <= (t if eager else horizon) + 1e-9:
            i = order[q]
            largest = max(largest, TTFT[select(lin[i], (8, 16), policy)])
            t += TTFT[select(lin[i], (8, 16), policy)] + (admit[1] if k else first_cost[not idled])
            q, k = q + 1, k + 1
            first[i] = t
            if lout[i] == 1:
                finish[i] = t
            else:
                slots[i] = 0
        was_idle = idled
        if took or k:
            idled = False
        if not slots:
            if q < n and arr[order[q]] > t:
                spell = arr[order[q]] - t if q else math.inf
                t, idled = arr[order[q]], True
            continue
        if took or k:
            t += resume_by(spell if was_idle else 0.0, largest)
        longest = max(lin[i] + s + 1 for i, s in slots.items())
        host = max(row_s - kv * row_context, 0.0)
        reads = sum(lin[i] + s + 1 for i, s in slots.items())
        t += TBT[select(longest, (8, 16), policy)] - batch * kv * REF + kv * reads - (batch - len(slots)) * host
        for i in list(slots):
            slots[i] += 1
            if slots[i] == lout[i] - 1:
                finish[i] = t
                del slots[i]
    return np.asarray(first), np.asarray(finish)


@pytest.mark.parametrize("row_s, admit, kv, resume, by_idle, by_pass", [
    (0.0, (0.0, 0.0), 0.0, 0.0, (), ()), (0.02, (0.0, 0.0), 0.0, 0.0, (), ()), (0.0, (0.3, -0.1), 0.0, 0.0, (), ()),
    (0.02, (0.0, 0.0), 0.003, 0.0, (), ()), (0.0, (0.3, -0.1), 0.001, 0.0, (), ()),
    (0.0, (0.0, 0.0), 0.0, 0.25, (), ()), (0.02, (0.3, -0.1), 0.001, 0.07, (), ()),
    (0.0, (0.3, -0.1, -0.2), 0.0, 0.0, (), ()), (0.02, (0.3, 0.1, 0.05), 0.001, 0.07, (), ()),
    # the resume cost by the idle spell before the pass: a busy pass pays the shortest spell's
    (0.0, (0.0, 0.0), 0.0, 0.25, ((0.01, 0.05), (0.3, 0.15), (1.0, 0.25)), ()),
    (0.02, (0.3, 0.1, 0.05), 0.001, 0.07, ((0.05, 0.01), (2.0, 0.07)), ()),
    # and a busy pass by its largest prefill (an idle one: the larger of the two)
    (0.0, (0.0, 0.0), 0.0, 0.25, ((0.01, 0.05), (0.3, 0.15), (1.0, 0.25)), ((1.0, 0.1), (2.0, 0.4))),
    (0.02, (0.3, 0.1, 0.05), 0.001, 0.07, ((0.05, 0.01), (2.0, 0.07)), ((1.05, 0.02), (2.05, 0.05))),
])
@pytest.mark.parametrize("prefill", ["sequential", "batched"])
@pytest.mark.parametrize("seed", range(12))
def test_event_jumps_match_stepping_every_iteration(seed, prefill, row_s, admit, kv, resume, by_idle, by_pass):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    batch = int(rng.integers(1, 5))
    lin = rng.integers(1, 12, n)
    lout = np.minimum(rng.integers(1, 9, n), 17 - lin)
    arr = np.round(np.cumsum(rng.exponential(rng.choice([0.05, 0.5, 3.0]), n)) * rng.integers(0, 2, n), 2)
    cap = int(rng.integers(0, 3))
    eager = bool(rng.integers(0, 2))
    row_context = 4.0 if kv else 0.0
    p = predict_serving(table(batch, prefill=prefill, row_s=row_s, admit=admit, kv=kv, row_context=row_context,
                              resume=resume, by_idle=by_idle, by_pass=by_pass),
                        Requests(lin, lout, arr),
                        scheduler=Scheduler(max_prefills=cap, prefill_priority="prefill" if eager else "decode"))
    first, finish = reference(batch, lin.tolist(), lout.tolist(), arr.tolist(), cap=cap, eager=eager,
                              prefill=prefill, row_s=row_s, admit=admit, kv=kv, row_context=row_context,
                              resume=resume, by_idle=by_idle, by_pass=by_pass)
    np.testing.assert_allclose(p.first_s, first, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(p.finish_s, finish, rtol=1e-9, atol=1e-9)


def test_a_single_slot_with_spaced_arrivals_is_the_single_request_composition():
    from lens.compose import predict

    lin, lout = np.array([3, 9, 5]), np.array([6, 4, 2])
    alone = predict(table(1), Requests(lin, lout))
    p = run(1, lin, lout, [0.0, 100.0, 200.0])
    close(p.ttft_s, alone.ttft_s)
    close(p.e2e_s, alone.e2e_s)


def test_refusals_are_one_line_user_errors():
    t = table(2)
    with pytest.raises(UserError, match="arrival"):
        predict_serving(t, Requests([3], [2]))
    with pytest.raises(UserError, match="arrival"):
        predict_serving(t, Requests([3], [2], np.array([-1.0])))
    with pytest.raises(UserError, match="request 1"):
        predict_serving(t, Requests([3, 17], [2, 2], np.array([0.0, 1.0])))
    with pytest.raises(UserError, match="max_prefills"):
        Scheduler(max_prefills=-1)
    with pytest.raises(UserError, match="prefill_priority"):
        Scheduler(prefill_priority="fifo")


def test_a_slowed_table_serves_a_lone_request_that_much_later_and_a_queue_more():
    """On a host 25% slower every second of a lone request's TTFT and E2E is 25% longer (admission offsets and
    resume costs too); where requests queue, the wait grows by more than that."""
    t = table(2, admit=(0.05, 0.02), resume=0.1, by_idle=((0.0, 0.1), (1.0, 0.2)))
    far = Requests([4, 12], [3, 5], np.array([0.0, 100.0]))
    base, slow = predict_serving(t, far), predict_serving(t.slowed(1.25), far)
    assert slow.first_s - far.arrival_s == pytest.approx(1.25 * (base.first_s - far.arrival_s))
    assert slow.finish_s - far.arrival_s == pytest.approx(1.25 * (base.finish_s - far.arrival_s))
    close_by = Requests([4, 12, 5, 6], [3, 5, 4, 2], np.array([0.0, 0.1, 0.2, 0.3]))
    base, slow = predict_serving(t, close_by), predict_serving(t.slowed(1.25), close_by)
    assert (slow.first_s - close_by.arrival_s)[-1] > 1.25 * (base.first_s - close_by.arrival_s)[-1]
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="positive"):
            t.slowed(bad)
