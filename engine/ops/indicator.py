"""Tensors of ones at chosen positions (cl/indicator.cl): EyeLike (a diagonal, `k` off the main
one) and OneHot (depth a memory dep: it sizes the output)."""
from __future__ import annotations

from engine.kernels import KernelCall
from engine.layout import Layout, bits_type, cl_type, type_jit
from engine.ops.registry import register
from engine.ops.common import ShapeInferenceError, norm_axis, onnx_dtype


def _eye_kernels(node, ins, outs, deps):
    y = outs[0]
    jit = (*type_jit("T", y.dtype), ("EYE_LIKE", 1), ("IMPL_TAG", "EyeLike"))
    # the input is never read: only its shape (the output's) matters
    return [KernelCall("indicator", "eye_like", jit, (("out", 0),), params=(int(node.attrs.get("k", 0)),),
                       gws=(max(y.count, 1),))]


@register("EyeLike", checked=22, kernels=_eye_kernels, f16=True)
def _eye_like(node, ins, deps):
    x = ins[0]
    if x.rank != 2:
        raise ShapeInferenceError(f"EyeLike {node.name}: input {x} must be 2-D")
    dt = onnx_dtype(node.attrs["dtype"]) if node.attrs.get("dtype") is not None else x.dtype
    return [Layout(x.shape, dt)]


def _one_hot_geometry(node, ins, deps):
    idx, values = ins[0], ins[2]
    d = deps.get(1)
    if d is None or d.size != 1:
        raise ShapeInferenceError(f"OneHot {node.name}: depth must be a 1-element tensor")
    depth = int(d.reshape(-1)[0])
    if depth < 1:
        raise ShapeInferenceError(f"OneHot {node.name}: depth {depth} must be positive")
    if values.count != 2:
        raise ShapeInferenceError(f"OneHot {node.name}: values {values} must hold [off, on]")
    axis = norm_axis(int(node.attrs.get("axis", -1)), idx.rank + 1)
    inner = 1
    for n in idx.shape[axis:]:
        inner *= n
    return depth, axis, inner


def _one_hot_kernels(node, ins, outs, deps):
    depth, _, inner = _one_hot_geometry(node, ins, deps)
    jit = (("T", bits_type(ins[2].dtype)), ("TI", cl_type(ins[0].dtype)), ("ONE_HOT", 1),
           ("IMPL_TAG", "OneHot"))
    return [KernelCall("indicator", "one_hot", jit, (("in", 0), ("in", 2), ("out", 0)),
                       params=(depth, inner), gws=(max(outs[0].count, 1),))]


# OneHot-28 added bfloat16 values only
@register("OneHot", checked=28, kernels=_one_hot_kernels, shape_deps=(1,), f16=True)
def _one_hot(node, ins, deps):
    if ins[0].dtype in ("f16", "bool"):
        raise ShapeInferenceError(f"OneHot {node.name}: indices of type {ins[0].dtype} are not supported")
    depth, axis, _ = _one_hot_geometry(node, ins, deps)
    s = list(ins[0].shape)
    s.insert(axis, depth)
    return [Layout(tuple(s), ins[2].dtype)]
