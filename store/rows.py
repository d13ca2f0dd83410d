"""Rows of the cache: the checks every stored value passes, and conversion to/from BucketProfile.

The same checks guard ``put_unit``, ``import_file`` and recovery, so a value a file import
would refuse can never be stored another way. Values come either as Python/numpy values
(``put_unit``, Parquet, SQLite) or as text (CSV cells, parsed strictly: no NaN from a blank).
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from lens.types import BucketProfile

from .schema import BOOL_COLUMNS, FLOAT_COLUMNS, INT_COLUMNS, PROFILE_COLUMNS, UNIT_COLUMNS


class BadValue(Exception):
    """One bad value; the caller adds where it was (a file row, a profile)."""


_INT_RE = re.compile(r"[+-]?[0-9]+")
_INT64_MAX = 2**63 - 1


def as_int(v: Any, *, lo: int, text: bool) -> int:
    if text:
        s = v.strip()
        if not _INT_RE.fullmatch(s):
            raise BadValue(f"{v!r} is not an integer")
        out = int(s)
    else:
        if v is None:
            raise BadValue("missing value")
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise BadValue(f"{v!r} is not an integer")
        out = int(v)
    if out < lo:
        raise BadValue(f"{out} is below the minimum {lo}")
    if out > _INT64_MAX:
        raise BadValue(f"{out} is too large")
    return out


def _number(v: Any, *, text: bool) -> float:
    if text:
        try:
            return float(v)
        except ValueError:
            raise BadValue(f"{v!r} is not a number") from None
    if v is None:
        raise BadValue("missing value")
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise BadValue(f"{v!r} is not a number")
    return float(v)


def as_seconds(v: Any, *, text: bool) -> float:
    """A finite, non-negative number (a time or a spread)."""
    out = _number(v, text=text)
    if math.isnan(out):
        raise BadValue("NaN is not a valid time")
    if math.isinf(out):
        raise BadValue(f"{out} is not finite")
    if out < 0:
        raise BadValue(f"{out} is negative; times and spreads are >= 0")
    return out


def as_ratio(v: Any, *, text: bool) -> float:
    """A finite share above -1 (an expected slow-down; the mean of a probe's runs can sit below their median)."""
    out = _number(v, text=text)
    if not math.isfinite(out) or out <= -1:
        raise BadValue(f"{out} is not a share above -1")
    return out


def as_offset(v: Any, *, text: bool) -> float:
    """A finite number of seconds of either sign (a cost against another one)."""
    out = _number(v, text=text)
    if not math.isfinite(out):
        raise BadValue(f"{out} is not finite")
    return out


def as_str(v: Any, *, nonempty: bool) -> str:
    if v is None:
        raise BadValue("missing value")
    if not isinstance(v, str):
        raise BadValue(f"{v!r} is not text")
    if nonempty and not v:
        raise BadValue("empty value")
    return v


def _bool(v: Any, *, text: bool) -> int:
    if text:
        s = v.strip().lower()
        if s in ("0", "false"):
            return 0
        if s in ("1", "true"):
            return 1
        raise BadValue(f"{v!r} is not 0/1 or true/false")
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    if isinstance(v, (int, np.integer)) and int(v) in (0, 1):
        return int(v)
    raise BadValue(f"{v!r} is not 0/1 or true/false")


def _json_list(v: Any, *, text: bool, what: str) -> list:
    """The items of a JSON list given as text, or of a list/tuple given as is."""
    if v is None:
        raise BadValue("missing value")
    if text or isinstance(v, str):
        try:
            items = json.loads(v)
        except (TypeError, ValueError):
            raise BadValue(f"{v!r} is not a JSON list of {what}") from None
        if not isinstance(items, list):
            raise BadValue(f"{v!r} is not a JSON list of {what}")
        return items
    if isinstance(v, (tuple, list)):
        return list(v)
    raise BadValue(f"{v!r} is not a list of {what}")


def _times_json(v: Any, *, text: bool) -> str:
    """A JSON list of non-negative finite seconds, re-serialised canonically."""
    out = []
    for x in _json_list(v, text=text, what="seconds"):
        try:
            out.append(as_seconds(x, text=False))
        except BadValue as exc:
            raise BadValue(f"element {x!r}: {exc}") from None
    return json.dumps(out)


def _pairs_json(v: Any, *, text: bool, key: str) -> str:
    """A JSON list of [``key`` (finite, >= 0), seconds (finite, either sign)] pairs, ``key`` increasing,
    re-serialised canonically."""
    out = []
    for x in _json_list(v, text=text, what=f"[{key}, seconds] pairs"):
        if not isinstance(x, (list, tuple)) or len(x) != 2:
            raise BadValue(f"element {x!r} is not an [{key}, seconds] pair")
        try:
            pair = [as_seconds(x[0], text=False), as_offset(x[1], text=False)]
        except BadValue as exc:
            raise BadValue(f"element {x!r}: {exc}") from None
        if out and pair[0] <= out[-1][0]:
            raise BadValue(f"element {x!r}: the {key} must increase")
        out.append(pair)
    return json.dumps(out)


#: the most quantile levels a ``prefill_tail`` or ``decode_pace`` keeps (0, 0.001, ..., 1)
MAX_TAIL_QUANTILES = 1001


def _quantiles_json(v: Any, *, text: bool) -> str:
    """A JSON list of finite seconds of either sign, non-decreasing (quantiles at evenly spaced levels 0..1):
    empty, or 2 to :data:`MAX_TAIL_QUANTILES` of them; re-serialised canonically."""
    items = _json_list(v, text=text, what="seconds")
    if len(items) == 1:
        raise BadValue("one quantile is not a tail: give none, or at least 2 (the levels 0 and 1)")
    if len(items) > MAX_TAIL_QUANTILES:
        raise BadValue(f"{len(items)} quantiles; at most {MAX_TAIL_QUANTILES}")
    out: list[float] = []
    for x in items:
        try:
            q = as_offset(x, text=False)
        except BadValue as exc:
            raise BadValue(f"element {x!r}: {exc}") from None
        if out and q < out[-1]:
            raise BadValue(f"element {x!r}: the quantiles must not decrease")
        out.append(q)
    return json.dumps(out)


def _pace_json(v: Any, *, text: bool) -> str:
    """``_quantiles_json`` of fractions of a mean, each over -1 (a decode that takes no time is not a pace)."""
    out = _quantiles_json(v, text=text)
    q = json.loads(out)
    if q and q[0] <= -1.0:
        raise BadValue(f"element {q[0]!r}: a pace is a fraction of the mean over -1")
    return out


def _source(v: Any) -> str:
    s = as_str(v, nonempty=True)
    if s in ("measured", "simulated") or (s.startswith("estimate:") and len(s) > len("estimate:")):
        return s
    raise BadValue(f"{s!r} is not 'measured', 'simulated' or 'estimate:<model>'")


def _checkers(text: bool) -> dict[str, Callable[[Any], Any]]:
    def i(lo: int) -> Callable[[Any], int]:
        return lambda v: as_int(v, lo=lo, text=text)

    f = lambda v: as_seconds(v, text=text)  # noqa: E731
    off = lambda v: as_offset(v, text=text)  # noqa: E731
    s = lambda v: as_str(v, nonempty=False)  # noqa: E731
    raw = lambda v: _times_json(v, text=text)  # noqa: E731
    return {
        "fingerprint": lambda v: as_str(v, nonempty=True),
        "tp": i(1), "batch": i(1), "bucket": i(1),
        "ttft_s": f, "tbt_s": f,
        "input_len": i(0), "l1": i(0), "l2": i(0),
        "t1_s": f, "t2_s": f,
        "raw_t1": raw, "raw_t2": raw,
        "repeats": i(0), "spread": f,
        "runner": s, "host": s,
        "measured_at": f,
        "simulated": lambda v: _bool(v, text=text),
        "source": _source,
        "ttft_err_s": f, "tbt_err_s": f, "excess": lambda v: as_ratio(v, text=text),
        "accepted": lambda v: _bool(v, text=text),
        "row_s": f, "admit_first_s": off, "admit_next_s": off,
        "kv_token_s": f, "row_context": f,  # seconds per token; tokens (both finite, >= 0)
        "resume_s": off,  # seconds, of either sign (lens.resume bounds it at minus one step)
        "admit_busy_s": off,
        "resume_idle": lambda v: _pairs_json(v, text=text, key="idle seconds"),  # (lens.resume)
        "resume_busy": lambda v: _pairs_json(v, text=text, key="pass seconds"),  # (lens.busy_resume)
        "prefill_tail": lambda v: _quantiles_json(v, text=text),  # (lens.prefill_tail)
        "prefill_tail_median_s": f,  # the median it lies about (0: its seconds read as they are)
        "decode_pace": lambda v: _pace_json(v, text=text),  # fractions of the mean (lens.decode_pace)
        "decode_pace_window_s": f, "decode_pace_tau_s": f,  # seconds (0: none measured; no correlation seen)
        "host_costs_method": i(0),  # lens.methods (0: not known)
    }


#: column -> check of one value given as a Python/numpy value (raises BadValue)
CHECK_VALUES = _checkers(text=False)
#: column -> check of one value given as text (a CSV cell)
CHECK_TEXT = _checkers(text=True)


def checked_profile_row(row: Sequence[Any]) -> tuple:
    """The values of a ``profiles`` row (in :data:`PROFILE_COLUMNS` order), checked; BadValue if one fails."""
    return tuple(CHECK_VALUES[c](v) for c, v in zip(PROFILE_COLUMNS, row))


def checked_unit_row(row: Sequence[Any]) -> tuple:
    """The values of a ``units`` row (in :data:`UNIT_COLUMNS` order), checked; BadValue if one fails."""
    r = dict(zip(UNIT_COLUMNS, row))
    return (as_str(r["fingerprint"], nonempty=True), as_int(r["tp"], lo=1, text=False),
            as_int(r["batch"], lo=1, text=False),
            as_str(r["target_json"], nonempty=False), as_str(r["runner"], nonempty=False),
            as_str(r["versions_json"], nonempty=False), as_str(r["host"], nonempty=False),
            as_seconds(r["compile_s"], text=False), as_seconds(r["run_s"], text=False),
            as_seconds(r["created_at"], text=False))


def profile_row(fingerprint: str, tp: int, batch: int, p: BucketProfile) -> tuple:
    """The checked ``profiles`` row of ``p`` in unit (fingerprint, tp, batch); ValueError naming a bad value."""
    values = {
        "fingerprint": fingerprint, "tp": tp, "batch": batch, "bucket": p.bucket,
        "ttft_s": p.ttft_s, "tbt_s": p.tbt_s, "input_len": p.input_len, "l1": p.l1, "l2": p.l2,
        "t1_s": p.t1_s, "t2_s": p.t2_s, "raw_t1": p.raw_t1, "raw_t2": p.raw_t2,
        "repeats": p.repeats, "spread": p.spread, "runner": p.runner, "host": p.host,
        "measured_at": p.measured_at, "simulated": p.simulated, "source": p.source,
        "ttft_err_s": p.ttft_err_s, "tbt_err_s": p.tbt_err_s, "excess": p.excess, "accepted": p.accepted,
        "row_s": p.row_s, "admit_first_s": p.admit_first_s, "admit_next_s": p.admit_next_s,
        "kv_token_s": p.kv_token_s, "row_context": p.row_context, "resume_s": p.resume_s,
        "admit_busy_s": p.admit_busy_s, "resume_idle": p.resume_idle, "resume_busy": p.resume_busy,
        "prefill_tail": p.prefill_tail, "prefill_tail_median_s": p.prefill_tail_median_s,
        "decode_pace": p.decode_pace, "decode_pace_window_s": p.decode_pace_window_s,
        "decode_pace_tau_s": p.decode_pace_tau_s, "host_costs_method": p.host_costs_method,
    }
    out = []
    for col in PROFILE_COLUMNS:
        try:
            out.append(CHECK_VALUES[col](values[col]))
        except BadValue as exc:
            raise ValueError(f"profile of bucket {p.bucket!r} of unit ({fingerprint}, tp={tp}, batch={batch}): {col}: {exc}") from None
    return tuple(out)


def to_profile(row: Sequence[Any]) -> BucketProfile:
    """The BucketProfile of a ``profiles`` row."""
    r = dict(zip(PROFILE_COLUMNS, row))
    return BucketProfile(
        bucket=int(r["bucket"]), ttft_s=float(r["ttft_s"]), tbt_s=float(r["tbt_s"]),
        input_len=int(r["input_len"]), l1=int(r["l1"]), l2=int(r["l2"]),
        t1_s=float(r["t1_s"]), t2_s=float(r["t2_s"]), repeats=int(r["repeats"]),
        spread=float(r["spread"]), runner=r["runner"], host=r["host"],
        measured_at=float(r["measured_at"]), simulated=bool(r["simulated"]),
        raw_t1=tuple(float(x) for x in json.loads(r["raw_t1"])),
        raw_t2=tuple(float(x) for x in json.loads(r["raw_t2"])),
        source=r["source"],
        ttft_err_s=float(r["ttft_err_s"]), tbt_err_s=float(r["tbt_err_s"]), excess=float(r["excess"]),
        accepted=bool(r["accepted"]), row_s=float(r["row_s"]),
        admit_first_s=float(r["admit_first_s"]), admit_next_s=float(r["admit_next_s"]),
        kv_token_s=float(r["kv_token_s"]), row_context=float(r["row_context"]), resume_s=float(r["resume_s"]),
        admit_busy_s=float(r["admit_busy_s"]),
        resume_idle=tuple((float(i), float(c)) for i, c in json.loads(r["resume_idle"])),
        resume_busy=tuple((float(x), float(c)) for x, c in json.loads(r["resume_busy"])),
        prefill_tail=tuple(float(x) for x in json.loads(r["prefill_tail"])),
        prefill_tail_median_s=float(r["prefill_tail_median_s"]),
        decode_pace=tuple(float(x) for x in json.loads(r["decode_pace"])),
        decode_pace_window_s=float(r["decode_pace_window_s"]), decode_pace_tau_s=float(r["decode_pace_tau_s"]),
        host_costs_method=int(r["host_costs_method"]),
    )


def empty_profiles_frame() -> pd.DataFrame:
    """A frame of no profiles with the columns and dtypes of ``ProfileCache.frame()``."""
    dtypes = {c: ("int64" if c in INT_COLUMNS or c in BOOL_COLUMNS else "float64" if c in FLOAT_COLUMNS else "object")
              for c in PROFILE_COLUMNS}
    return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in dtypes.items()})
