"""Elementwise ops: one broadcasting kernel (cl/eltwise.cl), the op is a C expression."""
from __future__ import annotations

from engine.layout import Layout
from engine.ops.registry import register
from engine.ops.common import (ShapeInferenceError, broadcast, contiguous_strides, eltwise_call,
                               onnx_dtype)
from engine.ops.movement import copy_call

# op -> (C expression over the inputs a, b, checked schema version). Each also runs fused into
# a producer's epilogue, the binary ones into a consumer's prologue (engine/fusion.py), and their
# kernels store through FUSED_OPS (they take an epilogue themselves).
BINARY = {
    "Add": ("a + b", 14), "Sub": ("a - b", 14), "Mul": ("a * b", 14), "Div": ("a / b", 14),
    "Pow": ("pow((float)a, (float)b)", 15),
}
UNARY = {
    # a select, not fmax: fmax(NaN, 0) is 0, and Relu(NaN) is NaN in onnxruntime
    "Relu": ("(a < (TOUT)0 ? (TOUT)0 : a)", 14), "Sigmoid": ("(TOUT)1 / ((TOUT)1 + exp(-a))", 13),
    "Tanh": ("tanh(a)", 13), "Erf": ("erf_f32(a)", 13), "Sqrt": ("sqrt(a)", 13),
}


def _same_dtype(node, ins):
    dts = {l.dtype for l in ins}
    if len(dts) != 1:
        raise ShapeInferenceError(f"{node.op} inputs have different types {sorted(dts)}")
    return ins[0].dtype


def _kernels_from(expr_of):
    def kernels(node, ins, outs, deps):
        return [eltwise_call(node, ins, outs[0], expr_of(node, ins, outs))]
    return kernels


def _infer_broadcast(node, ins, deps):
    return [Layout(broadcast(*[l.shape for l in ins]), _same_dtype(node, ins))]


def _infer_pow(node, ins, deps):
    return [Layout(broadcast(*[l.shape for l in ins]), ins[0].dtype)]


for _op, (_expr, _checked) in {**BINARY, **UNARY}.items():
    # Pow's exponent may have its own type (opset 12+); the result has the base's
    register(_op, checked=_checked, kernels=_kernels_from(lambda n, i, o, e=_expr: e), host_ok=True,
             f16=True, fuse_expr=_expr, fusion_producer=True)(
        _infer_pow if _op == "Pow" else _infer_broadcast)


def _sum_expr(node, ins, outs):
    if len(ins) > 5:
        raise ShapeInferenceError("Sum of more than 5 inputs is not supported")
    return " + ".join("abcde"[: len(ins)])


register("Sum", checked=13, kernels=_kernels_from(_sum_expr), host_ok=True, f16=True)(_infer_broadcast)


def _mean_expr(node, ins, outs):
    # summed in input order, then divided, as onnx.reference's Mean does
    return f"({_sum_expr(node, ins, outs)}) / (TOUT){len(ins)}"


@register("Mean", checked=13, kernels=_kernels_from(_mean_expr), host_ok=True, f16=True)
def _mean(node, ins, deps):
    out = _infer_broadcast(node, ins, deps)
    if out[0].dtype not in ("f32", "f64", "f16"):
        raise ShapeInferenceError(f"Mean {node.name}: element type {out[0].dtype} is not supported "
                                  "(float types only)")
    return out


@register("Equal", checked=19, kernels=_kernels_from(lambda n, i, o: "(TOUT)(a == b)"), host_ok=True, f16=True)
def _equal(node, ins, deps):
    _same_dtype(node, ins)
    return [Layout(broadcast(ins[0].shape, ins[1].shape), "bool")]


# fuse_expr: a Where of an attention mask chain runs in the Softmax's prologue (engine/fusion.py;
# its condition arrives as 0 or 1)
@register("Where", checked=16, kernels=_kernels_from(lambda n, i, o: "a ? b : c"), host_ok=True, f16=True,
          fuse_expr="(a != 0.0f) ? b : c")
def _where(node, ins, deps):
    if ins[0].dtype != "bool":
        raise ShapeInferenceError("Where condition must be bool")
    return [Layout(broadcast(*[l.shape for l in ins]), _same_dtype(node, ins[1:]))]


def _cast_expr(node, ins, outs):
    if outs[0].dtype == "bool":
        return "(TOUT)(a != 0)"
    return "(TOUT)a"


def _cast_kernels(node, ins, outs, deps):
    if ins[0].pad is None:
        return [eltwise_call(node, ins, outs[0], _cast_expr(node, ins, outs))]
    # a padded input (a KV cache with room along its sequence axis, engine/network.py): a
    # converting strided copy reads it in place
    conv = "((v) != 0)" if outs[0].dtype == "bool" else "(v)"
    return [copy_call(node, ins[0].dtype, outs[0].shape, contiguous_strides(ins[0].phys), 0,
                      contiguous_strides(outs[0].shape), 0, convert=(outs[0].dtype, conv))]


@register("Cast", checked=28, kernels=_cast_kernels, host_ok=True, f16=True, padded_ok=True)
def _cast(node, ins, deps):
    return [Layout(ins[0].shape, onnx_dtype(node.attrs["to"]))]
