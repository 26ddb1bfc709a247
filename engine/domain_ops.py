"""Domain ops (com.microsoft, what onnxruntime's transformer optimizer emits; also the
SimplifiedLayerNormalization onnxruntime keeps in the ONNX domain) rewritten at load into
ONNX-schema nodes, before constant folding, shape subgraphs and fusion see the graph.

Each such op registers `expand(node, ctx)` (engine/ops/registry.py `register_expansion`;
the ops are in engine/ops/ms/): it writes through `ctx` the ONNX nodes that compute the op,
ending in the op's own output names. The nodes run at EXPAND_OPSET whatever the model's
opset (each `Node` carries its opset), so an expansion is written against one set of schemas.
They then run as any exported graph does: LayerNormalization's kernel, MatMul with its bias in
the epilogue, the attention chain fused into one kernel (engine/attention_fusion.py), weight
splits folded as constants.

Some expansions depend on an input's rank (Attention's mask_index: lengths [B] or a raw mask
[B, T]) or dims known at load (a head size): they come from ONNX shape inference over the
graph, each domain op's outputs typed by inference over its expansion (the float16 casts
read those types too).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from engine.graph import ModelError
from engine.layout import dtype_from_onnx
from engine.ops import OPS
from engine.ops.registry import op_key

# the opset the expansions are written against (Gelu 20, ReduceMean's axes input 18)
EXPAND_OPSET = 21
FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)


class ExpandContext:
    """What an expansion writes through: new nodes and constants under names unique in the
    graph, the node's attributes, the element types and ranks of tensors."""

    def __init__(self, node: onnx.NodeProto, label: str, taken: set, types, shared: dict):
        self.proto, self.label, self._taken, self._types, self._shared = node, label, taken, types, shared
        self.nodes: list[onnx.NodeProto] = []
        self.attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        # tensor -> (elem type, dims: int | None, dims: int | symbol | None)
        self.declared: dict[str, tuple] = {}
        self.inferred: dict[str, tuple] = {}    # every tensor it makes (after expand)
        # the op's float type (its first float input's): float constants are made in it
        floats = [t[0] for t in map(types, node.input) if t is not None and t[0] in FLOATS]
        self.float_type = floats[0] if floats else TensorProto.FLOAT

    def fresh(self, hint: str) -> str:
        name, k = f"{self.label}/{hint}", 1
        while name in self._taken:
            k += 1
            name = f"{self.label}/{hint}_{k}"
        self._taken.add(name)
        return name

    def input(self, k: int) -> str:
        """Input `k`'s tensor name, "" when omitted."""
        return self.proto.input[k] if k < len(self.proto.input) else ""

    def output(self, k: int) -> str:
        return self.proto.output[k] if k < len(self.proto.output) else ""

    def op(self, op_type: str, inputs: list, outputs=None, n_out: int = 1, **attrs):
        """Add one node; returns its output name (its list when it has several). `outputs`
        names them (the domain op's own outputs), else they are fresh."""
        outs = list(outputs) if outputs is not None else [self.fresh(op_type.lower()) for _ in range(n_out)]
        ins = list(inputs)
        while ins and not ins[-1]:      # omitted optional inputs and outputs at the end
            ins.pop()
        kept = list(outs)
        while len(kept) > 1 and not kept[-1]:
            kept.pop()
        self.nodes.append(helper.make_node(op_type, ins, kept, name=self.fresh(op_type), **attrs))
        return outs[0] if len(outs) == 1 else outs

    def const(self, value, dtype=None) -> str:
        """A Constant node holding `value` (folded at load); dtype None: the op's float type."""
        name = self.fresh("const")
        dtype = helper.tensor_dtype_to_np_dtype(self.float_type) if dtype is None else dtype
        t = numpy_helper.from_array(np.asarray(value, dtype=dtype), name)
        self.nodes.append(helper.make_node("Constant", [], [name], name=self.fresh("Constant"), value=t))
        return name

    def dim(self, tensor: str, axis: int) -> str:
        """A [1] int64 tensor holding dim `axis` of `tensor` (a Shape: host-run shape math)."""
        end = {"end": axis + 1} if axis != -1 else {}
        return self.op("Shape", [tensor], start=axis, **end)

    def rank(self, tensor: str) -> int | None:
        t = self._types(tensor)
        return None if t is None else len(t[1])

    def shape(self, tensor: str) -> tuple | None:
        """`tensor`'s dims as far as known at load (None for a dynamic one), None if unknown."""
        t = self._types(tensor)
        return None if t is None else t[1]

    def symbols(self, tensor: str) -> tuple | None:
        """`tensor`'s dims as ints, symbols or None (see `symbol`), None if its rank is unknown."""
        t = self._types(tensor)
        return None if t is None else t[2]

    def lead(self, tensor: str, n: int) -> tuple:
        """The first `n` dims of `tensor` as `symbols` gives them (None where unknown)."""
        s = self.symbols(tensor)
        return tuple(s[:n]) if s is not None and len(s) >= n else (None,) * n

    def symbol(self, tensor: str, axis: int):
        """Dim `axis` of `tensor` as ONNX inference names it (a value, a symbol such as
        'batch': two dims with one symbol are equal), None if unknown."""
        t = self._types(tensor)
        return t[2][axis] if t is not None and -len(t[2]) <= axis < len(t[2]) else None

    def shared(self, key: tuple, make) -> str:
        """A tensor several expansions compute alike (a mask's bias over the same mask and
        dims): made once by `make()` and reused. A key holding None is never shared."""
        if any(k is None for k in key):
            return make()
        if key not in self._shared:
            self._shared[key] = make()
        return self._shared[key]

    def elem_type(self, tensor: str) -> int:
        t = self._types(tensor)
        return TensorProto.FLOAT if t is None else t[0]

    def declare(self, output: str, elem_type: int, shape) -> None:
        """The type and dims of one of the op's outputs, for ops downstream: ints, symbols
        (ctx.symbols of an input: the dims the op keeps) or None."""
        if output:
            self.declared[output] = (elem_type, tuple(d if isinstance(d, int) else None for d in shape),
                                     tuple(shape))

    def fail(self, why: str):
        raise ModelError(f"node {self.label} ({op_key(self.proto.domain, self.proto.op_type)}): {why}")


def _entry(tt) -> tuple:
    """(elem type, dims: int | None, dims: int | symbol | None) of a TypeProto.Tensor. The
    symbols ONNX inference makes up (unk__N) are dropped: each run numbers them anew."""
    dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
    syms = tuple(d.dim_value if d.HasField("dim_value") else
                 (d.dim_param if d.dim_param and not d.dim_param.startswith("unk__") else None)
                 for d in tt.shape.dim)
    return tt.elem_type, dims, syms


def _merge(inferred, declared):
    """An output's type: inference's dims where it knows them, the declared symbols where
    inference lost them (a dim the op keeps from an input)."""
    if inferred is None or declared is None or len(inferred[1]) != len(declared[1]):
        return inferred or declared
    dims = tuple(i if i is not None else d for i, d in zip(inferred[1], declared[1]))
    syms = tuple(d if d is not None else i for i, d in zip(inferred[2], declared[2]))
    return inferred[0], dims, syms


def _value_info(name: str, t: tuple):
    return helper.make_tensor_value_info(name, t[0], list(t[2]))


class _Types:
    """Element type and dims of the graph's tensors by ONNX shape inference, over the model
    with the domain ops expanded so far replaced by their declared outputs (rerun when a
    tensor not known yet is asked for after another expansion: it may be downstream of it)."""

    def __init__(self, model: onnx.ModelProto):
        self.model, self.known, self.declared, self.done = model, {}, {}, set()
        self.inside = {}    # the tensors inside expansions (a later one may read one: shared())
        self._infer()

    def __call__(self, name: str):
        if not name:
            return None
        if name in self.inside:
            return self.inside[name]
        if name not in self.known and self.stale:
            self._infer()
        return self.known.get(name)

    def _infer(self) -> None:
        g = self.model.graph
        names = {vi.name for vi in g.input}
        inputs = list(g.input) + [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                                  for t in g.initializer if t.name not in names]
        inputs += [_value_info(n, t) for n, t in self.declared.items()]
        light = helper.make_graph([n for n in g.node if id(n) not in self.done], g.name, inputs, [])
        # ONNX refuses nodes of a domain the model does not import (onnxruntime runs them)
        imports = list(self.model.opset_import)
        have = {o.domain for o in imports}
        imports += [helper.make_opsetid(d, 1) for d in sorted({n.domain for n in g.node} - have)]
        m = helper.make_model(light, opset_imports=imports, ir_version=self.model.ir_version)
        try:
            m = onnx.shape_inference.infer_shapes(m)
        except Exception:   # a graph ONNX cannot infer: the declared and input types only
            pass
        for vi in list(m.graph.input) + list(m.graph.value_info):
            tt = vi.type.tensor_type
            if tt.elem_type and tt.HasField("shape"):
                self.known[vi.name] = _entry(tt)
        self.known.update(self.declared)
        self.stale = False

    def refresh(self) -> None:
        if self.stale:
            self._infer()

    def expanded(self, node: onnx.NodeProto, declared: dict, inside: dict) -> None:
        self.done.add(id(node))
        self.inside.update(inside)
        self.declared.update(declared)
        self.known.update(declared)
        self.stale = True


def expansion(node: onnx.NodeProto):
    """The registered `expand` of `node`'s op, None when it runs as it is."""
    d = OPS.get(op_key(node.domain, node.op_type))
    return d.expand if d is not None else None


@dataclass
class Expanded:
    """The graph's nodes after expansion, each with the opset it runs at."""
    nodes: list                         # [(onnx.NodeProto, opset)]
    types: _Types | None = None
    parts: list = field(default_factory=list)   # the ExpandContext of each expansion

    def dtypes(self) -> dict[str, str]:
        """Engine dtypes of the graph's tensors, the expansions' included: what the float16
        casts need to know (ONNX inference cannot tell a domain op's outputs)."""
        if self.types is None:
            return {}
        self.types.refresh()    # the graph with every domain op's outputs declared
        known = dict(self.types.known)
        for ctx in self.parts:
            for name, t in ctx.inferred.items():
                known.setdefault(name, t)
        return {n: dt for n, t in known.items() if (dt := dtype_from_onnx(t[0])) is not None}


def _infer_expansion(ctx, types) -> dict:
    """Type and dims of every tensor an expansion makes, by ONNX inference over its nodes at
    EXPAND_OPSET (inputs typed as far as the graph tells); {} where that fails."""
    made = {o for n in ctx.nodes for o in n.output}
    reads = sorted({i for n in ctx.nodes for i in n.input if i and i not in made})
    ins = [_value_info(i, t) for i in reads if (t := types(i)) is not None]
    m = helper.make_model(helper.make_graph(ctx.nodes, "expansion", ins, []),
                          opset_imports=[helper.make_opsetid("", EXPAND_OPSET)])
    try:
        m = onnx.shape_inference.infer_shapes(m)
    except Exception:
        return {}
    out = {}
    for vi in m.graph.value_info:
        tt = vi.type.tensor_type
        if tt.elem_type and tt.HasField("shape"):
            out[vi.name] = _entry(tt)
    return out


def expand_domain_ops(model: onnx.ModelProto, opset: int) -> Expanded:
    """The graph's nodes with every domain op replaced by its expansion, each with the opset it
    runs at (`opset` for the model's own nodes, EXPAND_OPSET for the expansions'). The
    caller's model is left as it is. Unsupported ops were refused before (program.py)."""
    g = model.graph
    if not any(expansion(n) for n in g.node):
        return Expanded([(n, opset) for n in g.node])
    taken = {t.name for t in g.initializer} | {vi.name for vi in g.input} | \
        {n.name for n in g.node} | {o for n in g.node for o in n.output} | {i for n in g.node for i in n.input}
    out, shared = Expanded([], _Types(model)), {}
    for k, n in enumerate(g.node):
        expand = expansion(n)
        if expand is None:
            out.nodes.append((n, opset))
            continue
        ctx = ExpandContext(n, n.name or f"{n.op_type}_{k}", taken, out.types, shared)
        expand(n, ctx)
        ctx.inferred = _infer_expansion(ctx, out.types)
        # the op's outputs as inference gives them, with what the expansion declared
        outs = {o: _merge(ctx.inferred.get(o), ctx.declared.get(o)) for o in n.output if o}
        inside = {t: v for t, v in ctx.inferred.items() if t not in outs}
        out.types.expanded(n, {o: t for o, t in outs.items() if t is not None}, inside)
        out.nodes += [(e, EXPAND_OPSET) for e in ctx.nodes]
        out.parts.append(ctx)
    return out
