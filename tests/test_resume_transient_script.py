"""``benchmarks/resume_transient.py``: the decode after a busy pass's prefill, step by step, on the jax runner."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "resume_transient.py"
BUCKETS = (64, 128, 256, 512)  # serving_accuracy.setup("jax"): the quickstart model's


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_every_prefill_bucket_up_to_each_decode_bucket_gets_its_steps_and_excess():
    proc = run("--repeats", "1", "--steps", "3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = re.findall(r"prefill +(\d+) \( *([\d.]+) ms, steady step ([\d.]+)\): ((?:[\d.]+ ?){3}) +excess ([+-][\d.]+) ms",
                      proc.stdout)
    assert [int(r[0]) for r in rows] == [p for d in BUCKETS for p in BUCKETS if p <= d]
    for _, pre, steady, steps, _ in rows:
        assert float(pre) > 0 and float(steady) > 0
        assert len(steps.split()) == 3 and all(float(x) > 0 for x in steps.split())


def test_gpu_is_refused_in_one_line_where_jax_sees_none():
    proc = run("--gpu")
    assert proc.returncode == 2
    assert "JAX sees no GPU" in proc.stderr and "Traceback" not in proc.stderr
