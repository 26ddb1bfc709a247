"""Tensors built or rearranged: Range, Trilu, Tile, Pad (cl/arrange.cl) and Split (strided
copies, cl/movement.cl). Sizes that pick the output shape (Range's scalars, Split's sizes,
Tile's repeats, Pad's pads and axes, Trilu's k) are shape deps: host values."""
from __future__ import annotations

import math

import numpy as np

from engine.kernels import KernelCall, MAX_RANK
from engine.layout import Layout, cl_type, type_jit
from engine.ops.registry import register
from engine.ops.activation import FLOATS, lit
from engine.ops.common import ShapeInferenceError, contiguous_strides, norm_axis
from engine.ops.movement import copy_call


def _scalar(node, deps, i, what):
    v = deps.get(i)
    if v is None or np.size(v) != 1:
        raise ShapeInferenceError(f"{node.op} {node.name}: {what} must be a one-element tensor")
    return np.asarray(v).reshape(-1)[0]


# ---- Range -----------------------------------------------------------------------------------
def _range_kernels(node, ins, outs, deps):
    jit = (("RANGE", 1), *type_jit("T", outs[0].dtype), ("IMPL_TAG", "Range"))
    return [KernelCall("arrange", "range", jit, (("in", 0), ("in", 1), ("in", 2), ("out", 0)),
                       gws=(max(outs[0].count, 1),))]


# f16: its inputs are shape deps (host values, never Cast), so the kernel reads and writes half
@register("Range", checked=27, kernels=_range_kernels, shape_deps=(0, 1, 2), host_ok=True, f16=True)
def _range(node, ins, deps):
    dts = {l.dtype for l in ins}
    if len(dts) != 1:
        raise ShapeInferenceError(f"Range {node.name}: inputs have different types {sorted(dts)}")
    start, limit, delta = (_scalar(node, deps, i, w) for i, w in enumerate(("start", "limit", "delta")))
    if delta == 0:
        raise ShapeInferenceError(f"Range {node.name}: delta is 0")
    n = max(int(math.ceil((float(limit) - float(start)) / float(delta))), 0)
    return [Layout((n,), ins[0].dtype)]


# ---- Trilu -----------------------------------------------------------------------------------
def _trilu_kernels(node, ins, outs, deps):
    k = int(_scalar(node, deps, 1, "k")) if deps.get(1) is not None else 0
    jit = (("TRILU", 1), ("T", cl_type(ins[0].dtype)), ("UPPER", int(node.attrs.get("upper", 1))),
           ("IMPL_TAG", "Trilu"))
    # k beyond the matrix behaves as the matrix size (keeps the int32 parameter in range)
    lim = max(ins[0].shape[-2:]) + 1
    return [KernelCall("arrange", "trilu", jit, (("in", 0), ("out", 0)),
                       params=(max(-lim, min(lim, k)),), gws=(max(ins[0].count, 1),))]


@register("Trilu", checked=14, kernels=_trilu_kernels, shape_deps=(1,), host_ok=True)
def _trilu(node, ins, deps):
    if ins[0].rank < 2:
        raise ShapeInferenceError(f"Trilu {node.name}: input {ins[0]} needs rank >= 2")
    return [Layout(ins[0].shape, ins[0].dtype)]


# ---- Tile ------------------------------------------------------------------------------------
def _tile_kernels(node, ins, outs, deps):
    jit = (("TILE", 1), ("T", cl_type(ins[0].dtype)), ("IMPL_TAG", "Tile"))
    return [KernelCall("arrange", "tile", jit, (("in", 0), ("out", 0)), gws=(max(outs[0].count, 1),))]


@register("Tile", checked=13, kernels=_tile_kernels, shape_deps=(1,), host_ok=True)
def _tile(node, ins, deps):
    reps = [int(r) for r in np.asarray(deps[1]).reshape(-1)]
    if len(reps) != ins[0].rank or any(r < 0 for r in reps):
        raise ShapeInferenceError(f"Tile {node.name}: repeats {reps} do not fit {ins[0]}")
    return [Layout(tuple(d * r for d, r in zip(ins[0].shape, reps)), ins[0].dtype)]


# ---- Pad -------------------------------------------------------------------------------------
MODES = {"constant": 0, "reflect": 1, "edge": 2, "wrap": 3}


def _pads(node, ins, deps):
    """(begin, end) pads per dim of the input."""
    rank = ins[0].rank
    if node.opset < 11:
        pads = [int(p) for p in node.attrs.get("pads", node.attrs.get("paddings", []))]
        axes = list(range(rank))
    else:
        pads = [int(p) for p in np.asarray(deps[1]).reshape(-1)]
        a = deps.get(3)
        axes = list(range(rank)) if a is None else [norm_axis(int(x), rank) for x in np.asarray(a).reshape(-1)]
    if len(pads) != 2 * len(axes):
        raise ShapeInferenceError(f"Pad {node.name}: {len(pads)} pads for {len(axes)} axes")
    begin, end = [0] * rank, [0] * rank
    for j, a in enumerate(axes):
        begin[a], end[a] = pads[j], pads[j + len(axes)]
    return begin, end


def _pad_kernels(node, ins, outs, deps):
    x = ins[0]
    begin, _ = _pads(node, ins, deps)
    mode = MODES[node.attrs.get("mode", "constant")]
    has_value = int(node.opset >= 11 and len(ins) > 2 and ins[2] is not None and mode == 0)
    value = node.attrs.get("value", 0.0) if node.opset < 11 else 0
    jit = (("PAD", 1), ("T", cl_type(x.dtype)), ("MODE", mode), ("HAS_VALUE", has_value),
           ("PAD_VALUE", lit(value, x.dtype).replace("TOUT", "T") if x.dtype in FLOATS else str(int(value))),
           ("IMPL_TAG", "Pad"))
    args = (("in", 0),) + ((("in", 2),) if has_value else ()) + (("out", 0),)
    params = tuple([0] * (MAX_RANK - x.rank) + begin)
    return [KernelCall("arrange", "pad", jit, args, params=params, gws=(max(outs[0].count, 1),))]


@register("Pad", checked=25, kernels=_pad_kernels, shape_deps=(1, 3), host_ok=True)
def _pad(node, ins, deps):
    mode = node.attrs.get("mode", "constant")
    if mode not in MODES:
        raise ShapeInferenceError(f"Pad {node.name}: mode {mode!r} is not supported")
    begin, end = _pads(node, ins, deps)
    out = tuple(d + b + e for d, b, e in zip(ins[0].shape, begin, end))
    if any(d < 0 for d in out):
        raise ShapeInferenceError(f"Pad {node.name}: pads {begin}/{end} crop {ins[0]} below 0")
    if mode != "constant" and any(d == 0 for d in ins[0].shape) and any(out):
        raise ShapeInferenceError(f"Pad {node.name}: {mode} padding of an empty dim")
    return [Layout(out, ins[0].dtype)]


# ---- Split -----------------------------------------------------------------------------------
def _split_sizes(node, ins, deps):
    x = ins[0]
    axis = norm_axis(int(node.attrs.get("axis", 0)), x.rank)
    n_out = len(node.outputs)
    total = x.shape[axis]
    if node.opset < 13 and "split" in node.attrs:
        sizes = [int(s) for s in node.attrs["split"]]
    elif node.opset >= 13 and deps.get(1) is not None:
        sizes = [int(s) for s in np.asarray(deps[1]).reshape(-1)]
    else:
        n = int(node.attrs.get("num_outputs", n_out))
        chunk = -(-total // n)   # ceil: the last chunk is smaller (opset 18)
        sizes = [min(chunk, max(total - k * chunk, 0)) for k in range(n)]
    if sum(sizes) != total or len(sizes) != n_out:
        raise ShapeInferenceError(f"Split {node.name}: sizes {sizes} do not split {total} "
                                  f"into {n_out} outputs")
    return axis, sizes


def _split_kernels(node, ins, outs, deps):
    x = ins[0]
    axis, sizes = _split_sizes(node, ins, deps)
    st = contiguous_strides(x.phys)
    calls, pos = [], 0
    for k, (o, s) in enumerate(zip(outs, sizes)):
        if o.count:
            calls.append(copy_call(node, x.dtype, o.shape, st, pos * st[axis],
                                   contiguous_strides(o.shape), 0, dst=("out", k)))
        pos += s
    return calls


def _split_in_place(node, ins, outs, deps):
    """Every dim before the axis is 1 (a fused QKV projection's output in a decode step): each
    output is one run of the input."""
    x = ins[0]
    axis, sizes = _split_sizes(node, ins, deps)
    if any(d != 1 for d in x.shape[:axis]):
        return None
    inner = math.prod(x.shape[axis + 1:])
    return tuple(inner * sum(sizes[:k]) for k in range(len(sizes)))


@register("Split", checked=18, kernels=_split_kernels, shape_deps=(1,), padded_ok=True, host_ok=True,
          in_place_crop=_split_in_place)
def _split(node, ins, deps):
    axis, sizes = _split_sizes(node, ins, deps)
    return [Layout(ins[0].shape[:axis] + (s,) + ins[0].shape[axis + 1:], ins[0].dtype) for s in sizes]
