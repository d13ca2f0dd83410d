"""Built-in workload distributions: parametric means, trace medians, determinism, errors."""
from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from lens import distributions as D
from lens.errors import UserError
from lens.types import Requests

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT.parent / "shared" / "data" / "traces"

#: the LENS paper's Table 4 means (input, output)
PAPER_MEANS = {
    "sharegpt": (167, 327),
    "cnn_dailymail": (1393, 73),
    "arxiv": (4822, 207),
    "writing_prompts": (30, 701),
}

#: name -> (file, input column, output column)
TRACE_FILES = {
    "azure_code": ("azure_code_2023.csv", "ContextTokens", "GeneratedTokens"),
    "azure_conv": ("azure_conv_2023.csv", "ContextTokens", "GeneratedTokens"),
    "sharegpt_8k": ("sharegpt_8k_llama2.csv", "num_prefill_tokens", "num_decode_tokens"),
    "arxiv_4k": ("arxiv_summarization_4k_llama2.csv", "num_prefill_tokens", "num_decode_tokens"),
    "bwb": ("bwb_4k_llama2.csv", "num_prefill_tokens", "num_decode_tokens"),
}


def _read_trace(name: str) -> tuple[np.ndarray, np.ndarray]:
    file, a, b = TRACE_FILES[name]
    path = TRACES / file
    if not path.is_file():
        pytest.skip(f"trace {path} is absent (it lives in ../shared/data/traces beside the project)")
    with path.open(newline="") as fh:
        rows = [(int(r[a]), int(r[b])) for r in csv.DictReader(fh)]
    x = np.array(rows)
    return x[:, 0], x[:, 1]


def test_names_cover_both_kinds():
    assert set(D.names()) == set(PAPER_MEANS) | set(TRACE_FILES)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(UserError) as exc:
        D.sample("alpaca", 10, 0)
    for name in D.names():
        assert name in str(exc.value)
    with pytest.raises(UserError):
        D.max_total("alpaca")


@pytest.mark.parametrize("name", list(PAPER_MEANS))
def test_parametric_means_match_the_paper(name):
    r = D.sample(name, 20000, 3)
    target_in, target_out = PAPER_MEANS[name]
    assert abs(r.input_len.mean() / target_in - 1) < 0.05
    assert abs(r.output_len.mean() / target_out - 1) < 0.05
    assert (r.input_len + r.output_len).max() <= D.PAPER_MAX_TOTAL == D.max_total(name)
    assert r.input_len.min() >= 1 and r.output_len.min() >= 1


def test_cnn_dailymail_inputs_are_over_1024():
    assert D.sample("cnn_dailymail", 5000, 0).input_len.min() > 1024


@pytest.mark.parametrize("name", D.names())
def test_samples_are_requests_of_ints_and_deterministic(name):
    a = D.sample(name, 500, 7)
    b = D.sample(name, 500, 7)
    c = D.sample(name, 500, 8)
    assert isinstance(a, Requests) and len(a) == 500 and a.name == name
    assert a.input_len.dtype == np.int64 and a.output_len.dtype == np.int64
    assert a.input_len.min() >= 1 and a.output_len.min() >= 1
    assert (a.input_len + a.output_len).max() <= D.max_total(name)
    np.testing.assert_array_equal(a.input_len, b.input_len)
    np.testing.assert_array_equal(a.output_len, b.output_len)
    assert not np.array_equal(a.input_len, c.input_len)


def test_bad_sizes_and_seeds():
    assert len(D.sample("bwb", 0, 0)) == 0
    for n, seed in ((-1, 0), (1.5, 0), (10, -3), (10, "x")):
        with pytest.raises(UserError):
            D.sample("sharegpt", n, seed)


def test_shipped_table_has_attribution_and_no_raw_rows():
    data = json.loads(D.DATA_FILE.read_text())
    assert set(data["traces"]) == set(TRACE_FILES)
    k, g = len(data["probs"]), data["grid"]
    for name, t in data["traces"].items():
        assert t["source"] and t["licence"] and t["file"] == TRACE_FILES[name][0]
        assert len(t["input_quantiles"]) == len(t["output_quantiles"]) == k
        assert np.asarray(t["rank_grid"]).shape == (g, g)
        assert sum(map(sum, t["rank_grid"])) == t["rows"]
        assert D.info(name)["licence"] == t["licence"]


@pytest.mark.parametrize("name", list(TRACE_FILES))
def test_quantile_samplers_reproduce_the_stored_medians(name):
    r = D.sample(name, 20000, 1)
    info = D.info(name)
    assert np.median(r.input_len) == pytest.approx(info["median_input"], rel=0.03, abs=1)
    assert np.median(r.output_len) == pytest.approx(info["median_output"], rel=0.03, abs=1)


@pytest.mark.parametrize("name", list(TRACE_FILES))
def test_quantile_samplers_reproduce_the_real_trace(name):
    lin, lout = _read_trace(name)
    r = D.sample(name, 20000, 2)
    assert np.median(r.input_len) == pytest.approx(np.median(lin), rel=0.03, abs=1)
    assert np.median(r.output_len) == pytest.approx(np.median(lout), rel=0.03, abs=1)
    assert r.input_len.mean() == pytest.approx(lin.mean(), rel=0.05)
    # the tails: the share of samples under the trace's p10 and p90 (a rank test, robust to gaps)
    for x, real in ((r.input_len, lin), (r.output_len, lout)):
        for q in (10, 90):
            assert np.mean(x <= np.percentile(real, q)) == pytest.approx(np.mean(real <= np.percentile(real, q)), abs=0.02)
    # the rank grid keeps the sign of the dependence between input and output length
    real = np.corrcoef(np.log(lin), np.log(lout))[0, 1]
    got = np.corrcoef(np.log(r.input_len), np.log(r.output_len))[0, 1]
    if abs(real) > 0.3:
        assert np.sign(got) == np.sign(real) and abs(got) > 0.5 * abs(real)


def test_shipped_table_is_up_to_date_with_the_traces():
    if not TRACES.is_dir():
        pytest.skip(f"traces folder {TRACES} is absent")
    spec = importlib.util.spec_from_file_location("derive_trace_quantiles", ROOT / "benchmarks" / "derive_trace_quantiles.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.render(mod.build(TRACES)) == D.DATA_FILE.read_text(), "run benchmarks/derive_trace_quantiles.py"
