"""Bitwise ops on integers, on the eltwise kernel (cl/eltwise.cl): BitwiseAnd, BitwiseOr,
BitwiseXor, BitwiseNot and BitShift (unsigned types only, as ONNX defines it)."""
from __future__ import annotations

from engine.layout import Layout
from engine.ops.registry import register
from engine.ops.activation import SIGNED, UNSIGNED, same_dtype
from engine.ops.common import ShapeInferenceError, broadcast, eltwise_call

INTEGERS = SIGNED + UNSIGNED
BITS = {"i8": 8, "u8": 8, "i16": 16, "u16": 16, "i32": 32, "u32": 32, "i64": 64, "u64": 64}


def _int_op(name, expr_of, allowed, checked):
    def kernels(node, ins, outs, deps):
        return [eltwise_call(node, ins, outs[0], expr_of(node, outs[0].dtype))]

    def infer(node, ins, deps):
        return [Layout(broadcast(*[l.shape for l in ins]), same_dtype(node, ins, allowed))]

    register(name, kernels=kernels, host_ok=True, checked=checked)(infer)


_int_op("BitwiseAnd", lambda n, dt: "a & b", INTEGERS, 18)
_int_op("BitwiseOr", lambda n, dt: "a | b", INTEGERS, 18)
_int_op("BitwiseXor", lambda n, dt: "a ^ b", INTEGERS, 18)
_int_op("BitwiseNot", lambda n, dt: "(TOUT)~a", INTEGERS, 18)


UNSIGNED_OF = {"i8": "uchar", "i16": "ushort", "i32": "uint", "i64": "ulong"}


def _shift(node, dt):
    """BitShift-28: a signed right shift sign-extends; a left shift runs on the unsigned bits (past
    the sign bit they are dropped, not undefined as in C). An amount that is negative or not
    below the width gives what the sign fill alone gives (OpenCL would take it modulo the width)."""
    d = node.attrs.get("direction")
    if d not in ("LEFT", "RIGHT"):
        raise ShapeInferenceError(f"BitShift {node.name}: direction must be LEFT or RIGHT, got {d!r}")
    signed = dt in UNSIGNED_OF
    bad = f"(b >= (TOUT){BITS[dt]}" + (" || b < (TOUT)0)" if signed else ")")
    if d == "LEFT":
        shifted = f"(TOUT)(({UNSIGNED_OF[dt]})a << b)" if signed else "(TOUT)(a << b)"
        return f"({bad} ? (TOUT)0 : {shifted})"
    fill = "(a < (TOUT)0 ? (TOUT)-1 : (TOUT)0)" if signed else "(TOUT)0"
    return f"({bad} ? {fill} : (TOUT)(a >> b))"


# BitShift-28 added the signed types
_int_op("BitShift", _shift, INTEGERS, 28)
