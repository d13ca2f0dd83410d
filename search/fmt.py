"""Numbers for people: three significant figures, with their units.

``report.md`` and ``report.html`` are read by people, so a latency is ``12.3 ms`` rather
than ``0.012345678``, a throughput ``473 tok/s``, a share ``12.5%``, and a model or a
workload one line of words rather than a Python dict. The CSV files keep full precision.
"""
from __future__ import annotations

import math
from typing import Any

from lens.types import ModelShape

#: significant figures of every number in a report
FIGURES = 3


def _finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def sig(x: Any, figures: int = FIGURES) -> str:
    """``x`` to ``figures`` significant figures, thousands separated, never in exponent form."""
    v = _finite(x)
    if v is None:
        return "-"
    if v == 0:
        return "0"
    digits = figures - 1 - math.floor(math.log10(abs(v)))
    r = round(v, digits)
    if r != 0 and math.floor(math.log10(abs(r))) > math.floor(math.log10(abs(v))):  # 999.7 -> 1000: one digit fewer
        digits -= 1
        r = round(v, digits)
    return f"{r:,.{max(digits, 0)}f}"


def seconds(x: Any) -> str:
    """A duration in the unit that keeps it between 1 and 1000: ``12.3 ms``, ``1.23 s``."""
    v = _finite(x)
    if v is None:
        return "-"
    if v == 0:
        return "0 s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(v) >= scale or unit == "µs":
            return f"{sig(v / scale)} {unit}"
    raise AssertionError("unreachable")


def tok_s(x: Any) -> str:
    return "-" if _finite(x) is None else f"{sig(x)} tok/s"


def share(x: Any) -> str:
    """A fraction as a percentage: 0.125 -> ``12.5%``."""
    v = _finite(x)
    return "-" if v is None else f"{sig(v * 100)}%"


def signed_pct(x: Any) -> str:
    """A percentage that is already one, with its sign: ``+3.12%``."""
    v = _finite(x)
    return "-" if v is None else ("+" if v > 0 else "") + f"{sig(v)}%"


def model_line(m: ModelShape, dtype: str) -> str:
    """A Llama-architecture shape in words: layers, widths, heads, vocabulary, parameters."""
    return (f"{m.layers} layers, hidden {m.hidden:,}, {m.heads} heads ({m.kv_heads} KV), intermediate "
            f"{m.intermediate:,}, vocabulary {m.vocab:,}: {sig(m.param_count() / 1e6)} M parameters in {dtype}")
