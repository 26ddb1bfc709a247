"""Reductions that sum a function of the values, on reduce.py's kernel (cl/reduce.cl):
ReduceSumSquare, ReduceL1, ReduceLogSum, ReduceLogSumExp; and CumProd on CumSum's kernel.

ReduceLogSumExp keeps a running maximum m beside the sum of exp(v - m) (one pass, rescaled when
m grows): exp of the raw values would overflow past 88 in float32, where the result is finite."""
from __future__ import annotations

from dataclasses import replace

from engine.layout import Layout
from engine.ops.registry import OPS, register
from engine.ops.activation import FLOATS, NUMERIC
from engine.ops.common import ShapeInferenceError, norm_axis
from engine.ops import reduce

# (init, accumulate, final) as reduce.REDUCE's; ONNX's integer ReduceL1/SumSquare stay integer
KINDS = {
    "ReduceSumSquare": (("acc = 0", "acc += v * v", "acc"), NUMERIC),
    "ReduceL1": (("acc = 0", "acc += (v < 0 ? -v : v)", "acc"), NUMERIC),
    "ReduceLogSum": (("acc = 0", "acc += v", "log(acc)"), FLOATS),
    # INIT declares the running max beside acc. Equal maxima add 1 (not exp(m - m): NaN for inf);
    # a NaN makes the sum NaN; an empty or all -inf set gives log(0) + -inf = -inf
    "ReduceLogSumExp": (("acc = 0; TACC m_ = -INFINITY",
                         "if (v > m_) { acc = acc * exp(m_ - v) + 1; m_ = v; } "
                         "else acc += (v == m_ ? (TACC)1 : exp(v - m_))",
                         "log(acc) + m_"), FLOATS),
}
reduce.REDUCE.update({op: k for op, (k, _) in KINDS.items()})


def _infer(node, ins, deps):
    dt = ins[0].dtype
    if dt not in KINDS[node.op][1]:
        raise ShapeInferenceError(f"{node.op} {node.name}: element type {dt} is not supported")
    axes, keepdims = reduce.reduce_axes(node, ins, deps)
    s = ins[0].shape
    out = tuple(1 if d in axes else n for d, n in enumerate(s)) if keepdims else \
        tuple(n for d, n in enumerate(s) if d not in axes)
    return [Layout(out, dt)]


def _kernels(node, ins, outs, deps):
    axes, _ = reduce.reduce_axes(node, ins, deps)
    return [reduce.reduce_kernel(node, ins[0], outs[0], axes, node.op)]


# all take `axes` as an input since opset 18; LogSum/LogSumExp-28 dropped the integer types
for _op in KINDS:
    register(_op, checked=28 if "Log" in _op else 18, kernels=_kernels, shape_deps=(1,),
             host_ok=True)(_infer)


def _cumprod_kernels(node, ins, outs, deps):
    call = OPS["CumSum"].kernels(node, ins, outs, deps)[0]
    jit = tuple(kv for kv in call.jit if kv[0] != "IMPL_TAG") + (("CUM_PRODUCT", 1), ("IMPL_TAG", "CumProd"))
    return [replace(call, jit=jit)]


@register("CumProd", checked=26, kernels=_cumprod_kernels, shape_deps=(1,), host_ok=True)
def _cumprod(node, ins, deps):
    if ins[0].dtype not in NUMERIC:
        raise ShapeInferenceError(f"CumProd {node.name}: element type {ins[0].dtype} is not supported")
    a = deps.get(1)
    if a is None or a.size != 1:
        raise ShapeInferenceError(f"CumProd {node.name}: axis must be a scalar")
    norm_axis(int(a.reshape(-1)[0]), ins[0].rank)
    return [Layout(ins[0].shape, ins[0].dtype)]
