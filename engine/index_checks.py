"""Indices out of range, refused as onnxruntime refuses them (the ONNX operator docs of Gather,
GatherElements, GatherND, ScatterElements and ScatterND: every index lies in [-s, s-1] for an
axis of size s; out of range is an error).

The kernels clamp an index so that a bad one cannot touch memory outside its tensors; the
clamped row they read is a wrong result, never a right one, so the network checks after each
inference, flow or plan replay alike, every such node: where the indices have a host value
(graph inputs such as input_ids, shape-subgraph values, values read back for shape inference),
a min/max over them (a few microseconds for a 512-token input_ids); where they were computed on
the device, the node's slot of the index flags its kernels set (engine/index_flags.py), read
with the outputs.
"""
from __future__ import annotations

import numpy as np

from engine.diagnose import cannot_run
from engine.index_flags import IndexFlags

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


def _text(bad: int, name: str, axis: int, s: int) -> str:
    return f"index {bad} of {name} is out of range for axis {axis} of size {s} ({-s}..{s - 1})"


def out_of_range(node, data_shape, idx: np.ndarray, name: str = "indices") -> str:
    """'index 7 of ids is out of range for axis 0 of size 4 (-4..3)', or '' when all fit."""
    for axis, v in _axes(node, data_shape, idx):
        if not 0 <= axis < len(data_shape) or not v.size:
            continue
        s = int(data_shape[axis])
        lo, hi = int(v.min()), int(v.max())
        if lo < -s or hi >= s:
            return _text(hi if hi >= s else lo, name, axis, s)
    return ""


def flagged(node, data_shape, column: int, bad: int, name: str) -> str:
    """The words of a bad index a kernel found (`column`: its place in an index row of GatherND
    and ScatterND, 0 otherwise)."""
    rank = len(data_shape)
    if node.op in ("GatherND", "ScatterND"):
        axis = (int(node.attrs.get("batch_dims", 0)) if node.op == "GatherND" else 0) + column
    else:
        axis = int(node.attrs.get("axis", 0))
        axis += rank if axis < 0 else 0
    return _text(bad, name, axis, int(data_shape[axis]) if 0 <= axis < rank else 0)


class IndexChecks:
    """The index checks of a network's device nodes (host nodes fail in numpy, in words)."""

    def __init__(self, insts):
        self.insts = [i for inst in insts for i in inst.family() if i.node.op in OPS
                      and not i.node.host and len(i.inputs) > 1 and i.inputs[1] is not None]
        # what the checks read after an inference (the message names every input's shape): a
        # plan replay must put it back at once
        self.tensors = {t for i in self.insts for t in i.inputs if t is not None}
        self.flags = IndexFlags(self.insts, self.insts[0].rt.queue) if self.insts else None

    def after(self, outs: dict) -> dict:
        """`outs` of an inference whose indices were all in range; InferenceError otherwise
        (the first node in execution order that refuses them)."""
        found = self.flags.found() if self.flags is not None else {}
        for k, inst in enumerate(self.insts):
            data, idx = inst.inputs[0], inst.inputs[1]
            if data.layout is None:
                continue
            if idx.host is not None:
                why = out_of_range(inst.node, data.layout.shape, np.asarray(idx.host), idx.name)
            else:
                why = flagged(inst.node, data.layout.shape, *found[k], idx.name) if k in found else ""
            if why:
                raise cannot_run(inst.node, [t.layout.shape if t is not None and t.layout is not None
                                             else None for t in inst.inputs], why)
        return outs
