"""Reshape targets that copy the input's own dims (program build).

Exporters spell `x.view(x.size(0), x.size(1), heads, d)` as a shape subgraph per Reshape:

    Concat(Unsqueeze(Gather(Shape(x), 0)), Unsqueeze(Gather(Shape(x), 1)), [heads, d]) -> Reshape(x, .)

Four host nodes per dim copied, each run by the flow on every new signature (173 of the
MiniLM-architecture BERT's 397 nodes, 344 of GPT-2-small's 817). ONNX's Reshape says the same
with a 0 (allowzero = 0: "copy the input's dim at this position"), so such a target becomes the
constant [0, 0, heads, d] and the shape nodes nothing else reads go. Taken only where every
copied dim is the Reshape's own input's dim at the same position (a Gather of its Shape, index =
position, no Shape start/end) and the Reshape has allowzero = 0 (a 0 the target already held
keeps its meaning); anything else keeps its subgraph.
"""
from __future__ import annotations

import numpy as np

from engine.graph import link


def fold_own_dim_targets(prog) -> int:
    """Rewrite the Reshape targets of `prog` that copy the input's own dims; returns how many
    shape nodes went."""
    made = 0
    for r in prog.nodes:
        if r.op != "Reshape" or int(r.attrs.get("allowzero", 0)) or len(r.inputs) < 2:
            continue
        target = _own_dims_target(prog, r.inputs[0], r.inputs[1])
        if target is not None:
            name = f"{r.name}:own_dims"
            prog.constants[name] = target
            r.inputs[1] = name
            made += 1
    if not made:
        return 0
    link(prog)
    before = len(prog.nodes)
    while True:     # shape nodes nothing reads any more (a Concat, then its parts...)
        read = set(prog.users) | set(prog.outputs)
        dead = [n for n in prog.nodes if n.op in _SHAPE_OPS and not any(o in read for o in n.outputs if o)]
        if not dead:
            break
        gone = set(map(id, dead))
        prog.nodes = [n for n in prog.nodes if id(n) not in gone]
        link(prog)
    return before - len(prog.nodes)


_SHAPE_OPS = ("Shape", "Gather", "Unsqueeze", "Concat")


def _own_dims_target(prog, x: str, target: str) -> np.ndarray | None:
    """The target as a constant with 0 for each dim copied from `x` at its own position, or
    None when some part of it is anything else."""
    hit = prog.producers.get(target)
    concat = hit[0] if hit else None
    if concat is None or concat.op != "Concat" or int(concat.attrs.get("axis", 0)) not in (0, -1):
        return None
    parts, copied = [], 0
    for name in concat.inputs:
        if name in prog.constants:
            v = np.asarray(prog.constants[name])
            if v.ndim != 1 or v.dtype != np.int64:
                return None
            parts.append(v)
            continue
        if _dim_of(prog, name, x) != sum(len(p) for p in parts):
            return None
        parts.append(np.zeros(1, np.int64))
        copied += 1
    return np.concatenate(parts) if copied else None


def _dim_of(prog, name: str, x: str) -> int | None:
    """The index i when `name` is Unsqueeze(Gather(Shape(x), i), [0]) or Gather(Shape(x), [i]),
    a 1-element vector; else None."""
    node = _producer(prog, name)
    if node is None:
        return None
    if node.op == "Unsqueeze":
        axes = node.attrs.get("axes")
        if axes is None and len(node.inputs) > 1:
            axes = prog.constants.get(node.inputs[1])
        if axes is None or [int(a) for a in np.asarray(axes).reshape(-1)] not in ([0], [-1]):
            return None
        node, scalar = _producer(prog, node.inputs[0]), True
    else:
        scalar = False
    if node is None or node.op != "Gather" or int(node.attrs.get("axis", 0)) != 0:
        return None
    idx = prog.constants.get(node.inputs[1])
    shape = _producer(prog, node.inputs[0])
    if idx is None or shape is None or shape.op != "Shape" or shape.inputs[0] != x or \
            int(shape.attrs.get("start", 0)) != 0 or shape.attrs.get("end") is not None:
        return None
    idx = np.asarray(idx)
    if idx.ndim != (0 if scalar else 1) or idx.size != 1 or int(idx.reshape(-1)[0]) < 0:
        return None
    return int(idx.reshape(-1)[0])


def _producer(prog, name: str):
    hit = prog.producers.get(name)
    return hit[0] if hit else None
