"""The simulated machine's continuous batching (runners.sim.serving): consistent with its own static
batches where the two machines coincide, and stepping the slots as docs/serving.md says."""
from __future__ import annotations

import numpy as np
import pytest

from lens.types import Candidate, ModelShape, Requests, Scheduler, Target
from runners.sim import SimRunner
from runners.sim.options import clean

BUCKETS = (128, 256, 512, 1024)
LLAMA_1B = ModelShape(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=128256)


def runner(scheduler=Scheduler(), prefill="sequential", **options) -> SimRunner:
    opts = {**clean(), "launch": True, "row_host": True, **options}
    return SimRunner(Target("t", "sim", "inf2", "exclusive", "bfloat16", LLAMA_1B, tuple(sorted(opts.items())),
                            scheduler=scheduler, prefill=prefill))


def cand(batch):
    return Candidate(1, batch, BUCKETS, BUCKETS)


def test_one_slot_and_spaced_arrivals_is_the_static_machine_request_by_request():
    lin, lout = np.array([100, 300, 700]), np.array([50, 200, 20])
    alone = [runner().run_workload(cand(1), Requests(lin[i:i + 1], lout[i:i + 1])) for i in range(3)]
    served = runner().run_workload(cand(1), Requests(lin, lout, np.array([0.0, 100.0, 200.0])), mode="continuous")
    assert served.mode == "continuous" and served.simulated
    np.testing.assert_allclose(served.ttft_s, [a.ttft_s[0] for a in alone], rtol=1e-12)
    np.testing.assert_allclose(served.e2e_s, [a.e2e_s[0] for a in alone], rtol=1e-12)
    assert served.total_s == pytest.approx(200.0 + alone[2].e2e_s[0])


def test_requests_beyond_the_slots_wait_and_reuse_them():
    lin, lout = np.array([100, 100, 100, 100]), np.array([40, 10, 30, 5])
    run = runner().run_workload(cand(2), Requests(lin, lout, np.zeros(4)), mode="continuous")
    first, last = run.ttft_s, run.e2e_s  # all arrive at 0: times from 0
    assert first[0] < first[1] < first[2] < first[3]
    assert first[2] > last[1]  # the third takes the slot of the second (10 tokens), not before it ends
    assert last[1] < first[2] < last[0]
    assert first[3] > min(last[0], last[2])  # the fourth waits for the next slot to free


def test_max_prefills_one_puts_a_decode_step_between_prefills():
    req = Requests(np.array([100, 100]), np.array([20, 20]), np.zeros(2))
    eager = runner().run_workload(cand(2), req, mode="continuous")
    one = runner(Scheduler(max_prefills=1)).run_workload(cand(2), req, mode="continuous")
    assert one.ttft_s[0] == pytest.approx(eager.ttft_s[0])
    assert one.ttft_s[1] > eager.ttft_s[1]  # a decode step ran before the second prefill


def test_the_targets_batched_prefill_admits_the_waiting_requests_in_one_call():
    req = Requests(np.array([100, 300, 50]), np.array([20, 20, 20]), np.array([0.0, 0.0, 0.0]))
    one_by_one = runner().run_workload(cand(2), req, mode="continuous")
    batched = runner(prefill="batched").run_workload(cand(2), req, mode="continuous")
    assert one_by_one.ttft_s[0] < one_by_one.ttft_s[1]  # sequential: the second prompt after the first
    assert batched.ttft_s[0] == batched.ttft_s[1]  # batched: both first tokens at the end of one call
    assert batched.ttft_s[2] > batched.e2e_s[0]  # the third waits for a slot, as before


def test_the_same_seed_serves_the_same_times():
    opts = dict(noise=0.02, stragglers=True, drift=True)
    req = Requests(np.array([100, 500, 30]), np.array([60, 9, 1]), np.array([0.0, 0.01, 0.02]))
    a = runner(**opts).run_workload(cand(2), req, mode="continuous")
    b = runner(**opts).run_workload(cand(2), req, mode="continuous")
    np.testing.assert_array_equal(a.e2e_s, b.e2e_s)
    assert a.e2e_s[2] == a.ttft_s[2]
