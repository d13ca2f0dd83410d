"""A host slower than when it profiled is reported as drift (``host_drift``), at ``lensopt measure``
and at confirmation, with the prediction error as is and corrected for it: re-scaled by a drift
under ``budget.drift_reprofile``, predicted again from the buckets profiled again past it
(toy_npu: SIMULATED)."""
from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from search.cli import main
from search.run import run

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "examples" / "command_runner" / "toy_npu.py"

SPACE = """
[target]
name = "drift-toy"
runner = "command"
hardware = "toy-npu"
bucket_policy = "exclusive"
dtype = "bfloat16"

[target.model]            # Llama-3.2-1B shape
layers = 16
hidden = 2048
heads = 32
kv_heads = 8
intermediate = 8192
vocab = 128256

[target.options]
argv = ["{python}", "{toy}"]
{env}

[space]
tp = [1]
batch = [1, 2]
buckets = [64, 128, 256]

[workload]
distribution = "sharegpt"
length_scale = 0.1
drop_longer = true
requests = 24
seed = 0

[budget]
trials = 12
top_k = 1
"""


def space(path: Path, env: str = "") -> Path:
    path.write_text(SPACE.replace("{python}", sys.executable.replace("\\", "/")).replace("{toy}", str(TOY))
                    .replace("{env}", env))
    return path


#: held-out requests over every bucket (none of them a probe)
HELD_OUT = [(20, 30), (90, 20), (150, 60), (40, 9), (70, 50), (200, 40), (5, 100), (130, 3), (33, 33), (240, 12)]


def reqs(tmp_path: Path) -> list[str]:
    trace = tmp_path / "held_out.csv"
    trace.write_text("input_len,output_len\n" + "".join(f"{a},{b}\n" for a, b in HELD_OUT))
    return ["--buckets", "64,128,256", "--workload", str(trace), "--length-scale", "1"]  # as written (the space scales by 0.1)


def measure(sp: Path, cache: Path, capsys, *extra: str) -> dict:
    capsys.readouterr()
    assert main(["measure", str(sp), "--tp", "1", "--batch", "2", *reqs(sp.parent), "--cache", str(cache),
                 "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_measure_reports_host_drift_and_the_error_corrected_by_it(tmp_path, capsys, monkeypatch):
    sp, cache = space(tmp_path / "s.toml"), tmp_path / "c.sqlite"
    assert main(["profile", str(sp), "--tp", "1", "--batch", "2", "--cache", str(cache), "--json"]) == 0
    quiet = measure(sp, cache, capsys)
    assert quiet["host_drift"] == pytest.approx(1.0, abs=0.03)
    assert quiet["drift_significant"] is False and 0 <= quiet["host_drift_err"] < 0.03
    # the reference ran on both sides of the workload, half of its repeats each
    ref = quiet["reference_probe"]
    assert len(ref["times_before_s"]) >= 2 and len(ref["times_after_s"]) >= 2
    assert quiet["prediction_e2e_mape_pct"] < 5
    assert quiet["drift_action"] == "none" and "prediction_e2e_mape_reprofiled_pct" not in quiet
    # minutes later the host is 8% slower (the environment is no part of the device's fingerprint):
    # beyond the tolerance (5%), under budget.drift_reprofile (10%): the prediction is re-scaled
    monkeypatch.setenv("TOY_NPU_MODE", "drift")
    monkeypatch.setenv("TOY_NPU_DRIFT", "1.08")
    slow = measure(sp, cache, capsys)
    assert slow["host_drift"] == pytest.approx(1.08, abs=0.01)
    assert slow["drift_significant"] is True and slow["drift_action"] == "rescaled"
    assert slow["reference_probe"]["bucket"] in (64, 128, 256)
    assert slow["prediction_e2e_mape_pct"] > 5  # as is: the drift looks like a model error ...
    assert slow["prediction_e2e_mape_drift_corrected_pct"] < 2  # ... corrected by host_drift, it is gone
    assert "prediction_e2e_mape_reprofiled_pct" not in slow and "reprofiled" not in slow
    capsys.readouterr()
    assert main(["measure", str(sp), "--tp", "1", "--batch", "2", *reqs(tmp_path), "--cache", str(cache)]) == 0
    text = capsys.readouterr().out
    assert "host_drift: 1.08" in text and "slower" in text and "beyond its noise" in text and "drift-corrected" in text


def test_a_large_drift_at_measure_reprofiles_the_requests_buckets_and_leaves_the_cache(tmp_path, capsys, monkeypatch):
    sp, cache = space(tmp_path / "s.toml"), tmp_path / "c.sqlite"
    assert main(["profile", str(sp), "--tp", "1", "--batch", "2", "--cache", str(cache), "--json"]) == 0
    capsys.readouterr()
    predict = ["predict", str(sp), "--tp", "1", "--batch", "2", *reqs(tmp_path), "--cache", str(cache), "--json"]
    assert main(predict) == 0
    before = json.loads(capsys.readouterr().out)["e2e_s"]
    monkeypatch.setenv("TOY_NPU_MODE", "drift")
    monkeypatch.setenv("TOY_NPU_DRIFT", "1.2")  # 20% slower: past budget.drift_reprofile (10%)
    slow = measure(sp, cache, capsys)
    assert slow["host_drift"] == pytest.approx(1.2, abs=0.01) and slow["drift_action"] == "reprofiled"
    # every bucket the held-out requests use (all three), measured again on the slow host
    assert slow["reprofiled"]["buckets"] == [64, 128, 256] and slow["reprofiled"]["hardware_s"] > 0
    assert slow["prediction_e2e_mape_pct"] > 12  # as is: the drift looks like a model error ...
    assert slow["prediction_e2e_mape_reprofiled_pct"] < 2  # ... predicted from the fresh profiles, it is gone
    # the cache keeps the profiles it had: the same prediction as before the slow measurement
    capsys.readouterr()
    assert main(predict) == 0
    assert json.loads(capsys.readouterr().out)["e2e_s"] == before
    assert main(["measure", str(sp), "--tp", "1", "--batch", "2", *reqs(tmp_path), "--cache", str(cache)]) == 0
    text = capsys.readouterr().out
    assert "host_drift: 1.2" in text and "profiled again" in text and "64, 128, 256" in text


def test_measure_without_a_cached_profile_says_drift_is_unknown(tmp_path, capsys):
    sp = space(tmp_path / "s.toml")
    out = measure(sp, tmp_path / "none.sqlite", capsys)
    assert out["host_drift"] is None and "prediction_e2e_mape_pct" not in out
    assert main(["measure", str(sp), "--tp", "1", "--batch", "2", *reqs(tmp_path), "--cache",
                 str(tmp_path / "no.sqlite")]) == 0
    assert "host_drift: unknown" in capsys.readouterr().out


@pytest.mark.parametrize("reprofile_above, action", [(0.5, "rescaled"), (None, "reprofiled")])
def test_a_confirmation_on_a_drifted_host_is_corrected_not_flagged(tmp_path, ray_local, reprofile_above, action):
    sp, cache = space(tmp_path / "s.toml"), tmp_path / "c.sqlite"
    res = run(sp, results_dir=tmp_path / "r", name="d", cache=cache, confirm=False, progress=False, log=lambda m: None)
    rd = res.run_dir
    # the host drifts before the confirmation: 20% slower (the run's copy of its space gets the environment)
    space(rd / "space.toml", env='env = { TOY_NPU_MODE = "drift", TOY_NPU_DRIFT = "1.2" }')
    if reprofile_above is not None:  # re-scaled below budget.drift_reprofile, re-profiled past it (default 10%)
        with open(rd / "space.toml", "a") as f:
            f.write(f"drift_reprofile = {reprofile_above}\n")  # the [budget] table ends the file
    assert main(["confirm", str(rd), "--top", "1", "--cache", str(cache), "--no-progress"]) == 0
    conf = pd.read_csv(rd / "confirm.csv")
    row = conf.iloc[0]
    assert row["host_drift"] == pytest.approx(1.2, abs=0.03) and row["drift_action"] == action
    assert row["e2e_request_mape_%"] > 12 and row["e2e_request_mape_drift_corrected_%"] < 5
    assert abs(row["e2e_p90_s_err_%"]) > 10 and abs(row["e2e_p90_s_err_drift_corrected_%"]) < 5
    assert not row["flagged"], {k: v for k, v in row.to_dict().items() if "corrected" in k}  # judged drift-corrected: the model is right, the host is slower
    info = json.loads((rd / "run.json").read_text())
    assert info["confirmed"][0]["host_drift"] == pytest.approx(1.2, abs=0.03)
    assert bool(info["confirmed"][0].get("reprofiled")) == (action == "reprofiled")
