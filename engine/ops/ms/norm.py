"""The normalisations (com.microsoft): EmbedLayerNormalization, SkipLayerNormalization and
the RMS forms SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization.

The layer norms become ONNX LayerNormalization over the summed input (its kernel; the sums
fuse into the MatMul before them); the RMS norms x / sqrt(mean(x^2) + epsilon) * scale as
onnxruntime computes them."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from engine.ops.ms.domain import MS
from engine.ops.registry import register_expansion

# onnxruntime's default epsilons: the fused layer norms', SimplifiedLayerNormalization's
EPSILON = 1e-12
RMS_EPSILON = 1e-5


def _skip_sum(ctx) -> str:
    """input + skip (+ bias), in onnxruntime's order; written to output 3 when it is asked for."""
    s = ctx.op("Add", [ctx.input(0), ctx.input(1)])
    bias = ctx.input(4) if ctx.proto.op_type == "SkipLayerNormalization" else ctx.input(3)
    if bias:
        s = ctx.op("Add", [s, bias])
    if ctx.output(3):
        s = ctx.op("Identity", [s], outputs=[ctx.output(3)])
    return s


@register_expansion(MS, "EmbedLayerNormalization")
def embed_layer_norm(node, ctx):
    """LayerNorm(word[ids] + position[position_ids or 0..S-1] + segment[segment_ids]); output 1
    the mask index: per row the count of mask entries equal to 1 (zeros without a mask);
    output 2 the sum before the norm."""
    ids, seg, word, pos, seg_emb, gamma, beta, mask, pos_ids = (ctx.input(k) for k in range(9))
    if pos_ids:
        p = ctx.op("Gather", [pos, pos_ids])
    else:   # positions 0 .. S-1: the table's first S rows, broadcast over the batch
        p = ctx.op("Slice", [pos, ctx.const([0], np.int64), ctx.dim(ids, 1), ctx.const([0], np.int64)])
    s = ctx.op("Add", [ctx.op("Gather", [word, ids]), p])
    if seg and seg_emb:
        s = ctx.op("Add", [s, ctx.op("Gather", [seg_emb, seg])])
    if ctx.output(2):
        s = ctx.op("Identity", [s], outputs=[ctx.output(2)])
    eps = float(ctx.attrs.get("epsilon", EPSILON))
    ctx.op("LayerNormalization", [s, gamma, beta], outputs=[ctx.output(0)], axis=-1, epsilon=eps)
    width = (ctx.shape(word) or (None, None))[-1]
    for o in (0, 2):
        ctx.declare(ctx.output(o), ctx.elem_type(word), ctx.lead(ids, 2) + (width,))
    if ctx.output(1):
        if mask:
            ones = ctx.op("Cast", [ctx.op("Equal", [mask, ctx.const(1, np.int32)])], to=TensorProto.INT32)
            ctx.op("ReduceSum", [ones, ctx.const([1], np.int64)], outputs=[ctx.output(1)], keepdims=0)
        else:
            ctx.op("ConstantOfShape", [ctx.dim(ids, 0)], outputs=[ctx.output(1)],
                   value=numpy_helper.from_array(np.array([0], np.int32)))
        ctx.declare(ctx.output(1), TensorProto.INT32, ctx.lead(ids, 1))


@register_expansion(MS, "SkipLayerNormalization")
def skip_layer_norm(node, ctx):
    """LayerNorm(input + skip + bias) over the last dim; outputs 1 and 2 are its mean and
    inverse standard deviation, 3 the sum."""
    s = _skip_sum(ctx)
    eps = float(ctx.attrs.get("epsilon", EPSILON))
    ctx.op("LayerNormalization", [s, ctx.input(2), ctx.input(3)],
           outputs=[ctx.output(0), ctx.output(1), ctx.output(2)], axis=-1, epsilon=eps)
    declare_like(ctx, ctx.input(0), (0, 3))


def declare_like(ctx, x, outputs):
    """Outputs `outputs` have x's type and dims."""
    dims = ctx.symbols(x)
    if dims is not None:
        for k in outputs:
            ctx.declare(ctx.output(k), ctx.elem_type(x), dims)


def rms(ctx, x, scale, axis: int, eps: float, out: str, inv_out: str = "", stash: int | None = None) -> None:
    """x / sqrt(mean(x^2 over axis..last) + epsilon) * scale; `inv_out` gets 1 / that root.
    `stash`: the element type the normalisation runs in (x cast to it, the result back)."""
    rank = ctx.rank(x)
    if axis < 0:
        if rank is None:
            if axis != -1:
                ctx.fail(f"axis {axis} of an input whose rank is unknown at load")
            axes = [-1]
        else:
            axes = list(range(axis + rank, rank))
    else:
        axes = list(range(axis, rank)) if rank is not None else ctx.fail(
            f"axis {axis} of an input whose rank is unknown at load")
    et = ctx.elem_type(x)
    cast = stash is not None and stash != et
    xs = ctx.op("Cast", [x], to=stash) if cast else x
    ms = ctx.op("ReduceMean", [ctx.op("Mul", [xs, xs]), ctx.const(axes, np.int64)], keepdims=1)
    eps_t = ctx.const(eps, helper.tensor_dtype_to_np_dtype(stash)) if cast else ctx.const(eps)
    root = ctx.op("Sqrt", [ctx.op("Add", [ms, eps_t])])
    normed = ctx.op("Div", [xs, root])
    if cast:
        normed = ctx.op("Cast", [normed], to=et)
    ctx.op("Mul", [normed, scale], outputs=[out])
    if inv_out:
        ctx.op("Reciprocal", [root], outputs=[inv_out])


# onnxruntime registers this one in the ONNX domain (its optimizer emits it there)
@register_expansion("", "SimplifiedLayerNormalization")
def simplified_layer_norm(node, ctx):
    """RMS norm of X over dims `axis`.. (default -1), times scale; output 1 the inverse root."""
    rms(ctx, ctx.input(0), ctx.input(1), int(ctx.attrs.get("axis", -1)),
         float(ctx.attrs.get("epsilon", RMS_EPSILON)), ctx.output(0), ctx.output(1))
    declare_like(ctx, ctx.input(0), (0,))


@register_expansion(MS, "SkipSimplifiedLayerNormalization")
def skip_simplified_layer_norm(node, ctx):
    """RMS norm of input + skip + bias over the last dim, times gamma; output 2 the inverse
    root, 3 the sum (output 1, the mean, is not computed by the op)."""
    if ctx.output(1):
        ctx.fail("output 1 (mean) is not computed by this op")
    s = _skip_sum(ctx)
    rms(ctx, s, ctx.input(2), -1, float(ctx.attrs.get("epsilon", EPSILON)), ctx.output(0), ctx.output(2))
    declare_like(ctx, ctx.input(0), (0, 3))
