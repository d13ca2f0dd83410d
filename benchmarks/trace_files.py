"""Where the shared public traces live: ``shared/data/traces/`` beside the project (or above a worktree,
or inside the checkout: a copy there, git-ignored, travels with the tree to another host)."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def trace_path(name: str) -> Path:
    """The trace file ``name`` in the nearest ``shared/data/traces/`` at or above the project root."""
    for d in (ROOT, *ROOT.parents):
        p = d / "shared" / "data" / "traces" / name
        if p.is_file():
            return p
    return ROOT.parent / "shared" / "data" / "traces" / name  # the documented place, for the error message
