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
from spacekit import space_table, tiny_target

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
    vllm = runner == "vllm"  # vLLM on a GPU encodes a batch's prompts in one step, NxD one at a time
    return Target(name="t", runner=runner, hardware="h200" if vllm else "inf2", bucket_policy="exclusive",
                  dtype="bfloat16", model=SHAPE, options=tuple(sorted(opts.items())),
                  prefill="batched" if vllm else "sequential")


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


# -- profile, predict and measure need neither Optuna nor Ray ------------------------------------
_BLOCKED = ("optuna", "ray")
_BLOCKER = (
    "import sys\n"
    "class _Blocked:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    f"        if name.split('.')[0] in {_BLOCKED!r}:\n"
    "            raise ImportError(f'{name} is not installed here')\n"
    "sys.meta_path.insert(0, _Blocked())\n"
)
_SIM_SPACE = tiny_target("no-search") + space_table()


def test_the_blocker_really_blocks():
    p = _python(_BLOCKER + "import optuna\n")
    assert p.returncode != 0 and "optuna is not installed here" in p.stderr


def test_importing_search_loads_neither_optuna_nor_ray():
    p = _python("import sys, json\nimport search, search.run, search.cli\n"
                f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {list(_BLOCKED)!r})))\n")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) == []


def test_profile_predict_measure_run_without_optuna_and_ray(tmp_path):
    space, cache = tmp_path / "space.toml", tmp_path / "cache.sqlite"
    space.write_text(_SIM_SPACE)
    unit = ["--tp", "1", "--batch", "2"]
    reqs = ["--buckets", "64,128", "--input-len", "10,70", "--output-len", "5,20"]
    for argv in (["profile", str(space), *unit, "--cache", str(cache), "--json"],
                 ["predict", str(space), *unit, *reqs, "--cache", str(cache), "--json"],
                 ["measure", str(space), *unit, *reqs, "--repeats", "1", "--json"]):
        p = _python(_BLOCKER + f"from search.cli import main\nsys.exit(main({argv!r}))\n")
        assert p.returncode == 0, (argv[0], p.stderr[-2000:])
        out = json.loads(p.stdout)
        if argv[0] == "predict":
            assert len(out["e2e_s"]) == 2 and all(x > 0 for x in out["e2e_s"])
        else:
            assert out["simulated"] is True
    # the blocker is what makes this proof: a search does need Optuna and fails without it
    p = _python(_BLOCKER + f"from search.cli import main\nsys.exit(main(['run', {str(space)!r}, '--workload', "
                           f"'sharegpt', '--cache', {str(cache)!r}, '--results', {str(tmp_path / 'r')!r}]))\n")
    assert p.returncode != 0 and "not installed here" in p.stderr
