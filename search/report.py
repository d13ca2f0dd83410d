"""``report.md``, ``report.html``, ``pareto.png``, ``staircase.png`` (and, for continuous serving,
``rate_sweep.png``) of a search."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from lens.drift import SIDE_BY_SIDE
from lens.types import BucketProfile, Candidate
from spaces import Space

from . import fmt
from .html import page
from .ledger import RunLedger, unit_key
from .selection import NEAR_DUPLICATE
from .sweep import RateSweep

#: prediction columns of the front, nearest-candidate and trial tables a person reads, in order
#: (the space's objectives are added when they are not among them)
FRONT_METRICS = ("throughput_tok_s", "throughput_tok_s_per_chip", "ttft_p50_s", "tpot_p50_s", "e2e_p50_s", "e2e_p90_s")
#: confirmation: the metrics shown predicted / measured / error


#: continuous serving's request rates (lens.serving_metrics, lens.capacity): their labels
RATE_LABELS = {"request_throughput_req_s": "request throughput", "request_throughput_req_s_per_chip":
               "request throughput per chip", "request_goodput_req_s": "goodput", "goodput_req_s_per_chip":
               "goodput per chip", "sustainable_rate_req_s": "sustainable rate", "sustainable_rate_req_s_per_chip":
               "sustainable rate per chip"}


def metric_label(name: str) -> str:
    """``ttft_p50_s`` -> ``TTFT p50``; ``throughput_tok_s_per_chip`` -> ``throughput per chip``."""
    if name in RATE_LABELS:
        return RATE_LABELS[name]
    if name.startswith("throughput_tok_s"):
        rest = name[len("throughput_tok_s"):].replace("_", " ").strip()
        return rest or "throughput"
    kind, _, stat = name.removesuffix("_s").partition("_")
    return f"{kind.upper()} {stat}" if stat else name


def metric_value(name: str, v: Any) -> str:
    """A metric's value with its unit, three significant figures."""
    if name in RATE_LABELS:
        return f"{fmt.sig(v)} req/s"
    if name.startswith("throughput"):
        return fmt.tok_s(v)
    if name.endswith("_padding"):
        return fmt.share(v)
    if name.endswith("_s"):
        return fmt.seconds(v)
    return fmt.sig(v)


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table of cells already formatted for reading (``_none_`` when empty)."""
    if not rows:
        return "_none_\n"
    esc = lambda c: str(c).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def _buckets(r: Mapping[str, Any]) -> str:
    ctx, tkg = str(r["ctx_buckets"]), str(r["tkg_buckets"])
    return ctx if ctx == tkg else f"ctx {ctx} / tkg {tkg}"


def _shown_metrics(space: Space) -> list[str]:
    return list(dict.fromkeys(FRONT_METRICS + (space.objectives.throughput, space.objectives.latency)))


def candidates_table(df: pd.DataFrame | None, space: Space, *, ranked: bool = True) -> str:
    """Front (or nearest) candidates: the unit, its buckets, the metrics, padding, where from."""
    if df is None or df.empty:
        return "_none_\n"
    if "collapsed_into" in df:
        df = df[df["collapsed_into"].isna()]
    metrics = [m for m in _shown_metrics(space) if m in df]
    over = [c for c in df.columns if c.startswith("slo_") and c.endswith("_over_s")]
    header = (["#"] if ranked else []) + ["tp", "batch", "buckets"] + [metric_label(m) for m in metrics]
    header += ["padding (prefill / decode)", "from"] + [f"over the SLO on `{c[4:-7]}`" for c in over]
    confirmed = "confirmed" in df
    objectives = (space.objectives.throughput, space.objectives.latency)
    bounded = "may_be_dominated_by" in df
    if bounded:
        header += [f"+- {metric_label(objectives[0])} / {metric_label(objectives[1])}", "overlaps"]
    if confirmed:
        header.append("confirmed")
    rows = []
    for r in df.to_dict("records"):
        row = ([str(r["rank"])] if ranked else []) + [str(r["tp"]), str(r["batch"]), _buckets(r)]
        row += [metric_value(m, r[m]) for m in metrics]
        row += [f"{fmt.share(r.get('prefill_padding'))} / {fmt.share(r.get('decode_padding'))}", str(r.get("source", ""))]
        row += [fmt.seconds(r[c]) if r[c] > 0 else "met" for c in over]
        if bounded:
            half = [(r[f"{m}_high"] - r[f"{m}_low"]) / 2 / r[m] if r[m] else float("nan") for m in objectives]
            row += [f"{fmt.share(half[0])} / {fmt.share(half[1])}",
                    " ".join(f"#{j}" for j in str(r.get("may_be_dominated_by") or "").split())]
        if confirmed:
            row.append(("yes" + (", **flagged**" if r.get("flagged") is True else "")) if r.get("confirmed") is True else "")
        rows.append(row)
    return md_table(header, rows)


def confirm_md(confirm: pd.DataFrame) -> str:
    """Predicted vs measured, the error of each, the per-request error and the flag."""
    header = ["tp", "batch", "buckets"]
    # the compared metrics (search.confirm.CONFIRM_METRICS), then the objectives not among them (under continuous
    # serving: goodput, a latency percentile), in the order the confirmation judged them
    shown = [c.removesuffix("_predicted") for c in confirm.columns if c.endswith("_predicted")]
    header += [f"{metric_label(m)}: predicted / measured (error)" for m in shown]
    drifted = "host_drift" in confirm and confirm["host_drift"].notna().any()
    header += ["per-request E2E error"]
    if drifted:
        header += ["host drift", "per-request E2E error, drift-corrected"]
    header += ["verdict"]
    rows = []
    for r in confirm.to_dict("records"):
        row = [str(r["tp"]), str(r["batch"]), _buckets(r)]
        if isinstance(r.get("error"), str) and r["error"]:
            rows.append(row + ["failed: " + r["error"]] + [""] * (len(header) - 4))
            continue
        for m in shown:
            fixed = r.get(f"{m}_err_drift_corrected_%")
            row.append(f"{metric_value(m, r[f'{m}_predicted'])} / {metric_value(m, r[f'{m}_measured'])} "
                       f"({fmt.signed_pct(r[f'{m}_err_%'])}"
                       + (f"; {fmt.signed_pct(fixed)} drift-corrected)" if drifted and fixed == fixed else ")"))
        row += [f"{fmt.sig(r.get('e2e_request_mape_%'))}%"]
        if drifted:
            row += [fmt.sig(r.get("host_drift")), f"{fmt.sig(r.get('e2e_request_mape_drift_corrected_%'))}%"]
        why = r.get("flagged_on")
        verdict = ("**flagged**" + (f" ({why})" if isinstance(why, str) and why else "")) if r["flagged"] else "ok"
        row += [verdict + _DRIFT_VERDICT.get(r.get("drift_action"), "")]
        rows.append(row)
    return md_table(header, rows)


#: how a confirmation's verdict reads when the host's drift changed what was judged (lens.drift.action)
_DRIFT_VERDICT = {"rescaled": ", re-scaled for drift", "reprofiled": ", re-profiled for drift"}


def _pm(value: float, err: float) -> str:
    """A value and its +- (relative), for reading: ``12.3 ms +-1.2%``."""
    return fmt.seconds(value) + (f" +-{fmt.share(err / value)}" if value > 0 and err > 0 else "")


def workload_line(ledger: RunLedger) -> str:
    w = ledger.workload
    if w is None:
        return "-"
    n = w.requests - (w.dropped_longer or 0)
    bits = [f"`{w.source}`{' (instead of the space' + chr(39) + 's)' if w.override else ''}", f"{n} requests (seed {w.seed}"
            + (f", lengths scaled by {w.length_scale:g}" if w.length_scale is not None else "")
            + (f"; {w.dropped_longer} of {w.requests} dropped as longer than the largest bucket" if w.dropped_longer else "")
            + ")"]
    bits.append(f"input {fmt.sig(w.input_mean)} tokens on average (at most {w.input_max:,}), output "
                f"{fmt.sig(w.output_mean)} (at most {w.output_max:,})")
    if w.arrivals:
        bits.append(f"arriving at {fmt.sig(w.arrival_rate)} requests/s ({w.arrivals})")
    return ", ".join(bits)


def _plots(run_dir: Path, space: Space, front: pd.DataFrame, trials: pd.DataFrame, confirm: pd.DataFrame | None,
           staircase: Mapping[int, BucketProfile], simulated: bool, estimate_only: bool = False,
           sweep: RateSweep | None = None) -> dict[str, bytes]:
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
    if confirm is not None and len(confirm) and f"{lcol}_measured" in confirm and f"{tcol}_measured" in confirm:
        ax.scatter(confirm[f"{lcol}_measured"], confirm[f"{tcol}_measured"],
                   marker="*", s=160, c="#228833", label="confirmed on hardware (measured)", zorder=4)
    ax.set_xlabel(f"{metric_label(lcol)} latency (s)")
    if tcol in RATE_LABELS:
        ax.set_ylabel(f"{metric_label(tcol)} (requests/s)")
    else:
        ax.set_ylabel(f"{'throughput ' if tcol != 'throughput_tok_s' else ''}{metric_label(tcol)} (tok/s)")
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
    if sweep is not None and len(sweep.points):
        out["rate_sweep.png"] = sweep_plot(sweep, space=space, tag=tag)
    for name, data in out.items():
        (run_dir / name).write_bytes(data)
    return out


def sweep_plot(sweep: RateSweep, *, space: Space, tag: str) -> bytes:
    """Against the arrival rate: the latency objective (log scale) and goodput per chip."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

    points, cap = sweep.points, sweep.capacity
    lcol = space.objectives.latency
    ycol = lcol if lcol in points else "e2e_p90_s"
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    for i, (label, g) in enumerate(points.groupby("candidate", sort=False)):
        color = f"C{i % 10}"
        a1.plot(g["rate_req_s"], g[ycol], marker="o", ms=3, c=color, label=label)
        a2.plot(g["rate_req_s"], g["goodput_req_s_per_chip"], marker="o", ms=3, c=color, label=label)
        sus = cap.loc[cap["candidate"] == label, "sustainable_rate_req_s"]
        if len(sus) and sus.iloc[0] > 0:
            for a in (a1, a2):
                a.axvline(sus.iloc[0], c=color, ls=":", lw=1)
    for a in (a1, a2):
        a.axvline(sweep.rate, c="k", ls="--", lw=1, label="the workload's rate")
        a.set_xscale("log")
        a.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        a.xaxis.set_major_formatter(ScalarFormatter())
        a.xaxis.set_minor_formatter(NullFormatter())
        a.set_xlabel("arrival rate (requests/s)")
        a.grid(alpha=0.3)
    a1.set_yscale("log")
    a1.set_ylabel(f"{metric_label(ycol)} latency (s)")
    a2.set_ylabel("goodput per chip (requests/s within every SLO)")
    a1.legend(fontsize=6)
    fig.suptitle(f"{space.target.name}: predicted latency and goodput vs arrival rate (dotted: largest sustainable "
                 f"rate){tag}", fontsize=9)
    fig.tight_layout()
    data = _png(fig)
    plt.close(fig)
    return data


def sweep_md(sweep: RateSweep, space: Space) -> list[str]:
    """The report's section on latency against the arrival rate (continuous serving)."""
    rows = [[r["candidate"], fmt.sig(r["saturation_req_s"]) + " req/s", fmt.sig(r["sustainable_rate_req_s"]) + " req/s",
             fmt.sig(r["sustainable_rate_req_s_per_chip"]) + " req/s", r["limited_by"] or "-"]
            for r in sweep.capacity.to_dict("records")]
    return ["## Latency vs arrival rate (continuous serving)\n",
            f"Each front candidate predicted at a range of arrival rates on the workload's arrival pattern (the "
            f"workload runs at {fmt.sig(sweep.rate)} requests/s, the dashed line); the dotted lines are each "
            f"candidate's largest sustainable rate: every SLO met and the queue growing by at most "
            f"{space.objectives.max_queue_growth:g} s per s (docs/serving.md). Every point is in `rate_sweep.csv`. "
            f"Saturation is the request throughput with every request arriving at once, over the whole run: its "
            f"last requests decode in a part-empty batch, which lowers it, so the largest sustainable rate (which "
            f"lets the queue grow by that bound) can lie above it.\n",
            "![rate sweep](rate_sweep.png)\n",
            md_table(["candidate", "saturation (all at once)", "largest sustainable rate", "per chip",
                      "beyond it"], rows)]


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def write_report(run_dir: Path, *, space: Space, front: pd.DataFrame, trials: pd.DataFrame, confirm: pd.DataFrame | None,
                 ledger: RunLedger, chosen: Candidate | None, staircase: Mapping[int, BucketProfile],
                 nearest: list[dict], sweep: RateSweep | None = None) -> None:
    simulated = ledger.simulated
    estimate_only = ledger.estimate_only
    pngs = _plots(run_dir, space, front, trials, confirm, staircase, simulated, estimate_only, sweep)
    t = space.target
    sim = "**SIMULATED device: every hardware number below comes from the simulator, not from hardware.**\n\n" if simulated else ""
    if estimate_only:
        sim = (f"**ESTIMATES ONLY: every number below comes from the {ledger.estimator or 'analytical'} model; "
               f"nothing was measured or confirmed on hardware.**\n\n")
    hw = " (simulated)" if simulated else ""
    lines = [f"# lensopt search: {t.name}\n", sim,
             f"- target: runner `{t.runner}` on `{t.hardware}`; bucket policy {t.bucket_policy}, "
             f"{space.target.batching} batching, {t.prefill} prefill, {t.serving} serving"
             + (f" ({f'at most {t.scheduler.max_prefills}' if t.scheduler.max_prefills else 'any number of'} "
                f"prompts between decode steps, {t.scheduler.prefill_priority} priority)"
                if t.serving == "continuous" else ""),
             f"- model: {fmt.model_line(t.model, t.dtype)}",
             f"- workload: {workload_line(ledger)}",
             f"- objectives: maximise `{space.objectives.throughput}`, minimise `{space.objectives.latency}`; "
             f"SLO: {', '.join(f'`{k}` at most {fmt.seconds(v)}' for k, v in space.slo) or 'none'}",
             f"- trials: {ledger.trials}; units measured this run: {len(ledger.units_measured)}, "
             f"reused from the cache: {len(ledger.units_reused)}, failed: {len(ledger.units_failed)}",
             f"- hardware time{hw}: profiling {fmt.seconds(ledger.profile_hardware_s)}, "
             f"confirmation {fmt.seconds(ledger.confirm_hardware_s)}",
             f"- fingerprint `{ledger.fingerprint}`; space `{ledger.space}` (sha256 `{ledger.space_sha256[:12]}`)",
             ""]
    if chosen is not None:
        same = chosen.ctx_buckets == chosen.tkg_buckets
        sets = (f"buckets {', '.join(map(str, chosen.ctx_buckets))} for both phases" if same else
                f"context-encoding buckets {', '.join(map(str, chosen.ctx_buckets))}, token-generation buckets "
                f"{', '.join(map(str, chosen.tkg_buckets))}")
        lines += ["## Chosen configuration\n",
                  f"tp {chosen.tp}, batch {chosen.batch}, {sets}: the front's knee; `deploy/` holds it as the "
                  f"runner takes it.\n"]
    kind = "estimated, never measured" if estimate_only else "predicted from measured profiles"
    lines += [f"## Pareto front ({kind})\n", candidates_table(front, space)]
    hidden = int(front["collapsed_into"].notna().sum()) if "collapsed_into" in front else 0
    if hidden:
        lines += [f"{hidden} more row(s) of the same tp and batch, within {NEAR_DUPLICATE:.0%} of a row above on both "
                  f"objectives but with more buckets, are left out here; `pareto.csv` keeps them (`collapsed_into`).\n"]
    if "may_be_dominated_by" in front:
        lines += ["`+-`: how far each objective moves when every bucket's TTFT_b and TBT_b move by their own +- "
                  "(one standard error of its repeats; `pareto.csv` has the bounds). `overlaps`: the rows whose "
                  "interval reaches past this one's on both objectives -- the profiles cannot order them, a "
                  "measurement may.\n"]
    if nearest:
        lines += ["## No candidate meets the SLO: the nearest ones\n",
                  candidates_table(pd.DataFrame(nearest), space, ranked=False)]
    lines += ["## Confirmation on the hardware\n"]
    if confirm is None or confirm.empty:
        lines += ["_not run_\n"]
    else:
        passes = space.budget.confirm_repeats
        read = (f"the median of {passes} passes' own figures" if space.target.serving == "continuous"
                else f"each request's median over {passes} passes")
        lines += ["Predicted vs measured on the workload sample"
                  + (f" ({read})" if passes > 1 else "")
                  + f"; an error over {space.budget.tolerance * 100:g}% is flagged.\n"]
        drift = confirm["host_drift"].dropna() if "host_drift" in confirm else pd.Series(dtype=float)
        if len(drift):
            if space.budget.drift_check == SIDE_BY_SIDE:
                how = ("each confirmation is judged on the prediction from the buckets its requests use, profiled "
                       "side by side with its run (before and after it: the host as it was then, not stored), the "
                       "error as is kept beside it.")
            else:
                how = (f"past {fmt.share(space.budget.drift_tolerance)} of drift (and beyond its own noise) the "
                       f"corrected one is judged: the prediction re-scaled by the drift, or past "
                       f"{fmt.share(space.budget.drift_reprofile)} predicted again from the buckets profiled again "
                       f"during the confirmation.")
            lines += [f"Host drift: a reference probe run around each confirmation took "
                      f"{', '.join(fmt.sig(d) for d in drift)} times its time in the profile. Each error is given "
                      f"as is and drift-corrected; {how}\n"]
        lines += [confirm_md(confirm)]
    if "staircase.png" in pngs:
        lines += ["## Per-bucket staircase of the chosen unit" + (" (estimated)" if estimate_only else "") + "\n",
                  "![staircase](staircase.png)\n",
                  md_table(["bucket", "TTFT_b", "TBT_b", "L1 / L2", "repeats", "accepted", "from"],
                           [[str(b), _pm(p.ttft_s, p.ttft_err_s), _pm(p.tbt_s, p.tbt_err_s), f"{p.l1} / {p.l2}",
                             str(p.repeats), "yes" if p.accepted else "**no**", p.source]
                            for b, p in sorted(staircase.items())])]
    lines += ["## Throughput vs latency\n", "![pareto](pareto.png)\n"]
    if "rate_sweep.png" in pngs:
        lines += sweep_md(sweep, space)
    if trials is not None and len(trials) and "infeasible" in trials:
        why = trials["infeasible"]  # text, or all NaN as a trials.csv of none read back
        inf = trials[why.notna() & (why.astype(str) != "")]
        if len(inf):
            counts = inf.groupby("infeasible").size().sort_values(ascending=False)
            lines += ["## Infeasible candidates\n", md_table(["why", "trials"], [[k, str(v)] for k, v in counts.items()])]
    if ledger.units_failed:
        lines += ["## Units whose profiling failed\n",
                  "The search went on without them (out of device memory, a timeout, a lost device, or runs that "
                  "stayed impossible to solve).\n",
                  md_table(["unit (tp x batch)", "error"], [[unit_key(u), v] for u, v in ledger.units_failed.items()])]
    if ledger.units_noisy:
        rows = [[unit_key(u), str(b), why] for u, per in ledger.units_noisy.items() for b, why in per.items()]
        lines += ["## Noisy measurements\n",
                  "Buckets kept although their derived TTFT_b or TBT_b spread more than profile.max_spread (each was "
                  "measured again, with more repeats or a longer run, up to profile.attempts times): they are stored "
                  "as not accepted, and predictions that use them carry wider intervals.\n",
                  md_table(["unit (tp x batch)", "bucket", "why"], rows)]
    md = "\n".join(lines)
    (run_dir / "report.md").write_text(md)
    (run_dir / "report.html").write_text(page(md, pngs, f"lensopt: {t.name}"))
