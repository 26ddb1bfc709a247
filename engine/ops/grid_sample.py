"""GridSample on the device (cl/grid_sample.cl): 1 to 3 spatial dims (X of rank 3 to 5), modes
nearest, linear and cubic (GridSample-16's bilinear/bicubic names too; cubic needs 2 spatial
dims, as ONNX says), padding zeros, border and reflection, align_corners. The spatial-transformer
and deformable-attention sampling step of detection and flow models."""
from __future__ import annotations

from engine.kernels import KernelCall
from engine.layout import Layout, type_jit
from engine.ops.registry import register
from engine.ops.activation import FLOATS
from engine.ops.common import ShapeInferenceError

MODES = {"nearest": 0, "linear": 1, "bilinear": 1, "cubic": 2, "bicubic": 2}
PADS = {"zeros": 0, "border": 1, "reflection": 2}


def _attrs(node, x):
    mode = node.attrs.get("mode", "linear" if node.opset >= 20 else "bilinear")
    pad = node.attrs.get("padding_mode", "zeros")
    if mode not in MODES or pad not in PADS:
        raise ShapeInferenceError(f"GridSample {node.name}: mode {mode!r} / padding_mode {pad!r} "
                                  "not supported")
    if MODES[mode] == 2 and x.rank != 4:
        raise ShapeInferenceError(f"GridSample {node.name}: cubic needs a 4-D input, got {x}")
    return MODES[mode], PADS[pad], int(node.attrs.get("align_corners", 0))


def _kernels(node, ins, outs, deps):
    x, grid, y = ins[0], ins[1], outs[0]
    mode, pad, align = _attrs(node, x)
    s = x.rank - 2
    points = y.count // max(x.shape[0] * x.shape[1], 1) if y.count else 0
    jit = (*type_jit("T", x.dtype), *type_jit("TG", grid.dtype),
           ("TC", "double" if "f64" in (x.dtype, grid.dtype) else "float"),
           ("GS_MODE", mode), ("GS_PAD", pad), ("ALIGN", align), ("IMPL_TAG", "GridSample"))
    return [KernelCall("grid_sample", "grid_sample", jit, (("in", 0), ("in", 1), ("out", 0)),
                       params=(s, x.shape[1], points), gws=(max(y.count, 1),))]


# GridSample-20 took N-D inputs and renamed the modes; 22 added types
@register("GridSample", checked=22, kernels=_kernels, f16=True)
def _grid_sample(node, ins, deps):
    x, grid = ins[0], ins[1]
    if x.dtype not in FLOATS or grid.dtype not in FLOATS:
        raise ShapeInferenceError(f"GridSample {node.name}: X {x} and Grid {grid} must be float tensors")
    if not 3 <= x.rank <= 5 or grid.rank != x.rank or grid.shape[-1] != x.rank - 2 \
            or grid.shape[0] != x.shape[0]:
        raise ShapeInferenceError(f"GridSample {node.name}: X {x} and Grid {grid} do not fit "
                                  "([N, C, 1 to 3 spatial dims] and [N, output dims..., spatial rank])")
    _attrs(node, x)
    return [Layout(tuple(x.shape[:2]) + tuple(grid.shape[1:-1]), x.dtype)]
