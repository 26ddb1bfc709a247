"""DepthToSpace and SpaceToDepth (DCR and CRD; SpaceToDepth's `mode` is opset 28's): pure data
movement, each one strided copy (cl/movement.cl) over the output viewed as 6 dims, so f16 moves as bits like any copy."""
from __future__ import annotations

from engine.layout import Layout
from engine.ops.registry import register
from engine.ops.common import ShapeInferenceError, contiguous_strides
from engine.ops.movement import copy_call


def _mode(node):
    mode = node.attrs.get("mode", "DCR")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("DCR", "CRD"):
        raise ShapeInferenceError(f"{node.op} {node.name}: unknown mode {mode!r}")
    return mode


def _check(node, ins):
    x = ins[0]
    b = int(node.attrs.get("blocksize", 0))
    if x.rank != 4:
        raise ShapeInferenceError(f"{node.op} {node.name}: input {x} must be 4-D (NCHW)")
    if b < 1:
        raise ShapeInferenceError(f"{node.op} {node.name}: blocksize must be >= 1, got {b}")
    return (*x.shape, b)


def _d2s_kernels(node, ins, outs, deps):
    N, C, H, W, b = _check(node, ins)
    c = C // (b * b)
    hw = H * W
    # output as [N, c, H, b (i), W, b (j)]; input channel (i * b + j) * c + k (DCR) or
    # k * b * b + i * b + j (CRD)
    if _mode(node) == "CRD":
        src = [C * hw, b * b * hw, W, b * hw, 1, hw]
    else:
        src = [C * hw, hw, W, b * c * hw, 1, c * hw]
    view = (N, c, H, b, W, b)
    return [copy_call(node, ins[0].dtype, view, src, 0, contiguous_strides(view), 0)]


# checked 28: DepthToSpace-28 changes nothing
@register("DepthToSpace", checked=28, kernels=_d2s_kernels, f16=True)
def _depth_to_space(node, ins, deps):
    N, C, H, W, b = _check(node, ins)
    _mode(node)
    if C % (b * b):
        raise ShapeInferenceError(f"DepthToSpace {node.name}: channels {C} not divisible by "
                                  f"blocksize^2 = {b * b}")
    return [Layout((N, C // (b * b), H * b, W * b), ins[0].dtype)]


def _s2d_kernels(node, ins, outs, deps):
    N, C, H, W, b = _check(node, ins)
    if _mode(node) == "CRD":
        # output as [N, C, b (i), b (j), H/b, W/b]: Y[n, c*b*b + i*b + j, h, w] = X[n, c, h*b + i, w*b + j]
        view = (N, C, b, b, H // b, W // b)
        src = [C * H * W, H * W, W, 1, b * W, b]
    else:
        # output as [N, b (i), b (j), C, H/b, W/b]: Y[n, (i*b + j)*C + c, h, w] = X[n, c, h*b + i, w*b + j]
        view = (N, b, b, C, H // b, W // b)
        src = [C * H * W, W, 1, H * W, b * W, b]
    return [copy_call(node, ins[0].dtype, view, src, 0, contiguous_strides(view), 0)]


# checked 28: SpaceToDepth-28 adds `mode` (DCR/CRD)
@register("SpaceToDepth", checked=28, kernels=_s2d_kernels, f16=True)
def _space_to_depth(node, ins, deps):
    N, C, H, W, b = _check(node, ins)
    _mode(node)
    if H % b or W % b:
        raise ShapeInferenceError(f"SpaceToDepth {node.name}: spatial {H}x{W} not divisible by "
                                  f"blocksize {b}")
    return [Layout((N, C * b * b, H // b, W // b), ins[0].dtype)]
