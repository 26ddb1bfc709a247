"""Attention (ONNX 23; 24's nonpad_kv_seqlen, 25's left / right windows) as the chain the
program fuses into its `attention` kernel:

    present = Concat(past, new) along the sequence axis   (a fed-back cache appends in place)
    softmax(q k^T * scale [softcapped] + bias) v

Grouped-query heads read the kv heads as they are: q [B, N, S, H] is viewed as
[B, Nkv, groups * S, H] (the query heads of one kv head are consecutive), the bias tiled or
reshaped alike, and the context viewed back as [B, N, S, Hv]. So the present is read only by
the attention (no repeated copy of the cache) and stays a KV append.

The bias is the spec's: a bool mask's False and the keys outside the causal frontier (key j
<= query i + offset, offset the past length, nonpad_kv_seqlen - S, or 0), the windows and the
padding of nonpad_kv_seqlen are -inf; a float mask is added; a mask shorter than the keys is
padded with -inf. A query row with every key masked gives 0 (the softmax's NaN replaced, the
guard torch.export writes, which the fused kernel takes). The softmax runs in float32 whatever
softmax_precision asks."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from engine.ops.ms.heads import attention_probs, positions_of, scale_of, split_heads
from engine.ops.registry import register_expansion

I64 = TensorProto.INT64


def _i64(ctx, values) -> str:
    return ctx.const(values, np.int64)


def _keep_bias(ctx, keep: str) -> str:
    return ctx.op("Where", [keep, ctx.const(0.0), ctx.const(-np.inf)])


def _frontier(ctx, seq: str, keys: str, offset: str, per_batch: bool, causal: bool, left: int, right: int):
    """Where query i (at position i + offset) may see key j: [S, T], or [B, 1, S, T] with a
    per-batch offset [B]; None when nothing restricts it."""
    if not (causal or left >= 0 or right >= 0):
        return None
    i, j = positions_of(ctx, seq, I64), positions_of(ctx, keys, I64)
    if per_batch:
        pos = ctx.op("Add", [ctx.op("Unsqueeze", [i, _i64(ctx, [1])]), ctx.op("Reshape", [offset, _i64(ctx, [-1, 1, 1])])])
    else:
        pos = ctx.op("Unsqueeze", [ctx.op("Add", [i, offset]), _i64(ctx, [1])])
    diff = ctx.op("Sub", [pos, j])              # position - key: [S, T] or [B, S, T]
    conds = []
    if causal:
        conds.append(ctx.op("GreaterOrEqual", [diff, _i64(ctx, 0)]))
    if left >= 0:
        conds.append(ctx.op("LessOrEqual", [diff, _i64(ctx, left)]))
    if right >= 0:
        conds.append(ctx.op("GreaterOrEqual", [diff, _i64(ctx, -right)]))
    keep = conds[0]
    for c in conds[1:]:
        keep = ctx.op("And", [keep, c])
    return ctx.op("Unsqueeze", [keep, _i64(ctx, [1])]) if per_batch else keep


def _mask_bias(ctx, mask: str, keys: str, keys_known) -> str:
    """attn_mask as an additive bias over all T keys (shorter: the rest -inf)."""
    if ctx.elem_type(mask) == TensorProto.BOOL:
        bias = _keep_bias(ctx, mask)
    else:
        bias = mask
    shape = ctx.shape(mask)
    if shape is None:
        ctx.fail(f"the rank of attn_mask {mask!r} is not known at load")
    if keys_known is not None and shape[-1] == keys_known:
        return bias
    width = ctx.dim(mask, len(shape) - 1)
    pads = ctx.op("Concat", [_i64(ctx, [0] * (2 * len(shape) - 1)), ctx.op("Sub", [keys, width])], axis=0)
    return ctx.op("Pad", [bias, pads, ctx.const(-np.inf)])


def _bias_dims(ctx, mask: str):
    """(heads dim is 1, query dim is 1: None when not known at load) of attn_mask against the
    scores [B, N, S, T]."""
    shape = ctx.shape(mask)
    rank = len(shape)
    heads = shape[1] if rank == 4 else shape[0] if rank == 3 else 1
    seq = shape[-2] if rank >= 2 else 1
    return heads == 1, None if seq is None else seq == 1


def _grouped_bias(ctx, bias: str, rank: int, heads_one: bool, seq_one, heads: int, kv_heads: int,
                  seq: str) -> str:
    """A bias against [B, N, S, T] as the grouped scores [B, Nkv, groups * S, T] see it
    (`seq_one` None: its query dim is not known at load, so it is broadcast to S first)."""
    if rank < 4:
        bias = ctx.op("Unsqueeze", [bias, _i64(ctx, list(range(4 - rank)))])
    if heads_one and seq_one:
        return bias
    if heads_one:
        if seq_one is None:
            bias = ctx.op("Expand", [bias, ctx.op("Concat", [_i64(ctx, [1, 1]), seq, _i64(ctx, [1])], axis=0)])
        return ctx.op("Tile", [bias, _i64(ctx, [1, 1, heads // kv_heads, 1])])
    dims = ctx.op("Concat", [_i64(ctx, [1, heads]), seq, _i64(ctx, [1])], axis=0)
    return ctx.op("Reshape", [ctx.op("Expand", [bias, dims]), _i64(ctx, [0, kv_heads, -1, 0])])


def _named(ctx, k: int):
    return [ctx.output(k)] if ctx.output(k) else None


def _heads(ctx, q: str, k: str, v: str):
    """(rank, heads, kv heads, q k v as [B, heads, S|L, H], head size, v head size)."""
    rank = ctx.rank(q)
    qs, ks, vs = ctx.shape(q), ctx.shape(k), ctx.shape(v)
    if rank == 3:
        heads, kv_heads = int(ctx.attrs.get("q_num_heads", 0)), int(ctx.attrs.get("kv_num_heads", 0))
        if not heads or not kv_heads:
            ctx.fail("3-D inputs need q_num_heads and kv_num_heads")
        qkv = split_heads(ctx, q, heads), split_heads(ctx, k, kv_heads), split_heads(ctx, v, kv_heads)
        head = qs[2] // heads if qs[2] else None
        v_head = vs[2] // kv_heads if vs and vs[2] else None
    elif rank == 4:
        heads, kv_heads = qs[1], ks[1] if ks else None
        if not heads or not kv_heads:
            ctx.fail("4-D inputs whose head counts are not known at load")
        qkv, head, v_head = (q, k, v), qs[3], vs[3] if vs else None
    else:
        ctx.fail(f"Q of rank {rank} (3 or 4 is supported)")
    if heads % kv_heads:
        ctx.fail(f"q heads ({heads}) not a multiple of kv heads ({kv_heads})")
    return (rank, heads, kv_heads) + qkv + (head, v_head)


def _presents(ctx, kh: str, vh: str, seq_axis: int):
    """(present key, present value, T as [1], T if known at load, the past's length or None).
    The presents are read by the attention alone: T comes from the inputs' dims."""
    past_k, past_v, ks = ctx.input(4), ctx.input(5), ctx.shape(ctx.input(1))
    new = ctx.dim(ctx.input(1), seq_axis)
    new_known = ks[seq_axis] if ks else None
    if not past_k:
        for o, t in ((1, kh), (2, vh)):
            if ctx.output(o):
                ctx.op("Identity", [t], outputs=[ctx.output(o)])
        return kh, vh, new, new_known, None
    pk = ctx.op("Concat", [past_k, kh], outputs=_named(ctx, 1), axis=2)
    pv = ctx.op("Concat", [past_v, vh], outputs=_named(ctx, 2), axis=2)
    past_len = ctx.dim(past_k, 2)
    known = (ctx.shape(past_k) or (None,) * 4)[2]
    total = known + new_known if known is not None and new_known is not None else None
    return pk, pv, ctx.op("Add", [past_len, new]), total, past_len


def _biases(ctx, seq: str, keys: str, keys_known, past_len, heads: int, kv_heads: int) -> list:
    """The additive biases against the scores, as the grouped view [B, Nkv, groups * S, T]
    sees them when kv heads are shared. The one of the frontier and nonpad_kv_seqlen is made
    once for the layers whose dims have the same symbols (ONNX inference's names)."""
    mask, nonpad = ctx.input(3), ctx.input(6)
    q, k, past_k = ctx.input(0), ctx.input(1), ctx.input(4)
    axis = ctx.rank(q) - 2
    window = int(ctx.attrs.get("left_window_size", -1)), int(ctx.attrs.get("right_window_size", -1))
    causal = bool(ctx.attrs.get("is_causal", 0))

    def group(bias, rank, heads_one, seq_one):
        if heads == kv_heads:
            return bias
        return _grouped_bias(ctx, bias, rank, heads_one, seq_one, heads, kv_heads, seq)

    def frontier():
        if nonpad:
            offset = ctx.op("Sub", [ctx.op("Cast", [nonpad], to=I64), seq])
        else:
            offset = past_len if past_len else _i64(ctx, [0])
        keep = _frontier(ctx, seq, keys, offset, bool(nonpad), causal, *window)
        if nonpad:      # the keys past each row's count
            counts = ctx.op("Reshape", [ctx.op("Cast", [nonpad], to=I64), _i64(ctx, [-1, 1, 1, 1])])
            valid = ctx.op("Less", [positions_of(ctx, keys, I64), counts])
            keep = valid if keep is None else ctx.op("And", [keep, valid])
        return group(_keep_bias(ctx, keep), 4 if nonpad else 2, True, False)

    terms = []
    if mask:
        terms.append(group(_mask_bias(ctx, mask, keys, keys_known), max(ctx.rank(mask), 1),
                           *_bias_dims(ctx, mask)))
    if causal or nonpad or max(window) >= 0:
        past_sym = ctx.symbol(past_k, 2) if past_k else 0
        key = ("attention_frontier", ctx.float_type, ctx.symbol(q, axis), ctx.symbol(k, axis), past_sym,
               nonpad or 0, causal, window, heads, kv_heads)
        terms.append(ctx.shared(key, frontier))
    return terms


@register_expansion("", "Attention", checked=25)
def attention(node, ctx):
    """Q, K, V [B, N|Nkv, S|L, H] or [B, S|L, heads * H] (q_num_heads, kv_num_heads); attn_mask
    broadcast to [B, N, S, T]; past_key / past_value [B, Nkv, P, H] and the presents; is_causal;
    nonpad_kv_seqlen [B] (an external cache); scale, softcap, qk_matmul_output_mode 0-3."""
    q, k, v, mask, past_k, past_v, nonpad = (ctx.input(i) for i in range(7))
    mode = int(ctx.attrs.get("qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        ctx.fail(f"qk_matmul_output_mode {mode} is not one of the spec's 0-3")
    if bool(past_k) != bool(past_v):
        ctx.fail("past_key and past_value must be given together")
    if nonpad and past_k:
        ctx.fail("nonpad_kv_seqlen cannot be used with past_key / past_value")
    rank, heads, kv_heads, qh, kh, vh, head, v_head = _heads(ctx, q, k, v)
    seq_axis = rank - 2
    seq = ctx.dim(q, seq_axis)
    pk, pv, keys, keys_known, past_len = _presents(ctx, kh, vh, seq_axis)
    terms = _biases(ctx, seq, keys, keys_known, past_len, heads, kv_heads)
    groups = heads // kv_heads
    qg = ctx.op("Reshape", [qh, _i64(ctx, [0, kv_heads, -1, 0])]) if groups > 1 else qh
    taps = {}
    probs = attention_probs(ctx, qg, pk, scale_of(ctx, head, qh), terms,
                            softcap=float(ctx.attrs.get("softcap", 0.0)), taps=taps)
    left, right = int(ctx.attrs.get("left_window_size", -1)), int(ctx.attrs.get("right_window_size", -1))
    if mask or nonpad or left >= 0 or right >= 0:   # a row may have no key left
        probs = ctx.op("Where", [ctx.op("IsNaN", [probs]), ctx.const(0.0), probs])
    _outputs(ctx, rank, groups, heads, probs, pv, probs if mode == 3 else taps[("scaled", "capped", "biased")[mode]])
    et, b_sym = ctx.elem_type(q), ctx.symbol(q, 0)
    if rank == 4:
        ctx.declare(ctx.output(0), et, (b_sym, heads, ctx.symbol(q, 2), v_head))
    else:
        ctx.declare(ctx.output(0), et, ctx.lead(q, 2) + (heads * v_head if v_head else None,))
    ctx.declare(ctx.output(1), et, (b_sym, kv_heads, None, head))
    ctx.declare(ctx.output(2), et, (b_sym, kv_heads, None, v_head))
    ctx.declare(ctx.output(3), et, (b_sym, heads, ctx.symbol(q, seq_axis), None))


def _outputs(ctx, rank: int, groups: int, heads: int, probs: str, pv: str, qk: str) -> None:
    """Y (the context, heads merged for 3-D inputs) and the qk output, the grouped view's
    [B, Nkv, groups * S, .] read back as [B, N, S, .]."""
    def ungroup(t, out=None):
        if groups > 1:
            return ctx.op("Reshape", [t, _i64(ctx, [0, heads, -1, 0])], outputs=out)
        return ctx.op("Identity", [t], outputs=out) if out else t

    direct = rank == 4 and groups == 1    # the context is Y itself
    y = ctx.op("MatMul", [probs, pv], outputs=[ctx.output(0)] if direct else None)
    if ctx.output(3):
        ungroup(qk, [ctx.output(3)])
    if rank == 4 and not direct:
        ungroup(y, [ctx.output(0)])
    elif rank == 3:
        merged = ctx.op("Transpose", [ungroup(y)], perm=[0, 2, 1, 3])
        ctx.op("Reshape", [merged, _i64(ctx, [0, 0, -1])], outputs=[ctx.output(0)])
