"""The steps of schema migrations (``store.schema.MIGRATIONS``) that need more than SQL.

A row of an older cache or export file that lacks the columns a later schema added gets
them from ``fill_added`` -- the same values the migration gives it.
"""
from __future__ import annotations

import json
import sqlite3
from typing import Any, Mapping

import numpy as np

from lens.noise import bootstrap_times, spread
from lens.probes import derive, prefill_calls
from lens.types import PREFILLS


def legacy_spreads(raw_t1, raw_t2, *, l1: int, l2: int, batch: int, prefill: str = PREFILLS[0]) -> tuple[float, float]:
    """The +- of a profile solved from the medians of its repeats, as schemas 1-2 did: bootstrapped over them."""
    t1, t2 = [float(x) for x in raw_t1], [float(x) for x in raw_t2]
    if (len(t1) < 2 and len(t2) < 2) or l2 <= l1:
        return 0.0, 0.0
    boot = bootstrap_times([t1, t2], estimator="median")
    ttft, tbt = derive(boot[:, 0], boot[:, 1], l1=l1, l2=l2, calls=prefill_calls(batch, prefill))
    return float(spread(ttft)), float(spread(tbt))


def fill_added(row: Mapping[str, Any], prefill: str = PREFILLS[0]) -> dict[str, Any]:
    """Values of the columns added after schema 2, for a profile row (a mapping of the older columns);
    ``prefill``: its target's, when known."""
    raw1, raw2 = row["raw_t1"], row["raw_t2"]
    raw1 = json.loads(raw1) if isinstance(raw1, str) else raw1
    raw2 = json.loads(raw2) if isinstance(raw2, str) else raw2
    try:
        e1, e2 = legacy_spreads(raw1, raw2, l1=int(row["l1"]), l2=int(row["l2"]), batch=int(row["batch"]),
                                prefill=prefill if prefill in PREFILLS else PREFILLS[0])
    except (TypeError, ValueError):  # a value the row checks refuse anyway
        e1 = e2 = 0.0
    return {"ttft_err_s": e1, "tbt_err_s": e2, "excess": 0.0, "accepted": 1, "row_s": 0.0,
            "admit_first_s": 0.0, "admit_next_s": 0.0, "kv_token_s": 0.0, "row_context": 0.0,
            "resume_s": 0.0,
            # schema 8: a busy pass's first prompt was priced as an idle pass's (one offset for both)
            "admit_busy_s": row.get("admit_first_s", 0.0),
            # schema 9: one resume cost after any pass, whatever the idle spell before it
            "resume_idle": "[]",
            # schema 10: a busy pass's resume priced at the shortest idle spell, whatever its prefill
            "resume_busy": "[]",
            # schema 11: every prefill took its composed time (no quantiles about the median)
            "prefill_tail": "[]",
            # schema 12: a tail's seconds read as they are, whatever the prompt
            "prefill_tail_median_s": 0.0,
            # schema 13: every decode step took its composed time (no wander of the pace)
            "decode_pace": "[]", "decode_pace_window_s": 0.0, "decode_pace_tau_s": 0.0,
            # schema 14: stored before the host costs' method was recorded (lens.methods: not known)
            "host_costs_method": 0}


def spreads_from_raw(con: sqlite3.Connection) -> None:
    """Schema 3's step: each profile's derived spreads, bootstrapped from the raw repeats it kept.

    Its values were solved from the medians of its repeats, so the spreads come through the
    median too; nothing measured then was judged by them, so every profile stays accepted,
    with no excess counted (the columns' defaults).
    """
    cols = ("fingerprint", "tp", "batch", "bucket", "l1", "l2", "raw_t1", "raw_t2")
    prefill = {}
    for fp, tp, batch, target in con.execute("SELECT fingerprint, tp, batch, target_json FROM units"):
        try:
            prefill[(fp, tp, batch)] = json.loads(target).get("prefill", PREFILLS[0])
        except (ValueError, AttributeError):
            pass  # an imported unit row without its target: sequential, as schemas 1-2 measured by default
    for r in con.execute(f"SELECT {', '.join(cols)} FROM profiles").fetchall():
        v = fill_added(dict(zip(cols, r)), prefill.get(tuple(r[:3]), PREFILLS[0]))
        if not all(np.isfinite([v["ttft_err_s"], v["tbt_err_s"]])):
            continue
        con.execute("UPDATE profiles SET ttft_err_s = ?, tbt_err_s = ? WHERE fingerprint = ? AND tp = ? AND batch = ? "
                    "AND bucket = ?", (v["ttft_err_s"], v["tbt_err_s"], *r[:4]))
