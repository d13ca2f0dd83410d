"""Built-in named workloads: request-length distributions sampled with a seed.

Two kinds:

*Parametric*, matching the dataset means the LENS paper uses (its Table 4; total length at
most 8192): input and output lengths are independent lognormals, each rounded to an
integer and truncated to its bounds, and the pair is conditioned on
``input + output <= 8192`` (rejection). ``sigma`` is chosen per dataset; the median was
solved so that the *truncated, conditioned* means land on the paper's (checked by the
tests to within a few percent):

=================  =============================  ==============================
name               input: median, sigma, bounds    output: median, sigma
=================  =============================  ==============================
sharegpt           101.8, 1.00, [1, 8192]          218.1, 0.90    (167 / 327)
cnn_dailymail      789.4, 0.45, [1025, 8192]       67.3, 0.40     (1393 / 73; inputs over 1024 only)
arxiv              4887.1, 0.35, [1, 8192]         173.9, 0.60    (4822 / 207)
writing_prompts    25.1, 0.60, [1, 8192]           618.4, 0.50    (30 / 701)
=================  =============================  ==============================

*Trace-derived*: ``azure_code``, ``azure_conv``, ``sharegpt_8k``, ``arxiv_4k``, ``bwb``,
sampled from ``lens/data/trace_quantiles.json`` (derived statistics of public traces; see
the attribution there and ``benchmarks/derive_trace_quantiles.py``). Each trace is kept
as quantiles of input and output length plus a 32x32 grid of counts over their
equal-count rank bins (an empirical copula). A sample picks a grid cell by its count,
a uniform rank inside the cell on each axis, and maps each rank through the inverse CDF
(linear interpolation between quantiles), so both marginals and the coarse dependence
(e.g. arXiv's long inputs with short summaries) survive. Pairs whose total exceeds the
trace's longest observed total are drawn again.
"""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from .errors import UserError
from .types import Requests

DATA_FILE = Path(__file__).resolve().parent / "data" / "trace_quantiles.json"

#: the LENS paper's limit on input + output for its datasets
PAPER_MAX_TOTAL = 8192


@dataclass(frozen=True)
class _Lognormal:
    median: float
    sigma: float
    lo: int = 1
    hi: int = PAPER_MAX_TOTAL


@dataclass(frozen=True)
class _Parametric:
    input: _Lognormal
    output: _Lognormal
    mean_input: float  # the paper's published means the parameters were solved for
    mean_output: float
    note: str = ""


PARAMETRIC: dict[str, _Parametric] = {
    "sharegpt": _Parametric(_Lognormal(101.8, 1.00), _Lognormal(218.1, 0.90), 167, 327),
    "cnn_dailymail": _Parametric(
        _Lognormal(789.4, 0.45, lo=1025), _Lognormal(67.3, 0.40), 1393, 73, note="inputs over 1024 tokens only"
    ),
    "arxiv": _Parametric(_Lognormal(4887.1, 0.35), _Lognormal(173.9, 0.60), 4822, 207),
    "writing_prompts": _Parametric(_Lognormal(25.1, 0.60), _Lognormal(618.4, 0.50), 30, 701),
}

TRACE_NAMES = ("azure_code", "azure_conv", "sharegpt_8k", "arxiv_4k", "bwb")


def names() -> list[str]:
    """Every built-in workload name."""
    return list(PARAMETRIC) + list(TRACE_NAMES)


def _check_name(name: str) -> str:
    if name not in PARAMETRIC and name not in TRACE_NAMES:
        raise UserError(f"unknown workload distribution {name!r}: choose one of {', '.join(names())}")
    return name


@lru_cache(maxsize=1)
def _tables() -> dict:
    try:
        data = json.loads(DATA_FILE.read_text())
    except FileNotFoundError:
        raise UserError(
            f"{DATA_FILE} is missing; regenerate it with benchmarks/derive_trace_quantiles.py"
        ) from None
    if data.get("format") != "lensopt-trace-quantiles/1":
        raise UserError(f"{DATA_FILE}: unknown format {data.get('format')!r}")
    return data


def max_total(name: str) -> int:
    """The longest input + output a sample of ``name`` can have."""
    _check_name(name)
    if name in PARAMETRIC:
        return PAPER_MAX_TOTAL
    return int(_tables()["traces"][name]["max_total"])


def info(name: str) -> dict:
    """How ``name`` is generated: family, parameters, target or source statistics, attribution."""
    _check_name(name)
    if name in PARAMETRIC:
        p = PARAMETRIC[name]
        return {
            "name": name,
            "family": "independent truncated lognormals conditioned on input + output <= 8192",
            "input": vars(p.input).copy(),
            "output": vars(p.output).copy(),
            "mean_input": p.mean_input,
            "mean_output": p.mean_output,
            "max_total": PAPER_MAX_TOTAL,
            "source": "LENS paper (arXiv 2606.18042), Table 4 means" + (f"; {p.note}" if p.note else ""),
        }
    t = _tables()["traces"][name]
    keep = ("file", "source", "licence", "rows", "mean_input", "mean_output", "median_input", "median_output", "max_total")
    return {"name": name, "family": "trace quantiles with a rank grid", **{k: t[k] for k in keep}}


def _check_args(n: int, seed: int) -> None:
    for what, v in (("n", n), ("seed", seed)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise UserError(f"workload sample: {what} must be an integer, got {v!r}")
    if n < 0 or seed < 0:
        raise UserError(f"workload sample: n and seed must be >= 0, got n={n}, seed={seed}")


def _draw(n: int, rng: np.random.Generator, draw_batch, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Rejection loop: ``draw_batch(k)`` gives candidate pairs (already in bounds or not)."""
    ins, outs, got = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], 0
    while got < n:
        a, b, ok = draw_batch(2 * (n - got) + 64)
        ok &= a + b <= limit
        ins.append(a[ok])
        outs.append(b[ok])
        got += int(ok.sum())
    return np.concatenate(ins)[:n], np.concatenate(outs)[:n]


def _sample_parametric(p: _Parametric, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    def batch(k: int):
        a = np.rint(rng.lognormal(np.log(p.input.median), p.input.sigma, k)).astype(np.int64)
        b = np.rint(rng.lognormal(np.log(p.output.median), p.output.sigma, k)).astype(np.int64)
        ok = (a >= p.input.lo) & (a <= p.input.hi) & (b >= p.output.lo) & (b <= p.output.hi)
        return a, b, ok

    return _draw(n, rng, batch, PAPER_MAX_TOTAL)


def _sample_trace(name: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    data = _tables()
    t = data["traces"][name]
    probs = np.asarray(data["probs"], dtype=float)
    q_in = np.asarray(t["input_quantiles"], dtype=float)
    q_out = np.asarray(t["output_quantiles"], dtype=float)
    grid = np.asarray(t["rank_grid"], dtype=float)
    g = grid.shape[0]
    cell_p = grid.ravel() / grid.sum()

    def batch(k: int):
        cell = rng.choice(cell_p.size, size=k, p=cell_p)
        u_in = (cell // g + rng.random(k)) / g
        u_out = (cell % g + rng.random(k)) / g
        a = np.maximum(np.rint(np.interp(u_in, probs, q_in)), 1).astype(np.int64)
        b = np.maximum(np.rint(np.interp(u_out, probs, q_out)), 1).astype(np.int64)
        return a, b, np.ones(k, dtype=bool)

    return _draw(n, rng, batch, int(t["max_total"]))


def sample(name: str, n: int, seed: int = 0) -> Requests:
    """``n`` requests of the named workload, the same for the same ``seed``; lengths are ints >= 1."""
    _check_name(name)
    _check_args(n, seed)
    rng = np.random.default_rng([int(seed), zlib.crc32(name.encode())])
    if name in PARAMETRIC:
        lin, lout = _sample_parametric(PARAMETRIC[name], int(n), rng)
    else:
        lin, lout = _sample_trace(name, int(n), rng)
    return Requests(lin, lout, None, name)


__all__ = ["PARAMETRIC", "PAPER_MAX_TOTAL", "TRACE_NAMES", "info", "max_total", "names", "sample"]
