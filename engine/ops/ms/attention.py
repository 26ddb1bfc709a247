"""Attention and MultiHeadAttention (com.microsoft): the projections as MatMuls with their
biases (weights split at load, folded as constants), then the attention chain of heads.py,
which the program fuses into one attention kernel.

Not supported (refused at load, naming the node): Attention's past_present_share_buffer,
do_rotary and 4-D (Megatron) mask; MultiHeadAttention's packed q/k/v forms (onnxruntime's CPU
does not run them), a past with per-head key and value, cache_indirection and the qk output."""
from __future__ import annotations

import numpy as np

from engine.ops.ms.domain import MS
from engine.ops.ms.heads import attend, causal_bias, mask_bias, scale_of, split_heads
from engine.ops.registry import register_expansion


def _split(ctx, t: str, axis: int, sizes) -> list:
    if sizes is not None:
        return ctx.op("Split", [t, ctx.const(sizes, np.int64)], n_out=3, axis=axis)
    return ctx.op("Split", [t], n_out=3, axis=axis, num_outputs=3)


def _with_past(ctx, past: str, new: str) -> str:
    return ctx.op("Concat", [past, new], axis=2) if past else new


@register_expansion(MS, "Attention")
def attention(node, ctx):
    """input [B, S, D] @ weights [D, Dq + Dk + Dv] (+ bias) -> q, k, v; mask_index: lengths
    [B], ends and starts [2B], a raw mask [B, T] or [B, S, T]; past [2, B, N, P, H] before the
    keys and values, present their concat; attention_bias [B|1, N|1, S, T] added to the
    scores; unidirectional: causal over past + new."""
    for a in ("past_present_share_buffer", "do_rotary"):
        if int(ctx.attrs.get(a, 0)):
            ctx.fail(f"{a}=1 is not supported")
    if ctx.input(6):
        ctx.fail("past_sequence_length (a shared past/present buffer) is not supported")
    x, w, b, mask, past, attn_bias = (ctx.input(k) for k in range(6))
    heads = int(ctx.attrs["num_heads"])
    sizes = [int(s) for s in ctx.attrs.get("qkv_hidden_sizes", [])] or None
    ws = ctx.shape(w)
    if sizes is None and ws is not None and len(ws) == 2 and ws[1] is not None:
        sizes = [ws[1] // 3] * 3
    qkv = [ctx.op("MatMul", [x, wp]) for wp in _split(ctx, w, 1, sizes)]
    if b:
        qkv = [ctx.op("Add", [t, bp]) for t, bp in zip(qkv, _split(ctx, b, 0, sizes))]
    q, k, v = (split_heads(ctx, t, heads) for t in qkv)
    if past:
        zero, one = ctx.const(0, np.int64), ctx.const(1, np.int64)
        k = _with_past(ctx, ctx.op("Gather", [past, zero], axis=0), k)
        v = _with_past(ctx, ctx.op("Gather", [past, one], axis=0), v)
    if ctx.output(1):
        axis0 = ctx.const([0], np.int64)
        ctx.op("Concat", [ctx.op("Unsqueeze", [k, axis0]), ctx.op("Unsqueeze", [v, axis0])],
               outputs=[ctx.output(1)], axis=0)
    # the keys' count read from the input, not from k's heads (which the fused kernel reads
    # through their Transposes only when nothing else reads them)
    total = (lambda: ctx.dim(k, 2)) if past else (lambda: ctx.dim(x, 1))
    b_sym, s_sym = ctx.symbol(x, 0), ctx.symbol(x, 1)
    t_sym = None if past else s_sym
    biases = [mask_bias(ctx, mask, lambda: ctx.dim(x, 0), total, "mask_index", dims=(b_sym, t_sym)) if mask else "",
              causal_bias(ctx, lambda: ctx.dim(x, 1), total, dims=(s_sym, t_sym))
              if int(ctx.attrs.get("unidirectional", 0)) else "",
              attn_bias]
    attend(ctx, q, k, v, scale_of(ctx, sizes[0] // heads if sizes else None, q), biases, ctx.output(0))
    et = ctx.elem_type(x)
    ctx.declare(ctx.output(0), et, ctx.lead(x, 2) + (sizes[2] if sizes else None,))
    ctx.declare(ctx.output(1), et, (2, ctx.symbol(x, 0), heads, None, None))


def _width(ctx, t: str):
    """The hidden width of [B, S, D] (D) or of per-head [B, N, S, H] (N * H), None if unknown."""
    shape = ctx.shape(t)
    if shape is None:
        return None
    if len(shape) == 4:
        return shape[1] * shape[3] if shape[1] and shape[3] else None
    return shape[-1]


@register_expansion(MS, "MultiHeadAttention")
def multi_head_attention(node, ctx):
    """query [B, S, Dq], key [B, L, Dk], value [B, L, Dv] (+ bias [Dq + Dk + Dv]), or key and
    value given as heads [B, N, L, H] (cross attention over computed keys: the bias applies
    to the query only, as onnxruntime does); key_padding_mask: lengths [B], a raw mask [B, T]
    or [B, S, T]; attention_bias added to the scores; past_key / past_value [B, N, P, H]
    before the keys and values, present_key / present_value their concat; unidirectional:
    causal over past + new."""
    q, k, v, b, mask, attn_bias, past_k, past_v = (ctx.input(i) for i in range(8))
    if ctx.input(8) or ctx.input(9) or ctx.output(3):
        ctx.fail("past_sequence_length, cache_indirection and the qk output are not supported")
    ranks = [ctx.rank(t) for t in (q, k, v)]
    per_head = ranks[1] == 4 and ranks[2] == 4
    if not (k and v) or ranks[0] not in (3, None) or not per_head and any(r not in (3, None) for r in ranks[1:]):
        ctx.fail("only query [B, S, D] with key and value [B, L, D] or [B, N, L, H] are supported "
                 "(packed forms, which onnxruntime's CPU does not run either, are not)")
    if per_head and (past_k or past_v):
        ctx.fail("a past with per-head key and value is not supported")
    heads = int(ctx.attrs["num_heads"])
    dims = [_width(ctx, t) for t in (q, k, v)]
    if b:
        qb, kb, vb = _split(ctx, b, 0, dims if None not in dims else None)
        q = ctx.op("Add", [q, qb])
        if not per_head:
            k, v = ctx.op("Add", [k, kb]), ctx.op("Add", [v, vb])
    qh = split_heads(ctx, q, heads)
    kh, vh = (k, v) if per_head else (split_heads(ctx, k, heads), split_heads(ctx, v, heads))
    kh, vh = _with_past(ctx, past_k, kh), _with_past(ctx, past_v, vh)
    for out, t in ((ctx.output(1), kh), (ctx.output(2), vh)):
        if out:
            ctx.op("Identity", [t], outputs=[out])
    total = (lambda: ctx.dim(kh, 2)) if past_k or per_head else (lambda: ctx.dim(k, 1))
    t_sym = None if past_k else ctx.symbol(k, 2 if per_head else 1)
    b_sym, s_sym = ctx.symbol(q, 0), ctx.symbol(q, 1)
    biases = [mask_bias(ctx, mask, lambda: ctx.dim(q, 0), total, "key_padding_mask", starts=False,
                        dims=(b_sym, t_sym)) if mask else "",
              causal_bias(ctx, lambda: ctx.dim(q, 1), total, dims=(s_sym, t_sym))
              if int(ctx.attrs.get("unidirectional", 0)) else "",
              attn_bias]
    attend(ctx, qh, kh, vh, scale_of(ctx, dims[0] // heads if dims[0] else None, qh), biases, ctx.output(0))
    et = ctx.elem_type(ctx.input(0))
    ctx.declare(ctx.output(0), et, ctx.lead(ctx.input(0), 2) + (dims[2],))
    for o in (1, 2):
        ctx.declare(ctx.output(o), et, (ctx.symbol(ctx.input(0), 0), heads, None, None))
