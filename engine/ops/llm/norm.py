"""RMSNormalization (ONNX 23): x / sqrt(mean(x^2 over axis..last) + epsilon) * scale, the
normalisation in stash_type's precision (float32 by default)."""
from __future__ import annotations

from onnx import TensorProto

from engine.ops.ms.norm import declare_like, rms
from engine.ops.registry import register_expansion


@register_expansion("", "RMSNormalization", checked=23)
def rms_normalization(node, ctx):
    x = ctx.input(0)
    stash = int(ctx.attrs.get("stash_type", TensorProto.FLOAT))
    if stash not in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16):
        ctx.fail(f"stash_type {stash} is not supported (float, float16 or double)")
    rms(ctx, x, ctx.input(1), int(ctx.attrs.get("axis", -1)), float(ctx.attrs.get("epsilon", 1e-5)),
        ctx.output(0), stash=stash)
    declare_like(ctx, x, (0,))
