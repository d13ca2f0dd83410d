"""``report.md``, ``report.html``, ``pareto.png`` and ``staircase.png`` of a search."""
from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from lens.types import BucketProfile, Candidate
from spaces import Space

from .ledger import RunLedger, unit_key

_SHOW = ["rank", "tp", "batch", "ctx_buckets", "tkg_buckets", "throughput_tok_s", "throughput_tok_s_per_chip",
         "ttft_p50_s", "tpot_p50_s", "e2e_p50_s", "e2e_p90_s", "prefill_padding", "decode_padding", "source", "confirmed",
         "flagged"]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v != v:
            return "-"
        return f"{v:.4g}"
    return str(v)


def md_table(df: pd.DataFrame, cols: list[str] | None = None) -> str:
    if df is None or df.empty:
        return "_none_\n"
    cols = [c for c in (cols or list(df.columns)) if c in df.columns]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df[cols].iterrows():
        out.append("| " + " | ".join(_fmt(r[c]) for c in cols) + " |")
    return "\n".join(out) + "\n"


def _plots(run_dir: Path, space: Space, front: pd.DataFrame, trials: pd.DataFrame, confirm: pd.DataFrame | None,
           staircase: Mapping[int, BucketProfile], simulated: bool, estimate_only: bool = False) -> dict[str, bytes]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tcol, lcol = space.objectives.throughput, space.objectives.latency
    tag = " (SIMULATED device)" if simulated else (" (ESTIMATES, nothing measured)" if estimate_only else "")
    out = {}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if trials is not None and tcol in trials:
        ok = trials.dropna(subset=[tcol, lcol])
        meas = ok[ok["source_now"].isin(["measured", "simulated"])]
        est = ok[~ok["source_now"].isin(["measured", "simulated"])]
        ax.scatter(est[lcol], est[tcol], s=10, c="#bbbbbb",
                   label="candidates (estimated)" if estimate_only else "estimated (prior), never on the front")
        ax.scatter(meas[lcol], meas[tcol], s=12, c="#7799cc", label="predicted from measured profiles")
    if len(front):
        f = front.sort_values(lcol)
        ax.step(f[lcol], f[tcol], where="post", c="#cc3333", lw=1.5)
        ax.scatter(f[lcol], f[tcol], s=30, c="#cc3333", zorder=3,
                   label="Pareto front (" + ("estimated" if set(f.get("source", [])) - {"measured", "simulated"} else "predicted") + ")")
    if confirm is not None and len(confirm) and f"{lcol}_measured" in confirm:
        ax.scatter(confirm[f"{lcol}_measured"], confirm[f"{tcol}_measured"] if f"{tcol}_measured" in confirm else None,
                   marker="*", s=160, c="#228833", label="confirmed on hardware (measured)", zorder=4)
    elif confirm is not None and len(confirm) and "throughput_tok_s_measured" in confirm and "e2e_p90_s_measured" in confirm and lcol == "e2e_p90_s":
        pass
    ax.set_xlabel(f"{lcol} (s)")
    ax.set_ylabel(tcol)
    ax.set_title(f"{space.target.name}: throughput vs latency{tag}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out["pareto.png"] = _png(fig)
    plt.close(fig)
    if staircase:
        bs = sorted(staircase)
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
        a1.step(bs, [staircase[b].ttft_s * 1e3 for b in bs], where="mid", marker="o")
        a1.set_xlabel("context-encoding bucket (tokens)")
        a1.set_ylabel("TTFT_b (ms)")
        a2.step(bs, [staircase[b].tbt_s * 1e3 for b in bs], where="mid", marker="o", c="#cc6633")
        a2.set_xlabel("token-generation bucket (tokens)")
        a2.set_ylabel("TBT_b (ms)")
        for a in (a1, a2):
            a.set_xscale("log", base=2)
            a.grid(alpha=0.3)
        fig.suptitle(f"per-bucket profile of the chosen unit{tag}")
        fig.tight_layout()
        out["staircase.png"] = _png(fig)
        plt.close(fig)
    for name, data in out.items():
        (run_dir / name).write_bytes(data)
    return out


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def write_report(run_dir: Path, *, space: Space, front: pd.DataFrame, trials: pd.DataFrame, confirm: pd.DataFrame | None,
                 ledger: RunLedger, chosen: Candidate | None, staircase: Mapping[int, BucketProfile],
                 nearest: list[dict]) -> None:
    simulated = ledger.simulated
    estimate_only = ledger.estimate_only
    pngs = _plots(run_dir, space, front, trials, confirm, staircase, simulated, estimate_only)
    t = space.target
    sim = "**SIMULATED device: every hardware number below comes from the simulator, not from hardware.**\n\n" if simulated else ""
    if estimate_only:
        sim = (f"**ESTIMATES ONLY: every number below comes from the {ledger.estimator or 'analytical'} model; "
               f"nothing was measured or confirmed on hardware.**\n\n")
    lines = [f"# lensopt search: {t.name}\n", sim,
             f"- target: runner `{t.runner}` on `{t.hardware}`, model {t.model.to_dict()}, dtype {t.dtype}, "
             f"policy {t.bucket_policy}, batching {space.target.batching}, prefill {t.prefill}",
             f"- fingerprint `{ledger.fingerprint}`; space `{ledger.space}` (sha256 {ledger.space_sha256[:12]})",
             f"- workload: {ledger.workload.to_json() if ledger.workload else None}",
             f"- objectives: maximise `{space.objectives.throughput}`, minimise `{space.objectives.latency}`; "
             f"SLO: {', '.join(f'{k} <= {v:g} s' for k, v in space.slo) or 'none'}",
             f"- trials: {ledger.trials}; units measured this run: {len(ledger.units_measured)}, "
             f"reused from the cache: {len(ledger.units_reused)}, failed: {len(ledger.units_failed)}",
             f"- hardware seconds{' (simulated)' if simulated else ''}: profiling {ledger.profile_hardware_s:.1f}, "
             f"confirmation {ledger.confirm_hardware_s:.1f}",
             ""]
    if chosen is not None:
        lines += ["## Chosen configuration\n",
                  f"tp = {chosen.tp}, batch = {chosen.batch}, context-encoding buckets {list(chosen.ctx_buckets)}, "
                  f"token-generation buckets {list(chosen.tkg_buckets)} (the front's knee; `deploy/` holds it as the runner takes it).\n"]
    kind = "estimated, never measured" if estimate_only else "predicted from measured profiles"
    lines += [f"## Pareto front ({kind})\n", md_table(front, _SHOW)]
    if nearest:
        lines += ["## No candidate meets the SLO: the nearest ones\n", md_table(pd.DataFrame(nearest))]
    lines += ["## Confirmation on the hardware\n"]
    if confirm is None or confirm.empty:
        lines += ["_not run_\n"]
    else:
        lines += [f"Predicted vs measured on the workload sample; |error| over {space.budget.tolerance * 100:g}% is flagged.\n",
                  md_table(confirm)]
    if "staircase.png" in pngs:
        lines += ["## Per-bucket staircase of the chosen unit" + (" (estimated)" if estimate_only else "") + "\n", "![staircase](staircase.png)\n",
                  md_table(pd.DataFrame([{"bucket": b, "TTFT_b_s": p.ttft_s, "TBT_b_s": p.tbt_s, "spread": p.spread,
                                          "source": p.source} for b, p in sorted(staircase.items())]))]
    lines += ["## Throughput vs latency\n", "![pareto](pareto.png)\n"]
    if trials is not None and len(trials) and "infeasible" in trials:
        inf = trials[trials["infeasible"].astype(str) != ""]
        if len(inf):
            counts = inf.groupby("infeasible").size().reset_index(name="trials")
            lines += ["## Infeasible candidates\n", md_table(counts)]
    if ledger.units_failed:
        lines += ["## Units whose profiling failed\n",
                  "The search went on without them (a timeout, a lost device, or runs that stayed impossible to solve).\n",
                  md_table(pd.DataFrame([{"unit": unit_key(u), "error": v} for u, v in ledger.units_failed.items()]))]
    if ledger.units_noisy:
        rows = [{"unit": unit_key(u), "bucket": str(b), "why": why} for u, per in ledger.units_noisy.items()
                for b, why in per.items()]
        lines += ["## Noisy measurements\n",
                  "Buckets kept although their repeated runs spread widely (each was measured again, with more "
                  "repeats, up to profile.attempts times): predictions that use them are less certain.\n",
                  md_table(pd.DataFrame(rows))]
    md = "\n".join(lines)
    (run_dir / "report.md").write_text(md)
    (run_dir / "report.html").write_text(_html(md, pngs, t.name))


def _html(md: str, pngs: dict[str, bytes], title: str) -> str:
    """A self-contained page: the markdown's tables and headings, images inlined."""
    body = []
    rows: list[str] = []

    def flush():
        if rows:
            head, *rest = rows
            cells = [c.strip() for c in head.strip("|").split("|")]
            h = "<tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in cells) + "</tr>"
            b = "".join("<tr>" + "".join(f"<td>{html.escape(c.strip())}</td>" for c in r.strip("|").split("|")) + "</tr>"
                        for r in rest if not r.startswith("|---"))
            body.append(f"<table>{h}{b}</table>")
            rows.clear()

    for line in md.splitlines():
        if line.startswith("|"):
            rows.append(line)
            continue
        flush()
        if line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif line.startswith("!["):
            name = line[line.index("(") + 1:line.index(")")]
            if name in pngs:
                data = base64.b64encode(pngs[name]).decode()
                body.append(f'<img alt="{name}" src="data:image/png;base64,{data}">')
        elif line.startswith("- "):
            body.append(f"<li>{html.escape(line[2:])}</li>")
        elif line.strip():
            body.append(f"<p>{html.escape(line).replace('**', '')}</p>")
    flush()
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;font-size:12px}"
             "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}img{max-width:100%}")
    return f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{style}</style></head><body>{''.join(body)}</body></html>\n"
