"""Comparisons, logical ops and float tests on the eltwise kernel (cl/eltwise.cl): Less,
LessOrEqual, Greater, GreaterOrEqual, And, Or, Xor, Not, IsNaN, IsInf. Outputs are bool (uchar
0/1 on the device). The attention masks of exported transformers are made of these."""
from __future__ import annotations

from engine.layout import Layout
from engine.ops.registry import register
from engine.ops.activation import FLOATS, NUMERIC, same_dtype
from engine.ops.common import broadcast, eltwise_call


def _bool_op(name, expr, allowed, expr_of=None, **kw):
    def kernels(node, ins, outs, deps):
        return [eltwise_call(node, ins, outs[0], expr_of(node) if expr_of else expr)]

    def infer(node, ins, deps):
        same_dtype(node, ins, allowed)
        return [Layout(broadcast(*[l.shape for l in ins]), "bool")]

    register(name, kernels=kernels, host_ok=True, **kw)(infer)


for _name, _cmp, _checked in (("Less", "<", 13), ("LessOrEqual", "<=", 16), ("Greater", ">", 13),
                              ("GreaterOrEqual", ">=", 16)):
    _bool_op(_name, f"(TOUT)(a {_cmp} b)", NUMERIC, checked=_checked)
_bool_op("And", "(TOUT)(a && b)", ("bool",), checked=7)
_bool_op("Or", "(TOUT)(a || b)", ("bool",), checked=7)
_bool_op("Xor", "(TOUT)((a != 0) != (b != 0))", ("bool",), checked=7)
_bool_op("Not", "(TOUT)(!a)", ("bool",), checked=1)
_bool_op("IsNaN", "(TOUT)isnan(a)", FLOATS, checked=20)


def _isinf(node):
    pos, neg = int(node.attrs.get("detect_positive", 1)), int(node.attrs.get("detect_negative", 1))
    return f"(TOUT)(isinf(a) && ((a > 0 && {pos}) || (a < 0 && {neg})))"


_bool_op("IsInf", None, FLOATS, _isinf, checked=20)
