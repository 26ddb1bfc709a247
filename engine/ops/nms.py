"""NonMaxSuppression on the device, split at program build as NonZero is (engine/ops/nonzero.py):

- `nms_select` (node `<name>_select`): a kernel keeps each (batch, class)'s boxes, writing
  their indices [B * C, S] (int32) and how many [B * C] (int64); its layouts never depend on data;
- `gather_nms` (keeps the node's name and output): its shape inference reads only the counts
  (`shape_deps=(1,)`: B * C longs from the device), and it is `dynamic_output`; its kernel writes
  the [count, 3] int64 (batch, class, box) rows, batch then class order, as ONNX does.

The thresholds and max_output_boxes_per_class are read by the kernel from their tensors (absent:
0, so no box is kept without max_output_boxes_per_class, as onnx.reference and onnxruntime).
"""
from __future__ import annotations

from dataclasses import replace

from engine.kernels import KernelCall
from engine.layout import Layout
from engine.ops.registry import register
from engine.ops.common import ShapeInferenceError

OPTIONAL = (("HAS_MAX", "T_MAX", "i64"), ("HAS_IOU", "T_IOU", "f32"), ("HAS_SCORE", "T_SCORE", "f32"))


def _geometry(node, ins):
    boxes, scores = ins[0], ins[1]
    if boxes.dtype != "f32" or scores.dtype != "f32":
        raise ShapeInferenceError(f"NonMaxSuppression {node.name}: boxes {boxes} and scores {scores} "
                                  "must be float32")
    if boxes.rank != 3 or boxes.shape[2] != 4 or scores.rank != 3 or \
            scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ShapeInferenceError(f"NonMaxSuppression {node.name}: boxes {boxes} and scores {scores} "
                                  "must be [B, S, 4] and [B, C, S]")
    for (_, _, dt), l in zip(OPTIONAL, ins[2:5]):
        if l is not None and (l.dtype != dt or l.count != 1):
            raise ShapeInferenceError(f"NonMaxSuppression {node.name}: {l} must be one {dt} value")
    b, s, c = boxes.shape[0], boxes.shape[1], scores.shape[1]
    return s, c, b * c


def _select_kernels(node, ins, outs, deps):
    s, c, bc = _geometry(node, ins)
    jit, args = [("NMS_SELECT", 1), ("CENTER", int(node.attrs.get("center_point_box", 0)))], \
        [("in", 0), ("in", 1)]
    for k, (has, pos, _) in enumerate(OPTIONAL):
        given = len(ins) > k + 2 and ins[k + 2] is not None
        jit.append((has, int(given)))
        if given:
            jit.append((pos, len(args)))
            args.append(("in", k + 2))
    jit += [("T_SEL", len(args)), ("T_CNT", len(args) + 1), ("IMPL_TAG", "nms_select")]
    return [KernelCall("nms", "nms_select", tuple(jit), tuple(args) + (("out", 0), ("out", 1)),
                       params=(s, c, bc), gws=(max(bc, 1),))]


@register("nms_select", kernels=_select_kernels, internal=True)
def _select(node, ins, deps):
    s, _, bc = _geometry(node, ins)
    return [Layout((bc, s), "i32"), Layout((bc,), "i64")]


def _gather_kernels(node, ins, outs, deps):
    bc, s = ins[0].shape
    c = ins[2].shape[1]    # scores' layout only: its data is not read
    return [KernelCall("nms", "gather_nms", (("GATHER_NMS", 1), ("IMPL_TAG", "gather_nms")),
                       (("in", 0), ("in", 1), ("out", 0)), params=(s, c, bc), gws=(max(bc, 1),))]


@register("gather_nms", kernels=_gather_kernels, shape_deps=(1,), dynamic_output=True, internal=True)
def _gather(node, ins, deps):
    counts = deps[1].reshape(-1)
    if (counts < 0).any() or (counts > ins[0].shape[1]).any():
        raise ShapeInferenceError(f"nms_select gave counts {counts.tolist()} for {ins[0]}")
    return [Layout((int(counts.sum()), 3), "i64")]


def split_nms(node) -> list:
    """NonMaxSuppression -> nms_select + gather_nms (scores go along to gather_nms for the class
    count C of their layout: its other inputs are [B * C, S] and [B * C])."""
    sel, cnt = f"{node.outputs[0]}_sel", f"{node.outputs[0]}_counts"
    return [replace(node, name=f"{node.name}_select", op="nms_select", outputs=[sel, cnt]),
            replace(node, op="gather_nms", inputs=[sel, cnt, node.inputs[1]])]


# checked 11: the schema has not changed since
@register("NonMaxSuppression", checked=11, decompose=split_nms, dynamic_output=True)
def _nms(node, ins, deps):
    raise ShapeInferenceError(f"NonMaxSuppression node {node.name} was not split at program build")
