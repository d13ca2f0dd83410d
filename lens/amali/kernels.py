"""The kernels of one prefill step and one decode step of a Llama-architecture model.

Each kernel is a frozen value that says *what* runs (its shape); ``model.py`` says how
long it takes on a GPU. One entry stands for ``count`` identical launches (e.g. the QKV
projection of every layer), so a step's list stays short and readable.

Per layer, on one GPU of a tensor-parallel group of ``tp`` (Megatron sharding: heads,
KV heads and the MLP's intermediate dimension split across GPUs; KV heads replicated
when there are fewer of them than GPUs):

    rmsnorm_attn   RMSNorm of the layer input                      element-wise (row reduction)
    qkv_proj       [tokens, hidden] x [hidden, (heads + 2 kv) d]    GEMM (GEMV-like when tokens are few)
    rope           rotary embedding of Q and K                      element-wise
    attn_score     Q K^T per KV head (the query group folded in M)  batched GEMM      } eager
    attn_softmax   causal softmax over each score row               element-wise      } attention,
    attn_value     P V per KV head                                  batched GEMM      } as in the paper
    (attention     one fused FlashAttention-style kernel instead, with attention="fused")
    o_proj         [tokens, heads d] x [heads d, hidden]            GEMM
    allreduce_attn all-reduce of the attention output (tp > 1)      NVLink / PCIe collective
    residual_attn  residual add                                     element-wise
    rmsnorm_mlp    RMSNorm before the MLP                           element-wise (row reduction)
    gate_up_proj   [tokens, hidden] x [hidden, 2 intermediate]      GEMM
    silu_mul       SiLU(gate) * up                                  element-wise
    down_proj      [tokens, intermediate] x [intermediate, hidden]  GEMM
    allreduce_mlp  all-reduce of the MLP output (tp > 1)            collective
    residual_mlp   residual add                                     element-wise
then once per step: final_norm (every token) and lm_head (only the rows whose next token
is sampled: the last prompt token in prefill, every sequence in decode; the vocabulary is
split across the tp GPUs and the logits gather is not modelled).

Prefill is one request of ``tokens`` (padded) tokens: attention is causal over them; the
eager kernels compute the full square score matrix and mask it in the softmax, as eager
frameworks do, while the fused kernel skips the masked half.
Decode is one step of ``batch`` sequences, each one new token against a KV context of
``context`` tokens (the bucket: every sequence is padded to it).

``dtype`` is the element type of every GEMM operand (weights, activations and, for the
attention products, the KV cache); element-wise kernels and all-reduces work on 16-bit
activations (32-bit for an fp32 model).

Not modelled: the embedding gather, the KV-cache write, sampling, and host-side gaps
between kernels (a CUDA-graph-like launch stream is assumed).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ..errors import UserError
from ..types import ModelShape
from .specs import DTYPE_BYTES, canonical_dtype

#: element size of activations for element-wise kernels (bf16 also under fp8 weights)
ACT_BYTES = 2


def act_bytes(dtype: str) -> int:
    """Bytes of an activation element: 4 for fp32 models, else 2 (bf16/fp16, and fp8 weights)."""
    return 4 if canonical_dtype(dtype) == "fp32" else ACT_BYTES
ATTENTION_MODES = ("eager", "fused")
PHASES = ("prefill", "decode")


@dataclass(frozen=True)
class Gemm:
    """C[batch, m, n] = A[batch, m, k] @ B[batch, k, n] on tensor cores."""

    name: str
    phase: str
    m: int
    n: int
    k: int
    batch: int = 1
    dtype: str = "bf16"
    count: int = 1
    kind: str = "gemm"  # "gemm" (a weight matrix) or "attention" (score / value products)

    @property
    def op(self) -> str:
        return "gemv" if self.m < 16 else "gemm"

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    def shape(self) -> str:
        b = f"{self.batch}x " if self.batch > 1 else ""
        return f"{b}M={self.m} N={self.n} K={self.k}"


@dataclass(frozen=True)
class RowOp:
    """A memory-bound element-wise kernel, one CTA per row of ``row_len`` elements.

    ``op`` is one of ``ROW_OPS``; ``extra_row_bytes`` are bytes read per row besides the
    row itself (RoPE's cos/sin of that position), ``vector_len`` a length-``row_len``
    vector every row reads (RMSNorm's weight: DRAM once, then L2 hits).
    """

    name: str
    phase: str
    op: str
    rows: int
    row_len: int
    count: int = 1
    kind: str = "elementwise"  # "attention" for the softmax of eager attention
    extra_row_bytes: int = 0
    vector_len: int = 0
    elem_bytes: int = ACT_BYTES
    #: heads per row for RoPE (for the validation's tensor layout), else 0
    heads: int = 0

    @property
    def flops(self) -> float:
        return float(self.rows * self.row_len * ROW_OPS[self.op].fp32_ops)

    def shape(self) -> str:
        return f"rows={self.rows} len={self.row_len}"


@dataclass(frozen=True)
class RowOpKind:
    """Per-element cost of a row op: streams read/written and instructions per element."""

    inputs: int  # row-length input streams (silu_mul reads gate and up: 2)
    outputs: int
    fp32_ops: int  # FP32-pipe instructions per output element (conversions included)
    sfu_ops: int  # special-function (MUFU) instructions per output element
    reductions: int  # block-wide reductions per row (RMSNorm: sum of squares; softmax: max, sum)


ROW_OPS: dict[str, RowOpKind] = {
    # x * rsqrt(mean(x^2) + eps) * w: cvt x, fma x^2, mul rstd, cvt w, mul w, cvt out
    "rmsnorm": RowOpKind(inputs=1, outputs=1, fp32_ops=6, sfu_ops=0, reductions=1),
    # a + b: cvt a, cvt b, add, cvt out
    "add": RowOpKind(inputs=2, outputs=1, fp32_ops=4, sfu_ops=0, reductions=0),
    # silu(g) * u = g / (1 + exp(-g)) * u: cvt g, cvt u, mul, add, mul, mul, cvt; exp and rcp on MUFU
    "silu_mul": RowOpKind(inputs=2, outputs=1, fp32_ops=7, sfu_ops=2, reductions=0),
    # rotate-half: cvt, x1*cos - x2*sin (mul + fma), cvt
    "rope": RowOpKind(inputs=1, outputs=1, fp32_ops=4, sfu_ops=0, reductions=0),
    # exp(x - max) / sum: cvt, max, sub, add, mul, cvt; exp on MUFU
    "softmax": RowOpKind(inputs=1, outputs=1, fp32_ops=6, sfu_ops=1, reductions=2),
}


@dataclass(frozen=True)
class FusedAttention:
    """One FlashAttention-style kernel: QK^T, online softmax and PV without the score matrix."""

    name: str
    phase: str
    batch: int
    heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    causal: bool
    dtype: str = "bf16"
    count: int = 1
    kind: str = "attention"
    op: str = "flash"

    @property
    def kv_eff(self) -> float:
        """Average keys each query attends to (causal prefill: about half)."""
        if not self.causal:
            return float(self.kv_len)
        past = self.kv_len - self.q_len
        return past + (self.q_len + 1) / 2.0

    @property
    def flops(self) -> float:
        return 4.0 * self.batch * self.heads * self.q_len * self.kv_eff * self.head_dim

    def shape(self) -> str:
        return f"B={self.batch} H={self.heads}/{self.kv_heads} q={self.q_len} kv={self.kv_len} d={self.head_dim}"


@dataclass(frozen=True)
class AllReduce:
    """A tensor-parallel all-reduce of ``nbytes`` per GPU over the GPU's link."""

    name: str
    phase: str
    nbytes: int
    tp: int
    count: int = 1
    kind: str = "comm"
    op: str = "allreduce"
    flops: float = 0.0

    def shape(self) -> str:
        return f"{self.nbytes / 2**20:.2f} MiB tp={self.tp}"


Kernel = Union[Gemm, RowOp, FusedAttention, AllReduce]


@dataclass(frozen=True)
class Shard:
    """The per-GPU slice of a model under tensor parallelism ``tp``."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    layers: int

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


def shard(model: ModelShape, tp: int) -> Shard:
    """Split ``model`` over ``tp`` GPUs; ``UserError`` when it does not divide."""
    if tp < 1:
        raise UserError(f"tp={tp} must be a positive number of GPUs")
    if model.heads % tp:
        raise UserError(f"tp={tp} does not divide the model's {model.heads} attention heads; pick a divisor")
    if model.heads % model.kv_heads:
        raise UserError(f"heads={model.heads} is not a multiple of kv_heads={model.kv_heads}")
    if model.intermediate % tp:
        raise UserError(f"tp={tp} does not divide intermediate={model.intermediate}")
    if model.kv_heads % tp == 0:
        kv = model.kv_heads // tp
    elif tp % model.kv_heads == 0:
        kv = 1  # fewer KV heads than GPUs: each GPU keeps a replica of one
    else:
        raise UserError(f"tp={tp} and kv_heads={model.kv_heads} do not divide one another")
    heads = model.heads // tp
    if heads % kv:
        raise UserError(f"tp={tp}: {heads} query heads per GPU do not group over {kv} KV heads")
    return Shard(
        hidden=model.hidden,
        heads=heads,
        kv_heads=kv,
        head_dim=model.head_dim,
        intermediate=model.intermediate // tp,
        vocab=-(-model.vocab // tp),
        layers=model.layers,
    )


def _check(attention: str, **positive: int) -> None:
    if attention not in ATTENTION_MODES:
        raise UserError(f"attention={attention!r}: use one of {', '.join(ATTENTION_MODES)}")
    for k, v in positive.items():
        if isinstance(v, bool) or int(v) != v or v < 1:
            raise UserError(f"{k}={v!r} must be a positive integer")


def _layer(
    s: Shard,
    *,
    phase: str,
    batch: int,
    q_len: int,
    kv_len: int,
    tp: int,
    dtype: str,
    attention: str,
) -> list[Kernel]:
    L, d, h = s.layers, s.head_dim, s.hidden
    ab = act_bytes(dtype)
    tokens = batch * q_len
    qkv_n = (s.heads + 2 * s.kv_heads) * d
    out: list[Kernel] = [
        RowOp("rmsnorm_attn", phase, "rmsnorm", rows=tokens, row_len=h, count=L, vector_len=h, elem_bytes=ab),
        Gemm("qkv_proj", phase, m=tokens, n=qkv_n, k=h, dtype=dtype, count=L),
        RowOp(
            "rope", phase, "rope", rows=tokens, row_len=(s.heads + s.kv_heads) * d, count=L,
            extra_row_bytes=d * 4, heads=s.heads + s.kv_heads, elem_bytes=ab,  # fp32 cos and sin, d/2 each
        ),
    ]
    if attention == "eager":
        # the query group of each KV head is folded into M (GQA without copying K and V)
        out += [
            Gemm("attn_score", phase, m=s.group * q_len, n=kv_len, k=d, batch=batch * s.kv_heads,
                 dtype=dtype, count=L, kind="attention"),
            RowOp("attn_softmax", phase, "softmax", rows=batch * s.heads * q_len, row_len=kv_len,
                  count=L, kind="attention", elem_bytes=ab),
            Gemm("attn_value", phase, m=s.group * q_len, n=d, k=kv_len, batch=batch * s.kv_heads,
                 dtype=dtype, count=L, kind="attention"),
        ]
    else:
        out.append(
            FusedAttention("attention", phase, batch=batch, heads=s.heads, kv_heads=s.kv_heads,
                           q_len=q_len, kv_len=kv_len, head_dim=d, causal=phase == "prefill",
                           dtype=dtype, count=L)
        )
    out.append(Gemm("o_proj", phase, m=tokens, n=h, k=s.heads * d, dtype=dtype, count=L))
    if tp > 1:
        out.append(AllReduce("allreduce_attn", phase, nbytes=tokens * h * ab, tp=tp, count=L))
    out += [
        RowOp("residual_attn", phase, "add", rows=tokens, row_len=h, count=L, elem_bytes=ab),
        RowOp("rmsnorm_mlp", phase, "rmsnorm", rows=tokens, row_len=h, count=L, vector_len=h, elem_bytes=ab),
        Gemm("gate_up_proj", phase, m=tokens, n=2 * s.intermediate, k=h, dtype=dtype, count=L),
        RowOp("silu_mul", phase, "silu_mul", rows=tokens, row_len=s.intermediate, count=L, elem_bytes=ab),
        Gemm("down_proj", phase, m=tokens, n=h, k=s.intermediate, dtype=dtype, count=L),
    ]
    if tp > 1:
        out.append(AllReduce("allreduce_mlp", phase, nbytes=tokens * h * ab, tp=tp, count=L))
    out.append(RowOp("residual_mlp", phase, "add", rows=tokens, row_len=h, count=L, elem_bytes=ab))
    return out


def prefill_kernels(
    model: ModelShape,
    *,
    tokens: int,
    tp: int = 1,
    dtype: str = "bf16",
    attention: str = "eager",
) -> tuple[Kernel, ...]:
    """Kernels of encoding ONE prompt of ``tokens`` (padded) tokens on one GPU of ``tp``."""
    _check(attention, tokens=tokens)
    dt = canonical_dtype(dtype)
    s = shard(model, tp)
    ks = _layer(s, phase="prefill", batch=1, q_len=tokens, kv_len=tokens, tp=tp, dtype=dt, attention=attention)
    ks += [
        RowOp("final_norm", "prefill", "rmsnorm", rows=tokens, row_len=s.hidden, vector_len=s.hidden,
              elem_bytes=act_bytes(dt)),
        Gemm("lm_head", "prefill", m=1, n=s.vocab, k=s.hidden, dtype=dt),
    ]
    return tuple(ks)


def decode_kernels(
    model: ModelShape,
    *,
    batch: int,
    context: int,
    tp: int = 1,
    dtype: str = "bf16",
    attention: str = "eager",
) -> tuple[Kernel, ...]:
    """Kernels of one decode step: ``batch`` sequences, one new token each, KV context ``context``."""
    _check(attention, batch=batch, context=context)
    dt = canonical_dtype(dtype)
    s = shard(model, tp)
    ks = _layer(s, phase="decode", batch=batch, q_len=1, kv_len=context, tp=tp, dtype=dt, attention=attention)
    ks += [
        RowOp("final_norm", "decode", "rmsnorm", rows=batch, row_len=s.hidden, vector_len=s.hidden,
              elem_bytes=act_bytes(dt)),
        Gemm("lm_head", "decode", m=batch, n=s.vocab, k=s.hidden, dtype=dt),
    ]
    return tuple(ks)


def gemm_bytes(dtype: str) -> int:
    return DTYPE_BYTES[canonical_dtype(dtype)]
