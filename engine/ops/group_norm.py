"""InstanceNormalization and GroupNormalization (opsets 18 and 21) on the device
(cl/group_norm.cl): one work-group per (batch, group) row, float32 statistics whatever the data
type (stash_type 1, the default). Opset 18's GroupNormalization takes scale/bias per group,
opset 21's per channel."""
from __future__ import annotations

from engine.kernels import KernelCall
from engine.layout import Layout, type_jit
from engine.ops.registry import register
from engine.ops.common import ShapeInferenceError
from engine.ops.norm import _f

WG = 64   # items per row: rows are short in small models and long in big ones; 64 is fair to both


def _geometry(node, ins):
    """(groups, channels per group, spatial size, per-channel scale)"""
    name = f"{node.op} {node.name}"
    if len(ins) < 3 or any(l is None for l in ins[:3]):
        raise ShapeInferenceError(f"{name}: needs X, scale and bias")
    x, sc, b = ins[:3]
    if x.dtype not in ("f32", "f16") or sc.dtype != x.dtype or b.dtype != x.dtype:
        raise ShapeInferenceError(f"{name}: X, scale, bias must all be float32 or all float16")
    if x.rank < 3:
        raise ShapeInferenceError(f"{name}: input {x} needs rank >= 3 (N, C, spatial...)")
    C = x.shape[1]
    S = 1
    for d in x.shape[2:]:
        S *= d
    if node.op == "InstanceNormalization":
        G, per_channel = C, True
    else:
        G = int(node.attrs.get("num_groups", 0))
        if G < 1 or C % G:
            raise ShapeInferenceError(f"{name}: num_groups {G} does not divide channels {C}")
        per_channel = node.opset >= 21
    want = C if per_channel else G
    if tuple(sc.shape) != (want,) or tuple(b.shape) != (want,):
        raise ShapeInferenceError(f"{name}: scale {sc} and bias {b} must be [{want}]")
    return G, C // G, S, per_channel


def _kernels(node, ins, outs, deps):
    G, cg, S, per_channel = _geometry(node, ins)
    rows = ins[0].shape[0] * G
    jit = (*type_jit("T", ins[0].dtype), ("WG", WG), ("EPS", _f(node.attrs.get("epsilon", 1e-5))),
           ("IMPL_TAG", node.op))
    return [KernelCall("group_norm", "group_norm", jit,
                       (("in", 0), ("in", 1), ("in", 2), ("out", 0)),
                       params=(G, cg, S, int(per_channel)), gws=(max(rows, 1) * WG,), lws=(WG,))]


def _infer(node, ins, deps):
    _geometry(node, ins)
    return [Layout(ins[0].shape, ins[0].dtype)]


register("InstanceNormalization", checked=22, kernels=_kernels, f16=True)(_infer)
register("GroupNormalization", checked=21, kernels=_kernels, f16=True)(_infer)
