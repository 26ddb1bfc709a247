"""Control-flow subgraphs at load: what a subgraph reads from the outer scope, Scan rewritten as a
Loop, and a subgraph as a model of its own (its outer-scope values as inputs, or as initializers
where the outer graph holds them as constants) that `build_program` takes like any model.

An If or Loop node's subgraphs may read any tensor of the graphs around them without naming it
as an input; those names are appended to the node's inputs at load, so the topological order,
the tensors' lifetimes and the memory pool see that the node reads them.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from engine.graph import ModelError, Node

# the subgraph attributes of each control-flow op the engine runs, by the name its runtime
# (and the trace: `<node>/<key>/<subgraph node>`) gives each
BODIES = {"If": (("then", "then_branch"), ("else", "else_branch")), "Loop": (("body", "body"),)}


def subgraphs_of(n: onnx.NodeProto) -> list:
    out = []
    for a in n.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            out += list(a.graphs)
    return out


def outer_names(g: onnx.GraphProto) -> list[str]:
    """Tensors `g` (its nested subgraphs too) reads but does not define, in first-read order."""
    defined = {vi.name for vi in g.input} | {t.name for t in g.initializer} | \
        {o for n in g.node for o in n.output}
    out: list[str] = []
    for n in g.node:
        for name in list(n.input) + [x for sub in subgraphs_of(n) for x in outer_names(sub)]:
            if name and name not in defined and name not in out:
                out.append(name)
    out += [o.name for o in g.output if o.name not in defined and o.name not in out]
    return out


def attach_outer(nodes: list, model: onnx.ModelProto, opset: int) -> list:
    """Scan nodes rewritten as Loops; every control-flow node's outer-scope reads appended to its
    inputs (`Node.outer`: name -> ONNX elem type, 0 when inference cannot tell)."""
    if not any(n.op in ("If", "Loop", "Scan") for n in nodes):
        return nodes
    out = []
    for n in nodes:
        out += scan_as_loop(n) if n.op == "Scan" else [n]
    types = _elem_types(model)
    for n in out:
        if n.op in BODIES:
            names = [x for _, attr in BODIES[n.op] for x in outer_names(n.attrs[attr])]
            n.outer = {x: types.get(x, 0) for x in dict.fromkeys(names)}
            n.inputs = list(n.inputs) + [x for x in n.outer if x not in n.inputs]
    return out


def _elem_types(model: onnx.ModelProto) -> dict:
    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception:   # a model ONNX cannot infer still runs: outer values are then float
        pass
    g = model.graph
    types = {t.name: t.data_type for t in g.initializer}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    types[n.output[0]] = a.t.data_type
    return types


def sub_model(g: onnx.GraphProto, node, constants: dict) -> onnx.ModelProto:
    """Subgraph `g` of control-flow `node` as a model: its own inputs, then the outer-scope
    values it reads (those in `constants` as initializers). Declared dims are dropped (a
    body's carried values may change shape between iterations)."""
    for vi in list(g.input) + list(g.output):
        if vi.type.WhichOneof("value") not in (None, "tensor_type"):
            raise ModelError(f"{node.op} node {node.name}: its subgraph's {vi.name!r} is a "
                             f"{vi.type.WhichOneof('value')}, not a tensor (not supported)")
    defaults = [TensorProto.INT64, TensorProto.BOOL] if node.op == "Loop" else []
    inputs = [_any_shape(vi.name, vi.type.tensor_type.elem_type or
                         (defaults[k] if k < len(defaults) else TensorProto.FLOAT))
              for k, vi in enumerate(g.input)]
    inits = list(g.initializer)
    outer = [x for x in node.outer if x in outer_names(g)]
    for x in outer:
        if x in constants:
            inits.append(numpy_helper.from_array(np.asarray(constants[x]), x))
        else:
            inputs.append(_any_shape(x, node.outer[x] or TensorProto.FLOAT))
    outputs = [_any_shape(vi.name, vi.type.tensor_type.elem_type or TensorProto.FLOAT) for vi in g.output]
    graph = helper.make_graph(list(g.node), g.name or node.name, inputs, outputs, inits)
    domains = {n.domain for n in g.node if n.domain not in ("", "ai.onnx")}
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", node.opset)] +
                             [helper.make_opsetid(d, 1) for d in sorted(domains)])


def _any_shape(name: str, elem_type: int):
    vi = helper.make_tensor_value_info(name, elem_type, None)
    vi.type.tensor_type.ClearField("shape")
    return vi


def scan_as_loop(n: Node) -> list[Node]:
    """Scan as a Loop over the scan axis (Scan-8: a Loop over the batch axis around it)."""
    protos = _scan8_protos(n) if n.opset < 9 else \
        _scan_protos(n.name, n.inputs, n.outputs, n.attrs, n.attrs["body"])
    return [Node(e.name, e.op_type, list(e.input), list(e.output), _attrs(e), e, n.opset) for e in protos]


def _maker(p: str):
    def node(op, ins, outs, into, **attrs):
        name = outs[0] if outs[0].startswith(p) else f"{p}/{outs[0]}"
        proto = helper.make_node(op, ins, outs, name=name, **attrs)
        into.append(proto)
        return proto

    def const(name, v, into):
        return node("Constant", [], [name], into, value=numpy_helper.from_array(np.asarray(v), name))
    return node, const


def _scan_protos(name: str, inputs: list, outputs: list, a: dict, body) -> list:
    """Scan-9 on: the trip count is the scan axis' length (host shape math); the body takes
    slice `i` of each scan input with a Gather (index `T - 1 - i` for a reversed one) and passes
    its condition through; a scan output along another axis gets a Transpose after the Loop, a
    reversed one is written from its end (the Loop's `scan_output_reverse`, which its runtime
    reads)."""
    m = a["num_scan_inputs"]
    n_state = len(inputs) - m
    xs = inputs[n_state:]
    in_axes = list(a.get("scan_input_axes") or [0] * m)
    in_dirs = list(a.get("scan_input_directions") or [0] * m)
    k_out = len(body.output) - n_state
    out_axes = list(a.get("scan_output_axes") or [0] * k_out)
    out_dirs = list(a.get("scan_output_directions") or [0] * k_out)
    p = f"{name}/scan"
    node, const = _maker(p)
    extra, body_nodes = [], []
    const(f"{p}/axis0", np.int64(in_axes[0]), extra)
    node("Shape", [xs[0]], [f"{p}/shape0"], extra)
    node("Gather", [f"{p}/shape0", f"{p}/axis0"], [f"{p}/T"], extra, axis=0)
    it, cond = f"{p}/iter", f"{p}/cond"
    if any(in_dirs):
        const(f"{p}/one", np.int64(1), body_nodes)
        node("Sub", [f"{p}/T", f"{p}/one"], [f"{p}/last"], body_nodes)
        node("Sub", [f"{p}/last", it], [f"{p}/back"], body_nodes)
    for j, (x, vi) in enumerate(zip(xs, body.input[n_state:])):
        node("Gather", [x, f"{p}/back" if in_dirs[j] else it], [vi.name], body_nodes, axis=in_axes[j])
    node("Identity", [cond], [f"{p}/cond_out"], body_nodes)
    new_body = helper.make_graph(
        body_nodes + list(body.node), body.name,
        [helper.make_tensor_value_info(it, TensorProto.INT64, []),
         helper.make_tensor_value_info(cond, TensorProto.BOOL, [])] + list(body.input[:n_state]),
        [helper.make_tensor_value_info(f"{p}/cond_out", TensorProto.BOOL, [])] + list(body.output),
        list(body.initializer))
    stacked, after = [], []
    for k, (y, axis) in enumerate(zip(outputs[n_state:], out_axes)):
        if axis == 0 or not y:
            stacked.append(y)
            continue
        rank = len(body.output[n_state + k].type.tensor_type.shape.dim) + 1
        axis = axis + rank if axis < 0 else axis
        perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, rank))
        stacked.append(f"{p}/stacked_{k}")
        node("Transpose", [stacked[-1]], [y], after, perm=perm)
    reverse = [k for k, d in enumerate(out_dirs) if d]
    loop = helper.make_node("Loop", [f"{p}/T", ""] + inputs[:n_state], outputs[:n_state] + stacked,
                            name=name, body=new_body,
                            **({"scan_output_reverse": reverse} if reverse else {}))
    return extra + [loop] + after


def _scan8_protos(n: Node) -> list:
    """Scan-8: every input and output has a batch axis first; a Loop over it runs the Scan of
    one batch entry (its states and scan inputs Gathered at `b`), its outputs stacked."""
    if n.inputs[0]:
        raise ModelError(f"Scan node {n.name}: sequence_lens (Scan-8) is not supported")
    a, body, ins = n.attrs, n.attrs["body"], n.inputs[1:]
    p = f"{n.name}/batch"
    node, const = _maker(p)
    outer, inner = [], []
    const(f"{p}/zero", np.int64(0), outer)
    node("Shape", [ins[0]], [f"{p}/shape"], outer)
    node("Gather", [f"{p}/shape", f"{p}/zero"], [f"{p}/B"], outer, axis=0)
    b, cond = f"{p}/b", f"{p}/cond"
    for x in ins:
        node("Gather", [x, b], [f"{p}/{x}@b"], inner, axis=0)
    outs = [f"{p}/out{k}" for k in range(len(n.outputs))]
    inner += _scan_protos(f"{n.name}/entry", [f"{p}/{x}@b" for x in ins], outs,
                          {"num_scan_inputs": a["num_scan_inputs"],
                           "scan_input_directions": a.get("directions")}, body)
    node("Identity", [cond], [f"{p}/cond_out"], inner)
    types = [vi.type.tensor_type.elem_type or TensorProto.FLOAT for vi in body.output]
    outer_body = helper.make_graph(
        inner, f"{body.name}_batch",
        [helper.make_tensor_value_info(b, TensorProto.INT64, []),
         helper.make_tensor_value_info(cond, TensorProto.BOOL, [])],
        [helper.make_tensor_value_info(f"{p}/cond_out", TensorProto.BOOL, [])] +
        [helper.make_tensor_value_info(o, t, None) for o, t in zip(outs, types)])
    return outer + [helper.make_node("Loop", [f"{p}/B", ""], list(n.outputs), name=n.name, body=outer_body)]


def _attrs(p: onnx.NodeProto) -> dict:
    return {x.name: (x.t if x.type == onnx.AttributeProto.TENSOR else helper.get_attribute_value(x))
            for x in p.attribute}
