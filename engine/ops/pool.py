"""Pooling: MaxPool and AveragePool over 1, 2 or 3 spatial dims (cl/pool.cl; 1-D and 2-D run as
3-D with unit leading spatial dims), MaxPool's Indices output included, GlobalAveragePool (a
mean reduction over the spatial dims, cl/norm.cl's reduce kernel) and GlobalMaxPool (a max
reduction over them, cl/reduce.cl's).

The window geometry (kernel, strides, dilations, pads) goes through shape_info, so one build
per (op, dtype, count_include_pad, indices) serves every pooling node and shape.
"""
from __future__ import annotations

from engine.kernels import KernelCall
from engine.layout import Layout, type_jit
from engine.ops.registry import register
from engine.ops.common import ShapeInferenceError
from engine.ops.conv import _ints, spatial_out
from engine.ops.norm import reduce_call
from engine.ops.reduce import reduce_kernel

# MaxPool also takes 8-bit integers (opset 12): the kernel's float max is exact for them
DTYPES = {"MaxPool": ("f32", "f16", "i8", "u8"), "AveragePool": ("f32", "f16")}


def _indices(node) -> bool:
    return node.op == "MaxPool" and len(node.outputs) > 1 and bool(node.outputs[1])


def _pool_geometry(node, ins):
    x = ins[0]
    if x is None:
        raise ShapeInferenceError(f"{node.op} {node.name}: missing input")
    if x.dtype not in DTYPES[node.op]:
        raise ShapeInferenceError(f"{node.op} {node.name}: {', '.join(DTYPES[node.op])} only, "
                                  f"got {x}")
    if x.rank not in (3, 4, 5):
        raise ShapeInferenceError(f"{node.op} {node.name}: only 1-D, 2-D and 3-D pooling are "
                                  f"supported, got input {x}")
    n = x.rank - 2
    ks = node.attrs.get("kernel_shape")
    if ks is None or len(ks) != n:
        raise ShapeInferenceError(f"{node.op} {node.name}: kernel_shape must have {n} values "
                                  f"for input {x}, got {ks}")
    ks = [int(k) for k in ks]
    strides = _ints(node, "strides", n, 1)
    dil = _ints(node, "dilations", n, 1)
    ceil_mode = bool(node.attrs.get("ceil_mode", 0))
    if _indices(node) and int(node.attrs.get("storage_order", 0)) not in (0, 1):
        raise ShapeInferenceError(f"MaxPool {node.name}: storage_order must be 0 or 1")
    out, pb, pe = spatial_out(node, x.shape[2:], ks, strides, dil, ceil_mode)
    lead = [1] * (3 - n)      # the unit leading spatial dims of the 3-D view
    return dict(N=x.shape[0], C=x.shape[1], out=out, in3=lead + list(x.shape[2:]),
                out3=lead + out, ks=lead + ks, strides=lead + strides, dil=lead + dil,
                pb=[0] * (3 - n) + pb, pe=[0] * (3 - n) + pe)


def _pool_kernels(node, ins, outs, deps):
    g = _pool_geometry(node, ins)
    is_max = node.op == "MaxPool"
    cip = 0 if is_max else int(node.attrs.get("count_include_pad", 0))
    jit = (*type_jit("T", ins[0].dtype), ("POOL_MAX", int(is_max)), ("COUNT_INCLUDE_PAD", cip),
           ("IMPL_TAG", node.op))
    args = (("in", 0), ("out", 0))
    if _indices(node):
        jit += (("WITH_INDICES", 1), ("STORAGE_ORDER", int(node.attrs.get("storage_order", 0))))
        args += (("out", 1),)
    params = (*g["ks"], *g["strides"], *g["dil"], *g["pb"], *g["pe"])
    dims = {0: (g["N"], g["C"], *g["in3"]), 1: (g["N"], g["C"], *g["out3"])}
    return [KernelCall("pool", "pool", jit, args, params=params, gws=(max(outs[0].count, 1),),
                       dims=dims)]


def _pool_infer(node, ins, deps):
    g = _pool_geometry(node, ins)
    y = Layout((g["N"], g["C"], *g["out"]), ins[0].dtype)
    return [y, Layout(y.shape, "i64")] if _indices(node) else [y]


register("MaxPool", checked=22, kernels=_pool_kernels, f16=True)(_pool_infer)
register("AveragePool", checked=22, kernels=_pool_kernels, f16=True)(_pool_infer)


def _gap_check(node, ins, dtypes=("f32",)):
    x = ins[0]
    if x.dtype not in dtypes:
        raise ShapeInferenceError(f"{node.op} {node.name}: {', '.join(dtypes)} only, got {x}")
    if x.rank < 3:
        raise ShapeInferenceError(f"{node.op} {node.name}: input {x} needs rank >= 3")
    return x


def _gap_kernels(node, ins, outs, deps):
    x = _gap_check(node, ins)
    return [reduce_call(node, x.shape, range(2, x.rank))]


@register("GlobalAveragePool", checked=22, kernels=_gap_kernels)
def _gap(node, ins, deps):
    x = _gap_check(node, ins)
    return [Layout(tuple(x.shape[:2]) + (1,) * (x.rank - 2), "f32")]


# ---- GlobalMaxPool: ReduceMax over the spatial dims (a float16 input gets Casts: engine/f16.py)
def _gmp_kernels(node, ins, outs, deps):
    x = _gap_check(node, ins, ("f32", "f64"))
    return [reduce_kernel(node, x, outs[0], range(2, x.rank), "ReduceMax")]


@register("GlobalMaxPool", checked=22, kernels=_gmp_kernels)
def _gmp(node, ins, deps):
    x = _gap_check(node, ins, ("f32", "f64"))
    return [Layout(tuple(x.shape[:2]) + (1,) * (x.rank - 2), x.dtype)]
