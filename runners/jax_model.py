"""A Llama-architecture decoder in pure JAX, written for static (bucketed) shapes.

Three graph builders mirror NxD Inference's compiled models:

- ``prefill_fn(shape, bucket, cache_len)``: context encoding of ONE request padded to
  ``bucket`` tokens (batch 1, NxD Inference's ``ctx_batch_size = 1``); the valid length and
  the destination batch row are traced scalars, so one compiled graph serves every prompt
  length of the bucket and every row. It writes that row's K/V for positions [0, bucket)
  into the batch KV cache and stores the greedy next token (at position ``length - 1``)
  into the batch token vector.
- ``prefill_batch_fn(shape, bucket, cache_len)``: context encoding of the WHOLE batch in
  one call of shape (batch, bucket) (``ctx_batch_size = batch``, vLLM's batched prefill);
  per-row lengths are traced, so padding rows (length 0) run in the shape too.
- ``decode_fn(shape, bucket)``: one token-generation step of the whole batch; attention
  reads only the first ``bucket`` cache positions (a static slice), masked per row
  beyond that row's context.

The KV cache is ``[layers, batch, cache_len, kv_heads, head_dim]`` (one array for K, one
for V); callers donate it so the updates happen in place.  Parameters and the cache carry
``PartitionSpec``s over a mesh axis named ``"tp"``: attention heads and the MLP
intermediate dimension are split, the rest replicated, and GSPMD inserts the collectives.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from lens.types import ModelShape

TP_AXIS = "tp"
ROPE_THETA = 10000.0
NORM_EPS = 1e-5
INIT_SCALE = 0.02
_MASKED = -1e30

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}

Params = dict[str, Any]


def jnp_dtype(name: str):
    """The jax dtype of a target dtype name ("float32" or "bfloat16")."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype {name!r} is not supported: use one of {', '.join(DTYPES)}") from None


# -- parameters ---------------------------------------------------------------------------
def _layer_shapes(s: ModelShape) -> dict[str, tuple[tuple[int, ...], P]]:
    h, hd, i = s.hidden, s.head_dim, s.intermediate
    return {
        "attn_norm": ((h,), P()),
        "wq": ((h, s.heads, hd), P(None, TP_AXIS, None)),
        "wk": ((h, s.kv_heads, hd), P(None, TP_AXIS, None)),
        "wv": ((h, s.kv_heads, hd), P(None, TP_AXIS, None)),
        "wo": ((s.heads, hd, h), P(TP_AXIS, None, None)),
        "mlp_norm": ((h,), P()),
        "w_gate": ((h, i), P(None, TP_AXIS)),
        "w_up": ((h, i), P(None, TP_AXIS)),
        "w_down": ((i, h), P(TP_AXIS, None)),
    }


def _top_shapes(s: ModelShape) -> dict[str, tuple[tuple[int, ...], P]]:
    return {
        "embed": ((s.vocab, s.hidden), P()),
        "final_norm": ((s.hidden,), P()),
        "lm_head": ((s.hidden, s.vocab), P()),
    }


def param_specs(shape: ModelShape) -> Params:
    """The ``PartitionSpec`` of every parameter, as a pytree shaped like the parameters."""
    out: Params = {k: spec for k, (_, spec) in _top_shapes(shape).items()}
    out["layers"] = [{k: spec for k, (_, spec) in _layer_shapes(shape).items()} for _ in range(shape.layers)]
    return out


def param_structs(shape: ModelShape, dtype, shardings: Params | None = None) -> Params:
    """``jax.ShapeDtypeStruct``s of the parameters (for ahead-of-time lowering)."""
    def st(shp, sh):
        return jax.ShapeDtypeStruct(shp, dtype, sharding=sh)

    top, lay = _top_shapes(shape), _layer_shapes(shape)
    out: Params = {k: st(shp, None if shardings is None else shardings[k]) for k, (shp, _) in top.items()}
    out["layers"] = [
        {k: st(shp, None if shardings is None else shardings["layers"][li][k]) for k, (shp, _) in lay.items()}
        for li in range(shape.layers)
    ]
    return out


def _init(shape: ModelShape, seed: int, dtype) -> Params:
    base = jax.random.key(seed)

    def normal(idx: int, shp) -> jax.Array:
        return (INIT_SCALE * jax.random.normal(jax.random.fold_in(base, idx), shp, jnp.float32)).astype(dtype)

    idx = 0
    out: Params = {}
    for k, (shp, _) in _top_shapes(shape).items():
        out[k] = jnp.ones(shp, dtype) if k.endswith("norm") else normal(idx, shp)
        idx += 1
    layers = []
    for _ in range(shape.layers):
        lay = {}
        for k, (shp, _) in _layer_shapes(shape).items():
            lay[k] = jnp.ones(shp, dtype) if k.endswith("norm") else normal(idx, shp)
            idx += 1
        layers.append(lay)
    out["layers"] = layers
    return out


def init_params(shape: ModelShape, *, seed: int, dtype, shardings: Params | None = None) -> Params:
    """Random weights (normal, std 0.02; norms at 1) from ``seed``.

    The values depend only on ``seed`` and the shape, not on the sharding, so every tp
    degree computes the same function.
    """
    fn = jax.jit(lambda: _init(shape, seed, dtype), out_shardings=shardings)
    return fn()


# -- building blocks ----------------------------------------------------------------------
def rms_norm(x: jax.Array, w: jax.Array) -> jax.Array:
    xf = x.astype(jnp.float32)
    y = xf * lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + NORM_EPS)
    return (y * w.astype(jnp.float32)).astype(x.dtype)


def rope(x: jax.Array, pos: jax.Array) -> jax.Array:
    """Rotary embedding (rotate-half form) of ``x[..., T, n, D]`` at positions ``pos[..., T]``."""
    d = x.shape[-1]
    inv = 1.0 / (ROPE_THETA ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    ang = pos.astype(jnp.float32)[..., None] * inv  # [..., T, D/2]
    cos = jnp.cos(ang)[..., None, :]
    sin = jnp.sin(ang)[..., None, :]
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., : d // 2], xf[..., d // 2:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def mlp(x: jax.Array, p: Params) -> jax.Array:
    g = jnp.einsum("...h,hi->...i", x, p["w_gate"])
    u = jnp.einsum("...h,hi->...i", x, p["w_up"])
    return jnp.einsum("...i,ih->...h", jax.nn.silu(g) * u, p["w_down"])


def _qkv(h: jax.Array, p: Params):
    q = jnp.einsum("...h,hnd->...nd", h, p["wq"])
    k = jnp.einsum("...h,hnd->...nd", h, p["wk"])
    v = jnp.einsum("...h,hnd->...nd", h, p["wv"])
    return q, k, v


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query attention.

    q ``[B, T, heads, D]``, k/v ``[B, S, kv_heads, D]``, mask ``[B, T, S]`` (True = visible);
    returns ``[B, T, heads, D]``.  Query head ``h`` reads kv head ``h // (heads/kv_heads)``,
    so a contiguous split of heads over tp keeps every group on one shard.
    """
    bsz, t, nh, d = q.shape
    kvh = k.shape[2]
    g = nh // kvh
    qg = q.reshape(bsz, t, kvh, g, d)
    s = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32) * (1.0 / np.sqrt(d))
    s = jnp.where(mask[:, None, None, :, :], s, _MASKED)
    w = jax.nn.softmax(s, axis=-1).astype(v.dtype)
    o = jnp.einsum("bkgts,bskd->btkgd", w, v)
    return o.reshape(bsz, t, nh, d)


def _logits(x: jax.Array, params: Params) -> jax.Array:
    h = rms_norm(x, params["final_norm"])
    return jnp.einsum("...h,hv->...v", h, params["lm_head"], preferred_element_type=jnp.float32)


# -- graphs -------------------------------------------------------------------------------
def prefill_fn(shape: ModelShape, bucket: int, cache_len: int) -> Callable:
    """Context encoding of one request in ``bucket``: see the module docstring.

    Signature: ``(params, cache_k, cache_v, tokens[B], prompt[1, bucket], length, row)
    -> (tokens[B], cache_k, cache_v)``; ``tokens[row]`` receives the greedy next token.
    """
    n_write = min(bucket, cache_len)

    def fn(params, ck, cv, tokens, prompt, length, row):
        pos = jnp.arange(bucket, dtype=jnp.int32)[None, :]  # [1, b]
        mask = (pos[0][:, None] >= pos[0][None, :])[None]  # causal [1, b, b]
        x = params["embed"][prompt]  # [1, b, H]
        zero = jnp.zeros((), jnp.int32)
        for li, p in enumerate(params["layers"]):
            h = rms_norm(x, p["attn_norm"])
            q, k, v = _qkv(h, p)
            q, k = rope(q, pos), rope(k, pos)
            start = (jnp.int32(li), row.astype(jnp.int32), zero, zero, zero)
            ck = lax.dynamic_update_slice(ck, k[None, :, :n_write].astype(ck.dtype), start)
            cv = lax.dynamic_update_slice(cv, v[None, :, :n_write].astype(cv.dtype), start)
            a = _attend(q, k, v, mask)
            x = x + jnp.einsum("btnd,ndh->bth", a, p["wo"])
            x = x + mlp(rms_norm(x, p["mlp_norm"]), p)
        last = lax.dynamic_slice_in_dim(x[0], length - 1, 1, axis=0)  # [1, H]
        nxt = jnp.argmax(_logits(last, params)[0]).astype(jnp.int32)
        return tokens.at[row].set(nxt), ck, cv

    return fn


def prefill_batch_fn(shape: ModelShape, bucket: int, cache_len: int) -> Callable:
    """Context encoding of every row of the batch in one call of shape (batch, ``bucket``).

    Signature: ``(params, cache_k, cache_v, tokens[B], prompts[B, bucket], lengths[B])
    -> (tokens[B], cache_k, cache_v)``: row r's K/V for positions [0, bucket) go to cache row
    r and ``tokens[r]`` becomes its greedy next token (at position ``lengths[r] - 1``; a
    padding row of length 0 yields a token no one reads). ``tokens`` in is not read; it is
    there so both prefill graphs take the same arguments.
    """
    n_write = min(bucket, cache_len)

    def fn(params, ck, cv, tokens, prompts, lengths):
        bsz = prompts.shape[0]
        pos = jnp.broadcast_to(jnp.arange(bucket, dtype=jnp.int32)[None, :], (bsz, bucket))
        mask = jnp.broadcast_to((pos[0][:, None] >= pos[0][None, :])[None], (bsz, bucket, bucket))  # causal
        x = params["embed"][prompts]  # [B, b, H]
        zero = jnp.zeros((), jnp.int32)
        for li, p in enumerate(params["layers"]):
            h = rms_norm(x, p["attn_norm"])
            q, k, v = _qkv(h, p)
            q, k = rope(q, pos), rope(k, pos)
            start = (jnp.int32(li), zero, zero, zero, zero)
            ck = lax.dynamic_update_slice(ck, k[None, :, :n_write].astype(ck.dtype), start)
            cv = lax.dynamic_update_slice(cv, v[None, :, :n_write].astype(cv.dtype), start)
            a = _attend(q, k, v, mask)
            x = x + jnp.einsum("btnd,ndh->bth", a, p["wo"])
            x = x + mlp(rms_norm(x, p["mlp_norm"]), p)
        last = jnp.maximum(lengths - 1, 0).astype(jnp.int32)
        h_last = jnp.take_along_axis(x, last[:, None, None], axis=1)[:, 0]  # [B, H]
        return jnp.argmax(_logits(h_last, params), axis=-1).astype(jnp.int32), ck, cv

    return fn


def decode_fn(shape: ModelShape, bucket: int) -> Callable:
    """One token-generation step of the whole batch with attention over ``bucket`` positions.

    Signature: ``(params, cache_k, cache_v, tokens[B], l_in[B], last_step[B], step)
    -> (tokens[B], cache_k, cache_v, step + 1)``.  Row r feeds ``tokens[r]`` at position
    ``l_in[r] + step - 1`` (its context is ``l_in[r] + step``) while ``step <=
    last_step[r]``; other rows (finished or empty) ride along at position 0 of their own
    row and never affect the real rows.
    """

    def fn(params, ck, cv, tokens, l_in, last_step, step):
        bsz = tokens.shape[0]
        active = step <= last_step
        pos = jnp.where(active, l_in + step - 1, 0).astype(jnp.int32)  # [B]
        rows = jnp.arange(bsz, dtype=jnp.int32)
        mask = (jnp.arange(bucket, dtype=jnp.int32)[None, :] <= pos[:, None])[:, None, :]  # [B, 1, b]
        x = params["embed"][tokens][:, None, :]  # [B, 1, H]
        for li, p in enumerate(params["layers"]):
            h = rms_norm(x, p["attn_norm"])
            q, k, v = _qkv(h, p)
            q, k = rope(q, pos[:, None]), rope(k, pos[:, None])
            ck = ck.at[li, rows, pos].set(k[:, 0].astype(ck.dtype))
            cv = cv.at[li, rows, pos].set(v[:, 0].astype(cv.dtype))
            a = _attend(q, ck[li, :, :bucket], cv[li, :, :bucket], mask)
            x = x + jnp.einsum("btnd,ndh->bth", a, p["wo"])
            x = x + mlp(rms_norm(x, p["mlp_norm"]), p)
        nxt = jnp.argmax(_logits(x[:, 0], params), axis=-1).astype(jnp.int32)
        return nxt, ck, cv, step + 1

    return fn


def forward_full(params: Params, tokens: jax.Array) -> jax.Array:
    """Reference forward pass without a cache: logits ``[B, T, vocab]`` of ``tokens[B, T]``."""
    bsz, t = tokens.shape
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None, :], (bsz, t))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool))[None], (bsz, t, t))
    x = params["embed"][tokens]
    for p in params["layers"]:
        h = rms_norm(x, p["attn_norm"])
        q, k, v = _qkv(h, p)
        q, k = rope(q, pos), rope(k, pos)
        x = x + jnp.einsum("btnd,ndh->bth", _attend(q, k, v, mask), p["wo"])
        x = x + mlp(rms_norm(x, p["mlp_norm"]), p)
    return _logits(x, params)


def cache_spec() -> P:
    """KV cache ``[layers, batch, cache_len, kv_heads, head_dim]`` split on kv_heads."""
    return P(None, None, None, TP_AXIS, None)


def cache_shape(shape: ModelShape, batch: int, cache_len: int) -> tuple[int, ...]:
    return (shape.layers, batch, cache_len, shape.kv_heads, shape.head_dim)
