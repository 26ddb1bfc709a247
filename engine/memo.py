"""Bounded memo tables for the flow's pure functions of shapes (a node's output layouts, its
kernel calls, a kernel's shape_info for given offsets): a sequence of shapes that come back
computes each once. The flow still takes every decision; this only saves recomputing what the
same shapes gave before. Nodes of one class (node_class: the same op, attributes, fused ops and
inputs present) share their tables: a transformer's layers ask the same questions of the same
shapes, so one layer's answer serves all of them (a new sequence length, a decode step)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx


class Memo(dict):
    """A dict that forgets its oldest entry past `size` (insertion order)."""

    def __init__(self, size: int = 32):
        super().__init__()
        self.size = size

    def put(self, key, value):
        if len(self) >= self.size:
            del self[next(iter(self))]
        self[key] = value
        return value


def values_key(deps: dict) -> tuple:
    """Host values (memory deps) as a hashable key."""
    return tuple((i, a.dtype.str, a.shape, a.tobytes()) for i, a in ((i, np.asarray(v)) for i, v in deps.items()))


SHARED_SIZE = 4096       # entries of each shared table (about 60 classes in a BERT)


@dataclass
class SharedMemos:
    """The tables nodes of one class share (their keys begin with the class)."""
    layouts: Memo = field(default_factory=lambda: Memo(SHARED_SIZE))   # -> (out layouts, unfuse reason)
    calls: Memo = field(default_factory=lambda: Memo(SHARED_SIZE))     # -> dynamic impl's kernel calls
    info: Memo = field(default_factory=lambda: Memo(SHARED_SIZE))      # (call, offsets) -> shape_info


class _Unshared(Exception):
    pass


def node_class(node, fusion, n_own: int, kv_append: bool) -> tuple | None:
    """What a node's output layouts and dynamic kernel calls depend on besides its input
    layouts and memory deps: op, opset, attributes, which inputs and outputs are present, its
    fused ops (their expressions and operand positions, not their names) and the KV append it
    takes. None when an attribute has no value key (the node keeps tables of its own)."""
    try:
        attrs = tuple(sorted((k, _value_key(v)) for k, v in node.attrs.items()))
        return (node.op, node.opset, attrs, tuple(bool(i) for i in node.inputs),
                tuple(bool(o) for o in node.outputs), n_own, fusion_key(fusion), kv_append)
    except _Unshared:
        return None


def fusion_key(f) -> tuple | None:
    if f is None:
        return None
    if f.subgraph:     # its check reads the node's attributes (in the class already)
        return ("subgraph", tuple(op.node.op for op in f.ops))
    at = {name: k for k, name in enumerate(f.extra)}
    return (f.prologue, tuple((op.expr, tuple((kind, at[x] if kind == "t" else x) for kind, x in op.operands))
                              for op in f.ops), tuple(sorted((at[x], t) for x, t in f.types.items())))


def _value_key(v):
    if isinstance(v, (int, float, str, bytes, bool, type(None))):
        return v
    if isinstance(v, (list, tuple)):
        return tuple(_value_key(x) for x in v)
    if isinstance(v, np.ndarray):
        return (v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, onnx.TensorProto):
        return v.SerializeToString()
    if hasattr(v, "subgraph") and hasattr(v, "ops"):     # a Fusion (a fused attention's prologue)
        return fusion_key(v)
    raise _Unshared
