"""``benchmarks/serving_accuracy.py --space FILE``: the serving accuracy table for a space file's
target (the path an accelerator host takes), here on the simulated inf2 of ``spaces/sim-inf2.toml``."""
from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks.trace_files import trace_path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "serving_accuracy.py"


def space_buckets(text: str) -> list[int]:
    import tomllib

    return tomllib.loads(text)["space"]["buckets"]


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_a_space_files_target_gets_the_table_with_its_buckets_and_scheduler(tmp_path):
    azure = trace_path("azure_conv_2023.csv")  # the benchmark's second workload: the trace's own arrivals
    if not azure.is_file():
        pytest.skip(f"trace {azure} is absent (it lives in ../shared/data/traces beside the project)")
    text = (ROOT / "spaces" / "sim-inf2.toml").read_text()
    served = (text.replace("[target]\n", '[target]\nserving = "continuous"\n', 1)
              .replace("[workload]\n", "[workload]\narrival_rate = 1.0\n", 1))
    tables = {}
    # the default scheduler, and one of its own (JetStream's one prefill per iteration)
    for name, body in (("default", served),
                       ("one-prefill", served.replace("[target.model]", "[target.scheduler]\nmax_prefills = 1\n\n"
                                                      "[target.model]", 1))):
        space, out = tmp_path / f"{name}.toml", tmp_path / f"{name}.csv"
        space.write_text(body)
        proc = run("--space", str(space), "--units", "1x4", "--requests", "24", "--repeats", "1", "--rates", "0.8",
                   "--csv", str(out), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "SIMULATED" in proc.stdout and "within 10%" in proc.stdout
        # what every prediction composes, printed before the host costs: each bucket's TTFT_b and TBT_b
        said = [ln for ln in proc.stderr.splitlines() if ln.startswith("inf2 tp1 b4: profiles TTFT_b / TBT_b: ")]
        assert len(said) == 1 and said[0].count(" ms") == len(space_buckets(body)), said
        rows = list(csv.DictReader(out.open()))
        assert len(rows) == 2 * 7  # two workloads x seven metrics at one rate
        assert {r["unit"] for r in rows} == {"inf2 tp1 b4"}
        thr = [r for r in rows if r["metric"] == "throughput"]
        assert all(abs(float(r["error_%"])) < 10 for r in thr), thr  # the simulated stack serves what it is offered
        tables[name] = {(r["workload"], r["metric"]): float(r["predicted"]) for r in rows}
    # the space's scheduler reached the prediction: one prefill per iteration changes the first tokens
    assert any(tables["default"][k] != tables["one-prefill"][k] for k in tables["default"] if k[1].startswith("TTFT"))


def test_a_space_whose_runner_does_not_serve_continuous_mode_fails_in_one_line(tmp_path):
    proc = run("--space", str(ROOT / "spaces" / "neuron-inf2-example.toml"), cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "serving_accuracy: runner 'neuron' (neuron-inf2-llama3.2-1b-random) does not run continuous mode; it runs "
        "static (docs/serving.md says what a runner must do to serve it)"]
    proc = run("--space", str(tmp_path / "missing.toml"), cwd=tmp_path)
    assert proc.returncode == 2 and "missing.toml" in proc.stderr and "Traceback" not in proc.stderr


def test_a_time_budget_lists_what_it_skipped_and_the_csv_holds_what_ran(tmp_path):
    if not trace_path("azure_conv_2023.csv").is_file():
        pytest.skip("trace azure_conv_2023.csv is absent (it lives in ../shared/data/traces beside the project)")
    out = tmp_path / "t.csv"
    proc = run("--runner", "sim", "--hardware", "inf2", "--units", "1x4,1x8", "--requests", "16", "--repeats", "1",
               "--rates", "0.8", "--budget-s", "0", "--csv", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the first unit's first workload always runs; everything after it is past a budget of 0 s
    assert "skipped (time budget of 0 s): tp1 b4 azure-conv (trace arrivals), tp1 b8" in proc.stdout
    rows = list(csv.DictReader(out.open()))
    assert {(r["unit"], r["workload"]) for r in rows} == {("inf2 tp1 b4", "sharegpt (Poisson)")}
    assert len(rows) == 7  # one rate x seven metrics


def test_gpu_on_a_machine_where_jax_sees_none_fails_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--gpu"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "serving_accuracy: --gpu: JAX sees no GPU here (backend 'cpu'); run it on the GPU host with JAX's CUDA "
        "plugin, or leave --gpu out for this CPU"]
    proc = run("--gpu", "--runner", "sim", cwd=tmp_path)
    assert proc.returncode == 2 and "--gpu is for --runner jax" in proc.stderr and "Traceback" not in proc.stderr


def test_the_level_of_a_prediction_counts_requests_not_milliseconds(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # as when run as a script
    from benchmarks.serving_accuracy import level_of, pooled_latencies, target_level
    from lens.types import Requests
    import numpy as np

    class Run:  # one repeat: 3 requests on the first step of a TTFT staircase (5 ms), 1 on the second (20 ms)
        ttft_s = np.array([0.005, 0.005, 0.005, 0.020])
        e2e_s = np.array([0.105, 0.105, 0.105, 0.120])

    req = Requests(np.array([10, 10, 10, 200]), np.array([11, 11, 11, 11]))
    pooled = pooled_latencies(req, [Run(), Run()])
    assert pooled["ttft"].size == 8 and np.allclose(pooled["tpot"], 0.01)
    # on the riser: 12.5 ms is 150% above the measured p50 (5 ms) and 37.5% below p90 (20 ms), yet every
    # request on the lower step is below it and every one on the upper above it
    assert level_of(pooled, "ttft_p90_s", 0.0125) == 75.0
    assert level_of(pooled, "ttft_p50_s", 0.005) == 37.5  # ties count half: 6 of 8 requests are at 5 ms
    assert level_of(pooled, "e2e_p90_s", 1.0) == 100.0 and level_of(pooled, "tpot_p50_s", 0.0) == 0.0
    assert np.isnan(level_of(pooled, "request_throughput_req_s", 3.0))
    assert target_level("ttft_p90_s") == 90.0 and target_level("e2e_p50_s") == 50.0
    assert np.isnan(target_level("request_throughput_req_s"))


def test_a_busier_rate_serves_more_times_up_to_the_cap(tmp_path):
    """--repeats at the lightest rate, about as long served at a busier one, at most --max-repeats."""
    if not trace_path("azure_conv_2023.csv").is_file():
        pytest.skip("trace azure_conv_2023.csv is absent (it lives in ../shared/data/traces beside the project)")
    out = tmp_path / "t.csv"
    proc = run("--runner", "sim", "--hardware", "inf2", "--units", "1x4", "--requests", "12", "--repeats", "1",
               "--max-repeats", "3", "--rates", "0.2,0.4,0.8", "--budget-s", "0", "--csv", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 / 2 / 3 repeats at 0.2 / 0.4 / 0.8 x saturation" in proc.stdout
    runs = {(r["x_sat"], r["metric"]): int(r["repeats"]) for r in csv.DictReader(out.open())}
    # 0.4 / 0.2 = 2 runs; 0.8 / 0.2 = 4, capped at 3
    assert {x: n for (x, m), n in runs.items() if m == "throughput"} == {"0.2": 1, "0.4": 2, "0.8": 3}
    # each row's median interval holds its median, and covers it as its number of repeats allows (one: not at all;
    # two or three: their range, 50% and 75%)
    for r in csv.DictReader(out.open()):
        assert float(r["measured_low"]) <= float(r["measured"]) <= float(r["measured_high"]), r
        assert float(r["measured_coverage_%"]) == {1: 0.0, 2: 50.0, 3: 75.0}[int(r["repeats"])], r
    assert "measured median's interval (order statistics, 0% / 50% / 75% coverage)" in proc.stdout


def test_bad_repeat_and_rate_flags_are_refused_in_one_line(tmp_path):
    for flags, said in ((("--repeats", "0"), "--repeats and --max-repeats: at least 1"),
                        (("--rates", "0.5,x"), "--rates 0.5,x: comma-separated fractions"),
                        (("--rates", "0,0.5"), "--rates 0,0.5: fractions of the saturation rate above 0")):
        proc = run("--runner", "sim", *flags, cwd=tmp_path)
        assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_the_summary_says_how_steady_the_host_was(monkeypatch):
    """The drift's range and the latency rows' median spread, by rate; throughput rows and unmeasured drift left out."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from benchmarks.serving_accuracy import host_said

    def row(x, metric, spread, drift):
        return {"x_sat": x, "metric": metric, "spread_%": spread, "drift": drift}

    rows = [row(0.15, "throughput", 90.0, 0.7), row(0.15, "TTFT p50", 4.0, 0.7), row(0.15, "TTFT p90", 6.0, 0.7),
            row(0.8, "throughput", 0.5, 1.15), row(0.8, "TTFT p50", 40.0, 1.15), row(0.8, "E2E p90", 20.0, float("nan"))]
    said = host_said(rows, [0.15, 0.5, 0.8])
    # 0.5 x saturation ran no row (a time budget ended the run): it is not listed
    assert said == ("the host: drift 0.70-1.15 (the reference probe's time beside the repeats over its time in the "
                    "profile); the latency rows' repeats spread a median 13.0% (5.0% / 30.0% at 0.15 / 0.8 x saturation)")
    assert "drift not measured" in host_said([row(0.5, "TPOT p50", 1.0, float("nan"))], [0.5])


def test_the_summary_counts_the_misses_inside_the_corrected_predictions_band(monkeypatch):
    """A row outside 10% whose measured median lies within the corrected prediction's band is counted; a row within
    10% is not a miss, and one whose measurement lies past its band is not inside."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from benchmarks.serving_accuracy import band_said

    def row(x, err, measured, low, high):
        return {"x_sat": x, "corrected_error_%": err, "measured": measured, "corrected_low": low,
                "corrected_high": high}

    rows = [row(0.15, 2.0, 1.0, 0.9, 1.1), row(0.8, 40.0, 1.0, 0.8, 1.6), row(0.8, -30.0, 1.0, 0.6, 0.9),
            row(0.5, 12.0, 1.0, 1.0, 1.2)]
    assert band_said(rows).endswith("standard error): 2 of 3 (at 0.5, 0.8 x saturation)")
    assert band_said(rows[:1]).endswith("standard error): 0 of 0")


def test_the_summary_counts_the_rows_whose_repeats_do_not_pin_their_median(monkeypatch):
    """A latency row whose median's interval reaches past 10% of it either side is counted loose (throughput is not a
    latency row); a miss whose corrected prediction lies in that interval is counted, one past it is not."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from benchmarks.serving_accuracy import measured_said

    def row(metric, err, low, high, cover=96.09375):
        return {"metric": metric, "corrected_error_%": err, "corrected_predicted": 1.0 + err / 100,
                "measured": 1.0, "measured_low": low, "measured_high": high, "measured_coverage_%": cover}

    rows = [row("TTFT p50", 30.0, 0.5, 1.4),   # loose, its prediction (1.3) inside
            row("TTFT p90", -20.0, 0.85, 1.05),  # loose below, its prediction (0.8) past it
            row("E2E p50", 4.0, 0.95, 1.05, 75.0),  # tight, within 10%
            row("throughput", 15.0, 0.5, 2.0)]  # not a latency row, but a miss inside its interval
    assert measured_said(rows) == (
        "latency rows whose measured median's interval (order statistics, 75% / 96% coverage) reaches past 10% of "
        "it: 2/3; rows outside 10% corrected whose corrected prediction lies in that interval: 2 of 3")


def test_one_factor_for_the_host_is_the_median_of_the_side_by_side_costs_over_the_cached(monkeypatch):
    """Every bucket probed side by side gives two ratios (TTFT_b, TBT_b) over its cached profile; the factor is
    their median, so one bucket's noisy few runs do not set it. Buckets without a cached profile or a cost are left
    out; with none left, the reference probe's drift."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from types import SimpleNamespace

    from benchmarks.serving_accuracy import one_factor

    def prof(b, ttft, tbt):  # the two solved costs are all it reads of a BucketProfile
        return SimpleNamespace(bucket=b, ttft_s=ttft, tbt_s=tbt)

    cached = {64: prof(64, 0.010, 0.002), 128: prof(128, 0.020, 0.004)}
    side = {64: prof(64, 0.011, 0.0021), 128: prof(128, 0.030, 0.0042), 256: prof(256, 0.1, 0.1)}
    # ratios 1.10, 1.05, 1.50, 1.05: the median 1.075, the outlying 1.5 not moving it past its neighbours
    assert one_factor(cached, side, 0.9) == pytest.approx(1.075)
    assert one_factor(cached, {256: side[256]}, 0.9) == 0.9
    assert one_factor({64: prof(64, 0.0, 0.002)}, {64: prof(64, 0.01, 0.003)}, 0.9) == pytest.approx(1.5)


def test_the_drift_rounds_range_and_the_misses_where_the_host_moved(monkeypatch):
    """A rate's drift rounds give their range over the profile's reference time; the summary counts the latency rows
    within 10% apart for the rows whose rounds held within 10% and those that moved more (throughput and unmeasured
    rows left out)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from benchmarks.serving_accuracy import moved_said, rounds_moved

    assert rounds_moved(((0.010, 0.012), (0.011,), (0.0105, 0.0095, 0.010)), 0.010) == pytest.approx(10.0)
    assert np.isnan(rounds_moved(((0.010,),), 0.010))

    def row(metric, err, moved):
        return {"metric": metric, "corrected_error_%": err, "drift_rounds_moved_%": moved}

    rows = [row("TTFT p50", 25.0, 18.0), row("TTFT p90", -12.0, 4.0), row("E2E p50", 3.0, 12.0),
            row("TPOT p50", 1.0, 2.0), row("TPOT p90", 2.0, 6.0), row("throughput", 40.0, 30.0),
            row("E2E p90", 50.0, float("nan"))]
    assert moved_said(rows).endswith("held within 10%: 2/3 within 10% corrected (rounds' range median 4.0%); "
                                     "moved more: 1/2 within 10% corrected (rounds' range median 15.0%)")
    assert moved_said(rows[-2:]).endswith("not measured")


def test_each_repeat_is_predicted_at_the_hosts_speed_in_the_rounds_either_side(monkeypatch):
    """Rounds at the table's own speed give the single prediction; rounds 20% slower around every repeat give a
    later one; rounds that do not bracket the repeats give nothing (nan), not a guess."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "lens"))
    from benchmarks.serving_accuracy import per_pass
    from lens.serving import Scheduler, predict_serving
    from lens.serving_metrics import summarize_serving_prediction
    from lens.types import Requests
    from servingkit import table

    t = table(2)
    req = Requests([4, 12, 5, 6, 9], [3, 5, 4, 2, 6], np.array([0.0, 0.5, 1.0, 1.5, 2.0]))
    one = summarize_serving_prediction(req, predict_serving(t, req, scheduler=Scheduler()), chips=1)
    assert per_pass(req, t, Scheduler(), 1, (1.0, 1.0, 1.0), 2) == pytest.approx(one)
    slow = per_pass(req, t, Scheduler(), 1, (1.2, 1.2, 1.2, 1.2), 3)
    assert slow["ttft_p50_s"] > 1.19 * one["ttft_p50_s"] and slow["e2e_p90_s"] > 1.19 * one["e2e_p90_s"]
    assert all(np.isnan(v) for v in per_pass(req, t, Scheduler(), 1, (1.0, 1.0), 2).values())
