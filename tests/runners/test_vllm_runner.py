"""The vllm runner: engine arguments per platform, deploy snippet, fingerprints, and the
probe / workload / timing logic and the conformance suite against a fake engine.  The real
engine boundary (``_VllmEngine``) runs against a fake ``vllm`` package that models the
current one (queueing race, token budget, V1 outputs, the Neuron plugin), and on real vLLM
only in the ``gpu``-marked tests, on a host with vLLM and an NVIDIA GPU."""
from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from lens.errors import RunnerError, RunnerUnavailable, UserError
from lens.probes import plan_probes, solve
from lens.types import Candidate, ModelShape, Probe, Requests, Target, Unit
from runners import get_runner
from runners import _llm_host as host
from runners import vllm_runner as vr
from runners._engine_timing import RequestClock, StepObservation, TimedBatch, drive_arrivals, drive_steps

ROOT = Path(__file__).resolve().parents[2]
SHAPE = ModelShape(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=128256)
SMALL = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=500)
FAKE_VERSIONS = {"python": "3.x", "vllm": "0.11.test", "torch": "2.x", "cuda": "12.x", "gpus": "1 x Fake GPU",
                 "vllm-neuron": "0.2.0"}


def target(hardware="h200", *, shape=SHAPE, dtype="bfloat16", policy=None, prefill=None, **opts) -> Target:
    plat = vr.resolve_platform(hardware, opts.get("platform", ""))
    if plat != "neuron" or opts.get("load_format", "dummy") != "dummy":
        opts.setdefault("model", "/models/llama")
    policy = policy or ("exclusive" if plat == "neuron" else "inclusive")
    prefill = prefill or ("sequential" if plat == "neuron" else "batched")
    return Target(name="t", runner="vllm", hardware=hardware, bucket_policy=policy, dtype=dtype, model=shape,
                  options=tuple(sorted(opts.items())), prefill=prefill)


def spec(hardware="h200", tp=2, batch=8, ctx=(128, 256, 512), tkg=None, root=None, **opts):
    t = target(hardware, **opts)
    r = vr.VllmRunner(t)
    return vr.build_engine_spec(t, r.opts, tp=tp, batch=batch, ctx=ctx, tkg=tkg or ctx, artifacts_root=root,
                                checkpoint=r.checkpoint_dir())


# -- platform and engine arguments ---------------------------------------------------------------


@pytest.mark.parametrize("hw,plat", [("h200", "gpu"), ("gpu", "gpu"), ("A100-80GB", "gpu"), ("tpu-v6e", "tpu"),
                                     ("inf2", "neuron"), ("trn1", "neuron"), ("neuron-core-v2", "neuron")])
def test_platform_from_hardware(hw, plat):
    assert vr.resolve_platform(hw) == plat


def test_platform_option_wins_and_unknown_ones_fail():
    assert vr.resolve_platform("h200", "tpu") == "tpu"
    with pytest.raises(UserError, match="platform = 'cpu' is unknown"):
        vr.resolve_platform("h200", "cpu")
    with pytest.raises(UserError, match="set \\[target.options\\] platform"):
        vr.resolve_platform("mystery-chip")
    with pytest.raises(UserError, match="unknown"):
        get_runner(target(platform="fpga"))


def test_gpu_engine_arguments():
    s = spec("h200", tp=2, batch=8, ctx=(128, 256, 512))
    kw = s.llm_kwargs
    assert s.platform == "gpu"
    assert kw["tensor_parallel_size"] == 2 and kw["max_num_seqs"] == 8
    assert kw["max_model_len"] == 513  # largest bucket + 1: vLLM counts the last token too
    assert kw["skip_tokenizer_init"] is True and kw["load_format"] == "dummy"
    assert kw["enable_prefix_caching"] is False
    assert kw["max_num_batched_tokens"] == 8 * 512  # a batch's prompts fit one step
    assert kw["compilation_config"] == {"cudagraph_capture_sizes": [8]}
    assert "enforce_eager" not in kw and s.env == {}
    assert vr.build_engine_spec(target(), vr.VllmRunner(target()).opts, tp=2, batch=8, ctx=(128, 256, 512),
                                tkg=(128, 256, 512)).key == s.key
    assert spec(tp=2, batch=4).key != s.key


def test_gpu_cuda_graph_modes():
    assert spec(cuda_graphs="off").llm_kwargs["enforce_eager"] is True
    kw = spec(cuda_graphs="default").llm_kwargs
    assert "compilation_config" not in kw and "enforce_eager" not in kw
    with pytest.raises(UserError, match="cuda_graphs"):
        spec(cuda_graphs="sometimes")


def test_max_model_len_follows_the_largest_of_both_sets():
    s = spec(ctx=(128, 256), tkg=(128, 256, 1024))
    assert s.llm_kwargs["max_model_len"] == 1025


def test_fp8_is_gpu_only():
    assert spec(dtype="fp8").llm_kwargs["quantization"] == "fp8"
    with pytest.raises(UserError, match="fp8"):
        spec("tpu-v5e", dtype="fp8")


def test_tpu_padding_ladder():
    assert vr.tpu_ladder(0, 512) == (16, 32, 64, 128, 256, 512)
    # vLLM's documented example: max 512, gap 64
    assert vr.tpu_ladder(64, 512) == (16, 32, 64, 128, 192, 256, 320, 384, 448, 512)
    assert vr.tpu_padding_gap([128, 256, 512]) == 0
    assert vr.tpu_padding_gap([128, 256, 384, 512]) == 128
    assert vr.tpu_padding_gap([512, 1024, 1536, 2048]) == 512
    with pytest.raises(UserError, match="padding ladder"):
        vr.tpu_padding_gap([100, 200])
    with pytest.raises(UserError, match="padding ladder"):
        vr.tpu_padding_gap([8, 16])


def test_tpu_engine_arguments():
    s = spec("tpu-v6e", tp=4, batch=1, ctx=(128, 256, 384, 512))
    assert s.platform == "tpu" and s.prefill == "batched"
    assert s.env == {"VLLM_TPU_BUCKET_PADDING_GAP": "128"}
    assert s.llm_kwargs["max_num_batched_tokens"] == 512
    assert "compilation_config" not in s.llm_kwargs
    assert spec("tpu-v6e", batch=1, ctx=(128, 256, 512)).env["VLLM_TPU_BUCKET_PADDING_GAP"] == "0"
    assert spec("tpu-v6e", batch=1, max_num_batched_tokens=2048).llm_kwargs["max_num_batched_tokens"] == 2048


def test_token_budget_holds_a_whole_batch():
    assert vr.token_budget({}, batch=8, ctx=(128, 2048)) == 16384
    assert vr.token_budget({"max_num_batched_tokens": 32768}, batch=8, ctx=(2048,)) == 32768
    with pytest.raises(UserError, match="max_num_batched_tokens = 8192 is less than batch 8 x the largest context "
                                        "bucket 2048"):
        vr.token_budget({"max_num_batched_tokens": 8192}, batch=8, ctx=(2048,))


def test_tpu_refuses_batches_over_one():
    r = get_runner(target("tpu-v6e"))
    r.check_unit(Unit(r.target, 4, 1))
    with pytest.raises(UserError, match="tpu.*batch = 8.*pads the tokens of a whole step"):
        r.check_unit(Unit(r.target, 4, 8))


def test_bucket_policy_must_be_the_platforms():
    with pytest.raises(UserError, match="target.bucket_policy = 'inclusive'.*neuron.*set bucket_policy = \"exclusive\""):
        get_runner(target("inf2", policy="inclusive"))
    with pytest.raises(UserError, match="target.bucket_policy = 'exclusive'.*tpu.*set bucket_policy = \"inclusive\""):
        get_runner(target("tpu-v5e", policy="exclusive"))
    for policy in ("inclusive", "exclusive"):  # a GPU compiles no lengths: either shapes LENS's profile
        get_runner(target("h200", policy=policy))


def test_prefill_mode_per_platform():
    assert get_runner(target("h200")).prefill == "batched"
    assert get_runner(target("tpu-v6e")).prefill == "batched"
    assert get_runner(target("inf2")).prefill == "sequential"  # the Neuron plugin encodes one prompt per step
    assert vr.VllmRunner.one_unit_per_process is True


@pytest.mark.parametrize(("hardware", "wrong", "right"), [("h200", "sequential", "batched"),
                                                          ("tpu-v6e", "sequential", "batched"),
                                                          ("inf2", "batched", "sequential")])
def test_a_target_whose_prefill_the_platform_does_not_run_is_refused(hardware, wrong, right):
    with pytest.raises(UserError, match=f'prefill = "{wrong}".*set prefill = "{right}" under \\[target\\]'):
        get_runner(target(hardware, prefill=wrong))


def test_the_loader_names_the_file_and_the_key_of_a_prefill_vllm_does_not_run(tmp_path):
    from lens.errors import SpaceError
    from spaces import load_space

    p = tmp_path / "gpu.toml"
    text = (ROOT / "spaces" / "vllm-gpu-example.toml").read_text()
    assert 'prefill = "batched"' in text
    p.write_text(text.replace('prefill = "batched"', 'prefill = "sequential"'))
    with pytest.raises(SpaceError, match=re.escape(str(p)) + r'.*\[target\].*prefill = "sequential"'):
        load_space(p)


def test_neuron_engine_arguments(tmp_path):
    s = spec("inf2", tp=2, batch=4, ctx=(128, 512), tkg=(128, 256, 512), root=tmp_path, artifacts_dir=str(tmp_path))
    nc = s.llm_kwargs["additional_config"]["override_neuron_config"]
    assert nc == {"enable_bucketing": True, "context_encoding_buckets": [128, 512],
                  "token_generation_buckets": [128, 256, 512], "max_context_length": 512, "seq_len": 512}
    assert s.llm_kwargs["num_gpu_blocks_override"] == 4
    assert "override_neuron_config" not in s.llm_kwargs  # current EngineArgs has no such argument
    assert s.prefill == "sequential"
    art = Path(s.env["NEURON_COMPILED_ARTIFACTS"])
    assert art.parent == tmp_path and art.name.startswith("tp2_b4_")
    other = spec("inf2", tp=2, batch=4, ctx=(128, 512), tkg=(128, 512), root=tmp_path)
    assert other.env["NEURON_COMPILED_ARTIFACTS"] != str(art)  # one folder per configuration
    # random weights: the plugin ignores load_format, so a checkpoint of [target.model] is written
    ck = Path(s.llm_kwargs["model"])
    assert ck.parent == tmp_path / "checkpoints" and ck.name.startswith("llama_") and "load_format" not in s.llm_kwargs
    assert s.checkpoint.folder == str(ck) and s.checkpoint.shape == SHAPE and s.checkpoint.max_position == 513
    real = spec("inf2", load_format="auto", model="/ckpt/llama")
    assert real.checkpoint is None and real.llm_kwargs["model"] == "/ckpt/llama"


def test_neuron_random_weights_take_no_model_and_legacy_is_gone():
    with pytest.raises(UserError, match="leave \\[target.options\\] model out, or set load_format = \"auto\""):
        get_runner(target("inf2", model="/models/llama"))
    # the in-tree Neuron support passed override_neuron_config as an engine argument; EngineArgs rejects it now
    with pytest.raises(UserError, match="unknown option 'neuron_integration'"):
        get_runner(target("inf2", neuron_integration="legacy"))


# -- options and units ------------------------------------------------------------------------------


def test_missing_model_option():
    t = Target(name="t", runner="vllm", hardware="h200", bucket_policy="inclusive", dtype="bfloat16", model=SHAPE)
    with pytest.raises(UserError, match="no \\[target.options\\] model"):
        get_runner(t)


def test_unknown_and_mistyped_options():
    with pytest.raises(UserError, match="unknown option 'tensor_parallel'"):
        get_runner(target(tensor_parallel=2))
    with pytest.raises(UserError, match="warmup = 'two' must be an integer"):
        get_runner(target(warmup="two"))
    with pytest.raises(UserError, match="must be a number"):
        get_runner(target(gpu_memory_utilization=True))


def test_check_unit():
    r = get_runner(target())
    r.check_unit(Unit(r.target, 8, 4))
    r.check_unit(Unit(r.target, 16, 1))  # 8 KV heads replicated over 16 ranks
    with pytest.raises(UserError, match="does not divide model.heads"):
        r.check_unit(Unit(r.target, 3, 1))
    with pytest.raises(UserError, match="batch"):
        r.check_unit(Unit(r.target, 1, 0))
    with pytest.raises(UserError, match="tp"):
        r.check_unit(Unit(r.target, True, 1))


def test_kv_heads_must_split_or_replicate_evenly():
    shape = ModelShape(layers=2, hidden=640, heads=20, kv_heads=4, intermediate=2560, vocab=1000)
    r = get_runner(target(shape=shape))
    with pytest.raises(UserError, match="kv_heads = 4"):
        r.check_unit(Unit(r.target, 10, 1))  # 10 ranks: neither 4 % 10 nor 10 % 4
    r.check_unit(Unit(r.target, 4, 1))


# -- versions and fingerprints -------------------------------------------------------------------


@pytest.fixture
def fake_sdk(monkeypatch):
    versions = dict(FAKE_VERSIONS)
    monkeypatch.setattr(vr, "sdk_versions", lambda platform: dict(versions, platform_seen=platform))
    return versions


def test_fingerprint_changes_with_versions_and_options(fake_sdk):
    a = get_runner(target()).fingerprint()
    assert a == get_runner(target()).fingerprint()
    assert a == get_runner(target(artifacts_dir="/elsewhere")).fingerprint()  # where files go is not a measurement
    assert a == get_runner(target(allow_untested_vllm=True)).fingerprint()  # the version itself is in it
    assert a != get_runner(target(cuda_graphs="off")).fingerprint()
    assert a != get_runner(target(model="/models/other")).fingerprint()
    assert a != get_runner(target(load_format="auto")).fingerprint()
    assert a != get_runner(target(dtype="float16")).fingerprint()
    assert a != get_runner(target("h100")).fingerprint()
    fake_sdk["vllm"] = "0.0.other"
    assert a != get_runner(target()).fingerprint()
    fake_sdk["vllm"] = FAKE_VERSIONS["vllm"]
    fake_sdk["nvidia_driver"] = "999.1"
    assert a != get_runner(target()).fingerprint()


def test_versions_include_the_platform_stack(fake_sdk):
    v = get_runner(target("tpu-v5e")).versions()
    assert v["vllm"] == "0.11.test" and v["platform_seen"] == "tpu"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_without_vllm_using_the_runner_says_which_extra_to_install():
    r = get_runner(target())  # constructing does no I/O and needs no SDK
    for use in (r.fingerprint, r.versions,
                lambda: r.profile(Unit(r.target, 1, 1), plan_probes((128, 256), policy="inclusive", max_output=16, repeats=1)),
                lambda: r.run_workload(Candidate(1, 1, (128,), (128,)), Requests([5], [5]))):
        with pytest.raises(RunnerUnavailable, match=r'pip install "lensopt\[vllm\]"'):
            use()
    assert "vllm_serve.sh" in r.deploy_snippets(Candidate(1, 1, (128,), (128,)))  # pure: works anyway


def test_nvidia_info_reads_procfs(tmp_path):
    (tmp_path / "gpus" / "0000:01:00.0").mkdir(parents=True)
    (tmp_path / "gpus" / "0000:02:00.0").mkdir(parents=True)
    (tmp_path / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 2024\n")
    for d in (tmp_path / "gpus").iterdir():
        (d / "information").write_text("Model: \t\t NVIDIA H200\nIRQ: 1\n")
    info = host.nvidia_info(str(tmp_path))
    assert info == {"nvidia_driver": "550.54.15", "gpus": "2 x NVIDIA H200"}
    assert host.nvidia_info(str(tmp_path / "absent")) == {}


# -- deploy snippet --------------------------------------------------------------------------------


def serve_flags(script: str) -> tuple[list[str], dict[str, str]]:
    line = [ln for ln in script.splitlines() if ln.startswith("exec vllm serve ")]
    assert len(line) == 1
    argv = shlex.split(line[0])[1:]
    assert argv[:2] == ["vllm", "serve"]
    flags, i = {}, 3
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            flags[argv[i]] = argv[i + 1]
            i += 2
        else:
            flags[argv[i]] = ""
            i += 1
    return argv, flags


def test_deploy_snippet_gpu():
    r = get_runner(target())
    files = r.deploy_snippets(Candidate(2, 16, (128, 256, 512), (128, 256, 512)))
    assert json.loads(files["config.json"])["tp"] == 2
    script = files["vllm_serve.sh"]
    assert script.startswith("#!/bin/sh\n")
    argv, flags = serve_flags(script)
    assert argv[2] == "/models/llama"
    assert flags["--tensor-parallel-size"] == "2"
    assert flags["--max-num-seqs"] == "16"
    assert flags["--max-model-len"] == "513"
    assert flags["--dtype"] == "bfloat16"
    assert json.loads(flags["--compilation-config"]) == {"cudagraph_capture_sizes": [16]}
    assert "--load-format" not in flags  # a deployment serves the real weights
    assert "random weights" in script


def test_deploy_snippet_quotes_paths_with_spaces():
    r = get_runner(target(model="/models/my llama"))
    argv, _ = serve_flags(r.deploy_snippets(Candidate(1, 1, (128,), (128,)))["vllm_serve.sh"])
    assert argv[2] == "/models/my llama"


def test_deploy_snippet_eager_tpu_and_neuron():
    _, flags = serve_flags(get_runner(target(cuda_graphs="off")).deploy_snippets(
        Candidate(1, 4, (128,), (128,)))["vllm_serve.sh"])
    assert "--enforce-eager" in flags and "--compilation-config" not in flags

    script = get_runner(target("tpu-v6e")).deploy_snippets(Candidate(4, 1, (256, 512), (256, 512)))["vllm_serve.sh"]
    assert "export VLLM_TPU_BUCKET_PADDING_GAP=0" in script.splitlines()
    _, flags = serve_flags(script)
    assert flags["--max-num-batched-tokens"] == "512"

    cand = Candidate(2, 4, (128, 512), (128, 256, 512))
    script = get_runner(target("inf2")).deploy_snippets(cand)["vllm_serve.sh"]
    _, flags = serve_flags(script)
    nc = json.loads(flags["--additional-config"])["override_neuron_config"]
    assert nc["context_encoding_buckets"] == [128, 512] and nc["token_generation_buckets"] == [128, 256, 512]
    assert flags["--num-gpu-blocks-override"] == "4"
    assert "--override-neuron-config" not in flags and "random weights" in script


# -- timing bookkeeping (the step loop) ---------------------------------------------------------


def request_output(rid, n, finished, first_token_time=None):
    metrics = None if first_token_time is None else SimpleNamespace(first_token_time=first_token_time)
    return SimpleNamespace(request_id=rid, outputs=[SimpleNamespace(token_ids=list(range(n)))], finished=finished,
                           metrics=metrics)


def test_observe_request_output():
    ob = vr.observe_request_output(request_output("a", 3, False, 12.5))
    assert ob == StepObservation("a", 3, False)
    ob = vr.observe_request_output(SimpleNamespace(request_id="b", outputs=[], finished=False, metrics=None))
    assert ob.n_tokens == 0


class ScriptedEngine:
    """A stand-in for vLLM's LLMEngine: per step, a list of RequestOutputs and the time it returns."""

    def __init__(self, script):
        self.script = list(script)
        self.clock = 100.0

    def step(self):
        t, outs = self.script.pop(0)
        self.clock = t
        return outs

    def has_unfinished(self):
        return bool(self.script)


def test_step_loop_times_from_the_host_clock():
    eng = ScriptedEngine([
        (100.5, []),  # a prefill chunk: nothing out yet
        (101.0, [request_output("a", 1, False), request_output("b", 1, False)]),
        (101.2, [request_output("a", 2, True), request_output("b", 2, False)]),
        (101.4, [request_output("b", 3, True)]),
    ])
    clock = RequestClock(["a", "b"], [2, 3], t0=100.0)
    drive_steps(eng.step, eng.has_unfinished, clock, vr.observe_request_output, now=lambda: eng.clock, max_steps=10)
    tb = clock.result()
    assert tb.ttft_source == "step" and clock.first_token_steps() == 1
    np.testing.assert_allclose(tb.ttft_s, [1.0, 1.0])
    np.testing.assert_allclose(tb.e2e_s, [1.2, 1.4])
    assert tb.wall_s == pytest.approx(1.4)


def test_step_loop_ignores_engine_first_token_stamps():
    # V1 keeps no first_token_time; a stale stamp on an output must not stand in for the step clock
    eng = ScriptedEngine([
        (101.0, [request_output("a", 1, False, 5000.7)]),
        (101.3, [request_output("a", 2, True, 5000.7), request_output("b", 1, True, 5000.8)]),
    ])
    clock = RequestClock(["a", "b"], [2, 1], t0=100.0)
    drive_steps(eng.step, eng.has_unfinished, clock, vr.observe_request_output, now=lambda: eng.clock, max_steps=10)
    tb = clock.result()
    assert tb.ttft_source == "step" and clock.first_token_steps() == 2
    np.testing.assert_allclose(tb.ttft_s, [1.0, 1.3])
    np.testing.assert_allclose(tb.e2e_s, [1.3, 1.3])


def test_step_loop_errors():
    # stopped early: one token short
    eng = ScriptedEngine([(101.0, [request_output("a", 1, True)])])
    clock = RequestClock(["a"], [2], t0=100.0)
    drive_steps(eng.step, eng.has_unfinished, clock, vr.observe_request_output, now=lambda: eng.clock, max_steps=5)
    with pytest.raises(RunnerError, match="produced 1 tokens, 2 were asked for"):
        clock.result()
    # a request of another batch
    eng = ScriptedEngine([(101.0, [request_output("zz", 1, False)])])
    with pytest.raises(RunnerError, match="did not submit"):
        drive_steps(eng.step, eng.has_unfinished, RequestClock(["a"], [1], t0=0),
                    vr.observe_request_output, now=lambda: eng.clock, max_steps=5)
    # never finishing
    with pytest.raises(RunnerError, match="within 3 steps"):
        drive_steps(lambda: [], lambda: True, RequestClock(["a"], [1], t0=0),
                    vr.observe_request_output, now=lambda: 1.0, max_steps=3)
    # the loop ended with a request unfinished
    with pytest.raises(RunnerError, match="unfinished"):
        RequestClock(["a"], [1], t0=0).result()


# -- serving arrivals: the host loop on a clock of its own ------------------------------------------


class VirtualNeuronScheduler:
    """The vllm-neuron plugin's scheduler on a virtual clock, written from its description
    (docs/serving.md) apart from the estimator: a step with a waiting prompt and a free slot
    prefills that one prompt (the TTFT of its bucket); any other step decodes every running
    request (the TBT of the bucket of the longest context). Costs from ``servingkit``."""

    def __init__(self, batch, lin, lout):
        from collections import deque

        from tests.lens import servingkit as kit

        self.kit, self.batch, self.lin, self.lout = kit, batch, lin, lout
        self.t, self.waiting, self.running, self.added = 0.0, deque(), [], {}

    def bucket(self, length):
        from lens.buckets import select

        return select(int(length), (8, 16), "exclusive")

    def add(self, i):
        self.added[i] = self.t
        self.waiting.append([i, int(self.lin[i]), int(self.lout[i]), 0])  # request, l_in, l_out, tokens out

    def has_unfinished(self):
        return bool(self.waiting or self.running)

    def step(self):
        if self.waiting and len(self.running) < self.batch:
            r = self.waiting.popleft()
            self.t += self.kit.TTFT[self.bucket(r[1])]
            r[3] = 1
            if r[2] > 1:
                self.running.append(r)
            return [request_output(str(r[0]), 1, r[2] == 1)]
        self.t += self.kit.TBT[self.bucket(max(r[1] + r[3] for r in self.running))]
        outs = []
        for r in self.running:
            r[3] += 1
            outs.append(request_output(str(r[0]), r[3], r[3] == r[2]))
        self.running = [r for r in self.running if r[3] < r[2]]
        return outs

    def wait(self, deadline):
        self.t = max(self.t, deadline)


@pytest.mark.parametrize("batch,rate", [(1, 0.3), (3, 0.5), (3, 4.0), (4, 1.5)])
def test_served_arrivals_on_the_plugins_scheduler_are_the_machine_predicted(batch, rate):
    """drive_arrivals hands each request over at its arrival and every arrived one before a step:
    on the plugin's scheduler that is the machine lens.serving composes, to rounding."""
    from lens.serving import predict_serving
    from tests.lens import servingkit as kit

    rng = np.random.default_rng(batch * 100 + int(rate * 10))
    n = 60
    lin = rng.integers(1, 12, n)
    lout = np.minimum(rng.integers(1, 9, n), 16 - lin)
    arr = np.concatenate([[0.0], np.cumsum(rng.exponential(1 / rate, n - 1))])
    eng = VirtualNeuronScheduler(batch, lin, lout)
    clock = RequestClock([str(i) for i in range(n)], lout.tolist(), t0=0.0)
    drive_arrivals(eng.add, eng.step, eng.has_unfinished, clock, vr.observe_request_output, arr.tolist(),
                   now=lambda: eng.t, wait=eng.wait, max_steps=10_000)
    served = clock.served(arr)
    assert all(eng.added[i] >= arr[i] for i in range(n))  # never handed over before it arrives
    pred = predict_serving(kit.table(batch), Requests(lin, lout, arr))
    np.testing.assert_allclose(served.ttft_s, pred.ttft_s, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(served.e2e_s, pred.e2e_s, rtol=1e-9, atol=1e-9)
    assert served.wall_s == pytest.approx(pred.total_s)
    assert (pred.queue_s > 0).any() or batch == 1 and rate < 1  # the busy cases did queue


def test_served_arrivals_wait_when_idle_and_count_from_each_arrival():
    eng = VirtualNeuronScheduler(2, np.array([3, 3]), np.array([2, 2]))
    waits = []

    def wait(deadline):
        waits.append(deadline)
        eng.wait(deadline)

    clock = RequestClock(["0", "1"], [2, 2], t0=50.0)
    eng.t = 50.0
    drive_arrivals(eng.add, eng.step, eng.has_unfinished, clock, vr.observe_request_output, [0.0, 10.0],
                   now=lambda: eng.t, wait=wait, max_steps=100)
    tb = clock.served([0.0, 10.0])
    assert waits == [60.0]  # idle after the first request: waits for the second's release
    np.testing.assert_allclose(tb.ttft_s, [1.0, 1.0])  # the bucket-8 prefill, from each arrival
    np.testing.assert_allclose(tb.e2e_s, [1.1, 1.1])
    assert tb.wall_s == pytest.approx(11.1)
    with pytest.raises(RunnerError, match="within 1 steps"):
        eng = VirtualNeuronScheduler(1, np.array([3]), np.array([3]))
        drive_arrivals(eng.add, eng.step, eng.has_unfinished, RequestClock(["0"], [3], t0=0.0),
                       vr.observe_request_output, [0.0], now=lambda: eng.t, wait=eng.wait, max_steps=1)


# -- probes and workloads with a fake engine --------------------------------------------------------

PREFILL_S = 1e-3  # per request, plus PER_TOKEN_S per prompt token
PER_TOKEN_S = 2e-6
STEP_S = 4e-3  # one decode step of the batch


class FakeEngine:
    """A static-batch machine: prompts encoded as the platform does (one by one on neuron; on gpu
    and tpu in one call, every first token at its end), then the batch decodes together."""

    started: list["FakeEngine"] = []
    per_token_s = PER_TOKEN_S

    def __init__(self, spec):
        if "unusable" in str(spec.llm_kwargs["model"]):
            raise FileNotFoundError(f"no model at {spec.llm_kwargs['model']}")
        self.spec = spec
        self.calls: list[tuple[list[list[int]], list[int]]] = []
        self.closed = False
        self.compile_s = 7.0
        FakeEngine.started.append(self)

    def generate_timed(self, prompts, output_lens):
        self.calls.append(([list(p) for p in prompts], list(output_lens)))
        pre = np.cumsum([PREFILL_S + self.per_token_s * len(p) for p in prompts])
        if self.spec.prefill == "batched":
            pre = np.full(len(prompts), pre[-1])
        e2e = pre[-1] + (np.asarray(output_lens) - 1) * STEP_S
        return TimedBatch(pre, e2e, float(e2e.max()), "step")

    def close(self):
        self.closed = True


@pytest.fixture
def fake_runner(monkeypatch, fake_sdk):
    FakeEngine.started = []
    monkeypatch.setattr(vr.VllmRunner, "engine_class", FakeEngine)
    monkeypatch.setattr(vr.VllmRunner, "one_unit_per_process", False)  # FakeEngine.started is this process's
    r = get_runner(target(shape=SMALL, warmup=1))
    yield r
    r.close()


def test_profile_runs_each_probe_as_a_full_batch(fake_runner):
    r = fake_runner
    buckets = (64, 128, 256)
    probes = plan_probes(buckets, policy="inclusive", max_output=32, repeats=3)
    res = r.profile(Unit(r.target, 1, 4), probes)
    assert len(FakeEngine.started) == 1
    eng = FakeEngine.started[0]
    assert eng.spec.llm_kwargs["max_num_seqs"] == 4 and eng.spec.llm_kwargs["max_model_len"] == 257
    assert res.compile_s == 7.0 and res.versions["vllm"] == "0.11.test" and not res.simulated
    # one warm-up per bucket, then `repeats` timed runs per probe
    assert len(eng.calls) == len(buckets) + 3 * len(probes)
    for prompts, outs in eng.calls:
        assert len(prompts) == 4 and len(set(map(len, prompts))) == 1 and len(set(outs)) == 1
        assert all(1 <= tok < SMALL.vocab for p in prompts for tok in p)
    assert [len(run.times_s) for run in res.runs] == [3] * len(probes)
    assert res.run_s == pytest.approx(sum(sum(run.times_s) for run in res.runs)
                                      + sum(res.runs[2 * k].times_s[0] for k in range(len(buckets))))
    # the solve recovers the fake machine's batch prefill (one call on gpu) and decode step
    prof = solve(res.runs, batch=4, prefill=r.target.prefill)
    for p in probes:
        assert prof[p.bucket].tbt_s == pytest.approx(STEP_S)
        assert prof[p.bucket].ttft_s == pytest.approx(4 * (PREFILL_S + PER_TOKEN_S * p.input_len))


def test_engine_is_reused_for_the_same_configuration_and_replaced_otherwise(fake_runner):
    r = fake_runner
    probes = plan_probes((64, 128), policy="inclusive", max_output=8, repeats=1)
    first = r.profile(Unit(r.target, 1, 2), probes)
    again = r.profile(Unit(r.target, 1, 2), probes)
    assert len(FakeEngine.started) == 1 and first.compile_s == 7.0 and again.compile_s == 0.0
    n_calls = len(FakeEngine.started[0].calls)
    assert n_calls == 2 + 2 * 2 + 2 * 2  # warm-ups only the first time
    r.profile(Unit(r.target, 1, 4), probes)
    assert len(FakeEngine.started) == 2 and FakeEngine.started[0].closed and not FakeEngine.started[1].closed
    assert [rec.batch for rec in r.engine_log] == [2, 4]
    r.close()
    assert FakeEngine.started[1].closed


def test_profile_rejects_probes_that_leave_their_bucket(fake_runner):
    r = fake_runner
    with pytest.raises(UserError, match="runs in bucket 128, not 64"):
        r.profile(Unit(r.target, 1, 1), [Probe(bucket=64, input_len=70, output_len=2, repeats=1),
                                         Probe(bucket=128, input_len=100, output_len=2, repeats=1)])
    with pytest.raises(UserError, match="probe 0 \\(bucket 64\\): input 10 \\+ output 60 .* fits no token-generation"):
        r.profile(Unit(r.target, 1, 1), [Probe(bucket=64, input_len=10, output_len=60, repeats=1)])
    with pytest.raises(UserError, match="at least one probe"):
        r.profile(Unit(r.target, 1, 1), [])
    assert FakeEngine.started == []  # nothing started for a bad request


def test_workload_runs_in_order_in_static_batches(fake_runner):
    r = fake_runner
    lin = np.array([10, 50, 100, 3, 200, 60, 7])
    lout = np.array([5, 1, 20, 9, 30, 2, 4])
    cand = Candidate(1, 3, (64, 128, 256), (64, 128, 256))
    run = r.run_workload(cand, Requests(lin, lout))
    eng = FakeEngine.started[0]
    timed = eng.calls[1:]  # the first call warms the engine on the first batch
    assert eng.calls[0][1] == [5, 1, 20]
    assert [[len(p) for p in prompts] for prompts, _ in timed] == [[10, 50, 100], [3, 200, 60], [7]]
    assert [outs for _, outs in timed] == [[5, 1, 20], [9, 30, 2], [4]]
    exp_ttft, exp_e2e, total = [], [], 0.0
    for s in range(0, 7, 3):
        pre = np.sum(PREFILL_S + PER_TOKEN_S * lin[s:s + 3])  # one call on gpu: every first token at its end
        e2e = pre + (lout[s:s + 3] - 1) * STEP_S
        exp_ttft += [pre] * len(e2e)
        exp_e2e += list(e2e)
        total += e2e.max()
    np.testing.assert_allclose(run.ttft_s, exp_ttft)
    np.testing.assert_allclose(run.e2e_s, exp_e2e)
    assert run.total_s == pytest.approx(total)
    assert run.run_s > run.total_s  # the warm-up batch is hardware time too
    assert run.compile_s == 7.0 and r.last_ttft_sources == ("step",)
    # the same candidate again: the warm engine is neither restarted nor warmed again
    again = r.run_workload(cand, Requests(lin[:3], lout[:3]))
    assert again.compile_s == 0.0 and len(FakeEngine.started) == 1 and len(eng.calls) == 5


def test_workload_rejects_requests_that_fit_no_bucket(fake_runner):
    r = fake_runner
    cand = Candidate(1, 2, (64, 128), (64, 128))
    with pytest.raises(UserError, match="request 1: input of 129 tokens fits no context-encoding bucket"):
        r.run_workload(cand, Requests([5, 129], [2, 2]))
    with pytest.raises(UserError, match="reaches context 130"):
        r.run_workload(cand, Requests([100], [31]))
    with pytest.raises(UserError, match="tp = 3 does not divide"):
        r.run_workload(Candidate(3, 1, (64,), (64,)), Requests([5], [2]))


def test_sdk_failures_become_runner_errors(fake_runner, monkeypatch):
    class Broken(FakeEngine):
        def __init__(self, spec):
            raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(vr.VllmRunner, "engine_class", Broken)
    with pytest.raises(RunnerError, match="starting the engine for tp 1, batch 1 failed: RuntimeError: CUDA out of memory"):
        fake_runner.run_workload(Candidate(1, 1, (64,), (64,)), Requests([5], [2]))


# -- the real engine boundary against a fake vLLM that behaves like the current one ---------------

#: A stand-in for the ``vllm`` package with the behaviours the runner must survive:
#: - the V1 engine core runs in its own process unless VLLM_ENABLE_V1_MULTIPROCESSING=0, and
#:   starts a step as soon as one request is queued (FAKE_VLLM_ALWAYS_MP=1 models an engine
#:   that ignores the variable);
#: - chunked prefill is always on: a step schedules running decodes first, then prompts
#:   (whole or in part) while the token budget (max_num_batched_tokens, default 8192) lasts;
#: - outputs carry V1 metrics, which have no first_token_time;
#: - EngineArgs rejects arguments it does not know (override_neuron_config is one);
#: - on the Neuron platform (FAKE_VLLM_PLATFORM=neuron) the plugin ignores load_format and
#:   needs *.safetensors in the model folder, and its scheduler encodes one prompt per step.
#: STEP_LOG records, per step, (request id, "prefill"/"decode", tokens, first token out);
#: ADD_LOG, per add_request, (request id, time.perf_counter()).
FAKE_VLLM_SRC = """
import glob, os, time
from types import SimpleNamespace

STEP_LOG = []
ADD_LOG = []
#: what a step costs on the wall clock (the runner times the engine by it): a fixed part and a part
#: per prompt token. Without it a step is microseconds of Python, and a probe's solve reads the
#: scheduler's noise (a negative TTFT once in a suite run on a 2-core host).
STEP_S, PROMPT_TOKEN_S = 1e-3, 1e-5
ENGINE_ARGS = {"load_format", "skip_tokenizer_init", "tensor_parallel_size", "max_num_seqs", "max_model_len",
               "max_num_batched_tokens", "dtype", "seed", "enable_prefix_caching", "disable_log_stats",
               "gpu_memory_utilization", "compilation_config", "enforce_eager", "quantization",
               "additional_config", "num_gpu_blocks_override"}


class SamplingParams:
    def __init__(self, *, temperature=1.0, max_tokens=16, min_tokens=0, ignore_eos=False, detokenize=True):
        self.max_tokens = max_tokens


class _Req:
    def __init__(self, rid, n_prompt, max_tokens):
        self.rid, self.n_prompt, self.max_tokens, self.done_prompt, self.out = rid, n_prompt, max_tokens, 0, 0


class InprocClient:
    def shutdown(self):
        pass


class SyncMPClient(InprocClient):
    pass


class _Engine:
    def __init__(self, platform, mp, budget, max_seqs):
        self.platform, self.mp, self.budget, self.max_seqs = platform, mp, budget, max_seqs
        self.engine_core = SyncMPClient() if mp else InprocClient()
        self.waiting, self.running, self.pending = [], [], []

    def add_request(self, rid, prompt, params):
        ADD_LOG.append((rid, time.perf_counter()))
        idle = not (self.waiting or self.running or self.pending)
        self.waiting.append(_Req(rid, len(prompt["prompt_token_ids"]), params.max_tokens))
        if self.mp and idle:  # the core process picks the request up at once
            self.pending.append(self._step())

    def has_unfinished_requests(self):
        return bool(self.waiting or self.running or self.pending)

    def step(self):
        return self.pending.pop(0) if self.pending else self._step()

    def _emit(self, r, log, kind, n):
        r.out += 1
        log.append((r.rid, kind, n, r.out == 1))
        done = r.out >= r.max_tokens
        stats = SimpleNamespace(arrival_time=0.0, first_token_ts=0.0)  # V1: no first_token_time
        return SimpleNamespace(request_id=r.rid, outputs=[SimpleNamespace(token_ids=[7] * r.out)], finished=done,
                               metrics=stats), done

    def _step(self):
        log = []
        outs = self._schedule(log)
        STEP_LOG.append(log)
        time.sleep(STEP_S + PROMPT_TOKEN_S * sum(n for _, kind, n, _ in log if kind == "prefill"))
        return outs

    def _schedule(self, log):
        outs, budget, still = [], self.budget, []
        if self.platform == "neuron" and self.waiting and len(self.running) < self.max_seqs:
            # one whole prompt per step into a free sequence slot, the running decodes held back
            r = self.waiting.pop(0)
            r.done_prompt = r.n_prompt
            o, done = self._emit(r, log, "prefill", r.n_prompt)
            outs.append(o)
            if not done:
                self.running.append(r)
            return outs
        for r in self.running:
            o, done = self._emit(r, log, "decode", 1)
            budget -= 1
            outs.append(o)
            if not done:
                still.append(r)
        self.running = still
        while self.waiting and budget > 0 and len(self.running) < self.max_seqs:
            r = self.waiting[0]
            n = min(r.n_prompt - r.done_prompt, budget)
            r.done_prompt += n
            budget -= n
            if r.done_prompt < r.n_prompt:  # a chunk: no token yet, the rest next step
                log.append((r.rid, "prefill", n, False))
                break
            self.waiting.pop(0)
            o, done = self._emit(r, log, "prefill", n)
            outs.append(o)
            if not done:
                self.running.append(r)
        return outs


class LLM:
    def __init__(self, model, **kw):
        bad = sorted(set(kw) - ENGINE_ARGS)
        if bad:
            raise TypeError(f"EngineArgs.__init__() got an unexpected keyword argument {bad[0]!r}")
        platform = os.environ.get("FAKE_VLLM_PLATFORM", "gpu")
        if platform == "neuron" and not glob.glob(os.path.join(model, "*.safetensors")):
            raise FileNotFoundError(f"no *.safetensors in {model}: the Neuron plugin loads the checkpoint itself")
        mp = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0" or os.environ.get("FAKE_VLLM_ALWAYS_MP") == "1"
        budget = 131072 if platform == "neuron" else kw.get("max_num_batched_tokens") or 8192
        self.llm_engine = _Engine(platform, mp, budget, kw["max_num_seqs"])
"""


@pytest.fixture
def fake_vllm(monkeypatch, fake_sdk):
    """The fake vLLM package in place of ``vllm``, the real ``_VllmEngine`` in this process."""
    mod = types.ModuleType("vllm")
    exec(FAKE_VLLM_SRC, mod.__dict__)
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setattr(vr.VllmRunner, "one_unit_per_process", False)  # reads mod.STEP_LOG here
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    return mod


def prefill_steps(step_log, rids):
    """The indices of the steps in which the first token of each of ``rids`` came out."""
    return {i for i, log in enumerate(step_log) for rid, kind, _, first in log if first and rid in rids}


def batches_of(step_log, batch):
    """Request ids (lensopt-<n>) grouped by the batch they were submitted in."""
    ids = sorted({rid for log in step_log for rid, *_ in log}, key=lambda r: int(r.split("-")[1]))
    return [set(ids[i:i + batch]) for i in range(0, len(ids), batch)]


def test_a_batch_is_queued_whole_before_the_first_step(fake_vllm):
    r = get_runner(target(shape=SMALL, warmup=0))
    try:
        r.profile(Unit(r.target, 1, 4), plan_probes((64, 128), policy="inclusive", max_output=8, repeats=1))
        r.run_workload(Candidate(1, 4, (64, 128), (64, 128)), Requests([10, 100, 30, 5, 60], [3, 1, 6, 2, 4]))
    finally:
        r.close()
    groups = batches_of(fake_vllm.STEP_LOG, 4)
    assert len(groups) == 4 + 2
    for rids in groups:  # every prompt of a batch is encoded in one step, not request 0 alone
        assert len(prefill_steps(fake_vllm.STEP_LOG, rids)) == 1, rids
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ  # set for the engine only


def test_the_token_budget_keeps_a_large_batch_in_one_step(fake_vllm, monkeypatch):
    # 8 prompts of up to 2048 tokens: vLLM's default budget (8192 here) would chunk them over steps
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the budget alone, apart from the queueing race
    r = get_runner(target(shape=SMALL, warmup=0))
    lin = [2000, 1500, 1900, 1100, 2048, 1700, 1300, 1999]
    try:
        r.run_workload(Candidate(1, 8, (1024, 2048), (1024, 2048, 4096)), Requests(lin, [2] * 8))
    finally:
        r.close()
    assert len(prefill_steps(fake_vllm.STEP_LOG, batches_of(fake_vllm.STEP_LOG, 8)[0])) == 1
    assert not any(kind == "prefill" and not first for log in fake_vllm.STEP_LOG for _, kind, _, first in log)


def test_an_engine_that_steps_before_the_batch_is_queued_is_refused(fake_vllm, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_ALWAYS_MP", "1")
    r = get_runner(target(shape=SMALL, warmup=0))
    try:
        with pytest.raises(RunnerError, match="4 prompts of a batch were encoded over 2 engine steps"):
            r.run_workload(Candidate(1, 4, (64, 128), (64, 128)), Requests([10, 100, 30, 5], [3, 1, 6, 2]))
    finally:
        r.close()


def test_neuron_platform_writes_a_random_checkpoint_and_prefills_one_prompt_a_step(fake_vllm, monkeypatch, tmp_path):
    from runners import _model_dir

    monkeypatch.setenv("FAKE_VLLM_PLATFORM", "neuron")
    r = get_runner(target("inf2", shape=SMALL, warmup=0, artifacts_dir=str(tmp_path)))
    try:
        run = r.run_workload(Candidate(1, 2, (64, 128), (64, 128)), Requests([10, 100, 30], [3, 2, 4]))
    finally:
        r.close()
    assert (run.e2e_s >= run.ttft_s).all()
    ck = r.checkpoint_dir()
    head = _model_dir.read_header(ck / "model.safetensors")
    assert head["model.embed_tokens.weight"]["shape"] == [SMALL.vocab, SMALL.hidden]
    assert head["model.layers.1.mlp.down_proj.weight"] == {
        "dtype": "BF16", "shape": [SMALL.hidden, SMALL.intermediate],
        "data_offsets": head["model.layers.1.mlp.down_proj.weight"]["data_offsets"]}
    assert json.loads((ck / "config.json").read_text())["num_hidden_layers"] == SMALL.layers
    # the plugin's scheduler: each prompt in a step of its own
    for rids in batches_of(fake_vllm.STEP_LOG, 2):
        assert len(prefill_steps(fake_vllm.STEP_LOG, rids)) == len(rids)


def test_neuron_platform_serves_arrivals_through_the_engine(fake_vllm, monkeypatch, tmp_path):
    """Continuous mode through the real engine boundary on the plugin's scheduler (the fake
    vLLM): no request is handed over before its arrival, first tokens come in arrival order,
    a request beyond the slots waits for one, and times count from each arrival."""
    monkeypatch.setenv("FAKE_VLLM_PLATFORM", "neuron")
    r = get_runner(target("inf2", shape=SMALL, warmup=0, artifacts_dir=str(tmp_path)))
    lin, lout = [10, 100, 30, 12, 5], [3, 2, 4, 1, 3]
    arr = [0.0, 0.0, 0.0, 0.0, 0.08]
    try:
        assert "continuous" in r.modes
        run = r.run_workload(Candidate(1, 2, (64, 128), (64, 128)), Requests(lin, lout, arr), mode="continuous")
    finally:
        r.close()
    assert run.mode == "continuous" and not run.simulated
    assert (run.ttft_s > 0).all() and (run.e2e_s >= run.ttft_s).all()
    assert run.e2e_s[3] == pytest.approx(run.ttft_s[3])  # a one-token request ends at its first token
    adds = dict(fake_vllm.ADD_LOG)
    ids = sorted(adds, key=lambda rid: int(rid.split("-")[1]))
    t0 = adds[ids[0]]
    # the late one is handed over at its arrival (the run's origin is a hair before the first hand-over)
    assert 0.08 - 1e-3 <= adds[ids[4]] - t0 < 0.08 + 0.05
    assert run.total_s >= 0.08 + run.e2e_s[4]
    first = [next(i for i, log in enumerate(fake_vllm.STEP_LOG) for rid_, _, _, f in log if f and rid_ == rid)
             for rid in ids]
    assert first == sorted(first)  # FIFO
    done1 = max(i for i, log in enumerate(fake_vllm.STEP_LOG) for rid_, _, _, _ in log if rid_ in ids[:2])
    assert first[2] > min(first[:2]) and first[2] <= done1 + 1  # the third took a freed slot
    assert all(sum(kind == "decode" for _, kind, _, _ in log) <= 2 for log in fake_vllm.STEP_LOG)


def test_a_served_run_crosses_the_engine_process(fake_sdk, monkeypatch, tmp_path):
    """Continuous mode as it runs for real: the engine in a child process of its own, the
    arrivals and the per-request times over its socket."""
    pkg = tmp_path / "site" / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(FAKE_VLLM_SRC)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))  # the child imports from the parent's path
    monkeypatch.setenv("FAKE_VLLM_PLATFORM", "neuron")
    assert vr.VllmRunner.one_unit_per_process
    r = get_runner(target("inf2", shape=SMALL, warmup=1, artifacts_dir=str(tmp_path / "art")))
    reqs = Requests([10, 100, 30], [3, 2, 4], [0.0, 0.0, 0.05])
    try:
        run = r.run_workload(Candidate(1, 2, (64, 128), (64, 128)), reqs, mode="continuous")
        pid = r._engine.pid
    finally:
        r.close()
    assert pid != os.getpid() and run.mode == "continuous"
    assert (run.ttft_s > 0).all() and (run.e2e_s >= run.ttft_s).all() and run.total_s >= 0.05


@pytest.mark.parametrize("key,value,fix", [("prefill_priority", "decode", 'prefill_priority = "prefill"'),
                                           ("max_prefills", 1, "max_prefills = 0")])
def test_continuous_mode_on_neuron_needs_the_plugins_scheduler(key, value, fix):
    from lens.types import Scheduler

    t = target("inf2", shape=SMALL)
    t = Target(**{**t.__dict__, "serving": "continuous", "scheduler": Scheduler(**{key: value})})
    with pytest.raises(UserError, match=rf"\[target.scheduler\] {key} = .*set {re.escape(fix)}"):
        get_runner(t)
    assert get_runner(Target(**{**t.__dict__, "scheduler": Scheduler()})).modes == ("static", "continuous")


def test_continuous_mode_on_a_gpu_is_refused_with_the_reason(fake_runner):
    assert fake_runner.modes == ("static",)
    reqs = Requests([10, 20], [2, 2], [0.0, 0.1])
    with pytest.raises(UserError, match=r"\(gpu\): continuous mode is not measured here: .*mixed step.*"
                                        r'serving = "static"'):
        fake_runner.run_workload(Candidate(1, 2, (64, 128), (64, 128)), reqs, mode="continuous")
    t = Target(**{**fake_runner.target.__dict__, "serving": "continuous"})
    with pytest.raises(UserError, match="chunked prefill"):
        get_runner(t)
    assert get_runner(target("tpu-v6e", shape=SMALL)).modes == ("static", "continuous")  # batch 1: one slot


def test_the_loader_names_the_file_of_a_continuous_target_vllm_does_not_serve(tmp_path):
    from lens.errors import SpaceError
    from spaces import load_space

    text = (ROOT / "spaces" / "vllm-gpu-example.toml").read_text()
    assert text.index("seed = 0\n") < text.index("[target.model]") and "requests = 200\n" in text
    p = tmp_path / "gpu-serving.toml"
    p.write_text(text.replace("seed = 0\n", 'seed = 0\nserving = "continuous"\n', 1)
                 .replace("requests = 200\n", "requests = 200\narrival_rate = 2.0\n", 1))
    with pytest.raises(SpaceError, match=re.escape(str(p)) + r".*continuous mode is not measured here"):
        load_space(p)


def test_pyproject_extras_pin_the_runners_ranges():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra, platform in (("vllm", "gpu"), ("vllm-tpu", "tpu"), ("vllm-neuron", "neuron")):
        lo, hi = vr.TESTED_VLLM[platform]
        assert extras[extra] == [f"{'vllm-tpu' if platform == 'tpu' else 'vllm'}>={lo},<{hi}"], extra


def test_untested_vllm_versions_are_refused_unless_allowed(fake_sdk):
    fake_sdk["vllm"] = "0.9.2"
    r = get_runner(target())
    with pytest.raises(RunnerUnavailable, match="gpu platform is written against vLLM >=0.11,<0.34, and vLLM 0.9.2"):
        r.require_sdk()
    get_runner(target(allow_untested_vllm=True)).require_sdk()
    fake_sdk["vllm"] = "0.33.1"
    get_runner(target()).require_sdk()
    with pytest.raises(RunnerUnavailable, match="neuron platform is written against vLLM >=0.11,<0.12"):
        get_runner(target("inf2")).require_sdk()
    fake_sdk["vllm"] = "0.11.0"
    get_runner(target("inf2")).require_sdk()
    del fake_sdk["vllm-neuron"]
    with pytest.raises(RunnerUnavailable, match="needs the vLLM Neuron plugin"):
        get_runner(target("inf2")).require_sdk()


# -- model folders -------------------------------------------------------------------------------


def test_llama_config_and_model_dir(tmp_path):
    cfg = host.llama_hf_config(SHAPE, dtype="bfloat16", max_position=2049)
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_key_value_heads"] == 8
    assert cfg["hidden_size"] == 2048 and cfg["head_dim"] == 64 and cfg["max_position_embeddings"] == 2049
    assert "eos_token_id" not in cfg
    d = host.write_llama_model_dir(tmp_path / "m", SHAPE, max_position=2049)
    assert json.loads((d / "config.json").read_text()) == cfg
    assert host.write_llama_model_dir(tmp_path / "m", SHAPE, max_position=2049) == d  # same content: fine
    with pytest.raises(UserError, match="another model configuration"):
        host.write_llama_model_dir(tmp_path / "m", SMALL)


# -- the GPU check script ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_check():
    path = ROOT / "benchmarks" / "gpu" / "vllm_check.py"
    spec_ = importlib.util.spec_from_file_location("vllm_check", path)
    mod = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(mod)
    return mod


def test_check_script_pure_parts(vllm_check):
    assert vllm_check.parse_units("1x1, 1x4,2X8") == [(1, 1), (1, 4), (2, 8)]
    with pytest.raises(UserError):
        vllm_check.parse_units("1x")
    assert vllm_check.parse_buckets("128,256") == (128, 256)
    rng = np.random.default_rng(0)
    buckets = (128, 256, 512)
    avoid = {(129, 5)}
    req = vllm_check.held_out_requests(rng, buckets, "inclusive", 300, max_output=64, avoid=avoid)
    assert len(req) == 300
    assert (req.input_len >= 1).all() and (req.input_len <= 512).all()
    assert (req.output_len >= 1).all() and (req.output_len <= 64).all()
    assert (req.input_len + req.output_len - 1 <= 512).all()
    assert not any((int(a), int(b)) in avoid for a, b in zip(req.input_len, req.output_len))
    per_bucket = np.bincount(np.searchsorted(buckets, req.input_len), minlength=3)
    assert (per_bucket > 60).all()  # spread over every bucket
    st = vllm_check.error_stats([0.01, -0.02, 0.10])
    assert st["mean"] == pytest.approx(13 / 3) and st["max"] == pytest.approx(10) and st["under5"] == pytest.approx(200 / 3)
    t = vllm_check.make_target("/m")
    assert t.runner == "vllm" and dict(t.options)["load_format"] == "dummy" and dict(t.options)["platform"] == "gpu"
    get_runner(t)  # its options pass the runner's schema


def test_check_script_end_to_end_with_a_fake_engine(vllm_check, monkeypatch, tmp_path, fake_sdk, capsys):
    class FlatEngine(FakeEngine):  # prefill cost independent of the prompt length
        per_token_s = 0.0

    FakeEngine.started = []
    monkeypatch.setattr(vr.VllmRunner, "engine_class", FlatEngine)
    monkeypatch.setattr(vr.VllmRunner, "one_unit_per_process", False)
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))  # the script checks for vLLM first
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    rc = vllm_check.main(["--units", "1x1,1x4", "--buckets", "64,128,256", "--batches", "2", "--runs", "2",
                          "--repeats", "2", "--max-output", "16", "--held-out-output", "32",
                          "--model-dir", str(tmp_path / "model")])
    assert rc == 0
    text = capsys.readouterr().out
    assert "E2E mean %" in text and "tp1 b4" in text and "all" in text
    assert json.loads((tmp_path / "model" / "config.json").read_text())["num_hidden_layers"] == 16
    rows = list(csv.DictReader(open(tmp_path / "out" / "vllm_check.csv")))
    assert len(rows) == 2 * 1 + 2 * 4
    assert {"e2e_err_static", "e2e_err_ragged", "ttft_err_static"} <= set(rows[0])
    prof = list(csv.DictReader(open(tmp_path / "out" / "vllm_check_profiles.csv")))
    assert len(prof) == 2 * 3
    # a flat static-batch machine is what the static mode composes: its E2E and TTFT are exact
    assert max(abs(float(r["e2e_err_static"])) for r in rows) < 1e-6
    assert max(abs(float(r["ttft_err_static"])) for r in rows) < 1e-6
    assert len(FakeEngine.started) == 2 and all(e.closed for e in FakeEngine.started)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_check_script_without_vllm_says_so_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "vllm_check.py"),
                           "--model-dir", str(tmp_path / "m")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "needs vLLM, which is not installed here" in lines[0] and "NVIDIA GPU host" in lines[0]
    assert "check.py" in lines[0] and not (tmp_path / "m").exists()


def test_check_script_writes_only_the_model_dir(vllm_check, tmp_path):
    assert vllm_check.main(["--write-model-dir", str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / "config.json").exists()


# -- real hardware ----------------------------------------------------------------------------------


def _has_vllm_gpu() -> bool:
    return importlib.util.find_spec("vllm") is not None and Path("/proc/driver/nvidia/gpus").is_dir() and \
        any(Path("/proc/driver/nvidia/gpus").iterdir())


@pytest.mark.gpu
@pytest.mark.skipif(not _has_vllm_gpu(), reason="needs vllm and an NVIDIA GPU")
def test_real_vllm_engine_on_a_gpu(tmp_path):
    model = host.write_llama_model_dir(tmp_path / "tiny", SMALL, max_position=257)
    t = Target(name="gpu-smoke", runner="vllm", hardware="gpu", bucket_policy="inclusive", dtype="bfloat16",
               model=SMALL, options=(("gpu_memory_utilization", 0.3), ("model", str(model))))
    r = get_runner(t)
    try:
        res = r.profile(Unit(t, 1, 2), plan_probes((64, 128, 256), policy="inclusive", max_output=16, repeats=2))
        prof = solve(res.runs, batch=2)
        assert all(p.tbt_s > 0 and p.ttft_s > 0 for p in prof.values())
        run = r.run_workload(Candidate(1, 2, (64, 128, 256), (64, 128, 256)), Requests([10, 200, 60], [5, 40, 1]))
        assert (run.e2e_s >= run.ttft_s).all() and (run.ttft_s > 0).all()
        assert "vllm" in r.versions() and "cuda" in r.versions()
    finally:
        r.close()


# -- the conformance suite -------------------------------------------------------------------------

from runners.conformance import RunnerConformance  # noqa: E402

#: a tiny model every GPU attention backend takes (head_dim 64)
CONF_MODEL = ModelShape(layers=2, hidden=256, heads=4, kv_heads=2, intermediate=512, vocab=1024)


def _conformance_model_dir(shape: ModelShape) -> str:
    import tempfile

    from lens.types import stable_hash

    d = Path(tempfile.gettempdir()) / "lensopt-vllm-conformance" / stable_hash(shape.to_dict(), n=12)
    return str(host.write_llama_model_dir(d, shape, max_position=1024))


class TestVllmFlowConformance(RunnerConformance):
    """The shared runner flow of ``vllm`` (options, engines, probes, workloads) with a fake engine."""

    model = CONF_MODEL

    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def _fake_backend(cls):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(vr.VllmRunner, "engine_class", FakeEngine)
            mp.setattr(vr.VllmRunner, "one_unit_per_process", False)
            mp.setattr(vr, "sdk_versions", lambda platform: dict(FAKE_VERSIONS))
            yield

    prefills = ("batched",)  # vLLM on a GPU encodes a batch's prompts in one step

    def make_target(self, *, model: ModelShape | None = None, policy: str = "exclusive") -> Target:
        return Target(name="conformance-vllm-fake", runner="vllm", hardware="gpu", bucket_policy=policy,
                      dtype="bfloat16", model=model or self.model, options=(("model", "/fake/model"),),
                      prefill="batched")

    def make_unusable_target(self) -> Target:
        return Target(name="conformance-vllm-fake", runner="vllm", hardware="gpu", bucket_policy="exclusive",
                      dtype="bfloat16", model=self.model, options=(("model", "/fake/unusable"),), prefill="batched")


@pytest.mark.gpu
@pytest.mark.skipif(not _has_vllm_gpu(), reason="needs vllm and an NVIDIA GPU")
class TestVllmGpuConformance(RunnerConformance):
    """The conformance suite on a real GPU through vLLM (random weights, a tiny model)."""

    model = CONF_MODEL

    prefills = ("batched",)

    def make_target(self, *, model: ModelShape | None = None, policy: str = "exclusive") -> Target:
        m = model or self.model
        return Target(name="conformance-vllm-gpu", runner="vllm", hardware="gpu", bucket_policy=policy,
                      dtype="bfloat16", model=m, prefill="batched",
                      options=(("gpu_memory_utilization", 0.3), ("model", _conformance_model_dir(m))))

    def make_unusable_target(self) -> Target:
        return Target(name="conformance-vllm-missing", runner="vllm", hardware="gpu", bucket_policy="exclusive",
                      dtype="bfloat16", model=self.model, prefill="batched",
                      options=(("gpu_memory_utilization", 0.3), ("model", "/nonexistent/lensopt-no-model")))


class TestVllmNeuronEngineConformance(RunnerConformance):
    """The real engine boundary (``_VllmEngine``) on the neuron platform against the fake vLLM
    package and its plugin scheduler: static batches and continuous serving of arrivals."""

    model = SMALL
    policies = ("exclusive",)  # NxD Inference's rule
    prefills = ("sequential",)  # the plugin encodes one prompt per step

    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def _fake_backend(cls, tmp_path_factory):
        mod = types.ModuleType("vllm")
        exec(FAKE_VLLM_SRC, mod.__dict__)
        cls.artifacts = str(tmp_path_factory.mktemp("vllm-neuron-artifacts"))
        with pytest.MonkeyPatch.context() as mp:
            mp.setitem(sys.modules, "vllm", mod)
            mp.setenv("FAKE_VLLM_PLATFORM", "neuron")
            mp.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
            mp.setattr(vr.VllmRunner, "one_unit_per_process", False)
            mp.setattr(vr, "sdk_versions", lambda platform: dict(FAKE_VERSIONS))
            yield

    def make_target(self, *, model: ModelShape | None = None, policy: str = "exclusive") -> Target:
        return Target(name="conformance-vllm-neuron-fake", runner="vllm", hardware="inf2", bucket_policy=policy,
                      dtype="bfloat16", model=model or self.model, prefill="sequential",
                      options=(("artifacts_dir", self.artifacts), ("warmup", 0)))

    def make_unusable_target(self) -> Target:
        # real weights from a folder without a checkpoint: the plugin fails when the engine starts
        return Target(name="conformance-vllm-neuron-missing", runner="vllm", hardware="inf2",
                      bucket_policy="exclusive", dtype="bfloat16", model=self.model, prefill="sequential",
                      options=(("artifacts_dir", self.artifacts), ("load_format", "auto"),
                               ("model", "/nonexistent/lensopt-no-model")))
