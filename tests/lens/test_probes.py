import numpy as np
import pytest

from lens.buckets import select_index
from lens.errors import RunnerError, UserError
from lens.probes import check_probe, plan_probes, solve
from lens.types import Probe, ProbeRun


@pytest.mark.parametrize("policy", ["exclusive", "inclusive"])
@pytest.mark.parametrize("buckets", [(64, 128, 256, 512), (3, 5, 9, 1024), (128, 4096, 4608, 8192)])
def test_probe_contexts_never_leave_their_bucket(policy, buckets):
    probes = plan_probes(buckets, policy=policy, max_output=10_000, repeats=3)
    assert len(probes) == 2 * len(buckets)
    for p in probes:
        ctx = np.arange(p.input_len, p.input_len + p.output_len)  # prompt, then decode contexts
        idx = select_index(ctx, buckets, policy)
        assert set(np.asarray(buckets)[idx]) == {p.bucket}, p
        check_probe(p, buckets, policy)
    # the longer run of each bucket uses the whole room the bucket leaves
    for b in buckets:
        l2 = max(p.output_len for p in probes if p.bucket == b)
        p = next(p for p in probes if p.bucket == b)
        nxt = select_index([p.input_len + l2], buckets, policy)[0]
        assert nxt == -1 or buckets[nxt] != b


def test_probe_plan_respects_lower_neighbour_of_full_set():
    # profiling only 256 of the set still puts the prompt above 128
    (p1, p2) = plan_probes((64, 128, 256), policy="exclusive", profile=[256], max_output=128, repeats=3)
    assert p1.input_len == 128 and p2.input_len == 128
    (p1, p2) = plan_probes((64, 128, 256), policy="inclusive", profile=[256], max_output=128, repeats=3)
    assert p1.input_len == 129


def test_narrow_bucket_is_refused_clearly():
    with pytest.raises(UserError, match="too narrow"):
        plan_probes((4, 5, 6), policy="exclusive", max_output=128, repeats=3)


def test_check_probe_catches_the_pitfall():
    with pytest.raises(UserError):
        check_probe(Probe(bucket=64, input_len=64, output_len=2, repeats=1), (64, 128), "exclusive")
    with pytest.raises(UserError):
        check_probe(Probe(bucket=64, input_len=60, output_len=10, repeats=1), (64, 128), "exclusive")


def test_solve_recovers_ttft_and_tbt():
    ttft, tbt, batch = 0.05, 0.002, 4
    probes = plan_probes((64, 128), policy="exclusive", max_output=128, repeats=3)
    runs = []
    for p in probes:
        t = batch * ttft + (p.output_len - 1) * tbt
        runs.append(ProbeRun(p, (t * 0.99, t, t * 1.02)))
    out = solve(runs, batch=batch)
    # every run is the true cost times 0.99, 1 or 1.02: three runs cannot tell that 0.33% excess of the
    # mean from none (lens.noise.counted_classes), so the medians stand
    for b in (64, 128):
        assert out[b].ttft_s == pytest.approx(ttft, rel=1e-9)
        assert out[b].tbt_s == pytest.approx(tbt, rel=1e-9)
        assert out[b].excess == 0.0
        assert out[b].repeats == 3
        assert out[b].spread == pytest.approx(0.03)
        # the +- comes from the repeats: small here, and zero only when they agree
        assert 0 < out[b].ttft_err_s < 0.02 * ttft and 0 < out[b].tbt_err_s < 0.05 * tbt
        assert out[b].accepted


def test_solve_counts_a_slow_down_that_many_runs_show():
    ttft, tbt, batch = 0.05, 0.002, 4
    probes = plan_probes((64, 128), policy="exclusive", max_output=128, repeats=10)
    # 3 runs of 10 of every probe 20% slower (a busy core): the expected cost is their mean, 1.06x
    runs = [ProbeRun(p, tuple((batch * ttft + (p.output_len - 1) * tbt) * f for f in [1.0] * 7 + [1.2] * 3))
            for p in probes]
    out = solve(runs, batch=batch)
    for b in (64, 128):
        assert out[b].ttft_s == pytest.approx(ttft * 1.06, rel=1e-9)
        assert out[b].tbt_s == pytest.approx(tbt * 1.06, rel=1e-9)
        assert out[b].excess == pytest.approx(0.06)


def test_solve_refuses_non_increasing_times():
    p1, p2 = plan_probes((64,), policy="exclusive", max_output=128, repeats=3)
    with pytest.raises(RunnerError, match="not slower"):
        solve([ProbeRun(p1, (1.0,)), ProbeRun(p2, (0.9,))], batch=1)


def test_solve_batched_prefill_keeps_the_one_call():
    # batched prefill: a probe of B identical requests costs ONE call P_b plus its decode steps,
    # T(L) = P_b + (L - 1) TBT_b, so TTFT_b is P_b itself, not P_b / B
    call, tbt, batch = 0.12, 0.002, 4
    probes = plan_probes((64, 128), policy="exclusive", max_output=128, repeats=1)
    runs = [ProbeRun(p, (call + (p.output_len - 1) * tbt,)) for p in probes]
    batched = solve(runs, batch=batch, prefill="batched")
    sequential = solve(runs, batch=batch)
    for b in (64, 128):
        assert batched[b].ttft_s == pytest.approx(call, rel=1e-9)
        assert batched[b].tbt_s == pytest.approx(tbt, rel=1e-9)
        assert sequential[b].ttft_s == pytest.approx(call / batch, rel=1e-9)  # the same runs, read as B prefills
    with pytest.raises(UserError, match="prefill"):
        solve(runs, batch=batch, prefill="chunked")


def test_solve_marks_a_bucket_whose_derived_values_spread_as_not_accepted():
    """The straggler case: 32 prefills of bucket 4096 (0.34 s each) then decode steps of 44 ms, L2 = 128."""
    batch = 32
    probes = plan_probes((2048, 4096), policy="exclusive", max_output=128, repeats=3)
    runs = []
    for p in probes:
        t = batch * 0.34 + (p.output_len - 1) * 0.044
        # a straggling prefill (4x) lifts two of the three short runs of bucket 4096 by 3 x 0.34 s: 9% of T1, 4% of
        # the raw spread rule's 50%; but T2 - T1 is half of T1, so the slope moves by 18%
        slow = p.bucket == 4096 and p.output_len == 2
        runs.append(ProbeRun(p, (t + 1.02, t * 1.001 + 1.02, t * 0.999) if slow else (t, t * 1.001, t * 0.999)))
    out = solve(runs, batch=batch, max_spread=0.05)
    assert max(r.spread for r in runs) < 0.5  # the raw-spread rule (0.5) would have accepted it
    assert out[2048].accepted and not out[4096].accepted
    assert out[4096].tbt_err_s / out[4096].tbt_s > 0.05
