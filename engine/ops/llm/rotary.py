"""RotaryEmbedding (ONNX 23): each head's first rotary_embedding_dim values (all by default)
rotated by the cos / sin cache rows of their positions, halves or interleaved pairs, the rest
copied (the rotation of engine/ops/ms/rotary.py). The caches are [max position, rot / 2] read
at position_ids [B, S], or without position_ids already [B, S, rot / 2]."""
from __future__ import annotations

import numpy as np

from engine.ops.ms.rotary import rotate
from engine.ops.registry import register_expansion


def rotary_width(ctx, x: str, cos_cache: str, heads: int) -> int:
    """The rotated width: rotary_embedding_dim, else the head size (the cache's width * 2
    when the head's is not known at load)."""
    rot = int(ctx.attrs.get("rotary_embedding_dim", 0))
    if rot:
        return rot
    cache, shape = ctx.shape(cos_cache), ctx.shape(x)
    if cache and cache[-1]:
        return 2 * cache[-1]
    if shape and shape[-1]:
        return shape[-1] if len(shape) == 4 else shape[-1] // heads
    ctx.fail("rotary_embedding_dim is 0 and neither the head size nor the cache's width is known at load")


@register_expansion("", "RotaryEmbedding", checked=23)
def rotary_embedding(node, ctx):
    """X [B, N, S, H], or [B, S, N*H] with num_heads."""
    x, cos_cache, sin_cache, pos = (ctx.input(k) for k in range(4))
    rank, heads = ctx.rank(x), int(ctx.attrs.get("num_heads", 0))
    if rank not in (3, 4):
        ctx.fail(f"input of rank {rank} (3 or 4 is supported)")
    if rank == 3 and not heads:
        ctx.fail("a 3-D input needs num_heads")
    rot = rotary_width(ctx, x, cos_cache, heads)
    cos, sin = (ctx.op("Gather", [c, pos]) for c in (cos_cache, sin_cache)) if pos else (cos_cache, sin_cache)
    inter = bool(ctx.attrs.get("interleaved", 0))
    # cos, sin [B, S, rot / 2] against the heads' [B, N, S, rot / 2] or [B, S, N, rot / 2]
    axis = ctx.const([1 if rank == 4 else 2], np.int64)
    cos, sin = (ctx.op("Unsqueeze", [c, axis]) for c in (cos, sin))
    if rank == 4:
        rotate(ctx, x, cos, sin, rot, inter, ctx.output(0))
    else:
        split = ctx.op("Reshape", [x, ctx.const([0, 0, heads, -1], np.int64)])
        y = ctx.fresh("rotated")
        rotate(ctx, split, cos, sin, rot, inter, y)
        ctx.op("Reshape", [y, ctx.const([0, 0, -1], np.int64)], outputs=[ctx.output(0)])
    dims = ctx.symbols(x)
    if dims is not None:
        ctx.declare(ctx.output(0), ctx.elem_type(x), dims)
