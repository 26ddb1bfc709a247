"""TopK on the device (cl/topk.cl). K is an input (opset 10+; the opset 1 attribute too): a
memory dep, so its value decides the output shape, read from the device (8 bytes) only when it
was computed there. The op is marked `dynamic_output` (the GPU plugin's preprocessing.md):
update_shape never skips it, since the same input layouts can come with a new K."""
from __future__ import annotations

from engine.kernels import KernelCall
from engine.layout import Layout, type_jit
from engine.ops.registry import register
from engine.ops.common import ShapeInferenceError, norm_axis


# the kernel compares in the element type itself (T_C; float for half): unsigned types order as
# unsigned
DTYPES = ("f32", "f16", "i64", "i32", "i16", "i8", "u64", "u8")


def _geometry(node, ins, deps):
    name = f"TopK {node.name}"
    x = ins[0]
    if x.rank == 0:
        raise ShapeInferenceError(f"{name}: scalar input")
    if x.dtype not in DTYPES:
        raise ShapeInferenceError(f"{name}: element type {x.dtype} is not supported")
    axis = norm_axis(int(node.attrs.get("axis", -1)), x.rank)
    if "k" in node.attrs:
        k = int(node.attrs["k"])
    else:
        if deps.get(1) is None or deps[1].size != 1:
            raise ShapeInferenceError(f"{name}: K must be a 1-element tensor")
        k = int(deps[1].reshape(-1)[0])
    if not 0 <= k <= x.shape[axis]:
        raise ShapeInferenceError(f"{name}: K={k} outside 0..{x.shape[axis]} (input {x}, axis {axis})")
    inner = 1
    for d in x.shape[axis + 1:]:
        inner *= d
    return axis, k, inner


# Items per work-group along a row (the tile of the row held in local memory).
WG = 64


def _kernels(node, ins, outs, deps):
    axis, k, inner = _geometry(node, ins, deps)
    a = ins[0].shape[axis]
    rows = ins[0].count // a if a else 0
    jit = (*type_jit("T", ins[0].dtype), ("LARGEST", int(node.attrs.get("largest", 1))),
           ("WG", WG), ("IMPL_TAG", "TopK"))
    return [KernelCall("topk", "topk", jit, (("in", 0), ("out", 0), ("out", 1)),
                       params=(a, inner, k), gws=(max(a, 1), max(rows, 1)), lws=(WG, 1))]


# checked 11: TopK-24 (types) is not checked yet (a model that picks it runs with the warning)
@register("TopK", checked=11, kernels=_kernels, shape_deps=(1,), dynamic_output=True, f16=True)
def _topk(node, ins, deps):
    axis, k, _ = _geometry(node, ins, deps)
    shape = tuple(k if d == axis else n for d, n in enumerate(ins[0].shape))
    return [Layout(shape, ins[0].dtype), Layout(shape, "i64")]
