"""Compress on the device (cl/compress.cl). The condition is a memory dep: the number of true
values sizes the output, so the op is `dynamic_output` (update_shape never skips it), as TopK."""
from __future__ import annotations

import numpy as np

from engine.kernels import KernelCall
from engine.layout import Layout, bits_type
from engine.ops.registry import register
from engine.ops.common import ShapeInferenceError, norm_axis


def _geometry(node, ins, deps):
    """(outer, A, inner, axis or None, conditions read, K)."""
    x, cond = ins[0], deps.get(1)
    if ins[1].dtype != "bool" or cond is None or cond.ndim != 1:
        raise ShapeInferenceError(f"Compress {node.name}: condition {ins[1]} must be a 1-D bool tensor")
    if node.attrs.get("axis") is None:
        outer, a, inner, axis = 1, x.count, 1, None
    else:
        axis = norm_axis(int(node.attrs["axis"]), x.rank)
        outer, a, inner = _prod(x.shape[:axis]), x.shape[axis], _prod(x.shape[axis + 1:])
    if cond.size > a:
        raise ShapeInferenceError(f"Compress {node.name}: condition of {cond.size} values is longer "
                                  f"than the {a} it selects from (input {x})")
    return outer, a, inner, axis, cond.size, int(np.count_nonzero(cond))


def _prod(dims) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _kernels(node, ins, outs, deps):
    _, a, inner, _, n, k = _geometry(node, ins, deps)
    return [KernelCall("compress", "compress", (("T", bits_type(ins[0].dtype)), ("IMPL_TAG", "Compress")),
                       (("in", 0), ("in", 1), ("out", 0)), params=(a, inner, k, n),
                       gws=(max(outs[0].count, 1),))]


# Compress-28 added bfloat16 only
@register("Compress", checked=28, kernels=_kernels, shape_deps=(1,), dynamic_output=True, f16=True)
def _compress(node, ins, deps):
    _, _, _, axis, _, k = _geometry(node, ins, deps)
    x = ins[0]
    shape = (k,) if axis is None else tuple(k if d == axis else n for d, n in enumerate(x.shape))
    return [Layout(shape, x.dtype)]
