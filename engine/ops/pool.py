"""Pooling: MaxPool and AveragePool (2-D, cl/pool.cl) and GlobalAveragePool (a mean reduction
over the spatial dims, cl/norm.cl's reduce kernel).

The window geometry (kernel, strides, dilations, pads) goes through shape_info, so one build
per (op, count_include_pad) serves every pooling node and shape.
"""
from __future__ import annotations

from engine.f16 import type_jit
from engine.kernels import KernelCall
from engine.layout import Layout
from engine.ops import register
from engine.ops.common import ShapeInferenceError
from engine.ops.conv import _ints, spatial_out
from engine.ops.norm import reduce_call


def _pool_geometry(node, ins):
    x = ins[0]
    if x is None:
        raise ShapeInferenceError(f"{node.op} {node.name}: missing input")
    if x.dtype not in ("f32", "f16"):
        raise ShapeInferenceError(f"{node.op} {node.name}: float32 or float16 only, got {x}")
    if x.rank != 4:
        raise ShapeInferenceError(f"{node.op} {node.name}: only 2-D (NCHW) pooling is supported, "
                                  f"got input {x}")
    ks = node.attrs.get("kernel_shape")
    if ks is None or len(ks) != 2:
        raise ShapeInferenceError(f"{node.op} {node.name}: kernel_shape must have 2 values, got {ks}")
    ks = [int(k) for k in ks]
    strides = _ints(node, "strides", 2, 1)
    dil = _ints(node, "dilations", 2, 1)
    ceil_mode = bool(node.attrs.get("ceil_mode", 0))
    N, C, H, W = x.shape
    (OH, OW), pb, pe = spatial_out(node, (H, W), ks, strides, dil, ceil_mode)
    return dict(N=N, C=C, OH=OH, OW=OW, ks=ks, strides=strides, dil=dil, pb=pb, pe=pe)


def _pool_kernels(node, ins, outs, deps):
    g = _pool_geometry(node, ins)
    is_max = node.op == "MaxPool"
    cip = 0 if is_max else int(node.attrs.get("count_include_pad", 0))
    jit = (*type_jit("T", ins[0].dtype), ("POOL_MAX", int(is_max)), ("COUNT_INCLUDE_PAD", cip), ("IMPL_TAG", node.op))
    params = (*g["ks"], *g["strides"], *g["dil"], *g["pb"], *g["pe"])
    return [KernelCall("pool", "pool2d", jit, (("in", 0), ("out", 0)), params=params,
                       gws=(max(outs[0].count, 1),))]


def _pool_infer(node, ins, deps):
    if node.op == "MaxPool" and len(node.outputs) > 1 and node.outputs[1]:
        raise ShapeInferenceError(f"MaxPool {node.name}: the Indices output is not supported")
    g = _pool_geometry(node, ins)
    return [Layout((g["N"], g["C"], g["OH"], g["OW"]), ins[0].dtype)]


register("MaxPool", kernels=_pool_kernels, f16=True)(_pool_infer)
register("AveragePool", kernels=_pool_kernels, f16=True)(_pool_infer)


def _gap_check(node, ins):
    x = ins[0]
    if x.dtype != "f32":
        raise ShapeInferenceError(f"GlobalAveragePool {node.name}: float32 only, got {x}")
    if x.rank < 3:
        raise ShapeInferenceError(f"GlobalAveragePool {node.name}: input {x} needs rank >= 3")
    return x


def _gap_kernels(node, ins, outs, deps):
    x = _gap_check(node, ins)
    return [reduce_call(node, x.shape, range(2, x.rank))]


@register("GlobalAveragePool", kernels=_gap_kernels)
def _gap(node, ins, deps):
    x = _gap_check(node, ins)
    return [Layout(tuple(x.shape[:2]) + (1,) * (x.rank - 2), "f32")]
