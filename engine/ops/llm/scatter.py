"""TensorScatter (ONNX 24): the update written into the cache along `axis` from each batch
row's write index (0 without write_indices), the index taken modulo the cache's length in
"circular" mode; one ScatterElements over the cache with the update's positions. The cache is
copied into the present (not updated in place as a Concat-grown cache is)."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from engine.ops.ms.heads import positions_of
from engine.ops.registry import register_expansion

I64 = TensorProto.INT64


@register_expansion("", "TensorScatter", checked=24)
def tensor_scatter(node, ctx):
    past, update, write = ctx.input(0), ctx.input(1), ctx.input(2)
    rank = ctx.rank(past)
    if rank is None:
        ctx.fail("a cache whose rank is not known at load")
    axis = int(ctx.attrs.get("axis", -2))
    axis = axis + rank if axis < 0 else axis
    if not 0 < axis < rank:
        ctx.fail(f"axis {ctx.attrs.get('axis', -2)} (the batch axis or out of rank {rank})")
    mode = ctx.attrs.get("mode", b"linear")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("linear", "circular"):
        ctx.fail(f"mode {mode!r} (linear or circular)")
    # position s of the update along `axis`, shaped to broadcast against the update
    along = [1] * rank
    along[axis] = -1
    idx = ctx.op("Reshape", [positions_of(ctx, ctx.dim(update, axis), I64), ctx.const(along, np.int64)])
    if write:
        rows = [-1] + [1] * (rank - 1)
        idx = ctx.op("Add", [idx, ctx.op("Reshape", [ctx.op("Cast", [write], to=I64), ctx.const(rows, np.int64)])])
    if mode == "circular":
        idx = ctx.op("Mod", [idx, ctx.dim(past, axis)])
    idx = ctx.op("Expand", [idx, ctx.op("Shape", [update])])
    ctx.op("ScatterElements", [past, idx, update], outputs=[ctx.output(0)], axis=axis)
    dims = ctx.symbols(past)
    if dims is not None:
        ctx.declare(ctx.output(0), ctx.elem_type(past), dims)
