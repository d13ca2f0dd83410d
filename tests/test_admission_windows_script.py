"""``benchmarks/admission_windows.py``: the admission offsets side by side, by window and prompt (simulated fleet)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "admission_windows.py"
OFFSET = r"([+-][\d.]+) \+- ([\d.]+) ms \(sd ([\d.]+)\)"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--runner", "sim", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_each_prompt_gets_its_idle_offset_and_a_busy_one_per_window_paired_against_the_first():
    proc = run("--rounds", "3", "--prompts", "smallest,largest", "--profile-repeats", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "(SIMULATED device)" in out.splitlines()[0]
    prompts = [int(b) for b in re.findall(r"^prompt bucket (\d+): static [\d.]+ ms", out, re.M)]
    assert prompts == [256, 4096]  # the simulated fleet's smallest and largest buckets
    assert len(re.findall(rf"^  idle, a pass's first prompt: {OFFSET}$", out, re.M)) == 2
    busy = re.findall(rf"^  busy, carriers in window (\d+) \(([\d.]+) ms steps, (\d+) carriers of (\d+)\): {OFFSET}"
                      rf"(?:; less window (\d+)'s, paired: {OFFSET})?$", out, re.M)
    assert len(busy) == 4  # two windows per prompt: the smallest and the largest that hold a carrier
    for first, second in (busy[:2], busy[2:]):
        assert int(first[0]) < int(second[0]) and first[7] == "" and int(second[7]) == int(first[0])
        assert float(first[1]) < float(second[1])  # the larger window's steps are longer
        # the paired difference is the second window's offset less the first's, round by round
        assert abs(float(second[8]) - (float(second[4]) - float(first[4]))) < 2e-3
        for b in (first, second):
            assert int(b[2]) * int(b[3]) >= 24 and float(b[6]) >= 0  # 24 lone arrivals a call at least


def test_a_window_that_holds_no_carrier_is_refused_in_one_line():
    proc = run("--rounds", "2", "--windows", "999", "--profile-repeats", "2")
    assert proc.returncode == 2
    assert "--windows '999'" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_a_batch_of_one_is_refused():
    proc = run("--batch", "1")
    assert proc.returncode == 2 and "--batch must be 2 or more" in proc.stderr and "Traceback" not in proc.stderr
