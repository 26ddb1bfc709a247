"""Shrink, Swish and SwiGLU on the eltwise kernel (cl/eltwise.cl): the activations of recent
exporters' MLP blocks (SwiGLU = Swish(A) * B, Llama's gate and up projections)."""
from __future__ import annotations

from engine.layout import Layout
from engine.ops.registry import register
from engine.ops.activation import FLOATS, NUMERIC, lit
from engine.ops.common import ShapeInferenceError, broadcast, eltwise_call


def _one_type(node, ins, allowed):
    dts = {l.dtype for l in ins}
    if len(dts) != 1 or (dt := dts.pop()) not in allowed:
        raise ShapeInferenceError(f"{node.op} {node.name}: element types {[l.dtype for l in ins]} "
                                  f"are not supported ({', '.join(allowed)} are, all the same)")
    return dt


def _swish(node, dt, a="a"):
    return f"({a} / ((TOUT)1 + exp(-{lit(node.attrs.get('alpha', 1.0), dt)} * {a})))"


def _kernels(expr_of):
    def kernels(node, ins, outs, deps):
        return [eltwise_call(node, ins, outs[0], expr_of(node, outs[0].dtype))]
    return kernels


def _shrink(node, dt):
    # computed in the compute type, then converted (an integer input: float lambd and bias)
    lam, bias = float(node.attrs.get("lambd", 0.5)), float(node.attrs.get("bias", 0.0))
    return (f"(TOUT)((float)a < {-lam!r}f ? (float)a + {bias!r}f : "
            f"(float)a > {lam!r}f ? (float)a - {bias!r}f : 0.0f)") if dt not in FLOATS else \
        (f"(a < -{lit(lam, dt)} ? a + {lit(bias, dt)} : a > {lit(lam, dt)} ? a - {lit(bias, dt)} "
         f": (TOUT)0)")


@register("Shrink", checked=9, kernels=_kernels(_shrink), host_ok=True)
def _shrink_infer(node, ins, deps):
    return [Layout(ins[0].shape, _one_type(node, ins, NUMERIC))]


@register("Swish", checked=24, kernels=_kernels(_swish), host_ok=True)
def _swish_infer(node, ins, deps):
    return [Layout(ins[0].shape, _one_type(node, ins, FLOATS))]


@register("SwiGLU", checked=28, kernels=_kernels(lambda n, dt: f"{_swish(n, dt)} * b"), host_ok=True)
def _swiglu_infer(node, ins, deps):
    dt = _one_type(node, ins, FLOATS)
    if tuple(ins[0].shape) != tuple(ins[1].shape):   # no broadcasting in SwiGLU
        raise ShapeInferenceError(f"SwiGLU {node.name}: A {ins[0]} and B {ins[1]} differ in shape")
    return [Layout(broadcast(ins[0].shape, ins[1].shape), dt)]
