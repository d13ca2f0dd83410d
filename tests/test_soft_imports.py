"""lensopt works with none of the optional SDKs installed: importing it loads none of them,
the CLI starts, space files naming such a runner load, and choosing such a runner says which
extra to install only when it is used."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lens.errors import RunnerUnavailable
from lens.types import Candidate, ModelShape, Requests, Target, Unit

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("vllm", "torch", "torch_neuronx", "neuronx_distributed", "neuronx_distributed_inference", "neuronxcc",
         "transformers")
SHAPE = ModelShape(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=500)


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_importing_lensopt_loads_no_optional_sdk():
    code = (
        "import sys, json\n"
        "import lens, runners, search, spaces\n"
        "import runners.vllm_runner, runners.neuron, runners._llm_common, runners._llm_host\n"
        "from runners import runner_class\n"
        "runner_class('vllm'); runner_class('neuron')\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {list(HEAVY)!r})))\n"
    )
    p = _python(code)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) == []


def test_cli_help_works_without_the_sdks():
    p = subprocess.run([sys.executable, "-m", "search.cli", "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert "lensopt" in p.stdout
    from search.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0


def test_console_script_help():
    exe = Path(sys.executable).parent / "lensopt"
    if not exe.exists():
        pytest.skip("the lensopt console script is not installed in this environment")
    p = subprocess.run([str(exe), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr


def _target(runner: str, **opts) -> Target:
    return Target(name="t", runner=runner, hardware="h200" if runner == "vllm" else "inf2",
                  bucket_policy="exclusive", dtype="bfloat16", model=SHAPE, options=tuple(sorted(opts.items())))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_choosing_vllm_without_it_names_the_extra():
    from runners import get_runner

    r = get_runner(_target("vllm", model="/models/x"))  # choosing it is fine; using it is not
    with pytest.raises(RunnerUnavailable, match=r'lensopt\[vllm\]'):
        r.fingerprint()
    with pytest.raises(RunnerUnavailable, match=r'lensopt\[vllm\]'):
        r.run_workload(Candidate(1, 1, (64,), (64,)), Requests([4], [4]))


@pytest.mark.skipif(importlib.util.find_spec("neuronx_distributed_inference") is not None,
                    reason="the Neuron SDK is installed here")
def test_choosing_neuron_without_it_points_to_the_neuron_repository():
    from runners import get_runner

    r = get_runner(_target("neuron", model="/models/x"))
    with pytest.raises(RunnerUnavailable) as exc:
        r.profile(Unit(r.target, 1, 1), [])
    assert "lensopt[neuron]" in str(exc.value) and "pip.repos.neuron.amazonaws.com" in str(exc.value)


@pytest.mark.parametrize("name", ["vllm-gpu-example.toml", "neuron-inf2-example.toml"])
def test_example_space_files_load_without_the_sdks(name):
    from runners import get_runner
    from spaces import load_space

    sp = load_space(ROOT / "spaces" / name)
    r = get_runner(sp.target)
    c = Candidate(sp.search.tp[0], sp.search.batch[-1], sp.search.buckets, sp.search.buckets)
    files = r.deploy_snippets(c)  # pure: needs no SDK
    assert "config.json" in files and len(files) == 2
