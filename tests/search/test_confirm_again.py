"""`lensopt confirm` over a finished search: what it reads back from run.json and keeps in pareto.csv."""
from __future__ import annotations

import pandas as pd

from lens.types import ModelShape, Scheduler, Target
from search.ledger import RunLedger
from search.results import _kept_swept


def test_the_ledger_keeps_the_targets_serving_and_scheduler():
    """run.json's target read back serves as the search did (a static one printed static columns, and the
    confirmation wrote run.json back as static)."""
    t = Target("t", "sim", "inf2", "exclusive", "bfloat16", ModelShape(2, 256, 4, 2, 688, 4096), seed=3,
               serving="continuous", scheduler=Scheduler(max_prefills=1, prefill_priority="decode"))
    back = RunLedger.from_json(RunLedger(run="r", space="s.toml", space_sha256="ab" * 32, fingerprint="f" * 16,
                                         target=t).to_json())
    assert back.target == t
    # a run.json written before serving existed reads as static, with the default scheduler
    old = RunLedger(run="r", space="s.toml", space_sha256="ab" * 32, fingerprint="f" * 16,
                    target=Target("t", "sim", "inf2", "exclusive", "bfloat16", ModelShape(2, 256, 4, 2, 688, 4096)))
    d = old.to_json()
    del d["target"]["serving"], d["target"]["scheduler"]
    assert RunLedger.from_json(d).target == old.target


def test_a_confirmation_run_again_keeps_the_sustainable_rates_the_sweep_found(tmp_path):
    """`lensopt confirm` rewrites pareto.csv from fresh evaluations, which hold a sustainable rate only when it is
    the objective: the rates the search's sweep found for the others are kept, by candidate."""
    key = {"tp": [1, 1, 2], "batch": [2, 4, 2], "ctx_buckets": ["64 128", "128", "64 128"],
           "tkg_buckets": ["64 128", "128", "64 128"]}
    pd.DataFrame({**key, "sustainable_rate_req_s": [3.0, 5.5, float("nan")],
                  "sustainable_rate_req_s_per_chip": [3.0, 5.5, float("nan")]}).to_csv(tmp_path / "p.csv", index=False)
    fresh = pd.DataFrame({"tp": [1, 2, 1], "batch": [4, 2, 2], "ctx_buckets": ["128", "64 128", "64"],
                          "tkg_buckets": ["128", "64 128", "64"], "ttft_p90_s": [0.1, 0.2, 0.3]})
    got = _kept_swept(fresh, tmp_path / "p.csv")
    assert got["sustainable_rate_req_s"].tolist()[0] == 5.5  # (1, 4, 128)
    assert got["sustainable_rate_req_s"].isna().tolist() == [False, True, True]  # none swept; another candidate
    assert got["ttft_p90_s"].tolist() == [0.1, 0.2, 0.3]
    # a value the fresh evaluation holds (the objective's) stands
    fresh["sustainable_rate_req_s"] = [9.0, float("nan"), float("nan")]
    assert _kept_swept(fresh, tmp_path / "p.csv")["sustainable_rate_req_s"].tolist()[0] == 9.0
    assert _kept_swept(fresh, tmp_path / "none.csv") is fresh
