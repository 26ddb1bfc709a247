"""ONNX import: the `Program` (the GPU plugin's cldnn::program) of `Node`s after constant folding.

What happens here, once per model:
- parse with `onnx`; graph inputs that are also initializers are constants (IR < 4 models);
- refuse, before anything runs, a model with any op outside the registry (one message);
- rewrite domain ops (com.microsoft) into the ONNX-domain nodes that compute them
  (engine/domain_ops.py);
- topological order; Constant nodes and every node whose inputs are all constants are folded
  with the host impl (onnx.reference), so weights built by ConstantOfShape become plain data;
- mark shape subgraphs: Shape nodes and the shape math that depends only on them and on
  constants run on the host (numpy, no device round trip), as the GPU plugin runs its
  shape_of subgraphs on CPU impls;
- split device nodes of ops that run as several primitives (NonZero -> count_nonzero +
  gather_nonzero, engine/ops/nonzero.py), as the GPU plugin's program builder does;
- fuse elementwise chains into their producers (engine/fusion.py).
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from engine.domain_ops import expand_domain_ops
from engine.f16 import insert_f16_casts
from engine.fusion import embedding_rows, fuse
from engine.graph import ModelError, Node, link
from engine.layout import Layout, dtype_from_onnx
from engine.model_file import check_graph, load_model
from engine.packed_projections import pack_projections
from engine.ops import OPS
from engine.ops.registry import ONNX_DOMAINS, domains, op_key
from engine.static_dims import fold_static_dims
from engine.reshape_targets import fold_own_dim_targets
from engine.subgraphs import attach_outer, subgraphs_of
from engine.opsets import MIN_OPSET, MAX_OPSET, too_old_ops, unchecked_ops


@dataclass
class Program:
    path: str
    nodes: list
    constants: dict          # tensor name -> np.ndarray
    inputs: dict             # graph input name -> declared Layout (dims None/int)
    input_dim_names: dict    # graph input name -> tuple of dim_param str | int | None
    outputs: list
    opset: int
    producers: dict = field(default_factory=dict)   # tensor -> (node, output index)
    users: dict = field(default_factory=dict)       # tensor -> [nodes]
    fused: int = 0                                   # nodes fused into their producer
    folded: int = 0
    warnings: list = field(default_factory=list)     # e.g. ops not checked at this opset
    dtypes: dict = field(default_factory=dict)       # tensor -> dtype where ONNX inference tells

    def node_count(self) -> int:
        return len(self.nodes)


def _attrs(node: onnx.NodeProto) -> dict:
    out = {}
    for a in node.attribute:
        if a.type == onnx.AttributeProto.TENSOR:
            out[a.name] = a.t
        else:
            out[a.name] = helper.get_attribute_value(a)
            if isinstance(out[a.name], bytes):
                out[a.name] = out[a.name].decode()
    return out


def _declared(vi) -> tuple[Layout, tuple]:
    tt = vi.type.tensor_type
    dt = dtype_from_onnx(tt.elem_type)
    if dt is None:
        raise ModelError(f"input {vi.name!r} has element type "
                         f"{onnx.TensorProto.DataType.Name(tt.elem_type)}, not supported "
                         "(float32, float64, bool and the 8 to 64-bit integers are)")
    if not tt.HasField("shape"):   # no shape declared: any rank; an unknown dim keeps it dynamic
        return Layout((None,), dt), ()
    names, shape = [], []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            names.append(d.dim_value)
            shape.append(d.dim_value)
        else:
            names.append(d.dim_param or None)
            shape.append(None)
    return Layout(tuple(shape), dt), tuple(names)


def _toposort(nodes: list, available: set) -> list:
    ready = set(available) | {""}
    pending = list(nodes)
    order = []
    while pending:
        progressed = False
        rest = []
        for n in pending:
            if all(i in ready for i in n.inputs):
                order.append(n)
                ready.update(n.outputs)
                progressed = True
            else:
                rest.append(n)
        if not progressed:
            missing = sorted({i for n in rest for i in n.inputs if i not in ready})
            raise ModelError(f"graph has a cycle or undefined tensors: {', '.join(missing[:5])}")
        pending = rest
    return order


def load_program(path: str | os.PathLike) -> Program:
    path = str(path)
    return build_program(load_model(path), path)


def build_program(model: onnx.ModelProto, path: str = "<model>", fusion: bool = True,
                  attention: bool = True, subgraph: bool = False) -> Program:
    """`attention=False` keeps the attention chain as separate nodes (engine/attention_fusion.py).
    `subgraph`: a control-flow node's subgraph (engine/control_flow.py), which may have no inputs."""
    check_graph(model.graph)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset < MIN_OPSET:
        raise ModelError(f"opset {opset} is not supported (opsets {MIN_OPSET} to {MAX_OPSET} are)")
    g = model.graph
    notes = _check_ops(g, opset)

    constants = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    inputs, dim_names = {}, {}
    for vi in g.input:
        if vi.name in constants:
            continue
        inputs[vi.name], dim_names[vi.name] = _declared(vi)
    if not inputs and not subgraph:
        raise ModelError("the model has no inputs")

    nodes, taken = [], set()
    expanded = expand_domain_ops(model, opset)
    for k, (n, node_opset) in enumerate(expanded.nodes):
        name = n.name or f"{n.op_type}_{k}"
        # ONNX does not require unique node names, the runtime does (decisions, scratch
        # buffers and the trace name nodes): a name met again gets the node's position
        while name in taken:
            name = f"{name}#{k}"
        taken.add(name)
        nodes.append(Node(name, n.op_type, list(n.input), list(n.output), _attrs(n), n, node_opset))
    nodes = attach_outer(nodes, model, opset)    # control flow: what subgraphs read from here
    nodes = _toposort(nodes, set(constants) | set(inputs))
    kept, folded = _fold_constants(nodes, constants)

    outputs = [o.name for o in g.output]
    prog = Program(path, kept, constants, inputs, dim_names, outputs, opset, folded=folded,
                   warnings=notes)
    link(prog)
    _check_outputs(prog)
    if fold_static_dims(model, prog):     # the shape math over them folds too
        prog.nodes, more = _fold_constants(prog.nodes, prog.constants)
        prog.folded += more
        link(prog)
    prog.folded += fold_own_dim_targets(prog)
    _mark_shape_subgraphs(prog)
    _decompose(prog)
    if insert_f16_casts(prog, model, expanded.dtypes):
        link(prog)
    packed = pack_projections(prog) if fusion else 0
    _mark_static(prog)
    if fusion:
        prog.fused = fuse(prog, attention=attention) + packed
    return prog


def _check_ops(g: onnx.GraphProto, opset: int) -> list[str]:
    """Refuse ops outside the registry (one message naming them all: ops of a domain the
    registry has none of as a custom domain) and ops whose schema at `opset` is older than the
    engine runs. A newer opset runs: the ops whose schema there was never checked are named
    once, in a warning and in the returned notes."""
    known = set(ONNX_DOMAINS) | domains()
    foreign = sorted({op_key(n.domain, n.op_type) for n in g.node if n.domain not in known})
    unsupported: dict[str, list] = {}
    for n in g.node:
        key = op_key(n.domain, n.op_type)
        if n.domain in known and (key not in OPS or OPS[key].internal):
            unsupported.setdefault(key, []).append(n.name or n.output[0])
    if unsupported or foreign:
        parts = [f"{op} (nodes: {', '.join(ns[:4])}{', ...' if len(ns) > 4 else ''})"
                 for op, ns in sorted(unsupported.items())] + [f"{f} (custom domain)" for f in foreign]
        raise ModelError("unsupported ops: " + "; ".join(parts))

    # control flow: a subgraph's ops are the model's too
    notes = [x for n in g.node for sub in subgraphs_of(n) for x in _check_ops(sub, opset)]
    # ops expanded at load (onnxruntime's SimplifiedLayerNormalization) have no ONNX schema
    used = {n.op_type for n in g.node if n.domain in ONNX_DOMAINS and OPS[n.op_type].expand is None}
    old = too_old_ops(used, opset)
    if old:
        raise ModelError(f"opset {opset}: the versions of {', '.join(old)} it selects are older "
                         "than the engine runs (those of opset 7 and later)")
    unchecked = unchecked_ops(used, opset)
    if unchecked:
        notes.append(f"opset {opset}: {', '.join(unchecked)} not checked against the schema "
                     f"version{'s' if len(unchecked) > 1 else ''} it selects"
                     + (f" (the installed onnx knows opsets up to {MAX_OPSET})" if opset > MAX_OPSET else ""))
        warnings.warn(notes[-1], stacklevel=3)   # at build_program's caller
    return notes


def _fold_constants(nodes: list, constants: dict) -> tuple[list, int]:
    """Constant folding (and Constant nodes) with the host impl: the outputs of every node whose
    inputs are all constants join `constants`. Returns (the nodes kept, the number folded)."""
    kept, folded = [], 0
    for n in nodes:
        # a control-flow node runs its subgraphs on the device, even over constants
        if all(i == "" or i in constants for i in n.inputs) and not n.opdef.control:
            vals = n.run_host([constants.get(i) for i in n.inputs])
            for o, v in zip(n.outputs, vals):
                if o:
                    constants[o] = v
            folded += 1
        else:
            kept.append(n)
    return kept, folded


def _decompose(prog: Program) -> None:
    """Device nodes of ops the device runs as several primitives (NonZero -> count_nonzero +
    gather_nonzero) are replaced by them; host nodes keep the ONNX op for the host impl."""
    if not any(n.opdef.decompose and not n.host for n in prog.nodes):
        return
    nodes = []
    for n in prog.nodes:
        nodes += n.opdef.decompose(n) if n.opdef.decompose and not n.host else [n]
    prog.nodes = nodes
    link(prog)


def _check_outputs(prog: Program) -> None:
    for n in prog.nodes:
        if n.op == "Dropout" and len(n.outputs) > 1 and n.outputs[1] and not (
                n.outputs[1] in prog.users or n.outputs[1] in prog.outputs):
            n.outputs = n.outputs[:1]   # a mask nothing reads is not computed (split_dropout)
    for o in prog.outputs:
        if o not in prog.producers and o not in prog.inputs and o not in prog.constants:
            raise ModelError(f"graph output {o!r} is produced by no node")
    for name, v in prog.constants.items():
        if v.dtype.kind == "f" and v.dtype not in (np.float32, np.float64, np.float16) and name in prog.users:
            raise ModelError(f"constant {name!r} is {v.dtype}; only float32, float64 and float16 data are supported")


def _mark_static(prog: Program) -> None:
    """`node.static_output`: every input is a constant, a graph input declared with static dims
    or the output of another such node, so its output layouts never change after the first
    inference (update_shape is skipped with reason `static_output`). Not so for an op whose
    output depends on data (`dynamic_output`) or on the value of a memory dep that can change
    (Reshape's target from a graph input): static dims do not make a value fixed."""
    static = set(prog.constants) | {n for n, l in prog.inputs.items() if l.is_static}
    fixed = set(prog.constants)      # tensors whose values never change
    for n in prog.nodes:
        deps = [n.inputs[i] for i in n.opdef.shape_deps if i < len(n.inputs) and n.inputs[i]]
        n.static_output = all(i == "" or i in static for i in n.inputs) and \
            not n.opdef.dynamic_output and all(d in fixed for d in deps)
        if n.static_output:
            static.update(o for o in n.outputs if o)
            # shape math over static layouts yields fixed values
            if n.op == "Shape" or n.host and all(i == "" or i in fixed for i in n.inputs):
                fixed.update(o for o in n.outputs if o)


def _mark_shape_subgraphs(prog: Program) -> None:
    """A node is host-run shape math when it is a Shape, or a host-capable op whose non-constant
    inputs all come from host nodes; float-valued fills (ConstantOfShape, Expand) and rows
    gathered from a float table (a BERT's position embeddings by positions made from the
    length) stay on the device since they make data, not shapes: on the host every new length
    gathered its rows and uploaded them (0.2 MB for a MiniLM BERT at 128: 75-105 us of an
    H200 host's time per new transition)."""
    host_tensors: dict[str, frozenset] = {}
    for n in prog.nodes:
        if n.op == "Shape":
            n.host, n.shape_sources = True, frozenset([n.name])
        else:
            live = [i for i in n.inputs if i and i not in prog.constants]
            if not (n.opdef.host_ok and live and all(i in host_tensors for i in live)):
                continue
            if embedding_rows(prog, n):
                continue
            if n.op in ("ConstantOfShape", "Expand"):
                v = prog.constants.get(n.inputs[0]) if n.op == "Expand" else None
                is_float = (v is not None and v.dtype.kind == "f") or (
                    n.op == "ConstantOfShape" and n.attrs.get("value") is not None
                    and numpy_helper.to_array(n.attrs["value"]).dtype.kind == "f")
                if is_float or n.op == "ConstantOfShape" and n.attrs.get("value") is None:
                    continue
            n.host = True
            n.shape_sources = frozenset().union(*(host_tensors[i] for i in live))
        for o in n.outputs:
            if n.host and o:
                host_tensors[o] = n.shape_sources


__all__ = ["Program", "Node", "ModelError", "load_program", "build_program"]
