"""Symbolic host values: the integer shape math of a decode step's dirty host nodes (the Shape
of a cache, the Gather of its length, Unsqueeze, Add...) evaluated on symbolic dims, so that a
compiled step's function computes them with the rest (compiled_steps.py) instead of each node
running its flow. Values are numpy object arrays of Syms and ints; the ops are the few that
shape subgraphs use around a dynamic dim, with the same semantics as engine/host_ops.py's
numpy (ONNX's): any other op, dtype or case gives None and the node runs its flow.

A whole compiled plan (compiled.py) computes its shape subgraph so too, in a function of its
own run before the plan's (`HostFn`): there a Slice of a constant by symbolic bounds (BERT's
position ids, the table's first `length` entries) is a value too (`Sliced`), the constant
sliced at run time, its length a dim of the function.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from engine.decisions import count
from engine.primitive_inst import same_value
from engine.layout import Layout, dtype_from_numpy
from engine.symbolic import Escape, Session, check, concrete

_INT = ("i64", "i32")
_ARITH = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}


def _obj(v) -> np.ndarray:
    """An object array of `v` (an array, a list of dims, one dim), filled slot by slot: numpy
    would ask a Sym for an array of its own."""
    if isinstance(v, np.ndarray):
        return v if v.dtype == object else v.astype(object)
    items = v if isinstance(v, list) else [v]
    out = np.empty(len(items), dtype=object)
    for k, x in enumerate(items):
        out[k] = x
    return out if isinstance(v, list) else out.reshape(())


def _axes(node, vals, k) -> list | None:
    if len(vals) > k and vals[k] is not None:
        return [int(a) for a in np.asarray(vals[k]).reshape(-1)]
    a = node.attrs.get("axes")
    return None if a is None else [int(x) for x in a]


class Sliced:
    """A Slice of a constant by symbolic bounds: `data[start:stop:step, ...]` at run time (a
    view, as host_ops' Slice gives). Only a device node may read it (its layout is a
    parameter of the plan's function): a host node that does is no symbolic math."""
    __slots__ = ("data", "bounds")

    def __init__(self, data: np.ndarray, bounds: list):
        self.data, self.bounds = data, bounds

    def concrete(self) -> np.ndarray:
        return self.data[tuple(slice(None) if b is None else slice(*map(concrete, b)) for b in self.bounds)]

    def source(self, s: Session) -> str:
        return s.const(self.data) + "[" + ", ".join(
            ":" if b is None else ":".join(s.named(x) for x in b) for b in self.bounds) + "]"


def _int_or_sym(v):
    return v if v.__class__ is not np.ndarray and not isinstance(v, np.integer) else int(v)


def _sliced(node, vals) -> list | None:
    """A Slice (opset 10+) of a constant by bounds some of which are symbolic, its axes and
    steps constants (positive steps: Python's slice clamps as ONNX's does then)."""
    x = vals[0]
    if node.opset < 10 or x.dtype == object or any(v is not None and v.dtype == object for v in vals[3:]):
        return None
    starts, ends = (_obj(v).reshape(-1) for v in vals[1:3])
    axes = range(len(starts)) if len(vals) < 4 or vals[3] is None else [int(a) for a in vals[3].reshape(-1)]
    steps = [1] * len(starts) if len(vals) < 5 or vals[4] is None else [int(a) for a in vals[4].reshape(-1)]
    bounds = [None] * x.ndim
    for a, b, e, st in zip(axes, starts, ends, steps):
        if st <= 0:
            return None
        bounds[a % x.ndim] = (_int_or_sym(b), _int_or_sym(e), st)
    return [Sliced(x, bounds)]


def sym_outputs(inst, in_layouts, vals, slices: bool = False) -> list | None:
    """`inst`'s output values for these input layouts (symbolic) and values (object arrays for
    symbolic host values, ndarrays for constants, None for inputs it reads no value of), or
    None when it is not symbolic integer math. `slices`: a Slice of a constant is a value too
    (Sliced)."""
    if any(v.__class__ is Sliced for v in vals):
        return None                     # (only a device node reads one)
    if slices and inst.node.op == "Slice" and vals and all(v is not None for v in vals[:3]):
        return _sliced(inst.node, vals)
    out = _outputs(inst, in_layouts, vals)
    return None if out is None else [_obj(v) for v in out]   # (numpy gives 0-d results as scalars)


def _outputs(inst, in_layouts, vals) -> list | None:
    node = inst.node
    op = node.op
    if any(t.layout is None or t.layout.dtype not in _INT for t in inst.outputs):
        return None
    if op == "Shape":
        shape = in_layouts[0].shape
        return [_obj(list(shape[slice(node.attrs.get("start", 0), node.attrs.get("end", len(shape)))]))]
    if any(v is None for v in vals):
        return None
    if op == "Gather":
        idx = vals[1]
        if idx.dtype == object:                # a symbolic index picks nothing numpy can take
            return None
        return [np.take(_obj(vals[0]), idx, axis=int(node.attrs.get("axis", 0)))]
    if op in ("Unsqueeze", "Squeeze"):
        axes = _axes(node, vals, 1)
        if any(v.dtype == object for v in vals[1:]):
            return None
        x = _obj(vals[0])
        if op == "Squeeze":
            return [np.squeeze(x, axis=None if axes is None else tuple(a % x.ndim for a in axes))]
        rank = x.ndim + len(axes)
        shape = list(x.shape)
        for a in sorted(a % rank for a in axes):
            shape.insert(a, 1)
        return [x.reshape(shape)]
    if op == "Concat":
        return [np.concatenate([_obj(v) for v in vals], axis=int(node.attrs["axis"]))]
    if op in _ARITH:
        return [_ARITH[op](_obj(vals[0]), _obj(vals[1]))]
    if op == "Identity":
        return [_obj(vals[0])]
    return None


# run_host's two decisions where a node computes
_HOST_PATH = Counter()
count(_HOST_PATH, "update_shape", "infer", "shape_changed", {})
count(_HOST_PATH, "execute", "host", "", {})


def host_part(c, hosts) -> None:
    """The host nodes a compiled step computes (trace_hosts), and what their flow would count."""
    c.hosts = c.host_counts = c.run_hosts = None
    if hosts is None:
        return
    sym_nodes, c.run_hosts = hosts
    c.hosts = [(inst, inst.node.op == "Shape", [(t, v.shape, t.host.dtype) for t, v in zip(inst.outputs, vals)],
                checks) for (inst, checks), vals in sym_nodes]
    c.host_counts = Counter()
    for _ in sym_nodes:
        c.host_counts.update(_HOST_PATH)


def trace_hosts(fast, d, sym) -> tuple | None:
    """(the dirty host nodes of `d` (compiled_steps.Dirty) whose values are symbolic integer
    math, each with its checks and output values, in order; those that run their flow) or None
    when none is, or when a parameter of the function comes from one that runs its flow."""
    dirty_out = {id(t) for i, _ in d.hosts for t in i.outputs}
    clean_host = {id(t) for i in fast.insts if i.node.host for t in i.outputs} - dirty_out
    hv: dict = {}
    sym_nodes, run_nodes = [], []
    for inst, checks in d.hosts:
        vals = [None if t is None else hv.get(id(t), t.host if t.host is not None and
                                               (t.constant or id(t) in clean_host) else None)
                for t in inst.inputs]
        in_l = [None if t is None else sym.get(id(t), t.layout) for t in inst.inputs]
        out = sym_outputs(inst, in_l, vals)
        if out is None or len(out) != len(inst.outputs):
            run_nodes.append((inst, checks))
            continue
        for t, v in zip(inst.outputs, out):
            got = np.array([concrete(x) for x in v.ravel()], t.host.dtype).reshape(v.shape) \
                if t.host is not None else None
            check(got is not None and same_value(got, t.host), inst, "a host value")
            hv[id(t)] = v
        sym_nodes.append(((inst, checks), out))
    shapes = {i.node.name for (i, _), _ in sym_nodes if i.node.op == "Shape"}
    run = {id(t) for i, _ in run_nodes for t in i.outputs}
    if not sym_nodes or any(id(t) in run for t in d.host_params):
        return None
    for (inst, _), _ in sym_nodes:      # each computes again because a Shape before it changed
        if inst.node.op != "Shape" and not inst.node.shape_sources & shapes:
            return None
    return sym_nodes, run_nodes


def apply_hosts(c, values: tuple, counters) -> bool:
    """A compiled step's dirty host nodes (compiled_steps.Steps.hosts): the values its function
    computed, when each node's flow would have computed them (a Shape's input moved and its
    value changed: the nodes after it compute again), then the nodes that run their flow.
    False: nothing done."""
    new = []
    for (inst, is_shape, outs, _), flat in zip(c.hosts, values):
        if is_shape and inst.in_layouts is not None and inst.inputs[0].layout == inst.in_layouts[0]:
            return False
        for (t, shape, dtype), f in zip(outs, flat):
            v = np.array(f, dtype).reshape(shape)
            same = t.host is not None and same_value(t.host, v)
            if same and is_shape:
                return False
            if not same and (t.layout is None or t.layout.shape != shape or t.layout.pad is not None):
                return False
            new.append((t, v, same))
    for t, v, same in new:                  # (run_host's own assignments)
        if not same:
            t.host = v
            t.version += 1
    for inst, is_shape, _, _ in c.hosts:
        inst.in_layouts = [t.layout if t is not None else None for t in inst.inputs]
        if is_shape:
            inst.rt.shape_of_changed.add(inst.node.name)
    counters.update(c.host_counts)
    for inst, _ in c.run_hosts:     # their flow's path, its two decisions counted at once
        if inst.host_step():
            counters.update(_HOST_PATH)
        else:
            inst.execute()
    return True


class HostFn:
    """The shape subgraph of a whole compiled plan (compiled.py) as one generated function of
    the graph inputs' dims, `fn(*dims)` -> each host node's output values (None when a guard
    fails); `nodes`: (node, whether a Shape, each output's fixed shape or None for a Sliced);
    `counts`: what their flow counts when each computes; `runs`: inferences it served."""
    __slots__ = ("fn", "source", "nodes", "counts", "runs")

    def apply(self, dims, rt, counters) -> bool:
        """The values for `dims`, set where each node's flow would set them (a Shape whose
        input moved and whose value changed: every node after it computes again, host_fn
        checked), its decisions counted. False, nothing done: a guard failed, or a Shape's
        input or value did not change (the flow skips there)."""
        got = self.fn(*dims)
        if got is None:
            return False
        outs = []
        for (inst, is_shape, shapes), values in zip(self.nodes, got):
            vals = [v if shape is None else np.array(v, t.host.dtype).reshape(shape)
                    for t, shape, v in zip(inst.outputs, shapes, values)]
            prev = inst.outputs[0].host
            if is_shape and (inst.in_layouts is None or inst.inputs[0].layout == inst.in_layouts[0] or
                             (prev is not None and same_value(prev, vals[0]))):
                return False
            outs.append(vals)
        for (inst, is_shape, _), vals in zip(self.nodes, outs):
            inst._host_outputs([t.layout if t is not None else None for t in inst.inputs], vals)
            if is_shape:
                rt.shape_of_changed.add(inst.node.name)
        counters.update(self.counts)
        self.runs += 1
        return True


def host_fn(host_insts: list, inputs: list) -> HostFn | None:
    """The shape subgraph `host_insts` (in order) as a HostFn of the graph `inputs`' dims,
    checked against the values the flow just computed; None when a node is no symbolic math
    (it reads a graph input's value, a device tensor, an op of none of the cases above) or
    would not compute again after a Shape that changed."""
    if not host_insts or any(t.host is None for i in host_insts for t in i.outputs):
        return None
    s = Session()
    try:
        with s:
            sym = {id(t): s.layout(t.layout) for t in inputs}
            hv: dict = {}
            nodes, parts = [], []
            for inst in host_insts:
                vals = [None if t is None else hv.get(id(t), t.host if t.constant else None) for t in inst.inputs]
                out = sym_outputs(inst, [None if t is None else sym.get(id(t), t.layout) for t in inst.inputs],
                                  vals, slices=True)
                if out is None or len(out) != len(inst.outputs):
                    return None
                src = []
                for t, v in zip(inst.outputs, out):
                    sliced = v.__class__ is Sliced
                    got = v.concrete() if sliced else np.array([concrete(x) for x in v.ravel()]).reshape(v.shape)
                    check(got.shape == t.host.shape and (not sliced or got.dtype == t.host.dtype)
                          and same_value(got.astype(t.host.dtype), t.host), inst, "a host value")
                    hv[id(t)] = v
                    if not sliced:          # (a Shape of it)
                        sym[id(t)] = Layout(v.shape, dtype_from_numpy(t.host.dtype))
                    src.append(v.source(s) if sliced else "(" + "".join(s.named(x) + ", " for x in v.ravel()) + ")")
                nodes.append((inst, inst.node.op == "Shape",
                              [None if v.__class__ is Sliced else v.shape for v in out]))
                parts.append("(" + "".join(x + ", " for x in src) + ")")
            fn, src = s.function("host_values", "(" + "".join(p + ", " for p in parts) + ")")
    except Escape:
        return None
    shapes = {i.node.name for i, is_shape, _ in nodes if is_shape}
    if any(not is_shape and not i.node.shape_sources & shapes for i, is_shape, _ in nodes):
        return None                     # (its flow would skip it: no Shape before it changes)
    h = HostFn()
    h.fn, h.source, h.nodes, h.runs = fn, src, nodes, 0
    h.counts = Counter()
    for _ in nodes:
        h.counts.update(_HOST_PATH)
    return h
