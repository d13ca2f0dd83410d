"""The neuron runner (NxD Inference): NeuronConfig building, per-unit artifact folders and their
reuse, deploy snippet, fingerprints, batch and policy checks, random checkpoints, and the probe
/ workload flow and the conformance suite against a fake engine.  The real engine boundary
(``_NxdEngine``) runs in child processes against a fake Neuron SDK written to disk, and on the
real SDK only in the ``neuron``-marked tests, on an Inferentia/Trainium host."""
from __future__ import annotations

import importlib.util
import json
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest

from lens.errors import RunnerError, RunnerUnavailable, UserError
from lens.probes import plan_probes, solve
from lens.types import Candidate, ModelShape, Requests, Target, Unit
from runners import get_runner
from runners import neuron as nr
from runners._engine_timing import times_from_steps

ROOT = Path(__file__).resolve().parents[2]
SHAPE = ModelShape(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=128256)
SMALL = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=500)
FAKE_VERSIONS = {"python": "3.x", "neuronx-cc": "2.0.test", "torch-neuronx": "2.x", "neuronx-distributed-inference": "0.x"}


def target(*, shape=SHAPE, dtype="bfloat16", hardware="inf2", policy="exclusive", prefill="sequential",
           **opts) -> Target:
    if "model" not in opts and "random_weights" not in opts:
        opts["model"] = "/models/llama"
    return Target(name="n", runner="neuron", hardware=hardware, bucket_policy=policy, dtype=dtype, model=shape,
                  options=tuple(sorted(opts.items())), prefill=prefill)


@pytest.fixture
def fake_sdk(monkeypatch):
    versions = dict(FAKE_VERSIONS)
    monkeypatch.setattr(nr, "sdk_versions", lambda: dict(versions))
    return versions


# -- NeuronConfig ------------------------------------------------------------------------------


def test_neuron_config_kwargs():
    kw = nr.neuron_config_kwargs(tp=8, batch=4, ctx=(128, 512, 1024), tkg=(512, 2048), dtype="bfloat16")
    assert kw == {
        "tp_degree": 8, "batch_size": 4, "ctx_batch_size": 1, "tkg_batch_size": 4, "is_continuous_batching": True,
        "seq_len": 2048, "max_context_length": 1024, "torch_dtype": "bfloat16", "padding_side": "right",
        "enable_bucketing": True, "context_encoding_buckets": [128, 512, 1024], "token_generation_buckets": [512, 2048],
        "on_device_sampling_config": {"top_k": 1},
    }
    whole = nr.neuron_config_kwargs(tp=2, batch=4, ctx=(128,), tkg=(128,), dtype="float16", batched_prefill=True,
                                    on_device_sampling=False)
    assert whole["ctx_batch_size"] == 4 and whole["is_continuous_batching"] is False
    assert "on_device_sampling_config" not in whole
    # batch 1: context and decode batches agree, no continuous-batching layout needed
    assert nr.neuron_config_kwargs(tp=1, batch=1, ctx=(128,), tkg=(128,), dtype="bfloat16")["is_continuous_batching"] is False
    with pytest.raises(UserError, match="dtype 'fp8'"):
        nr.neuron_config_kwargs(tp=1, batch=1, ctx=(128,), tkg=(128,), dtype="fp8")


def test_deploy_snippet_round_trips():
    r = get_runner(target())
    cand = Candidate(4, 8, (128, 512), (256, 512, 1024))
    files = r.deploy_snippets(cand)
    assert json.loads(files["config.json"])["batch_size"] == 8
    cfg = json.loads(files["neuron_config.json"])
    assert cfg == nr.deploy_config(r.target, r.opts, cand)
    assert cfg["tp_degree"] == 4 and cfg["batch_size"] == 8 and cfg["seq_len"] == 1024
    assert cfg["context_encoding_buckets"] == [128, 512] and cfg["token_generation_buckets"] == [256, 512, 1024]
    assert json.loads(json.dumps(cfg)) == cfg


# -- options ---------------------------------------------------------------------------------------


def test_option_errors():
    with pytest.raises(UserError, match="needs \\[target.options\\] model"):
        get_runner(Target(name="n", runner="neuron", hardware="inf2", bucket_policy="exclusive", dtype="bfloat16",
                          model=SHAPE))
    with pytest.raises(UserError, match="family = 'mixtral' is unknown"):
        get_runner(target(family="mixtral"))
    with pytest.raises(UserError, match="not both"):
        get_runner(target(model="/m", random_weights=True))
    with pytest.raises(UserError, match="dtype 'fp8'"):
        get_runner(target(dtype="fp8"))
    with pytest.raises(UserError, match="unknown option 'tp_degree'"):
        get_runner(target(tp_degree=8))
    r = get_runner(target())
    with pytest.raises(UserError, match="does not divide model.heads"):
        r.check_unit(Unit(r.target, 5, 1))


# -- artifacts -----------------------------------------------------------------------------------


def test_unit_dir_and_marker(tmp_path):
    cfg = nr.neuron_config_kwargs(tp=2, batch=4, ctx=(128, 256), tkg=(128, 256), dtype="bfloat16")
    d = nr.unit_dir(tmp_path, "fp123", 2, 4, cfg)
    assert d.parent == tmp_path / "fp123" and d.name.startswith("tp2_b4_")
    other = nr.neuron_config_kwargs(tp=2, batch=4, ctx=(128, 512), tkg=(128, 512), dtype="bfloat16")
    assert nr.unit_dir(tmp_path, "fp123", 2, 4, other) != d
    assert not nr.artifacts_complete(d, cfg)
    d.mkdir(parents=True)
    assert not nr.artifacts_complete(d, cfg)  # a compilation that never finished
    nr.write_marker(d, cfg, compile_s=12.5, versions=FAKE_VERSIONS)
    assert nr.artifacts_complete(d, cfg)
    assert not nr.artifacts_complete(d, other)
    assert json.loads((d / nr.MARKER).read_text())["versions"]["neuronx-cc"] == "2.0.test"
    (d / nr.MARKER).write_text("{not json")
    assert not nr.artifacts_complete(d, cfg)


def test_engine_spec_places_units_under_the_fingerprint(tmp_path, fake_sdk):
    r = get_runner(target(artifacts_dir=str(tmp_path)))
    s = r.engine_spec(2, 4, (128, 256), (128, 256))
    assert Path(s.artifacts).parent == tmp_path / r.fingerprint()
    assert Path(s.artifacts).name.startswith("tp2_b4_")
    assert s.checkpoint == "/models/llama" and not s.random_weights
    assert s.neuron_config["context_encoding_buckets"] == [128, 256]
    assert r.engine_spec(2, 4, (128, 256), (128, 256)).key == s.key
    assert r.engine_spec(2, 4, (128, 512), (128, 512)).key != s.key

    rw = get_runner(target(random_weights=True, artifacts_dir=str(tmp_path)))
    ck = Path(rw.engine_spec(1, 1, (128,), (128,)).checkpoint)
    assert ck.parent == tmp_path / "checkpoints" and ck.name.startswith("llama_")


# -- versions and fingerprints -------------------------------------------------------------------


def test_fingerprint_changes_with_sdk_versions_and_options(fake_sdk):
    a = get_runner(target()).fingerprint()
    assert a == get_runner(target()).fingerprint()
    assert a == get_runner(target(artifacts_dir="/elsewhere")).fingerprint()
    assert a != get_runner(target(prefill="batched")).fingerprint()
    assert a != get_runner(target(model="/models/other")).fingerprint()
    assert a != get_runner(target(hardware="trn1")).fingerprint()
    fake_sdk["neuronx-cc"] = "2.1.test"  # a new compiler: old profiles no longer apply
    assert a != get_runner(target()).fingerprint()


@pytest.mark.skipif(importlib.util.find_spec("neuronx_distributed_inference") is not None,
                    reason="the Neuron SDK is installed here")
def test_without_the_sdk_using_the_runner_explains_where_the_packages_come_from():
    r = get_runner(target())
    for use in (r.fingerprint,
                lambda: r.profile(Unit(r.target, 1, 1), plan_probes((128, 256), policy="exclusive", max_output=16, repeats=1)),
                lambda: r.run_workload(Candidate(1, 1, (128,), (128,)), Requests([5], [5]))):
        with pytest.raises(RunnerUnavailable) as exc:
            use()
        msg = str(exc.value)
        assert 'lensopt[neuron]' in msg and "pip.repos.neuron.amazonaws.com" in msg and "docs/neuron.md" in msg
        assert "neuronx-distributed-inference" in msg
    assert "neuron_config.json" in r.deploy_snippets(Candidate(1, 1, (128,), (128,)))


def test_sdk_versions_reads_metadata_only(monkeypatch):
    present = {"neuronx-distributed-inference": "0.7", "torch-neuronx": "2.8", "neuronx-cc": "2.21", "torch": "2.8"}
    monkeypatch.setattr(nr, "dist_versions", lambda names: {n: present[n] for n in names if n in present})
    monkeypatch.setattr(nr, "neuron_driver_version", lambda: "2.24.7")
    v = nr.sdk_versions()
    assert v["neuronx-cc"] == "2.21" and v["neuron_driver"] == "2.24.7" and v["torch"] == "2.8"
    del present["neuronx-cc"]
    with pytest.raises(RunnerUnavailable, match="needs neuronx-cc"):
        nr.sdk_versions()


# -- timing of a static batch ------------------------------------------------------------------


def test_times_from_steps():
    steps = [10.5, 10.6, 10.7, 10.8]  # one host time per generated token of the batch
    tb = times_from_steps(steps, 10.0, [1, 4, 2], wall_s=0.85)
    assert tb.ttft_source == "batch-prefill"
    np.testing.assert_allclose(tb.ttft_s, [0.5, 0.5, 0.5])
    np.testing.assert_allclose(tb.e2e_s, [0.5, 0.8, 0.6])
    assert tb.wall_s == 0.85
    with pytest.raises(RunnerError, match="generated 2 tokens per row, 4 were asked for"):
        times_from_steps(steps[:2], 10.0, [4], wall_s=1.0)
    with pytest.raises(RunnerError, match="backwards"):
        times_from_steps([2.0, 1.0], 0.0, [2], wall_s=1.0)


# -- the runner flow with a fake engine ------------------------------------------------------------


class FakeNxd:
    """Compiles unless the unit's folder is complete, like the real engine; times a static batch."""

    started: list["FakeNxd"] = []

    def __init__(self, spec):
        if "unusable" in spec.checkpoint:
            raise FileNotFoundError(f"no checkpoint at {spec.checkpoint}")
        self.spec = spec
        self.artifacts = spec.artifacts
        self.reused_artifacts = nr.artifacts_complete(spec.artifacts, spec.neuron_config)
        self.compile_s = 0.0
        if not self.reused_artifacts:
            Path(spec.artifacts).mkdir(parents=True, exist_ok=True)
            self.compile_s = 30.0
            nr.write_marker(spec.artifacts, spec.neuron_config, compile_s=30.0, versions=spec.versions)
        self.load_s = 4.0
        self.calls = []
        self.closed = False
        FakeNxd.started.append(self)

    def generate_timed(self, prompts, output_lens):
        self.calls.append(([len(p) for p in prompts], list(output_lens)))
        prefill = 1e-3 * len(prompts)
        steps = [prefill + 5e-3 * k for k in range(max(output_lens))]
        return times_from_steps(steps, 0.0, output_lens, wall_s=steps[-1])

    def close(self):
        self.closed = True


@pytest.fixture
def fake_runner(monkeypatch, fake_sdk, tmp_path):
    FakeNxd.started = []
    monkeypatch.setattr(nr.NeuronRunner, "engine_class", FakeNxd)
    monkeypatch.setattr(nr.NeuronRunner, "one_unit_per_process", False)  # FakeNxd.started is this process's
    r = get_runner(target(shape=SMALL, artifacts_dir=str(tmp_path), warmup=1))
    yield r
    r.close()


def test_profile_compiles_once_then_reuses_the_unit_folder(fake_runner, monkeypatch, fake_sdk, tmp_path):
    r = fake_runner
    probes = plan_probes((64, 128, 256), policy="exclusive", max_output=16, repeats=2)
    res = r.profile(Unit(r.target, 2, 4), probes)
    assert res.compile_s == 30.0 and res.run_s >= 4.0  # loading counts as hardware time
    assert r.engine_log[-1].reused_artifacts is False
    prof = solve(res.runs, batch=4)
    for p in prof.values():
        assert p.tbt_s == pytest.approx(5e-3) and p.ttft_s == pytest.approx(1e-3)
    # a new process (a fresh runner) finds the finished unit and does not compile again
    r.close()
    again = get_runner(target(shape=SMALL, artifacts_dir=str(tmp_path), warmup=1))
    res2 = again.profile(Unit(again.target, 2, 4), probes)
    assert res2.compile_s == 0.0
    rec = again.engine_log[-1]
    assert rec.reused_artifacts is True and rec.load_s == 4.0 and rec.artifacts == FakeNxd.started[0].artifacts
    again.close()


def test_workload_per_request_times(fake_runner):
    r = fake_runner
    cand = Candidate(1, 2, (64, 128), (64, 128))
    run = r.run_workload(cand, Requests([10, 50, 100], [3, 1, 5]))
    eng = FakeNxd.started[0]
    assert eng.calls[1:] == [([10, 50], [3, 1]), ([100], [5])]
    np.testing.assert_allclose(run.ttft_s, [2e-3, 2e-3, 1e-3])
    np.testing.assert_allclose(run.e2e_s, [2e-3 + 2 * 5e-3, 2e-3, 1e-3 + 4 * 5e-3])
    assert run.compile_s == 30.0 and r.last_ttft_sources == ("batch-prefill",)


def test_workload_refuses_a_batch_that_overruns_the_compiled_length(fake_runner):
    r = fake_runner
    cand = Candidate(1, 2, (1024, 2048), (1024, 2048))
    # each request alone fits 2048; padded together they reach 2000 + 2000 - 1
    with pytest.raises(UserError, match=r"batch 0 \(requests 0\.\.1\): its longest prompt \(request 0, 2000 tokens\) "
                                        r"and longest output \(request 1, 2000 tokens\) reach context 3999, past the "
                                        r"compiled length 2048"):
        r.run_workload(cand, Requests([2000, 10], [10, 2000]))
    with pytest.raises(UserError, match="batch 1 \\(requests 2\\.\\.3\\)"):
        r.run_workload(cand, Requests([2000, 30, 2000, 10], [10, 40, 10, 2000]))
    assert FakeNxd.started == []  # refused before anything was compiled
    r.run_workload(cand, Requests([2000, 10, 10, 30], [10, 40, 2000, 900]))  # long prompts and long outputs apart


def test_check_batches_matches_the_single_request_rule():
    nr.check_batches([100], [1949], batch=4, seq_len=2048)  # 100 + 1949 - 1 = 2048: fits, as alone
    with pytest.raises(UserError, match="reach context 2049"):
        nr.check_batches([100, 3], [1, 1950], batch=4, seq_len=2048)


def test_inclusive_policy_is_refused():
    with pytest.raises(UserError, match="target.bucket_policy = 'inclusive'.*l < b.*set bucket_policy = \"exclusive\""):
        get_runner(target(policy="inclusive"))


def test_loading_an_inclusive_neuron_space_fails_naming_the_file_and_key(tmp_path, capsys):
    from search.cli import main

    text = (ROOT / "spaces" / "neuron-inf2-example.toml").read_text()
    assert 'bucket_policy = "exclusive"' in text
    space = tmp_path / "inclusive-neuron.toml"
    space.write_text(text.replace('bucket_policy = "exclusive"', 'bucket_policy = "inclusive"'))
    rc = main(["profile", str(space), "--tp", "1", "--batch", "1", "--cache", str(tmp_path / "c.sqlite")])
    err = capsys.readouterr().err
    assert rc == 2
    assert str(space) in err and "target.bucket_policy = 'inclusive'" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "c.sqlite").exists()


# -- random checkpoints (numpy only) -------------------------------------------------------------------


def test_bfloat16_rounds_to_nearest_even():
    from runners._model_dir import to_bfloat16_bits

    x = np.array([0x3F800000, 0xC0000000, 0x3DCCCCCD, 0x3F808000, 0x3F818000], np.uint32).view(np.float32)
    assert to_bfloat16_bits(x).tolist() == [0x3F80, 0xC000, 0x3DCD, 0x3F80, 0x3F82]


def test_random_checkpoint_is_a_valid_safetensors_file(tmp_path):
    from runners import _model_dir as ck

    d = ck.write_random_checkpoint(tmp_path / "m", SMALL, dtype="float32", seed=3, max_position=257)
    f = d / ck.WEIGHTS
    head = ck.read_header(f)
    names = [n for n, _ in ck.llama_tensors(SMALL)]
    assert sorted(k for k in head if k != "__metadata__") == sorted(names)
    assert sum(np.prod(v["shape"]) for k, v in head.items() if k != "__metadata__") == SMALL.param_count()
    n = int.from_bytes(f.read_bytes()[:8], "little")
    raw = f.read_bytes()[8 + n:]
    a, b = head["model.layers.0.mlp.up_proj.weight"]["data_offsets"]
    w = np.frombuffer(raw[a:b], "<f4").reshape(head["model.layers.0.mlp.up_proj.weight"]["shape"])
    assert w.shape == (SMALL.intermediate, SMALL.hidden) and abs(w.std() - 0.02) < 0.002 and abs(w.mean()) < 0.002
    a, b = head["model.norm.weight"]["data_offsets"]
    assert (np.frombuffer(raw[a:b], "<f4") == 1).all()
    assert json.loads((d / "config.json").read_text())["max_position_embeddings"] == 257
    before = f.stat().st_mtime_ns
    assert ck.write_random_checkpoint(tmp_path / "m", SMALL, dtype="float32", seed=3, max_position=257) == d
    assert f.stat().st_mtime_ns == before  # written once
    with pytest.raises(UserError, match="is not this model's random checkpoint"):
        ck.write_random_checkpoint(tmp_path / "m", SMALL, dtype="float32", seed=4, max_position=257)
    f.write_bytes(f.read_bytes()[:-10])  # cut short: not a checkpoint any more
    with pytest.raises(ValueError, match="the header describes"):
        ck.read_header(f)


# -- the real engine boundary in child processes, against a fake Neuron SDK ---------------------------

#: A stand-in for torch, transformers and NxD Inference with the behaviours the runner must
#: survive: GenerationConfig(eos_token_id=None) falls back to the model's end-of-sequence id
#: (the fake emits it at the third step), a batch padded past the compiled length overruns
#: the attention mask, the checkpoint folder must hold safetensors, and a loaded unit keeps
#: its NeuronCores for the life of its process (FAKE_NEURON_CORES holds one file per core,
#: naming the process holding it).  Every load and generate appends a line to FAKE_NEURON_LOG.
FAKE_NEURON_SDK = {
    "torch/__init__.py": """
        import numpy as np

        class Tensor(np.ndarray):
            device = "cpu"

        long, bool = np.int64, np.bool_

        def zeros(shape, dtype=None, device=None):
            return np.zeros(shape, dtype=dtype or np.float32).view(Tensor)

        def tensor(data, dtype=None):
            return np.asarray(data, dtype=dtype).view(Tensor)
    """,
    "transformers/__init__.py": """
        class GenerationConfig:
            def __init__(self, **kw):
                self.__dict__.update(kw)

        class StoppingCriteria:
            pass

        class StoppingCriteriaList(list):
            pass
    """,
    "neuronx_distributed_inference/__init__.py": "",
    "neuronx_distributed_inference/models/__init__.py": "",
    "neuronx_distributed_inference/models/config.py": """
        class NeuronConfig:
            def __init__(self, **kw):
                self.__dict__.update(kw)
    """,
    "neuronx_distributed_inference/models/llama/__init__.py": "",
    "neuronx_distributed_inference/models/llama/modeling_llama.py": """
        import glob, json, os

        def log(**event):
            with open(os.environ["FAKE_NEURON_LOG"], "a") as fh:
                fh.write(json.dumps(dict(event, pid=os.getpid())) + "\\n")

        def alive(pid):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            return True

        class LlamaInferenceConfig:
            def __init__(self, neuron_config, load_config=None):
                self.neuron_config = neuron_config
                self.hf = load_config()

        class NeuronLlamaForCausalLM:
            def __init__(self, path, config):
                if not glob.glob(os.path.join(path, "*.safetensors")):
                    raise FileNotFoundError(f"no safetensors checkpoint in {path}")
                self.config = config

            def compile(self, path):
                open(os.path.join(path, "model.pt"), "w").write("compiled")

            def load(self, path):
                for core in range(self.config.neuron_config.tp_degree):
                    f = os.path.join(os.environ["FAKE_NEURON_CORES"], f"core{core}")
                    if os.path.exists(f) and alive(int(open(f).read())):
                        raise RuntimeError(f"NeuronCore {core} is held by process {open(f).read()}")
                    open(f, "w").write(str(os.getpid()))
                log(event="load", tp=self.config.neuron_config.tp_degree)
    """,
    "neuronx_distributed_inference/utils/__init__.py": "",
    "neuronx_distributed_inference/utils/hf_adapter.py": """
        import json, os
        import numpy as np
        from neuronx_distributed_inference.models.llama.modeling_llama import log

        MODEL_EOS = 2

        def load_pretrained_config(path):
            return lambda: json.load(open(os.path.join(path, "config.json")))

        class HuggingFaceGenerationAdapter:
            def __init__(self, model):
                self.model = model

            def generate(self, input_ids, attention_mask=None, generation_config=None, stopping_criteria=()):
                seq_len = self.model.config.neuron_config.seq_len
                width, steps = input_ids.shape[1], generation_config.max_new_tokens
                eos = generation_config.eos_token_id
                log(event="generate", eos=eos, width=width, steps=steps)
                eos = [MODEL_EOS] if eos is None else [eos] if isinstance(eos, int) else eos
                if width + steps - 1 > seq_len:
                    raise IndexError(f"position {width + steps - 1} is past the attention mask of {seq_len}")
                done = np.zeros(input_ids.shape[0], bool)
                ids = input_ids
                for t in range(steps):
                    tok = np.full(input_ids.shape[0], MODEL_EOS if t == 2 else 7)
                    ids = np.concatenate([ids, tok[:, None]], axis=1).view(type(input_ids))
                    done |= np.isin(tok, eos)
                    for c in stopping_criteria:
                        c(ids, None)
                    if done.all():
                        break
                return ids
    """,
}


@pytest.fixture
def fake_neuron_sdk(tmp_path, monkeypatch, fake_sdk):
    """The fake SDK on disk, on the path the engine processes import from; returns the log reader."""
    root = tmp_path / "fake_sdk"
    for rel, src in FAKE_NEURON_SDK.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(textwrap.dedent(src))
    (tmp_path / "cores").mkdir()
    monkeypatch.syspath_prepend(str(root))  # handed to the engine processes, never imported here
    monkeypatch.setenv("FAKE_NEURON_CORES", str(tmp_path / "cores"))
    monkeypatch.setenv("FAKE_NEURON_LOG", str(tmp_path / "log.jsonl"))

    def events():
        f = tmp_path / "log.jsonl"
        return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []

    return events


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_engine_messages_are_json_and_rebuild_only_the_projects_dataclasses():
    from runners import _engine_host as host
    from runners._engine_timing import TimedBatch

    spec = nr.NeuronUnitSpec(key="k", tp=2, batch=4, family="llama", neuron_config={"seq_len": 128, "b": [1, 2]},
                             checkpoint="/c", random_weights=True, shape=SMALL, dtype="bfloat16", seed=0,
                             artifacts="/a", versions={"x": "1"})
    tb = TimedBatch(np.array([0.5, float("nan")]), np.array([1.0, 2.0]), 2.0, "step")
    msg = json.loads(json.dumps(host.encode({"spec": spec, "tb": tb, "t": (1, "a"), "m": {3: (4,)}})))
    back = host.decode(msg)
    assert vars(back["spec"]) == vars(spec) and back["t"] == (1, "a") and back["m"] == {3: (4,)}
    np.testing.assert_array_equal(back["tb"].ttft_s, tb.ttft_s)
    assert back["tb"].ttft_source == "step" and back["tb"].wall_s == 2.0
    with pytest.raises(ValueError, match="outside the lens and runners packages"):
        host.decode({"$dc": "subprocess:Popen", "v": {}})
    assert isinstance(host._rebuild({"type": "UserError", "message": "m"}), UserError)
    assert isinstance(host._rebuild({"type": "FileNotFoundError", "message": "m"}), FileNotFoundError)
    assert str(host._rebuild({"type": "SdkError", "message": "m"})) == "SdkError: m"


def test_each_unit_runs_in_a_process_of_its_own_that_frees_its_cores(fake_neuron_sdk, tmp_path):
    assert nr.NeuronRunner.one_unit_per_process is True
    r = get_runner(target(shape=SMALL, random_weights=True, artifacts_dir=str(tmp_path / "art"), warmup=0))
    probes = plan_probes((64, 128), policy="exclusive", max_output=8, repeats=1)
    try:
        r.profile(Unit(r.target, 1, 2), probes)
        first = r._engine
        r.profile(Unit(r.target, 2, 2), probes)  # another tp: its cores were held by the first unit
        assert not first.alive  # the first unit's process ended before the second loaded
        run = r.run_workload(Candidate(2, 2, (64, 128), (64, 128)), Requests([10, 100, 30], [5, 20, 3]))
    finally:
        r.close()
    loads = [e for e in fake_neuron_sdk() if e["event"] == "load"]
    assert [e["tp"] for e in loads] == [1, 2] and loads[0]["pid"] != loads[1]["pid"]
    assert all(e["pid"] != os.getpid() and not _alive(e["pid"]) for e in loads)
    assert (run.e2e_s > 0).all() and (run.e2e_s >= run.ttft_s).all()
    ck = r.checkpoint_dir()
    assert (ck / "model.safetensors").stat().st_size > 2 * SMALL.param_count()  # bfloat16 weights, no torch


def test_generation_never_stops_on_an_end_of_sequence_id(fake_neuron_sdk, tmp_path):
    from runners._model_dir import write_random_checkpoint

    ck = write_random_checkpoint(tmp_path / "ckpt", SMALL, dtype="bfloat16", seed=0, max_position=129)
    r = get_runner(target(shape=SMALL, model=str(ck), artifacts_dir=str(tmp_path / "art"), warmup=0))
    try:
        run = r.run_workload(Candidate(1, 2, (64, 128), (64, 128)), Requests([10, 40], [12, 6]))
    finally:
        r.close()
    gens = [e for e in fake_neuron_sdk() if e["event"] == "generate"]
    assert gens and all(e["eos"] == [] for e in gens)  # None would fall back to the model's id
    assert run.e2e_s[0] > run.e2e_s[1]  # row 0 generated all 12 tokens


def test_an_engine_process_failure_reaches_the_caller(fake_neuron_sdk, tmp_path):
    r = get_runner(target(shape=SMALL, model=str(tmp_path / "no-checkpoint"), artifacts_dir=str(tmp_path / "art")))
    with pytest.raises(RunnerError, match="starting the engine for tp 1, batch 1 failed: FileNotFoundError: .*"
                                          "no-checkpoint"):
        r.run_workload(Candidate(1, 1, (64,), (64,)), Requests([5], [2]))
    r.close()


# -- real hardware ----------------------------------------------------------------------------------


def _has_neuron() -> bool:
    return importlib.util.find_spec("neuronx_distributed_inference") is not None and Path("/dev/neuron0").exists()


@pytest.mark.neuron
@pytest.mark.skipif(not _has_neuron(), reason="needs the Neuron SDK (neuronx-distributed-inference) and a NeuronCore")
def test_real_nxd_inference_unit(tmp_path):
    tiny = ModelShape(layers=2, hidden=256, heads=4, kv_heads=2, intermediate=512, vocab=1024)
    t = Target(name="neuron-smoke", runner="neuron", hardware="inf2", bucket_policy="exclusive", dtype="bfloat16",
               model=tiny, options=(("artifacts_dir", str(tmp_path)), ("random_weights", True)))
    r = get_runner(t)
    try:
        res = r.profile(Unit(t, 1, 2), plan_probes((128, 256), policy="exclusive", max_output=16, repeats=2))
        prof = solve(res.runs, batch=2)
        assert all(p.tbt_s > 0 for p in prof.values())
        run = r.run_workload(Candidate(1, 2, (128, 256), (128, 256)), Requests([10, 200], [5, 40]))
        assert (run.e2e_s >= run.ttft_s).all()
    finally:
        r.close()


# -- the conformance suite -------------------------------------------------------------------------

from runners.conformance import RunnerConformance  # noqa: E402

#: a tiny model NxD Inference compiles in minutes (head_dim 64)
CONF_MODEL = ModelShape(layers=2, hidden=256, heads=4, kv_heads=2, intermediate=512, vocab=1024)


class _ExclusiveOnly:
    """NxD Inference has one bucket policy: the other one is refused (the conformance suite checks it)."""

    policies = ("exclusive",)


class TestNeuronFlowConformance(_ExclusiveOnly, RunnerConformance):
    """The shared runner flow of ``neuron`` (options, units, probes, workloads) with a fake engine."""

    model = CONF_MODEL

    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def _fake_backend(cls, tmp_path_factory):
        cls.artifacts = str(tmp_path_factory.mktemp("neuron-artifacts"))
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(nr.NeuronRunner, "engine_class", FakeNxd)
            mp.setattr(nr.NeuronRunner, "one_unit_per_process", False)
            mp.setattr(nr, "sdk_versions", lambda: dict(FAKE_VERSIONS))
            yield

    def make_target(self, *, model: ModelShape | None = None, policy: str = "exclusive") -> Target:
        return Target(name="conformance-neuron-fake", runner="neuron", hardware="inf2", bucket_policy=policy,
                      dtype="bfloat16", model=model or self.model,
                      options=(("artifacts_dir", self.artifacts), ("random_weights", True)))

    def make_unusable_target(self) -> Target:
        return Target(name="conformance-neuron-fake", runner="neuron", hardware="inf2", bucket_policy="exclusive",
                      dtype="bfloat16", model=self.model,
                      options=(("artifacts_dir", self.artifacts), ("model", "/fake/unusable")))


@pytest.mark.neuron
@pytest.mark.skipif(not _has_neuron(), reason="needs the Neuron SDK (neuronx-distributed-inference) and a NeuronCore")
class TestNeuronHardwareConformance(_ExclusiveOnly, RunnerConformance):
    """The conformance suite on a NeuronCore through NxD Inference (random weights, a tiny model)."""

    model = CONF_MODEL
    buckets = (128, 256)  # NxD Inference's smallest useful buckets; each one is a compiled graph

    def make_target(self, *, model: ModelShape | None = None, policy: str = "exclusive") -> Target:
        return Target(name="conformance-neuron", runner="neuron", hardware="inf2", bucket_policy=policy,
                      dtype="bfloat16", model=model or self.model, options=(("random_weights", True),))

    def make_unusable_target(self) -> Target:
        return Target(name="conformance-neuron-missing", runner="neuron", hardware="inf2", bucket_policy="exclusive",
                      dtype="bfloat16", model=self.model, options=(("model", "/nonexistent/lensopt-no-checkpoint"),))


def test_the_target_prefill_sets_the_context_encoding_batch(fake_sdk):
    seq, bat = get_runner(target()), get_runner(target(prefill="batched"))
    assert seq.prefill == "sequential" and bat.prefill == "batched"
    assert seq.engine_spec(2, 4, (128,), (128,)).neuron_config["ctx_batch_size"] == 1
    assert bat.engine_spec(2, 4, (128,), (128,)).neuron_config["ctx_batch_size"] == 4
    cand = Candidate(2, 4, (128,), (128,))
    assert json.loads(bat.deploy_snippets(cand)["neuron_config.json"])["ctx_batch_size"] == 4
    # the former option says where the setting lives now
    with pytest.raises(UserError, match=r"batched_prefill .* no longer an option: write prefill = \"batched\""):
        get_runner(target(batched_prefill=True))
