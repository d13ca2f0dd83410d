"""Composition: per-bucket TTFT_b / TBT_b -> per-request TTFT, TPOT, E2E.

All of it is numpy over (batches x rows x buckets); nothing loops over decode steps.

The machine (the same one the runners implement): requests run in order, in static
batches of the unit's batch size.  Prompts are encoded as the target's ``prefill`` says:

- ``sequential`` (NxD Inference's default, ``ctx_batch_size = 1``): one request at a time,
  each in the context-encoding bucket of its length, so request i of a batch gets its
  first token after the prefills of requests 0..i (TTFT_b is one request's prefill);
- ``batched`` (vLLM, NxD Inference with ``ctx_batch_size = batch``): one call of shape
  (batch, bucket of the batch's longest prompt), every first token at its end; a short
  last batch still runs the whole compiled shape (TTFT_b is that call).

Then the batch decodes:

- ``static`` (NxD Inference default): the whole batch is one shape; at decode step t the
  token-generation bucket is the one of the longest context among the requests still
  generating; finished requests ride along as padding until the longest output ends. The
  host's work per live row (``UnitTable.row_s``, ``lens.rows``) is not done for them: a
  step with r rows still generating costs TBT_b - (B - r) row_s. On a paged decode kernel
  (``UnitTable.kv_token_s`` > 0, ``lens.context_cost``) a step costs TBT_b less what the
  probes' rows read, plus what the batch's requests read at their own contexts (a finished
  one's riding along too).
- ``ragged`` (TPU ragged paged attention): each request walks its own buckets and pays
  TBT_b / B per step, summed over the requests still generating.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .admission import unit_admission
from .buckets import bucket_ranges, select_index, validate_buckets
from .context_cost import host_row_s, reference_context, unit_context_cost, unread_tbt_s
from .errors import MissingProfiles, UserError
from .decode_pace import unit_pace
from .prefill_tail import unit_tail
from .resume import unit_by_idle, unit_by_pass, unit_resume
from .rows import unit_row_s
from .types import BATCHING, PREFILLS, BucketProfile, Candidate, Requests



@dataclass(frozen=True, eq=False)
class UnitTable:
    """The per-bucket numbers of one candidate, as arrays aligned with its bucket sets."""

    batch: int
    policy: str
    ctx_buckets: np.ndarray
    ttft_s: np.ndarray
    tkg_buckets: np.ndarray
    tbt_s: np.ndarray
    #: integer context ranges [lo, hi] of each token-generation bucket under the policy
    tkg_lo: np.ndarray
    tkg_hi: np.ndarray
    sources: tuple[str, ...] = ()
    #: how the profiles' TTFT_b was measured and how prompts are composed (``Target.prefill``)
    prefill: str = PREFILLS[0]
    #: the +- of each value (one standard error from the profile's repeats; zeros when unknown)
    ttft_err_s: np.ndarray | None = None
    tbt_err_s: np.ndarray | None = None
    #: host seconds per live row per decode step, counted in TBT_b for a full batch (``lens.rows``): a step
    #: with r rows still generating costs TBT_b - (batch - r) row_s
    row_s: float = 0.0
    #: served admissions against TTFT_b (``lens.admission``): seconds added to the first prompt of a scheduler pass
    #: that finds the device idle, and to each further one in the pass (continuous serving only)
    admit_first_s: float = 0.0
    admit_next_s: float = 0.0
    #: seconds per KV token a decode step reads (``lens.context_cost``; static and continuous), the probes' mean
    #: row context behind each TBT_b, and the mean context of the row cost's measured row
    kv_token_s: float = 0.0
    tkg_ref: np.ndarray | None = None
    row_context: float = 0.0
    #: seconds the first decode run after a served admission pass costs beyond its steps (``lens.resume``;
    #: continuous serving only)
    resume_s: float = 0.0
    #: seconds added to the first prompt of a served pass that stops a running decode (``lens.admission``:
    #: ``admit_first_s`` is a pass's that finds the device idle; continuous serving only)
    admit_busy_s: float = 0.0
    #: (idle seconds before a pass, what the first decode run after it costs) at each idle spell measured
    #: (``lens.resume``; empty: ``resume_s`` after any pass)
    resume_idle: tuple[tuple[float, float], ...] = ()
    #: (a pass's seconds, what the first decode run after it costs) for a pass that stops a running decode, per
    #: prefill size measured (``lens.busy_resume``; empty: ``resume_idle``'s shortest spell prices it)
    resume_busy: tuple[tuple[float, float], ...] = ()
    #: a lone served prompt's TTFT about its median, at evenly spaced quantile levels (``lens.prefill_tail``;
    #: empty: every prompt takes the time composed); continuous serving reads its percentiles over it
    prefill_tail: tuple[float, ...] = ()
    #: the median the tail lies about (``lens.prefill_tail``; 0: the tail in seconds, whatever the prompt)
    prefill_tail_median_s: float = 0.0
    #: a lone served decode's seconds over its call's mean, less one, at evenly spaced quantile levels, the window
    #: each one averages the pace over, and how fast the pace forgets (``lens.decode_pace``; empty: every decode
    #: step at its composed time)
    decode_pace: tuple[float, ...] = ()
    decode_pace_window_s: float = 0.0
    decode_pace_tau_s: float = 0.0

    @classmethod
    def build(
        cls, candidate: Candidate, profiles: Mapping[int, BucketProfile], *, policy: str,
        prefill: str = PREFILLS[0],
    ) -> "UnitTable":
        if prefill not in PREFILLS:
            raise UserError(f"prefill = {prefill!r} is unknown: use one of {', '.join(PREFILLS)}")
        ctx = validate_buckets(candidate.ctx_buckets, what="context-encoding buckets")
        tkg = validate_buckets(candidate.tkg_buckets, what="token-generation buckets")
        missing = sorted(set(b for b in ctx + tkg if b not in profiles))
        if missing:
            raise MissingProfiles(
                f"no profile for bucket(s) {missing} of tp={candidate.tp} batch={candidate.batch}",
                missing={(candidate.tp, candidate.batch): missing},
            )
        lo, hi = bucket_ranges(tkg, policy)
        used = [profiles[b] for b in sorted(set(ctx + tkg))]
        admit = unit_admission([profiles[b] for b in ctx])
        tail = unit_tail([profiles[b] for b in ctx])
        pace = unit_pace([profiles[b] for b in tkg])
        kv, row_context = unit_context_cost([profiles[b] for b in tkg])
        return cls(
            batch=candidate.batch,
            policy=policy,
            ctx_buckets=np.asarray(ctx, dtype=np.int64),
            ttft_s=np.asarray([profiles[b].ttft_s for b in ctx], dtype=np.float64),
            tkg_buckets=np.asarray(tkg, dtype=np.int64),
            tbt_s=np.asarray([max(profiles[b].tbt_s, 0.0) for b in tkg], dtype=np.float64),
            tkg_lo=lo,
            tkg_hi=hi,
            sources=tuple(sorted({p.source for p in used})),
            prefill=prefill,
            ttft_err_s=np.asarray([profiles[b].ttft_err_s for b in ctx], dtype=np.float64),
            tbt_err_s=np.asarray([profiles[b].tbt_err_s for b in tkg], dtype=np.float64),
            row_s=unit_row_s([profiles[b] for b in tkg]),
            admit_first_s=admit[0],
            admit_next_s=admit[1],
            kv_token_s=kv,
            tkg_ref=np.asarray([reference_context(profiles[b]) for b in tkg], dtype=np.float64),
            row_context=row_context,
            resume_s=unit_resume([profiles[b] for b in tkg]),
            admit_busy_s=admit[2],
            resume_idle=unit_by_idle([profiles[b] for b in tkg]),
            resume_busy=unit_by_pass([profiles[b] for b in tkg]),
            prefill_tail=tail[0],
            prefill_tail_median_s=tail[1],
            decode_pace=pace[0],
            decode_pace_window_s=pace[1],
            decode_pace_tau_s=pace[2],
        )

    def shifted(self, sigmas: float) -> "UnitTable":
        """The table with every value moved by ``sigmas`` of its +- (all buckets together), floored at 0."""
        z = lambda a, n: np.zeros(n) if a is None else a  # noqa: E731
        return dataclasses.replace(
            self, ttft_s=np.maximum(self.ttft_s + sigmas * z(self.ttft_err_s, len(self.ttft_s)), 0.0),
            tbt_s=np.maximum(self.tbt_s + sigmas * z(self.tbt_err_s, len(self.tbt_s)), 0.0))

    def slowed(self, factor: float) -> "UnitTable":
        """The table on a host ``factor`` times slower (1.1: 10% slower; ``lens.drift.round_speeds``): every
        device and host second scaled, idle spells and the relative wanders (tail shape, decode pace) as they are."""
        f = float(factor)
        if not np.isfinite(f) or f <= 0:
            raise ValueError(f"a host speed factor is a positive number, not {factor!r}")
        sc = lambda a: None if a is None else a * f  # noqa: E731
        return dataclasses.replace(
            self, ttft_s=self.ttft_s * f, tbt_s=self.tbt_s * f, ttft_err_s=sc(self.ttft_err_s),
            tbt_err_s=sc(self.tbt_err_s), row_s=self.row_s * f, admit_first_s=self.admit_first_s * f,
            admit_next_s=self.admit_next_s * f, admit_busy_s=self.admit_busy_s * f, kv_token_s=self.kv_token_s * f,
            resume_s=self.resume_s * f, resume_idle=tuple((idle, cost * f) for idle, cost in self.resume_idle),
            resume_busy=tuple((took * f, cost * f) for took, cost in self.resume_busy),
            prefill_tail=tuple(x * f for x in self.prefill_tail),
            prefill_tail_median_s=self.prefill_tail_median_s * f)

    def decode_costs(self) -> tuple[float, np.ndarray, float]:
        """What a decode step is composed from: (kv, per-bucket step seconds, host seconds per free row).

        On a paged kernel (``kv_token_s`` > 0, ``lens.context_cost``) a step is TBT_b less the probes'
        reads, plus ``kv`` per context token each row holds, less the host's part of the row cost per
        free row; otherwise (kv 0) TBT_b less ``row_s`` per free row.
        """
        kv = self.kv_token_s if self.tkg_ref is not None else 0.0
        if kv > 0.0:
            return kv, unread_tbt_s(self.tbt_s, self.tkg_ref, self.batch, kv), \
                host_row_s(self.row_s, kv, self.row_context)
        return 0.0, self.tbt_s, self.row_s

    def cum(self, x: np.ndarray, values: np.ndarray | None = None) -> np.ndarray:
        """Sum of ``values`` (default TBT_b) over the integer contexts 1..x, elementwise."""
        v = self.tbt_s if values is None else values
        x = np.asarray(x, dtype=np.int64)[..., None]
        n = np.clip(x - self.tkg_lo + 1, 0, self.tkg_hi - self.tkg_lo + 1)
        return n @ v.astype(np.float64)


@dataclass(frozen=True, eq=False)
class Prediction:
    """Per-request latencies and per-batch times of one workload on one candidate."""

    ttft_s: np.ndarray
    tpot_s: np.ndarray  # NaN for one-token requests (no decode step)
    e2e_s: np.ndarray
    batch_s: np.ndarray
    prefill_padding: float
    decode_padding: float
    mode: str
    #: the same workload predicted from the profiles at -1 and +1 standard error (see ``predict``)
    low: "Prediction | None" = None
    high: "Prediction | None" = None

    @property
    def total_s(self) -> float:
        return float(self.batch_s.sum())


def check_fit(req: Requests, table: UnitTable) -> None:
    """``UserError`` naming the first request whose prompt or last context fits no bucket of ``table``."""
    lin, lout = req.input_len, req.output_len
    bad = np.flatnonzero((lin < 1) | (lout < 1))
    if bad.size:
        i = int(bad[0])
        raise UserError(f"request {i}: input {lin[i]} / output {lout[i]} tokens; both must be >= 1")
    longest_ctx = int(table.ctx_buckets[-1])
    bad = np.flatnonzero(select_index(lin, table.ctx_buckets, table.policy) < 0)
    if bad.size:
        i = int(bad[0])
        raise UserError(
            f"request {i}: input of {lin[i]} tokens fits no context bucket (largest {longest_ctx}); "
            f"add a larger bucket or drop the request"
        )
    last = lin + lout - 1
    bad = np.flatnonzero((lout > 1) & (last > table.tkg_hi[-1]))
    if bad.size:
        i = int(bad[0])
        raise UserError(
            f"request {i}: {lin[i]} + {lout[i]} tokens exceed the largest token-generation bucket "
            f"{int(table.tkg_buckets[-1])}; add a larger bucket or shorten the request"
        )


def predict(table: UnitTable, requests: Requests, *, mode: str = "static", interval: bool = False) -> Prediction:
    """Predict every request of ``requests`` run in order, in batches of ``table.batch``.

    ``interval``: also predict it from the profiles one standard error below and above
    (``Prediction.low``/``high``). Every bucket moves together, so the band is that of an
    error shared by the buckets -- a host slower or faster than it measured -- and it is
    wider than independent per-bucket errors would give: a cautious interval.
    """
    pred = _predict(table, requests, mode=mode)
    if not interval:
        return pred
    return dataclasses.replace(pred, low=_predict(table.shifted(-1.0), requests, mode=mode),
                               high=_predict(table.shifted(1.0), requests, mode=mode))


def _predict(table: UnitTable, requests: Requests, *, mode: str) -> Prediction:
    if mode not in BATCHING:
        raise UserError(f"batching mode {mode!r} is unknown: use one of {', '.join(BATCHING)}")
    n = len(requests)
    if n == 0:
        raise UserError("the workload has no requests")
    check_fit(requests, table)
    B = table.batch
    nb = -(-n // B)
    pad = nb * B - n
    lin = np.concatenate([requests.input_len, np.zeros(pad, np.int64)]).reshape(nb, B)
    lout = np.concatenate([requests.output_len, np.ones(pad, np.int64)]).reshape(nb, B)
    real = np.concatenate([np.ones(n, bool), np.zeros(pad, bool)]).reshape(nb, B)

    ci = select_index(np.maximum(lin, 1), table.ctx_buckets, table.policy)
    if table.prefill == "sequential":
        pre = np.where(real, table.ttft_s[ci], 0.0)
        ttft = np.cumsum(pre, axis=1)
        prefill_total = ttft[:, -1]
        slots_pre = table.ctx_buckets[ci][real].sum()
    else:
        # one call per batch in the bucket of its longest prompt (selection is monotone in the
        # length, so that is the largest bucket index); the padding rows run in it too
        call = ci.max(axis=1)
        prefill_total = table.ttft_s[call]
        ttft = np.broadcast_to(prefill_total[:, None], lin.shape)
        slots_pre = table.ctx_buckets[call].sum() * B

    if mode == "static":
        dec, dec_slots = _static_decode(table, lin, lout)
    else:
        dec, dec_slots = _ragged_decode(table, lin, lout, real)
    # a one-token request is done at its own first token; the others after the batch's
    # prefills and their decode steps
    e2e = np.where(lout > 1, prefill_total[:, None] + dec, ttft)
    batch_s = prefill_total + dec.max(axis=1)

    steps = np.maximum(lout - 1, 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(steps > 0, (e2e - ttft) / steps, np.nan)

    used_pre = lin[real].sum()
    useful_dec = (steps * lin + steps * (steps + 1) // 2)[real].sum()
    return Prediction(
        ttft_s=ttft[real],
        tpot_s=tpot[real],
        e2e_s=e2e[real],
        batch_s=batch_s,
        prefill_padding=float(1 - used_pre / slots_pre) if slots_pre else 0.0,
        decode_padding=float(1 - useful_dec / dec_slots) if dec_slots else 0.0,
        mode=mode,
    )


def _static_decode(table: UnitTable, lin: np.ndarray, lout: np.ndarray) -> tuple[np.ndarray, float]:
    """Decode time from the batch start of decoding to each row's last token (static batch).

    Rows sorted by output length: between the (j-1)-th and j-th shortest outputs the
    requests still generating are rows j.., so the longest of their contexts is
    M_j + t with M_j the suffix maximum of their prompt lengths.
    """
    order = np.argsort(lout, axis=1, kind="stable")
    o = np.take_along_axis(lout, order, axis=1)
    own = np.take_along_axis(lin, order, axis=1)
    m = np.maximum.accumulate(own[:, ::-1], axis=1)[:, ::-1]  # suffix max
    prev = np.concatenate([np.ones((o.shape[0], 1), np.int64), o[:, :-1]], axis=1)
    kv, step_s, row_s = table.decode_costs()
    # segment j covers steps t in (prev_j - 1, o_j - 1]: contexts (M_j + prev_j - 1, M_j + o_j - 1]
    seg = table.cum(m + o - 1, step_s) - table.cum(m + prev - 1, step_s)
    if row_s > 0.0:  # segment j has the j rows of shorter output (padding included) no longer live
        seg = seg - row_s * np.arange(o.shape[1]) * (o - prev)
    sorted_dec = np.cumsum(seg, axis=1)
    if kv > 0.0:
        # finished rows ride along, their context growing as padding: by row j's last step s = o_j - 1 every
        # request's row has read l + 1 .. l + s (the short last batch's padding rows hold no context)
        s = o - 1
        sorted_dec = sorted_dec + kv * (s * own.sum(axis=1, keepdims=True)
                                        + (own > 0).sum(axis=1, keepdims=True) * s * (s + 1) // 2)
    slots = table.cum(m + o - 1, table.tkg_buckets) - table.cum(m + prev - 1, table.tkg_buckets)
    dec = np.empty_like(sorted_dec)
    np.put_along_axis(dec, order, sorted_dec, axis=1)
    return dec, float(slots.sum() * table.batch)


def _ragged_decode(
    table: UnitTable, lin: np.ndarray, lout: np.ndarray, real: np.ndarray
) -> tuple[np.ndarray, float]:
    """Ragged batch: E2E_i = sum_j [C(l_j + min(o_i, o_j) - 1) - C(l_j)] / B over requests j."""
    B = table.batch
    base = table.cum(lin)  # (nb, B)
    steps_ij = np.minimum(lout[:, :, None], lout[:, None, :]) - 1  # (nb, i, j)
    reach = lin[:, None, :] + steps_ij
    cost = (table.cum(reach) - base[:, None, :]) * real[:, None, :]
    dec = cost.sum(axis=2) / B
    own = (table.cum(lin + lout - 1, table.tkg_buckets) - table.cum(lin, table.tkg_buckets)) * real
    return dec, float(own.sum())
