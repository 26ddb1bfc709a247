"""Elementwise math and activations on the eltwise kernel (cl/eltwise.cl): Neg, Abs, Exp, Log,
Reciprocal, trigonometry (Sin, Cos, ... : rotary embeddings), Floor, Ceil, Round, Sign, Mod,
Gelu, Softplus, Softsign, Mish, HardSigmoid, HardSwish, LeakyRelu, Elu, Selu, Celu,
ThresholdedRelu, PRelu, Clip, Min, Max.

Attributes become literals of the expression (JIT), so each attribute value is its own build.
Not fusable into producers (engine/fusion.py fuses the float-only BINARY/UNARY of eltwise.py).
"""
from __future__ import annotations

import math

from engine.layout import Layout
from engine.ops.registry import register
from engine.ops.common import ShapeInferenceError, broadcast, eltwise_call

FLOATS = ("f32", "f64", "f16")
SIGNED = ("i8", "i16", "i32", "i64")
UNSIGNED = ("u8", "u16", "u32", "u64")
NUMERIC = FLOATS + SIGNED + UNSIGNED


def lit(v, dtype="f32") -> str:
    """A float attribute as a C literal of the output type."""
    v = float(v)
    if math.isnan(v):
        return "(TOUT)NAN"
    if math.isinf(v):
        return "(TOUT)INFINITY" if v > 0 else "(TOUT)(-INFINITY)"
    return f"(TOUT){v!r}" + ("" if dtype == "f64" else "f")   # a float literal unless double


def same_dtype(node, ins, allowed) -> str:
    """The one element type of `ins` (absent optional inputs skipped), refused in words when
    they differ or it is not among `allowed` (elementwise, logic and bitwise ops share it)."""
    dts = {l.dtype for l in ins if l is not None}
    if len(dts) != 1:
        raise ShapeInferenceError(f"{node.op} {node.name}: inputs have different types {sorted(dts)}")
    dt = dts.pop()
    if dt not in allowed:
        raise ShapeInferenceError(f"{node.op} {node.name}: element type {dt} is not supported "
                                  f"({', '.join(allowed)} are)")
    return dt


def _present(ins):
    return tuple(i for i, l in enumerate(ins) if l is not None)


def _op(name, expr_of, allowed=FLOATS, **kw):
    """Register an elementwise op: expr_of(node, dtype, n_inputs) -> C expression; `kw` goes to
    register (checked, fuse_expr...)."""
    def kernels(node, ins, outs, deps):
        idx = _present(ins)
        return [eltwise_call(node, ins, outs[0], expr_of(node, outs[0].dtype, len(idx)), inputs=idx)]

    def infer(node, ins, deps):
        dt = same_dtype(node, ins, allowed)
        return [Layout(broadcast(*[l.shape for l in ins if l is not None]), dt)]

    register(name, kernels=kernels, host_ok=True, **kw)(infer)


def _a(node, key, default):
    return node.attrs.get(key, default)


_op("Neg", lambda n, dt, k: "-a", FLOATS + SIGNED, checked=13)
_op("Abs", lambda n, dt, k: "fabs(a)" if dt in FLOATS else "a" if dt in UNSIGNED else "(a < 0 ? -a : a)", NUMERIC, checked=13)
_op("Exp", lambda n, dt, k: "exp(a)", checked=13)
_op("Log", lambda n, dt, k: "log(a)", checked=13)
_op("Reciprocal", lambda n, dt, k: "(TOUT)1 / a", checked=13)
# log(1 + e^a) as max(a, 0) + log1p(e^-|a|): exp(a) overflows past 88 and log(1 + tiny) loses it
_op("Softplus", lambda n, dt, k: "(a > (TOUT)0 ? a + log1p(exp(-a)) : log1p(exp(a)))", checked=22)
_op("Softsign", lambda n, dt, k: "a / ((TOUT)1 + fabs(a))", checked=22)
_op("Mish", lambda n, dt, k: "a * tanh(log(exp(a) + (TOUT)1))", checked=22)
for _name, _fn, _checked in (
        ("Sin", "sin", 22), ("Cos", "cos", 22), ("Tan", "tan", 22), ("Asin", "asin", 22),
        ("Acos", "acos", 22), ("Atan", "atan", 22), ("Sinh", "sinh", 22), ("Cosh", "cosh", 22),
        ("Asinh", "asinh", 22), ("Acosh", "acosh", 22), ("Atanh", "atanh", 22),
        ("Floor", "floor", 13), ("Ceil", "ceil", 13),
        ("Round", "rint", 22)):   # rint: to nearest, ties to even (the default rounding mode)
    _op(_name, lambda n, dt, k, f=_fn: f"{f}(a)", checked=_checked)
_op("Sign", lambda n, dt, k: "(a > 0 ? (TOUT)1 : a < 0 ? (TOUT)-1 : a)" if dt in FLOATS
    else "(TOUT)((a > 0) - (a < 0))", NUMERIC, checked=13)


def _mod(node, dt, k):
    """fmod=1: C's remainder (sign of a); fmod=0: numpy's (sign of b). An integer divisor of
    0 (and MIN % -1) gives 0, as numpy does: C leaves it undefined (a CPU traps on it)."""
    if dt in FLOATS:
        r = "fmod(a, b)"
    elif dt in UNSIGNED:
        r = "(b == 0 ? (TOUT)0 : a % b)"
    else:
        r = "(b == 0 || b == (TOUT)-1 ? (TOUT)0 : a % b)"
    if node.attrs.get("fmod", 0) or dt in UNSIGNED:
        return r
    return f"(({r} != 0 && ({r} < 0) != (b < 0)) ? {r} + b : {r})"


_op("Mod", _mod, NUMERIC, checked=28)
# fmax/fmin return the other operand for NaN: NaN goes through a select (onnxruntime keeps it)
_op("HardSigmoid", lambda n, dt, k: f"(isnan(a) ? a : fmax((TOUT)0, fmin((TOUT)1, {lit(_a(n, 'alpha', 0.2), dt)} * a + "
                                    f"{lit(_a(n, 'beta', 0.5), dt)})))", checked=22)
_op("HardSwish", lambda n, dt, k: "a * fmax((TOUT)0, fmin((TOUT)1, a / (TOUT)6 + (TOUT)0.5))", checked=22)
_op("LeakyRelu", lambda n, dt, k: f"(a < 0 ? {lit(_a(n, 'alpha', 0.01), dt)} * a : a)", checked=16)
_op("Elu", lambda n, dt, k: f"(a < 0 ? {lit(_a(n, 'alpha', 1.0), dt)} * (exp(a) - (TOUT)1) : a)", checked=22)
_op("Selu", lambda n, dt, k: f"{lit(_a(n, 'gamma', 1.0507009873554805), dt)} * (a <= 0 ? "
                             f"{lit(_a(n, 'alpha', 1.6732632423543772), dt)} * (exp(a) - (TOUT)1) : a)", checked=22)
_op("Celu", lambda n, dt, k: f"((a < (TOUT)0 ? (TOUT)0 : a) + (a > (TOUT)0 ? (TOUT)0 : {lit(_a(n, 'alpha', 1.0), dt)} * "
                             f"(exp(a / {lit(_a(n, 'alpha', 1.0), dt)}) - (TOUT)1)))", checked=28)
_op("ThresholdedRelu", lambda n, dt, k: f"(a > {lit(_a(n, 'alpha', 1.0), dt)} ? a : (TOUT)0)", checked=22)
# slope b broadcasts to x (unidirectional in ONNX; numpy broadcasting is the superset)
_op("PRelu", lambda n, dt, k: "(a < 0 ? (TOUT)(b * a) : a)", FLOATS + SIGNED + UNSIGNED, checked=16)


def gelu_expr(node, dt, k):
    if _a(node, "approximate", "none") == "tanh":
        return (f"(TOUT)0.5 * a * ((TOUT)1 + tanh({lit(math.sqrt(2 / math.pi), dt)} * "
                f"(a + {lit(0.044715, dt)} * a * a * a)))")
    return f"(TOUT)0.5 * a * ((TOUT)1 + erf(a * {lit(math.sqrt(0.5), dt)}))"


# exporters at opset 20 emit Gelu: it runs in its MatMul's epilogue (float32 there)
_op("Gelu", gelu_expr, checked=20, fuse_expr=lambda n: gelu_expr(n, "f32", 1))


# ---- Min / Max: variadic, broadcasting; NaN propagates as numpy's minimum/maximum -------------
def _fold(node, dt, k, cmp):
    names = "abcde"[:k]
    if k > 5:
        raise ShapeInferenceError(f"{node.op} {node.name}: more than 5 inputs")
    e = names[0]
    for v in names[1:]:
        nan = f"isnan({e}) || " if dt in FLOATS else ""
        e = f"(({nan}{e} {cmp} {v}) ? {e} : {v})"
    return e


_op("Min", lambda n, dt, k: _fold(n, dt, k, "<"), NUMERIC, checked=13)
_op("Max", lambda n, dt, k: _fold(n, dt, k, ">"), NUMERIC, checked=13)


# ---- Clip: min/max attributes before opset 11, optional inputs 1 and 2 after ------------------
def _clip_kernels(node, ins, outs, deps):
    dt = outs[0].dtype
    x = "a"
    if node.opset < 11:
        lo, hi = node.attrs.get("min"), node.attrs.get("max")
        if lo is not None:
            x = f"(a < {lit(lo, dt)} ? {lit(lo, dt)} : a)"
        if hi is not None:
            x = f"({x} > {lit(hi, dt)} ? {lit(hi, dt)} : {x})"
        return [eltwise_call(node, ins[:1], outs[0], x, inputs=(0,))]
    idx = _present(ins)
    names = dict(zip(idx, "abc"))
    if 1 in names:
        x = f"(a < {names[1]} ? {names[1]} : a)"
    if 2 in names:
        x = f"({x} > {names[2]} ? {names[2]} : {x})"
    # min and max are scalars: they broadcast like any operand
    return [eltwise_call(node, ins, outs[0], x, inputs=idx)]


@register("Clip", checked=13, kernels=_clip_kernels, host_ok=True)
def _clip(node, ins, deps):
    dt = same_dtype(node, ins, NUMERIC)
    for l in ins[1:]:
        if l is not None and l.count != 1:
            raise ShapeInferenceError(f"Clip {node.name}: min/max must be scalars, got {l}")
    return [Layout(ins[0].shape, dt)]
