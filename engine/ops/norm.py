"""Normalisations and reductions: Softmax, LayerNormalization, BatchNormalization,
LRN and ReduceMean (cl/norm.cl; GlobalAveragePool shares the mean reduction)."""
from __future__ import annotations

import math

from engine.kernels import KernelCall, StaticVariant
from engine.layout import Layout
from engine.ops.registry import register
from engine.symbolic import prod
from engine.ops.common import ShapeInferenceError, norm_axis


def _f(v) -> str:
    """A float attribute as an OpenCL C literal."""
    v = float(v)
    if not math.isfinite(v):
        raise ShapeInferenceError(f"non-finite float attribute {v}")
    return f"{v!r}f"


# GPU row kernels (layer_norm_wg, softmax_wg): one work-group size for every shape (one build),
# the lanes per row sized to the row (row_lanes). Not yet measured on a GPU (written without
# one, checked on PoCL): `python scripts/bench_norm.py` on the H100 should decide NORM_WG and
# ROW_PER_LANE.
NORM_WG = 128
ROW_PER_LANE = 8     # a row of up to ROW_PER_LANE * NORM_WG floats is held in registers


def row_lanes(n: int) -> int:
    """Lanes per row on a GPU: the least power of two giving each lane at most ROW_PER_LANE
    elements, up to the whole work-group (a 384-float row: 64 lanes, 2 rows per work-group)."""
    w = 1
    while w < NORM_WG and w * ROW_PER_LANE < n:
        w *= 2
    return w


def _rows_dispatch(rows: int, w: int) -> tuple:
    per = NORM_WG // w
    return (max((rows + per - 1) // per, 1) * NORM_WG,), (NORM_WG,)


def _check_f32(node, *ls):
    for l in ls:
        if l is not None and l.dtype != "f32":
            raise ShapeInferenceError(f"{node.op} {node.name}: float32 only, got {l}")


def _no_extra_outputs(node, what):
    if any(o for o in node.outputs[1:]):
        raise ShapeInferenceError(f"{node.op} {node.name}: the {what} output(s) are not supported "
                                  "(only the first output)")


# ---- mean reduction --------------------------------------------------------------------------
def reduce_call(node, shape, axes) -> KernelCall:
    """Mean of `shape` over `axes`; the output is the input's element order minus those dims."""
    axes = set(axes)
    groups = []  # [size, reduced] outermost first, size-1 dims dropped, same kinds merged
    for d, n in enumerate(shape):
        if n == 1:
            continue
        red = d in axes
        if groups and groups[-1][1] == red:
            groups[-1][0] *= n
        else:
            groups.append([n, red])
    stride, strides = 1, []
    for n, _ in reversed(groups):
        strides.append(stride)
        stride *= n
    strides.reverse()
    kept = [(n, s) for (n, r), s in zip(groups, strides) if not r][::-1]   # innermost first
    red = [(n, s) for (n, r), s in zip(groups, strides) if r]              # outermost first
    if len(kept) > 3 or len(red) > 3:  # cannot happen for rank <= 6
        raise ShapeInferenceError(f"{node.op} {node.name}: too many dim groups in {shape}")
    kept += [(1, 0)] * (3 - len(kept))
    red = [(1, 0)] * (3 - len(red)) + red
    if any(shape[a] == 0 for a in axes):
        red = [(0, 0)] + red[1:]  # empty reduction: 0 / 0
    params = tuple(n for n, _ in kept) + tuple(s for _, s in kept) + \
        tuple(n for n, _ in red) + tuple(s for _, s in red)
    out_count = prod(n for d, n in enumerate(shape) if d not in axes)
    return KernelCall("norm", "reduce_mean", (("REDUCE_MEAN", 1), ("IMPL_TAG", "ReduceMean")),
                      (("in", 0), ("out", 0)), params=params, gws=(max(out_count, 1),),
                      dims={1: (out_count,)})


def _reduce_axes(node, ins, deps):
    """Normalised reduced axes (a sorted tuple) and keepdims."""
    rank = ins[0].rank
    keepdims = int(node.attrs.get("keepdims", 1))
    if node.opset >= 18:
        axes = deps.get(1)
        axes = [] if axes is None else [int(a) for a in axes.reshape(-1)]
        if not axes:
            if int(node.attrs.get("noop_with_empty_axes", 0)):
                return (), keepdims
            axes = list(range(rank))
    else:
        axes = node.attrs.get("axes")
        axes = list(range(rank)) if axes is None or len(axes) == 0 else [int(a) for a in axes]
    norm = sorted({norm_axis(a, rank) for a in axes}) if rank else []
    if len(norm) != len(axes):
        raise ShapeInferenceError(f"ReduceMean {node.name}: repeated axes {axes}")
    return tuple(norm), keepdims


def _reduce_mean_kernels(node, ins, outs, deps):
    axes, _ = _reduce_axes(node, ins, deps)
    return [reduce_call(node, ins[0].shape, axes)]


@register("ReduceMean", checked=18, kernels=_reduce_mean_kernels, shape_deps=(1,), host_ok=True)
def _reduce_mean(node, ins, deps):
    _check_f32(node, ins[0])
    axes, keepdims = _reduce_axes(node, ins, deps)
    s = ins[0].shape
    if keepdims:
        out = tuple(1 if d in axes else n for d, n in enumerate(s))
    else:
        out = tuple(n for d, n in enumerate(s) if d not in axes)
    return [Layout(out, "f32")]


# ---- softmax ---------------------------------------------------------------------------------
def _softmax_view(node, shape):
    """(outer, A, inner, dims of A): opset < 13 normalises over the flattened tail from `axis`
    (default 1), opset >= 13 over the single dim `axis` (default -1)."""
    rank = len(shape)
    if node.opset < 13:
        axis = norm_axis(int(node.attrs.get("axis", 1)), rank) if rank else 0
        return prod(shape[:axis]), prod(shape[axis:]), 1, tuple(shape[axis:])
    axis = norm_axis(int(node.attrs.get("axis", -1)), rank) if rank else 0
    if rank == 0:
        return 1, 1, 1, ()
    return prod(shape[:axis]), shape[axis], prod(shape[axis + 1:]), (shape[axis],)


def _softmax_kernels(node, ins, outs, deps, device="cpu"):
    outer, a, inner, a_dims = _softmax_view(node, ins[0].shape)
    # A along at most one dim > 1: a row steps one coordinate, so a prologue's broadcast offsets
    # are linear along it (cl/common.cl PROLOGUE_ROW)
    lin = int(sum(1 for d in a_dims if d != 1) <= 1)
    if device == "gpu" and inner == 1:   # contiguous rows: a work-group slice per row
        w = row_lanes(a)
        gws, lws = _rows_dispatch(outer, w)
        return [KernelCall("norm", "softmax_wg", (("SOFTMAX_WG", 1), ("NORM_WG", NORM_WG),
                                                  ("LANES_REDUCE", 1), ("ROW_PER_LANE", ROW_PER_LANE),
                                                  ("IMPL_TAG", "Softmax")),
                           (("in", 0), ("out", 0)), params=(a, inner, outer, lin, w),
                           gws=gws, lws=lws)]
    return [KernelCall("norm", "softmax", (("SOFTMAX", 1), ("IMPL_TAG", "Softmax")),
                       (("in", 0), ("out", 0)), params=(a, inner, outer * inner, lin),
                       gws=(max(outer * inner, 1),))]


def _softmax_static(node, ins, outs, deps, consts, device="cpu"):
    """Static Softmax: the axis length and strides constant (the three passes unroll). A
    prologue (engine/fusion.py) is supported here too: its operands' dims are in the static
    table like every tensor argument's, so their broadcast offsets fold to constants."""
    call = _softmax_kernels(node, ins, outs, deps, device)[0]
    return StaticVariant(call, {}, call.params, "x".join(map(str, ins[0].shape)))


# no static_on (scripts/bench_impls.py, dynamic / static kernel time, > 1: static faster): PoCL
# CPU (2 shared cores, --repeat 15) 0.82 (0.59..1.00); NVIDIA H200 (--repeat 50 --large) 1.07
# (0.97..1.17). prologue: attention's Softmax(scores * scale + mask) takes scale and mask (2)
@register("Softmax", checked=13, kernels=_softmax_kernels, static=_softmax_static, per_device=True,
          prologue=3)
def _softmax(node, ins, deps):
    _check_f32(node, ins[0])
    _softmax_view(node, ins[0].shape)  # validates the axis
    return [Layout(ins[0].shape, "f32")]


# ---- layer normalization ---------------------------------------------------------------------
def _suffix_count(node, what, l, norm_shape):
    """Element count of a Scale/B that broadcasts to the normalised dims as a suffix."""
    s = list(l.shape)
    while s and s[0] == 1:
        s.pop(0)
    n = len(norm_shape)
    if len(s) > n or tuple(s) != tuple(norm_shape[n - len(s):]):
        raise ShapeInferenceError(f"LayerNormalization {node.name}: {what} {l} does not match the "
                                  f"normalised dims {tuple(norm_shape)}")
    return max(prod(s), 1)


def _ln_geometry(node, ins):
    x, scale = ins[0], ins[1] if len(ins) > 1 else None
    bias = ins[2] if len(ins) > 2 else None
    if scale is None:
        raise ShapeInferenceError(f"LayerNormalization {node.name}: Scale is required")
    _check_f32(node, x, scale, bias)
    if x.rank == 0:
        raise ShapeInferenceError(f"LayerNormalization {node.name}: scalar input")
    axis = norm_axis(int(node.attrs.get("axis", -1)), x.rank)
    norm_shape = x.shape[axis:]
    sc = _suffix_count(node, "Scale", scale, norm_shape)
    bc = _suffix_count(node, "B", bias, norm_shape) if bias is not None else 1
    return prod(x.shape[:axis]), prod(norm_shape), sc, bc, bias is not None, norm_shape


def _ln_kernels(node, ins, outs, deps, device="cpu"):
    rows, d, sc, bc, has_bias, norm_shape = _ln_geometry(node, ins)
    eps = _f(node.attrs.get("epsilon", 1e-5))
    args = (("in", 0), ("in", 1)) + ((("in", 2),) if has_bias else ()) + (("out", 0),)
    lin = int(sum(1 for n in norm_shape if n != 1) <= 1)   # a prologue's offsets (softmax's)
    jit = (("LAYER_NORM", 1), ("HAS_BIAS", int(has_bias)), ("EPS", eps),
           ("IMPL_TAG", "LayerNormalization"))
    if device == "gpu":
        w = row_lanes(d)
        gws, lws = _rows_dispatch(rows, w)
        return [KernelCall("norm", "layer_norm_wg",
                           jit + (("NORM_WG", NORM_WG), ("ROW_PER_LANE", ROW_PER_LANE),
                                 ("LANES_REDUCE", 1)), args,
                           params=(rows, d, sc, bc, lin, w), gws=gws, lws=lws)]
    return [KernelCall("norm", "layer_norm", jit, args, params=(rows, d, sc, bc, lin, 1),
                       gws=(max(rows, 1),))]


# prologue: the residual add before it (x + r, and the bias add before that)
@register("LayerNormalization", checked=17, kernels=_ln_kernels, per_device=True, prologue=3)
def _layer_norm(node, ins, deps):
    _no_extra_outputs(node, "Mean/InvStdDev")
    _ln_geometry(node, ins)
    return [Layout(ins[0].shape, "f32")]


# ---- batch normalization (inference) ---------------------------------------------------------
def _bn_check(node, ins):
    if len(ins) < 5 or any(l is None for l in ins[:5]):
        raise ShapeInferenceError(f"BatchNormalization {node.name}: needs X, scale, B, mean, var")
    if int(node.attrs.get("training_mode", 0)):
        raise ShapeInferenceError(f"BatchNormalization {node.name}: training_mode=1 is not supported")
    _no_extra_outputs(node, "running mean/var (training)")
    x = ins[0]
    _check_f32(node, *ins[:5])
    if x.rank < 2:
        raise ShapeInferenceError(f"BatchNormalization {node.name}: input {x} needs rank >= 2")
    c = x.shape[1]
    for what, l in zip(("scale", "B", "mean", "var"), ins[1:5]):
        if tuple(l.shape) != (c,):
            raise ShapeInferenceError(f"BatchNormalization {node.name}: {what} {l} must be [{c}] "
                                      "(spatial=0 is not supported)")
    return x


def _bn_kernels(node, ins, outs, deps):
    x = _bn_check(node, ins)
    c, hw = x.shape[1], prod(x.shape[2:])
    jit = (("BATCH_NORM", 1), ("EPS", _f(node.attrs.get("epsilon", 1e-5))),
           ("IMPL_TAG", "BatchNormalization"))
    return [KernelCall("norm", "batch_norm", jit, tuple(("in", i) for i in range(5)) + (("out", 0),),
                       params=(c, hw, x.count), gws=(max(x.count, 1),))]


# fused after a Conv as y = x * k + c per channel (engine/fusion.py folds k and c)
@register("BatchNormalization", checked=15, kernels=_bn_kernels, fuse_expr="a * b + c")
def _batch_norm(node, ins, deps):
    x = _bn_check(node, ins)
    return [Layout(x.shape, "f32")]


# ---- LRN -------------------------------------------------------------------------------------
def _lrn_kernels(node, ins, outs, deps):
    x = ins[0]
    a = node.attrs
    jit = (("LRN", 1), ("LRN_SIZE", int(a["size"])), ("LRN_ALPHA", _f(a.get("alpha", 1e-4))),
           ("LRN_BETA", _f(a.get("beta", 0.75))), ("LRN_BIAS", _f(a.get("bias", 1.0))),
           ("IMPL_TAG", "LRN"))
    return [KernelCall("norm", "lrn", jit, (("in", 0), ("out", 0)),
                       params=(x.shape[1], prod(x.shape[2:])), gws=(max(x.count, 1),))]


@register("LRN", checked=13, kernels=_lrn_kernels)
def _lrn(node, ins, deps):
    x = ins[0]
    _check_f32(node, x)
    if x.rank < 3:
        raise ShapeInferenceError(f"LRN {node.name}: input {x} needs rank >= 3 (N, C, ...)")
    size = node.attrs.get("size")
    if size is None or int(size) < 1:
        raise ShapeInferenceError(f"LRN {node.name}: size attribute must be >= 1, got {size}")
    return [Layout(x.shape, "f32")]
