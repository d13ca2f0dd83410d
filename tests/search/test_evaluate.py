"""The evaluator's feasibility rules on hand-made candidates and profiles."""
from pathlib import Path

import numpy as np
import pytest

from lens.types import BucketProfile, Candidate, ModelShape, Requests, Target
from search.confirm import repredicted
from search.evaluate import Evaluator
from search.prior import memory_gib
from spaces import Hosts, SearchSpace, Space

M = ModelShape(layers=8, hidden=1024, heads=16, kv_heads=8, intermediate=4096, vocab=32000)


def space(memory_gib_per_chip: float) -> Space:
    target = Target(name="t", runner="sim", hardware="inf2", bucket_policy="exclusive", dtype="bfloat16", model=M)
    return Space(path=Path("s.toml"), sha256="", target=target,
                 search=SearchSpace(tp=(1,), batch=(8,), buckets=(256, 4096), tie_buckets=False),
                 hosts=Hosts(memory_gib_per_chip=memory_gib_per_chip))


def test_memory_pruning_counts_the_context_encoding_buckets():
    """A context bucket longer than every token-generation bucket fills the KV cache too."""
    short = memory_gib(M, "bfloat16", tp=1, batch=8, max_len=256)
    long = memory_gib(M, "bfloat16", tp=1, batch=8, max_len=4096)
    sp = space((short + long) / 2)  # room for 256-token rows, not for 4096
    ev = Evaluator(sp, Requests(np.asarray([10]), np.asarray([5])))
    wide_ctx = Candidate(1, 8, ctx_buckets=(256, 4096), tkg_buckets=(256,))
    wide_tkg = Candidate(1, 8, ctx_buckets=(256,), tkg_buckets=(256, 4096))
    narrow = Candidate(1, 8, ctx_buckets=(256,), tkg_buckets=(256,))
    for c in (wide_ctx, wide_tkg):
        why = ev.infeasible_reason(c)
        assert why is not None and "GiB per chip" in why, (c, why)
    assert ev.infeasible_reason(narrow) is None


def _bp(bucket: int, ttft_s: float, tbt_s: float) -> BucketProfile:
    return BucketProfile(bucket=bucket, ttft_s=ttft_s, tbt_s=tbt_s, input_len=1, l1=2, l2=64, t1_s=0.0, t2_s=0.0,
                         repeats=3, spread=0.0)


def test_a_confirmation_predicts_again_knowing_every_measured_unit():
    """A confirmation judged on buckets profiled side by side predicts the candidate again: it must know, as
    the search did, that a unit measured at the largest bucket shows the KV cache fits it, or it asks for a
    bucket the workload never runs in and gives no prediction."""
    sp = Space(path=Path("s.toml"), sha256="", target=space(1.0).target,
               search=SearchSpace(tp=(1,), batch=(8, 16), buckets=(256, 4096), tie_buckets=False), hosts=Hosts())
    reqs = Requests(np.asarray([10, 100]), np.asarray([5, 20]))
    c = Candidate(1, 8, ctx_buckets=(256, 4096), tkg_buckets=(256, 4096))
    measured = {(1, 8): {256: _bp(256, 0.010, 0.002)}, (1, 16): {4096: _bp(4096, 0.2, 0.01)}}
    fresh = {256: _bp(256, 0.012, 0.0024)}  # the host 20% slower now
    again = repredicted(sp, reqs, measured, c, fresh)
    assert again.prediction is not None and again.infeasible is None
    before = repredicted(sp, reqs, measured, c, {})
    assert again.metrics["e2e_p90_s"] == pytest.approx(1.2 * before.metrics["e2e_p90_s"], rel=1e-6)
    # without the batch-16 unit nothing shows that 4096 fits, and nothing predicts the candidate
    assert repredicted(sp, reqs, {(1, 8): measured[(1, 8)]}, c, fresh).prediction is None


def test_the_rate_sweep_reuses_an_evaluations_own_bisection(monkeypatch):
    """Where the sustainable rate is the objective, the evaluation keeps its bisection and the sweep reads it
    (the same table); a front read back without one is bisected afresh, to the same rate."""
    import dataclasses

    from lens import arrivals
    from search.sweep import rate_sweep
    from spaces import Objectives

    base = space(1e6)
    sp = dataclasses.replace(base, target=dataclasses.replace(base.target, serving="continuous"),
                             objectives=Objectives(throughput="sustainable_rate_req_s_per_chip", latency="ttft_p90_s"),
                             slo=(("ttft_p90_s", 2.0),))
    n = 40
    req = Requests(np.full(n, 100), np.full(n, 20), arrivals.poisson(n, rate=2.0, seed=0))
    ev = Evaluator(sp, req)
    ev.set_measured((1, 8), {256: _bp(256, 0.05, 0.01), 4096: _bp(4096, 0.5, 0.02)})
    e = ev.evaluate(Candidate(1, 8, ctx_buckets=(256, 4096), tkg_buckets=(256, 4096)))
    assert e.capacity is not None and e.metrics["sustainable_rate_req_s"] == e.capacity.rate_req_s > 0
    calls = []
    bisect = Evaluator.sustainable
    monkeypatch.setattr(Evaluator, "sustainable", lambda self, c, tbl=None: calls.append(c) or bisect(self, c, tbl))
    kept = rate_sweep([e], ev, sp).capacity.iloc[0]
    assert calls == [] and kept["sustainable_rate_req_s"] == e.capacity.rate_req_s
    assert kept["limited_by"] == e.capacity.why_not
    again = rate_sweep([dataclasses.replace(e, capacity=None)], ev, sp).capacity.iloc[0]
    assert calls == [e.candidate] and again["sustainable_rate_req_s"] == kept["sustainable_rate_req_s"]
