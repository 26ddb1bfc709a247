"""Element indexing: GatherElements, GatherND, ScatterElements, ScatterND (cl/indexing.cl).

A scatter is two kernels: a copy of data into the output (movement.cl), then the updates. With
a reduction (add/mul/max/min) the update kernel runs as one work-item, so duplicate indices
accumulate in index order as onnx.reference does; without one it runs one work-item per update
(duplicates are undefined in ONNX)."""
from __future__ import annotations

import math

from engine.kernels import KernelCall, MAX_RANK
from engine.layout import Layout, cl_type
from engine.ops.registry import register
from engine.ops.common import ShapeInferenceError, contiguous_strides, norm_axis
from engine.ops.movement import copy_call

REDUCTIONS = {
    "none": "o = v",
    "add": "o += v",
    "mul": "o *= v",
    "max": "o = (v > o ? v : o)",
    "min": "o = (v < o ? v : o)",
}


# data, indices[, updates], out and the node's slot of the index flags (engine/index_flags.py)
ARGS3 = (("in", 0), ("in", 1), ("out", 0), ("flag", 0))
ARGS4 = (("in", 0), ("in", 1), ("in", 2), ("out", 0), ("flag", 0))


def _index_type(node, l):
    if l.dtype not in ("i64", "i32"):
        raise ShapeInferenceError(f"{node.op} {node.name}: indices must be int64 or int32, got {l}")


# ---- GatherElements --------------------------------------------------------------------------
def _ge_kernels(node, ins, outs, deps):
    data, idx = ins
    axis = norm_axis(int(node.attrs.get("axis", 0)), data.rank)
    jit = (("GATHER_ELEMENTS", 1), ("T", cl_type(data.dtype)), ("TIDX", cl_type(idx.dtype)),
           ("IMPL_TAG", "GatherElements"))
    return [KernelCall("indexing", "gather_elements", jit, ARGS3,
                       params=(axis + MAX_RANK - data.rank,), gws=(max(idx.count, 1),))]


@register("GatherElements", checked=13, kernels=_ge_kernels, host_ok=True)
def _gather_elements(node, ins, deps):
    data, idx = ins
    _index_type(node, idx)
    norm_axis(int(node.attrs.get("axis", 0)), data.rank)
    if idx.rank != data.rank:
        raise ShapeInferenceError(f"GatherElements {node.name}: indices {idx} and data {data} "
                                  "differ in rank")
    return [Layout(idx.shape, data.dtype)]


# ---- GatherND --------------------------------------------------------------------------------
def _gnd_geometry(node, data, idx):
    """(batch_dims, k, rows per batch, slice, output shape) of GatherND(data, idx)."""
    b = int(node.attrs.get("batch_dims", 0))
    if idx.rank < 1 or not 0 <= b < min(data.rank, idx.rank):
        raise ShapeInferenceError(f"GatherND {node.name}: batch_dims {b} for data {data}, indices {idx}")
    k = idx.shape[-1]
    if b + k > data.rank:
        raise ShapeInferenceError(f"GatherND {node.name}: index rows of {k} for data {data} "
                                  f"after {b} batch dims")
    if tuple(idx.shape[:b]) != tuple(data.shape[:b]):
        raise ShapeInferenceError(f"GatherND {node.name}: batch dims of indices {idx} and data {data} differ")
    return (b, k, math.prod(idx.shape[b:-1]), math.prod(data.shape[b + k:]),
            tuple(idx.shape[:-1]) + tuple(data.shape[b + k:]))


def _gnd_kernels(node, ins, outs, deps):
    data, idx = ins
    b, k, rows, slice_, _ = _gnd_geometry(node, data, idx)
    st = contiguous_strides(data.shape)
    batch_elems = st[b - 1] if b else 0          # data elements per batch entry
    pad = [0] * (MAX_RANK - k)
    params = (k, slice_, rows, batch_elems) + tuple(st[b:b + k]) + tuple(pad) + \
        tuple(data.shape[b:b + k]) + tuple(pad)
    jit = (("GATHER_ND", 1), ("T", cl_type(data.dtype)), ("TIDX", cl_type(idx.dtype)),
           ("IMPL_TAG", "GatherND"))
    return [KernelCall("indexing", "gather_nd", jit, ARGS3,
                       params=params, gws=(max(outs[0].count, 1),))]


@register("GatherND", checked=13, kernels=_gnd_kernels, host_ok=True)
def _gather_nd(node, ins, deps):
    data, idx = ins
    _index_type(node, idx)
    return [Layout(_gnd_geometry(node, data, idx)[4], data.dtype)]


# ---- scatters --------------------------------------------------------------------------------
def _scatter_jit(node, data, idx, flag):
    red = node.attrs.get("reduction", "none")
    if red not in REDUCTIONS:
        raise ShapeInferenceError(f"{node.op} {node.name}: reduction {red!r} is not supported")
    return red, ((flag, 1), ("T", cl_type(data.dtype)), ("TIDX", cl_type(idx.dtype)),
                 ("REDUCE_INTO(o, v)", REDUCTIONS[red]), ("IMPL_TAG", node.op))


def _update_call(node, kernel, jit, red, params, n) -> KernelCall:
    """The updates kernel over n updates: one work-item in index order with a reduction."""
    serial = red != "none"
    return KernelCall("indexing", kernel, jit, ARGS4, params=params, gws=(1 if serial else n,),
                      lws=(1,) if serial else None)


def _copy_data(node, data):
    st = contiguous_strides(data.shape)
    return copy_call(node, data.dtype, data.shape, st, 0, st, 0)


def _se_kernels(node, ins, outs, deps):
    data, idx, upd = ins
    axis = norm_axis(int(node.attrs.get("axis", 0)), data.rank)
    red, jit = _scatter_jit(node, data, idx, "SCATTER_ELEMENTS")
    calls = [_copy_data(node, data)] if data.count else []
    if idx.count:
        calls.append(_update_call(node, "scatter_elements", jit, red, (axis + MAX_RANK - data.rank,),
                                  idx.count))
    return calls


@register("ScatterElements", checked=18, kernels=_se_kernels, host_ok=True)
def _scatter_elements(node, ins, deps):
    data, idx, upd = ins
    _index_type(node, idx)
    norm_axis(int(node.attrs.get("axis", 0)), data.rank)
    if tuple(idx.shape) != tuple(upd.shape) or idx.rank != data.rank:
        raise ShapeInferenceError(f"ScatterElements {node.name}: indices {idx} and updates {upd} "
                                  f"must have one shape of data's rank ({data})")
    return [Layout(data.shape, data.dtype)]


def _nd_geometry(node, data, idx, upd):
    if idx.rank < 1:
        raise ShapeInferenceError(f"ScatterND {node.name}: indices {idx} must have rank >= 1")
    k = idx.shape[-1]
    if k > data.rank:
        raise ShapeInferenceError(f"ScatterND {node.name}: index rows of {k} for data {data}")
    want = tuple(idx.shape[:-1]) + tuple(data.shape[k:])
    if tuple(upd.shape) != want:
        raise ShapeInferenceError(f"ScatterND {node.name}: updates {upd} must be {want}")
    return k, math.prod(idx.shape[:-1]), math.prod(data.shape[k:])


def _nd_kernels(node, ins, outs, deps):
    data, idx, upd = ins
    k, rows, slice_ = _nd_geometry(node, data, idx, upd)
    red, jit = _scatter_jit(node, data, idx, "SCATTER_ND")
    st = contiguous_strides(data.shape)[:k]
    pad = [0] * (MAX_RANK - k)
    params = (k, slice_, rows) + tuple(st) + tuple(pad) + tuple(data.shape[:k]) + tuple(pad)
    calls = [_copy_data(node, data)] if data.count else []
    if rows * slice_:
        calls.append(_update_call(node, "scatter_nd", jit, red, params, rows * slice_))
    return calls


@register("ScatterND", checked=18, kernels=_nd_kernels, host_ok=True)
def _scatter_nd(node, ins, deps):
    data, idx, upd = ins
    _index_type(node, idx)
    _nd_geometry(node, data, idx, upd)
    return [Layout(data.shape, data.dtype)]
