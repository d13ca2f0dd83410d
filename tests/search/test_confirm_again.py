"""`lensopt confirm` over a finished search: what it reads back from run.json and keeps in pareto.csv."""
from __future__ import annotations

from lens.types import ModelShape, Scheduler, Target
from search.ledger import RunLedger


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

