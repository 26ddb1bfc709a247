"""FusedMatMul (com.microsoft, what onnxruntime's own graph optimizer writes for a MatMul with
a transposed operand and a scale): alpha * op(A) @ op(B), op a swap of the last two dims
where transA / transB say; Transposes, A scaled, a MatMul, which the attention fusion takes as
it takes torch.export's attention."""
from __future__ import annotations

import numpy as np

from engine.ops.ms.domain import MS
from engine.ops.registry import register_expansion


def _swapped(ctx, x: str, what: str) -> str:
    rank = ctx.rank(x)
    if rank is None or rank < 2:
        ctx.fail(f"{what} of rank {rank} cannot be transposed (rank known at load, 2 or more)")
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    return ctx.op("Transpose", [x], perm=perm)


@register_expansion(MS, "FusedMatMul")
def fused_matmul(node, ctx):
    """alpha * op(A) @ op(B) (transBatchA / transBatchB are refused)."""
    if int(ctx.attrs.get("transBatchA", 0)) or int(ctx.attrs.get("transBatchB", 0)):
        ctx.fail("transBatchA / transBatchB are not supported")
    a, b = ctx.input(0), ctx.input(1)
    if int(ctx.attrs.get("transA", 0)):
        a = _swapped(ctx, a, "A")
    if int(ctx.attrs.get("transB", 0)):
        b = _swapped(ctx, b, "B")
    alpha = float(ctx.attrs.get("alpha", 1.0))
    if alpha != 1.0:
        # on A, as torch.export scales q: the attention fusion takes it as its scale, and the
        # Softmax's prologue then starts at the MatMul (its scores), not at a Mul after it
        a = ctx.op("Mul", [a, ctx.const(alpha)])
    ctx.op("MatMul", [a, b], outputs=[ctx.output(0)])
