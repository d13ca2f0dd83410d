"""Regenerate ``lens/data/trace_quantiles.json`` from the public traces in ../shared/data/traces/.

Only summary statistics leave the traces: per trace, quantiles of input and of output
length (the marginals) and a coarse rank grid (a 2-D histogram of the two lengths' rank
pairs, i.e. an empirical copula) that keeps their dependence. ``lens.distributions``
samples from them. Deterministic: the same traces give the same file.

    python benchmarks/derive_trace_quantiles.py            # write the JSON
    python benchmarks/derive_trace_quantiles.py --check    # exit 1 if the shipped JSON is stale
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = ROOT.parent / "shared" / "data" / "traces"
DEFAULT_OUT = ROOT / "lens" / "data" / "trace_quantiles.json"

#: quantile levels: every percent, plus finer points in both tails
PROBS = sorted({round(p / 100, 4) for p in range(101)} | {0.001, 0.005, 0.995, 0.999})
#: rank bins per axis of the dependence grid
GRID = 32

#: name -> (file, input column, output column, origin, licence)
TRACES = {
    "azure_code": (
        "azure_code_2023.csv", "ContextTokens", "GeneratedTokens",
        "Azure LLM inference trace 2023, code service: Azure/AzurePublicDataset, "
        "data/AzureLLMInferenceTrace_code.csv",
        "CC-BY-4.0",
    ),
    "azure_conv": (
        "azure_conv_2023.csv", "ContextTokens", "GeneratedTokens",
        "Azure LLM inference trace 2023, conversation service: Azure/AzurePublicDataset, "
        "data/AzureLLMInferenceTrace_conv.csv",
        "CC-BY-4.0",
    ),
    "arxiv_4k": (
        "arxiv_summarization_4k_llama2.csv", "num_prefill_tokens", "num_decode_tokens",
        "microsoft/vidur, data/processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv",
        "MIT",
    ),
    "sharegpt_8k": (
        "sharegpt_8k_llama2.csv", "num_prefill_tokens", "num_decode_tokens",
        "project-etalon/etalon, data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
        "Apache-2.0",
    ),
    "bwb": (
        "bwb_4k_llama2.csv", "num_prefill_tokens", "num_decode_tokens",
        "project-etalon/etalon, data/processed_traces/bwb_stats_llama2_tokenizer_filtered_v2.csv",
        "Apache-2.0",
    ),
}


def read_lengths(path: Path, in_col: str, out_col: str) -> tuple[np.ndarray, np.ndarray]:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = {in_col, out_col} - set(reader.fieldnames or ())
        if missing:
            raise SystemExit(f"{path}: missing column(s) {sorted(missing)}")
        rows = [(int(float(r[in_col])), int(float(r[out_col]))) for r in reader]
    a = np.array(rows, dtype=np.int64)
    return a[:, 0], a[:, 1]


def rank_bins(x: np.ndarray) -> np.ndarray:
    """Equal-count bin (0..GRID-1) of each value's rank; ties broken by row order."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=np.int64)
    ranks[order] = np.arange(len(x))
    return ranks * GRID // len(x)


def summarise(name: str, traces: Path) -> dict:
    file, in_col, out_col, origin, licence = TRACES[name]
    lin, lout = read_lengths(traces / file, in_col, out_col)
    grid = np.zeros((GRID, GRID), dtype=np.int64)
    np.add.at(grid, (rank_bins(lin), rank_bins(lout)), 1)

    def q(x: np.ndarray) -> list[float]:
        return [round(float(v), 2) for v in np.quantile(x, PROBS)]

    return {
        "file": file,
        "columns": [in_col, out_col],
        "source": origin,
        "licence": licence,
        "rows": int(len(lin)),
        "input_quantiles": q(lin),
        "output_quantiles": q(lout),
        "rank_grid": grid.tolist(),
        "max_total": int((lin + lout).max()),
        "mean_input": round(float(lin.mean()), 2),
        "mean_output": round(float(lout.mean()), 2),
        "median_input": float(np.median(lin)),
        "median_output": float(np.median(lout)),
    }


def build(traces: Path) -> dict:
    return {
        "format": "lensopt-trace-quantiles/1",
        "description": (
            "Derived statistics of public LLM-serving traces (no raw rows): quantiles of input "
            "and output token length at 'probs', and 'rank_grid', a GRIDxGRID count of requests "
            "by (input rank bin, output rank bin) with equal-count bins, which keeps the joint "
            "structure. Regenerate with benchmarks/derive_trace_quantiles.py."
        ),
        "probs": PROBS,
        "grid": GRID,
        "traces": {name: summarise(name, traces) for name in TRACES},
    }


def render(data: dict) -> str:
    text = json.dumps(data, indent=1)
    # one line per list of numbers keeps the file short and diffable
    text = re.sub(r"\[\s*([-0-9.,\s]+?)\s*\]", lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)
    return text + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="folder of the trace CSV files")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON file to write")
    ap.add_argument("--check", action="store_true", help="only compare with the existing file")
    args = ap.parse_args(argv)
    if not args.traces.is_dir():
        print(f"traces folder {args.traces} not found; pass --traces", file=sys.stderr)
        return 2
    text = render(build(args.traces))
    if args.check:
        same = args.out.is_file() and args.out.read_text() == text
        print(f"{args.out}: {'up to date' if same else 'STALE'}")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out} ({len(text)} bytes, {len(TRACES)} traces)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
