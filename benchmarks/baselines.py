"""The two baselines LENS is compared with in ``benchmarks/eval_accuracy.py``.

MaverIQ-style (per dataset, per unit): one TTFT constant and one TBT slope.
    A handful of requests of the dataset is run end to end on the device (the calibration
    runs; how many is the caller's choice and is printed), and the per-request model

        E2E_i = a + b * (l_out_i - 1)

    is fitted by ordinary least squares over those requests (``fit_maveriq``): ``a`` plays
    the TTFT constant, ``b`` the TBT slope. If the unconstrained fit gives ``a < 0`` (or
    ``b < 0``) the offending coefficient is pinned at zero and the other one refitted, so
    every prediction stays a latency. The fit sees neither input lengths nor buckets; a
    one-token request is predicted ``a``. The constant absorbs, on average, the prompt
    encoding of the whole static batch, which the request waits for before its first
    decode step.

Operator-sum (analytical): every operator of the Llama-architecture decoder is costed
    with a roofline at the device's *public* peak figures -- dense TFLOPS, HBM bandwidth,
    interconnect bandwidth (``runners.sim.devices.DEVICES``, each number cited there) --
    and the operator times are summed (``OperatorSum``). Lengths are the requests' actual,
    unpadded lengths: no buckets, no compiler effects, no host overheads. At peak figures
    it measures nothing; the fair form (``OperatorSum.calibrated``) fits one prefill and
    one decode efficiency per unit by least squares on the same probe runs LENS gets
    (times = scale x peak-figure time), then predicts from kernel shapes at the real
    lengths. Per layer and per tensor-parallel device:

    ========  =====================================  =====================================
    operator  FLOPs                                  bytes moved (x dtype bytes)
    ========  =====================================  =====================================
    norm x2   (ignored)                              2 r h each
    q,k,v     2 r h (H + 2K) d / p                   h (H + 2K) d / p + r h + r (H + 2K) d / p
    attention prefill 4 l^2 H d / p;                 prefill 2 l (H + K) d / p;
              decode  4 S H d / p                    decode  2 S K d / p + 2 r H d / p
    o         2 r H d h / p                          H d h / p + r H d / p + r h
    all-red.  --                                     2 (p - 1) / p * r h over the link
    gate,up   4 r h I / p                            2 h I / p + r h + 2 r I / p
    act       (ignored)                              3 r I / p
    down      2 r I h / p                            I h / p + r I / p + r h
    all-red.  --                                     2 (p - 1) / p * r h over the link
    ========  =====================================  =====================================

    plus the LM head once per step (2 r' h V / p FLOPs, h V / p + r' h + r' V / p bytes;
    r' = 1 for a prefill, which only needs the last position's logits). r = rows through
    the matmuls (l prompt tokens, or the n requests still generating), S = the sum of the
    attended contexts, h hidden, H heads, K kv heads, d head dim, I intermediate, V vocab,
    p = tp. Each operator costs max(FLOPs / peak, bytes / bandwidth); all-reduces cost
    their ring bytes over the link bandwidth.

    The schedule is the machine's own (prompts encoded one by one, then the batch decodes
    together), but only the requests still generating are counted at each decode step, as
    an iteration-level simulator would.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from lens.types import ModelShape, Requests
from runners.sim.devices import DTYPE_BYTES, device_spec


# -- MaverIQ-style ------------------------------------------------------------------------
@dataclass(frozen=True)
class MaverIQFit:
    """E2E = ttft_s + tbt_s * (l_out - 1), fitted on ``n`` calibration requests."""

    ttft_s: float
    tbt_s: float
    n: int

    def predict_e2e(self, output_len) -> np.ndarray:
        steps = np.maximum(np.asarray(output_len, dtype=np.float64) - 1.0, 0.0)
        return self.ttft_s + self.tbt_s * steps


def fit_maveriq(output_len, e2e_s) -> MaverIQFit:
    """Least squares of E2E = a + b * (l_out - 1) over measured requests (see the module doc)."""
    x = np.maximum(np.asarray(output_len, dtype=np.float64) - 1.0, 0.0)
    y = np.asarray(e2e_s, dtype=np.float64)
    if x.ndim != 1 or x.shape != y.shape:
        raise ValueError("output_len and e2e_s must be 1-D arrays of one length")
    if x.size == 0:
        raise ValueError("the MaverIQ-style fit needs at least one measured request")
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise ValueError("measured E2E latencies must be finite and positive")
    if x.size >= 2 and np.ptp(x) > 0:
        A = np.stack([np.ones_like(x), x], axis=1)
        (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    else:  # one distinct output length: the slope is not identifiable, keep the mean as the constant
        a, b = float(y.mean()), 0.0
    if b < 0:  # longer outputs cannot be faster: constant only
        a, b = float(y.mean()), 0.0
    if a < 0:  # no negative TTFT: a line through the origin
        a, b = 0.0, float(x @ y / (x @ x))
    return MaverIQFit(ttft_s=float(a), tbt_s=float(b), n=int(x.size))


# -- operator-sum roofline ----------------------------------------------------------------
@dataclass(frozen=True)
class Peak:
    """Public peak figures of one tensor-parallel device."""

    flops_s: float  # dense matmul FLOP/s at the dtype
    bandwidth_Bps: float  # HBM bytes/s
    link_Bps: float  # collective bytes/s per device and direction

    @classmethod
    def for_sim_device(cls, hardware: str, dtype: str) -> "Peak":
        """The spec-sheet figures the simulator starts from (``runners.sim.devices``), none of its hidden ones."""
        s = device_spec(hardware)
        e = DTYPE_BYTES[dtype]
        tflops = s.peak_tflops_8bit if e == 1 else s.peak_tflops
        return cls(flops_s=tflops * 1e12, bandwidth_Bps=s.bandwidth_gbs * 1e9, link_Bps=s.link_gbs * 1e9)


class OperatorSum:
    """Sum of per-operator rooflines at actual lengths (see the module doc).

    ``scale`` = (prefill, decode) multipliers of the peak-figure times: 1 / achieved
    efficiency. ``calibrated`` fits them to measured probe runs.
    """

    def __init__(self, model: ModelShape, peak: Peak, *, tp: int, dtype: str, scale: tuple[float, float] = (1.0, 1.0)):
        if tp < 1:
            raise ValueError(f"tp {tp} must be >= 1")
        self.m, self.peak, self.tp, self.e = model, peak, int(tp), DTYPE_BYTES[dtype]
        self.dtype, self.scale = dtype, (float(scale[0]), float(scale[1]))

    # -- calibration on the probe runs LENS gets --------------------------------------------
    def probe_parts(self, input_len: int, output_len: int, *, batch: int) -> tuple[float, float]:
        """Peak-figure seconds of one probe (``batch`` identical requests): its prefills, its decode steps."""
        pre = batch * float(self.prefill_s([input_len])[0])
        k = np.arange(1, output_len, dtype=float)
        dec = float(self.decode_step_s(np.full_like(k, batch), batch * (input_len + k)).sum())
        return pre, dec

    def calibrated(self, probes: Sequence[tuple[int, int, float]], *, batch: int) -> "OperatorSum":
        """A copy with one prefill and one decode efficiency fitted to measured probes.

        ``probes``: (input length, output length, measured seconds) of full-batch runs.
        Least squares of the relative residuals (every probe counts alike, short or long);
        a coefficient that comes out non-positive is pinned at 0 and the other refitted.
        """
        parts = np.array([self.probe_parts(l_in, l_out, batch=batch) for l_in, l_out, _ in probes], float)
        t = np.array([p[2] for p in probes], float)
        if parts.shape[0] < 2 or not np.all(t > 0):
            raise ValueError("calibration needs at least two probes with positive times")
        a = parts / t[:, None]  # rows scaled so that residuals are relative
        x, *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
        if np.any(x <= 0):
            singles = []
            for j in (0, 1):
                col = a[:, j]
                xj = float(col @ np.ones_like(t) / (col @ col)) if col @ col > 0 else 0.0
                fit = np.zeros(2)
                fit[j] = xj
                singles.append((float(np.sum((a @ fit - 1) ** 2)), fit))
            x = min(singles, key=lambda s: s[0])[1]
        return OperatorSum(self.m, self.peak, tp=self.tp, dtype=self.dtype, scale=(float(x[0]), float(x[1])))

    def _op(self, flops, nbytes) -> np.ndarray:
        return np.maximum(np.asarray(flops, float) / self.peak.flops_s, np.asarray(nbytes, float) * self.e / self.peak.bandwidth_Bps)

    def _allreduce(self, elems) -> np.ndarray:
        p = self.tp
        if p == 1:
            return np.zeros_like(np.asarray(elems, float))
        return 2.0 * (p - 1) / p * np.asarray(elems, float) * self.e / self.peak.link_Bps

    def _step(self, rows, attn_flops, attn_bytes, head_rows) -> np.ndarray:
        """Seconds of one forward pass: ``rows`` tokens through every matmul of every layer."""
        m, p = self.m, self.tp
        h, H, K, d, I, V = m.hidden, m.heads, m.kv_heads, m.head_dim, m.intermediate, m.vocab
        r = np.asarray(rows, float)
        qkv = (H + 2 * K) * d
        layer = (
            2 * self._op(0.0, 2 * r * h)  # the two RMSNorms (memory-bound)
            + self._op(2 * r * h * qkv / p, h * qkv / p + r * h + r * qkv / p)
            + self._op(attn_flops, attn_bytes)
            + self._op(2 * r * H * d * h / p, H * d * h / p + r * H * d / p + r * h)
            + self._op(4 * r * h * I / p, 2 * h * I / p + r * h + 2 * r * I / p)
            + self._op(0.0, 3 * r * I / p)  # SiLU(gate) * up
            + self._op(2 * r * I * h / p, I * h / p + r * I / p + r * h)
            + 2 * self._allreduce(r * h)
        )
        hr = np.asarray(head_rows, float)
        head = self._op(2 * hr * h * V / p, h * V / p + hr * h + hr * V / p)
        return m.layers * layer + head

    def prefill_s(self, input_len) -> np.ndarray:
        """One prompt of each length, encoded alone."""
        m, p = self.m, self.tp
        l = np.asarray(input_len, float)
        fl = 4.0 * l * l * m.heads * m.head_dim / p
        by = 2.0 * l * (m.heads + m.kv_heads) * m.head_dim / p
        return self._step(l, fl, by, np.ones_like(l))

    def decode_step_s(self, active, ctx_sum) -> np.ndarray:
        """One decode step of ``active`` requests whose contexts add up to ``ctx_sum``."""
        m, p = self.m, self.tp
        n = np.asarray(active, float)
        s = np.asarray(ctx_sum, float)
        fl = 4.0 * s * m.heads * m.head_dim / p
        by = 2.0 * s * m.kv_heads * m.head_dim / p + 2.0 * n * m.heads * m.head_dim / p
        return self._step(n, fl, by, n)

    def predict(self, requests: Requests, *, batch: int) -> tuple[np.ndarray, np.ndarray, float]:
        """Per-request TTFT and E2E and the total time of ``requests`` run in static batches of ``batch``."""
        lin, lout = requests.input_len, requests.output_len
        n = len(requests)
        ttft, e2e, total = np.empty(n), np.empty(n), 0.0
        pre_all = self.prefill_s(lin) * self.scale[0]
        for s in range(0, n, batch):
            sl = slice(s, min(s + batch, n))
            pre = np.cumsum(pre_all[sl])
            ttft[sl] = pre
            steps_i = lout[sl] - 1  # decode steps of each request
            k_max = int(steps_i.max())
            if k_max <= 0:
                e2e[sl] = pre
                total += float(pre[-1])
                continue
            # active at step k (1..k_max): requests with steps_i >= k
            cnt = np.bincount(steps_i, minlength=k_max + 1).astype(float)
            lsum = np.bincount(steps_i, weights=lin[sl].astype(float), minlength=k_max + 1)
            active = cnt[::-1].cumsum()[::-1][1:]
            lin_active = lsum[::-1].cumsum()[::-1][1:]
            k = np.arange(1, k_max + 1, dtype=float)
            dec = np.cumsum(self.decode_step_s(active, lin_active + k * active)) * self.scale[1]
            e2e[sl] = np.where(steps_i > 0, pre[-1] + dec[np.maximum(steps_i - 1, 0)], pre)
            total += float(pre[-1] + dec[-1])
        return ttft, e2e, total
