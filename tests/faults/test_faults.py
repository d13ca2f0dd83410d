"""Faults injected for real: nothing measured is lost, nothing is measured twice, every
failure ends in a clear message (exit 2) instead of a traceback."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from faultkit import (  # noqa: F401  (fault and ray_session are fixtures)
    cli_run, descendants_named, fault, processes_with, ray_session, sim_space, stop_group, toy_space, wait_for,
)
from lens.types import BucketProfile
from runners import get_runner
from search.cli import main
from search.profiler import measure_unit
from search.run import run
from spaces import load_space
from store import PROFILE_COLUMNS, ProfileCache


def _run(space, tmp_path, logs=None, **kw):
    kw.setdefault("cache", tmp_path / "cache.sqlite")
    kw.setdefault("results_dir", tmp_path / "results")
    kw.setdefault("progress", False)
    kw.setdefault("log", (logs.append if logs is not None else (lambda m: None)))
    return run(space, **kw)


def _single_compile_s(space: Path, tp: int, batch: int) -> float:
    """Hardware seconds the simulator reports for compiling one unit once (deterministic)."""
    sp = load_space(space)
    t = sp.target
    quiet = type(t)(**{**t.__dict__, "options": tuple((k, v) for k, v in t.options if k != "wall_delay_s")})
    m = measure_unit(quiet, tp=tp, batch=batch, buckets=sp.search.buckets, all_buckets=sp.search.buckets,
                     profile=sp.profile)
    return m.compile_s


def _whole_units(cache_path: Path, space: Path) -> tuple[pd.DataFrame, int, int]:
    """The cache's units, how many units of the space are missing or partial, how many were stored twice."""
    sp = load_space(space)
    with ProfileCache.open(cache_path, create=False) as c:
        assert c.integrity_check() == "ok"
        units = c.units()
    want = {(t, b) for t in sp.search.tp for b in sp.search.batch}
    have = {(int(r.tp), int(r.batch)): r for r in units.itertuples()}
    lost = sum(1 for u in want if u not in have or have[u].n_buckets != len(sp.search.buckets))
    dup = sum(1 for u, r in have.items() if r.compile_s > 1.5 * _single_compile_s(space, *u))
    return units, lost, dup


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


# -- 1. a Ray worker killed in the middle of a profiling task ------------------------------------
def test_worker_killed_mid_task_is_retried(tmp_path, ray_session, fault):
    fault.fault = "Ray worker SIGKILLed mid-task"
    # (the delay is slept per runner call: a unit's task makes about seven -- its probes, the row cost's workload,
    # the admission measurement's four calls, the context cost's workload)
    space = sim_space(tmp_path, options="wall_delay_s = 0.4")
    killed: list[int] = []

    def killer():
        pids = wait_for(lambda: descendants_named(b"ray::_measure_task", os.getpid()), timeout=90)
        if pids:
            time.sleep(0.5)  # the task is inside its profile call now
            os.kill(pids[0], signal.SIGKILL)
            killed.append(pids[0])

    th = threading.Thread(target=killer, daemon=True)
    th.start()
    res = _run(space, tmp_path, profile_all=True, confirm=False, trials=10)
    th.join(10)
    assert killed, "no profiling task was seen running"
    fault.injected = "SIGKILL to the worker running _measure_task"
    assert wait_for(lambda: not Path(f"/proc/{killed[0]}").exists() or
                    "State:\tZ" in Path(f"/proc/{killed[0]}/status").read_text(), 10)
    assert res.info["units_failed"] == {}
    assert res.info["profile_tasks_this_run"] == 4  # one outcome per unit: the killed one was retried
    units, lost, dup = _whole_units(tmp_path / "cache.sqlite", space)
    fault.lost, fault.duplicated = lost, dup
    assert len(units) == 4 and lost == 0 and dup == 0  # no partial unit, none stored twice
    assert len(res.front) >= 1


# -- 2. a hung program: the per-task timeout --------------------------------------------------
def test_hung_profile_times_out_and_the_search_goes_on(tmp_path, ray_session, fault):
    fault.fault = "hung compile/run (per-task timeout)"
    marker = f"hang-{os.getpid()}-{time.time_ns()}"
    space = toy_space(tmp_path, "--mode", "slow", "--sleep", "300", "--fail-on", "profile", "--only-batch", "4",
                      "--label", marker, extra="[profile]\ntimeout_s = 4\n")
    fault.injected = "toy program sleeps 300 s in profile (batch 4); profile.timeout_s = 4"
    try:
        res = _run(space, tmp_path, profile_all=True, confirm=False, trials=12)
        # the hung program was stopped with its worker: nothing of it is left running
        left = wait_for(lambda: not processes_with(marker), timeout=15)
    finally:
        stray = processes_with(marker)
        for pid in stray:  # ours (the marker is unique to this test): never leave them behind
            os.kill(pid, signal.SIGKILL)
    assert left, f"the hung program survived its task: pids {stray}"
    failed = res.info["units_failed"]
    assert list(failed) == ["1x4"] and "profile.timeout_s" in failed["1x4"] and "TimeoutError" in failed["1x4"]
    md = (res.run_dir / "report.md").read_text()
    assert "Units whose profiling failed" in md and "1x4" in md and "timeout" in md
    assert len(res.front) >= 1 and set(res.front["batch"]) == {1}
    with ProfileCache.open(tmp_path / "cache.sqlite", create=False) as c:
        units = c.units()
        assert c.claims().empty  # the claim of the timed-out unit was given back
    assert [(int(r.tp), int(r.batch), int(r.n_buckets)) for r in units.itertuples()] == [(1, 1, 3)]
    fault.lost, fault.duplicated = 0, 0


def test_hung_confirmation_times_out_and_hardware_seconds_count_the_warm_up(tmp_path, ray_session, fault):
    """Confirmation tasks have a timeout as profiling tasks do; a confirmation that ran counts
    the warm-up run (which compiles every graph) as well as the measured passes."""
    from lens.types import Candidate
    from search.confirm import confirm_front
    from search.dispatch import Dispatcher
    from search.evaluate import Evaluator
    from search.ledger import RunLedger
    from spaces import load_requests

    fault.fault = "hung confirmation (per-task timeout)"
    marker = f"hang-confirm-{os.getpid()}-{time.time_ns()}"
    path = toy_space(tmp_path, "--mode", "slow", "--sleep", "300", "--fail-on", "run_workload", "--only-batch", "4",
                     "--label", marker)
    path.write_text(path.read_text().replace("[budget]\n", "[budget]\nconfirm_timeout_s = 4\n"))
    space = load_space(path)
    fault.injected = "toy program sleeps 300 s in run_workload (batch 4); budget.confirm_timeout_s = 4"
    reqs, _ = load_requests(space)
    runner = get_runner(space.target)
    ev = Evaluator(space, reqs)
    bk = space.search.buckets
    front = []
    # profiled by the same program behaving (profiling a batch-4 unit runs a workload too: its row cost)
    plain = load_space(toy_space(tmp_path, name="plain.toml"))
    for batch in (1, 4):
        m = measure_unit(plain.target, tp=1, batch=batch, buckets=bk, all_buckets=bk, profile=space.profile)
        ev.set_measured((1, batch), m.profiles)
        front.append(ev.evaluate(Candidate(1, batch, bk, bk), with_prediction=True))
    ledger = RunLedger()
    try:
        got = confirm_front(front, 2, space=space, requests=reqs, dispatcher=Dispatcher(resources_for=space.hosts.resources_for),
                            ledger=ledger, log=lambda m: None, progress=False)
        left = wait_for(lambda: not processes_with(marker), timeout=15)
    finally:
        stray = processes_with(marker)
        for pid in stray:
            os.kill(pid, signal.SIGKILL)
    assert left, f"the hung program survived its task: pids {stray}"
    ok, hung = got
    assert hung.error is not None and "TimeoutError" in hung.error and "budget.confirm_timeout_s" in hung.error
    assert ok.error is None
    # the same runs the task made (the warm-up, then budget.confirm_repeats passes), made here: the toy's
    # seconds are deterministic
    c = front[0].candidate
    warm, full = runner.run_workload(c, reqs.head(c.batch)), runner.run_workload(c, reqs)
    assert warm.compile_s > 0 and space.budget.confirm_repeats > 1
    assert ledger.confirm_hardware_s == pytest.approx(warm.compile_s + warm.run_s
                                                      + space.budget.confirm_repeats * (full.compile_s + full.run_s))
    fault.lost, fault.duplicated = 0, 0


# -- 3. `lensopt run` killed with SIGKILL mid-search -------------------------------------------
def _journal(path: Path) -> list[tuple]:
    """The trials in a run's store (lines a kill cut short are not read)."""
    if not path.exists():
        return []
    try:
        st = optuna.load_study(study_name=path.parent.name, storage=JournalStorage(JournalFileBackend(str(path))))
    except KeyError:  # the store holds no study yet
        return []
    return [(t.number, t.state.name, t.params, t.values) for t in st.trials]


def test_sigkilled_search_resumes_without_losing_or_repeating(tmp_path, fault):
    fault.fault = "`lensopt run` SIGKILLed mid-search"
    space = sim_space(tmp_path, options="wall_delay_s = 0.2")
    cache, res = tmp_path / "cache.sqlite", tmp_path / "res"
    args = [str(space), "--cache", str(cache), "--results", str(res), "--name", "k", "--trials", "60", "--no-confirm"]
    journal = res / "k" / "study.journal"

    def cached_units() -> int:
        if not cache.exists():
            return 0
        with ProfileCache.open(cache, create=False) as c:
            return len(c.units())

    proc = cli_run(*args)
    try:
        hit = wait_for(lambda: proc.poll() is None and len(_journal(journal)) >= 5 and cached_units() >= 1,
                       timeout=120, step=0.1)
        assert hit and proc.poll() is None, "the search ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
        fault.injected = f"SIGKILL to `lensopt run` after {len(_journal(journal))} trials"
    finally:
        stop_group(proc)
    before_trials = _journal(journal)
    with ProfileCache.open(cache, create=False) as c:
        before = c.frame()[["tp", "batch", "bucket", "measured_at"]]
        before_units = c.units()[["tp", "batch", "compile_s"]]
    again = cli_run(*args)
    out, err = again.communicate(timeout=240)
    stop_group(again)
    assert again.returncode == 0, err[-3000:]
    assert "is being profiled by" not in out + err
    after_trials = _journal(journal)
    assert len(after_trials) == 60
    assert after_trials[:len(before_trials)] == before_trials  # every trial of the killed run kept, in order
    with ProfileCache.open(cache, create=False) as c:
        after = c.frame()[["tp", "batch", "bucket", "measured_at"]]
        after_units = c.units()[["tp", "batch", "compile_s"]]
        assert c.claims().empty
    m = before.merge(after, on=["tp", "batch", "bucket"], how="left", suffixes=("_before", "_after"))
    lost = int(m["measured_at_after"].isna().sum())
    dup = int((m["measured_at_after"] != m["measured_at_before"]).sum()) - lost
    mu = before_units.merge(after_units, on=["tp", "batch"], suffixes=("_before", "_after"))
    dup += int((mu["compile_s_after"] != mu["compile_s_before"]).sum())
    fault.lost, fault.duplicated = lost, dup
    assert lost == 0 and dup == 0
    info = json.loads((res / "k" / "run.json").read_text())
    assert info["state"] == "complete"


# -- 4. two `lensopt run` at once on one cache file ------------------------------------------
def test_two_searches_share_one_cache_and_profile_each_unit_once(tmp_path, fault):
    fault.fault = "two `lensopt run` on one cache"
    space = sim_space(tmp_path, options="wall_delay_s = 0.5")
    cache = tmp_path / "shared.sqlite"
    procs = [cli_run(str(space), "--cache", str(cache), "--results", str(tmp_path / "res"), "--name", f"p{i}",
                     "--trials", "20", "--no-confirm", "--profile-all") for i in (0, 1)]
    fault.injected = "2 processes, --profile-all of the same 4 units, started together"
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=240))
    finally:
        for p in procs:
            stop_group(p)
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    infos = [json.loads((tmp_path / "res" / f"p{i}" / "run.json").read_text()) for i in (0, 1)]
    tasks = sum(i["profile_tasks_this_run"] for i in infos)
    units, lost, dup = _whole_units(cache, space)
    fault.lost, fault.duplicated = lost, dup + max(0, tasks - 4)
    assert len(units) == 4 and lost == 0 and dup == 0
    assert tasks == 4  # each unit profiled by exactly one of the two
    waited = sum(len(i["units_waited"]) for i in infos)
    assert waited >= 1 and any("is being profiled by" in out for out, _ in outs)  # one really waited for the other
    with ProfileCache.open(cache, create=False) as c:
        assert c.claims().empty


def test_a_dead_claimant_elsewhere_is_waited_out_then_replaced(tmp_path, ray_session, fault):
    fault.fault = "claimant died on another host"
    space = sim_space(tmp_path)
    cache = tmp_path / "cache.sqlite"
    fp = get_runner(load_space(space).target).fingerprint()
    with ProfileCache.open(cache) as c:
        got = c.claim_unit(fingerprint=fp, tp=1, batch=1, buckets=[128, 256, 512, 1024],
                           owner="another-host:4242:00000000", lease_s=4.0)
        assert got.granted
    fault.injected = "a claim on unit tp1 b1 by a dead process of another host, lease 4 s"
    logs: list[str] = []
    t0 = time.monotonic()
    res = _run(space, tmp_path, logs, profile_all=True, confirm=False, trials=8)
    assert time.monotonic() - t0 >= 3.5  # waited for the lease
    assert any("another-host:4242" in m for m in logs)
    assert res.info["profile_tasks_this_run"] == 4 and res.info["units_failed"] == {}
    units, lost, dup = _whole_units(cache, space)
    fault.lost, fault.duplicated = lost, dup
    assert len(units) == 4 and lost == 0 and dup == 0


# -- 5. a truncated or corrupted cache file ----------------------------------------------------
def _fill(path: Path, n: int = 120) -> int:
    with ProfileCache.open(path) as c:
        for i in range(n):
            c.put_unit(fingerprint=f"{i:016x}", tp=1 + i % 2, batch=4, target={"i": i}, runner="sim", versions={},
                       host="h", compile_s=1.0, run_s=1.0,
                       profiles=[BucketProfile(bucket=b, ttft_s=0.01 * b, tbt_s=0.001, input_len=b // 2, l1=2, l2=64,
                                               t1_s=0.1, t2_s=0.2, repeats=3, spread=0.01, raw_t1=(0.1,) * 3,
                                               raw_t2=(0.2,) * 3, source="simulated", simulated=True)
                                 for b in (128, 256, 512)])
    return 3 * n


def _garbage_page(path: Path, which: float) -> str:
    size = path.stat().st_size
    page = int(size / 4096 * which)
    with open(path, "r+b") as f:
        f.seek(page * 4096)
        f.write(os.urandom(4096))
    return f"a page of random bytes at page {page + 1} of {size // 4096}"


@pytest.mark.parametrize("damage", ["truncated-half", "truncated-mid-page", "garbage-page"])
def test_damaged_cache_is_refused_with_a_recovery_command(tmp_path, damage, capsys, fault):
    fault.fault = f"cache file {damage}"
    cache = tmp_path / "profiles.sqlite"
    n = _fill(cache)
    size = cache.stat().st_size
    if damage == "truncated-half":
        os.truncate(cache, size // 2)
        fault.injected = f"cut from {size} to {size // 2} bytes"
    elif damage == "truncated-mid-page":
        os.truncate(cache, size * 3 // 4 + 1234)
        fault.injected = f"cut from {size} to {size * 3 // 4 + 1234} bytes (mid-page)"
    else:
        fault.injected = _garbage_page(cache, 0.5)
    sha = _sha(cache)
    space = sim_space(tmp_path)
    res = tmp_path / "res"
    (tmp_path / "x.csv").write_text(",".join(PROFILE_COLUMNS) + "\n")
    capsys.readouterr()
    for argv in (["cache", "ls", "--cache", str(cache)],
                 ["run", str(space), "--cache", str(cache), "--results", str(res), "--no-progress"],
                 ["profile", str(space), "--tp", "1", "--batch", "4", "--cache", str(cache)],
                 ["cache", "import", str(tmp_path / "x.csv"), "--cache", str(cache)]):
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2, (argv, err)
        assert "Traceback" not in err and str(cache) in err, err
        assert "damaged" in err and "lensopt cache recover" in err, err
    assert _sha(cache) == sha  # never written
    assert not res.exists()  # the search stopped before writing anything
    assert not list(tmp_path.glob("*.recovered"))
    # the recovery command the message gives works, and leaves the damaged file alone
    assert main(["cache", "recover", str(cache)]) == 0
    out = capsys.readouterr().out
    rec = Path(str(cache) + ".recovered")
    assert "recovered" in out and rec.exists() and _sha(cache) == sha
    with ProfileCache.open(rec, create=False) as c:
        assert c.integrity_check() == "ok"
        got = len(c.frame())
        assert (c.frame()["tbt_s"] > 0).all()
    assert main(["cache", "recover", str(cache)]) == 2  # never overwrites the first recovery
    assert "already exists" in capsys.readouterr().err
    # what the damage itself destroyed; everything still readable was salvaged
    fault.lost, fault.duplicated = f"{n - got} of {n} (on the damaged pages)", 0
    assert got > 0


# -- 6. impossible or noisy measurements -------------------------------------------------------
def _tpot_ok(res) -> bool:
    t = res.trials
    cols = [c for c in t.columns if c.startswith(("tpot_", "ttft_", "e2e_"))]
    vals = t[cols].to_numpy(dtype=float)
    return bool(((vals > 0) | pd.isna(vals)).all())


def test_impossible_measurement_is_retried_then_left_out(tmp_path, ray_session, fault):
    fault.fault = "impossible measurement (T2 <= T1)"
    space = toy_space(tmp_path, "--mode", "flat", "--fail-on", "profile", "--only-batch", "4")
    fault.injected = "every profile run of batch 4 takes the same time"
    res = _run(space, tmp_path, profile_all=True, confirm=False, trials=12)
    failed = res.info["units_failed"]
    assert list(failed) == ["1x4"]
    assert "noisy measurement" in failed["1x4"] and "3 attempt(s)" in failed["1x4"] and "3, 6, 12 repeats" in failed["1x4"]
    md = (res.run_dir / "report.md").read_text()
    assert "Units whose profiling failed" in md and "noisy measurement" in md
    assert _tpot_ok(res) and set(res.front["batch"]) == {1}
    with ProfileCache.open(tmp_path / "cache.sqlite", create=False) as c:
        f = c.frame()
    assert set(f["batch"]) == {1} and (f["tbt_s"] > 0).all() and (f["ttft_s"] > 0).all()
    fault.lost, fault.duplicated = 0, 0


def test_a_resumed_run_keeps_its_failed_units_until_one_is_measured(tmp_path, ray_session, fault):
    """A unit that failed in a run (not for good: an impossible measurement) is not profiled
    again when the run resumes; once it is measured after all, the run no longer lists it."""
    fault.fault = "a failed unit across a resume"
    count = tmp_path / "calls"
    space = toy_space(tmp_path, "--mode", "flat", "--fail-on", "profile", "--only-batch", "4", "--fail-times", "3",
                      "--count-file", str(count))
    fault.injected = "the first 3 profile calls of batch 4 are flat (one failed unit), later ones are good"
    first = _run(space, tmp_path, profile_all=True, confirm=False, trials=8, name="r")
    assert list(first.info["units_failed"]) == ["1x4"] and count.read_bytes() == b"..."
    # the same command again resumes the run: the evaluator knows what its ledger says
    again = _run(space, tmp_path, profile_all=True, confirm=False, trials=8, name="r")
    assert count.read_bytes() == b"..."  # not profiled again
    assert list(again.info["units_failed"]) == ["1x4"] and set(again.front["batch"]) == {1}
    # asked to retry, the unit is measured (the program now answers well) and leaves the list
    retry = _run(space, tmp_path, profile_all=True, confirm=False, trials=8, name="r", retry_failed=True)
    assert count.read_bytes() == b"...."
    assert retry.info["units_failed"] == {} and [1, 4] in retry.info["units_measured"]
    assert "Units whose profiling failed" not in (retry.run_dir / "report.md").read_text()
    fault.lost, fault.duplicated = 0, 0


def test_noisy_measurement_is_kept_flagged_and_reported(tmp_path, ray_session, fault):
    fault.fault = "huge spread between repeats"
    space = toy_space(tmp_path, "--mode", "outlier", "--fail-on", "profile", "--only-batch", "4")
    fault.injected = "one repeat of every run of batch 4 is 5x slower"
    res = _run(space, tmp_path, profile_all=True, confirm=False, trials=12)
    assert res.info["units_failed"] == {}
    noisy = res.info["units_noisy"]
    assert list(noisy) == ["1x4"] and len(noisy["1x4"]) == 3
    assert all("max_spread" in why and "3 attempt(s)" in why for why in noisy["1x4"].values())
    md = (res.run_dir / "report.md").read_text()
    assert "## Noisy measurements" in md and "1x4" in md
    assert _tpot_ok(res)
    with ProfileCache.open(tmp_path / "cache.sqlite", create=False) as c:
        f = c.frame()
    assert (f["tbt_s"] > 0).all() and (f[f["batch"] == 4]["spread"] > 0.5).all()
    fault.lost, fault.duplicated = 0, 0


def test_transient_noise_is_measured_again_and_passes(tmp_path, ray_session, fault):
    fault.fault = "transient impossible measurement"
    count = tmp_path / "calls"
    space = toy_space(tmp_path, "--mode", "flat", "--fail-on", "profile", "--only-batch", "4", "--fail-times", "1",
                      "--count-file", str(count))
    fault.injected = "the first profile call of batch 4 is flat, later ones are good"
    res = _run(space, tmp_path, profile_all=True, confirm=False, trials=12)
    assert res.info["units_failed"] == {} and res.info["units_noisy"] == {}
    attempts = {(t["tp"], t["batch"]): t["attempts"] for t in res.info["unit_tasks"]}
    assert attempts == {(1, 1): 1, (1, 4): 2}
    assert _tpot_ok(res)
    fault.lost, fault.duplicated = 0, 0


def test_out_of_device_memory_is_not_retried_is_remembered_and_skipped(tmp_path, ray_session, fault, capsys):
    """A deterministic failure: one call (no Ray retry), one line, remembered in the cache so
    that the next search skips the unit; ``--retry-failed`` measures it again."""
    fault.fault = "out of device memory (a failure that repeats)"
    count = tmp_path / "calls"
    space = toy_space(tmp_path, "--mode", "oom", "--fail-on", "profile", "--only-batch", "4", "--fail-times", "1000",
                      "--count-file", str(count))
    fault.injected = "every profile call of batch 4 answers out of device memory (kind out_of_memory)"
    logs: list[str] = []
    res = _run(space, tmp_path, logs, profile_all=True, confirm=False, trials=8, name="first")
    assert count.read_bytes() == b"."  # called once: Ray did not retry it
    failed = res.info["units_failed"]
    assert list(failed) == ["1x4"] and failed["1x4"].startswith("DeviceOutOfMemory: ") and "\n" not in failed["1x4"]
    lines = [m for m in logs if "FAILED" in m]
    assert len(lines) == 1 and "out of device memory" in lines[0] and "\n" not in lines[0]
    cache = tmp_path / "cache.sqlite"
    with ProfileCache.open(cache, create=False) as c:
        rec = c.get_failure(res.info["fingerprint"], 1, 4)
        assert c.claims().empty
    assert rec is not None and rec.kind == "DeviceOutOfMemory" and "out of device memory" in rec.reason
    capsys.readouterr()
    assert main(["cache", "ls", "--cache", str(cache)]) == 0
    listing = capsys.readouterr().out
    assert "failed for good" in listing and "out of device memory" in listing and "1 failed unit" in listing
    # another search on the same cache skips it: the program is not called again
    again = _run(space, tmp_path, profile_all=True, confirm=False, trials=8, name="second")
    assert count.read_bytes() == b"."
    assert "recorded in the profile cache" in again.info["units_failed"]["1x4"]
    assert "1x4" in (again.run_dir / "report.md").read_text()
    # asked to, it tries again (and, failing again, the record is renewed)
    retry = _run(space, tmp_path, profile_all=True, confirm=False, trials=8, name="third", retry_failed=True)
    assert count.read_bytes() == b".."
    assert retry.info["units_failed"]["1x4"].startswith("DeviceOutOfMemory: ")
    fault.lost, fault.duplicated = 0, 0


# -- 7. a results folder that cannot be written -------------------------------------------------
def _seed_cache(space: Path, cache: Path) -> str:
    assert main(["profile", str(space), "--tp", "1", "--batch", "1", "--cache", str(cache)]) == 0
    return _sha(cache)


def test_results_folder_not_writable(tmp_path, capsys, fault):
    fault.fault = "results folder not writable"
    space = sim_space(tmp_path)
    cache = tmp_path / "cache.sqlite"
    sha = _seed_cache(space, cache)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the results folder should be\n")
    fault.injected = "--results under a regular file (root ignores chmod)"
    capsys.readouterr()
    code = main(["run", str(space), "--cache", str(cache), "--results", str(blocker / "results"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert str(blocker / "results") in err and "not writable" in err and "--results" in err
    assert _sha(cache) == sha
    fault.lost, fault.duplicated = 0, 0


def _tiny_tmpfs(where: Path) -> bool:
    where.mkdir()
    if shutil.which("mount") is None:
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(where)], capture_output=True)
    return r.returncode == 0


def test_disk_full_mid_search(tmp_path, ray_session, capsys, fault):
    fault.fault = "disk full in the results folder"
    space = sim_space(tmp_path)
    cache = tmp_path / "cache.sqlite"
    full = tmp_path / "full"
    mounted = _tiny_tmpfs(full)
    try:
        if mounted:
            fault.injected = "results on an 8 KiB tmpfs (ENOSPC from the kernel)"
        else:  # no mount permission: the kernel's always-full device for one results file
            (full / "r").mkdir()
            os.symlink("/dev/full", full / "r" / "trials.csv")
            fault.injected = "trials.csv -> /dev/full (ENOSPC from the kernel)"
        capsys.readouterr()
        code = main(["run", str(space), "--cache", str(cache), "--results", str(full), "--name", "r",
                     "--trials", "40", "--no-confirm", "--no-progress"])
        err = capsys.readouterr().err
        assert code == 2, err
        assert "Traceback" not in err and "No space left on device" in err and str(full / "r") in err
        assert "--results" in err
    finally:
        if mounted:
            subprocess.run(["umount", str(full)], check=False)
    # the cache is whole: every unit in it has all its buckets, and it is reused by the next run
    sp = load_space(space)
    with ProfileCache.open(cache, create=False) as c:
        assert c.integrity_check() == "ok"
        units = c.units()
        before = c.frame()[["tp", "batch", "bucket", "measured_at"]]
    assert len(units) >= 1 and (units["n_buckets"] == len(sp.search.buckets)).all()
    res = run(space, cache=cache, results_dir=tmp_path / "ok", trials=20, confirm=False, progress=False, log=lambda m: None)
    assert len(res.info["units_reused"]) >= len(units)
    with ProfileCache.open(cache, create=False) as c:
        after = c.frame()[["tp", "batch", "bucket", "measured_at"]]
    m = before.merge(after, on=["tp", "batch", "bucket"], how="left", suffixes=("_b", "_a"))
    fault.lost = int(m["measured_at_a"].isna().sum())
    fault.duplicated = int((m["measured_at_a"] != m["measured_at_b"]).sum()) - fault.lost
    assert fault.lost == 0 and fault.duplicated == 0
