"""The search end to end on the simulated runner (fast, no accelerator)."""
import json
import re
import subprocess
import sys

import optuna
import pandas as pd
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from searchkit import write_space
from search.cli import main
from search.encoding import all_candidates
from search.evaluate import Evaluator
from search.run import run
from spaces import load_requests, load_space
from store import ProfileCache


def _stored(run_dir):
    """The trials in a run's store, as Optuna (and optuna-dashboard) reads them."""
    storage = JournalStorage(JournalFileBackend(str(run_dir / "study.journal")))
    return optuna.load_study(study_name=run_dir.name, storage=storage).trials


def _run(space, tmp_path, **kw):
    kw.setdefault("cache", tmp_path / "cache.sqlite")
    kw.setdefault("results_dir", tmp_path / "results")
    kw.setdefault("progress", False)
    kw.setdefault("log", lambda m: None)
    return run(space, **kw)


def test_search_end_to_end_writes_every_result(tmp_path, ray_local):
    res = _run(write_space(tmp_path), tmp_path)
    front = res.front
    assert len(front) >= 1
    assert set(front["source"]) <= {"simulated"}  # only measured (here: simulated) profiles on the front
    rd = res.run_dir
    for f in ("pareto.csv", "trials.csv", "confirm.csv", "report.md", "report.html", "pareto.png", "run.json",
              "study.journal", "deploy/config.json", "deploy/space.toml"):
        assert (rd / f).exists(), f
    info = json.loads((rd / "run.json").read_text())
    assert info["simulated"] is True and info["state"] == "complete"
    assert info["profile_hardware_s"] > 0 and len(info["units_measured"]) >= 1
    assert "SIMULATED" in (rd / "report.md").read_text()
    # the deploy space file pins the chosen configuration and loads as a space
    pinned = load_space(rd / "deploy" / "space.toml")
    assert pinned.search.tp == (info["chosen"]["tp"],) and pinned.search.batch == (info["chosen"]["batch"],)
    # the trial store is an Optuna journal (optuna-dashboard opens it), one trial per candidate asked
    stored = _stored(rd)
    assert len(stored) == info["trials"] == 40
    assert all(t.user_attrs["candidate"]["tp"] == t.params["tp"] for t in stored)
    assert {t.user_attrs["source"] for t in stored if t.state.name == "COMPLETE"} <= {"simulated", "estimate:physical"}
    # lensopt confirm reads the front back from run.json's ledger
    assert [[c["tp"], c["batch"], " ".join(map(str, c["ctx_buckets"]))] for c in info["front"]] == \
        front[["tp", "batch", "ctx_buckets"]].values.tolist()
    conf = res.confirm
    assert len(conf) == min(2, len(front))
    assert (conf["throughput_tok_s_err_%"].abs() < 15).all()
    assert res.trials.shape[0] == 40 and {"tp", "batch", "state", "source_now"} <= set(res.trials.columns)


def test_rerun_resumes_without_losing_trials_or_reprofiling(tmp_path, ray_local):
    space = write_space(tmp_path)
    first = _run(space, tmp_path, name="r", trials=20, confirm=False)
    first_params = [t.params for t in _stored(first.run_dir)]
    with ProfileCache.open(tmp_path / "cache.sqlite") as c:
        before = c.frame()[["tp", "batch", "bucket", "measured_at"]]
    again = _run(space, tmp_path, name="r", trials=40, confirm=False)
    log = _stored(again.run_dir)
    assert len(log) == 40 and again.info["trials"] == 40
    assert len(first_params) == 20
    assert [t.params for t in log[:20]] == first_params  # the first 20 trials are the same ones, not redone
    # every bucket profile measured by the first run is still the same measurement (none profiled twice)
    with ProfileCache.open(tmp_path / "cache.sqlite") as c:
        after = c.frame()[["tp", "batch", "bucket", "measured_at"]]
    merged = before.merge(after, on=["tp", "batch", "bucket"], suffixes=("_before", "_after"))
    assert len(merged) == len(before)
    assert (merged["measured_at_before"] == merged["measured_at_after"]).all()


def test_a_store_line_cut_by_a_kill_is_dropped_and_the_run_resumes(tmp_path, ray_local):
    space = write_space(tmp_path)
    first = _run(space, tmp_path, name="cut", trials=20, confirm=False)
    store = first.run_dir / "study.journal"
    kept = [t.params for t in _stored(first.run_dir)][:19]
    data = store.read_bytes()
    store.write_bytes(data[:data.rstrip(b"\n").rfind(b"\n") + 40])  # the last trial's line, cut mid-write
    again = _run(space, tmp_path, name="cut", trials=40, confirm=False)
    log = _stored(again.run_dir)
    assert len(log) == 40 and [t.params for t in log[:19]] == kept
    assert store.read_bytes().endswith(b"\n")


def test_a_store_damaged_before_its_end_is_refused(tmp_path, ray_local, capsys):
    space = write_space(tmp_path)
    first = _run(space, tmp_path, name="bad", trials=20, confirm=False)
    store = first.run_dir / "study.journal"
    lines = store.read_bytes().splitlines(keepends=True)
    store.write_bytes(b"".join(lines[:3] + [b"garbage\n"] + lines[3:]))
    capsys.readouterr()
    # in this process: the command line's own exit and message, on the Ray already started
    code = main(["run", str(space), "--cache", str(tmp_path / "cache.sqlite"), "--results", str(tmp_path / "results"),
                 "--name", "bad", "--no-confirm", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "study.journal, line 4" in err and "--fresh" in err


def test_the_printed_front_reads_rates_as_numbers_and_latencies_in_seconds(tmp_path, ray_local, capsys):
    """The front's table: tok/s columns are the rates themselves (a name ending in _s is not a latency)."""
    from search.cmd_run import print_front

    res = _run(write_space(tmp_path), tmp_path, name="p", trials=20, confirm=False)
    capsys.readouterr()
    print_front(res)
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("#  "))
    cols = re.split(r"\s{2,}", lines[head].strip())  # cells hold single spaces ("4.66 ms"), columns two or more
    first = dict(zip(cols, re.split(r"\s{2,}", lines[head + 2].strip())))
    top = res.front.iloc[0]
    assert [float(first["tok/s"]), float(first["tok/s/chip"])] == pytest.approx(
        [top["throughput_tok_s"], top["throughput_tok_s_per_chip"]], rel=0.01)
    assert all(re.fullmatch(r"[\d.]+ m?s", first[c]) for c in ("TTFT p50", "TPOT p50", "E2E p90")), first


def _confirmed_rows(report: str) -> int:
    """The rows of report.md's confirmation table (0: "_not run_")."""
    section = report.split("## Confirmation on the hardware")[1].split("\n## ")[0]
    return max(0, sum(1 for line in section.splitlines() if line.startswith("| ")) - 1)  # less its header


def test_confirm_reads_the_front_from_the_ledger(tmp_path, ray_local, capsys):
    space = write_space(tmp_path)
    res = _run(space, tmp_path, name="c", trials=30, confirm=False)
    rd = res.run_dir
    assert res.confirm is None and not (rd / "confirm.csv").exists() and len(res.front) >= 1
    assert _confirmed_rows((rd / "report.md").read_text()) == 0
    trials = (rd / "trials.csv").read_bytes()
    assert main(["confirm", str(rd), "--top", "2", "--cache", str(tmp_path / "cache.sqlite"), "--no-progress"]) == 0
    info = json.loads((rd / "run.json").read_text())
    conf = pd.read_csv(rd / "confirm.csv")
    assert len(conf) == len(info["confirmed"]) == min(2, len(res.front))
    on_front = [(c["tp"], c["batch"], tuple(c["ctx_buckets"])) for c in info["front"]]
    for c in info["confirmed"]:
        cand = c["candidate"]
        assert (cand["tp"], cand["batch"], tuple(cand["ctx_buckets"])) in on_front
        assert c["predicted"]["e2e_p90_s"] > 0 and c["measured"]["e2e_p90_s"] > 0
    front = pd.read_csv(rd / "pareto.csv")
    assert front["confirmed"].sum() == len(conf) and front["confirmed"].iloc[0]  # the lowest latency end
    # the report shows the confirmation too; the search's trials are left as they were
    assert _confirmed_rows((rd / "report.md").read_text()) == len(conf)
    assert (rd / "trials.csv").read_bytes() == trials
    # a run.json without its front (as older versions wrote it) is refused with the way out
    del info["front"]
    (rd / "run.json").write_text(json.dumps(info))
    capsys.readouterr()
    assert main(["confirm", str(rd), "--cache", str(tmp_path / "cache.sqlite")]) == 2
    assert "records no Pareto front" in capsys.readouterr().err


def test_confirm_reruns_the_runs_own_workload_override(tmp_path, ray_local, capsys):
    """After ``run --workload X`` on a space with its own [workload], ``confirm`` predicts and
    measures X again (same size and seed), not the space's workload."""
    space = write_space(tmp_path)
    res = _run(space, tmp_path, name="w", trials=20, confirm=False, workload="cnn_dailymail", requests=24, seed=5)
    rd = res.run_dir
    info = json.loads((rd / "run.json").read_text())
    assert info["workload"]["source"] == "cnn_dailymail" and info["workload"]["override"] is True
    assert main(["confirm", str(rd), "--top", "1", "--cache", str(tmp_path / "cache.sqlite"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    n = 24 - info["workload"].get("dropped_longer", 0)
    assert f"with the {n}-request workload" in out
    sets = {"ctx_buckets": str, "tkg_buckets": str}  # a lone bucket ("1024") must not read as a number
    front, conf = pd.read_csv(rd / "pareto.csv", dtype=sets), pd.read_csv(rd / "confirm.csv", dtype=sets)
    row = conf.iloc[0]
    same = front[(front["tp"] == row["tp"]) & (front["batch"] == row["batch"])
                 & (front["ctx_buckets"] == row["ctx_buckets"]) & (front["tkg_buckets"] == row["tkg_buckets"])]
    # predicted on the same sample as the search predicted it
    assert row["throughput_tok_s_predicted"] == pytest.approx(same["throughput_tok_s"].iloc[0], rel=1e-9)
    # a run.json from before "override" was recorded: the source alone says it
    del info["workload"]["override"]
    (rd / "run.json").write_text(json.dumps(info))
    assert main(["confirm", str(rd), "--top", "1", "--cache", str(tmp_path / "cache.sqlite"), "--no-progress"]) == 0
    assert f"with the {n}-request workload" in capsys.readouterr().out


def test_second_search_on_a_full_cache_profiles_nothing(tmp_path, ray_local):
    space = write_space(tmp_path)
    sp = load_space(space)
    # fill the cache with every unit, as earlier searches on this target would have
    for tp in sp.search.tp:
        for b in sp.search.batch:
            assert main(["profile", str(space), "--tp", str(tp), "--batch", str(b), "--cache", str(tmp_path / "cache.sqlite")]) == 0
    other = write_space(tmp_path, "slo.toml", extra="[slo]\ne2e_p90_s = 30.0\n")
    res = _run(other, tmp_path, workload="cnn_dailymail", requests=40, confirm=False)
    assert res.info["profile_tasks_this_run"] == 0
    assert res.info["units_measured"] == [] and len(res.info["units_reused"]) == 4
    assert len(res.front) >= 1


def test_second_search_with_another_workload_profiles_only_what_it_needs(tmp_path, ray_local):
    # device memory declared: a unit's longest bucket is then not needed to know it fits
    space = write_space(tmp_path, extra="[hosts]\nmemory_gib_per_chip = 64\n")
    first = _run(space, tmp_path, name="long", workload="cnn_dailymail", confirm=False)
    with ProfileCache.open(tmp_path / "cache.sqlite") as c:
        before = c.frame()[["tp", "batch", "bucket", "measured_at"]]
    # long prompts run in the long buckets only: the short ones are left unprofiled
    assert first.info["units_measured"] and len(before) < 4 * 4
    second = _run(space, tmp_path, name="short", workload="sharegpt", confirm=False)
    with ProfileCache.open(tmp_path / "cache.sqlite") as c:
        after = c.frame()[["tp", "batch", "bucket", "measured_at"]]
    # nothing the cache held is measured again
    merged = before.merge(after, on=["tp", "batch", "bucket"], suffixes=("_before", "_after"))
    assert len(merged) == len(before) and (merged["measured_at_before"] == merged["measured_at_after"]).all()
    # each bucket the second search measured completes a candidate whose prediction on the
    # second workload runs in it: no bucket is profiled that no measured candidate uses
    sp = load_space(space)
    reqs, _ = load_requests(sp, workload="sharegpt")
    ev = Evaluator(sp, reqs)
    have: dict = {}
    for r in after.itertuples():
        have.setdefault((r.tp, r.batch), set()).add(r.bucket)
    new = after.merge(before, on=["tp", "batch", "bucket"], how="left", indicator=True)
    new = new[new["_merge"] == "left_only"]
    assert second.info["profile_tasks_this_run"] >= 1 and len(new)
    for r in new.itertuples():
        uses = [ev.used(c) for c in all_candidates(sp.search) if (c.tp, c.batch) == (r.tp, r.batch)]
        assert any(r.bucket in u and u <= have[(r.tp, r.batch)] for u in uses), (r.tp, r.batch, r.bucket)


def test_unmeetable_slo_finishes_and_reports_nearest(tmp_path, ray_local):
    space = write_space(tmp_path, extra="[slo]\ne2e_p90_s = 0.000001\n")
    res = _run(space, tmp_path, confirm=False, trials=20)
    assert res.front.empty
    md = (res.run_dir / "report.md").read_text()
    assert "No candidate meets the SLO" in md and "over the SLO on `e2e_p90_s`" in md
    assert res.info["slo_met"] is False


def test_infeasible_candidates_are_recorded_not_fatal(tmp_path, ray_local):
    # 0.3 GiB per chip: the tp=1 units cannot hold the weights (0.36 GiB), tp=2 ones can
    space = write_space(tmp_path, extra="[hosts]\nmemory_gib_per_chip = 0.3\n")
    res = _run(space, tmp_path, confirm=False, trials=30)
    t = res.trials
    bad = t[t["infeasible"].astype(str).str.contains("GiB per chip")]
    assert len(bad) > 0 and set(bad["tp"]) == {1}
    assert (res.front["tp"] == 2).all()


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "search.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_unreachable_ray_address_fails_fast_and_writes_nothing(tmp_path):
    space = write_space(tmp_path)
    r = _cli("run", str(space), "--ray-address", "127.0.0.1:9", "--results", str(tmp_path / "res"),
             "--cache", str(tmp_path / "c.sqlite"))
    assert r.returncode == 2
    assert "127.0.0.1:9" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "res").exists() and not (tmp_path / "c.sqlite").exists()


def test_trace_with_a_bad_row_names_file_and_line(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("input_len,output_len\n10,5\n12,x\n")
    space = write_space(tmp_path)
    r = _cli("run", str(space), "--workload", str(trace), "--results", str(tmp_path / "res"), "--cache", str(tmp_path / "c.sqlite"))
    assert r.returncode == 2
    assert "trace.csv, line 3" in r.stderr and "output_len" in r.stderr and "Traceback" not in r.stderr


def test_python_api_returns_dataframes(tmp_path, ray_local):
    res = _run(load_space(write_space(tmp_path)), tmp_path, confirm=False, trials=20)
    assert isinstance(res.front, pd.DataFrame) and isinstance(res.trials, pd.DataFrame)
