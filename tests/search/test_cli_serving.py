"""``lensopt predict`` / ``measure`` with --mode continuous: arrivals, goodput, vLLM's names, errors."""
from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest

from search.cli import main
from search.passes import PASS_METRICS
from spacekit import TINY_MODEL, space_table, tiny_target

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "examples" / "command_runner" / "toy_npu.py"
MODEL = TINY_MODEL + space_table()
SIM = tiny_target("cli-serving") + space_table()
UNIT = ["--tp", "1", "--batch", "2", "--buckets", "64,128"]
def _write_traces(d: Path) -> None:
    """short.csv: 60 requests that fit 128 tokens; timed.csv: the same with an arrival every 0.25 s."""
    rows = [(5 + (7 * i) % 60, 2 + (5 * i) % 40) for i in range(60)]
    (d / "short.csv").write_text("input_len,output_len\n" + "".join(f"{a},{b}\n" for a, b in rows))
    (d / "timed.csv").write_text("input_len,output_len,arrival_s\n"
                                 + "".join(f"{a},{b},{i * 0.25}\n" for i, (a, b) in enumerate(rows)))


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    space, cache = d / "space.toml", d / "cache.sqlite"
    space.write_text(SIM)
    _write_traces(d)
    assert main(["profile", str(space), "--tp", "1", "--batch", "2", "--cache", str(cache)]) == 0
    return space, cache


def work(space, name="short.csv"):
    return ["--workload", str(space.parent / name), "--requests", "40"]


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_predict_continuous_at_a_request_rate(profiled, capsys):
    space, cache = profiled
    out = _json(capsys, ["predict", str(space), *UNIT, *work(space), "--mode", "continuous", "--request-rate", "3",
                         "--goodput", "ttft:200", "e2el:5000", "--cache", str(cache), "--json"])
    s = out["summary"]
    assert out["arrivals"] == "poisson" and out["request_rate"] == 3.0 and out["mode"] == "continuous"
    assert out["scheduler"] == "max_prefills 0 (no cap), prefill_priority prefill"  # the defaults, as a reader reads them
    assert len(out["arrival_s"]) == len(out["ttft_s"]) == 40 and out["arrival_s"][0] == 0.0
    assert 0 < s["request_goodput_req_s"] <= s["request_throughput_req_s"]
    assert s["offered_rate_req_s"] == pytest.approx(3.0, rel=0.4)
    # the same requests at a tenth of the rate queue less: TTFT falls
    slow = _json(capsys, ["predict", str(space), *UNIT, *work(space), "--mode", "continuous", "--arrival-rate", "0.3",
                          "--cache", str(cache), "--json"])
    assert slow["summary"]["ttft_p90_s"] <= s["ttft_p90_s"]
    # the largest sustainable rate of the pattern, the same at any rate it is asked at (the pattern scales)
    cap = out["capacity"]
    assert 0 < cap["sustainable_rate_req_s"] < cap["unsustainable_above_req_s"] <= cap["sustainable_rate_req_s"] * 1.01
    assert cap["limited_by"] and cap["predictions"] > 2 and cap["max_queue_growth"] == 0.05
    assert slow["capacity"]["sustainable_rate_req_s"] == pytest.approx(cap["sustainable_rate_req_s"], rel=1e-9)
    assert main(["predict", str(space), *UNIT, *work(space), "--mode", "continuous", "--request-rate", "3",
                 "--cache", str(cache)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"Max sustainable rate: {cap['sustainable_rate_req_s']:.4g} req/s of this arrival pattern")


def test_predict_continuous_at_a_traces_own_arrivals(profiled, capsys):
    space, cache = profiled
    out = _json(capsys, ["predict", str(space), *UNIT, *work(space, "timed.csv"), "--mode", "continuous",
                         "--cache", str(cache), "--json"])
    assert out["arrivals"] == "trace" and out["request_rate"] == pytest.approx(4.0)
    gaps = [b - a for a, b in zip(out["arrival_s"], out["arrival_s"][1:])]
    assert gaps == pytest.approx([0.25] * 39)  # 40 consecutive rows, their gaps kept


def test_predict_and_measure_print_vllm_names(profiled, capsys):
    space, cache = profiled
    args = [*UNIT, *work(space), "--mode", "continuous", "--request-rate", "2"]
    assert main(["predict", str(space), *args, "--cache", str(cache)]) == 0
    text = capsys.readouterr().out
    for name in ("Request throughput (req/s):", "Request goodput (req/s):", "Output token throughput (tok/s):",
                 "Median TTFT (ms):", "P90 TPOT (ms):", "P99 E2EL (ms):", "Benchmark duration (s):"):
        assert name in text, name
    assert main(["measure", str(space), *args, "--repeats", "1"]) == 0
    text = capsys.readouterr().out
    assert "SIMULATED" in text and "Request goodput (req/s):" in text


def test_measure_continuous_on_the_simulated_device(profiled, capsys):
    space, _ = profiled
    out = _json(capsys, ["measure", str(space), *UNIT, *work(space), "--mode", "continuous", "--request-rate", "2",
                         "--repeats", "2", "--json"])
    assert out["simulated"] is True and out["summary"]["request_throughput_req_s"] > 0
    assert all(t <= e for t, e in zip(out["ttft_s"], out["e2e_s"]))
    # each pass's own percentiles, and how far they spread (the summary is their median)
    assert set(out["pass_spread"]) == set(PASS_METRICS) and all(v >= 0 for v in out["pass_spread"].values())
    # and where their median lies: two passes' range, which holds the median half the time
    at = out["pass_median_interval"]
    assert set(at) == set(PASS_METRICS) and all(v["coverage"] == 0.5 for v in at.values())
    assert all(v["below"] == pytest.approx(v["above"]) and v["below"] >= 0 for v in at.values())  # the midpoint
    assert main(["measure", str(space), *UNIT, *work(space), "--mode", "continuous", "--request-rate", "2",
                 "--repeats", "2"]) == 0
    assert "median of 2 passes' own figures" in capsys.readouterr().out


def test_measure_continuous_grades_the_serving_prediction_and_reports_the_drift(profiled, capsys):
    space, cache = profiled
    args = [str(space), *UNIT, *work(space), "--mode", "continuous", "--request-rate", "2", "--cache", str(cache),
            "--json"]
    pred = _json(capsys, ["predict", *args])
    meas = _json(capsys, ["measure", *args, "--repeats", "1"])
    assert "pass_spread" not in meas and "pass_median_interval" not in meas  # one pass has no spread
    assert meas["host_drift"] > 0 and meas["reference_probe"]["bucket"] in (64, 128)
    # the error is that of the continuous-batching prediction at the same arrivals (queueing included)
    p, m = np.asarray(pred["e2e_s"]), np.asarray(meas["e2e_s"])
    assert meas["prediction_e2e_mape_pct"] == pytest.approx(float(np.mean(np.abs(p - m) / m) * 100))


@pytest.mark.parametrize(("extra", "message"), [
    (["--request-rate", "3"], "--request-rate is read by --mode continuous only"),
    (["--mode", "continuous"], "continuous serving needs arrival times"),
    (["--mode", "continuous", "--request-rate", "0"], "--request-rate 0 must be a positive number (requests per second)"),
    (["--mode", "continuous", "--request-rate", "nan"], "--request-rate nan must be a positive number"),
    (["--mode", "continuous", "--request-rate", "2", "--burstiness", "0"], "--burstiness 0 must be a positive number"),
    (["--mode", "continuous", "--request-rate", "2", "--goodput", "itl:5"], "--goodput 'itl:5': give KEY:MILLISECONDS"),
    (["--mode", "continuous", "--request-rate", "2", "--goodput", "ttft:-1"], "positive number of milliseconds"),
])
def test_serving_flag_errors_are_one_line_exit_2(profiled, capsys, extra, message):
    space, cache = profiled
    reqs = ["--input-len", "10,20,30", "--output-len", "5"]
    assert main(["predict", str(space), *UNIT, *reqs, *extra, "--cache", str(cache)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


@pytest.mark.parametrize(("extra", "message"), [
    (["--request-rate", "-1"], "--request-rate -1 must be a positive number (requests per second)"),
    (["--request-rate", "2", "--burstiness", "inf"], "--burstiness inf is more than 1,000 (1 is a Poisson process)"),
    (["--request-rate", "inf"], "--request-rate inf is not a finite number: for every request at once (vllm bench's "
                                "inf) give a rate far above what the unit serves, e.g. 1e6 requests per second"),
])
def test_arrival_flag_errors_name_the_flag_with_a_workload(profiled, capsys, extra, message):
    """A sampled workload's bad rate is the flag's mistake, not the space file's: the error says so."""
    space, cache = profiled
    assert main(["predict", str(space), *UNIT, *work(space), "--mode", "continuous", *extra,
                 "--cache", str(cache)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(message) and str(space) not in err and "\n" not in err


def test_measure_refuses_continuous_for_a_program_that_does_not_declare_it(tmp_path, capsys):
    space = tmp_path / "toy.toml"
    space.write_text('[target]\nname = "toy"\nrunner = "command"\nhardware = "toy-npu"\n[target.options]\n'
                     f'argv = [{json.dumps(sys.executable)}, {json.dumps(str(TOY))}, "--modes", "static"]\n' + MODEL)
    _write_traces(tmp_path)
    argv = ["measure", str(space), *UNIT, *work(space), "--mode", "continuous", "--request-rate", "2",
            "--repeats", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "does not run continuous mode; it runs static" in err and "\n" not in err


def test_predict_says_when_the_cached_admission_offsets_come_from_an_older_method(profiled, tmp_path, capsys):
    """A cache filled before lensopt recorded how it measures host costs (schema 13 or older migrates to 0):
    continuous predictions say so on stderr, with the commands that measure the unit anew; static ones, which
    read no admission offset, do not."""
    space, cache = profiled
    old = tmp_path / "old.sqlite"
    src = sqlite3.connect(cache)
    dst = sqlite3.connect(old)
    src.backup(dst)
    src.close()
    assert dst.execute("SELECT COUNT(*) FROM profiles WHERE admit_first_s != 0").fetchone()[0] > 0
    dst.execute("UPDATE profiles SET host_costs_method = 0")
    dst.commit()
    dst.close()
    serve = ["predict", str(space), *UNIT, *work(space), "--mode", "continuous", "--request-rate", "2"]
    assert main([*serve, "--cache", str(cache)]) == 0
    assert "note:" not in capsys.readouterr().err  # measured by this lensopt
    assert main([*serve, "--cache", str(old)]) == 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("note: the cached tp1 b2's served-admission offsets") and "\n" not in err
    assert "lensopt cache rm --fingerprint " in err and f"--tp 1 --batch 2 --cache {old} && lensopt profile" in err
    assert main(["predict", str(space), *UNIT, *work(space), "--mode", "static", "--cache", str(old)]) == 0
    assert "note:" not in capsys.readouterr().err
    # lensopt profile on a served target whose unit is all cached says so too (nothing is measured again)
    served = tmp_path / "served.toml"
    served.write_text(tiny_target("cli-serving", extra='serving = "continuous"\n') + space_table()
                      + '[workload]\ndistribution = "sharegpt"\narrival_rate = 2.0\n')
    assert main(["profile", str(served), "--tp", "1", "--batch", "2", "--cache", str(old)]) == 0
    err = capsys.readouterr().err
    assert "note: the cached tp1 b2's served-admission offsets" in err and "lensopt cache rm" in err
    assert main(["profile", str(space), "--tp", "1", "--batch", "2", "--cache", str(old)]) == 0
    assert "note:" not in capsys.readouterr().err  # a static target reads no offset


def test_predict_continuous_gives_the_band_the_profiles_own_error_allows(profiled, capsys):
    space, cache = profiled
    args = ["predict", str(space), *UNIT, *work(space), "--mode", "continuous", "--cache", str(cache)]

    def at(rate: float) -> dict:
        return _json(capsys, [*args, "--request-rate", str(rate), "--json"])

    light = at(0.3)
    sat = light["capacity"]["saturation_req_s"]
    busy = at(0.9 * sat)
    for out in (light, busy):
        s, b = out["summary"], out["band"]
        for k in ("request_throughput_req_s", "ttft_p50_s", "ttft_p90_s", "tpot_p90_s", "e2e_p90_s"):
            assert b[k][0] <= s[k] <= b[k][1], k
        assert b["ttft_p90_s"][1] > b["ttft_p90_s"][0]  # the sim profiles carry a +-: the band is not a point

    def width(out: dict) -> float:
        lo, hi = out["band"]["ttft_p90_s"]
        return (hi - lo) / out["summary"]["ttft_p90_s"]

    # near saturation the queue turns the same +- of the costs into a wider share of the TTFT
    assert width(busy) > 2 * width(light), (width(light), width(busy))
    assert main([*args, "--request-rate", "0.3"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("Band "))
    lo, hi = light["band"]["ttft_p90_s"]
    assert f"P90 TTFT {lo * 1e3:.2f}-{hi * 1e3:.2f} ms" in line and "request throughput" in line
