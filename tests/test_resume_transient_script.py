"""``benchmarks/resume_transient.py``: the decode after a busy pass's prefill, step by step, on the jax runner."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "resume_transient.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_every_prefill_bucket_up_to_each_decode_bucket_gets_its_steps_and_excess():
    # (two of the target's buckets, given out of order: every graph of all four compiles in 25 s on a slow CPU)
    proc = run("--repeats", "1", "--steps", "3", "--buckets", "128,64")
    assert proc.returncode == 0, proc.stderr[-3000:]
    decode = [int(d) for d in re.findall(r"^decode bucket (\d+):", proc.stdout, re.M)]
    rows = re.findall(r"prefill +(\d+) \( *([\d.]+) ms, steady step ([\d.]+)\): ((?:[\d.]+ ?){3}) +excess ([+-][\d.]+) ms",
                      proc.stdout)
    assert decode == [64, 128]
    assert [int(r[0]) for r in rows] == [64, 64, 128]  # each prefill bucket up to each decode bucket
    for _, pre, steady, steps, _ in rows:
        assert float(pre) > 0 and float(steady) > 0
        assert len(steps.split()) == 3 and all(float(x) > 0 for x in steps.split())


@pytest.mark.parametrize("given, said", [("64,100", "[100] not among the target's buckets 64, 128, 256, 512"),
                                         ("64,x", "give integers separated by commas")])
def test_buckets_outside_the_target_are_refused_in_one_line(given, said):
    proc = run("--buckets", given)
    assert proc.returncode == 2 and said in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_gpu_is_refused_in_one_line_where_jax_sees_none():
    proc = run("--gpu")
    assert proc.returncode == 2
    assert "JAX sees no GPU" in proc.stderr and "Traceback" not in proc.stderr
