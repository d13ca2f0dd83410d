"""The files of ``results/<run>/``, written from the search's records.

This is the edge where records become tables: the front (Evaluations), the trials
(TrialRecords), the confirmations and the ledger turn into ``pareto.csv``, ``trials.csv``,
``confirm.csv`` and ``run.json`` here, and into ``report.md``/``.html`` and ``deploy/``.
Nothing reads these files back into objects: ``lensopt confirm`` reads the ledger.
A folder that cannot be written stops the run with a ``ResultsError`` naming the file.
"""
from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import pandas as pd

from lens.errors import UserError
from lens.types import BucketProfile, Candidate, stable_hash
from spaces import Space

from . import fmt
from .cli_common import json_safe
from .confirm import Confirmation
from .evaluate import Evaluation
from .ledger import RunLedger
from .report import metric_label
from .selection import may_be_dominated_by, near_duplicates
from .sweep import RateSweep

if TYPE_CHECKING:
    from .study import TrialRecord

#: the trial store and the tables a fresh run starts without
RUN_FILES = ("study.journal", "confirm.csv", "pareto.csv", "trials.csv", "run.json")
#: files of earlier lensopt versions that a fresh run removes too
OLD_FILES = ("trials.jsonl", "study.sqlite")
#: prediction columns of the front and trial tables, in order
REPORT_METRICS = ("throughput_tok_s", "throughput_tok_s_per_chip", "throughput_tok_s_per_host", "ttft_mean_s",
                  "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_mean_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s",
                  "e2e_mean_s", "e2e_p50_s", "e2e_p90_s", "e2e_p99_s", "prefill_padding", "decode_padding", "total_s",
                  # continuous serving (lens.serving_metrics, lens.capacity)
                  "request_throughput_req_s", "request_throughput_req_s_per_chip", "request_goodput_req_s",
                  "goodput_req_s_per_chip", "good_fraction", "offered_rate_req_s", "queue_growth", "queue_mean_s",
                  "queue_p90_s", "sustainable_rate_req_s", "sustainable_rate_req_s_per_chip")


def default_run_name(space: Space, extra: Any = None) -> str:
    """The run folder's name: the space file's name and a hash of its content and the options."""
    return f"{space.path.stem}-{stable_hash([space.sha256, extra], 8)}"


class ResultsError(UserError):
    """The results folder cannot be written (read-only, not a folder, disk full)."""


def results_error(path: Path, exc: BaseException) -> ResultsError:
    where = getattr(exc, "filename", None) or path
    why = getattr(exc, "strerror", None) or str(exc)
    hint = ("free some space on its disk" if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
            else "make it writable")
    return ResultsError(f"cannot write {where}: {why}; {hint} or pass --results DIR (the profile cache is a "
                        f"separate file and keeps every unit measured so far)")


@dataclass
class SearchResult:
    """What ``run`` and ``confirm_run`` return: the tables as written, and the ledger."""

    run_dir: Path
    front: pd.DataFrame
    trials: pd.DataFrame
    confirm: pd.DataFrame | None
    ledger: RunLedger
    #: continuous serving: the front's latency-versus-rate sweep (``search.sweep``), as rate_sweep.csv holds it
    sweep: pd.DataFrame | None = None

    @property
    def info(self) -> dict[str, Any]:
        """The ledger as run.json holds it."""
        return self.ledger.to_json()


def prepare_dir(run_dir: Path, *, fresh: bool) -> None:
    """Create the run folder (emptied of an earlier run's files with ``fresh``) and check it is writable."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        if fresh:
            for f in RUN_FILES + OLD_FILES:
                (run_dir / f).unlink(missing_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ResultsError(f"results directory {run_dir} is not writable ({exc.strerror or exc}"
                           f"{': ' + str(exc.filename) if exc.filename and str(exc.filename) != str(run_dir) else ''}); "
                           f"pass --results DIR") from None


def write_json(p: Path, obj: Mapping[str, Any]) -> None:
    """Write ``obj`` whole or not at all (a temporary file renamed into place)."""
    tmp = p.with_suffix(".json.tmp")
    try:
        tmp.write_text(json.dumps(json_safe(obj), indent=2, default=str))
        os.replace(tmp, p)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise results_error(p, exc) from None


def write_ledger(run_dir: Path, ledger: RunLedger) -> None:
    write_json(run_dir / "run.json", ledger.to_json())


# -- records -> rows ---------------------------------------------------------------------------
def candidate_cells(c: Candidate) -> dict[str, Any]:
    """A candidate as table cells (bucket sets as space-separated boundaries)."""
    return {"tp": c.tp, "batch": c.batch, "ctx_buckets": " ".join(map(str, c.ctx_buckets)),
            "tkg_buckets": " ".join(map(str, c.tkg_buckets))}


def eval_row(e: Evaluation, space: Space) -> dict[str, Any]:
    row = {**candidate_cells(e.candidate), "source": e.source}
    row.update({k: e.metrics[k] for k in REPORT_METRICS if k in e.metrics})
    for k, v in e.violations(space).items():
        row[f"slo_{k}_over_s"] = v
    return row


def front_table(front: Sequence[Evaluation], space: Space, confirmed: Sequence[Confirmation] | None = None) -> pd.DataFrame:
    """``pareto.csv``: the front as given (lowest latency first), ranked, marked where confirmed.

    Every point is a row; ``collapsed_into`` holds the rank of the row a near-duplicate reads
    as (``selection.near_duplicates``), empty for the rows a person is shown. Each objective's
    interval from the profiles' +- (``_low``/``_high``), and the ranks of the points that may
    dominate it within their intervals (``may_be_dominated_by``).
    """
    df = pd.DataFrame([eval_row(e, space) for e in front])
    if not len(df):
        return df
    df.insert(0, "rank", range(1, len(df) + 1))
    df["collapsed_into"] = pd.array([None if j is None else j + 1 for j in near_duplicates(front, space)], dtype="Int64")
    if any(e.bounds for e in front):
        for name in (space.objectives.throughput, space.objectives.latency):
            df[f"{name}_low"] = [e.bounds.get(name, (float("nan"),) * 2)[0] for e in front]
            df[f"{name}_high"] = [e.bounds.get(name, (float("nan"),) * 2)[1] for e in front]
        df["may_be_dominated_by"] = [" ".join(str(j + 1) for j in js) for js in may_be_dominated_by(front, space)]
    if confirmed:
        flags = {c.candidate: c.flagged for c in confirmed}
        df["flagged"] = [flags.get(e.candidate, float("nan")) for e in front]
        df["confirmed"] = [e.candidate in flags for e in front]
    return df


#: pareto.csv's columns the rate sweep fills beyond each candidate's own evaluation
SWEPT = ("sustainable_rate_req_s", "sustainable_rate_req_s_per_chip")


def with_capacity(table: pd.DataFrame, front: Sequence[Evaluation], sweep: RateSweep) -> pd.DataFrame:
    """``table`` with each swept candidate's largest sustainable rate where its own evaluation has
    none (the rate is an objective's only when it is the throughput objective; the sweep finds it
    for the candidates it draws, the rest stay empty)."""
    found = dict(zip(sweep.capacity["candidate"], sweep.capacity.itertuples()))
    out = table.copy()
    for col in SWEPT:
        have = out[col] if col in out else pd.Series(float("nan"), index=out.index)
        swept = [getattr(found[e.candidate.label()], col) if e.candidate.label() in found else float("nan")
                 for e in front]
        out[col] = have.where(have.notna(), pd.Series(swept, index=out.index, dtype=float))
    return out


def trials_table(records: Iterable["TrialRecord"], now: Mapping[Candidate, Evaluation], space: Space) -> pd.DataFrame:
    """``trials.csv``: every trial, with the estimate it has now (``now``: candidate -> evaluation)."""
    rows = []
    for rec in records:
        ev = now[rec.candidate]
        row = {"trial": rec.number, "state": rec.state, **candidate_cells(rec.candidate), "source_at_trial": rec.source,
               "source_now": ev.source, "infeasible": ev.infeasible or rec.infeasible}
        if ev.metrics:
            row.update({k: ev.metrics[k] for k in REPORT_METRICS if k in ev.metrics})
            row["meets_slo"] = ev.meets_slo(space)
        rows.append(row)
    return pd.DataFrame(rows)


def confirm_table(confirmed: Sequence[Confirmation]) -> pd.DataFrame:
    """``confirm.csv``: predicted vs measured, the error and the flag of each confirmed candidate."""
    rows = []
    for c in confirmed:
        row = candidate_cells(c.candidate)
        if c.error is not None:
            row.update({"error": c.error, "flagged": True})
        else:
            row["simulated"] = c.simulated
            row["passes"] = c.passes
            for m in c.predicted:
                row.update({f"{m}_predicted": c.predicted[m], f"{m}_measured": c.measured[m],
                            f"{m}_err_%": c.error_pct(m)})
            row.update({"e2e_request_mape_%": c.e2e_request_mape_pct, "host_drift": c.host_drift,
                        "host_drift_err": c.host_drift_err,
                        "drift_action": c.drift_action,
                        "e2e_request_mape_drift_corrected_%": c.e2e_request_mape_corrected_pct})
            if c.drift_note:
                row["drift_note"] = c.drift_note
            if c.host_drift and c.e2e_request_mape_corrected_pct is not None:  # None: no linear correction (serving)
                for m in c.predicted:
                    row[f"{m}_err_drift_corrected_%"] = c.error_pct(m, corrected=True)
            row["flagged"] = c.flagged
            row["flagged_on"] = flag_reason(c)
        rows.append(row)
    return pd.DataFrame(rows)


def flag_reason(c: Confirmation) -> str:
    """What flagged a confirmation, for reading: ``TTFT p50 +11.8% (drift-corrected)``; "" when nothing did."""
    if not c.flagged_on:
        return ""
    said = "; ".join(f"{metric_label(m)} {fmt.signed_pct(e)}" for m, e in c.flagged_on.items())
    return said + (" (drift-corrected)" if c.judged_corrected else "")


# -- files --------------------------------------------------------------------------------------
def _write_csv(path: Path, df: pd.DataFrame) -> pd.DataFrame:
    try:
        df.to_csv(path, index=False)
    except OSError as exc:
        raise results_error(path, exc) from None
    return df


def write_confirm(run_dir: Path, confirmed: Sequence[Confirmation]) -> pd.DataFrame:
    return _write_csv(run_dir / "confirm.csv", confirm_table(confirmed))


def write_front(run_dir: Path, front: Sequence[Evaluation], space: Space,
                confirmed: Sequence[Confirmation] = ()) -> pd.DataFrame:
    return _write_csv(run_dir / "pareto.csv", front_table(front, space, confirmed))


def write_results(run_dir: Path, *, space: Space, runner, ledger: RunLedger, trials: pd.DataFrame,
                  front: Sequence[Evaluation] | None, staircase: Mapping[int, BucketProfile] | None = None,
                  nearest: Sequence[Evaluation] = (), sweep: RateSweep | None = None,
                  write_trials: bool = True) -> SearchResult:
    """Write the run's files; ``front=None``: an interrupted run (trials and run.json only).

    The front is the ledger's (``ledger.front``, ``ledger.chosen``) with its evaluations;
    ``sweep``, under continuous serving, becomes rate_sweep.csv and the report's rate plot.
    ``write_trials`` False: a confirmation run again, which reads the search's trials.csv and leaves it as it is.
    """
    try:
        return _write_results(run_dir, space=space, runner=runner, ledger=ledger, trials=trials, front=front,
                              staircase=staircase or {}, nearest=nearest, sweep=sweep, write_trials=write_trials)
    except OSError as exc:
        raise results_error(run_dir, exc) from None


def _write_results(run_dir: Path, *, space: Space, runner, ledger: RunLedger, trials: pd.DataFrame,
                   front: Sequence[Evaluation] | None, staircase: Mapping[int, BucketProfile],
                   nearest: Sequence[Evaluation], sweep: RateSweep | None, write_trials: bool) -> SearchResult:
    from .deploy import write_deploy
    from .report import write_report

    if write_trials:
        trials.to_csv(run_dir / "trials.csv", index=False)
    if front is None:
        write_ledger(run_dir, ledger)
        return SearchResult(run_dir, pd.DataFrame(), trials, None, ledger)
    table = front_table(front, space, ledger.confirmed)
    if sweep is not None:
        table = with_capacity(table, front, sweep)
    table.to_csv(run_dir / "pareto.csv", index=False)
    if ledger.chosen is not None:
        write_deploy(run_dir / "deploy", space, ledger.chosen, runner, ledger.workload)
    write_ledger(run_dir, ledger)
    confirm = confirm_table(ledger.confirmed) if ledger.confirmed else None
    if sweep is not None:
        sweep.points.to_csv(run_dir / "rate_sweep.csv", index=False)
    write_report(run_dir, space=space, front=table, trials=trials, confirm=confirm, ledger=ledger,
                 chosen=ledger.chosen, staircase=staircase, nearest=[eval_row(e, space) for e in nearest], sweep=sweep)
    return SearchResult(run_dir, table, trials, confirm, ledger, None if sweep is None else sweep.points)
