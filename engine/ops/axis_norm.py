"""Normalisations along axes (cl/axis_norm.cl): LogSoftmax, Hardmax and LpNormalization along
one axis, a work-item per line; MeanVarianceNormalization over a set of axes, a work-item per
kept position (norm.py's reduce_call geometry). float32, float64 and float16 (stored as half,
computed as float)."""
from __future__ import annotations

from engine.kernels import KernelCall
from engine.layout import Layout, type_jit
from engine.ops.registry import register
from engine.ops.activation import FLOATS
from engine.ops.common import ShapeInferenceError, norm_axis
from engine.ops.norm import reduce_call


def _floats(node, x):
    if x.dtype not in FLOATS:
        raise ShapeInferenceError(f"{node.op} {node.name}: element type {x.dtype} is not supported "
                                  f"({', '.join(FLOATS)} are)")
    return [Layout(x.shape, x.dtype)]


def _line_call(node, x, kernel, view, extra=()):
    outer, a, inner, _ = view
    jit = (*type_jit("T", x.dtype), (kernel.upper(), 1), *extra, ("IMPL_TAG", node.op))
    return KernelCall("axis_norm", kernel, jit, (("in", 0), ("out", 0)),
                      params=(a, inner, outer * inner), gws=(max(outer * inner, 1),))


def _prod(dims) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _softmax_view(node, shape):
    """(outer, A, inner, None) of LogSoftmax and Hardmax, Softmax's rule: one axis (default -1)
    from opset 13, the flattened tail from `axis` (default 1) before."""
    if not shape:
        return 1, 1, 1, None
    if node.opset < 13:
        axis = norm_axis(int(node.attrs.get("axis", 1)), len(shape))
        return _prod(shape[:axis]), _prod(shape[axis:]), 1, None
    axis = norm_axis(int(node.attrs.get("axis", -1)), len(shape))
    return _prod(shape[:axis]), shape[axis], _prod(shape[axis + 1:]), None


def _softmax_like(kernel):
    def kernels(node, ins, outs, deps):
        return [_line_call(node, ins[0], kernel, _softmax_view(node, ins[0].shape))]

    def infer(node, ins, deps):
        _softmax_view(node, ins[0].shape)   # validates the axis
        return _floats(node, ins[0])
    return kernels, infer


for _op, _kernel in (("LogSoftmax", "log_softmax"), ("Hardmax", "hardmax")):
    _k, _i = _softmax_like(_kernel)
    register(_op, checked=13, kernels=_k, f16=True)(_i)


def _lp_view(node, x):
    axis = norm_axis(int(node.attrs.get("axis", -1)), x.rank)
    return _prod(x.shape[:axis]), x.shape[axis], _prod(x.shape[axis + 1:]), None


def _lp_kernels(node, ins, outs, deps):
    p = int(node.attrs.get("p", 2))
    return [_line_call(node, ins[0], "lp_norm", _lp_view(node, ins[0]), (("LP_P", p),))]


@register("LpNormalization", checked=22, kernels=_lp_kernels, f16=True)
def _lp_norm(node, ins, deps):
    if int(node.attrs.get("p", 2)) not in (1, 2):
        raise ShapeInferenceError(f"LpNormalization {node.name}: p must be 1 or 2, got {node.attrs['p']}")
    if ins[0].rank == 0:
        raise ShapeInferenceError(f"LpNormalization {node.name}: scalar input")
    _lp_view(node, ins[0])
    return _floats(node, ins[0])


def _mvn_axes(node, x):
    axes = node.attrs.get("axes")
    axes = [0, 2, 3] if axes is None else [int(a) for a in axes]
    picked = sorted({norm_axis(a, x.rank) for a in axes})
    if len(picked) != len(axes):
        raise ShapeInferenceError(f"MeanVarianceNormalization {node.name}: repeated axes {axes}")
    return picked


def _mvn_kernels(node, ins, outs, deps):
    x = ins[0]
    axes = _mvn_axes(node, x)
    geo = reduce_call(node, x.shape, axes)
    kept = geo.gws[0] if x.count else 0
    # epsilon 1e-9: the constant of ONNX's function body
    jit = (*type_jit("T", x.dtype), ("MVN", 1), ("EPS", "1e-9f"), ("IMPL_TAG", node.op))
    return [KernelCall("axis_norm", "mvn", jit, (("in", 0), ("out", 0)),
                       params=geo.params + (kept,), gws=geo.gws)]


@register("MeanVarianceNormalization", checked=13, kernels=_mvn_kernels, f16=True)
def _mvn(node, ins, deps):
    _mvn_axes(node, ins[0])
    return _floats(node, ins[0])
