"""Plain-text tables and CSV files for the GPU check scripts (no pandas: the GPU host may lack it)."""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Sequence


def _cell(v) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def format_table(rows: Sequence[dict], cols: Sequence[str] | None = None) -> str:
    """Right-aligned columns (``cols``, default the first row's keys); NaN prints as ``-``."""
    if not rows:
        return "(no rows)"
    cols = list(cols or rows[0])
    cells = [cols] + [[_cell(r[c]) for c in cols] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    return "\n".join("  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells)


def write_csv(path: Path, rows: Sequence[dict]) -> None:
    """``rows`` as CSV at ``path`` (folders created); nothing when there are no rows."""
    if not rows:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
