"""The jax runner: numerics of the cached decoder, one graph per bucket, tp, timing shapes."""
from __future__ import annotations

import os

# The CPU backend reads this when it starts; set it before anything initialises jax so
# the tp test has devices (the runner does the same on import, if it comes first).
_FLAG = "--xla_force_host_platform_device_count"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" {_FLAG}=8").strip()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax = pytest.importorskip("jax")

from lens.errors import RunnerError, UserError  # noqa: E402
from lens.types import Candidate, ModelShape, Probe, Requests, Target, Unit  # noqa: E402
from runners import get_runner  # noqa: E402
from runners import jax_model as jm  # noqa: E402
from runners.jax_runner import JaxRunner, decode_buckets  # noqa: E402

BUCKETS = (16, 32, 64)
SHAPE = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=256)


def make_target(**kw) -> Target:
    args = dict(name="t", runner="jax", hardware="cpu", bucket_policy="exclusive", dtype="float32", model=SHAPE)
    args.update(kw)
    return Target(**args)


@pytest.fixture(scope="module")
def runner():
    r = get_runner(make_target())
    yield r
    r.close()


def reference_greedy(params, prompt, n_out: int, pad_to: int = 64) -> list[int]:
    """Greedy tokens recomputing the full prefix every step (no KV cache).

    The prefix is padded to one fixed length so a single compiled forward serves every
    step; causal attention makes the padding invisible to the positions read.
    """
    fwd = jax.jit(jm.forward_full)
    seq = list(prompt)
    out = []
    for _ in range(n_out):
        buf = np.zeros((1, pad_to), np.int32)
        buf[0, : len(seq)] = seq
        logits = np.asarray(fwd(params, buf))
        nxt = int(np.argmax(logits[0, len(seq) - 1]))
        out.append(nxt)
        seq.append(nxt)
    return out


PROMPTS = [[7, 3, 200, 41, 5], list(range(100, 120))]
OUT_LEN = [40, 6]  # the first request crosses two decode buckets; the second ends early


def test_registry_returns_jax_runner(runner):
    assert isinstance(runner, JaxRunner)
    assert runner.name == "jax" and runner.simulated is False
    assert "warmup" in runner.options_schema


def test_cached_decoding_matches_full_recompute(runner):
    got = runner.generate(tp=1, batch=2, ctx_buckets=BUCKETS, tkg_buckets=BUCKETS, prompts=PROMPTS, output_len=OUT_LEN)
    params = runner._tp_state(1).params
    for prompt, n, tokens in zip(PROMPTS, OUT_LEN, got):
        assert len(tokens) == n
        assert list(tokens) == reference_greedy(params, prompt, n)


def test_one_graph_per_bucket_not_per_length(runner):
    probes = [
        Probe(16, 3, 2, 1), Probe(16, 5, 6, 1), Probe(16, 9, 4, 1),
        Probe(32, 17, 2, 1), Probe(32, 25, 5, 1),
        Probe(64, 33, 3, 1), Probe(64, 50, 10, 1),
    ]
    runner.profile(Unit(runner.target, 1, 2), probes)
    expected = sorted((k, b) for k in ("prefill", "decode") for b in BUCKETS)
    assert runner.compiled_graphs(1, 2) == expected
    before = runner.compile_seconds(1, 2)
    # more buckets of the same unit, then a workload: nothing is compiled again
    runner.profile(Unit(runner.target, 1, 2), [Probe(16, 4, 3, 1), Probe(64, 40, 2, 1)])
    runner.run_workload(Candidate(1, 2, BUCKETS, BUCKETS), Requests([3, 30], [4, 8]))
    assert runner.compiled_graphs(1, 2) == expected
    assert runner.compile_seconds(1, 2) == before


def test_tp2_matches_tp1(runner):
    if len(jax.devices()) < 2:
        pytest.skip(f"needs 2 devices, jax has {len(jax.devices())}: jax was initialised before XLA_FLAGS "
                    f"could set {_FLAG}; run this module on its own or export XLA_FLAGS={_FLAG}=8")
    small = BUCKETS[:2]  # fewer graphs to compile; both requests still cross a boundary
    kw = dict(ctx_buckets=small, tkg_buckets=small, prompts=PROMPTS, output_len=[20, 6])
    t1 = runner.generate(tp=1, batch=2, **kw)
    t2 = runner.generate(tp=2, batch=2, **kw)
    assert [list(a) for a in t1] == [list(b) for b in t2]
    assert len(runner.compiled_graphs(2, 2)) == 2 * len(small)


def test_profile_returns_one_run_per_probe(runner):
    probes = [Probe(16, 5, 3, 3), Probe(16, 5, 9, 2), Probe(32, 20, 4, 2)]
    res = runner.profile(Unit(runner.target, 1, 2), probes)
    assert [r.probe for r in res.runs] == probes
    for r in res.runs:
        assert len(r.times_s) == r.probe.repeats
        assert all(t > 0 for t in r.times_s)
    assert res.run_s >= sum(sum(r.times_s) for r in res.runs)
    assert res.compile_s >= 0 and res.simulated is False and res.host
    assert {"python", "jax", "jaxlib", "cpu", "platform"} <= set(res.versions)
    assert runner.fingerprint() == runner.fingerprint()


def test_cpu_threads_reads_the_last_flag():
    from runners.jax_runner import _cpu_threads

    assert _cpu_threads("") == "many"  # XLA's default: a thread pool per graph
    assert _cpu_threads("--xla_cpu_multi_thread_eigen=false") == "one"
    assert _cpu_threads("--xla_force_host_platform_device_count=8 --xla_cpu_multi_thread_eigen=0") == "one"
    assert _cpu_threads("--xla_cpu_multi_thread_eigen=false --xla_cpu_multi_thread_eigen=true") == "many"
    assert _cpu_threads("--xla_cpu_multi_thread_eigen=true --xla_cpu_multi_thread_eigen=False") == "one"


def test_one_thread_is_the_default_and_is_in_the_fingerprint(runner, monkeypatch):
    # importing the runner set the flag unless the process's XLA_FLAGS already named it
    assert "--xla_cpu_multi_thread_eigen=" in os.environ["XLA_FLAGS"]
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
    one = runner.fingerprint()
    assert runner.versions()["xla_cpu_threads"] == "one"
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=true")
    # a thread-pool run keeps the fingerprint profiles had before the key existed
    assert "xla_cpu_threads" not in runner.versions()
    assert runner.fingerprint() != one


def test_run_workload_per_request_times(runner):
    lin = np.array([3, 20, 40, 5, 7])
    lout = np.array([10, 3, 20, 1, 2])
    cand = Candidate(1, 2, BUCKETS, BUCKETS)
    run = runner.run_workload(cand, Requests(lin, lout))
    assert run.ttft_s.shape == run.e2e_s.shape == (5,)
    assert np.all(run.ttft_s > 0)
    assert np.all(run.ttft_s <= run.e2e_s)
    assert run.e2e_s[3] == run.ttft_s[3]  # one output token: done at its prefill
    batches = [[0, 1], [2, 3], [4]]  # the last batch has an empty row
    for idx in batches:
        ttft, e2e = run.ttft_s[idx], run.e2e_s[idx]
        assert np.all(np.diff(ttft) >= 0)  # prompts are encoded one after the other
        decoding = lout[idx] > 1
        assert np.all(e2e[decoding] >= ttft.max())  # decoding starts after every prefill
    assert run.total_s >= sum(run.e2e_s[idx].max() for idx in batches) - 1e-9
    assert run.run_s >= run.total_s and run.simulated is False


def test_decode_bucket_schedule():
    # finished rows do not choose the bucket: after step 1 only the short prompt decodes
    b = decode_buckets([40, 3], [2, 10], BUCKETS, "exclusive")
    assert b.tolist() == [64] + [16] * 8
    # exclusive: context 16 runs in 32; inclusive: it stays in 16
    assert decode_buckets([10], [8], BUCKETS, "exclusive").tolist() == [16] * 5 + [32] * 2
    assert decode_buckets([10], [8], BUCKETS, "inclusive").tolist() == [16] * 6 + [32]
    assert decode_buckets([10], [1], BUCKETS, "exclusive").size == 0
    with pytest.raises(UserError):
        decode_buckets([60], [10], BUCKETS, "exclusive")


def test_check_unit_errors(runner):
    t = runner.target
    with pytest.raises(UserError, match="heads"):
        runner.check_unit(Unit(t, 3, 1))
    with pytest.raises(UserError, match="kv_heads"):
        runner.check_unit(Unit(t, 4, 1))
    with pytest.raises(UserError, match="batch"):
        runner.check_unit(Unit(t, 1, 0))
    big = JaxRunner(make_target(model=ModelShape(layers=1, hidden=1024, heads=512, kv_heads=512,
                                                 intermediate=512, vocab=16)))
    with pytest.raises((UserError, RunnerError), match="device"):
        big.check_unit(Unit(big.target, 512, 1))


def test_requests_that_do_not_fit(runner):
    cand = Candidate(1, 2, BUCKETS, BUCKETS)
    with pytest.raises(UserError, match=r"request 1: input_len = 70"):
        runner.run_workload(cand, Requests([5, 70], [2, 2]))
    with pytest.raises(UserError, match=r"request 0: input_len = 60, output_len = 10"):
        runner.run_workload(cand, Requests([60], [10]))
    with pytest.raises(UserError, match="output_len = 0"):
        runner.run_workload(cand, Requests([5], [0]))
    with pytest.raises(UserError, match="probe 0"):
        runner.profile(Unit(runner.target, 1, 2), [Probe(32, 5, 2, 1), Probe(16, 5, 2, 1)])
    with pytest.raises(UserError, match="warmup"):
        JaxRunner(make_target(options=(("warmup", -1),))).run_workload(cand, Requests([5], [2]))
    with pytest.raises(UserError, match="'warm_up' is unknown"):
        JaxRunner(make_target(options=(("warm_up", 1),))).run_workload(cand, Requests([5], [2]))


# -- batched prefill: the whole batch's prompts in one call of shape (batch, bucket) -------------

@pytest.fixture(scope="module")
def batched():
    r = get_runner(make_target(prefill="batched"))
    yield r
    r.close()


def test_batched_prefill_decodes_what_the_full_recompute_gives(batched):
    """Rows of one batched call do not see each other: each request's greedy tokens are the
    full recompute's, with both rows real and with a padding row (a short batch)."""
    params = batched._tp_state(1).params
    got = batched.generate(tp=1, batch=2, ctx_buckets=BUCKETS, tkg_buckets=BUCKETS, prompts=PROMPTS, output_len=OUT_LEN)
    for prompt, n, tokens in zip(PROMPTS, OUT_LEN, got):
        assert list(tokens) == reference_greedy(params, prompt, n)
    (alone,) = batched.generate(tp=1, batch=2, ctx_buckets=BUCKETS, tkg_buckets=BUCKETS, prompts=PROMPTS[:1],
                                output_len=[12])
    assert list(alone) == reference_greedy(params, PROMPTS[0], 12)
    # one batched prefill graph per context bucket, and no per-request one
    assert batched.compiled_graphs(1, 2) == sorted((k, b) for k in ("prefill-batched", "decode") for b in BUCKETS)


def test_batched_prefill_gives_a_batch_its_first_tokens_at_once(batched):
    lin = np.array([3, 20, 40, 5, 7])
    lout = np.array([10, 3, 20, 1, 2])
    run = batched.run_workload(Candidate(1, 2, BUCKETS, BUCKETS), Requests(lin, lout))
    for idx in ([0, 1], [2, 3], [4]):  # the last batch has an empty row, run in the shape too
        ttft, e2e = run.ttft_s[idx], run.e2e_s[idx]
        assert np.ptp(ttft) == 0.0  # one call, one synchronisation: every first token at its end
        assert np.all(e2e[lout[idx] > 1] > ttft[0])
    assert run.e2e_s[3] == run.ttft_s[3]


def test_batched_prefill_refuses_continuous_mode(batched):
    req = Requests([3, 5], [2, 2], np.array([0.0, 0.0]))
    with pytest.raises(UserError, match='prefill = "batched" runs static batches only'):
        batched.run_workload(Candidate(1, 2, BUCKETS, BUCKETS), req, mode="continuous")
