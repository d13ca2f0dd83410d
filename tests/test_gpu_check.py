"""``benchmarks/gpu/check.py --cpu``: the real-accelerator check's flow on this CPU, with optuna
and ray made unimportable (the GPU host has neither), and a budget that runs only the first case."""
from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "check.py"

#: runs the script as __main__ in an interpreter where importing optuna or ray fails
BLOCKED_RUN = """
import runpy, sys

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("optuna", "ray"):
            raise ImportError(f"{name} is not on the GPU host")
        return None

sys.meta_path.insert(0, Blocker())
script, *args = sys.argv[1:]
sys.argv = [script, *args]
runpy.run_path(script, run_name="__main__")
"""


@pytest.mark.slow
def test_check_cpu_prints_its_tables_without_optuna_or_ray(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path), "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", BLOCKED_RUN, str(SCRIPT), "--cpu", "--budget-s", "0",
                           "--requests", "4"], capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    out = proc.stdout
    assert "per-request E2E error of LENS vs the measured runs" in out
    assert "AMALI's analytical TTFT_b / TBT_b (H200-SXM spec, not comparable to this device)" in out
    # a budget of 0 s runs the first case only, and says which ones it skipped
    assert "skipped (time budget of 0 s): exclusive b4, inclusive b1, inclusive b4" in out

    rows = list(csv.DictReader(open(tmp_path / "check.csv")))
    assert [(r["policy"], r["batch"], r["workload"]) for r in rows] == [
        ("exclusive", "1", "azure_conv"), ("exclusive", "1", "arxiv_4k")]
    for r in rows:
        vals = {k: float(v) for k, v in r.items() if k not in ("policy", "workload")}
        assert all(math.isfinite(v) for v in vals.values()), r
        assert vals["requests"] == 4 and 0 < vals["scale"] <= 1
        assert 0 <= vals["E2E <5% share"] <= 100
        assert 0 <= vals["E2E err mean %"] < 500  # a unit slip (ms for s) would be far off
        assert vals["drift"] > 0 and vals["compile s"] > 0 and vals["run s"] > 0

    amali = list(csv.DictReader(open(tmp_path / "check_amali.csv")))
    assert [int(r["bucket"]) for r in amali] == [32, 64, 128, 256]
    for r in amali:
        assert float(r["ttft_ms"]) > 0 and float(r["tbt_ms"]) > 0
        assert float(r["amali_ttft_ms"]) > 0 and float(r["amali_tbt_ms"]) > 0
        assert math.isnan(float(r["ttft_err_%"]))  # a GPU model is not graded against a CPU


def test_check_refuses_a_machine_without_a_gpu_in_one_line(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", BLOCKED_RUN, str(SCRIPT)], capture_output=True, text=True,
                          timeout=200, env=env, cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("check: error: JAX sees no GPU here") and "--cpu" in proc.stderr
    assert "Traceback" not in proc.stderr
