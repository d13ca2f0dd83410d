"""The jax runner's continuous batching: slots are KV rows, per-row positions, slot reuse (semantics only)."""
from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from lens.compose import UnitTable  # noqa: E402
from lens.errors import UserError  # noqa: E402
from lens.serving import predict_serving  # noqa: E402
from lens.types import BucketProfile, Candidate, ModelShape, Requests, Target  # noqa: E402
from runners import get_runner  # noqa: E402

BUCKETS = (16, 32, 64)
SHAPE = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256)
PROMPTS = [[7, 3, 200, 41, 5], list(range(100, 120)), [9] * 3, list(range(30, 63)), [1, 2], [250, 4, 4, 8]]
OUT_LEN = [40, 6, 12, 1, 25, 9]  # crosses decode buckets, ends early, a one-token request, ...


@pytest.fixture(scope="module")
def runner():
    r = get_runner(Target(name="t", runner="jax", hardware="cpu", bucket_policy="exclusive", dtype="float32",
                          model=SHAPE))
    yield r
    r.close()


@pytest.fixture(scope="module")
def served(runner):
    # all six arrive at once into two slots: four of them wait, rows are reused at different positions
    return runner.serve_tokens(tp=1, batch=2, ctx_buckets=BUCKETS, tkg_buckets=BUCKETS, prompts=PROMPTS,
                               output_len=OUT_LEN, arrival_s=[0.0] * len(PROMPTS))


def test_each_request_generates_what_it_would_alone(runner, served):
    """A slot's tokens must not depend on its neighbours, on its row, or on when it joined."""
    for prompt, n, got in zip(PROMPTS, OUT_LEN, served.tokens):
        alone = runner.generate(tp=1, batch=1, ctx_buckets=BUCKETS, tkg_buckets=BUCKETS, prompts=[prompt],
                                output_len=[n])[0]
        assert list(got) == list(alone)


def test_fifo_admission_into_at_most_batch_slots(served):
    admit, first, finish = served.admit_s, served.first_s, served.finish_s
    assert (np.diff(admit) >= 0).all() and (np.diff(first) >= 0).all()  # FIFO, prompts one at a time
    assert (admit <= first).all() and (first <= finish).all()
    assert finish[3] == first[3]  # one token: done at its prefill
    for t in np.concatenate([admit, finish]):  # never more than two requests hold a slot
        assert ((admit <= t) & (t < finish)).sum() <= 2
    assert admit[2] >= min(finish[0], finish[1])  # the third waits for a slot to free
    # a request whose slot frees during a decode step joins before the next one: the decode
    # steps counted equal those of the machine (each step advances every live slot by one)
    assert served.decode_steps >= max(OUT_LEN) - 1


def test_every_slot_freed_while_requests_wait_is_refilled_at_that_step_boundary(served):
    """With every request waiting from the start, the machine's schedule depends on the lengths alone: the
    served loop (which queues decode steps ahead of the device between its waits) must run exactly its decode
    steps."""
    profiles = {b: BucketProfile(bucket=b, ttft_s=1e-3, tbt_s=1e-4, input_len=1, l1=1, l2=2, t1_s=0.0, t2_s=0.0,
                                 repeats=1, spread=0.0) for b in BUCKETS}
    table = UnitTable.build(Candidate(1, 2, BUCKETS, BUCKETS), profiles, policy="exclusive")
    req = Requests(np.array([len(p) for p in PROMPTS]), np.array(OUT_LEN), np.zeros(len(PROMPTS)))
    machine = predict_serving(table, req)
    assert served.decode_steps == machine.decode_steps
    # and in the machine's order: the same requests share the same slots' turns
    assert list(np.argsort(served.admit_s, kind="stable")) == list(np.argsort(machine.admit_s, kind="stable"))


def test_requests_are_released_at_their_arrival_times(runner):
    arrivals = [0.0, 0.05, 0.3]
    s = runner.serve_tokens(tp=1, batch=2, ctx_buckets=BUCKETS, tkg_buckets=BUCKETS, prompts=PROMPTS[:3],
                            output_len=[3, 3, 3], arrival_s=arrivals)
    assert (s.admit_s >= np.asarray(arrivals)).all()


def test_run_workload_continuous_measures_from_each_arrival(runner):
    req = Requests(np.array([5, 20, 3, 40]), np.array([8, 3, 1, 6]), np.array([0.0, 0.0, 0.01, 0.02]))
    run = runner.run_workload(Candidate(1, 2, BUCKETS, BUCKETS), req, mode="continuous")
    assert run.mode == "continuous" and run.simulated is False
    assert run.ttft_s.shape == run.e2e_s.shape == (4,)
    assert (run.ttft_s > 0).all() and (run.ttft_s <= run.e2e_s).all()
    assert run.e2e_s[2] == run.ttft_s[2]
    assert run.total_s == pytest.approx(float((req.arrival_s + run.e2e_s).max()))


def test_continuous_mode_needs_arrivals_and_a_known_mode(runner):
    cand = Candidate(1, 2, BUCKETS, BUCKETS)
    with pytest.raises(UserError, match="arrival"):
        runner.run_workload(cand, Requests([5], [2]), mode="continuous")
    with pytest.raises(UserError, match="unknown"):
        runner.run_workload(cand, Requests([5], [2], np.zeros(1)), mode="ragged")
    assert runner.modes == ("static", "continuous")
