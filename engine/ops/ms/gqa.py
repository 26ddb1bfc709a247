"""GroupQueryAttention (com.microsoft): causal attention of num_heads query heads over
kv_num_heads key/value heads (each shared by num_heads / kv_num_heads query heads), with the
KV cache laid out as onnxruntime's kernel lays it:

- per batch row b the total length is seqlens_k[b] + 1 and the past length 0 on the first
  prompt (sequence length == total_sequence_length), else total - sequence length;
- present [B, kv_heads, max(past buffer, total_sequence_length), H]: row b's past (its first
  past length entries), then its new keys, zeros after;
- query s of row b sees keys up to its own position (past + s) and before the row's total.

The present is one GatherElements over [past, new, a zero slot]; the heads are repeated to
num_heads for the attention chain (heads.py), which fuses into the attention kernel."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from engine.ops.ms.domain import MS
from engine.ops.ms.heads import attend, positions_of, scale_of, split_heads
from engine.ops.ms.rotary import rotate
from engine.ops.registry import register_expansion

I64 = TensorProto.INT64


def _lowest(ctx) -> float:
    """A masked key's bias: exp() of it is 0, and sums with it stay finite."""
    return float(np.finfo(helper.tensor_dtype_to_np_dtype(ctx.float_type)).min)


def _i64(ctx, t: str) -> str:
    return ctx.op("Cast", [t], to=I64)


def _cat(ctx, parts, axis=0) -> str:
    return ctx.op("Concat", list(parts), axis=axis)


def _present(ctx, past: str, new: str, src: str, dims: str, kv_heads: int, out: str) -> str:
    """present[b, :, t] = [past, new, 0][b, :, src[b, t]] (dims: the present's [4] dims)."""
    zero_dims = _cat(ctx, [ctx.dim(new, 0), ctx.const([kv_heads, 1], np.int64), ctx.dim(new, 3)])
    zero = ctx.op("ConstantOfShape", [zero_dims],
                  value=numpy_helper.from_array(np.zeros(1, helper.tensor_dtype_to_np_dtype(ctx.float_type))))
    cat = _cat(ctx, [past, new, zero] if past else [new, zero], axis=2)
    idx = ctx.op("Expand", [ctx.op("Unsqueeze", [src, ctx.const([1, 3], np.int64)]), dims])
    return ctx.op("GatherElements", [cat, idx], outputs=[out] if out else None, axis=2)


def _repeat_kv(ctx, kv: str, groups: int, heads: int) -> str:
    """[B, kv_heads, T, H] -> [B, heads, T, H], each kv head repeated `groups` times in a row."""
    if groups == 1:
        return kv
    e = ctx.op("Expand", [ctx.op("Unsqueeze", [kv, ctx.const([2], np.int64)]),
                          ctx.const([1, 1, groups, 1, 1], np.int64)])
    dims = _cat(ctx, [ctx.dim(kv, 0), ctx.const([heads], np.int64), ctx.dim(kv, 2), ctx.dim(kv, 3)])
    return ctx.op("Reshape", [e, dims])


def _rows(ctx, q: str, seqlens: str, total: str):
    """(each row's total [B], past length [B], each query's position [B, S],
    total_sequence_length as a [1] shape value) as onnxruntime counts them: past 0 on the
    first prompt (S == total_sequence_length), else total - S."""
    seq = ctx.dim(q, 1)
    # total_sequence_length read by a Range as its limit, then its length by a Shape: the
    # present's length is host shape math, and the input's value a memory dep of its own
    tot = ctx.dim(ctx.op("Range", [ctx.const(0, np.int32), total, ctx.const(1, np.int32)]), 0)
    row_total = ctx.op("Add", [_i64(ctx, seqlens), ctx.const(1, np.int64)])
    first = ctx.op("Equal", [seq, tot])
    past_len = ctx.op("Where", [first, ctx.const(0, np.int64), ctx.op("Sub", [row_total, seq])])
    q_pos = ctx.op("Add", [ctx.op("Unsqueeze", [past_len, ctx.const([1], np.int64)]), positions_of(ctx, seq, I64)])
    return row_total, past_len, q_pos, tot


def _rotary_positions(ctx, q: str, pos_ids: str, tot: str) -> str:
    """The rotary positions [B|1, S] onnxruntime reads from position_ids: on the first prompt
    (S == total_sequence_length, S > 1) the first id and those after it, else each token's."""
    seq = ctx.dim(q, 1)
    ids = _i64(ctx, pos_ids)
    start = ctx.op("Slice", [ctx.op("Reshape", [ids, ctx.const([-1], np.int64)]), ctx.const([0], np.int64),
                             ctx.const([1], np.int64)])
    run = ctx.op("Add", [ctx.op("Unsqueeze", [start, ctx.const([1], np.int64)]),
                         ctx.op("Unsqueeze", [positions_of(ctx, seq, I64), ctx.const([0], np.int64)])])
    first_prompt = ctx.op("And", [ctx.op("Equal", [seq, tot]), ctx.op("Greater", [seq, ctx.const([1], np.int64)])])
    return ctx.op("Where", [first_prompt, run, ids])


def _rotary(ctx, qh: str, kh: str, q_pos: str, cos_cache: str, sin_cache: str):
    cache = ctx.shape(cos_cache)
    if cache is None or len(cache) != 2 or not cache[1]:
        ctx.fail("do_rotary with a cos cache whose dims are not known at load")
    col = ctx.const([1], np.int64)
    cos, sin = (ctx.op("Unsqueeze", [ctx.op("Gather", [c, q_pos]), col]) for c in (cos_cache, sin_cache))
    inter = bool(ctx.attrs.get("rotary_interleaved", 0))
    qr, kr = ctx.fresh("q_rotated"), ctx.fresh("k_rotated")
    rotate(ctx, qh, cos, sin, 2 * cache[1], inter, qr)
    rotate(ctx, kh, cos, sin, 2 * cache[1], inter, kr)
    return qr, kr


def _sources(ctx, past_k: str, q: str, tot: str, past_len: str):
    """(present length [1], positions 0..T-1, where each present entry comes from [B, T]:
    past (t < past length), new, else the zero slot)."""
    seq = ctx.dim(q, 1)
    p = ctx.dim(past_k, 2) if past_k else ctx.const([0], np.int64)
    length = ctx.op("Max", [p, tot])
    t = positions_of(ctx, length, I64)
    rel = ctx.op("Sub", [t, ctx.op("Unsqueeze", [past_len, ctx.const([1], np.int64)])])
    zero = ctx.const(0, np.int64)
    is_new = ctx.op("And", [ctx.op("GreaterOrEqual", [rel, zero]), ctx.op("Less", [rel, seq])])
    src = ctx.op("Where", [ctx.op("Less", [rel, zero]), t,
                           ctx.op("Where", [is_new, ctx.op("Add", [p, rel]), ctx.op("Add", [p, seq])])])
    return length, t, src


def _causal_rows(ctx, t: str, q_pos: str, row_total: str) -> str:
    """[B, 1, S, T] bias: query s of row b sees keys t <= its position and t < the row's total
    (and, with local_window_size w >= 0, t > its position - w)."""
    pos = ctx.op("Unsqueeze", [q_pos, ctx.const([2], np.int64)])
    keep = ctx.op("And", [ctx.op("LessOrEqual", [t, pos]),
                          ctx.op("Less", [t, ctx.op("Unsqueeze", [row_total, ctx.const([1, 2], np.int64)])])])
    window = int(ctx.attrs.get("local_window_size", -1))
    if window >= 0:
        keep = ctx.op("And", [keep, ctx.op("Greater", [t, ctx.op("Sub", [pos, ctx.const(window, np.int64)])])])
    return ctx.op("Unsqueeze", [ctx.op("Where", [keep, ctx.const(0.0), ctx.const(_lowest(ctx))]), ctx.const([1], np.int64)])


def _zero_keyless_rows(ctx, y: str, q_pos: str, row_total: str, window: int) -> None:
    """onnxruntime's output for a query whose window holds no key (a padded row past its
    total) is 0: keys max(0, pos - w + 1) .. min(pos, total - 1) must not be empty."""
    lo = ctx.op("Max", [ctx.op("Sub", [q_pos, ctx.const(window - 1, np.int64)]), ctx.const(0, np.int64)])
    hi = ctx.op("Min", [q_pos, ctx.op("Unsqueeze", [ctx.op("Sub", [row_total, ctx.const(1, np.int64)]),
                                                   ctx.const([1], np.int64)])])
    some = ctx.op("Cast", [ctx.op("LessOrEqual", [lo, hi])], to=ctx.float_type)
    ctx.op("Mul", [y, ctx.op("Unsqueeze", [some, ctx.const([2], np.int64)])], outputs=[ctx.output(0)])


@register_expansion(MS, "GroupQueryAttention")
def group_query_attention(node, ctx):
    """query [B, S, N*H] with key and value [B, S, Nkv*H] (or packed [B, S, (N + 2 Nkv) H]);
    past_key / past_value [B, Nkv, P, H]; seqlens_k [B]; total_sequence_length (scalar);
    do_rotary with cos_cache / sin_cache at each token's position (or from position_ids);
    attention_bias; softcap;
    local_window_size; smooth_softmax and head_sink."""
    q, k, v, past_k, past_v, seqlens, total, cos_cache, sin_cache, pos_ids, attn_bias = \
        (ctx.input(i) for i in range(11))
    if ctx.output(3) or int(ctx.attrs.get("qk_output", 0)):
        ctx.fail("the qk output is not supported")
    heads, kv_heads = int(ctx.attrs["num_heads"]), int(ctx.attrs["kv_num_heads"])
    qshape = ctx.shape(q)
    d = qshape[-1] if qshape else None
    if not k:   # packed q, k, v
        if d is None:
            ctx.fail("packed query/key/value whose width is not known at load")
        h = d // (heads + 2 * kv_heads)
        q, k, v = ctx.op("Split", [q, ctx.const([heads * h, kv_heads * h, kv_heads * h], np.int64)],
                         n_out=3, axis=2)
        d = heads * h
    head_size = d // heads if d else None
    qh, kh, vh = split_heads(ctx, q, heads), split_heads(ctx, k, kv_heads), split_heads(ctx, v, kv_heads)
    row_total, past_len, q_pos, tot = _rows(ctx, q, seqlens, total)
    if int(ctx.attrs.get("do_rotary", 0)):
        pos = _rotary_positions(ctx, q, pos_ids, tot) if pos_ids else q_pos
        qh, kh = _rotary(ctx, qh, kh, pos, cos_cache, sin_cache)
    length, t, src = _sources(ctx, past_k, q, tot, past_len)
    dims = _cat(ctx, [ctx.dim(q, 0), ctx.const([kv_heads], np.int64), length, ctx.dim(kh, 3)])
    pk = _present(ctx, past_k, kh, src, dims, kv_heads, ctx.output(1))
    pv = _present(ctx, past_v, vh, src, dims, kv_heads, ctx.output(2))
    if attn_bias:   # [.., S, total]: zeros over the present's keys past the total (masked anyway)
        pads = _cat(ctx, [ctx.const([0] * 7, np.int64), ctx.op("Sub", [length, tot])])
        attn_bias = ctx.op("Pad", [attn_bias, pads])
    groups = heads // kv_heads
    window = int(ctx.attrs.get("local_window_size", -1))
    out = ctx.fresh("windowed") if window >= 0 else ctx.output(0)
    # head_sink, or smooth_softmax's 0: one more logit per head in the softmax's denominator
    sink = ctx.input(11) or (ctx.const([0.0]) if int(ctx.attrs.get("smooth_softmax", 0)) else "")
    attend(ctx, qh, _repeat_kv(ctx, pk, groups, heads), _repeat_kv(ctx, pv, groups, heads),
           scale_of(ctx, head_size, qh), [_causal_rows(ctx, t, q_pos, row_total), attn_bias], out,
           softcap=float(ctx.attrs.get("softcap", 0.0)), sink=sink)
    if window >= 0:
        _zero_keyless_rows(ctx, out, q_pos, row_total, window)
    et = ctx.elem_type(ctx.input(0))
    ctx.declare(ctx.output(0), et, ctx.lead(ctx.input(0), 2) + (d,))
    for o in (1, 2):
        ctx.declare(ctx.output(o), et, (ctx.symbol(ctx.input(0), 0), kv_heads, None, head_size))
