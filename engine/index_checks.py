"""Indices out of range, refused as onnxruntime refuses them (the ONNX operator docs of Gather,
GatherElements, GatherND, ScatterElements and ScatterND: every index lies in [-s, s-1] for an
axis of size s; out of range is an error).

The kernels clamp an index so that a bad one cannot touch memory outside its tensors; the
clamped row they read is a wrong result, never a right one, so the network checks after each
inference, flow or plan replay alike, every such node whose indices have a host value (graph
inputs such as input_ids, shape-subgraph values, values read back for shape inference): a
min/max over the indices (a few microseconds for a 512-token input_ids); no device read. Indices computed on the device
(ArgMax, TopK, NonZero: in range by construction) are not read back for this.
"""
from __future__ import annotations

import numpy as np

from engine.diagnose import cannot_run

OPS = ("Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND")


def _axes(node, data_shape, idx: np.ndarray):
    """(axis of data, the indices along it) for each indexed axis of `node`."""
    rank = len(data_shape)
    if node.op in ("GatherND", "ScatterND"):
        b = int(node.attrs.get("batch_dims", 0)) if node.op == "GatherND" else 0
        k = idx.shape[-1] if idx.ndim else 0
        return [(b + j, idx[..., j]) for j in range(k) if b + j < rank]
    axis = int(node.attrs.get("axis", 0))
    return [(axis + rank if axis < 0 else axis, idx)]


def out_of_range(node, data_shape, idx: np.ndarray, name: str = "indices") -> str:
    """'index 7 of ids is out of range for axis 0 of size 4 (-4..3)', or '' when all fit."""
    for axis, v in _axes(node, data_shape, idx):
        if not 0 <= axis < len(data_shape) or not v.size:
            continue
        s = int(data_shape[axis])
        lo, hi = int(v.min()), int(v.max())
        if lo < -s or hi >= s:
            bad = hi if hi >= s else lo
            return f"index {bad} of {name} is out of range for axis {axis} of size {s} ({-s}..{s - 1})"
    return ""


class IndexChecks:
    """The index checks of a network's device nodes (host nodes fail in numpy, in words)."""

    def __init__(self, insts):
        self.insts = [i for i in insts if i.node.op in OPS and not i.node.host
                      and len(i.inputs) > 1 and i.inputs[1] is not None]
        # what the checks read after an inference: a plan replay must put it back at once
        self.tensors = {t for i in self.insts for t in i.inputs[:2] if t is not None}

    def after(self, outs: dict) -> dict:
        """`outs` of an inference whose indices were all in range; InferenceError otherwise."""
        for inst in self.insts:
            data, idx = inst.inputs[0], inst.inputs[1]
            if idx.host is None or data.layout is None:
                continue
            why = out_of_range(inst.node, data.layout.shape, np.asarray(idx.host), idx.name)
            if why:
                raise cannot_run(inst.node, [t.layout.shape if t is not None and t.layout is not None
                                             else None for t in inst.inputs], why)
        return outs
