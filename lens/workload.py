"""Workloads: request lengths from a trace file (CSV/JSONL) or a named built-in distribution."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import TraceError, UserError
from .types import Requests

#: sample size of a workload when none is given (a space file's workload.requests defaults to it)
DEFAULT_REQUESTS = 200
#: most requests a workload sample may hold (predicting a million takes seconds; more is a typo)
MAX_REQUESTS = 1_000_000
#: longest request a trace may give, in tokens (beyond any context window; larger is a bad row)
MAX_TOKENS = 100_000_000

#: (input, output, arrival) column names recognised without configuration
KNOWN_COLUMNS = (
    ("input_len", "output_len", "arrival_s"),
    ("ContextTokens", "GeneratedTokens", "TIMESTAMP"),
    ("num_prefill_tokens", "num_decode_tokens", None),
    ("input_tokens", "output_tokens", "arrival"),
    ("prompt_len", "output_len", "arrival_time"),
)


def _pick_columns(header: Sequence[str], path: Path, input_col, output_col, arrival_col):
    if input_col or output_col:
        if not (input_col and output_col):
            raise TraceError(f"{path}: give both input_column and output_column (or neither, to auto-detect)")
        for c in (input_col, output_col) + ((arrival_col,) if arrival_col else ()):
            if c not in header:
                raise TraceError(f"{path}: no column {c!r}; the header has {', '.join(header)}")
        return input_col, output_col, arrival_col
    for i, o, a in KNOWN_COLUMNS:
        if i in header and o in header:
            return i, o, (a if a in header else None)
    raise TraceError(
        f"{path}: cannot find input/output length columns in {', '.join(header) or 'an empty header'}; "
        f"name them input_len,output_len or set input_column/output_column in [workload]"
    )


def _int_cell(v, path: Path, line: int, col: str) -> int:
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise TraceError(f"{path}, line {line}: column {col} = {v!r} is not a number") from None
    if not np.isfinite(f) or f != int(f):
        raise TraceError(f"{path}, line {line}: column {col} = {v!r} is not a whole token count")
    if f < 1:
        raise TraceError(f"{path}, line {line}: column {col} = {v!r}; token counts must be >= 1")
    if f > MAX_TOKENS:
        raise TraceError(f"{path}, line {line}: column {col} = {v!r} is more than {MAX_TOKENS:,} tokens")
    return int(f)


def _arrival(v, path: Path, line: int, col: str) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        pass
    try:
        return np.datetime64(str(v).strip()).astype("datetime64[us]").astype(np.int64) / 1e6
    except ValueError:
        raise TraceError(f"{path}, line {line}: column {col} = {v!r} is neither seconds nor a timestamp") from None


def read_trace(
    path: str | Path,
    *,
    input_column: str | None = None,
    output_column: str | None = None,
    arrival_column: str | None = None,
) -> Requests:
    """Every request of a CSV or JSONL trace, in file order; bad rows name file and line."""
    p = Path(path)
    if not p.is_file():
        raise TraceError(f"{p}: no such trace file")
    ins: list[int] = []
    outs: list[int] = []
    arr: list[float] = []
    try:
        with p.open(newline="", encoding="utf-8") as fh:
            if p.suffix.lower() in (".jsonl", ".ndjson"):
                cols = None
                for line_no, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise TraceError(f"{p}, line {line_no}: not valid JSON ({exc.msg})") from None
                    if not isinstance(row, dict):
                        raise TraceError(f"{p}, line {line_no}: each line must be a JSON object")
                    if cols is None:
                        cols = _pick_columns(list(row), p, input_column, output_column, arrival_column)
                    _take(row, cols, p, line_no, ins, outs, arr)
            else:
                reader = csv.DictReader(fh)
                cols = _pick_columns(reader.fieldnames or [], p, input_column, output_column, arrival_column)
                for row in reader:
                    _take(row, cols, p, reader.line_num, ins, outs, arr)
    except UnicodeDecodeError:
        raise TraceError(f"{p}: not a UTF-8 text file; traces are CSV or JSONL") from None
    except csv.Error as exc:  # a NUL byte, a field over the csv module's size limit, ...
        line = reader.line_num if "reader" in locals() else 1
        raise TraceError(f"{p}, line {line}: not a readable CSV row ({exc})") from None
    except OSError as exc:
        raise TraceError(f"{p}: cannot read the trace: {exc.strerror or exc}") from None
    if not ins:
        raise TraceError(f"{p}: the trace has no requests")
    arrival = None
    if arr:
        a = np.asarray(arr, dtype=np.float64)
        arrival = a - a.min()
    return Requests(np.asarray(ins), np.asarray(outs), arrival, name=p.stem)


def _take(row, cols, p, line_no, ins, outs, arr):
    i, o, a = cols
    for c in (i, o):
        if c not in row:
            raise TraceError(f"{p}, line {line_no}: missing column {c}")
    ins.append(_int_cell(row[i], p, line_no, i))
    outs.append(_int_cell(row[o], p, line_no, o))
    if a:
        arr.append(_arrival(row.get(a), p, line_no, a))


def check_sample(n: int, seed: int, *, where: str = "") -> None:
    """Refuse a sample size or seed no sampler can take (``where`` says whose they are)."""
    if n < 1:
        raise UserError(f"{where}requests = {n}: sample at least one request")
    if n > MAX_REQUESTS:
        raise UserError(f"{where}requests = {n}: at most {MAX_REQUESTS:,} requests per sample")
    if seed < 0:
        raise UserError(f"{where}seed = {seed}: a seed is an integer >= 0")


def sample(requests: Requests, n: int, *, seed: int) -> Requests:
    """``n`` requests drawn at random (without replacement while the trace is large enough)."""
    check_sample(n, seed)
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(requests), size=n, replace=n > len(requests))
    arr = None if requests.arrival_s is None else requests.arrival_s[idx]
    return Requests(requests.input_len[idx], requests.output_len[idx], arr, requests.name)


def is_trace(source: str | Path) -> bool:
    """Whether ``source`` names a trace file (else a built-in distribution)."""
    p = Path(source)
    return p.suffix.lower() in (".csv", ".jsonl", ".ndjson") or p.exists()


def load_workload(
    source: str | Path,
    *,
    requests: int | None = None,
    seed: int = 0,
    input_column: str | None = None,
    output_column: str | None = None,
    arrival_column: str | None = None,
    consecutive: bool = False,
) -> Requests:
    """A trace file path or a built-in distribution name -> ``requests`` requests.

    ``requests=None``: all of a trace, ``DEFAULT_REQUESTS`` of a distribution. A trace is
    sampled by random rows, or with ``consecutive`` as a window of consecutive rows (its
    arrival process unthinned, for serving with arrivals).
    """
    check_sample(DEFAULT_REQUESTS if requests is None else requests, seed)
    p = Path(source)
    if is_trace(p):
        full = read_trace(p, input_column=input_column, output_column=output_column, arrival_column=arrival_column)
        if requests is None:
            return full
        return window(full, requests, seed=seed) if consecutive else sample(full, requests, seed=seed)
    from . import distributions  # built-in named workloads

    return distributions.sample(str(source), DEFAULT_REQUESTS if requests is None else requests, seed)


def fit_to(requests: Requests, max_len: int) -> tuple[Requests, int]:
    """Drop requests whose prompt or last context exceeds ``max_len``; return them and how many went."""
    keep = (requests.input_len <= max_len) & (requests.input_len + requests.output_len - 1 <= max_len)
    arr = None if requests.arrival_s is None else requests.arrival_s[keep]
    return Requests(requests.input_len[keep], requests.output_len[keep], arr, requests.name), int((~keep).sum())


def scale_lengths(requests: Requests, factor: float) -> Requests:
    """Scale input and output lengths (rounded, at least 1): a trace's shape for a small model."""
    if not factor > 0:
        raise UserError(f"length_scale = {factor} must be positive")
    longest = float(max(requests.input_len.max(initial=0), requests.output_len.max(initial=0))) * factor
    if not longest <= MAX_TOKENS:
        raise UserError(f"length_scale = {factor} makes requests longer than {MAX_TOKENS:,} tokens")
    f = lambda x: np.maximum(np.rint(x * factor), 1).astype(np.int64)  # noqa: E731
    return Requests(f(requests.input_len), f(requests.output_len), requests.arrival_s, requests.name)


def window(requests: Requests, n: int, *, seed: int) -> Requests:
    """``n`` consecutive requests of a trace, from a seeded start: its arrival process unthinned.

    Random rows (``sample``) would thin the arrivals; a window keeps their pattern.
    The window's arrivals start at 0.
    """
    total = len(requests)
    if n >= total:
        out = requests
    else:
        start = int(np.random.default_rng(seed).integers(0, total - n + 1))
        out = Requests(requests.input_len[start:start + n], requests.output_len[start:start + n],
                       None if requests.arrival_s is None else requests.arrival_s[start:start + n], requests.name)
    if out.arrival_s is not None:
        out = Requests(out.input_len, out.output_len, out.arrival_s - out.arrival_s.min(), out.name)
    return out
