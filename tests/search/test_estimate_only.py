"""--estimate-only: a search on a GPU target with no hardware and no profiles."""
import json

import pandas as pd

from search.cli import main

GPU_SPACE = """
[target]
name = "gpu-est"
runner = "vllm"
hardware = "H100-SXM"
bucket_policy = "inclusive"
dtype = "bfloat16"
prefill = "batched"            # vLLM on a GPU encodes a batch's prompts in one step
[target.model]
layers = 16
hidden = 2048
heads = 32
kv_heads = 8
intermediate = 8192
vocab = 128256
[target.options]
model = "unused"
[space]
tp = [1, 2]
batch = [1, 8]
buckets = [256, 1024, 4096]
[workload]
distribution = "sharegpt"
requests = 50
drop_longer = true
"""


def test_estimate_only_search_on_a_gpu_target(tmp_path, capsys):
    space = tmp_path / "gpu.toml"
    space.write_text(GPU_SPACE)
    assert main(["run", str(space), "--estimate-only", "--results", str(tmp_path / "r"), "--name", "e"]) == 0
    out = capsys.readouterr().out
    assert "ESTIMATES" in out
    rd = tmp_path / "r" / "e"
    front = pd.read_csv(rd / "pareto.csv")
    assert len(front) >= 1 and set(front["source"]) == {"estimate:amali"}
    info = json.loads((rd / "run.json").read_text())
    assert info["estimate_only"] is True and info["profile_hardware_s"] == 0
    assert "ESTIMATES ONLY" in (rd / "report.md").read_text()
    trials = pd.read_csv(rd / "trials.csv")
    assert len(trials) == 2 * 2 * 4  # every candidate: tp x batch x bucket sets


def test_estimate_only_refuses_an_npu_target(tmp_path, capsys):
    space = tmp_path / "npu.toml"
    space.write_text(GPU_SPACE.replace('runner = "vllm"', 'runner = "sim"').replace('"H100-SXM"', '"inf2"')
                     .replace('[target.options]\nmodel = "unused"\n', ""))
    assert main(["run", str(space), "--estimate-only", "--results", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "inf2" in err and "H100-SXM" in err
