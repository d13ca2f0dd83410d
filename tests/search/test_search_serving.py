"""A search under continuous serving, end to end on the simulated runner: objectives at the
workload's arrival rate, the sustainable rate, confirmation under the same arrivals, the sweep."""
import json

import pandas as pd
import pytest

from lens.prefill_tail import LEVELS
from searchkit import SIM_SPACE
from spaces import load_space
from search.cli import main
from search.cmd_run import _num, print_front
from search.run import run

SERVING = (SIM_SPACE.format(options="", extra="")
           .replace('dtype = "bfloat16"\n', 'dtype = "bfloat16"\nserving = "continuous"\n', 1)
           .replace("seed = 0\n", "seed = 0\narrival_rate = 4.0\n", 1)
           + '\n[objectives]\nthroughput = "sustainable_rate_req_s_per_chip"\nlatency = "ttft_p90_s"\n'
           + '\n[slo]\nttft_p90_s = 2.0\n\n[target.scheduler]\nmax_prefills = 0\n')


def test_continuous_search_end_to_end(tmp_path, ray_local, capsys):
    space = tmp_path / "serving.toml"
    space.write_text(SERVING)
    res = run(space, cache=tmp_path / "cache.sqlite", results_dir=tmp_path / "results", progress=False,
              log=lambda m: None, trials=30)
    rd = res.run_dir
    info = json.loads((rd / "run.json").read_text())
    assert info["workload"]["arrivals"] == "poisson" and info["workload"]["arrival_rate"] == 4.0
    # each unit's task records what its host costs came to, counted or not (a served target measures its
    # admissions and its resume cost)
    for task in info["unit_tasks"]:
        costs = task["host_costs"]
        assert {"the served admissions", "the resume cost"} <= set(costs), costs
        assert "a pass's first prompt" in costs["the served admissions"] and "ms" in costs["the resume cost"]
    # and, with a slot free while a carrier decodes (batch 4), what a busy pass costs the decode after it
    busy = [t["host_costs"]["the resume cost after a busy pass"] for t in info["unit_tasks"]
            if "the resume cost after a busy pass" in t["host_costs"]]
    assert busy and all("per second of the pass's largest prefill" in b for b in busy), busy
    front = res.front
    assert len(front) >= 1 and (front["sustainable_rate_req_s_per_chip"] > 0).all()
    # the objective is the largest sustainable rate per chip, found by bisection on predictions
    assert (front["sustainable_rate_req_s_per_chip"] * front["tp"]).round(6).equals(
        front["sustainable_rate_req_s"].round(6))
    # the band of each front point: the same machine on the profiles one standard error below and above
    for name in ("sustainable_rate_req_s_per_chip", "ttft_p90_s"):
        assert (front[f"{name}_low"] <= front[name] * (1 + 1e-9)).all()
        assert (front[name] <= front[f"{name}_high"] * (1 + 1e-9)).all()
    assert (front["ttft_p90_s_high"] > front["ttft_p90_s_low"]).any()
    # the sweep: every front candidate (up to 6) at rates that bracket its saturation, with a plot
    sweep = pd.read_csv(rd / "rate_sweep.csv")
    # every swept candidate is one of the front's units, and the front (up to 6 of it) is swept
    swept_units = {tuple(map(int, l.replace("tp", "").replace("b", "").split()[:2])) for l in sweep["candidate"]}
    assert swept_units <= set(zip(front["tp"], front["batch"]))
    assert sweep["candidate"].nunique() >= min(2, len(front))
    assert (sweep.groupby("candidate").size() >= 14).all()
    for _, g in sweep.groupby("candidate"):
        assert g["sustainable"].iloc[0] and not g["sustainable"].iloc[-1]  # sustainable at a trickle, not past saturation
        assert g["e2e_p90_s"].iloc[-1] > g["e2e_p90_s"].iloc[0]
    assert (rd / "rate_sweep.png").stat().st_size > 10_000
    report = (rd / "report.md").read_text()
    assert "Latency vs arrival rate" in report and "rate_sweep.png" in report
    assert "continuous serving (any number of prompts between decode steps, prefill priority)" in report
    assert '<img alt="rate sweep" src="data:image/png;base64,' in (rd / "report.html").read_text()
    # confirmation ran the picks on the (simulated) device in continuous mode, under the same arrivals
    conf = res.confirm
    assert conf is not None and len(conf) >= 1 and conf["simulated"].all()
    assert conf["ttft_p90_s_measured"].notna().all() and (conf["ttft_p90_s_measured"] > 0).all()
    # the host's drift is recorded, never used to re-scale a serving prediction (queueing is not linear in it):
    # each pick is judged on the same machine predicted from its buckets profiled side by side with the run
    assert conf["host_drift"].notna().all() and (conf["drift_action"] == "reprofiled").all()
    assert conf["ttft_p90_s_err_drift_corrected_%"].notna().all()
    # the printed front speaks of serving: requests per second per chip at the rate, goodput, the largest rate
    print_front(res)
    out = capsys.readouterr().out
    assert "continuous batching at the workload's arrival rate" in out
    assert "goodput/chip" in out and "max rate/chip" in out and "tok/s/chip" not in out
    top = front.sort_values("rank").iloc[0]
    line = next(ln for ln in out.splitlines() if ln.split()[:3] == [str(top["rank"]), str(top["tp"]), str(top["batch"])])
    assert _num(top["sustainable_rate_req_s_per_chip"]) in line and _num(top["goodput_req_s_per_chip"]) in line
    # the deploy space file pins the chosen candidate with the search's serving, scheduler, workload and SLOs:
    # lensopt predict takes it as is, and predicts what the search did
    pinned, own = load_space(rd / "deploy" / "space.toml"), load_space(space)
    assert pinned.target.serving == "continuous" and pinned.target.scheduler == own.target.scheduler
    assert pinned.workload == own.workload and pinned.slo == own.slo and pinned.objectives == own.objectives
    ch = info["chosen"]
    assert main(["predict", str(rd / "deploy" / "space.toml"), "--tp", str(ch["tp"]), "--batch", str(ch["batch"]),
                 "--buckets", ",".join(map(str, sorted({*ch["ctx_buckets"], *ch["tkg_buckets"]}))), "--ctx-buckets", ",".join(map(str, ch["ctx_buckets"])), "--tkg-buckets",
                 ",".join(map(str, ch["tkg_buckets"])), "--cache", str(tmp_path / "cache.sqlite"), "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["mode"] == "continuous" and said["request_rate"] == 4.0
    row = front[(front["tp"] == ch["tp"]) & (front["batch"] == ch["batch"])
                & (front["ctx_buckets"] == " ".join(map(str, ch["ctx_buckets"])))]
    assert len(row) == 1
    assert said["summary"]["ttft_p90_s"] == pytest.approx(float(row["ttft_p90_s"].iloc[0]), rel=1e-9)
    # and the largest sustainable rate the search found for it, by the same bisection on the same predictions
    assert said["capacity"]["sustainable_rate_req_s"] == pytest.approx(float(row["sustainable_rate_req_s"].iloc[0]),
                                                                       rel=1e-9)
    # lensopt confirm over the finished run: it serves again, prints the served latency objective, keeps the
    # target's serving in run.json and the sustainable rates its sweep found in pareto.csv
    before = pd.read_csv(rd / "pareto.csv")
    assert main(["confirm", str(rd), "--top", "1", "--cache", str(tmp_path / "cache.sqlite"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "TTFT p90 pred / meas (err as is / corrected)" in out and "tok/s pred / meas" in out
    report = (rd / "report.md").read_text().split("## Confirmation on the hardware")[1]
    assert "TTFT p90: predicted / measured (error)" in report.split("\n## ")[0]  # the latency objective, served
    assert "(the median of 3 passes' own figures)" in report.split("\n## ")[0]
    assert json.loads((rd / "run.json").read_text())["target"]["serving"] == "continuous"
    after = pd.read_csv(rd / "pareto.csv")
    assert after["sustainable_rate_req_s"].notna().all()
    assert after["sustainable_rate_req_s"].tolist() == before["sustainable_rate_req_s"].tolist()


def test_profile_json_of_a_served_target_gives_the_busy_pass_resume_per_level(tmp_path, capsys):
    space = tmp_path / "serving.toml"
    space.write_text(SERVING)
    assert main(["profile", str(space), "--tp", "1", "--batch", "4", "--buckets", "128,256",
                 "--cache", str(tmp_path / "cache.sqlite"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    busy = out["busy_resume_cost"]
    assert [lv["bucket"] for lv in busy["levels"]] == [128, 256] and busy["run_s"] > 0
    assert all(lv["pass_s"] > 0 and lv["err_s"] > 0 for lv in busy["levels"])
    # every profile keeps the (pass seconds, cost) pairs the ratio gives at the levels
    pairs = [[x["pass_s"], x["resume_s"]] for x in busy["by_pass"]]
    assert [x for x, _ in pairs] == sorted(lv["pass_s"] for lv in busy["levels"])
    assert [c for _, c in pairs] == [busy["ratio"] * x for x, _ in pairs]
    for p in out["profiles"].values():
        assert p["resume_busy"] == pairs
    # and a lone prompt's TTFT tail, kept in every profile (SIMULATED: the sim's own spread)
    tail = out["prefill_tail"]
    assert tail["requests"] > 0 and len(tail["quantiles_s"]) == LEVELS and tail["bucket"] == 128 and tail["run_s"] > 0
    assert tail["quantiles_s"] == sorted(tail["quantiles_s"]) and tail["median_s"] > 0
    assert all(p["prefill_tail"] == tail["quantiles_s"] and p["prefill_tail_median_s"] == tail["median_s"]
               for p in out["profiles"].values())
    # and a lone decode's pace, with its window and correlation time (SIMULATED: the sim's own jitter)
    pace = out["decode_pace"]
    assert pace["requests"] > 0 and len(pace["quantiles"]) == LEVELS and pace["bucket"] == 128 and pace["run_s"] > 0
    assert pace["quantiles"] == sorted(pace["quantiles"]) and pace["quantiles"][0] > -1 and pace["window_s"] > 0
    assert all(p["decode_pace"] == pace["quantiles"] and p["decode_pace_window_s"] == pace["window_s"]
               and p["decode_pace_tau_s"] == pace["tau_s"] for p in out["profiles"].values())


def test_the_prediction_memo_counts_the_tail_runs_a_serving_prediction_holds():
    import numpy as np

    from lens.compose import UnitTable
    from lens.serving import predict_serving
    from lens.types import BucketProfile, Candidate, Requests
    from search.evaluate import Evaluation, _nbytes

    def unit(tail):
        profiles = {b: BucketProfile(bucket=b, ttft_s=0.01 * b, tbt_s=0.001 * b, input_len=1, l1=1, l2=2, t1_s=0,
                                     t2_s=0, repeats=1, spread=0, prefill_tail=tail, prefill_tail_median_s=0.08)
                    for b in (8, 16)}
        return UnitTable.build(Candidate(1, 2, (8, 16), (8, 16)), profiles, policy="exclusive")

    req = Requests(np.ones(20, np.int64), np.full(20, 3), np.arange(20) * 10.0)
    plain, tailed = predict_serving(unit(()), req), predict_serving(unit((0.0, 0.01)), req)
    c = Candidate(1, 2, (8, 16), (8, 16))
    runs = tailed.tail_runs
    assert runs is not None and plain.tail_runs is None
    assert _nbytes(Evaluation(c, prediction=tailed)) == _nbytes(Evaluation(c, prediction=plain)) + sum(
        a.nbytes for a in (runs.admit_s, runs.first_s, runs.finish_s)) > _nbytes(Evaluation(c, prediction=plain))


def test_a_search_names_the_cached_units_whose_admission_offsets_an_older_method_may_have_measured(tmp_path):
    """What a search logs after loading its cached units (``_Search._note_outdated``): one note per unit whose
    profiles predate the host costs' method (a cache of schema 13 or older migrates to 0), for a served target."""
    from types import SimpleNamespace

    from lens import methods
    from lens.types import BucketProfile
    from search.run import _Search

    def prof(method, admit):
        return {64: BucketProfile(bucket=64, ttft_s=0.01, tbt_s=0.001, input_len=63, l1=2, l2=64, t1_s=0.1, t2_s=0.2,
                                  repeats=3, spread=0.0, admit_first_s=admit, host_costs_method=method)}

    measured = {(1, 4): prof(0, 0.0012), (1, 8): prof(methods.HOST_COSTS, 0.0011), (2, 4): prof(0, 0.0)}
    said = []
    search = SimpleNamespace(ev=SimpleNamespace(measured=measured), log=said.append,
                             ledger=SimpleNamespace(cache=tmp_path / "c.sqlite", fingerprint="f" * 16),
                             sp=SimpleNamespace(target=SimpleNamespace(serving="continuous")))
    _Search._note_outdated(search)
    assert len(said) == 1, said  # (1, 8) measured the current way; (2, 4) holds no offset
    assert said[0].startswith("note: the cached tp1 b4's served-admission offsets (lens.admission) were stored")
    assert said[0].endswith(f"lensopt cache rm --fingerprint ffffffffffffffff --tp 1 --batch 4 --cache "
                            f"{tmp_path / 'c.sqlite'}, and the next search profiles it again")
    said.clear()
    search.sp.target.serving = "static"  # a static search reads no offset
    _Search._note_outdated(search)
    assert said == []
