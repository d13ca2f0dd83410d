"""The simulated fleet of ``eval_accuracy.py``: devices, models, device variants, and its cases.

A *case* is (variant, fleet, device, model, batch, workload): LENS, the baselines and the
ground truth on one unit for one workload. A *variant* is the fleet with some effects of
the simulated stacks switched (``runners.sim.options``): the shipped device, a noise-free
one, a clean one, one effect alone on a clean device, one effect alone switched off, or
the shipped device whose targets say ``prefill = "batched"`` (the device runs it and LENS
composes it; "LENS-seq" is LENS's sequential machine model on the same probe runs, what
it predicted before it knew the setting). Everything measured here is SIMULATED (runner
``sim``).

Two readings of the MaverIQ-style baseline (``E2E = a + b (l_out - 1)``) are fitted on the
same calibration runs: "MaverIQ" per unit (device, model, tp, batch) and workload, and
"MaverIQ-pd" per (device, model) and workload, pooled over every batch size -- the LENS
paper's "one TTFT constant + one TBT slope fitted per dataset".
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from benchmarks.baselines import OperatorSum, Peak, fit_maveriq
from lens import distributions
from lens.compose import UnitTable, predict
from lens.types import PREFILLS, Candidate, ModelShape, Requests, Target
from lens.workload import fit_to
from runners import get_runner
from runners.sim import EFFECTS, SimOptions, fits_memory
from runners.sim.options import clean
from search.profiler import measure_unit
from spaces import ProfileSettings

DEVICES = ("inf2", "trn1", "tpu-v5e", "tpu-v6e")
POLICY = {"inf2": "exclusive", "trn1": "exclusive", "tpu-v5e": "inclusive", "tpu-v6e": "inclusive"}
MODELS = {
    "llama3.2-1b": ModelShape(layers=16, hidden=2048, heads=32, kv_heads=8, intermediate=8192, vocab=128256),
    "mistral-7b": ModelShape(layers=32, hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=32000),
    "qwen3-14b": ModelShape(layers=40, hidden=5120, heads=40, kv_heads=8, intermediate=17408, vocab=151936),
}
DATASETS = ("sharegpt", "cnn_dailymail", "arxiv", "writing_prompts")
#: trace-derived workloads (lens.distributions.TRACE_NAMES), requests over 8192 tokens dropped
TRACES = tuple(distributions.TRACE_NAMES)
BATCHES = (1, 2, 4, 8, 16, 32)
BUCKETS = (128, 256, 512, 1024, 2048, 4096, 8192)
DTYPE = "bfloat16"
#: profiling as a space file leaves it by default
SETTINGS = ProfileSettings()
EVAL_SEED, CAL_SEED = 1, 2
#: the methods of the headline tables; "OpSum" is the calibrated (fair) operator sum
METHODS = ("LENS", "MaverIQ", "OpSum")


@dataclass(frozen=True)
class Variant:
    """The fleet with some options of the simulated stacks changed."""

    name: str
    options: tuple[tuple[str, object], ...]
    what: str
    prefill: str = PREFILLS[0]  # the targets' [target] prefill: the device runs it, LENS composes it


def _only(effect: str) -> dict:
    return {**clean(), **({"noise": SimOptions().noise} if effect == "noise" else {effect: True})}


def _without(effect: str) -> dict:
    return {"noise": 0.0} if effect == "noise" else {effect: False}


def variants(kinds: tuple[str, ...]) -> list[Variant]:
    """The device variants of ``kinds`` ("main", "only", "without", "extra"), in table order."""
    out: list[Variant] = []
    if "main" in kinds:
        out.append(Variant("default", (), "every effect on: the fleet as shipped"))
    if "extra" in kinds:
        out.append(Variant("noise-free", (("noise", 0.0), ("stragglers", False), ("drift", False)),
                           "noise, stragglers and drift off: the modelled effects alone"))
        out.append(Variant("clean", tuple(clean().items()),
                           "noise and every effect off: the padded-bucket machine (compiler quirks kept)"))
    for effect in (*EFFECTS, "noise"):
        if "only" in kinds:
            out.append(Variant(f"only {effect}", tuple(_only(effect).items()), f"clean device plus {effect} alone"))
    for effect in (*EFFECTS, "noise"):
        if "without" in kinds:
            out.append(Variant(f"without {effect}", tuple(_without(effect).items()),
                               f"shipped device with {effect} alone switched off"))
    if "extra" in kinds and "without" not in kinds:  # LENS with and without stragglers, always
        out.append(Variant("without stragglers", tuple(_without("stragglers").items()),
                           "shipped device with stragglers alone switched off"))
    if "extra" in kinds:
        out.append(Variant("batched prefill", (),
                           "shipped device whose stack encodes a batch's prompts in one call; the target says "
                           "prefill = \"batched\", so LENS solves and composes it", prefill="batched"))
    return out


def sim_target(device: str, model: str, *, quirk_seed: int = 0, seed: int = 0, options=(),
               prefill: str = PREFILLS[0]) -> Target:
    opts = {"quirk_seed": quirk_seed, **dict(options)}
    return Target(
        name=f"sim-{device}-{model}", runner="sim", hardware=device, bucket_policy=POLICY[device], dtype=DTYPE,
        model=MODELS[model], options=tuple(sorted(opts.items())), seed=seed, prefill=prefill,
    )


def pick_tp(device: str, model: ModelShape, max_batch: int) -> int | None:
    """Smallest tp that divides the heads and fits weights + a max_batch x 8192 KV cache."""
    for tp in (1, 2, 4, 8):
        if model.heads % tp or model.kv_heads % tp:
            continue
        if fits_memory(device, model, DTYPE, tp, max_batch, BUCKETS[-1]):
            return tp
    return None


def workload(name: str, n: int, seed: int) -> Requests:
    """``n`` requests of a built-in workload that fit the 8192-token bucket set."""
    req = distributions.sample(name, n, seed=seed)
    if distributions.max_total(name) > BUCKETS[-1]:  # trace-derived tables may hold longer requests
        req, _ = fit_to(distributions.sample(name, 4 * n, seed=seed), BUCKETS[-1])
        if len(req) < n:
            raise RuntimeError(f"{name}: fewer than {n} of {4 * n} sampled requests fit {BUCKETS[-1]} tokens")
        req = req.head(n)
    return req


def case_errors(pred: np.ndarray, meas: np.ndarray) -> dict:
    rel = (np.asarray(pred) - meas) / meas
    return {"mape_%": float(np.abs(rel).mean() * 100), "bias_%": float(rel.mean() * 100),
            "mean_e2e_err_%": float((np.mean(pred) - meas.mean()) / meas.mean() * 100)}


def calibrated_opsum(opsum: OperatorSum, profiles: dict, *, batch: int) -> OperatorSum:
    """The operator sum with its two efficiencies fitted on LENS's own probe runs (their medians)."""
    probes = [(p.input_len, L, t) for p in profiles.values() for L, t in ((p.l1, p.t1_s), (p.l2, p.t2_s))]
    return opsum.calibrated(probes, batch=batch)


@dataclass
class Grid:
    """What to run: the sizes of one pass over the fleet."""

    batches: tuple[int, ...]
    datasets: tuple[str, ...]
    requests: int
    cal_batches: int
    baselines: bool  # MaverIQ-style calibrations too (LENS and the operator sums are always run)


def run_variant(variant: Variant, grid: Grid, rep: int, log) -> tuple[pd.DataFrame, dict]:
    """Every case of one variant on fleet ``rep`` (quirk_seed = target seed = rep)."""
    rows, cost = [], {"LENS": 0.0, "MaverIQ": 0.0}
    for device in DEVICES:
        for mname, model in MODELS.items():
            tp = pick_tp(device, model, max(grid.batches))
            if tp is None:
                log(f"  {device} {mname}: no tp in 1/2/4/8 fits batch {max(grid.batches)} at 8192 tokens; skipped")
                continue
            target = sim_target(device, mname, quirk_seed=rep, seed=rep, options=variant.options,
                                prefill=variant.prefill)
            runner = get_runner(target)  # one host session: compile cache and clock carry across its units
            peak_op = OperatorSum(model, Peak.for_sim_device(device, DTYPE), tp=tp, dtype=DTYPE)
            t0 = time.perf_counter()
            pooled: dict[str, list] = {}  # workload -> per batch (case row base, calibration, held-out)
            for batch in grid.batches:
                rows_u, cost_u, cal_u = _unit_cases(runner, target, variant, grid, rep, device, mname, tp, batch,
                                                    peak_op)
                rows += rows_u
                for ds, c in cal_u.items():
                    pooled.setdefault(ds, []).append(c)
                for k in cost:
                    cost[k] += cost_u[k]
            rows += _maveriq_per_dataset(pooled)
            log(f"  {variant.name:>22s} fleet {rep} {device:8s} {mname:12s} tp{tp}: "
                f"{time.perf_counter() - t0:.1f} s")
    return pd.DataFrame(rows), cost


def _sequential_table(cand: Candidate, profiles: dict, policy: str) -> UnitTable:
    """LENS's sequential machine model on the same probe runs: the probe's one prefill call read as
    ``batch`` prefills (TTFT_b / batch), prompts composed one at a time -- what LENS predicted on a
    batched device before its targets could say so."""
    seq = {b: replace(p, ttft_s=p.ttft_s / cand.batch, ttft_err_s=p.ttft_err_s / cand.batch)
           for b, p in profiles.items()}
    return UnitTable.build(cand, seq, policy=policy, prefill="sequential")


def _unit_cases(runner, target, variant, grid, rep, device, mname, tp, batch, peak_op):
    mu = measure_unit(target, tp=tp, batch=batch, buckets=BUCKETS, all_buckets=BUCKETS, profile=SETTINGS,
                      runner=runner)
    cost = {"LENS": mu.hardware_s, "MaverIQ": mu.compile_s}  # both compile the unit once
    cand = Candidate(tp, batch, BUCKETS, BUCKETS)
    table = UnitTable.build(cand, mu.profiles, policy=target.bucket_policy, prefill=target.prefill)
    seq_table = _sequential_table(cand, mu.profiles, target.bucket_policy) if target.prefill == "batched" else None
    cal_op = calibrated_opsum(peak_op, mu.profiles, batch=batch)
    rows, pooled = [], {}
    for ds in grid.datasets:
        req = workload(ds, grid.requests, EVAL_SEED + 10 * rep)
        meas = runner.run_workload(cand, req).e2e_s
        preds = {
            "LENS": predict(table, req, mode="static").e2e_s,
            "OpSum": cal_op.predict(req, batch=batch)[1],
            "OpSum-peak": peak_op.predict(req, batch=batch)[1],
        }
        if seq_table is not None:
            preds["LENS-seq"] = predict(seq_table, req, mode="static").e2e_s
        base = {"runner": "sim", "simulated": True, "variant": variant.name, "rep": rep, "device": device,
                "model": mname, "tp": tp, "batch": batch, "dataset": ds, "trace": ds not in DATASETS,
                "requests": len(req), "opsum_prefill_scale": cal_op.scale[0], "opsum_decode_scale": cal_op.scale[1]}
        if grid.baselines:
            cal = workload(ds, grid.cal_batches * batch, CAL_SEED + 10 * rep)
            cal_run = runner.run_workload(cand, cal)
            cost["MaverIQ"] += cal_run.run_s
            preds["MaverIQ"] = fit_maveriq(cal.output_len, cal_run.e2e_s).predict_e2e(req.output_len)
            small = cal.head(2 * batch)  # the same fit on "a handful" of runs: the first two batches
            preds["MaverIQ-2"] = fit_maveriq(small.output_len, cal_run.e2e_s[: len(small)]).predict_e2e(req.output_len)
            pooled[ds] = (base, (cal.output_len, cal_run.e2e_s), (req.output_len, meas))
        rows += [{**base, "method": m, **case_errors(p, meas)} for m, p in preds.items()]
    return rows, cost, pooled


def _maveriq_per_dataset(pooled: dict[str, list]) -> list[dict]:
    """MaverIQ-style read as the LENS paper describes it: one constant and one slope per workload
    (here per simulated device and model too), fitted on the calibration runs of every batch size
    together and used for every batch size."""
    rows = []
    for cases in pooled.values():
        fit = fit_maveriq(np.concatenate([c[1][0] for c in cases]), np.concatenate([c[1][1] for c in cases]))
        for base, _, (out_len, meas) in cases:
            rows.append({**base, "method": "MaverIQ-pd", **case_errors(fit.predict_e2e(out_len), meas)})
    return rows
