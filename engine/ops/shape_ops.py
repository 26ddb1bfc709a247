"""Shape, Size, ConstantOfShape and Constant. Shape always runs on the host (its value is the
input layout, no device round trip); Size and ConstantOfShape run on the device unless they are
shape math."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from onnx import numpy_helper

from engine.layout import Layout, dtype_from_numpy
from engine.ops.registry import register
from engine.ops.common import ShapeInferenceError, eltwise_call


@register("Shape", checked=25, host_ok=True)
def _shape(node, ins, deps):
    r = ins[0].rank
    start, end = node.attrs.get("start", 0), node.attrs.get("end", r)
    n = len(range(r)[slice(start, end)])
    return [Layout((n,), "i64")]


def shape_value(node, in_shape) -> np.ndarray:
    r = len(in_shape)
    start, end = node.attrs.get("start", 0), node.attrs.get("end", r)
    return np.asarray(in_shape[slice(start, end)], dtype=np.int64)


def _size_kernels(node, ins, outs, deps):
    # the element count is a kernel parameter, stored by the eltwise kernel with no inputs
    call = eltwise_call(node, [], outs[0], "(TOUT)PARAM(1)", inputs=())
    return [replace(call, params=call.params + (ins[0].count,))]


@register("Size", checked=25, kernels=_size_kernels, host_ok=True, f16=True)
def _size(node, ins, deps):    # f16: the kernel reads no element of the input
    return [Layout((), "i64")]


def fill_value(node) -> np.ndarray:
    v = node.attrs.get("value")
    return np.zeros(1, np.float32) if v is None else numpy_helper.to_array(v).reshape(-1)


def _cos_kernels(node, ins, outs, deps):
    v = fill_value(node)[0]
    lit = repr(float(v)) + "f" if outs[0].dtype in ("f32", "f16") else str(int(v))
    return [eltwise_call(node, [], outs[0], f"(TOUT){lit}", inputs=())]


@register("ConstantOfShape", checked=25, kernels=_cos_kernels, shape_deps=(0,), host_ok=True, f16=True)
def _constant_of_shape(node, ins, deps):
    shape = tuple(int(v) for v in deps[0])
    if any(d < 0 for d in shape):
        raise ShapeInferenceError(f"shape {list(shape)} has a negative dim")
    return [Layout(shape, dtype_from_numpy(fill_value(node).dtype))]


@register("Constant", checked=25)
def _constant(node, ins, deps):  # folded at import: never executed
    raise AssertionError("Constant nodes are folded when the program is built")
