"""The fault suite's kit: space files, a ``lensopt run`` subprocess, process lookups, the
``fault`` record and the summary table.

Every test of the suite injects one fault for real (a killed worker, a hung program, a
killed search, two searches on one cache, a damaged cache file, impossible measurements,
a results folder that cannot be written, hostile input) and describes it through the
``fault`` fixture. At the end of the session the table "fault / injected / survived /
profiles lost / duplicated" is printed, a row per test; "survived" is the test's verdict.

(There is no ``conftest.py`` here: the test modules import these fixtures; the table is a
plugin the first of them registers. The simulated space is tests/spacekit.py's, shared with
the search tests.)
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from spacekit import sim_space

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "examples" / "command_runner" / "toy_npu.py"

SIM_SPACE = sim_space(name="fault-sim", requests=40, trials=20, top_k=1)

TOY_SPACE = """
[target]
name = "fault-toy"
runner = "command"
hardware = "toy-npu"
bucket_policy = "exclusive"
dtype = "bfloat16"

[target.model]
layers = 2
hidden = 64
heads = 4
kv_heads = 2
intermediate = 128
vocab = 256

[target.options]
argv = {argv}
timeout_s = 600.0

[space]
tp = [1]
batch = [1, 4]
buckets = [32, 64, 128]

[workload]
distribution = "sharegpt"
length_scale = 0.05
drop_longer = true
requests = 30
seed = 0

[budget]
trials = 16
top_k = 1
{extra}
"""


def sim_space(tmp_path: Path, *, options: str = "", extra: str = "", name: str = "space.toml") -> Path:
    p = tmp_path / name
    p.write_text(SIM_SPACE.format(options=options, extra=textwrap.dedent(extra)))
    return p


def toy_space(tmp_path: Path, *toy_args: str, extra: str = "", name: str = "toy.toml") -> Path:
    argv = ["{python}", str(TOY), *toy_args]
    p = tmp_path / name
    p.write_text(TOY_SPACE.format(argv="[" + ", ".join(f'"{a}"' for a in argv) + "]", extra=textwrap.dedent(extra)))
    return p


def cli_run(*args: str, cwd: Path = ROOT, **popen) -> subprocess.Popen:
    """``lensopt run`` in its own process (and process group, so whatever it starts can be stopped)."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "search.cli", "run", *args, "--no-progress"], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **popen)


def stop_group(proc: subprocess.Popen) -> None:
    """SIGKILL what is left of a process group this suite started (Ray agents outlive a killed driver)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.communicate(timeout=30)
    except (subprocess.TimeoutExpired, ValueError):
        pass


def descendants_named(prefix: bytes, root: int) -> list[int]:
    """Pids of processes whose command line starts with ``prefix`` and that descend from ``root``."""
    parents: dict[int, int] = {}
    cmd: dict[int, bytes] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/status") as fh:
                ppid = next(int(line.split()[1]) for line in fh if line.startswith("PPid:"))
            with open(f"/proc/{d}/cmdline", "rb") as fh:
                cmd[int(d)] = fh.read()
        except (OSError, StopIteration, ValueError):
            continue
        parents[int(d)] = ppid
    out = []
    for pid, line in cmd.items():
        if not line.startswith(prefix):
            continue
        p = pid
        while p > 1 and p in parents:
            p = parents[p]
            if p == root:
                out.append(pid)
                break
    return out


def processes_with(marker: str) -> list[int]:
    """Pids whose command line holds ``marker`` (a token unique to one test)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as fh:
                    if marker.encode() in fh.read():
                        out.append(int(d))
            except OSError:
                pass
    return out


def wait_for(pred, timeout: float, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(step)
    return None


# -- the summary table -------------------------------------------------------------------
@dataclass
class FaultRecord:
    fault: str
    injected: str = ""
    #: profiles lost (a number, or a phrase when the fault destroys some by itself)
    lost: int | str | None = None
    duplicated: int | None = None
    passed: bool | None = None


_RECORDS: dict[str, FaultRecord] = {}


class _FaultTable:
    """Collects each fault test's verdict and prints the table at the end of the session."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        rep = outcome.get_result()
        rec = _RECORDS.get(item.nodeid)
        if rec is None:
            return
        if rep.when == "call":
            rec.passed = rep.passed
        elif rep.failed:  # setup or teardown failed
            rec.passed = False

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config):
        if not _RECORDS:
            return
        header = ["fault", "injected", "survived", "profiles lost", "duplicated"]
        rows = [[r.fault, r.injected or "-", "yes" if r.passed else ("NO" if r.passed is False else "not run"),
                 "-" if r.lost is None else str(r.lost), "-" if r.duplicated is None else str(r.duplicated)]
                for r in _RECORDS.values()]
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        tr = terminalreporter
        tr.write_sep("=", "fault suite")
        tr.write_line("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
        tr.write_line("  ".join("-" * w for w in widths))
        for r in rows:
            tr.write_line("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


@pytest.fixture
def fault(request):
    """Describe the fault a test injects: ``fault.fault``, ``.injected``, ``.lost``, ``.duplicated``."""
    pm = request.config.pluginmanager
    if pm.get_plugin("lensopt-fault-table") is None:
        pm.register(_FaultTable(), "lensopt-fault-table")
    rec = FaultRecord(fault=request.node.name)
    _RECORDS[request.node.nodeid] = rec
    return rec


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray for the module (a search finds it started and leaves it running).

    It is stopped when the module ends, so it never runs beside the Ray clusters that
    later tests start on this machine.
    """
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()
