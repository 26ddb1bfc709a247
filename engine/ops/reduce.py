"""Reductions: ReduceSum, ReduceMax, ReduceMin, ReduceProd, ReduceL2 (cl/reduce.cl, the dim
grouping of norm.py's mean reduction), ArgMax/ArgMin and CumSum. ReduceMean stays in norm.py.

The reduced axes are an attribute before ReduceSum-13 and the others' opset 18, an optional
input after (a shape dep: its value picks the output shape)."""
from __future__ import annotations

import numpy as np

from engine.kernels import KernelCall
from engine.layout import Layout, cl_type
from engine.ops.registry import register
from engine.ops.activation import FLOATS, NUMERIC
from engine.ops.common import ShapeInferenceError, norm_axis
from engine.ops.norm import reduce_call

AXES_INPUT_SINCE = {"ReduceSum": 13}   # the others: 18

# op -> (init, accumulate, final); `acc` the accumulator, `v` the value (TACC)
REDUCE = {
    "ReduceSum": ("acc = 0", "acc += v", "acc"),
    "ReduceProd": ("acc = 1", "acc *= v", "acc"),
    "ReduceL2": ("acc = 0", "acc += v * v", "sqrt(acc)"),
    # numpy's max/min propagate NaN: a NaN is kept once seen
    "ReduceMax": ("acc = LOWEST", "acc = (ISNAN(v) || v > acc) ? v : acc", "acc"),
    "ReduceMin": ("acc = HIGHEST", "acc = (ISNAN(v) || v < acc) ? v : acc", "acc"),
}
# empty reductions give -inf / +inf for floats (onnx.reference), the type's limits for ints
LIMITS = {"f32": ("-INFINITY", "INFINITY"), "f64": ("-INFINITY", "INFINITY"), "f16": ("-INFINITY", "INFINITY"),
          "i8": ("CHAR_MIN", "CHAR_MAX"), "u8": ("0", "UCHAR_MAX"), "bool": ("0", "1"),
          "i16": ("SHRT_MIN", "SHRT_MAX"), "u16": ("0", "USHRT_MAX"), "i32": ("INT_MIN", "INT_MAX"),
          "u32": ("0", "UINT_MAX"), "i64": ("LONG_MIN", "LONG_MAX"), "u64": ("0", "ULONG_MAX")}


def reduce_axes(node, ins, deps):
    """Normalised reduced axes (a sorted tuple) and keepdims."""
    rank, keepdims = ins[0].rank, int(node.attrs.get("keepdims", 1))
    from_input = node.opset >= AXES_INPUT_SINCE.get(node.op, 18)
    raw = deps.get(1) if from_input else node.attrs.get("axes")
    axes = [] if raw is None else [int(a) for a in np.asarray(raw).reshape(-1)]
    if not axes:   # none given: all, or none at all with noop_with_empty_axes (opset 13/18+)
        if from_input and int(node.attrs.get("noop_with_empty_axes", 0)):
            return (), keepdims
        axes = list(range(rank))
    picked = {norm_axis(a, rank) for a in axes} if rank else set()
    if rank and len(picked) < len(axes):
        raise ShapeInferenceError(f"{node.op} {node.name}: repeated axes {axes}")
    return tuple(sorted(picked)), keepdims


def _reduce_kernels(node, ins, outs, deps):
    axes, _ = reduce_axes(node, ins, deps)
    return [reduce_kernel(node, ins[0], outs[0], axes, node.op)]


def reduce_kernel(node, x: Layout, out: Layout, axes, kind: str) -> KernelCall:
    """The reduce kernel of `kind` (a REDUCE key) over `axes` of `x`."""
    dt = x.dtype
    init, acc, final = REDUCE[kind]
    lo, hi = LIMITS[dt]
    tacc = "double" if dt == "f64" else "float" if dt in ("f32", "f16") else cl_type(dt)
    jit = (("REDUCE", 1), ("T", cl_type(dt)), ("TOUT", cl_type(out.dtype)), ("TACC", tacc),
           ("LOWEST", f"({lo})"), ("HIGHEST", f"({hi})"),
           ("ISNAN(v)", "isnan(v)" if dt in FLOATS else "0"),
           ("REDUCE_INIT(acc)", init), ("REDUCE_ACC(acc, v)", acc), ("REDUCE_FINAL(acc)", final),
           ("IMPL_TAG", node.op))
    mean = reduce_call(node, x.shape, axes)   # the same dim grouping and work size
    return KernelCall("reduce", "reduce", jit, mean.args, mean.params, mean.gws, dims=mean.dims)


def _reduce_infer(node, ins, deps):
    dt = ins[0].dtype
    allowed = NUMERIC + (("bool",) if node.op in ("ReduceMax", "ReduceMin") else ())
    if node.op == "ReduceL2":
        allowed = FLOATS
    if dt not in allowed:
        raise ShapeInferenceError(f"{node.op} {node.name}: element type {dt} is not supported")
    axes, keepdims = reduce_axes(node, ins, deps)
    s = ins[0].shape
    out = tuple(1 if d in axes else n for d, n in enumerate(s)) if keepdims else \
        tuple(n for d, n in enumerate(s) if d not in axes)
    return [Layout(out, dt)]


# checked: ReduceSum-13 and the others' 18 take `axes` as an input; ReduceMax/Min-20 take bool
for _op in REDUCE:
    register(_op, checked=13 if _op == "ReduceSum" else 20 if _op in ("ReduceMax", "ReduceMin") else 18,
             kernels=_reduce_kernels, shape_deps=(1,), host_ok=True)(_reduce_infer)


# ---- ArgMax / ArgMin -------------------------------------------------------------------------
def _prod(dims) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _arg_kernels(node, ins, outs, deps):
    x = ins[0]
    axis = norm_axis(int(node.attrs.get("axis", 0)), x.rank)
    cmp = ">" if node.op == "ArgMax" else "<"
    if int(node.attrs.get("select_last_index", 0)):
        cmp += "="
    nan = "(isnan(v) && !isnan(best)) || " if x.dtype in FLOATS else ""
    jit = (("ARG_REDUCE", 1), ("T", cl_type(x.dtype)), ("BETTER(v, best)", f"({nan}v {cmp} best)"),
           ("IMPL_TAG", node.op))
    outer, inner = _prod(x.shape[:axis]), _prod(x.shape[axis + 1:])
    return [KernelCall("reduce", "arg_reduce", jit, (("in", 0), ("out", 0)),
                       params=(x.shape[axis], inner, outer * inner), gws=(max(outer * inner, 1),))]


def _arg_infer(node, ins, deps):
    x = ins[0]
    if x.dtype not in NUMERIC:
        raise ShapeInferenceError(f"{node.op} {node.name}: element type {x.dtype} is not supported")
    axis = norm_axis(int(node.attrs.get("axis", 0)), x.rank)
    if x.shape[axis] == 0:
        raise ShapeInferenceError(f"{node.op} {node.name}: empty axis {axis} in {x}")
    s = list(x.shape)
    if int(node.attrs.get("keepdims", 1)):
        s[axis] = 1
    else:
        del s[axis]
    return [Layout(tuple(s), "i64")]


for _op in ("ArgMax", "ArgMin"):
    register(_op, checked=13, kernels=_arg_kernels, host_ok=True)(_arg_infer)


# ---- CumSum ----------------------------------------------------------------------------------
def _cumsum_axis(node, ins, deps):
    a = deps.get(1)
    if a is None or a.size != 1:
        raise ShapeInferenceError(f"CumSum {node.name}: axis must be a scalar")
    return norm_axis(int(a.reshape(-1)[0]), ins[0].rank)


def _cumsum_kernels(node, ins, outs, deps):
    x = ins[0]
    axis = _cumsum_axis(node, ins, deps)
    jit = (("CUMSUM", 1), ("T", cl_type(x.dtype)), ("EXCLUSIVE", int(node.attrs.get("exclusive", 0))),
           ("REVERSE", int(node.attrs.get("reverse", 0))), ("IMPL_TAG", "CumSum"))
    return [KernelCall("reduce", "cumsum", jit, (("in", 0), ("out", 0)),
                       params=(x.shape[axis], _prod(x.shape[axis + 1:])), gws=(max(x.count, 1),))]


@register("CumSum", checked=14, kernels=_cumsum_kernels, shape_deps=(1,), host_ok=True)
def _cumsum(node, ins, deps):
    if ins[0].dtype not in NUMERIC:
        raise ShapeInferenceError(f"CumSum {node.name}: element type {ins[0].dtype} is not supported")
    _cumsum_axis(node, ins, deps)
    return [Layout(ins[0].shape, ins[0].dtype)]
