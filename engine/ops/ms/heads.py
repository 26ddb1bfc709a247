"""The multi-head attention chain the com.microsoft attention ops share, written as exporters
write it so the program's attention fusion (engine/attention_fusion.py) runs it as one kernel:

    softmax(q_h @ k_h^T * scale + bias) @ v_h, heads split [0, 2, 1, 3] and merged back

and the additive biases onnxruntime builds from its mask forms (mask_filter_value where a key
is masked, 0 where it is kept)."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

INT64_MAX = np.iinfo(np.int64).max


def split_heads(ctx, x: str, heads: int) -> str:
    """[B, S, N*H] -> [B, N, S, H]."""
    r = ctx.op("Reshape", [x, ctx.const([0, 0, heads, -1], np.int64)])
    return ctx.op("Transpose", [r], perm=[0, 2, 1, 3])


def scale_of(ctx, head_size: int | None, q_heads: str) -> str:
    """The `scale` attribute, else 1 / sqrt(head size): a constant when the head size is known
    at load, else computed from q's dims (host shape math)."""
    s = float(ctx.attrs.get("scale", 0.0))
    if s != 0.0:
        return ctx.const(s)
    if head_size is not None:
        return ctx.const(1.0 / np.sqrt(head_size))
    h = ctx.op("Cast", [ctx.dim(q_heads, 3)], to=ctx.float_type)
    return ctx.op("Reciprocal", [ctx.op("Sqrt", [h])])


def attend(ctx, q: str, k: str, v: str, scale: str, biases: list, out: str, softcap: float = 0.0,
           sink: str = "") -> None:
    """out [B, S, N*Hv] = heads merged of softmax(q k^T * scale + sum(biases)) v, for q
    [B, N, S, H], k [B, N, L, H], v [B, N, L, Hv] (attention_probs says the rest)."""
    probs = attention_probs(ctx, q, k, scale, biases, softcap, sink)
    merged = ctx.op("Transpose", [ctx.op("MatMul", [probs, v])], perm=[0, 2, 1, 3])
    ctx.op("Reshape", [merged, ctx.const([0, 0, -1], np.int64)], outputs=[out])


def attention_probs(ctx, q: str, k: str, scale: str, biases: list, softcap: float = 0.0, sink: str = "",
                    taps: dict | None = None) -> str:
    """softmax(q k^T * scale + sum(biases)) over the keys; `softcap` > 0 caps the scaled scores
    at +-softcap (softcap * tanh(scores / softcap)) before the biases; `sink` ([N] or a
    scalar) is one more logit per head in the softmax's denominator (attention sinks).
    `taps` gets the scores on the way: "scaled", "capped", "biased"."""
    taps = {} if taps is None else taps
    scores = ctx.op("Mul", [ctx.op("MatMul", [q, ctx.op("Transpose", [k], perm=[0, 1, 3, 2])]), scale])
    taps["scaled"] = scores
    if softcap > 0:
        cap = ctx.const(softcap)
        scores = ctx.op("Mul", [ctx.op("Tanh", [ctx.op("Div", [scores, cap])]), cap])
    taps["capped"] = scores
    biases = [b for b in biases if b]
    if biases:
        total = biases[0]
        for b in biases[1:]:
            total = ctx.op("Add", [total, b])
        scores = ctx.op("Add", [scores, total])
    taps["biased"] = scores
    return ctx.op("Softmax", [scores], axis=-1) if not sink else _sunk_softmax(ctx, scores, sink)


def _sunk_softmax(ctx, scores: str, sink: str) -> str:
    """Softmax over the keys and one more logit per head (`sink`), that column then dropped."""
    col = ctx.op("Reshape", [sink, ctx.const([1, -1, 1, 1], np.int64)])
    dims = ctx.op("Concat", [ctx.op("Shape", [scores], end=3), ctx.const([1], np.int64)], axis=0)
    wide = ctx.op("Concat", [scores, ctx.op("Expand", [col, dims])], axis=-1)
    probs = ctx.op("Softmax", [wide], axis=-1)
    return ctx.op("Slice", [probs, ctx.const([0], np.int64), ctx.const([-1], np.int64), ctx.const([-1], np.int64)])


def _filter(ctx) -> float:
    return float(ctx.attrs.get("mask_filter_value", -10000.0))


def _keep_to_bias(ctx, keep: str) -> str:
    return ctx.op("Where", [keep, ctx.const(0.0), ctx.const(_filter(ctx))])


def positions_of(ctx, length: str, elem=TensorProto.INT32) -> str:
    """0 .. n-1 for `length` a [1] int64 tensor (host shape math)."""
    dt = helper.tensor_dtype_to_np_dtype(elem)
    n = ctx.op("Cast", [ctx.op("Squeeze", [length, ctx.const([0], np.int64)])], to=elem)
    return ctx.op("Range", [ctx.const(0, dt), n, ctx.const(1, dt)])


def mask_bias(ctx, mask: str, batch, keys, what: str, starts: bool = True, dims=(None, None)) -> str:
    """The additive bias of a mask over the keys of the scores [B, N, S, T]: lengths [B] (keys
    at or past the length masked) or, with `starts`, [2B] (ends, then starts: keys before the
    start masked too), a raw mask [B, T] or [B, S, T] (a key kept where the mask is > 0).
    `batch()`, `keys()`: B and T as [1] int64 tensors; `dims`: their symbols (ctx.symbol).
    The layers of a model share one bias: a raw mask's depends on the mask alone, lengths' on
    the mask and B and T."""
    rank = ctx.rank(mask)
    key = ("mask_bias", mask, _filter(ctx), ctx.float_type, starts, rank) + (tuple(dims) if rank == 1 else ())
    return ctx.shared(key, lambda: _mask_bias(ctx, mask, rank, batch, keys, what, starts))


def _mask_bias(ctx, mask: str, rank, batch, keys, what: str, starts: bool) -> str:
    if rank == 1:
        batch, keys = batch(), keys()
        m = ctx.op("Cast", [mask], to=TensorProto.INT32)
        ends = ctx.op("Slice", [m, ctx.const([0], np.int64), batch, ctx.const([0], np.int64)])
        pos, col = positions_of(ctx, keys), ctx.const([1], np.int64)
        keep = ctx.op("Less", [pos, ctx.op("Unsqueeze", [ends, col])])
        if starts:
            # the starts of a [2B] mask; zeros for a [B] one (its second half is empty)
            rest = ctx.op("Slice", [m, batch, ctx.const([INT64_MAX], np.int64), ctx.const([0], np.int64)])
            zeros = ctx.op("ConstantOfShape", [batch], value=numpy_helper.from_array(np.array([0], np.int32)))
            first = ctx.op("Slice", [ctx.op("Concat", [rest, zeros], axis=0), ctx.const([0], np.int64), batch,
                                     ctx.const([0], np.int64)])
            keep = ctx.op("And", [keep, ctx.op("GreaterOrEqual", [pos, ctx.op("Unsqueeze", [first, col])])])
        return ctx.op("Unsqueeze", [_keep_to_bias(ctx, keep), ctx.const([1, 2], np.int64)])
    if rank in (2, 3):
        keep = ctx.op("Greater", [mask, ctx.const(0, _np_type(ctx, mask))])
        axes = [1, 2] if rank == 2 else [1]
        return ctx.op("Unsqueeze", [_keep_to_bias(ctx, keep), ctx.const(axes, np.int64)])
    if rank is None:
        ctx.fail(f"the rank of {what} {mask!r} is not known at load (1-D lengths, a 2-D or 3-D "
                 "mask are supported)")
    ctx.fail(f"{what} of rank {rank} is not supported (1-D lengths, a 2-D or 3-D mask are)")


def causal_bias(ctx, queries, keys, dims=(None, None)) -> str:
    """The unidirectional bias [S, T]: query i (at position T - S + i, after the past) sees
    keys up to its own position. `queries()`, `keys()`: S and T as [1] int64 tensors; `dims`:
    their symbols (layers with the same share one bias)."""
    return ctx.shared(("causal_bias", _filter(ctx), ctx.float_type) + tuple(dims),
                      lambda: _causal_bias(ctx, queries(), keys()))


def _causal_bias(ctx, queries: str, keys: str) -> str:
    past = ctx.op("Cast", [ctx.op("Sub", [keys, queries])], to=TensorProto.INT32)
    rows = ctx.op("Add", [ctx.op("Unsqueeze", [positions_of(ctx, queries), ctx.const([1], np.int64)]), past])
    return ctx.op("Where", [ctx.op("Greater", [positions_of(ctx, keys), rows]), ctx.const(_filter(ctx)),
                            ctx.const(0.0)])


def _np_type(ctx, tensor: str):
    return helper.tensor_dtype_to_np_dtype(ctx.elem_type(tensor))
