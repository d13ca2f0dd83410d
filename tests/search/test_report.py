"""``report.md`` and ``report.html`` for people: units, three significant figures, the model and
the workload in words, markdown rendered, tables that scroll in their own box; and the page
as a real browser shows it."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from lens.types import BucketProfile, Candidate, ModelShape, Target
from search import fmt
from search.evaluate import Evaluation
from search.html import page
from search.ledger import RunLedger
from search.report import write_report
from search.results import front_table
from spaces import SearchSpace, Space, WorkloadDescription

MODEL = ModelShape(layers=4, hidden=256, heads=4, kv_heads=2, intermediate=688, vocab=4096)
T, L = "throughput_tok_s_per_chip", "e2e_p90_s"


@pytest.mark.parametrize(("x", "want"), [(472.1, "472"), (0.0123456, "0.0123"), (1.0, "1.00"), (12345.0, "12,300"),
                                         (999.7, "1,000"), (-3.14159, "-3.14"), (0, "0"), (float("nan"), "-")])
def test_three_significant_figures(x, want):
    assert fmt.sig(x) == want


@pytest.mark.parametrize(("x", "want"), [(0.0123456, "12.3 ms"), (1.23456, "1.23 s"), (2.4e-5, "24.0 µs"),
                                         (154.2, "154 s"), (0.0, "0 s")])
def test_durations_carry_their_unit(x, want):
    assert fmt.seconds(x) == want


def test_markdown_renders_for_people():
    md = ("# Title\n\n- runner `jax` on `cpu`, **bold**\n- <b>not markup</b>\n\nA paragraph\nthat continues.\n\n"
          "| a | b |\n|---|---|\n| 1.23 ms | x \\| y |\n\n_none_\n")
    html = page(md, {}, "t")
    assert "<code>jax</code>" in html and "<code>cpu</code>" in html and "<strong>bold</strong>" in html
    assert "`" not in html and "**" not in html
    assert "&lt;b&gt;not markup&lt;/b&gt;" in html  # text is escaped, never markup
    assert "<p>A paragraph that continues.</p>" in html
    assert '<div class="table"><table>' in html and '<td class="num">1.23 ms</td>' in html
    assert "<td class=\"word\">x | y</td>" in html
    assert '<p class="note">none</p>' in html


def _space() -> Space:
    target = Target(name="report-test", runner="jax", hardware="cpu", bucket_policy="exclusive", dtype="float32",
                    model=MODEL)
    return Space(path=Path("spaces/quickstart.toml"), sha256="ab" * 32, target=target,
                 search=SearchSpace(tp=(1, 2), batch=(1, 4, 8), buckets=(64, 128, 256, 512)))


def _ev(tp, batch, t, l, buckets) -> Evaluation:
    m = {T: t, "throughput_tok_s": t * tp, L: l, "ttft_p50_s": 0.0123456, "tpot_p50_s": 0.00456789,
         "e2e_p50_s": l * 0.6, "prefill_padding": 0.4012, "decode_padding": 0.1234}
    return Evaluation(Candidate(tp, batch, buckets, buckets), metrics=m, source="measured")


def _report(tmp_path: Path) -> Path:
    sp = _space()
    full = (64, 128, 256, 512)
    front = [_ev(1, 1, 102.345, 1.98765, full), _ev(1, 4, 301.1, 3.4567, full), _ev(1, 8, 472.1, 5.1, (128, 512)),
             _ev(1, 8, 473.0, 5.11, full), _ev(2, 8, 800.5, 7.2, full)]
    table = front_table(front, sp)
    table["confirmed"] = [True, False, True, False, False]
    table["flagged"] = [False, float("nan"), True, float("nan"), float("nan")]
    confirm = pd.DataFrame([{
        "tp": 1, "batch": 1, "ctx_buckets": "64 128 256 512", "tkg_buckets": "64 128 256 512", "simulated": False,
        "throughput_tok_s_predicted": 102.345, "throughput_tok_s_measured": 98.7, "throughput_tok_s_err_%": 3.693,
        "e2e_p90_s_predicted": 1.98765, "e2e_p90_s_measured": 2.1, "e2e_p90_s_err_%": -5.35,
        "e2e_request_mape_%": 6.789, "flagged": False}])
    trials = pd.DataFrame({"trial": range(4), "source_now": ["measured", "measured", "estimate:scaling", ""],
                           T: [102.0, 300.0, 200.0, None], L: [2.0, 3.5, 4.0, None],
                           "infeasible": ["", "", "", "tp 2 exceeds chips_per_host 1"]})
    stair = {b: BucketProfile(bucket=b, ttft_s=0.001 * b / 64, tbt_s=0.004 + b * 1e-6, input_len=b - 1, l1=2, l2=64,
                              t1_s=0.1, t2_s=0.2, repeats=3, spread=0.0213) for b in full}
    ledger = RunLedger(run="r", space="spaces/quickstart.toml", space_sha256="ab" * 32, fingerprint="f" * 16,
                       target=sp.target, trials=150, profile_hardware_s=93.123, confirm_hardware_s=12.34,
                       workload=WorkloadDescription(source="sharegpt", requests=100, seed=0, input_mean=41.83,
                                                    output_mean=81.666, input_max=370, output_max=457,
                                                    length_scale=0.25, dropped_longer=3, override=False),
                       units_failed={(2, 8): "DeviceOutOfMemory: command runner (x): `prog --flag` profile: exited "
                                             "with status 0; the program reported an error: out of device memory "
                                             "while compiling the token-generation graph of bucket 512 " * 3})
    write_report(tmp_path, space=sp, front=table, trials=trials, confirm=confirm, ledger=ledger,
                 chosen=front[1].candidate, staircase=stair, nearest=[])
    return tmp_path


def test_report_md_speaks_in_units_and_words(tmp_path):
    md = (_report(tmp_path) / "report.md").read_text()
    assert "{'layers'" not in md and "'hidden'" not in md  # no Python reprs
    assert "4 layers, hidden 256, 4 heads (2 KV), intermediate 688, vocabulary 4,096" in md
    assert "`sharegpt`, 97 requests (seed 0, lengths scaled by 0.25; 3 of 100 dropped" in md
    assert "102 tok/s" in md and "1.99 s" in md and "12.3 ms" in md and "4.57 ms" in md and "40.1% / 12.3%" in md
    assert "102.345" not in md and "1.98765" not in md  # never raw floats
    assert "profiling 93.1 s, confirmation 12.3 s" in md
    assert "102 tok/s / 98.7 tok/s (+3.69%)" in md and "6.79%" in md
    # the near-duplicate row (tp 1, batch 8, 473.0 tok/s, more buckets) is left out, and said so
    assert "473 tok/s" not in md and "1 more row(s)" in md and "collapsed_into" in md


CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)
#: what the page measures of itself once loaded, written where --dump-dom shows it
PROBE = """<pre id="probe"></pre><script>
window.addEventListener("load", () => {
  const imgs = [...document.images];
  document.getElementById("probe").textContent = JSON.stringify({
    images: imgs.length, loaded: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
    pageWidth: document.documentElement.scrollWidth, viewWidth: window.innerWidth,
    text: document.body.innerText.length, backticks: document.body.innerText.split("`").length - 1,
    tables: document.querySelectorAll("div.table > table").length});
});
</script>"""


def _chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}", "--window-size=1280,2000",
             "--hide-scrollbars"]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium installed (apt-get install chromium) to open report.html in")
def test_report_html_in_a_real_browser(tmp_path):
    (tmp_path / "run").mkdir()
    rd = _report(tmp_path / "run")
    html = (rd / "report.html").read_text()
    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("</body>", PROBE + "</body>"))
    r = _chromium("--virtual-time-budget=10000", "--dump-dom", probe.as_uri(), profile=tmp_path / "p1")
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.split('<pre id="probe">', 1)[1].split("</pre>", 1)[0])
    assert got["images"] == 2 and got["loaded"] == 2, got  # the Pareto plot and the staircase
    assert got["text"] > 1000 and got["tables"] >= 4, got  # not blank
    assert got["backticks"] == 0, got  # markdown rendered, not shown
    assert got["pageWidth"] <= got["viewWidth"] == 1280, got  # wide tables scroll in their own box
    shot = tmp_path / "report.png"
    r = _chromium(f"--screenshot={shot}", (rd / "report.html").as_uri(), profile=tmp_path / "p2")
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    import matplotlib.image

    px = matplotlib.image.imread(shot)
    assert px.shape[1] == 1280
    assert (px[..., :3] < 0.9).any(axis=-1).mean() > 0.02  # ink on the page: text, tables and plots


def test_the_front_takes_the_sweeps_sustainable_rate_where_its_objective_did_not_compute_one():
    from types import SimpleNamespace

    from search.results import with_capacity
    from search.sweep import RateSweep

    a, b = Candidate(1, 2, (64, 128), (64, 128)), Candidate(2, 4, (64, 128), (64, 128))
    front = [SimpleNamespace(candidate=a), SimpleNamespace(candidate=b)]
    table = pd.DataFrame({"rank": [1, 2], "goodput_req_s_per_chip": [2.5, 1.5]})
    # the sweep drew only the first candidate
    cap = pd.DataFrame([{"candidate": a.label(), "tp": 1, "batch": 2, "saturation_req_s": 9.0,
                         "sustainable_rate_req_s": 6.0, "sustainable_rate_req_s_per_chip": 6.0, "limited_by": ""}])
    out = with_capacity(table, front, RateSweep(pd.DataFrame(), cap, 3.0))
    assert out["sustainable_rate_req_s_per_chip"].iloc[0] == 6.0
    assert pd.isna(out["sustainable_rate_req_s_per_chip"].iloc[1])  # not swept: left empty, never guessed
    assert "sustainable_rate_req_s" not in table  # the caller's table is not changed
    # a rate the objective computed is kept
    table["sustainable_rate_req_s_per_chip"] = [7.0, 3.0]
    table["sustainable_rate_req_s"] = [7.0, 6.0]
    kept = with_capacity(table, front, RateSweep(pd.DataFrame(), cap, 3.0))
    assert list(kept["sustainable_rate_req_s_per_chip"]) == [7.0, 3.0]
