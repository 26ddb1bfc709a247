"""RotaryEmbedding (com.microsoft): each head's first rotary_dim values rotated by the cos and
sin cache rows of their positions, the rest copied, as onnxruntime's kernel does: halves
(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), or with `interleaved` the pairs (x[2i],
x[2i+1]) rotated the same way."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from engine.ops.ms.domain import MS
from engine.ops.ms.heads import INT64_MAX, positions_of
from engine.ops.registry import register_expansion


def _slice(ctx, x: str, start: int, end: int, axis: int = -1) -> str:
    return ctx.op("Slice", [x, ctx.const([start], np.int64), ctx.const([end], np.int64), ctx.const([axis], np.int64)])


def rotate(ctx, x: str, cos: str, sin: str, rot: int, interleaved: bool, out: str) -> None:
    """Rotate the first `rot` values of x's last dim by cos / sin (broadcasting against x's
    [..., rot / 2]); the values past `rot` are copied. Writes `out`."""
    half = rot // 2
    head = _slice(ctx, x, 0, rot)
    if interleaved:
        pairs = ctx.op("Reshape", [head, ctx.const([0, 0, 0, half, 2], np.int64)])
        a, b = (ctx.op("Squeeze", [_slice(ctx, pairs, k, k + 1), ctx.const([-1], np.int64)]) for k in (0, 1))
    else:
        a, b = _slice(ctx, head, 0, half), _slice(ctx, head, half, rot)
    ra = ctx.op("Sub", [ctx.op("Mul", [a, cos]), ctx.op("Mul", [b, sin])])
    rb = ctx.op("Add", [ctx.op("Mul", [b, cos]), ctx.op("Mul", [a, sin])])
    if interleaved:
        last = ctx.const([-1], np.int64)
        both = ctx.op("Concat", [ctx.op("Unsqueeze", [ra, last]), ctx.op("Unsqueeze", [rb, last])], axis=-1)
        parts = [ctx.op("Reshape", [both, ctx.const([0, 0, 0, rot], np.int64)])]
    else:
        parts = [ra, rb]
    parts.append(_slice(ctx, x, rot, INT64_MAX))     # empty when the whole head rotates
    ctx.op("Concat", parts, outputs=[out], axis=-1)


@register_expansion(MS, "RotaryEmbedding")
def rotary_embedding(node, ctx):
    """input [B, S, N*H] (num_heads, or heads of rotary_embedding_dim) or [B, N, S, H];
    position_ids [B, S], or [1]: the first position, the others following it; cos_cache and
    sin_cache [max positions, rotary_dim / 2]."""
    x, pos, cos_cache, sin_cache = (ctx.input(k) for k in range(4))
    if int(ctx.attrs.get("is_packed_batching", 0)):
        ctx.fail("is_packed_batching=1 is not supported")
    if float(ctx.attrs.get("scale", 1.0)) != 1.0:
        ctx.fail("scale other than 1 is not supported")
    cache = ctx.shape(cos_cache)
    rot = int(ctx.attrs.get("rotary_embedding_dim", 0)) or (
        2 * cache[1] if cache is not None and len(cache) == 2 and cache[1] else None)
    if rot is None:
        ctx.fail("rotary_embedding_dim is 0 and the cos cache's dims are not known at load")
    rank = ctx.rank(x)
    if rank not in (3, 4):
        ctx.fail(f"input of rank {rank} (3 or 4 is supported)")
    if ctx.rank(pos) == 1:      # the first position: positions start + 0 .. S-1
        seq = ctx.dim(x, 1 if rank == 3 else 2)
        ids = ctx.op("Add", [positions_of(ctx, seq, TensorProto.INT64), ctx.op("Cast", [pos], to=TensorProto.INT64)])
        ids = ctx.op("Unsqueeze", [ids, ctx.const([0], np.int64)])      # [1, S], as [B, S]
    else:
        ids = pos
    cos, sin = (ctx.op("Gather", [c, ids]) for c in (cos_cache, sin_cache))   # [B|1, S, rot/2]
    if rank == 4:   # [B, N, S, H]: one cos row per (b, s), the same for every head
        axis = ctx.const([1], np.int64)
        cos, sin = (ctx.op("Unsqueeze", [c, axis]) for c in (cos, sin))
        rotate(ctx, x, cos, sin, rot, bool(ctx.attrs.get("interleaved", 0)), ctx.output(0))
    else:           # [B, S, N*H]: heads split, [B, S, N, H], cos per (b, s) over the heads
        heads = int(ctx.attrs.get("num_heads", 0))
        split = ctx.op("Reshape", [x, ctx.const([0, 0, heads, -1] if heads else [0, 0, -1, rot], np.int64)])
        axis = ctx.const([2], np.int64)
        cos, sin = (ctx.op("Unsqueeze", [c, axis]) for c in (cos, sin))
        y = ctx.fresh("rotated")
        rotate(ctx, split, cos, sin, rot, bool(ctx.attrs.get("interleaved", 0)), y)
        ctx.op("Reshape", [y, ctx.const([0, 0, -1], np.int64)], outputs=[ctx.output(0)])
    dims = ctx.symbols(x)
    if dims is not None:
        ctx.declare(ctx.output(0), ctx.elem_type(x), dims)
