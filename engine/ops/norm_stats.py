"""LayerNormalization's optional Mean and InvStdDev outputs (the training outputs ONNX's node
tests read): whatever norm.py's LayerNormalization does for Y, a node that asks for them gets
one more kernel (cl/reduce.cl row_stats) writing both, [rows dims..., 1, ...] float32.

Kept beside norm.py, wrapping its OpDef, so the Y kernel stays that module's alone."""
from __future__ import annotations

from dataclasses import replace

from engine.kernels import KernelCall
from engine.layout import Layout
from engine.ops.registry import OPS
from engine.ops.common import ShapeInferenceError, norm_axis

_LN = OPS["LayerNormalization"]
_infer_y, _kernels_y = _LN.infer, _LN.kernels


def _stats_wanted(node) -> bool:
    return any(o for o in node.outputs[1:])


def _y_node(node):
    return replace(node, outputs=node.outputs[:1]) if _stats_wanted(node) else node


def _geometry(node, x):
    axis = norm_axis(int(node.attrs.get("axis", -1)), x.rank)
    rows = 1
    for d in x.shape[:axis]:
        rows *= d
    return axis, rows, x.count // max(rows, 1)


def _infer(node, ins, deps):
    outs = _infer_y(_y_node(node), ins, deps)
    if not _stats_wanted(node):
        return outs
    x = ins[0]
    if int(node.attrs.get("stash_type", 1)) != 1:
        raise ShapeInferenceError(f"LayerNormalization {node.name}: stash_type must be float")
    axis, _, _ = _geometry(node, x)
    stats = Layout(tuple(x.shape[:axis]) + (1,) * (x.rank - axis), "f32")
    return outs + [stats] * (len(node.outputs) - 1)


def _kernels(node, ins, outs, deps, **dev):
    calls = _kernels_y(_y_node(node), ins, outs[:1], deps, **dev)   # dev: norm.py's per_device
    if not _stats_wanted(node):
        return calls
    if not all(node.outputs[1:3]) or len(node.outputs) != 3:
        raise ShapeInferenceError(f"LayerNormalization {node.name}: Mean and InvStdDev are "
                                  "supported together only")
    _, rows, d = _geometry(node, ins[0])
    eps = f"{float(node.attrs.get('epsilon', 1e-5))!r}f"
    calls.append(KernelCall("reduce", "row_stats", (("ROW_STATS", 1), ("EPS", eps),
                                                     ("IMPL_TAG", "LayerNormalization_stats")),
                            (("in", 0), ("out", 1), ("out", 2)), params=(rows, d),
                            gws=(max(rows, 1),)))
    return calls


_infer.__wrapped__, _kernels.__wrapped__ = _infer_y, _kernels_y   # the op's own module stays its family
_LN.infer, _LN.kernels = _infer, _kernels
